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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use agent_reach::model::TargetKind;
use agent_reach::reason;
use agent_reach_routing::{BreakerState, clock};
use agent_reach_telemetry::semconv;
use agent_reach_telemetry::trace::{FORCE_ATTRIBUTE, extract};
use http::Response;
use opentelemetry::trace::{Span, SpanKind, Status as SpanStatus, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tower::{Service, ServiceExt};

use agent_reach_routing::TableHandle;
use agent_reach_telemetry::Tracing;

use crate::call::{Attempt, InboundCall, OutboundCall};
use crate::control::WatchStats;
use crate::error::{DeliveryError, SidecarError};
use crate::grpc::{Body, header};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CallLabels {
    pub caller: String,
    pub target: String,
    pub instance: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TargetOutcome {
    pub target: String,
    pub outcome: String,
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
        Ok(())
    }
}

/// What a call ended with, attached to its response by the router.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallOutcome {
    /// "OK", a reason such as "AGENT_NOT_FOUND", or "CODE_<grpc code>" for agents' errors.
    pub outcome: String,
    pub instance: String,
    pub agent: String,
    pub agent_version: String,
    pub attempts: u32,
    pub strategy: &'static str,
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

/// The caller's label: the agent its credential verified, or `(anonymous)`. Names a caller
/// writes into its call are never labels (they would buy unbounded label sets).
fn caller_label(call: &OutboundCall) -> String {
    let name = call.caller_agent();
    if name.is_empty() { "(anonymous)".to_string() } else { name.to_string() }
}

/// The outcome label of a failed delivery.
pub(crate) fn delivery_outcome(e: &DeliveryError) -> String {
    match (e, e.reason()) {
        (DeliveryError::Remote(status), _) => outcome_of(status),
        (_, Some(reason)) => reason.as_str().to_string(),
        (_, None) => format!("CODE_{:?}", e.code()).to_uppercase(),
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Service: the caller's-sidecar span and the call metrics.
#[derive(Clone)]
pub(crate) struct OutboundTelemetry<S> {
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
    tenant: Arc<str>,
    inner: S,
}

/// The layer of [`OutboundTelemetry`].
pub(crate) fn outbound_layer<S>(
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
    tenant: Arc<str>,
) -> impl tower::Layer<S, Service = OutboundTelemetry<S>> + Clone {
    tower::layer::layer_fn(move |inner| OutboundTelemetry {
        tracing: tracing.clone(),
        metrics: metrics.clone(),
        tenant: tenant.clone(),
        inner,
    })
}

impl<S> Service<OutboundCall> for OutboundTelemetry<S>
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Response<Body>, SidecarError>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), SidecarError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: OutboundCall) -> Self::Future {
        let tracer = self.tracing.tracer();
        let parent = extract(&call.headers);
        let caller = caller_label(&call);
        let target = call.target.to_string();
        let forced = call
            .headers
            .get(header::TRACE)
            .is_some_and(|v| v.as_bytes() == agent_reach::headers::TRACE_FORCE.as_bytes());
        let method = if call.shape == crate::call::Shape::Stream { "InvokeStream" } else { "Invoke" };
        let mut attrs = vec![
            KeyValue::new("agent_reach.tenant", self.tenant.to_string()),
            KeyValue::new("agent_reach.caller", caller.clone()),
            KeyValue::new("agent_reach.target", target.clone()),
            KeyValue::new("agent_reach.priority", call.priority.as_str()),
        ];
        attrs.extend(semconv::grpc("agentreach.v1.Sidecar", method));
        if !call.head.session_id.is_empty() {
            // The dashboard finds a session's recent traces by it.
            attrs.push(KeyValue::new("agent_reach.session", call.head.session_id.clone()));
        }
        if forced {
            attrs.push(KeyValue::new(FORCE_ATTRIBUTE, true));
        }
        let span = tracer
            .span_builder(format!("invoke {target}"))
            .with_kind(SpanKind::Server)
            .with_attributes(attrs)
            .start_with_context(tracer, &parent);
        let cx = parent.with_span(span);
        call.trace = cx.clone();
        let started = call.started;
        let known_target = match &call.target.kind {
            TargetKind::Capability(c) => call.table.by_capability.contains_key(c),
            TargetKind::Agent(a) => call.table.by_agent.contains_key(a),
        };
        // The traffic report names a target with a policy too (a fallback may serve it).
        let report_target = if known_target || call.spec().is_some() { target.clone() } else { "(unknown)".into() };
        let (service, metrics) = (self.inner.clone(), self.metrics.clone());
        Box::pin(async move {
            let result = service.oneshot(call).await;
            let (outcome, detail) = match &result {
                Ok(resp) => match resp.extensions().get::<CallOutcome>() {
                    Some(o) => (o.outcome.clone(), Some(o.clone())),
                    None => {
                        // Answered before routing (cache) or with a status-only response.
                        let o = tonic::Status::from_header_map(resp.headers())
                            .map(|s| outcome_of(&s))
                            .unwrap_or("OK".into());
                        (o, None)
                    }
                },
                Err(e) => (e.reason().to_string(), None),
            };
            let elapsed = started.elapsed();
            let instance =
                detail.as_ref().map(|d| d.instance.clone()).filter(|i| !i.is_empty()).unwrap_or("(none)".into());
            let target_label = if known_target { target.clone() } else { "(unknown)".into() };
            let m = &metrics;
            let fallback = result.as_ref().is_ok_and(|r| r.headers().contains_key(header::FALLBACK_FROM));
            let served_by = detail.as_ref().map(|d| d.agent.clone()).filter(|a| !a.is_empty());
            m.traffic.record(
                tokio::time::Instant::now(),
                crate::report::EdgeKey {
                    caller: caller.clone(),
                    target: report_target,
                    agent: served_by.unwrap_or_else(|| "(none)".into()),
                },
                crate::report::CallSeen { ok: outcome == "OK", fallback, elapsed },
            );
            m.calls
                .get_or_create(&CallLabels {
                    caller,
                    target: target_label.clone(),
                    instance: instance.clone(),
                    outcome: outcome.clone(),
                })
                .inc();
            m.call_duration
                .get_or_create(&TargetOutcome { target: target_label, outcome: outcome.clone() })
                .observe(elapsed.as_secs_f64());
            let span = cx.span();
            span.set_attribute(KeyValue::new("agent_reach.outcome", outcome.clone()));
            let code = match &result {
                Ok(resp) => tonic::Status::from_header_map(resp.headers()).map(|s| s.code()).unwrap_or_else(|| {
                    agent_reach::reason::Reason::parse(&outcome).map_or(tonic::Code::Ok, |r| r.code())
                }),
                Err(e) => e.reason().code(),
            };
            span.set_attribute(semconv::grpc_status(code as i32));
            if let Some(d) = &detail {
                for kv in semconv::invoke_agent(&d.agent, &d.instance) {
                    span.set_attribute(kv);
                }
                span.set_attribute(KeyValue::new("agent_reach.instance", d.instance.clone()));
                span.set_attribute(KeyValue::new("agent_reach.agent", d.agent.clone()));
                span.set_attribute(KeyValue::new("agent_reach.agent_version", d.agent_version.clone()));
                span.set_attribute(KeyValue::new("agent_reach.attempts", i64::from(d.attempts)));
                tracing::debug!(
                    target: "agent_reach::route",
                    call_target = %target, agent = %d.agent, version = %d.agent_version, instance = %d.instance,
                    attempts = d.attempts, strategy = d.strategy, outcome = %outcome, elapsed_us = elapsed.as_micros() as u64,
                    "routed"
                );
            } else {
                tracing::debug!(target: "agent_reach::route", call_target = %target, outcome = %outcome, "not routed");
            }
            if outcome != "OK" {
                span.set_status(SpanStatus::error(outcome));
            }
            span.end();
            let mut result = result;
            let sc = span.span_context();
            if sc.is_sampled()
                && let Ok(resp) = result.as_mut()
                && let Ok(v) = http::HeaderValue::from_str(&sc.trace_id().to_string())
            {
                // A traced call names its trace, for `agent-reach trace <id>`.
                resp.headers_mut().insert(header::TRACE_ID, v);
            }
            result
        })
    }
}

/// Service: the target's-sidecar server span and the inbound hop metric.
#[derive(Clone)]
pub(crate) struct InboundTelemetry<S> {
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
    inner: S,
}

/// The layer of [`InboundTelemetry`].
pub(crate) fn inbound_layer<S>(
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
) -> impl tower::Layer<S, Service = InboundTelemetry<S>> + Clone {
    tower::layer::layer_fn(move |inner| InboundTelemetry { tracing: tracing.clone(), metrics: metrics.clone(), inner })
}

impl<S> Service<InboundCall> for InboundTelemetry<S>
where
    S: Service<InboundCall, Response = Attempt, Error = std::convert::Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Attempt;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Attempt, std::convert::Infallible>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: InboundCall) -> Self::Future {
        let tracer = self.tracing.tracer();
        let reg = &call.local.registration;
        let method = if call.shape == crate::call::Shape::Stream { "DeliverStream" } else { "Deliver" };
        let mut attrs = vec![
            KeyValue::new("agent_reach.tenant", call.tenant.clone()),
            KeyValue::new("agent_reach.instance", call.local.instance_id.clone()),
            KeyValue::new("agent_reach.agent", reg.agent.clone()),
            KeyValue::new("agent_reach.agent_version", reg.version.clone()),
            KeyValue::new("agent_reach.priority", call.priority.as_str()),
        ];
        attrs.extend(semconv::grpc("agentreach.v1.Mesh", method));
        attrs.extend(semconv::invoke_agent(&reg.agent, &call.local.instance_id));
        let span = tracer
            .span_builder(format!("deliver {}", reg.agent))
            .with_kind(SpanKind::Server)
            .with_attributes(attrs)
            .start_with_context(tracer, &call.trace);
        let cx = call.trace.with_span(span);
        call.trace = cx.clone();
        let (service, metrics) = (self.inner.clone(), self.metrics.clone());
        Box::pin(async move {
            let started = clock();
            let attempt = service.oneshot(call).await?;
            let elapsed = Duration::from_nanos(clock().saturating_sub(started));
            metrics.hop_duration.get_or_create(&HopLabels { hop: "inbound" }).observe(elapsed.as_secs_f64());
            let (outcome, code) = match &attempt {
                Attempt::Answered(resp, _) => match tonic::Status::from_header_map(resp.headers()) {
                    Some(s) => (outcome_of(&s), s.code()),
                    None => ("OK".to_string(), tonic::Code::Ok),
                },
                Attempt::NotDelivered(e) | Attempt::Failed(e) => (delivery_outcome(e), e.code()),
            };
            let span = cx.span();
            span.set_attribute(KeyValue::new("agent_reach.outcome", outcome.clone()));
            span.set_attribute(semconv::grpc_status(code as i32));
            if outcome != "OK" {
                span.set_status(SpanStatus::error(outcome));
            }
            span.end();
            Ok(attempt)
        })
    }
}

/// Records the time a call waited for an admission slot as a span (a child of the server
/// span) from `since` to now.
pub(crate) fn record_queue_span(tracing: &Tracing, parent: &Context, since: std::time::SystemTime, admitted: bool) {
    let tracer = tracing.tracer();
    let mut span = tracer
        .span_builder("admission queue")
        .with_kind(SpanKind::Internal)
        .with_start_time(since)
        .with_attributes([KeyValue::new("agent_reach.admitted", admitted)])
        .start_with_context(tracer, parent);
    span.end();
}
