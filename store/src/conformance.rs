//! The conformance suite: one set of exact behaviours that every [`Store`] backend passes
//! (feature `test-util`).
//!
//! Each case asserts what etcd 3.4 does — exact revisions, versions, event kinds and
//! batching, error variants — not merely that calls succeed, and bounds every call and
//! every wait for a watch event with a timeout, so a broken backend fails fast instead of
//! hanging. Cases panic with a message on failure, like any test.
//!
//! Every run works under its own key prefix (`{prefix_root}/{unique}/…`), so runs can share
//! one etcd one after the other. They must not run *concurrently* on one store: the suite
//! asserts that revisions move by exactly one per write and compacts the store's history,
//! both of which are global to the store. The suite does not test durability, clustering
//! or performance.

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::{Instant, timeout};

use crate::{
    Compare, Event, EventKind, KeyValue, LeaseId, Op, Revision, Store, StoreError, Txn, TxnResult, WatchBatch,
    WatchStream,
};

/// Longest wait for one store call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a watch event that should already be there or come at once.
const WATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The TTL of the lease the expiry case lets run out (about etcd's minimum).
const SHORT_TTL: Duration = Duration::from_secs(2);
/// Longest wait for that lease to expire (etcd checks expiry every 500 ms).
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs every case, in order, each under its own prefix below a unique prefix for this run.
pub async fn run_all(store: &dyn Store, prefix_root: &str) {
    assert!(matches!(store.backend(), "etcd" | "embedded"), "unknown backend name {:?}", store.backend());
    let root = format!("{}/{}", prefix_root.trim_end_matches('/'), unique_run_id());
    revisions_and_versions(store, &format!("{root}/revisions/")).await;
    delete_of_a_missing_key(store, &format!("{root}/delete/")).await;
    prefix_reads(store, &format!("{root}/prefix/")).await;
    large_prefix_reads(store, &format!("{root}/large/")).await;
    compare_and_swap(store, &format!("{root}/txn/")).await;
    transaction_events_share_one_batch(store, &format!("{root}/txn-events/")).await;
    leases(store, &format!("{root}/leases/")).await;
    lease_expiry(store, &format!("{root}/expiry/")).await;
    watch_replays_history(store, &format!("{root}/replay/")).await;
    watch_from_the_next_or_a_future_revision(store, &format!("{root}/live/")).await;
    invalid_requests(store, &format!("{root}/invalid/")).await;
    // Last: compaction is global to the store.
    compaction(store, &format!("{root}/compaction/")).await;
}

/// Revisions move by one per write; put returns the revision reads then report; create
/// revision and version follow etcd (version counts writes since creation).
pub async fn revisions_and_versions(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}k");
    let r0 = call("current_revision", store.current_revision()).await;
    let r1 = call("put", store.put(&key, bytes("v1"), None)).await;
    assert_eq!(r1, r0 + 1, "the first put must take the next revision");
    assert_eq!(get(store, &key).await, Some(kv(&key, "v1", r1, r1, 1, 0)));

    let r2 = call("put", store.put(&key, bytes("v2"), None)).await;
    assert_eq!(r2, r0 + 2);
    assert_eq!(get(store, &key).await, Some(kv(&key, "v2", r1, r2, 2, 0)));
    assert_eq!(call("current_revision", store.current_revision()).await, r2);

    let (r3, existed) = call("delete", store.delete(&key)).await;
    assert_eq!((r3, existed), (r0 + 3, true), "delete of an existing key");
    assert_eq!(get(store, &key).await, None);

    // A re-created key starts over: new create revision, version 1.
    let r4 = call("put", store.put(&key, bytes("v3"), None)).await;
    assert_eq!(r4, r0 + 4);
    assert_eq!(get(store, &key).await, Some(kv(&key, "v3", r4, r4, 1, 0)));
    assert_eq!(call("current_revision", store.current_revision()).await, r4);
}

/// Deleting a missing key reports `existed == false` and does not move the revision.
pub async fn delete_of_a_missing_key(store: &dyn Store, prefix: &str) {
    let r0 = call("current_revision", store.current_revision()).await;
    let result = call("delete", store.delete(&format!("{prefix}missing"))).await;
    assert_eq!(result, (r0, false), "delete of a missing key must not write");
    assert_eq!(call("current_revision", store.current_revision()).await, r0);
    assert_eq!(get(store, &format!("{prefix}missing")).await, None);
}

/// Prefix reads return exactly the keys under the prefix, in byte order, at the current
/// revision; a sibling prefix (`a/` vs `ab/`) is not included.
pub async fn prefix_reads(store: &dyn Store, prefix: &str) {
    for (key, value) in [("a/2", "two"), ("a/10", "ten"), ("a/1", "one"), ("a", "bare")] {
        call("put", store.put(&format!("{prefix}{key}"), bytes(value), None)).await;
    }
    call("put", store.put(&format!("{prefix}ab/1"), bytes("sibling"), None)).await;
    let last = call("put", store.put(&format!("{prefix}b"), bytes("after"), None)).await;

    let range = call("get_prefix", store.get_prefix(&format!("{prefix}a/"))).await;
    assert_eq!(keys_of(&range.kvs, prefix), ["a/1", "a/10", "a/2"]);
    assert_eq!(range.revision, last, "a range reports the current revision");
    for found in &range.kvs {
        assert_eq!(get(store, &found.key).await.as_ref(), Some(found), "range and get differ");
    }
    assert_eq!(range.kvs[1].value, bytes("ten"));

    let range = call("get_prefix", store.get_prefix(&format!("{prefix}ab/"))).await;
    assert_eq!(keys_of(&range.kvs, prefix), ["ab/1"]);

    let range = call("get_prefix", store.get_prefix(&format!("{prefix}a"))).await;
    assert_eq!(keys_of(&range.kvs, prefix), ["a", "a/1", "a/10", "a/2", "ab/1"]);

    let range = call("get_prefix", store.get_prefix(&format!("{prefix}nothing/"))).await;
    assert!(range.kvs.is_empty(), "unexpected keys: {:?}", range.kvs);
    assert_eq!(range.revision, last);
}

/// A prefix read of thousands of keys (more than one etcd page) is complete, in order,
/// and at one revision.
pub async fn large_prefix_reads(store: &dyn Store, prefix: &str) {
    const KEYS: usize = 2500;
    let mut last = 0;
    let names: Vec<String> = (0..KEYS).map(|i| format!("{prefix}{i:05}")).collect();
    for chunk in names.chunks(100) {
        let txn = Txn { success: chunk.iter().map(|key| put_op(key, key)).collect(), ..Txn::default() };
        last = call("txn", store.txn(txn)).await.revision;
    }
    let range = call("get_prefix", store.get_prefix(prefix)).await;
    assert_eq!(range.revision, last);
    assert_eq!(range.kvs.len(), KEYS, "keys under {prefix}");
    for (kv, name) in range.kvs.iter().zip(&names) {
        assert_eq!((&kv.key, &kv.value), (name, &bytes(name)), "keys out of order or wrong");
    }
}

/// Compare-and-swap transactions: exact `succeeded`, the failure branch applied otherwise,
/// all operations under one revision, no revision when nothing changes.
pub async fn compare_and_swap(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}k");
    let key2 = format!("{prefix}k2");
    let lost = format!("{prefix}lost");
    let r0 = call("current_revision", store.current_revision()).await;
    let create_if_absent = || Txn {
        compares: vec![Compare::ModRevision(key.clone(), 0)],
        success: vec![put_op(&key, "first")],
        failure: vec![put_op(&lost, "x")],
    };

    let result = call("txn", store.txn(create_if_absent())).await;
    assert_eq!(result, TxnResult { succeeded: true, revision: r0 + 1 }, "create if absent");
    assert_eq!(get(store, &key).await, Some(kv(&key, "first", r0 + 1, r0 + 1, 1, 0)));
    assert_eq!(get(store, &lost).await, None, "the failure branch ran on success");

    let result = call("txn", store.txn(create_if_absent())).await;
    assert_eq!(result, TxnResult { succeeded: false, revision: r0 + 2 }, "create if present");
    assert_eq!(get(store, &key).await, Some(kv(&key, "first", r0 + 1, r0 + 1, 1, 0)));
    assert_eq!(get(store, &lost).await, Some(kv(&lost, "x", r0 + 2, r0 + 2, 1, 0)));

    // Both operations of the success branch share one revision.
    let swap = Txn {
        compares: vec![Compare::ModRevision(key.clone(), r0 + 1)],
        success: vec![Op::Delete { key: key.clone() }, put_op(&key2, "b")],
        failure: vec![],
    };
    let result = call("txn", store.txn(swap)).await;
    assert_eq!(result, TxnResult { succeeded: true, revision: r0 + 3 });
    assert_eq!(get(store, &key).await, None);
    assert_eq!(get(store, &key2).await, Some(kv(&key2, "b", r0 + 3, r0 + 3, 1, 0)));

    // A failed compare with an empty failure branch writes nothing.
    let stale = Txn {
        compares: vec![Compare::ModRevision(key2.clone(), r0 + 1)],
        success: vec![put_op(&key2, "never")],
        failure: vec![],
    };
    let result = call("txn", store.txn(stale)).await;
    assert_eq!(result, TxnResult { succeeded: false, revision: r0 + 3 }, "stale compare");

    let if_value = |value: &str, new: &str| Txn {
        compares: vec![Compare::Value(key2.clone(), bytes(value))],
        success: vec![put_op(&key2, new)],
        failure: vec![],
    };
    let result = call("txn", store.txn(if_value("b", "c"))).await;
    assert_eq!(result, TxnResult { succeeded: true, revision: r0 + 4 }, "value compare");
    assert_eq!(get(store, &key2).await, Some(kv(&key2, "c", r0 + 3, r0 + 4, 2, 0)));
    let result = call("txn", store.txn(if_value("b", "d"))).await;
    assert_eq!(result, TxnResult { succeeded: false, revision: r0 + 4 }, "old value compare");

    // A missing key does not have the empty value.
    let missing = Txn { compares: vec![Compare::Value(format!("{prefix}missing"), Bytes::new())], ..Txn::default() };
    let result = call("txn", store.txn(missing)).await;
    assert_eq!(result, TxnResult { succeeded: false, revision: r0 + 4 }, "missing key value");

    // All compares must hold.
    let both = |value: &str| Txn {
        compares: vec![Compare::ModRevision(key2.clone(), r0 + 4), Compare::Value(key2.clone(), bytes(value))],
        ..Txn::default()
    };
    assert!(call("txn", store.txn(both("c"))).await.succeeded, "both compares hold");
    assert!(!call("txn", store.txn(both("x"))).await.succeeded, "one compare fails");

    // Deleting a missing key in a transaction changes nothing, so takes no revision.
    let noop = Txn { success: vec![Op::Delete { key: key.clone() }], ..Txn::default() };
    let result = call("txn", store.txn(noop)).await;
    assert_eq!(result, TxnResult { succeeded: true, revision: r0 + 4 }, "no-op delete");
    assert_eq!(call("current_revision", store.current_revision()).await, r0 + 4);
}

/// All events of one transaction come in one batch, at one revision, in operation order.
pub async fn transaction_events_share_one_batch(store: &dyn Store, prefix: &str) {
    let b = format!("{prefix}b");
    let r0 = call("put", store.put(&b, bytes("old"), None)).await;
    let mut watch = Watcher::open(store, prefix, r0 + 1).await;
    let c = format!("{prefix}c");
    let a = format!("{prefix}a");
    let txn = Txn { success: vec![put_op(&c, "3"), put_op(&a, "1"), Op::Delete { key: b.clone() }], ..Txn::default() };
    call("txn", store.txn(txn)).await;
    let batch = watch.next_batch().await;
    assert_eq!(
        batch.events,
        vec![
            put_event(kv(&c, "3", r0 + 1, r0 + 1, 1, 0)),
            put_event(kv(&a, "1", r0 + 1, r0 + 1, 1, 0)),
            delete_event(&b, r0 + 1),
        ],
        "the events of one transaction"
    );
}

/// Leases: grant, attach, keep alive, revoke (deleting every key of the lease under one
/// revision), and `LeaseNotFound` once gone.
pub async fn leases(store: &dyn Store, prefix: &str) {
    let grant = call("grant_lease", store.grant_lease(Duration::from_secs(30))).await;
    assert_ne!(grant.id, 0, "0 means no lease");
    assert_eq!(grant.ttl, Duration::from_secs(30));
    let other = call("grant_lease", store.grant_lease(Duration::from_secs(30))).await;
    assert_ne!(other.id, grant.id);

    let a = format!("{prefix}a");
    let b = format!("{prefix}b");
    let detached = format!("{prefix}detached");
    let ra = call("put", store.put(&a, bytes("1"), Some(grant.id))).await;
    assert_eq!(get(store, &a).await, Some(kv(&a, "1", ra, ra, 1, grant.id)));
    let rb = call("put", store.put(&b, bytes("2"), Some(grant.id))).await;
    // A put without a lease detaches the key from its lease, as in etcd.
    call("put", store.put(&detached, bytes("3"), Some(grant.id))).await;
    let rd = call("put", store.put(&detached, bytes("4"), None)).await;
    assert_eq!(get(store, &detached).await, Some(kv(&detached, "4", rd - 1, rd, 2, 0)));

    let ttl = call("keep_alive", store.keep_alive(grant.id)).await;
    assert_eq!(ttl, Duration::from_secs(30));
    assert_eq!(get(store, &b).await, Some(kv(&b, "2", rb, rb, 1, grant.id)));

    let mut watch = Watcher::open(store, prefix, rd + 1).await;
    call("revoke_lease", store.revoke_lease(grant.id)).await;
    assert_eq!(
        call("current_revision", store.current_revision()).await,
        rd + 1,
        "a revoke deletes all keys of the lease under one revision"
    );
    let batch = watch.next_batch().await;
    assert_eq!(batch.events, vec![delete_event(&a, rd + 1), delete_event(&b, rd + 1)]);
    assert_eq!(get(store, &a).await, None);
    assert_eq!(get(store, &b).await, None);
    assert_eq!(get(store, &detached).await, Some(kv(&detached, "4", rd - 1, rd, 2, 0)));

    let gone = Some(StoreError::LeaseNotFound(grant.id));
    assert_eq!(with_timeout("keep_alive", store.keep_alive(grant.id)).await.err(), gone);
    assert_eq!(with_timeout("revoke_lease", store.revoke_lease(grant.id)).await.err(), gone);
    let put = store.put(&a, bytes("x"), Some(grant.id));
    assert_eq!(with_timeout("put", put).await.err(), gone);
    let txn =
        Txn { success: vec![Op::Put { key: a.clone(), value: bytes("x"), lease: Some(grant.id) }], ..Txn::default() };
    assert_eq!(with_timeout("txn", store.txn(txn)).await.err(), gone, "txn put on a revoked lease");
    assert_eq!(call("current_revision", store.current_revision()).await, rd + 1);

    // The other lease is unaffected; revoking a lease without keys writes nothing.
    assert_eq!(call("keep_alive", store.keep_alive(other.id)).await, Duration::from_secs(30));
    call("revoke_lease", store.revoke_lease(other.id)).await;
    assert_eq!(call("current_revision", store.current_revision()).await, rd + 1);
    assert_eq!(with_timeout("keep_alive", store.keep_alive(other.id)).await, Err(StoreError::LeaseNotFound(other.id)));
}

/// A lease that is not kept alive expires after its TTL: its keys are deleted under one
/// revision and a watch sees the deletions.
pub async fn lease_expiry(store: &dyn Store, prefix: &str) {
    let a = format!("{prefix}a");
    let b = format!("{prefix}b");
    let start = call("current_revision", store.current_revision()).await + 1;
    let mut watch = Watcher::open(store, prefix, start).await;
    let granted_at = Instant::now();
    let lease = call("grant_lease", store.grant_lease(SHORT_TTL)).await;
    assert_eq!(lease.ttl, SHORT_TTL);
    call("put", store.put(&a, bytes("1"), Some(lease.id))).await;
    call("put", store.put(&b, bytes("2"), Some(lease.id))).await;
    let puts = watch.events(2).await;
    assert_eq!(
        puts,
        vec![
            put_event(kv(&a, "1", start, start, 1, lease.id)),
            put_event(kv(&b, "2", start + 1, start + 1, 1, lease.id)),
        ]
    );

    let batch = watch.next_batch_within(EXPIRY_TIMEOUT, "the lease to expire").await;
    let elapsed = granted_at.elapsed();
    assert_eq!(batch.events, vec![delete_event(&a, start + 2), delete_event(&b, start + 2)]);
    assert!(elapsed >= SHORT_TTL - Duration::from_millis(50), "the lease expired after {elapsed:?}, before its TTL");
    assert_eq!(get(store, &a).await, None);
    assert_eq!(with_timeout("keep_alive", store.keep_alive(lease.id)).await, Err(StoreError::LeaseNotFound(lease.id)));
}

/// A watch from a past revision replays exactly what happened under its prefix, in
/// order, then continues live; sibling prefixes are not seen.
pub async fn watch_replays_history(store: &dyn Store, prefix: &str) {
    let dir = format!("{prefix}w/");
    let a = format!("{dir}a");
    let b = format!("{dir}b");
    let r0 = call("current_revision", store.current_revision()).await;
    call("put", store.put(&a, bytes("1"), None)).await;
    call("put", store.put(&b, bytes("2"), None)).await;
    call("delete", store.delete(&a)).await;
    call("put", store.put(&format!("{prefix}wx/c"), bytes("sibling"), None)).await;
    call("put", store.put(&b, bytes("3"), None)).await;

    let mut watch = Watcher::open(store, &dir, r0 + 1).await;
    let replay = watch.events(4).await;
    assert_eq!(
        replay,
        vec![
            put_event(kv(&a, "1", r0 + 1, r0 + 1, 1, 0)),
            put_event(kv(&b, "2", r0 + 2, r0 + 2, 1, 0)),
            delete_event(&a, r0 + 3),
            put_event(kv(&b, "3", r0 + 2, r0 + 5, 2, 0)),
        ],
        "replay from revision {}",
        r0 + 1
    );

    call("put", store.put(&format!("{prefix}wx/d"), bytes("sibling"), None)).await;
    let c = format!("{dir}c");
    call("put", store.put(&c, bytes("live"), None)).await;
    assert_eq!(watch.events(1).await, vec![put_event(kv(&c, "live", r0 + 7, r0 + 7, 1, 0))]);

    // The start revision is inclusive.
    let mut watch = Watcher::open(store, &dir, r0 + 3).await;
    assert_eq!(watch.next_batch().await.events[0], delete_event(&a, r0 + 3));
}

/// A watch from current + 1 sees only new events; one from further ahead waits for its
/// start revision (as etcd allows).
pub async fn watch_from_the_next_or_a_future_revision(store: &dyn Store, prefix: &str) {
    let r0 = call("put", store.put(&format!("{prefix}before"), bytes("0"), None)).await;
    let mut next = Watcher::open(store, prefix, r0 + 1).await;
    let mut future = Watcher::open(store, prefix, r0 + 3).await;
    let x = format!("{prefix}x");
    let y = format!("{prefix}y");
    let z = format!("{prefix}z");
    call("put", store.put(&x, bytes("1"), None)).await;
    assert_eq!(next.events(1).await, vec![put_event(kv(&x, "1", r0 + 1, r0 + 1, 1, 0))]);
    call("put", store.put(&y, bytes("2"), None)).await;
    call("put", store.put(&z, bytes("3"), None)).await;
    assert_eq!(
        future.events(1).await,
        vec![put_event(kv(&z, "3", r0 + 3, r0 + 3, 1, 0))],
        "a watch from revision {} saw an earlier event",
        r0 + 3
    );
    assert_eq!(next.events(2).await.len(), 2);
}

/// Requests that are wrong fail with `Invalid` and write nothing.
pub async fn invalid_requests(store: &dyn Store, prefix: &str) {
    let r0 = call("current_revision", store.current_revision()).await;
    let result = with_timeout("put", store.put("", bytes("v"), None)).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))), "put of an empty key: {result:?}");
    let result = with_timeout("grant_lease", store.grant_lease(Duration::ZERO)).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))), "zero TTL: {result:?}");
    let result = with_timeout("watch_prefix", store.watch_prefix(prefix, 0)).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))), "watch from revision 0");
    let result = with_timeout("compact", store.compact(r0 + 1000)).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))), "compact in the future: {result:?}");
    assert_eq!(call("current_revision", store.current_revision()).await, r0);
}

/// After `compact(r)`: watches from before `r` fail with `Compacted`, watches from `r`
/// replay from `r`, and compacting again at or before `r` fails with `Compacted`.
pub async fn compaction(store: &dyn Store, prefix: &str) {
    let key = format!("{prefix}k");
    let r1 = call("put", store.put(&key, bytes("1"), None)).await;
    let r2 = call("put", store.put(&key, bytes("2"), None)).await;
    let r3 = call("put", store.put(&key, bytes("3"), None)).await;
    call("compact", store.compact(r2)).await;
    assert_eq!(call("current_revision", store.current_revision()).await, r3);

    let error = watch_error(store, prefix, r1).await;
    assert_eq!(error, StoreError::Compacted { requested: r1, compacted: r2 }, "watch from {r1}");

    let mut watch = Watcher::open(store, prefix, r2).await;
    assert_eq!(
        watch.events(2).await,
        vec![put_event(kv(&key, "2", r1, r2, 2, 0)), put_event(kv(&key, "3", r1, r3, 3, 0)),]
    );

    for again in [r2, r1] {
        match with_timeout("compact", store.compact(again)).await {
            Err(StoreError::Compacted { requested, compacted }) => {
                assert_eq!((requested, compacted), (again, r2), "compact({again}) again");
            }
            other => panic!("compact({again}) after compact({r2}): expected Compacted, got {other:?}"),
        }
    }
    assert_eq!(get(store, &key).await, Some(kv(&key, "3", r1, r3, 3, 0)));
}

/// A watch under test: checks on every batch that revisions never go backwards and that
/// no revision is split across batches.
pub struct Watcher {
    stream: WatchStream,
    description: String,
    last_revision: Revision,
}

impl Watcher {
    pub async fn open(store: &dyn Store, prefix: &str, start: Revision) -> Self {
        let stream = call("watch_prefix", store.watch_prefix(prefix, start)).await;
        Self { stream, description: format!("watch {prefix:?} from {start}"), last_revision: 0 }
    }

    /// The next batch, which must come within [`WATCH_TIMEOUT`].
    pub async fn next_batch(&mut self) -> WatchBatch {
        self.next_batch_within(WATCH_TIMEOUT, "a watch batch").await
    }

    pub async fn next_batch_within(&mut self, wait: Duration, what: &str) -> WatchBatch {
        let batch = match timeout(wait, self.stream.next()).await {
            Ok(Some(Ok(batch))) => batch,
            Ok(Some(Err(error))) => panic!("{}: failed waiting for {what}: {error}", self.description),
            Ok(None) => panic!("{}: ended waiting for {what}", self.description),
            Err(_) => panic!("{}: nothing within {wait:?} waiting for {what}", self.description),
        };
        assert!(!batch.events.is_empty(), "{}: empty batch", self.description);
        let first = batch.events[0].kv.mod_revision;
        assert!(
            first > self.last_revision,
            "{}: revision {first} after {} (split or repeated revision)",
            self.description,
            self.last_revision
        );
        for pair in batch.events.windows(2) {
            assert!(
                pair[0].kv.mod_revision <= pair[1].kv.mod_revision,
                "{}: events out of revision order in {batch:?}",
                self.description
            );
        }
        self.last_revision = batch.events[batch.events.len() - 1].kv.mod_revision;
        batch
    }

    /// Exactly the next `count` events (the batches must end at the last of them).
    pub async fn events(&mut self, count: usize) -> Vec<Event> {
        let mut events = Vec::new();
        while events.len() < count {
            events.extend(self.next_batch().await.events);
        }
        assert_eq!(events.len(), count, "{}: more events than expected: {events:?}", self.description);
        events
    }

    /// The error the watch ends with, which must come within [`WATCH_TIMEOUT`]; the stream
    /// must end after it.
    pub async fn error(&mut self) -> StoreError {
        self.error_within(WATCH_TIMEOUT).await
    }

    pub async fn error_within(&mut self, wait: Duration) -> StoreError {
        let error = loop {
            match timeout(wait, self.stream.next()).await {
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(error))) => break error,
                Ok(None) => panic!("{}: ended without an error", self.description),
                Err(_) => panic!("{}: no error within {wait:?}", self.description),
            }
        };
        match timeout(wait, self.stream.next()).await {
            Ok(None) => error,
            other => panic!("{}: went on after {error}: {other:?}", self.description),
        }
    }
}

/// The error of a watch that must fail: at once, or as its only item.
async fn watch_error(store: &dyn Store, prefix: &str, start: Revision) -> StoreError {
    match with_timeout("watch_prefix", store.watch_prefix(prefix, start)).await {
        Err(error) => error,
        Ok(stream) => {
            let mut watcher =
                Watcher { stream, description: format!("watch {prefix:?} from {start}"), last_revision: 0 };
            match timeout(WATCH_TIMEOUT, watcher.stream.next()).await {
                Ok(Some(Err(error))) => {
                    let next = timeout(WATCH_TIMEOUT, watcher.stream.next()).await;
                    assert!(matches!(next, Ok(None)), "the watch went on after {error}: {next:?}");
                    error
                }
                other => panic!("watch from {start}: expected an error, got {other:?}"),
            }
        }
    }
}

/// Awaits a store call, failing the test if it takes longer than [`CALL_TIMEOUT`].
pub async fn with_timeout<T>(what: &str, call: impl Future<Output = T>) -> T {
    match timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => panic!("{what} did not return within {CALL_TIMEOUT:?}"),
    }
}

/// Awaits a store call that must succeed within [`CALL_TIMEOUT`].
pub async fn call<T, E: Debug>(what: &str, call: impl Future<Output = Result<T, E>>) -> T {
    match with_timeout(what, call).await {
        Ok(value) => value,
        Err(error) => panic!("{what} failed: {error:?}"),
    }
}

async fn get(store: &dyn Store, key: &str) -> Option<KeyValue> {
    call("get", store.get(key)).await
}

fn bytes(value: &str) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

fn kv(
    key: &str,
    value: &str,
    create_revision: Revision,
    mod_revision: Revision,
    version: i64,
    lease: LeaseId,
) -> KeyValue {
    KeyValue { key: key.to_owned(), value: bytes(value), create_revision, mod_revision, version, lease }
}

fn put_op(key: &str, value: &str) -> Op {
    Op::Put { key: key.to_owned(), value: bytes(value), lease: None }
}

fn put_event(kv: KeyValue) -> Event {
    Event { kind: EventKind::Put, kv }
}

/// A deletion as etcd reports it: the key and the revision, everything else empty.
fn delete_event(key: &str, revision: Revision) -> Event {
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

fn keys_of<'a>(kvs: &'a [KeyValue], prefix: &str) -> Vec<&'a str> {
    kvs.iter().map(|kv| kv.key.strip_prefix(prefix).unwrap_or(&kv.key)).collect()
}

/// Unique per process and call, so runs sharing one store never see each other's keys.
fn unique_run_id() -> String {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}-{}", std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed))
}
