//! [`EmbeddedStore`]: the subset of etcd that Agent-Reach uses, in process memory.
//!
//! It reproduces etcd 3.4's observable behaviour for the [`Store`] methods: one global
//! revision (1 on a fresh store, so the first write gets 2) that moves by exactly one per
//! write that changes something; create/mod revisions and versions per key; leases whose
//! expiry or revocation deletes all their keys under one revision; transactions whose
//! operations all share one revision; prefix watches that replay from any kept revision and
//! fail with [`StoreError::Compacted`] below the compaction point. Lease expiry runs on
//! tokio's clock (a task sleeping until the earliest deadline), so it can be tested with a
//! paused clock.
//!
//! It does not persist anything, replicate, authenticate, or keep old versions of keys for
//! reads at a past revision: history is kept only as watch events, bounded by
//! [`EmbeddedOptions::history_limit`] revisions (older history is compacted automatically).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{
    Compare, Event, EventKind, KeyValue, LeaseGrant, LeaseId, Op, Range, Result, Revision, Store, StoreError, Txn,
    TxnResult, WatchBatch, WatchStream,
};

/// etcd's largest lease TTL (`MaxLeaseTTL`), in seconds.
const MAX_LEASE_TTL_SECS: u64 = 9_000_000_000;
/// etcd's default limit on the operations of one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;
/// etcd's default limit on the size of one request (`--max-request-bytes`), applied here to
/// the keys and values of a write (etcd also counts encoding overhead, so this is a bound).
const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// A watch batch stops growing at this many events (at a revision boundary).
const MAX_BATCH_EVENTS: usize = 1000;

/// How an [`EmbeddedStore`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// Revisions of history kept for watches; watches from older revisions fail with
    /// `Compacted`, as if etcd had been compacted there. At least 1.
    pub history_limit: usize,
    /// Shorter lease TTLs are raised to this, as etcd raises them to 1.5 election timeouts
    /// (2 s with etcd's default 1 s election timeout, the default here).
    pub min_lease_ttl: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        Self { history_limit: 100_000, min_lease_ttl: Duration::from_secs(2) }
    }
}

/// The in-process store (see the module documentation). Clones share one store; the
/// lease-expiry task ends when the last clone is dropped, and open watches then end with
/// `Unavailable`.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    min_lease_ttl: Duration,
    /// The current revision, published after every write so that watches wake up.
    head: watch::Sender<Revision>,
    /// Wakes the lease-expiry task when a lease is granted or the store is dropped.
    lease_wakeup: Arc<Notify>,
    /// The lease-expiry task, spawned by the first `grant_lease` (and again if the runtime
    /// that ran it has gone away).
    lease_task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Lets the lease-expiry task notice that the store is gone and return.
        self.lease_wakeup.notify_one();
    }
}

impl EmbeddedStore {
    pub fn new(options: EmbeddedOptions) -> Self {
        let (head, _) = watch::channel(1);
        let inner = Inner {
            state: Mutex::new(State::new(options.history_limit)),
            min_lease_ttl: options.min_lease_ttl,
            head,
            lease_wakeup: Arc::new(Notify::new()),
            lease_task: Mutex::new(None),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Makes sure the lease-expiry task runs (it needs a tokio runtime, hence not in `new`).
    fn ensure_lease_task(&self) {
        let mut task = lock(&self.inner.lease_task);
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            let store = Arc::downgrade(&self.inner);
            let wakeup = Arc::clone(&self.inner.lease_wakeup);
            *task = Some(tokio::spawn(expire_leases(store, wakeup)));
        }
    }
}

impl Default for EmbeddedStore {
    fn default() -> Self {
        Self::new(EmbeddedOptions::default())
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("EmbeddedStore")
            .field("revision", &state.revision)
            .field("keys", &state.kvs.len())
            .field("leases", &state.leases.len())
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, ignoring poisoning: every critical section leaves the state consistent
/// before anything in it can panic (they only allocate and move data).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// Runs `f` on the state after expiring the leases that are due, and wakes the watches
    /// if the revision moved.
    fn with_state<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> T {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let before = state.revision;
        state.expire_due(now);
        let out = f(&mut state, now);
        if state.revision != before {
            // Sent under the lock so that the published head never goes backwards.
            self.head.send_replace(state.revision);
        }
        out
    }
}

/// Deletes the keys of expired leases at their deadlines; returns when the store is gone.
async fn expire_leases(store: Weak<Inner>, wakeup: Arc<Notify>) {
    loop {
        let next_deadline = {
            // Only a weak reference is held while sleeping, so dropping the last store
            // handle drops the store (whose `Drop` wakes this task to end it).
            let Some(inner) = store.upgrade() else { return };
            inner.with_state(|state, _| state.next_deadline())
        };
        match next_deadline {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wakeup.notified() => {}
                }
            }
            None => wakeup.notified().await,
        }
    }
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

/// Everything the store holds; all methods are synchronous and take the time as input.
struct State {
    revision: Revision,
    /// Watches from revisions below this fail with `Compacted` (0: nothing compacted).
    compacted: Revision,
    history_limit: Revision,
    kvs: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, Lease>,
    /// Lease deadlines in expiry order.
    deadlines: BTreeSet<(Instant, LeaseId)>,
    /// Every event with revision >= `compacted`, in revision order.
    history: VecDeque<Event>,
    next_lease_id: LeaseId,
}

impl State {
    fn new(history_limit: usize) -> Self {
        Self {
            revision: 1,
            compacted: 0,
            history_limit: Revision::try_from(history_limit.max(1)).unwrap_or(Revision::MAX),
            kvs: BTreeMap::new(),
            leases: HashMap::new(),
            deadlines: BTreeSet::new(),
            history: VecDeque::new(),
            next_lease_id: random_lease_id_base(),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(deadline, _)| deadline)
    }

    /// Revokes every lease whose deadline is at or before `now`, one revision per lease
    /// (etcd revokes each expired lease with its own request).
    fn expire_due(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            // The lease exists: `deadlines` and `leases` are updated together.
            let _ = self.revoke(id);
        }
    }

    fn grant(&mut self, ttl: Duration, now: Instant) -> LeaseGrant {
        let id = loop {
            let id = self.next_lease_id;
            self.next_lease_id = if id >= LeaseId::MAX - 1 { 1 } else { id + 1 };
            if !self.leases.contains_key(&id) {
                break id;
            }
        };
        let deadline = now + ttl;
        self.leases.insert(id, Lease { ttl, deadline, keys: BTreeSet::new() });
        self.deadlines.insert((deadline, id));
        LeaseGrant { id, ttl }
    }

    fn keep_alive(&mut self, id: LeaseId, now: Instant) -> Result<Duration> {
        let lease = self.leases.get_mut(&id).ok_or(StoreError::LeaseNotFound(id))?;
        self.deadlines.remove(&(lease.deadline, id));
        lease.deadline = now + lease.ttl;
        self.deadlines.insert((lease.deadline, id));
        Ok(lease.ttl)
    }

    /// Removes a lease and deletes its keys under one revision (none if it has no keys).
    fn revoke(&mut self, id: LeaseId) -> Result<()> {
        let lease = self.leases.remove(&id).ok_or(StoreError::LeaseNotFound(id))?;
        self.deadlines.remove(&(lease.deadline, id));
        let deletes = lease.keys.into_iter().map(|key| Op::Delete { key }).collect();
        self.apply(deletes);
        Ok(())
    }

    /// Fails if a put names a lease that does not exist.
    fn check_leases(&self, ops: &[Op]) -> Result<()> {
        for op in ops {
            if let Op::Put { lease: Some(id), .. } = op
                && *id != 0
                && !self.leases.contains_key(id)
            {
                return Err(StoreError::LeaseNotFound(*id));
            }
        }
        Ok(())
    }

    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, revision) => self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *revision,
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|kv| kv.value == *value),
        }
    }

    /// Applies validated operations under one new revision, which is taken only if
    /// something changed (deleting a missing key changes nothing). Returns the revision.
    fn apply(&mut self, ops: Vec<Op>) -> Revision {
        let revision = self.revision + 1;
        let mut changed = false;
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let lease = lease.unwrap_or(0);
                    let (create_revision, version, old_lease) = match self.kvs.get(&key) {
                        Some(kv) => (kv.create_revision, kv.version + 1, kv.lease),
                        None => (revision, 1, 0),
                    };
                    if old_lease != lease {
                        self.detach(old_lease, &key);
                        if let Some(lease) = self.leases.get_mut(&lease) {
                            lease.keys.insert(key.clone());
                        }
                    }
                    let kv =
                        KeyValue { key: key.clone(), value, create_revision, mod_revision: revision, version, lease };
                    self.history.push_back(Event { kind: EventKind::Put, kv: kv.clone() });
                    self.kvs.insert(key, kv);
                    changed = true;
                }
                Op::Delete { key } => {
                    let Some(old) = self.kvs.remove(&key) else { continue };
                    self.detach(old.lease, &key);
                    // What etcd reports for a deletion: only the key and the revision.
                    let kv = KeyValue {
                        key,
                        value: Bytes::new(),
                        create_revision: 0,
                        mod_revision: revision,
                        version: 0,
                        lease: 0,
                    };
                    self.history.push_back(Event { kind: EventKind::Delete, kv });
                    changed = true;
                }
            }
        }
        if changed {
            self.revision = revision;
            let oldest_kept = revision - self.history_limit + 1;
            if oldest_kept > self.compacted {
                self.compact_history(oldest_kept);
            }
        }
        self.revision
    }

    fn detach(&mut self, lease: LeaseId, key: &str) {
        if let Some(lease) = self.leases.get_mut(&lease) {
            lease.keys.remove(key);
        }
    }

    fn compact(&mut self, revision: Revision) -> Result<()> {
        if revision > self.revision {
            return Err(StoreError::Invalid(format!(
                "cannot compact at revision {revision}: the current revision is {}",
                self.revision
            )));
        }
        if revision <= self.compacted {
            return Err(StoreError::Compacted { requested: revision, compacted: self.compacted });
        }
        self.compact_history(revision);
        Ok(())
    }

    fn compact_history(&mut self, revision: Revision) {
        self.compacted = revision;
        while self.history.front().is_some_and(|event| event.kv.mod_revision < revision) {
            self.history.pop_front();
        }
    }

    fn range(&self, prefix: &str) -> Range {
        let kvs = self
            .kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .collect();
        Range { kvs, revision: self.revision }
    }

    /// The events under `prefix` from revision `from` on (at most about `max` of them,
    /// never splitting a revision), and the revision to read from next time.
    fn read_events(&self, prefix: &str, from: Revision, max: usize) -> Result<(Vec<Event>, Revision)> {
        if from < self.compacted {
            return Err(StoreError::Compacted { requested: from, compacted: self.compacted });
        }
        let start = self.history.partition_point(|event| event.kv.mod_revision < from);
        let mut events: Vec<Event> = Vec::new();
        for event in self.history.range(start..) {
            let revision = event.kv.mod_revision;
            if events.len() >= max && events.last().is_some_and(|e| e.kv.mod_revision < revision) {
                return Ok((events, revision));
            }
            if event.kv.key.starts_with(prefix) {
                events.push(event.clone());
            }
        }
        Ok((events, from.max(self.revision + 1)))
    }
}

/// A random start for lease ids, so that a restarted dev control service does not hand a
/// new agent the lease id an old sidecar still keeps alive. Uses std's per-process random
/// hash keys, to avoid a dependency on a random number generator.
fn random_lease_id_base() -> LeaseId {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x6167_656e_742d_7265);
    // Keep it positive with room to count up, and never 0 (0 means "no lease").
    ((hasher.finish() >> 2) as LeaseId).max(1)
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(StoreError::Invalid("empty key".to_owned()));
    }
    Ok(())
}

/// Validates one branch of a transaction the way etcd does before running it.
fn check_ops(ops: &[Op]) -> Result<()> {
    if ops.len() > MAX_TXN_OPS {
        return Err(StoreError::Invalid(format!("too many operations in transaction ({} > {MAX_TXN_OPS})", ops.len())));
    }
    let mut puts = HashSet::new();
    let mut deletes = HashSet::new();
    let mut bytes = 0;
    for op in ops {
        match op {
            Op::Put { key, value, .. } => {
                check_key(key)?;
                if !puts.insert(key.as_str()) || deletes.contains(key.as_str()) {
                    return Err(duplicate_key(key));
                }
                bytes += key.len() + value.len();
            }
            Op::Delete { key } => {
                check_key(key)?;
                if puts.contains(key.as_str()) {
                    return Err(duplicate_key(key));
                }
                deletes.insert(key.as_str());
                bytes += key.len();
            }
        }
    }
    check_size(bytes)
}

fn duplicate_key(key: &str) -> StoreError {
    StoreError::Invalid(format!("duplicate key {key:?} in transaction"))
}

fn check_size(bytes: usize) -> Result<()> {
    if bytes > MAX_REQUEST_BYTES {
        return Err(StoreError::Invalid(format!("request is too large ({bytes} bytes > {MAX_REQUEST_BYTES})")));
    }
    Ok(())
}

/// etcd counts lease TTLs in whole seconds; a fractional TTL is rounded up.
pub(crate) fn whole_seconds(ttl: Duration) -> Result<Duration> {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    if secs == 0 {
        return Err(StoreError::Invalid("lease TTL must be positive".to_owned()));
    }
    if secs > MAX_LEASE_TTL_SECS {
        return Err(StoreError::Invalid(format!("lease TTL {secs}s exceeds the maximum of {MAX_LEASE_TTL_SECS}s")));
    }
    Ok(Duration::from_secs(secs))
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseGrant> {
        let ttl = whole_seconds(ttl)?.max(whole_seconds(self.inner.min_lease_ttl).unwrap_or_default());
        self.ensure_lease_task();
        let grant = self.inner.with_state(|state, now| state.grant(ttl, now));
        self.inner.lease_wakeup.notify_one();
        Ok(grant)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.inner.with_state(|state, now| state.keep_alive(lease, now))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.inner.with_state(|state, _| state.revoke(lease))
    }

    async fn put(&self, key: &str, value: Bytes, lease: Option<LeaseId>) -> Result<Revision> {
        check_key(key)?;
        check_size(key.len() + value.len())?;
        let ops = vec![Op::Put { key: key.to_owned(), value, lease }];
        self.inner.with_state(|state, _| {
            state.check_leases(&ops)?;
            Ok(state.apply(ops))
        })
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        check_key(key)?;
        Ok(self.inner.with_state(|state, _| state.kvs.get(key).cloned()))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Range> {
        Ok(self.inner.with_state(|state, _| state.range(prefix)))
    }

    async fn delete(&self, key: &str) -> Result<(Revision, bool)> {
        check_key(key)?;
        Ok(self.inner.with_state(|state, _| {
            let existed = state.kvs.contains_key(key);
            (state.apply(vec![Op::Delete { key: key.to_owned() }]), existed)
        }))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        if txn.compares.len() > MAX_TXN_OPS {
            return Err(StoreError::Invalid(format!(
                "too many compares in transaction ({} > {MAX_TXN_OPS})",
                txn.compares.len()
            )));
        }
        for compare in &txn.compares {
            let (Compare::ModRevision(key, _) | Compare::Value(key, _)) = compare;
            check_key(key)?;
        }
        check_ops(&txn.success)?;
        check_ops(&txn.failure)?;
        self.inner.with_state(|state, _| {
            let succeeded = txn.compares.iter().all(|compare| state.holds(compare));
            let ops = if succeeded { txn.success } else { txn.failure };
            state.check_leases(&ops)?;
            let revision = state.apply(ops);
            Ok(TxnResult { succeeded, revision })
        })
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream> {
        if start_revision <= 0 {
            return Err(StoreError::Invalid(format!("watch start revision must be positive, got {start_revision}")));
        }
        let head = self.inner.head.subscribe();
        let compacted = lock(&self.inner.state).compacted;
        if start_revision < compacted {
            return Err(StoreError::Compacted { requested: start_revision, compacted });
        }
        let cursor = WatchCursor {
            store: Arc::downgrade(&self.inner),
            head,
            prefix: prefix.to_owned(),
            next: start_revision,
            done: false,
        };
        let stream = futures_util::stream::unfold(cursor, |mut cursor| async move {
            let item = cursor.next_batch().await?;
            Some((item, cursor))
        });
        Ok(Box::pin(stream))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.with_state(|state, _| state.compact(revision))
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.inner.with_state(|state, _| state.revision))
    }
}

/// One watch: a position in the shared history, read whenever the head revision moves.
struct WatchCursor {
    /// Weak, so that an open watch does not keep a dropped store alive.
    store: Weak<Inner>,
    head: watch::Receiver<Revision>,
    prefix: String,
    /// The first revision not yet delivered.
    next: Revision,
    done: bool,
}

impl WatchCursor {
    async fn next_batch(&mut self) -> Option<Result<WatchBatch>> {
        if self.done {
            return None;
        }
        loop {
            // Marks the current head as seen before reading, so that a write after the read
            // makes `changed` return.
            self.head.borrow_and_update();
            let read = match self.store.upgrade() {
                Some(store) => lock(&store.state).read_events(&self.prefix, self.next, MAX_BATCH_EVENTS),
                None => Err(store_dropped()),
            };
            match read {
                Ok((events, next)) => {
                    self.next = next;
                    if !events.is_empty() {
                        return Some(Ok(WatchBatch { events }));
                    }
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
            if self.head.changed().await.is_err() {
                self.done = true;
                return Some(Err(store_dropped()));
            }
        }
    }
}

fn store_dropped() -> StoreError {
    StoreError::Unavailable("the embedded store was dropped".to_owned())
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn store() -> EmbeddedStore {
        EmbeddedStore::default()
    }

    async fn next_batch(watch: &mut WatchStream) -> WatchBatch {
        match tokio::time::timeout(Duration::from_secs(3600), watch.next()).await {
            Ok(Some(Ok(batch))) => batch,
            other => panic!("expected a watch batch, got {other:?}"),
        }
    }

    fn delete_of(key: &str, revision: Revision) -> Event {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: key.to_owned(),
                value: Bytes::new(),
                create_revision: 0,
                mod_revision: revision,
                version: 0,
                lease: 0,
            },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lease_expires_exactly_at_its_ttl() {
        let store = store();
        let lease = store.grant_lease(10 * SECOND).await.unwrap();
        assert_eq!(lease.ttl, 10 * SECOND);
        let revision = store.put("a/k", Bytes::from_static(b"v"), Some(lease.id)).await.unwrap();
        let mut watch = store.watch_prefix("a/", revision + 1).await.unwrap();
        let start = Instant::now();

        let batch = next_batch(&mut watch).await;
        assert_eq!(start.elapsed(), 10 * SECOND, "expired at the wrong time");
        assert_eq!(batch.events, vec![delete_of("a/k", revision + 1)]);
        assert_eq!(store.get("a/k").await.unwrap(), None);
        assert_eq!(store.keep_alive(lease.id).await, Err(StoreError::LeaseNotFound(lease.id)));
        assert_eq!(store.current_revision().await.unwrap(), revision + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_never_see_a_key_past_its_lease_deadline() {
        let store = store();
        let lease = store.grant_lease(5 * SECOND).await.unwrap();
        store.put("k", Bytes::from_static(b"v"), Some(lease.id)).await.unwrap();
        // Moves the clock without letting the expiry task run: reads expire due leases.
        tokio::time::advance(5 * SECOND - Duration::from_millis(1)).await;
        assert!(store.get("k").await.unwrap().is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(store.get("k").await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_restarts_the_ttl() {
        let store = store();
        let lease = store.grant_lease(10 * SECOND).await.unwrap();
        store.put("k", Bytes::from_static(b"v"), Some(lease.id)).await.unwrap();
        let start = Instant::now();

        tokio::time::sleep(6 * SECOND).await;
        assert_eq!(store.keep_alive(lease.id).await.unwrap(), 10 * SECOND);
        tokio::time::sleep(6 * SECOND).await;
        assert!(store.get("k").await.unwrap().is_some(), "expired despite the keep-alive");

        let mut watch = store.watch_prefix("k", store.current_revision().await.unwrap() + 1).await;
        let batch = next_batch(watch.as_mut().unwrap()).await;
        assert_eq!(start.elapsed(), 16 * SECOND, "should expire 10 s after the keep-alive");
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].kind, EventKind::Delete);
    }

    #[tokio::test(start_paused = true)]
    async fn revoke_deletes_all_keys_of_the_lease_in_one_revision() {
        let store = store();
        let lease = store.grant_lease(60 * SECOND).await.unwrap();
        let other = store.grant_lease(60 * SECOND).await.unwrap();
        store.put("l/a", Bytes::from_static(b"1"), Some(lease.id)).await.unwrap();
        store.put("l/b", Bytes::from_static(b"2"), Some(lease.id)).await.unwrap();
        store.put("l/c", Bytes::from_static(b"3"), Some(other.id)).await.unwrap();
        // Re-put without a lease: detached, so the revoke leaves it alone.
        store.put("l/d", Bytes::from_static(b"4"), Some(lease.id)).await.unwrap();
        let revision = store.put("l/d", Bytes::from_static(b"5"), None).await.unwrap();
        let mut watch = store.watch_prefix("l/", revision + 1).await.unwrap();

        store.revoke_lease(lease.id).await.unwrap();
        assert_eq!(store.current_revision().await.unwrap(), revision + 1);
        let batch = next_batch(&mut watch).await;
        assert_eq!(batch.events, vec![delete_of("l/a", revision + 1), delete_of("l/b", revision + 1)]);
        let keys: Vec<_> = store.get_prefix("l/").await.unwrap().kvs.into_iter().map(|kv| kv.key).collect();
        assert_eq!(keys, ["l/c", "l/d"]);
        assert_eq!(store.revoke_lease(lease.id).await, Err(StoreError::LeaseNotFound(lease.id)));
        assert_eq!(store.put("l/e", Bytes::new(), Some(lease.id)).await, Err(StoreError::LeaseNotFound(lease.id)));
        // A lease without keys expires or is revoked without a revision.
        let empty = store.grant_lease(SECOND).await.unwrap();
        store.revoke_lease(empty.id).await.unwrap();
        assert_eq!(store.current_revision().await.unwrap(), revision + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn several_leases_expire_in_deadline_order_one_revision_each() {
        let store = store();
        let start = Instant::now();
        let mut expected = Vec::new();
        for (key, secs) in [("m/five", 5), ("m/three", 3), ("m/eight", 8)] {
            let lease = store.grant_lease(secs * SECOND).await.unwrap();
            store.put(key, Bytes::from_static(b"v"), Some(lease.id)).await.unwrap();
            expected.push((secs, key));
        }
        expected.sort();
        let first = store.current_revision().await.unwrap() + 1;
        let mut watch = store.watch_prefix("m/", first).await.unwrap();
        for (i, (secs, key)) in expected.into_iter().enumerate() {
            let batch = next_batch(&mut watch).await;
            assert_eq!(start.elapsed(), secs * SECOND, "{key} expired at the wrong time");
            assert_eq!(batch.events, vec![delete_of(key, first + i as Revision)]);
        }
        // A new lease granted while the task sleeps on a later deadline still expires on time.
        let late = store.grant_lease(100 * SECOND).await.unwrap();
        store.put("m/late", Bytes::new(), Some(late.id)).await.unwrap();
        let early = store.grant_lease(2 * SECOND).await.unwrap();
        store.put("m/early", Bytes::new(), Some(early.id)).await.unwrap();
        let granted = Instant::now();
        let batch = next_batch(&mut watch).await; // the two puts
        assert_eq!(batch.events.len(), 2);
        let batch = next_batch(&mut watch).await;
        assert_eq!(granted.elapsed(), 2 * SECOND);
        assert_eq!(batch.events[0].kv.key, "m/early");
    }

    #[tokio::test(start_paused = true)]
    async fn lease_ttls_are_whole_seconds_and_at_least_the_minimum() {
        let store = store();
        assert_eq!(store.grant_lease(Duration::from_millis(2500)).await.unwrap().ttl, 3 * SECOND);
        assert!(matches!(store.grant_lease(Duration::ZERO).await, Err(StoreError::Invalid(_))));
        // Raised to etcd's default minimum, unless configured otherwise.
        assert_eq!(store.grant_lease(SECOND).await.unwrap().ttl, 2 * SECOND);
        let options = EmbeddedOptions { min_lease_ttl: SECOND, ..EmbeddedOptions::default() };
        let store = EmbeddedStore::new(options);
        assert_eq!(store.grant_lease(Duration::from_millis(100)).await.unwrap().ttl, SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_task_ends_with_the_last_handle_and_watches_end() {
        let store = store();
        let clone = store.clone();
        store.grant_lease(60 * SECOND).await.unwrap();
        let wakeup = Arc::clone(&store.inner.lease_wakeup);
        let weak = Arc::downgrade(&store.inner);
        let mut watch = store.watch_prefix("", 1).await.unwrap();
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&wakeup), 3, "the store, the task and this test");

        drop(store);
        tokio::task::yield_now().await;
        assert!(weak.upgrade().is_some(), "a clone is still alive");
        drop(clone);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(weak.upgrade().is_none(), "the store outlived its last handle");
        assert_eq!(Arc::strong_count(&wakeup), 1, "the lease task is still running");
        assert!(matches!(watch.next().await, Some(Err(StoreError::Unavailable(_)))));
        assert!(watch.next().await.is_none());
    }

    #[tokio::test]
    async fn a_watch_behind_the_kept_history_fails_with_compacted() {
        let store = EmbeddedStore::new(EmbeddedOptions { history_limit: 3, ..EmbeddedOptions::default() });
        let mut watch = store.watch_prefix("k", 2).await.unwrap();
        for i in 0..5u8 {
            store.put("k", Bytes::from(vec![i]), None).await.unwrap();
        }
        // Revisions 2..=6 were written; the last 3 (4, 5, 6) are kept.
        assert_eq!(watch.next().await, Some(Err(StoreError::Compacted { requested: 2, compacted: 4 })));
        assert!(watch.next().await.is_none());
        assert!(matches!(store.watch_prefix("k", 3).await, Err(StoreError::Compacted { requested: 3, compacted: 4 })));
        let mut watch = store.watch_prefix("k", 4).await.unwrap();
        let revisions: Vec<_> = next_batch(&mut watch).await.events.iter().map(|e| e.kv.mod_revision).collect();
        assert_eq!(revisions, [4, 5, 6]);
    }

    #[tokio::test]
    async fn large_replays_are_split_at_revision_boundaries() {
        let store = store();
        for i in 0..(MAX_BATCH_EVENTS / 2 + 1) {
            let txn = Txn {
                success: vec![
                    Op::Put { key: format!("t/{i}/a"), value: Bytes::new(), lease: None },
                    Op::Put { key: format!("t/{i}/b"), value: Bytes::new(), lease: None },
                ],
                ..Txn::default()
            };
            store.txn(txn).await.unwrap();
        }
        let mut watch = store.watch_prefix("t/", 1).await.unwrap();
        let first = next_batch(&mut watch).await;
        assert_eq!(first.events.len(), MAX_BATCH_EVENTS);
        let second = next_batch(&mut watch).await;
        assert_eq!(second.events.len(), 2);
        assert_eq!(second.events[0].kv.mod_revision, second.events[1].kv.mod_revision);
        assert!(first.events.last().unwrap().kv.mod_revision < second.events[0].kv.mod_revision);
    }

    #[tokio::test]
    async fn transactions_are_validated_like_etcd() {
        let store = store();
        let put = |key: &str| Op::Put { key: key.to_owned(), value: Bytes::new(), lease: None };
        let duplicate = Txn { success: vec![put("a"), put("a")], ..Txn::default() };
        assert!(matches!(store.txn(duplicate).await, Err(StoreError::Invalid(_))));
        let too_many = Txn { failure: (0..129).map(|i| put(&i.to_string())).collect(), ..Txn::default() };
        assert!(matches!(store.txn(too_many).await, Err(StoreError::Invalid(_))));
        let bad_lease =
            Txn { success: vec![Op::Put { key: "a".into(), value: Bytes::new(), lease: Some(7) }], ..Txn::default() };
        assert_eq!(store.txn(bad_lease).await, Err(StoreError::LeaseNotFound(7)));
        assert_eq!(store.current_revision().await.unwrap(), 1, "a failed txn wrote something");
    }
}
