//! Applying watch events to the routing table: a snapshot replaces it whole, a delta
//! applies only on top of the revision it follows, a batch of events costs one table
//! build, and removals after a reconnection are held as [`crate::grace`] decides.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::convert::{instance_from_proto, policy_from_proto, policy_kind_from_i32};
use agent_reach::model::Instance;
use agent_reach::policy::{Policy, PolicyKind};
use agent_reach::proto;
use agent_reach_routing::{RoutingTable, TableHandle};

use super::{Applied, WatchStats};
use crate::grace::Held;

/// Applies one watch event to the table: a snapshot replaces it whole; a delta applies
/// only on top of the revision it follows.
pub fn apply(table: &TableHandle, event: proto::WatchEvent, stats: &WatchStats) -> Option<Applied> {
    apply_batch(table, vec![event], stats).pop()
}

/// Applies watch events in order, building the table once at the end: each snapshot
/// replaces everything before it, each delta applies only on top of the revision it
/// follows. Returns what each event did.
pub fn apply_batch(table: &TableHandle, events: Vec<proto::WatchEvent>, stats: &WatchStats) -> Vec<Applied> {
    apply_batch_holding(table, events, stats, &mut Held::new(Duration::ZERO), tokio::time::Instant::now())
}

/// Removes the held instances whose grace ended by `now` (the table keeps its revision).
pub(super) fn release_held(table: &TableHandle, held: &mut Held, stats: &WatchStats, now: tokio::time::Instant) {
    let ended = held.expired(now);
    if ended.is_empty() {
        return;
    }
    let current = table.load_full();
    let mut instances: HashMap<String, Arc<Instance>> =
        current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect();
    for id in &ended {
        if instances.remove(id).is_some() {
            stats.held_expired.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(instance = %id, "a removal held after the reconnection applies: the instance did not register again");
        }
    }
    table.store(RoutingTable::build(current.revision, instances, current.policies.clone(), Some(&current)));
}

/// [`apply_batch`], holding removals as `held` decides (see [`crate::grace`]).
pub fn apply_batch_holding(
    table: &TableHandle,
    events: Vec<proto::WatchEvent>,
    stats: &WatchStats,
    held: &mut Held,
    now: tokio::time::Instant,
) -> Vec<Applied> {
    let current = table.load_full();
    let mut batch =
        Batch { current: &current, revision: current.revision, instances: None, policies: None, stats, held, now };
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        match event.event {
            Some(proto::watch_event::Event::Snapshot(s)) => out.push(batch.snapshot(s)),
            Some(proto::watch_event::Event::Delta(d)) => {
                let applied = batch.delta(d);
                let gap = matches!(applied, Applied::Refused { gap: true, .. });
                out.push(applied);
                if gap {
                    // Nothing after a gap may apply: the table resumes from `revision`.
                    break;
                }
            }
            None => {}
        }
    }
    if batch.revision != current.revision || batch.instances.is_some() || batch.policies.is_some() {
        let instances = batch.instances.unwrap_or_else(|| instances_of(&current));
        let policies = batch.policies.unwrap_or_else(|| current.policies.clone());
        table.store(RoutingTable::build(batch.revision, instances, policies, Some(&current)));
    }
    out
}

/// The table's instances, as a batch changes them.
fn instances_of(table: &RoutingTable) -> HashMap<String, Arc<Instance>> {
    table.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect()
}

/// Counts and logs an instance or policy from control that does not convert.
fn invalid(stats: &WatchStats, what: &str, e: &dyn std::fmt::Display) {
    stats.invalid_instances.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("ignoring an invalid {what} from control: {e}");
}

/// A batch of watch events applied so far: the revision reached, and the instances and
/// policies once an event changed them (None: still the table's).
struct Batch<'a> {
    current: &'a RoutingTable,
    revision: i64,
    instances: Option<HashMap<String, Arc<Instance>>>,
    policies: Option<HashMap<(PolicyKind, String), Arc<Policy>>>,
    stats: &'a WatchStats,
    held: &'a mut Held,
    now: tokio::time::Instant,
}

impl Batch<'_> {
    /// A snapshot replaces everything before it; instances it no longer has may only have
    /// lost their lease during an outage, and are held after a reconnection.
    fn snapshot(&mut self, s: proto::Snapshot) -> Applied {
        let stats = self.stats;
        let mut inst: HashMap<String, Arc<Instance>> = s
            .instances
            .into_iter()
            .filter_map(|p| instance_from_proto(p).map_err(|e| invalid(stats, "instance", &e)).ok())
            .map(|i| (i.record.instance_id.clone(), Arc::new(i)))
            .collect();
        for id in inst.keys() {
            self.held.upserted(id);
        }
        let before: Vec<(String, Arc<Instance>)> = match &self.instances {
            Some(m) => m.iter().map(|(id, i)| (id.clone(), i.clone())).collect(),
            None => self.current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect(),
        };
        for (id, i) in before {
            if !inst.contains_key(&id) && self.held.hold(&id, self.now) {
                stats.held_removals.fetch_add(1, Ordering::Relaxed);
                inst.insert(id, i);
            }
        }
        let pol: HashMap<(PolicyKind, String), Arc<Policy>> = s
            .policies
            .into_iter()
            .filter_map(|p| policy_from_proto(p).map_err(|e| invalid(stats, "policy", &e)).ok())
            .map(|p| ((p.kind, p.name.clone()), Arc::new(p)))
            .collect();
        tracing::info!(
            revision = s.revision,
            instances = inst.len(),
            policies = pol.len(),
            resync = s.resync,
            "applied snapshot"
        );
        self.instances = Some(inst);
        self.policies = Some(pol);
        self.revision = s.revision;
        stats.snapshots.fetch_add(1, Ordering::Relaxed);
        if s.resync {
            stats.resyncs.fetch_add(1, Ordering::Relaxed);
        }
        Applied::Snapshot { revision: s.revision, resync: s.resync }
    }

    /// A delta applies only on top of the revision it follows: one that does not move
    /// forward is rejected, one that does not follow is a gap.
    fn delta(&mut self, d: proto::Delta) -> Applied {
        let (stats, revision) = (self.stats, self.revision);
        if d.revision <= revision {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(revision = d.revision, table = revision, "rejected a delta that does not move forward");
            return Applied::Refused { revision: d.revision, table: revision, gap: false };
        }
        if d.prev_revision > revision {
            stats.gaps.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                revision = d.revision,
                follows = d.prev_revision,
                table = revision,
                "refused a delta that does not follow the table"
            );
            return Applied::Refused { revision: d.revision, table: revision, gap: true };
        }
        let changes =
            d.upserted.len() + d.removed_instance_ids.len() + d.upserted_policies.len() + d.removed_policies.len();
        let current = self.current;
        let inst = self.instances.get_or_insert_with(|| instances_of(current));
        for id in &d.removed_instance_ids {
            if inst.contains_key(id) && self.held.hold(id, self.now) {
                stats.held_removals.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            inst.remove(id);
        }
        for p in d.upserted {
            match instance_from_proto(p) {
                Ok(i) => {
                    self.held.upserted(&i.record.instance_id);
                    inst.insert(i.record.instance_id.clone(), Arc::new(i));
                }
                Err(e) => invalid(stats, "instance", &e),
            }
        }
        let pol = self.policies.get_or_insert_with(|| current.policies.clone());
        for r in d.removed_policies {
            match policy_kind_from_i32("kind", r.kind) {
                Ok(kind) => {
                    pol.remove(&(kind, r.name));
                }
                Err(e) => invalid(stats, "policy reference", &e),
            }
        }
        for p in d.upserted_policies {
            match policy_from_proto(p) {
                Ok(p) => {
                    pol.insert((p.kind, p.name.clone()), Arc::new(p));
                }
                Err(e) => invalid(stats, "policy", &e),
            }
        }
        stats.deltas.fetch_add(1, Ordering::Relaxed);
        self.revision = d.revision;
        Applied::Delta { from: revision, revision: d.revision, changes }
    }
}
