//! Fuzzes the saved routing table file: no panic, and every accepted value round-trips
//! (`agent_reach_sidecar::fuzzing::table_file`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = agent_reach_sidecar::fuzzing::table_file(data);
});
