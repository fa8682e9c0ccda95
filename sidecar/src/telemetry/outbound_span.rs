//! The caller's-sidecar side of a call: [`OutboundTelemetry`] opens the call's span (a
//! child of the caller's `traceparent`, or a new trace) before the call runs, and when it
//! ends records the call metrics, the traffic report's edge, and the span's outcome.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use agent_reach::model::TargetKind;
use agent_reach_telemetry::Tracing;
use agent_reach_telemetry::semconv;
use agent_reach_telemetry::trace::extract;
use http::Response;
use opentelemetry::trace::{SpanKind, Status as SpanStatus, TraceContextExt};
use opentelemetry::{Context, KeyValue};
use tokio::time::Instant;
use tower::Service;

use super::{BoxFuture, CallLabels, CallOutcome, SidecarMetrics, TargetOutcome, outcome_of};
use crate::call::OutboundCall;
use crate::error::SidecarError;
use crate::grpc::{Body, header};

/// Service: the caller's-sidecar span and the call metrics.
#[derive(Clone)]
pub(crate) struct OutboundTelemetry<S> {
    /// Shared: a clone of the layer is one reference count.
    state: Arc<State>,
    inner: S,
}

struct State {
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
    tenant: Arc<str>,
}

/// The layer of [`OutboundTelemetry`].
pub(crate) fn outbound_layer<S>(
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
    tenant: Arc<str>,
) -> impl tower::Layer<S, Service = OutboundTelemetry<S>> + Clone {
    let state = Arc::new(State { tracing, metrics, tenant });
    tower::layer::layer_fn(move |inner| OutboundTelemetry { state: state.clone(), inner })
}

impl<S> Service<OutboundCall> for OutboundTelemetry<S>
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Response<Body>, SidecarError>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), SidecarError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: OutboundCall) -> Self::Future {
        let opened = self.state.open(&mut call);
        // The inner layer is ready (`poll_ready` above): called here, not cloned into the
        // future, which holds only its answer's future.
        let answer = self.inner.call(call);
        let state = self.state.clone();
        Box::pin(async move { opened.close(&state.metrics, answer.await) })
    }
}

impl State {
    /// Opens the call's span and makes it the call's trace context.
    fn open(&self, call: &mut OutboundCall) -> Opened {
        let parent = extract(&call.headers);
        let caller = caller_label(call);
        let target = call.target_label();
        let forced = call
            .headers
            .get(header::TRACE)
            .is_some_and(|v| v.as_bytes() == agent_reach::headers::TRACE_FORCE.as_bytes());
        let span = self.tracing.start_span(
            &parent,
            SpanKind::Server,
            forced,
            || format!("invoke {target}"),
            || {
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
                attrs
            },
        );
        let cx = parent.with_span(span);
        call.trace = cx.clone();
        let known_target = match &call.target.kind {
            TargetKind::Capability(c) => call.table.by_capability.contains_key(c),
            TargetKind::Agent(a) => call.table.by_agent.contains_key(a),
        };
        // The traffic report names a target with a policy too (a fallback may serve it).
        let report_target = if known_target || call.spec().is_some() { target.clone() } else { "(unknown)".into() };
        Opened { cx, caller, target, known_target, report_target, started: call.started }
    }
}

/// The caller's label: the agent its credential verified, or `(anonymous)`. Names a caller
/// writes into its call are never labels (they would buy unbounded label sets).
fn caller_label(call: &OutboundCall) -> String {
    let name = call.caller_agent();
    if name.is_empty() { "(anonymous)".to_string() } else { name.to_string() }
}

/// A call whose span is open: what its metrics and span need when it ends.
struct Opened {
    cx: Context,
    caller: String,
    target: String,
    /// Whether the routing table knows the target (else its label is `(unknown)`).
    known_target: bool,
    /// The target as the traffic report names it.
    report_target: String,
    started: Instant,
}

impl Opened {
    /// Records how the call ended (metrics, traffic report, span) and returns its result,
    /// naming the trace in the answer when the call was traced.
    fn close(
        mut self,
        metrics: &SidecarMetrics,
        mut result: Result<Response<Body>, SidecarError>,
    ) -> Result<Response<Body>, SidecarError> {
        let (outcome, detail) = match &result {
            Ok(resp) => match resp.extensions().get::<CallOutcome>() {
                Some(o) => (o.outcome.clone(), Some(o.clone())),
                None => {
                    // Answered before routing (cache) or with a status-only response.
                    let o =
                        tonic::Status::from_header_map(resp.headers()).map(|s| outcome_of(&s)).unwrap_or("OK".into());
                    (o, None)
                }
            },
            Err(e) => (e.reason().to_string(), None),
        };
        let elapsed = self.started.elapsed();
        let fallback = result.as_ref().is_ok_and(|r| r.headers().contains_key(header::FALLBACK_FROM));
        self.record(metrics, &outcome, detail.as_ref(), fallback, elapsed);
        let code = match &result {
            Ok(resp) => tonic::Status::from_header_map(resp.headers())
                .map(|s| s.code())
                .unwrap_or_else(|| agent_reach::reason::Reason::parse(&outcome).map_or(tonic::Code::Ok, |r| r.code())),
            Err(e) => e.reason().code(),
        };
        self.end_span(outcome, code, detail.as_ref(), elapsed);
        let span = self.cx.span();
        let sc = span.span_context();
        if sc.is_sampled()
            && let Ok(resp) = result.as_mut()
            && let Ok(v) = http::HeaderValue::from_str(&sc.trace_id().to_string())
        {
            // A traced call names its trace, for `agent-reach trace <id>`.
            resp.headers_mut().insert(header::TRACE_ID, v);
        }
        result
    }

    /// The call metrics and the traffic report's edge (takes the caller's and the report's
    /// labels).
    fn record(
        &mut self,
        m: &SidecarMetrics,
        outcome: &str,
        detail: Option<&CallOutcome>,
        fallback: bool,
        elapsed: std::time::Duration,
    ) {
        let instance = detail.map(|d| d.instance.clone()).filter(|i| !i.is_empty()).unwrap_or("(none)".into());
        let target_label = if self.known_target { self.target.clone() } else { "(unknown)".into() };
        let served_by = detail.map(|d| d.agent.clone()).filter(|a| !a.is_empty());
        m.traffic.record(
            tokio::time::Instant::now(),
            crate::report::EdgeKey {
                caller: self.caller.clone(),
                target: std::mem::take(&mut self.report_target),
                agent: served_by.unwrap_or_else(|| "(none)".into()),
            },
            crate::report::CallSeen { ok: outcome == "OK", fallback, elapsed },
        );
        m.calls
            .get_or_create(&CallLabels {
                caller: std::mem::take(&mut self.caller),
                target: target_label.clone(),
                instance,
                outcome: outcome.to_string(),
            })
            .inc();
        m.call_duration
            .get_or_create(&TargetOutcome { target: target_label, outcome: outcome.to_string() })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the span's outcome, status and serving instance, and ends it.
    fn end_span(&self, outcome: String, code: tonic::Code, detail: Option<&CallOutcome>, elapsed: std::time::Duration) {
        let span = self.cx.span();
        // A span that is not recorded ignores attributes: none are built for it.
        let recording = span.is_recording();
        if recording {
            span.set_attribute(KeyValue::new("agent_reach.outcome", outcome.clone()));
            span.set_attribute(semconv::grpc_status(code as i32));
        }
        if let Some(d) = detail {
            if recording {
                for kv in semconv::invoke_agent(&d.agent, &d.instance) {
                    span.set_attribute(kv);
                }
                span.set_attribute(KeyValue::new("agent_reach.instance", d.instance.clone()));
                span.set_attribute(KeyValue::new("agent_reach.agent", d.agent.clone()));
                span.set_attribute(KeyValue::new("agent_reach.agent_version", d.agent_version.clone()));
                span.set_attribute(KeyValue::new("agent_reach.attempts", i64::from(d.attempts)));
            }
            tracing::debug!(
                target: "agent_reach::route",
                call_target = %self.target, agent = %d.agent, version = %d.agent_version, instance = %d.instance,
                attempts = d.attempts, strategy = d.strategy, outcome = %outcome, elapsed_us = elapsed.as_micros() as u64,
                "routed"
            );
        } else {
            tracing::debug!(target: "agent_reach::route", call_target = %self.target, outcome = %outcome, "not routed");
        }
        if recording && outcome != "OK" {
            span.set_status(SpanStatus::error(outcome));
        }
        span.end();
    }
}
