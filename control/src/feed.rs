//! Tenant feeds: each control replica watches the store once per tenant prefix and fans
//! the changes out to every sidecar of that tenant it serves.
//!
//! A [`Feed`] loads the tenant's state with one prefix read at revision R, then follows one
//! store watch from R+1. It keeps the current state in memory (snapshots are served from
//! it, without a store read per sidecar) and a bounded history of recent deltas, one per
//! revision that changed the tenant's routing state, each naming the revision before it
//! (`prev_revision`). It publishes its head revision through a `tokio::sync::watch`
//! channel: a latest-value signal that never queues. Each sidecar's stream
//! ([`crate::watch`]) reads the deltas after its own revision from the shared history when
//! woken, so a slow sidecar costs nothing to the others and holds no queue; one that falls
//! out of the history is caught up from the store's history instead.
//!
//! If the store compacts past the feed's position (the feed's watch was down), the feed
//! reloads and starts a new history; sidecars behind it are caught up or resynced. Feeds
//! are started by the first user of a tenant and stopped when unused for a while.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_reach::convert::policy_to_proto;
use agent_reach::proto;
use agent_reach_store::{Event, EventKind, LeaseId, Range, Revision, Store, StoreError};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use agent_reach::model::InstanceStatus;

use crate::error::ControlError;
use crate::keys;
use crate::record::{self, StoredInstance};
use crate::stats::{ControlStats, GaugeGuard};
use crate::wire::{SNAPSHOT_PART_BYTES, SharedDelta, SnapshotWire};

/// An unused feed is stopped after this long.
const FEED_LINGER: Duration = Duration::from_secs(60);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; every critical section here leaves the state
    // consistent before anything in it can panic.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key prefixes of one tenant.
#[derive(Clone, Debug)]
pub struct Prefixes {
    pub tenant: String,
    pub all: String,
    pub agents: String,
    pub policies: String,
}

impl Prefixes {
    pub fn new(tenant: &str) -> Prefixes {
        Prefixes {
            tenant: tenant.to_string(),
            all: keys::tenant_prefix(tenant),
            agents: keys::agents_prefix(tenant),
            policies: keys::policies_prefix(tenant),
        }
    }
}

/// One instance as the feed holds it.
#[derive(Debug)]
pub struct Entry {
    pub stored: StoredInstance,
    pub mod_revision: Revision,
    pub lease: LeaseId,
    /// As sidecars receive it.
    pub wire: proto::Instance,
}

/// What one store event means for a tenant's routing state.
enum Change {
    Instance {
        key: String,
        entry: Arc<Entry>,
    },
    InstanceGone {
        key: String,
        instance_id: String,
    },
    Policy {
        key: String,
        policy: Box<proto::Policy>,
    },
    PolicyGone {
        key: String,
        kind: proto::PolicyKind,
        name: String,
    },
    /// Not routing state (agent holds, unknown keys).
    None,
}

fn change(prefixes: &Prefixes, event: &Event) -> Change {
    let kv = &event.kv;
    let key = kv.key.clone();
    if let Some((agent, instance_id)) = keys::parse_instance_key(&prefixes.agents, &kv.key) {
        let gone = || Change::InstanceGone { key: kv.key.clone(), instance_id: instance_id.to_string() };
        if event.kind == EventKind::Delete {
            return gone();
        }
        return match record::decode_instance(kv, &prefixes.tenant, agent, instance_id) {
            Ok(stored) => {
                let wire = proto::Instance::from(&stored.status(kv.mod_revision));
                Change::Instance {
                    key,
                    entry: Arc::new(Entry { stored, mod_revision: kv.mod_revision, lease: kv.lease, wire }),
                }
            }
            Err(e) => {
                // An unreadable record cannot be routed to: it leaves the table.
                tracing::warn!("treating as removed: {e}");
                gone()
            }
        };
    }
    if let Some((kind, name)) = keys::parse_policy_key(&prefixes.policies, &kv.key) {
        let kind = proto::PolicyKind::from(kind);
        if event.kind == EventKind::Delete {
            return Change::PolicyGone { key, kind, name };
        }
        return match record::decode_policy(kv, &prefixes.tenant) {
            Ok(policy) => Change::Policy { key, policy: Box::new(policy_to_proto(&policy, kv.mod_revision)) },
            Err(e) => {
                tracing::warn!("treating as removed: {e}");
                Change::PolicyGone { key, kind, name }
            }
        };
    }
    Change::None
}

fn add_to_delta(delta: &mut proto::Delta, change: &Change) {
    match change {
        Change::Instance { entry, .. } => delta.upserted.push(entry.wire.clone()),
        Change::InstanceGone { instance_id, .. } => delta.removed_instance_ids.push(instance_id.clone()),
        Change::Policy { policy, .. } => delta.upserted_policies.push(proto::Policy::clone(policy)),
        Change::PolicyGone { kind, name, .. } => {
            delta.removed_policies.push(proto::PolicyRef { kind: *kind as i32, name: name.clone() })
        }
        Change::None => {}
    }
}

fn is_empty(delta: &proto::Delta) -> bool {
    delta.upserted.is_empty()
        && delta.removed_instance_ids.is_empty()
        && delta.upserted_policies.is_empty()
        && delta.removed_policies.is_empty()
}

/// Splits store events (in revision order) into one delta per revision that changed the
/// tenant's routing state, chaining `prev_revision` from `prev`. The feed and the catch-up
/// of a lagging sidecar both build deltas with this, so a revision always yields the same
/// delta whichever path delivers it.
pub fn deltas_from_events(prefixes: &Prefixes, events: &[Event], mut prev: Revision) -> Vec<proto::Delta> {
    let mut out: Vec<proto::Delta> = Vec::new();
    let mut current: Option<proto::Delta> = None;
    for event in events {
        let revision = event.kv.mod_revision;
        if current.as_ref().is_some_and(|d| d.revision != revision) {
            flush(&mut out, current.take(), &mut prev);
        }
        let delta = current.get_or_insert_with(|| proto::Delta { revision, prev_revision: prev, ..Default::default() });
        add_to_delta(delta, &change(prefixes, event));
    }
    flush(&mut out, current, &mut prev);
    out
}

fn flush(out: &mut Vec<proto::Delta>, delta: Option<proto::Delta>, prev: &mut Revision) {
    if let Some(mut delta) = delta.filter(|d| !is_empty(d)) {
        delta.prev_revision = *prev;
        *prev = delta.revision;
        out.push(delta);
    }
}

/// The in-memory state of one tenant.
#[derive(Default)]
struct FeedState {
    loaded: bool,
    failed: Option<String>,
    /// The last store revision fully applied (the load's, or the last event's).
    head: Revision,
    /// The revision of the newest delta (or of the load).
    last_delta: Revision,
    /// Every delta with a revision above this is in `history`.
    floor: Revision,
    instances: BTreeMap<String, Arc<Entry>>,
    policies: BTreeMap<String, proto::Policy>,
    history: VecDeque<Arc<SharedDelta>>,
    /// The current state as snapshot parts, encoded once for all sidecars that connect
    /// before the next routing change (whatever the head revision by then).
    snapshot: Option<Arc<SnapshotWire>>,
}

impl FeedState {
    fn load(&mut self, prefixes: &Prefixes, range: Range) {
        self.instances.clear();
        self.policies.clear();
        for kv in range.kvs {
            let event = Event { kind: EventKind::Put, kv };
            self.apply(change(prefixes, &event));
        }
        self.head = range.revision;
        self.last_delta = range.revision;
        self.floor = range.revision;
        self.history.clear();
        self.snapshot = None;
        self.loaded = true;
        self.failed = None;
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Instance { key, entry } => {
                self.instances.insert(key, entry);
            }
            Change::InstanceGone { key, .. } => {
                self.instances.remove(&key);
            }
            Change::Policy { key, policy } => {
                self.policies.insert(key, *policy);
            }
            Change::PolicyGone { key, .. } => {
                self.policies.remove(&key);
            }
            Change::None => {}
        }
    }

    /// Applies one batch of events and records its deltas.
    fn apply_batch(&mut self, prefixes: &Prefixes, events: Vec<Event>, capacity: usize) {
        let Some(last) = events.last().map(|e| e.kv.mod_revision) else { return };
        let mut current: Option<proto::Delta> = None;
        for event in &events {
            let revision = event.kv.mod_revision;
            if current.as_ref().is_some_and(|d| d.revision != revision) {
                self.record(current.take(), capacity);
            }
            let delta = current.get_or_insert_with(|| proto::Delta { revision, ..Default::default() });
            let change = change(prefixes, event);
            add_to_delta(delta, &change);
            self.apply(change);
        }
        self.record(current, capacity);
        self.head = self.head.max(last);
    }

    fn record(&mut self, delta: Option<proto::Delta>, capacity: usize) {
        let Some(mut delta) = delta.filter(|d| !is_empty(d)) else { return };
        delta.prev_revision = self.last_delta;
        self.last_delta = delta.revision;
        self.history.push_back(Arc::new(SharedDelta::new(delta)));
        while self.history.len() > capacity {
            if let Some(evicted) = self.history.pop_front() {
                self.floor = evicted.revision();
            }
        }
        self.snapshot = None;
    }
}

/// Where a feed stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Positions {
    pub head: Revision,
    pub floor: Revision,
}

/// Shared between a feed's task and its users.
struct Shared {
    prefixes: Prefixes,
    state: Mutex<FeedState>,
    /// The head revision, bumped after every applied batch (and on load or failure).
    head: watch::Sender<Revision>,
    capacity: usize,
}

/// One tenant's feed (see the module documentation). Dropping the last handle stops it.
pub struct Feed {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Feed {
    pub fn prefixes(&self) -> &Prefixes {
        &self.shared.prefixes
    }

    fn state(&self) -> MutexGuard<'_, FeedState> {
        lock(&self.shared.state)
    }

    /// A receiver woken whenever the head revision moves.
    pub fn subscribe(&self) -> watch::Receiver<Revision> {
        self.shared.head.subscribe()
    }

    pub fn positions(&self) -> Positions {
        let state = self.state();
        Positions { head: state.head, floor: state.floor }
    }

    /// The instance under `key`, as of the head revision.
    pub fn instance(&self, key: &str) -> Option<Arc<Entry>> {
        self.state().instances.get(key).cloned()
    }

    /// Runs `f` on the policy `kind`/`name` at the head revision, in place (session writes
    /// look up their field rules here on every write).
    pub fn with_policy<R>(
        &self,
        kind: agent_reach::policy::PolicyKind,
        name: &str,
        f: impl FnOnce(Option<&proto::Policy>) -> R,
    ) -> R {
        let key = keys::policy_key(&self.shared.prefixes.tenant, kind, name);
        f(self.state().policies.get(&key))
    }

    /// Every instance as operators see it (sorted by agent, then instance id) and every
    /// policy, at the head revision, from memory (the dashboard and the alert rules read
    /// this instead of the store).
    pub fn view(&self) -> (Revision, Vec<InstanceStatus>, Vec<proto::Policy>) {
        let (head, entries, policies) = self.entries();
        let instances = entries.iter().map(|e| e.stored.status(e.mod_revision)).collect();
        (head, instances, policies)
    }

    /// [`Feed::view`]'s instances as the feed holds them, shared, not copied: only
    /// reference counts are taken under the lock. (Records copied under it held up every
    /// event the feed applies and every sidecar's deltas for as long as the copy took,
    /// each time the alert rules or a dashboard read a large tenant.)
    pub fn entries(&self) -> (Revision, Vec<Arc<Entry>>, Vec<proto::Policy>) {
        let state = self.state();
        let entries = state.instances.values().cloned().collect();
        (state.head, entries, state.policies.values().cloned().collect())
    }

    /// The whole state at the head revision: the revision and the encoded snapshot parts,
    /// built at most once per routing change and shared by every sidecar's stream.
    pub fn snapshot(&self) -> (Revision, Arc<SnapshotWire>) {
        let mut state = self.state();
        let head = state.head;
        if let Some(built) = &state.snapshot {
            // No routing change since it was built: it holds at the head too.
            return (head, built.clone());
        }
        let built = Arc::new(SnapshotWire::build(
            state.instances.values().map(|e| &e.wire),
            state.policies.values(),
            SNAPSHOT_PART_BYTES,
        ));
        state.snapshot = Some(built.clone());
        (head, built)
    }

    /// The deltas after revision `after`, oldest first (at most `max`); `Err(floor)` when
    /// some of them are no longer in memory.
    pub fn deltas_after(&self, after: Revision, max: usize) -> Result<Vec<Arc<SharedDelta>>, Revision> {
        let state = self.state();
        if after < state.floor {
            return Err(state.floor);
        }
        let start = state.history.partition_point(|d| d.revision() <= after);
        Ok(state.history.range(start..).take(max).cloned().collect())
    }

    /// Waits until the feed has loaded the tenant's state.
    async fn ready(&self) -> Result<(), ControlError> {
        let mut head = self.subscribe();
        loop {
            {
                let state = self.state();
                if state.loaded {
                    return Ok(());
                }
                if let Some(why) = &state.failed {
                    return Err(StoreError::Unavailable(why.clone()).into());
                }
            }
            if head.changed().await.is_err() {
                return Err(StoreError::Unavailable("the tenant feed stopped".into()).into());
            }
        }
    }
}

/// Tenant feeds one replica runs at most, by default (`--max-tenant-feeds`).
pub const DEFAULT_MAX_FEEDS: usize = 10_000;

/// The feeds of one control replica, by tenant.
pub struct Feeds {
    store: Arc<dyn Store>,
    stats: Arc<ControlStats>,
    capacity: usize,
    /// Tenant feeds this replica runs at most (`--max-tenant-feeds`).
    max_feeds: usize,
    feeds: Mutex<HashMap<String, (Arc<Feed>, Instant)>>,
    /// Bumped whenever a feed starts (the alert rules follow every tenant with a feed).
    started: watch::Sender<u64>,
}

impl Feeds {
    /// Feeds keeping up to `capacity` deltas of history each.
    pub fn new(store: Arc<dyn Store>, stats: Arc<ControlStats>, capacity: usize) -> Feeds {
        Feeds {
            store,
            stats,
            capacity: capacity.max(1),
            max_feeds: DEFAULT_MAX_FEEDS,
            feeds: Mutex::new(HashMap::new()),
            started: watch::channel(0).0,
        }
    }

    /// These feeds, running at most `max` tenant feeds at once (at least 1).
    pub fn with_max_feeds(mut self, max: usize) -> Feeds {
        self.max_feeds = max.max(1);
        self
    }

    /// The feed of `tenant` (a validated name), started if needed, once it has loaded.
    /// A new tenant's feed when `--max-tenant-feeds` run already: feeds nobody uses now
    /// are stopped first; if all are in use, RESOURCE_EXHAUSTED `LIMIT_EXCEEDED`.
    pub async fn get(&self, tenant: &str) -> Result<Arc<Feed>, ControlError> {
        let feed = {
            let mut feeds = lock(&self.feeds);
            let now = Instant::now();
            match feeds.get_mut(tenant) {
                Some((feed, used)) if !feed.task.is_finished() => {
                    *used = now;
                    feed.clone()
                }
                _ => {
                    if feeds.len() >= self.max_feeds && !feeds.contains_key(tenant) {
                        feeds.retain(|_, (feed, _)| Arc::strong_count(feed) > 1);
                        if feeds.len() >= self.max_feeds {
                            self.stats.feed_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return Err(ControlError::LimitExceeded {
                                flag: "--max-tenant-feeds",
                                message: format!(
                                    "this control replica follows {} tenants already, all in use; it follows at most {}",
                                    feeds.len(),
                                    self.max_feeds
                                ),
                            });
                        }
                    }
                    let feed = Arc::new(self.start(tenant));
                    feeds.insert(tenant.to_string(), (feed.clone(), now));
                    self.started.send_modify(|n| *n += 1);
                    feed
                }
            }
        };
        feed.ready().await?;
        Ok(feed)
    }

    fn start(&self, tenant: &str) -> Feed {
        let (head, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            prefixes: Prefixes::new(tenant),
            state: Mutex::new(FeedState::default()),
            head,
            capacity: self.capacity,
        });
        let task = tokio::spawn(run(shared.clone(), self.store.clone(), self.stats.clone()));
        Feed { shared, task }
    }

    /// Stops feeds nobody has used for [`FEED_LINGER`], every few seconds, until `shutdown`.
    pub async fn run_janitor(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(FEED_LINGER / 4);
        loop {
            tokio::select! {
                _ = agent_reach_support::process::stopped(&mut shutdown) => break,
                _ = ticker.tick() => {}
            }
            let now = Instant::now();
            lock(&self.feeds).retain(|_, (feed, used)| {
                Arc::strong_count(feed) > 1 || now.saturating_duration_since(*used) < FEED_LINGER
            });
        }
        lock(&self.feeds).clear();
    }

    /// A receiver woken whenever a feed starts.
    pub fn subscribe_started(&self) -> watch::Receiver<u64> {
        self.started.subscribe()
    }

    /// Tenants with a running feed.
    pub fn tenants(&self) -> Vec<String> {
        let mut tenants: Vec<String> = lock(&self.feeds).keys().cloned().collect();
        tenants.sort();
        tenants
    }
}

/// The feed's task: load, then follow the store watch; reload when compacted past, resume
/// after a broken watch. Ends only if the first load fails (the next user starts a new
/// feed) or when the feed is dropped.
async fn run(shared: Arc<Shared>, store: Arc<dyn Store>, stats: Arc<ControlStats>) {
    let _gauge = GaugeGuard::new(stats, |s| &s.feeds);
    let prefixes = shared.prefixes.clone();
    let mut failures: u32 = 0;
    'load: loop {
        let range = match store.get_prefix(&prefixes.all).await {
            Ok(range) => range,
            Err(e) => {
                let loaded = lock(&shared.state).loaded;
                if !loaded {
                    lock(&shared.state).failed = Some(e.to_string());
                    shared.head.send_modify(|_| {});
                    return;
                }
                tracing::warn!(tenant = %prefixes.tenant, "cannot reload the tenant's state: {e}");
                backoff(&mut failures).await;
                continue 'load;
            }
        };
        let head = {
            let mut state = lock(&shared.state);
            state.load(&prefixes, range);
            state.head
        };
        tracing::debug!(tenant = %prefixes.tenant, revision = head, "tenant feed loaded");
        shared.head.send_replace(head);
        loop {
            let from = lock(&shared.state).head + 1;
            let mut watch = match store.watch_prefix(&prefixes.all, from).await {
                Ok(watch) => watch,
                Err(StoreError::Compacted { .. }) => continue 'load,
                Err(e) => {
                    tracing::warn!(tenant = %prefixes.tenant, "cannot watch the tenant's state: {e}");
                    backoff(&mut failures).await;
                    continue;
                }
            };
            while let Some(item) = watch.next().await {
                match item {
                    Ok(batch) => {
                        failures = 0;
                        let head = {
                            let mut state = lock(&shared.state);
                            state.apply_batch(&prefixes, batch.events, shared.capacity);
                            state.head
                        };
                        shared.head.send_replace(head);
                    }
                    Err(StoreError::Compacted { .. }) => {
                        tracing::warn!(tenant = %prefixes.tenant, "the store compacted past the tenant feed; reloading");
                        continue 'load;
                    }
                    Err(e) => {
                        tracing::warn!(tenant = %prefixes.tenant, "tenant watch broke: {e}");
                        break;
                    }
                }
            }
            backoff(&mut failures).await;
        }
    }
}

async fn backoff(failures: &mut u32) {
    let wait = agent_reach_support::backoff::jittered(*failures, Duration::from_millis(100), Duration::from_secs(5));
    *failures = failures.saturating_add(1);
    tokio::time::sleep(wait).await;
}

#[cfg(test)]
mod tests {
    use agent_reach_store::KeyValue;
    use bytes::Bytes;

    use super::*;

    #[tokio::test]
    async fn tenant_feeds_are_capped_and_unused_ones_make_room() {
        let store: Arc<dyn Store> = Arc::new(agent_reach_store::EmbeddedStore::default());
        let stats = Arc::new(ControlStats::default());
        let feeds = Feeds::new(store, stats.clone(), 16).with_max_feeds(2);
        let a = feeds.get("a").await.unwrap();
        let b = feeds.get("b").await.unwrap();
        // Both in use: a third tenant is refused, naming the limit.
        let refused = feeds.get("c").await.err().expect("refused");
        let status = tonic::Status::from(refused);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let info = agent_reach::reason::error_info(&status).unwrap();
        assert_eq!(info.reason, "LIMIT_EXCEEDED");
        assert_eq!(info.metadata.get("limit").map(String::as_str), Some("max-tenant-feeds"));
        assert_eq!(stats.feed_refusals.load(std::sync::atomic::Ordering::Relaxed), 1, "counted for /metrics");
        // A tenant already followed is still served.
        assert!(Arc::ptr_eq(&a, &feeds.get("a").await.unwrap()));
        // Once b is unused, c takes its place at once.
        drop(b);
        feeds.get("c").await.unwrap();
        assert_eq!(feeds.tenants(), vec!["a".to_string(), "c".to_string()]);
    }

    fn event(kind: EventKind, key: &str, value: &[u8], revision: Revision) -> Event {
        Event {
            kind,
            kv: KeyValue {
                key: key.to_string(),
                value: Bytes::copy_from_slice(value),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                lease: 0,
            },
        }
    }

    #[test]
    fn one_delta_per_revision_that_changes_routing_state() {
        let p = Prefixes::new("t");
        let policy = agent_reach::policy::Policy {
            tenant: "t".into(),
            kind: agent_reach::policy::PolicyKind::Capability,
            name: "c".into(),
            spec: Default::default(),
            description: String::new(),
        };
        let policy_json = serde_json::to_vec(&policy).unwrap();
        let events = vec![
            event(EventKind::Delete, "/agent-reach/v1/tenants/t/agents/a/a-1", b"", 5),
            event(EventKind::Put, "/agent-reach/v1/tenants/t/holds/a", b"{}", 6),
            event(EventKind::Put, "/agent-reach/v1/tenants/t/policies/capability/c", &policy_json, 7),
            event(EventKind::Delete, "/agent-reach/v1/tenants/t/agents/a/a-2", b"", 7),
            event(EventKind::Put, "/agent-reach/v1/tenants/t/agents/a/a-3", b"not json", 8),
        ];
        let deltas = deltas_from_events(&p, &events, 3);
        let summary: Vec<(Revision, Revision, Vec<String>, usize)> = deltas
            .iter()
            .map(|d| (d.prev_revision, d.revision, d.removed_instance_ids.clone(), d.upserted_policies.len()))
            .collect();
        // The hold key (revision 6) is not routing state; an unreadable record is removed.
        assert_eq!(
            summary,
            vec![
                (3, 5, vec!["a-1".to_string()], 0),
                (5, 7, vec!["a-2".to_string()], 1),
                (7, 8, vec!["a-3".to_string()], 0)
            ]
        );
        // The feed records the same deltas.
        let mut state = FeedState { head: 3, last_delta: 3, floor: 3, loaded: true, ..Default::default() };
        state.apply_batch(&p, events, 2);
        let kept: Vec<(Revision, Revision)> =
            state.history.iter().map(|d| (d.delta.prev_revision, d.delta.revision)).collect();
        assert_eq!(kept, [(5, 7), (7, 8)]);
        assert_eq!((state.head, state.floor, state.last_delta), (8, 5, 8));
        assert_eq!(state.policies.len(), 1);
    }
}
