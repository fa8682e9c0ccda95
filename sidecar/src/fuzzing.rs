//! Entry points of the fuzz targets under `fuzz/` (cargo fuzz, nightly; README "Fuzzing"):
//! each runs one parser of hostile input on arbitrary bytes, and panics only when the
//! parser breaks a property (it panicked itself, or an accepted value does not round-trip).
//! Each returns whether the input was accepted. Not part of the sidecar's API: hidden
//! from its documentation, and nothing in the workspace calls it but the seed replay below
//! (run by `cargo test`) and the fuzz targets.
//!
//! The parsers: gRPC message framing ([`grpc_framing`]), the `grpc-timeout` header
//! ([`grpc_timeout`]), a policy's JSON ([`policy_json`]), the saved routing table file
//! ([`table_file`]) and an HTTP agent's NDJSON stream ([`ndjson`]).

use bytes::Bytes;

use crate::grpc::{Frames, PREFIX_LEN, frames_data, single_message};

/// gRPC framing: `data` as a collected unary body. An accepted body is exactly one
/// uncompressed message, and framing that message again gives back `data`.
pub fn grpc_framing(data: &[u8]) -> bool {
    let data = Bytes::copy_from_slice(data);
    let Some(message) = single_message(&data) else { return false };
    assert_eq!(message.len() + PREFIX_LEN, data.len());
    let framed: Vec<u8> = frames_data(Frames::message(message.clone(), &[])).concat();
    assert_eq!(framed, data, "re-framing an accepted message gives back its bytes");
    // A message split into its payload and extra fields frames the same way.
    let cut = message.len() / 2;
    let split: Vec<u8> = frames_data(Frames::message(message.slice(..cut), &message[cut..])).concat();
    assert_eq!(split, data);
    true
}

/// `grpc-timeout`: `data` as the header's value. An accepted value formats to one that
/// parses back to no less than it, in at most 8 digits and a unit.
pub fn grpc_timeout(data: &[u8]) -> bool {
    let Some(d) = agent_reach_support::grpc_timeout::parse(data) else { return false };
    let formatted = agent_reach_support::grpc_timeout::format(d);
    assert!(formatted.len() <= 9, "{formatted:?}");
    let back = agent_reach_support::grpc_timeout::parse(formatted.as_bytes()).expect("a formatted value parses");
    assert!(back >= d, "{formatted:?} parsed to {back:?} < {d:?}");
    true
}

/// A policy's JSON (what `PutPolicy` and control's store hold). A policy that parses and
/// validates round-trips through JSON and through protobuf (what Admin and the sidecars
/// see) unchanged, and still validates.
pub fn policy_json(data: &[u8]) -> bool {
    use agent_reach::policy::Policy;
    let Ok(policy) = serde_json::from_slice::<Policy>(data) else { return false };
    if policy.validate().is_err() {
        return false;
    }
    let json = serde_json::to_vec(&policy).expect("a policy serializes");
    let again: Policy = serde_json::from_slice(&json).expect("a written policy parses");
    assert_eq!(again, policy, "JSON round trip");
    let proto = agent_reach::convert::policy_to_proto(&policy, 1);
    let back = agent_reach::convert::policy_from_proto(proto).expect("a valid policy converts back");
    assert_eq!(back, policy, "protobuf round trip");
    assert_eq!(back.validate(), Ok(()));
    true
}

/// The saved routing table file of tenant `default`. An accepted file, written again as the
/// sidecar saves it, loads back to the same instances, policies and save time.
pub fn table_file(data: &[u8]) -> bool {
    let Ok((table, saved_at)) = crate::persist::parse(data, "default") else { return false };
    assert_eq!(table.revision, 0, "a loaded table is stale");
    // Instance revisions must not pass the file's; the loaded table forgot it.
    let revision = table.instances.values().map(|m| m.instance.revision).max().unwrap_or(0);
    let written = crate::persist::encode("default", &table, revision, saved_at);
    let (again, saved_again) = crate::persist::parse(&written, "default").expect("a written table loads back");
    assert_eq!(saved_again, saved_at);
    assert_eq!(again.instances.len(), table.instances.len());
    for (id, m) in &table.instances {
        assert_eq!(again.instances.get(id).map(|a| &a.instance), Some(&m.instance), "instance {id}");
    }
    assert_eq!(again.policies, table.policies);
    true
}

/// An HTTP agent's NDJSON stream: `data[1..]` is the answer, `data[0]` the size of the
/// pieces it arrives in. Reading it in pieces gives the same chunks and errors as reading
/// it whole. Accepted: every line read into a chunk.
pub fn ndjson(data: &[u8]) -> bool {
    let Some((&split, answer)) = data.split_first() else { return false };
    let whole = read_ndjson(&[answer]);
    let pieces: Vec<&[u8]> = answer.chunks(usize::from(split).max(1)).collect();
    assert_eq!(read_ndjson(&pieces), whole, "the same chunks in pieces of {split}");
    whole.iter().all(Result::is_ok)
}

/// The chunks (payload, or the error's message) of `pieces` fed to the NDJSON reader in
/// order, up to the first refusal.
fn read_ndjson(pieces: &[&[u8]]) -> Vec<Result<Bytes, String>> {
    let mut lines = crate::inbound::http_agent::NdjsonLines::default();
    let mut out = Vec::new();
    for piece in pieces {
        if let Err(s) = lines.push(piece) {
            out.push(Err(s.message().to_string()));
            return out;
        }
        while let Some(line) = lines.next_chunk() {
            out.push(line.map(|c| c.payload).map_err(|s| s.message().to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! Replays the committed seed corpus (`fuzz/corpus/<target>/`): every seed named
    //! `valid-*` is accepted, every other one refused, and none breaks a property.

    use std::path::{Path, PathBuf};

    use super::*;

    fn corpus(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
    }

    fn replay(target: &str, run: fn(&[u8]) -> bool) {
        let dir = corpus(target);
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(run(&bytes), name.starts_with("valid-"), "{target}/{name}");
            seeds += 1;
        }
        assert!(seeds >= 3, "{target}: {seeds} seeds");
    }

    #[test]
    fn the_grpc_framing_seeds_replay() {
        replay("grpc_framing", grpc_framing);
    }

    #[test]
    fn the_grpc_timeout_seeds_replay() {
        replay("grpc_timeout", grpc_timeout);
    }

    #[test]
    fn the_policy_json_seeds_replay() {
        replay("policy_json", policy_json);
    }

    #[test]
    fn the_table_file_seeds_replay() {
        replay("table_file", table_file);
    }

    #[test]
    fn the_ndjson_seeds_replay() {
        replay("ndjson", ndjson);
    }

    #[test]
    fn a_large_framed_message_round_trips() {
        // Past the size below which a message is copied into one buffer.
        let mut body = vec![0, 0, 1, 0, 0];
        body.extend(std::iter::repeat_n(7u8, 65_536));
        assert!(grpc_framing(&body));
    }
}
