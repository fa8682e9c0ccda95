//! Applying watch events to the routing table: a snapshot replaces it whole, a delta
//! applies only on top of the revision it follows, a batch of events costs one table
//! build, and removals after a reconnection are held as [`crate::grace`] decides.
//!
//! Records are converted from protobuf as they arrive ([`Converted`]: a large snapshot part
//! by part, so its messages are never held whole), and each is stored with its lists at
//! their exact size ([`convert_instance`]): a table keeps every record as long as the
//! instance stays registered.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::convert::{instance_from_proto, policy_from_proto, policy_kind_from_i32};
use agent_reach::model::Instance;
use agent_reach::proto;
use agent_reach_routing::{RoutingTable, TableHandle};

use super::{Applied, WatchStats};
use crate::grace::Held;

/// A whole snapshot, converted to the table's records: instances by id and policies by
/// kind and name (records that failed conversion were counted and left out).
#[derive(Debug, Default)]
pub struct Converted {
    pub revision: i64,
    pub resync: bool,
    pub instances: HashMap<String, Arc<Instance>>,
    pub policies: agent_reach_routing::table::Policies,
}

impl Converted {
    /// Adds the records of one snapshot part (the part is consumed: its messages are freed
    /// as they are converted).
    pub fn extend(&mut self, part: proto::Snapshot, stats: &WatchStats) {
        self.instances.reserve(part.instances.len());
        for p in part.instances {
            match convert_instance(p) {
                Ok(i) => {
                    self.instances.insert(i.record.instance_id.clone(), Arc::new(i));
                }
                Err(e) => invalid(stats, "instance", &e),
            }
        }
        for p in part.policies {
            match policy_from_proto(p) {
                Ok(p) => {
                    self.policies.insert((p.kind, p.name.clone()), Arc::new(p));
                }
                Err(e) => invalid(stats, "policy", &e),
            }
        }
    }

    /// A snapshot in one part.
    pub fn of(s: proto::Snapshot, stats: &WatchStats) -> Converted {
        let mut c = Converted { revision: s.revision, resync: s.resync, ..Default::default() };
        c.extend(s, stats);
        c
    }
}

/// A watch event ready to apply: a delta as received, or a converted snapshot.
#[derive(Debug)]
pub enum Ready {
    Snapshot(Converted),
    Delta(proto::Delta),
    /// An event with nothing in it (it changes nothing; the table still counts as confirmed).
    Empty,
}

impl Ready {
    /// `event` ready to apply (a snapshot converted at once).
    pub fn of(event: proto::WatchEvent, stats: &WatchStats) -> Ready {
        match event.event {
            Some(proto::watch_event::Event::Snapshot(s)) => Ready::Snapshot(Converted::of(s, stats)),
            Some(proto::watch_event::Event::Delta(d)) => Ready::Delta(d),
            None => Ready::Empty,
        }
    }
}

/// An instance from control as the table keeps it: converted, with its capability and tag
/// lists in allocations of their exact size (decoding grows them by pushing: two
/// capabilities sat in room for four).
pub fn convert_instance(p: proto::Instance) -> Result<Instance, agent_reach::model::FieldError> {
    let mut i = instance_from_proto(p)?;
    let caps = &mut i.record.registration.capabilities;
    if caps.capacity() > caps.len() {
        *caps = exact(std::mem::take(caps));
    }
    for c in caps.iter_mut() {
        if c.tags.capacity() > c.tags.len() {
            c.tags = exact(std::mem::take(&mut c.tags));
        }
    }
    Ok(i)
}

/// `v` in a new allocation of exactly its length (`shrink_to_fit` may keep the block:
/// mimalloc shrinks in place while the new size is at least half).
fn exact<T>(v: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    out.extend(v);
    out
}

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
    let ready = events.into_iter().map(|e| Ready::of(e, stats)).collect();
    apply_ready(table, ready, stats, held, now)
}

/// [`apply_batch_holding`] of events already converted.
pub fn apply_ready(
    table: &TableHandle,
    events: Vec<Ready>,
    stats: &WatchStats,
    held: &mut Held,
    now: tokio::time::Instant,
) -> Vec<Applied> {
    let current = table.load_full();
    let mut batch =
        Batch { current: &current, revision: current.revision, instances: None, policies: None, stats, held, now };
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        match event {
            Ready::Snapshot(s) => out.push(batch.snapshot(s)),
            Ready::Delta(d) => {
                let applied = batch.delta(d);
                let gap = matches!(applied, Applied::Refused { gap: true, .. });
                out.push(applied);
                if gap {
                    // Nothing after a gap may apply: the table resumes from `revision`.
                    break;
                }
            }
            Ready::Empty => {}
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
    policies: Option<agent_reach_routing::table::Policies>,
    stats: &'a WatchStats,
    held: &'a mut Held,
    now: tokio::time::Instant,
}

impl Batch<'_> {
    /// A snapshot replaces everything before it; instances it no longer has may only have
    /// lost their lease during an outage, and are held after a reconnection.
    fn snapshot(&mut self, s: Converted) -> Applied {
        let stats = self.stats;
        let Converted { revision, resync, instances: mut inst, policies: pol } = s;
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
        tracing::info!(revision, instances = inst.len(), policies = pol.len(), resync, "applied snapshot");
        self.instances = Some(inst);
        self.policies = Some(pol);
        self.revision = revision;
        stats.snapshots.fetch_add(1, Ordering::Relaxed);
        if resync {
            stats.resyncs.fetch_add(1, Ordering::Relaxed);
        }
        Applied::Snapshot { revision, resync }
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
            match convert_instance(p) {
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
