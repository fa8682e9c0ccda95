//! Counters of the control service, kept in plain atomics so that tests, the scale
//! benchmark and (later) the `/metrics` endpoint read the same numbers.
//!
//! [`CountingStore`] wraps the store and counts every request the service sends to it, so
//! "etcd writes per heartbeat" is measured at the one place all writes go through rather
//! than estimated. Nothing here formats or exports metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use agent_reach_store::{KeyValue, LeaseGrant, LeaseId, Range, Result, Revision, Store, Txn, TxnResult, WatchStream};
use bytes::Bytes;

/// Counters of one control replica. Gauges are `AtomicI64`, counters `AtomicU64`.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Control calls let through without a certificate (permissive mTLS).
    pub anonymous_calls: AtomicU64,
    /// TLS handshakes on the gRPC port, completed and refused.
    pub tls: Arc<agent_reach_identity::net::HandshakeStats>,
    /// Registrations stored (new and re-registrations).
    pub registrations: AtomicU64,
    /// Instance heartbeats received (one per instance entry of a Heartbeat request).
    pub heartbeats: AtomicU64,
    /// Heartbeat requests received (each carries a batch of instance heartbeats).
    pub heartbeat_requests: AtomicU64,
    /// Record writes caused by a state change in a heartbeat.
    pub state_writes: AtomicU64,
    /// Record writes caused by a meaningful load change in a heartbeat.
    pub load_writes: AtomicU64,
    /// Meaningful load changes not written yet because the instance's record was written
    /// less than one load-report interval ago (a later heartbeat writes them).
    pub load_writes_deferred: AtomicU64,
    /// Requests that wrote to the store: puts, transactions, deletes, lease grants and
    /// revocations (a failed compare-and-swap transaction counts too).
    pub store_writes: AtomicU64,
    /// Reads: single keys and prefixes.
    pub store_reads: AtomicU64,
    /// Lease keep-alives sent to the store.
    pub store_keep_alives: AtomicU64,
    /// Watches opened on the store (one per tenant feed start, plus catch-up watches).
    pub store_watches_opened: AtomicU64,
    /// Tenant feeds running (each holds one store watch): gauge.
    pub feeds: AtomicI64,
    /// Watches refused because `--max-tenant-feeds` feeds were running, all in use.
    pub feed_refusals: AtomicU64,
    /// Sidecar watch streams open: gauge.
    pub watch_streams: AtomicI64,
    /// Snapshots sent to sidecars (including resyncs).
    pub snapshots_sent: AtomicU64,
    /// Snapshots flagged `resync` (the sidecar's revision was compacted or unknown).
    pub resyncs_sent: AtomicU64,
    /// Deltas sent to sidecars.
    pub deltas_sent: AtomicU64,
    /// Sidecars that resumed from a revision older than their feed's memory and were
    /// caught up from the store's history.
    pub catch_ups: AtomicU64,
    /// Alerts fired and delivered (see [`crate::alerts`]).
    pub alerts: AlertCounters,
    /// Session context writes, refusals and live sessions (see [`crate::sessions`]).
    pub sessions: crate::session_stats::SessionCounters,
    /// Connections of the gRPC port refused or closed by a limit (see [`crate::conn`]).
    pub conn: Arc<crate::limit_stats::ConnStats>,
}

/// Counters of the alert rules and the webhook.
#[derive(Debug, Default)]
pub struct AlertCounters {
    /// Alerts fired by the rule "instances lost together".
    pub instances_lost: AtomicU64,
    /// Alerts fired by the rule "fewer healthy instances than the minimum".
    pub below_min_healthy: AtomicU64,
    /// Alerts fired by the rule "served by its fallback".
    pub fallback_serving: AtomicU64,
    /// Alerts fired by the rule "breakers open on more than half of an agent's instances".
    pub breakers_open: AtomicU64,
    /// Alerts of any rule in force now: gauge.
    pub active: AtomicI64,
    /// Alerts POSTed to the webhook and answered 2xx.
    pub webhook_delivered: AtomicU64,
    /// Alerts given up on (attempts exhausted or a 4xx answer).
    pub webhook_failed: AtomicU64,
    /// Alerts not queued for the webhook because its queue was full.
    pub webhook_dropped: AtomicU64,
    /// Alerts another replica claimed first (it delivers them).
    pub webhook_claimed_elsewhere: AtomicU64,
    /// POST attempts, including retries.
    pub webhook_attempts: AtomicU64,
}

impl ControlStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds a gauge up by one until dropped.
pub(crate) struct GaugeGuard(Arc<ControlStats>, fn(&ControlStats) -> &AtomicI64);

impl GaugeGuard {
    pub(crate) fn new(stats: Arc<ControlStats>, gauge: fn(&ControlStats) -> &AtomicI64) -> GaugeGuard {
        gauge(&stats).fetch_add(1, Ordering::Relaxed);
        GaugeGuard(stats, gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        (self.1)(&self.0).fetch_sub(1, Ordering::Relaxed);
    }
}

/// A [`Store`] that counts the requests passing through it into [`ControlStats`].
pub struct CountingStore {
    inner: Arc<dyn Store>,
    stats: Arc<ControlStats>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>, stats: Arc<ControlStats>) -> CountingStore {
        CountingStore { inner, stats }
    }

    fn write(&self) {
        ControlStats::inc(&self.stats.store_writes);
    }

    fn read(&self) {
        ControlStats::inc(&self.stats.store_reads);
    }
}

#[async_trait::async_trait]
impl Store for CountingStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.write();
        self.inner.grant_lease(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        ControlStats::inc(&self.stats.store_keep_alives);
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.write();
        self.inner.revoke_lease(lease).await
    }

    async fn put(&self, key: &str, value: Bytes, lease: Option<LeaseId>) -> Result<Revision> {
        self.write();
        self.inner.put(key, value, lease).await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.read();
        self.inner.get(key).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Range> {
        self.read();
        self.inner.get_prefix(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(Revision, bool)> {
        self.write();
        self.inner.delete(key).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        self.write();
        self.inner.txn(txn).await
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream> {
        ControlStats::inc(&self.stats.store_watches_opened);
        self.inner.watch_prefix(prefix, start_revision).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.read();
        self.inner.current_revision().await
    }
}
