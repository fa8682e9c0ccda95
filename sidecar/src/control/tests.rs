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

fn ids(event: &proto::WatchEvent) -> Vec<String> {
    match &event.event {
        Some(proto::watch_event::Event::Snapshot(s)) => s.instances.iter().map(|i| i.instance_id.clone()).collect(),
        _ => panic!("not a snapshot"),
    }
}

#[test]
fn snapshot_parts_are_gathered_into_one_snapshot() {
    let mut parts = SnapshotParts::default();
    // A snapshot in one part passes through.
    assert_eq!(ids(&parts.gather(part(3, &["a"], false)).unwrap().unwrap()), ["a"]);
    assert!(parts.gather(part(5, &["a", "b"], true)).unwrap().is_none());
    assert!(parts.gather(part(5, &["c"], true)).unwrap().is_none());
    let whole = parts.gather(part(5, &["d"], false)).unwrap().unwrap();
    assert_eq!(ids(&whole), ["a", "b", "c", "d"]);
    // A part of another revision, or a delta, in the middle of a snapshot breaks it.
    assert!(parts.gather(part(6, &["a"], true)).unwrap().is_none());
    assert!(parts.gather(part(7, &["b"], false)).unwrap_err().contains("revision 7"));
    assert!(parts.gather(part(8, &["a"], true)).unwrap().is_none());
    let delta = proto::WatchEvent { event: Some(proto::watch_event::Event::Delta(proto::Delta::default())) };
    assert!(parts.gather(delta).unwrap_err().contains("delta"));
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
