//! Fuzzes a policy's JSON: no panic, and every accepted value round-trips
//! (`agent_reach_sidecar::fuzzing::policy_json`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = agent_reach_sidecar::fuzzing::policy_json(data);
});
