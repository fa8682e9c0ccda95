//! What the sidecar measures and traces.
//!
//! Metrics (Prometheus, on the admin port): calls by caller, target, instance and outcome;
//! latency histograms end to end, per hop and for admission queueing; in-flight calls;
//! breaker states; refusals by mechanism; retries; the watch's state. Labels come only
//! from names in the routing table (an unknown target is `(unknown)`) and from callers
//! verified by their agent credential (`(anonymous)` without one), never from names a
//! caller writes, sessions or payloads, so their cardinality is bounded by the fleet.
//!
//! Spans: [`OutboundTelemetry`] opens the caller's-sidecar span of a call (a child of
//! the caller's `traceparent`, or a new trace), the router opens one client span per
//! attempt, and [`InboundTelemetry`] opens the target's-sidecar server span, whose
//! context reaches the agent; admission queueing is a child span of its own, so time
//! waiting for a slot shows apart from time in the agent.
//!
//! Files: this one (metric families, [`Rejections`], [`Calls`], outcome labels),
//! `scrape.rs` (counters read at each scrape), `outbound_span.rs` and `inbound_span.rs`
//! (the two layers and their spans).

mod inbound_span;
mod outbound_span;
mod scrape;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_reach::reason;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::call::BoxFuture;
use crate::error::DeliveryError;

pub(crate) use inbound_span::{inbound_layer, record_queue_span};
pub(crate) use outbound_span::outbound_layer;
pub(crate) use scrape::{BoundedMaps, ScrapeCollector};

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CallLabels {
    pub caller: String,
    pub target: String,
    pub instance: String,
    pub outcome: Cow<'static, str>,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TargetOutcome {
    pub target: String,
    pub outcome: Cow<'static, str>,
}

/// The label sets looked up once per call hash their strings with a seeded foldhash and
/// hand the family's SipHash one word: a family's map cannot take another hasher, and
/// SipHash over four strings cost about 500 instructions per lookup.
fn label_digest<T: std::hash::Hash>(parts: T) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::LazyLock<foldhash::fast::RandomState> = std::sync::LazyLock::new(Default::default);
    SEED.hash_one(parts)
}

impl std::hash::Hash for CallLabels {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(label_digest((&self.caller, &self.target, &self.instance, &self.outcome)));
    }
}

impl std::hash::Hash for TargetOutcome {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(label_digest((&self.target, &self.outcome)));
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HopLabels {
    /// "outbound" (one attempt from the caller's sidecar) or "inbound" (delivery to the agent).
    pub hop: &'static str,
}

/// A family of latency histograms.
pub(crate) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// The metric families and scrape-time collector of one sidecar.
pub(crate) struct SidecarMetrics {
    registry: Registry,
    pub calls: Family<CallLabels, Counter>,
    pub call_duration: HistogramFamily<TargetOutcome>,
    pub hop_duration: HistogramFamily<HopLabels>,
    pub queue_duration: Histogram,
    /// The call edges of the last minute, for the report to control.
    pub traffic: Arc<crate::report::Traffic>,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 100 µs .. ~26 s.
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 19)
}

impl SidecarMetrics {
    /// Families registered; the collector of scrape-time values is added by
    /// [`SidecarMetrics::with_collector`].
    pub(crate) fn new() -> SidecarMetrics {
        let mut registry = Registry::with_prefix("agent_reach");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register("calls", "Calls by caller, target, serving instance and outcome", calls.clone());
        let call_duration: HistogramFamily<TargetOutcome> =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "call_duration_seconds",
            "End-to-end latency of calls, measured in the caller's sidecar",
            call_duration.clone(),
        );
        let hop_duration: HistogramFamily<HopLabels> =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "hop_duration_seconds",
            "Latency per hop: outbound = one attempt from the caller's sidecar; inbound = delivery to the agent",
            hop_duration.clone(),
        );
        let queue_duration = latency_histogram();
        registry.register(
            "queue_duration_seconds",
            "Time calls waited for an admission slot at their instance",
            queue_duration.clone(),
        );
        SidecarMetrics {
            registry,
            calls,
            call_duration,
            hop_duration,
            queue_duration,
            traffic: Arc::new(crate::report::Traffic::new()),
        }
    }

    /// Adds the collector that reads the sidecar's counters at each scrape.
    pub(crate) fn with_collector(mut self, collector: ScrapeCollector) -> SidecarMetrics {
        self.registry.register_collector(Box::new(collector));
        self
    }

    /// Adds another scrape-time collector (e.g. the session cache's).
    pub(crate) fn with(mut self, collector: Box<dyn Collector>) -> SidecarMetrics {
        self.registry.register_collector(collector);
        self
    }

    /// The Prometheus text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for SidecarMetrics {
    fn default() -> Self {
        SidecarMetrics::new()
    }
}

/// Refusals and shortcuts by mechanism, counted by the layers that make them and read at
/// each scrape.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    pub rate_limited: AtomicU64,
    pub breaker_open: AtomicU64,
    pub overloaded: AtomicU64,
    pub idempotency_replays: AtomicU64,
    pub idempotency_refused: AtomicU64,
    pub cache_hits: AtomicU64,
    pub retries: AtomicU64,
    pub retry_budget_exhausted: AtomicU64,
    pub fallbacks: AtomicU64,
    /// Calls the target's authorization policies refused.
    pub not_authorized: AtomicU64,
}

impl Rejections {
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one refusal (or shortcut) on `counter` and answers `answer` at once, without
    /// calling the wrapped service: how a layer turns a call away.
    pub(crate) fn refuse<T: Send + 'static>(counter: &AtomicU64, answer: T) -> BoxFuture<T> {
        Rejections::count(counter);
        Box::pin(std::future::ready(answer))
    }
}

/// Calls in flight through the sidecar, with a notification when the count drops, so
/// shutdown can wait for them.
#[derive(Default)]
pub(crate) struct Calls {
    count: AtomicU64,
    idle: tokio::sync::Notify,
}

impl Calls {
    /// Counts a call until the guard drops.
    pub(crate) fn begin(&self) -> CallCount<'_> {
        self.count.fetch_add(1, Ordering::Relaxed);
        CallCount { calls: self }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Completes when no call is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One call counted in [`Calls`].
pub(crate) struct CallCount<'a> {
    calls: &'a Calls,
}

impl Drop for CallCount<'_> {
    fn drop(&mut self) {
        if self.calls.count.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.calls.idle.notify_waiters();
        }
    }
}

/// What the layers under the call's telemetry answer ([`OutboundTelemetry`]'s inner
/// service): the caller's answer and, when the router routed the call, how it ended. A
/// field, not an `http::Extensions` entry on the answer, which allocated its map, table and
/// value on every call (about 600 instructions under callgrind) and was lost when the
/// result cache rebuilt an answer it stored.
pub(crate) struct Routed {
    pub resp: http::Response<crate::grpc::Body>,
    pub outcome: Option<CallOutcome>,
}

impl Routed {
    /// An answer the router did not route to an instance (a refusal, a cache hit, a
    /// deadline passed before any instance answered).
    pub(crate) fn unrouted(resp: http::Response<crate::grpc::Body>) -> Routed {
        Routed { resp, outcome: None }
    }
}

/// What a call ended with, as the router saw it.
#[derive(Clone, Debug)]
pub(crate) struct CallOutcome {
    /// "OK", a reason such as "AGENT_NOT_FOUND", or "CODE_<grpc code>" for agents' errors
    /// (a constant for the answered call, not a string allocated per call).
    pub outcome: Cow<'static, str>,
    /// The instance that served the call (its id, agent and version: a reference count,
    /// not three copies; the labels copy what they keep).
    pub served: Arc<agent_reach::model::Instance>,
    pub attempts: u32,
    pub strategy: &'static str,
    /// A fallback target served the call (the answer names it in `ar-fallback-from`).
    pub fallback: bool,
}

impl CallOutcome {
    pub(crate) fn instance(&self) -> &str {
        self.served.id()
    }

    pub(crate) fn agent(&self) -> &str {
        self.served.agent()
    }

    pub(crate) fn agent_version(&self) -> &str {
        &self.served.record.registration.version
    }
}

/// The outcome label of a status.
pub(crate) fn outcome_of(status: &tonic::Status) -> String {
    if status.code() == tonic::Code::Ok {
        return "OK".into();
    }
    match reason::error_info(status) {
        Some(info) if !info.reason.is_empty() => info.reason,
        _ => format!("CODE_{:?}", status.code()).to_uppercase(),
    }
}

/// The outcome label of a failed delivery.
pub(crate) fn delivery_outcome(e: &DeliveryError) -> String {
    match (e, e.reason()) {
        (DeliveryError::Remote(status), _) => outcome_of(status),
        (_, Some(reason)) => reason.as_str().to_string(),
        (_, None) => format!("CODE_{:?}", e.code()).to_uppercase(),
    }
}
