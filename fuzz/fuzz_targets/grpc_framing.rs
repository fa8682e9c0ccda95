//! Fuzzes gRPC message framing of a collected unary body: no panic, and every accepted value round-trips
//! (`agent_reach_sidecar::fuzzing::grpc_framing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = agent_reach_sidecar::fuzzing::grpc_framing(data);
});
