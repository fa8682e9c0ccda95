//! Counters kept elsewhere in the sidecar (refusals by mechanism, calls in flight, the
//! watch's state, port limits, the sizes of the bounded maps), read at each scrape by
//! [`ScrapeCollector`]. Nothing here runs on the call path: a scrape reads atomics and
//! takes each map's lock once, briefly, for its length.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_reach_routing::{BreakerState, TableHandle, clock};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{Calls, Rejections};
use crate::control::WatchStats;

/// Reads counters kept elsewhere in the sidecar at each scrape.
pub(crate) struct ScrapeCollector {
    pub rejections: Arc<Rejections>,
    pub calls: Arc<Calls>,
    pub watch_stats: Arc<WatchStats>,
    pub table: TableHandle,
    /// Calls delivered to local agents and not yet answered.
    pub inbound_in_flight: Box<dyn Fn() -> u32 + Send + Sync>,
    /// Refusals by limit, per port ("local", "mesh").
    pub limits: [(&'static str, Arc<crate::limits::LimitStats>); 2],
    /// The maps that grow with input, each bounded.
    pub bounded: BoundedMaps,
}

/// A size read at scrape time.
pub(crate) type Size = Box<dyn Fn() -> usize + Send + Sync>;

/// The maps that grow with input (each has a cap; README "Limits on input"), whose sizes
/// `/metrics` reports as `agent_reach_bounded_entries{map}` and
/// `agent_reach_bounded_bytes{map}`. The sizes are read through closures the sidecar hands
/// in at start, so telemetry imports none of the layers above it that own the maps.
pub(crate) struct BoundedMaps {
    /// (map, entries): caller → target token buckets (`rate_buckets`), admission gates of
    /// local instances (`admission_gates`), connection-pool slots (`pool_slots`), the result
    /// cache (`result_cache`), idempotency keys (`idempotency`).
    pub entries: Vec<(&'static str, Size)>,
    /// (map, bytes) of the maps bounded in bytes (`result_cache`, `idempotency`).
    pub bytes: Vec<(&'static str, Size)>,
}

impl BoundedMaps {
    /// (map, entries) of every map.
    fn entries(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        self.entries.iter().map(|(map, size)| (*map, size()))
    }

    /// (map, bytes) of the maps bounded in bytes.
    fn bytes(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        self.bytes.iter().map(|(map, size)| (*map, size()))
    }
}

impl std::fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeCollector").finish_non_exhaustive()
    }
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
    c.encode(m)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = &self.rejections;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut rejections = encoder.encode_descriptor(
            "rejections",
            "Calls refused, by the mechanism that refused them",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (mechanism, value) in [
            ("rate_limit", load(&r.rate_limited)),
            ("circuit_breaker", load(&r.breaker_open)),
            ("admission", load(&r.overloaded)),
            ("idempotency", load(&r.idempotency_refused)),
            ("authorization", load(&r.not_authorized)),
        ] {
            ConstCounter::new(value).encode(rejections.encode_family(&[("mechanism", mechanism)])?)?;
        }
        let mut refusals = encoder.encode_descriptor(
            "limit_refusals",
            "Requests and connections refused by a limit of the local or mesh port",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (port, stats) in &self.limits {
            for (limit, value) in stats.counts() {
                ConstCounter::new(value).encode(refusals.encode_family(&[("port", *port), ("limit", limit)])?)?;
            }
        }
        let plaintext = self.limits.iter().map(|(_, s)| load(&s.plaintext_connections)).sum();
        counter(
            &mut encoder,
            "mesh_plaintext_connections",
            "Plaintext connections served by the mesh port in permissive mutual TLS (--mesh-mtls permissive)",
            plaintext,
        )?;
        counter(&mut encoder, "cache_hits", "Calls answered from the result cache", load(&r.cache_hits))?;
        counter(
            &mut encoder,
            "idempotency_replays",
            "Duplicates answered with a stored reply",
            load(&r.idempotency_replays),
        )?;
        counter(&mut encoder, "retries", "Attempts after the first, on another instance", load(&r.retries))?;
        counter(
            &mut encoder,
            "retry_budget_exhausted",
            "Retries the retry budget refused",
            load(&r.retry_budget_exhausted),
        )?;
        counter(&mut encoder, "fallbacks", "Calls sent to a policy's fallback", load(&r.fallbacks))?;
        gauge(
            &mut encoder,
            "in_flight_outbound",
            "Calls in flight through this sidecar",
            self.calls.in_flight() as i64,
        )?;
        gauge(
            &mut encoder,
            "in_flight_inbound",
            "Calls delivered to local agents and not yet answered",
            i64::from((self.inbound_in_flight)()),
        )?;
        let w = &self.watch_stats;
        gauge(
            &mut encoder,
            "watch_connected",
            "1 while a watch stream to control is up",
            i64::from(w.connected.load(Ordering::Relaxed)),
        )?;
        let table = self.table.load();
        gauge(&mut encoder, "watch_revision", "Store revision of the routing table", table.revision)?;
        counter(&mut encoder, "watch_snapshots", "Snapshots applied", load(&w.snapshots))?;
        counter(&mut encoder, "watch_resyncs", "Snapshots that replaced a table after compaction", load(&w.resyncs))?;
        counter(&mut encoder, "watch_deltas", "Deltas applied", load(&w.deltas))?;
        counter(&mut encoder, "watch_rejected", "Deltas rejected for a revision going backwards", load(&w.rejected))?;
        let (_, age) = w.staleness();
        gauge(
            &mut encoder,
            "table_stale_seconds",
            "How long the table has gone unconfirmed while control is unreachable",
            age.as_secs() as i64,
        )?;
        gauge(&mut encoder, "table_instances", "Instances in the routing table", table.len() as i64)?;
        let now = clock();
        let mut open = 0;
        let mut half_open = 0;
        for m in table.instances.values() {
            match m.stats.breaker.state(now) {
                BreakerState::Open => open += 1,
                BreakerState::HalfOpen => half_open += 1,
                BreakerState::Closed => {}
            }
        }
        let mut breakers = encoder.encode_descriptor(
            "breakers",
            "Instances whose circuit breaker is open or half-open",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (state, value) in [("open", open), ("half_open", half_open)] {
            ConstGauge::new(value).encode(breakers.encode_family(&[("state", state)])?)?;
        }
        let as_gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        let mut entries = encoder.encode_descriptor(
            "bounded_entries",
            "Entries held by a map that grows with input (each has a cap)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (map, n) in self.bounded.entries() {
            as_gauge(n).encode(entries.encode_family(&[("map", map)])?)?;
        }
        let mut bytes = encoder.encode_descriptor(
            "bounded_bytes",
            "Bytes held by a map bounded in bytes",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (map, n) in self.bounded.bytes() {
            as_gauge(n).encode(bytes.encode_family(&[("map", map)])?)?;
        }
        Ok(())
    }
}
