//! Unit tests of the watch loop's parts: snapshot parts, held removals.

use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_routing::TableHandle;

use super::apply::release_held;
use super::*;
use crate::grace::Held;
use agent_reach::model::fixture;

fn wire(id: &str) -> proto::Instance {
    proto::Instance::from(&fixture::instance(id).agent("a").capability("c", &[]).build())
}

fn part(revision: i64, ids: &[&str], more: bool) -> proto::WatchEvent {
    proto::WatchEvent {
        event: Some(proto::watch_event::Event::Snapshot(proto::Snapshot {
            revision,
            instances: ids.iter().map(|id| wire(id)).collect(),
            more,
            ..Default::default()
        })),
    }
}

fn ids(ready: &Ready) -> (i64, Vec<String>) {
    match ready {
        Ready::Snapshot(s) => {
            let mut ids: Vec<String> = s.instances.keys().cloned().collect();
            ids.sort();
            (s.revision, ids)
        }
        _ => panic!("not a snapshot"),
    }
}

#[test]
fn snapshot_parts_are_gathered_into_one_snapshot() {
    let (mut parts, stats) = (SnapshotParts::default(), WatchStats::default());
    // A snapshot in one part passes through.
    assert_eq!(ids(&parts.gather(part(3, &["a"], false), &stats).unwrap().unwrap()), (3, vec!["a".into()]));
    assert!(parts.gather(part(5, &["a", "b"], true), &stats).unwrap().is_none());
    assert!(parts.gather(part(5, &["c"], true), &stats).unwrap().is_none());
    let whole = parts.gather(part(5, &["d"], false), &stats).unwrap().unwrap();
    assert_eq!(ids(&whole), (5, ["a", "b", "c", "d"].map(String::from).to_vec()));
    // A part of another revision, or a delta, in the middle of a snapshot breaks it.
    assert!(parts.gather(part(6, &["a"], true), &stats).unwrap().is_none());
    assert!(parts.gather(part(7, &["b"], false), &stats).unwrap_err().contains("revision 7"));
    assert!(parts.gather(part(8, &["a"], true), &stats).unwrap().is_none());
    let delta = proto::WatchEvent { event: Some(proto::watch_event::Event::Delta(proto::Delta::default())) };
    assert!(parts.gather(delta.clone(), &stats).unwrap_err().contains("delta"));
    // Outside a snapshot a delta passes through (a broken stream is dropped with its parts).
    assert!(matches!(SnapshotParts::default().gather(delta, &stats), Ok(Some(Ready::Delta(_)))));
    assert_eq!(stats.invalid_instances.load(Ordering::Relaxed), 0);
}

#[test]
fn a_part_is_converted_when_it_arrives_and_invalid_records_are_counted() {
    let (mut parts, stats) = (SnapshotParts::default(), WatchStats::default());
    let mut first = part(9, &["a-1", "b-1"], true);
    if let Some(proto::watch_event::Event::Snapshot(s)) = &mut first.event {
        s.instances[1].registration = None;
    }
    assert!(parts.gather(first, &stats).unwrap().is_none());
    // Counted with its part, before the snapshot is whole.
    assert_eq!(stats.invalid_instances.load(Ordering::Relaxed), 1);
    let whole = parts.gather(part(9, &["c-1"], false), &stats).unwrap().unwrap();
    assert_eq!(ids(&whole), (9, vec!["a-1".into(), "c-1".into()]));
    let table = TableHandle::default();
    let applied = apply_ready(&table, vec![whole], &stats, &mut Held::new(Duration::ZERO), tokio::time::Instant::now());
    assert_eq!(applied, [Applied::Snapshot { revision: 9, resync: false }]);
    assert_eq!((table.load().revision, table.load().len()), (9, 2));
}

#[test]
fn records_are_kept_with_lists_at_their_exact_size() {
    use prost::Message;
    // As the wire delivers them: decoded, so every list grew by pushing.
    let mut wire = proto::Instance::from(
        &fixture::instance("a-1").agent("a").capability("c", &["x", "y"]).capability("d", &[]).build(),
    );
    wire = proto::Instance::decode(wire.encode_to_vec().as_slice()).unwrap();
    let reg = wire.registration.as_ref().unwrap();
    assert!(reg.capabilities.capacity() > 2 && reg.capabilities[0].tags.capacity() > 2, "decoding over-allocates");
    let i = convert_instance(wire).unwrap();
    let caps = &i.record.registration.capabilities;
    assert_eq!((caps.len(), caps.capacity()), (2, 2));
    assert_eq!((caps[0].tags.clone(), caps[0].tags.capacity()), (vec!["x".to_string(), "y".to_string()], 2));
    assert_eq!(i, fixture::instance("a-1").agent("a").capability("c", &["x", "y"]).capability("d", &[]).build());
}

#[test]
fn removals_after_a_reconnection_are_held_until_the_instance_returns() {
    let table = TableHandle::default();
    let stats = WatchStats::default();
    let mut held = Held::new(Duration::from_secs(10));
    let now = tokio::time::Instant::now();
    held.connected(now);
    let first = part(10, &["a-1", "b-1"], false);
    apply_batch_holding(&table, vec![first], &stats, &mut held, now);
    held.live();
    // Reconnected: a resync snapshot without a-1, and a delta removing b-1.
    held.connected(now);
    let delta = |revision, removed: &[&str], upserted: &[&str]| proto::WatchEvent {
        event: Some(proto::watch_event::Event::Delta(proto::Delta {
            revision,
            prev_revision: revision - 1,
            removed_instance_ids: removed.iter().map(|s| s.to_string()).collect(),
            upserted: upserted.iter().map(|id| wire(id)).collect(),
            ..Default::default()
        })),
    };
    apply_batch_holding(&table, vec![part(20, &["b-1"], false), delta(21, &["b-1"], &[])], &stats, &mut held, now);
    assert_eq!(stats.held_removals.load(Ordering::Relaxed), 2);
    let mut now_ids: Vec<String> = table.load().instances.keys().cloned().collect();
    now_ids.sort();
    assert_eq!(now_ids, ["a-1", "b-1"], "both removals held");
    // a-1 registers again; b-1 does not and goes when its grace ends.
    apply_batch_holding(&table, vec![delta(22, &[], &["a-1"])], &stats, &mut held, now);
    release_held(&table, &mut held, &stats, now + Duration::from_secs(11));
    let left: Vec<String> = table.load().instances.keys().cloned().collect();
    assert_eq!(left, ["a-1"]);
    assert_eq!(table.load().revision, 22);
    assert_eq!(stats.held_expired.load(Ordering::Relaxed), 1);
}
