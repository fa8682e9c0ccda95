//! Fuzzes the grpc-timeout header value: no panic, and every accepted value round-trips
//! (`agent_reach_sidecar::fuzzing::grpc_timeout`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = agent_reach_sidecar::fuzzing::grpc_timeout(data);
});
