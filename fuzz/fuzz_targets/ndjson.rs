//! Fuzzes an HTTP agent's NDJSON stream (the first byte is the size of the pieces it
//! arrives in): no panic, and the same chunks in any pieces
//! (`agent_reach_sidecar::fuzzing::ndjson`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = agent_reach_sidecar::fuzzing::ndjson(data);
});
