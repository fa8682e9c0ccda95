//! The caller's-sidecar side of a call: [`OutboundTelemetry`] opens the call's span (a
//! child of the caller's `traceparent`, or a new trace) before the call runs, and when it
//! ends records the call metrics, the traffic report's edge, and the span's outcome.

use std::borrow::Cow;
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

use super::{BoxFuture, CallLabels, CallOutcome, Routed, SidecarMetrics, TargetOutcome, outcome_of};
use crate::call::{OutboundCall, boxed};
use crate::error::SidecarError;
use crate::grpc::{self, Body, header};

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
    S: Service<OutboundCall, Response = Routed, Error = SidecarError>,
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
        boxed!(async move { opened.close(&state.metrics, answer.await) })
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
        let report_known = known_target || call.spec().is_some();
        Opened { cx, caller, target, known_target, report_known, started: call.started }
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
    /// Whether the traffic report names the target (else `(unknown)`).
    report_known: bool,
    started: Instant,
}

impl Opened {
    /// Records how the call ended (metrics, traffic report, span) and returns its result,
    /// naming the trace in the answer when the call was traced.
    fn close(
        self,
        metrics: &SidecarMetrics,
        routed: Result<Routed, SidecarError>,
    ) -> Result<Response<Body>, SidecarError> {
        let elapsed = self.started.elapsed();
        // How the router says the call ended, taken (nothing outside this layer reads it).
        let (mut result, mut detail) = match routed {
            Ok(Routed { resp, outcome }) => (Ok(resp), outcome),
            Err(e) => (Err(e), None),
        };
        let outcome = match (&result, detail.as_mut()) {
            (Ok(_), Some(d)) => std::mem::take(&mut d.outcome),
            // Answered before routing (cache) or with a status-only response.
            (Ok(resp), None) => {
                grpc::failed_status(resp.headers()).map_or(Cow::Borrowed("OK"), |s| outcome_of(&s).into())
            }
            (Err(e), _) => Cow::Borrowed(e.reason().as_str()),
        };
        // A routed answer says whether a fallback served it; a cached one is looked at.
        let fallback = match (&result, &detail) {
            (Ok(_), Some(d)) => d.fallback,
            (Ok(resp), None) => resp.headers().contains_key(header::FALLBACK_FROM),
            (Err(_), _) => false,
        };
        let code = match &result {
            // Routed and OK: a status in the answer's headers (a trailers-only answer) would
            // have made the outcome that status's.
            Ok(_) if detail.is_some() && outcome == "OK" => tonic::Code::Ok,
            Ok(resp) => grpc::status_code(resp.headers())
                .unwrap_or_else(|| agent_reach::reason::Reason::parse(&outcome).map_or(tonic::Code::Ok, |r| r.code())),
            Err(e) => e.reason().code(),
        };
        self.end_span(&outcome, code, detail.as_ref(), elapsed);
        let span = self.cx.span();
        let sc = span.span_context();
        if sc.is_sampled()
            && let Ok(resp) = result.as_mut()
            && let Ok(v) = http::HeaderValue::from_str(&sc.trace_id().to_string())
        {
            // A traced call names its trace, for `agent-reach trace <id>`.
            resp.headers_mut().insert(header::TRACE_ID, v);
        }
        self.record(metrics, outcome, detail, fallback, elapsed);
        result
    }

    /// The call metrics and the traffic report's edge. The label strings are moved from one
    /// label set to the next (each family copies a set only the first time it sees it).
    fn record(
        self,
        m: &SidecarMetrics,
        outcome: Cow<'static, str>,
        detail: Option<CallOutcome>,
        fallback: bool,
        elapsed: std::time::Duration,
    ) {
        let ok = outcome == "OK";
        let named = |name: Option<&str>| match name {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => "(none)".to_string(),
        };
        let instance = named(detail.as_ref().map(CallOutcome::instance));
        let served_by = named(detail.as_ref().map(CallOutcome::agent));
        let Opened { caller, target, known_target, report_known, .. } = self;
        // The label names a target the table knows; the report also one with a policy
        // (a fallback may serve it).
        let (label, report) = match (known_target, report_known) {
            (true, _) => (target, None),
            (false, true) => ("(unknown)".to_string(), Some(target)),
            (false, false) => ("(unknown)".to_string(), None),
        };
        let labels = CallLabels { caller, target: label, instance, outcome };
        m.calls.get_or_create(&labels).inc();
        let CallLabels { caller, target: label, outcome, .. } = labels;
        let labels = TargetOutcome { target: label, outcome };
        m.call_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
        let TargetOutcome { target: label, .. } = labels;
        m.traffic.record(
            tokio::time::Instant::now(),
            crate::report::EdgeKey { caller, target: report.unwrap_or(label), agent: served_by },
            crate::report::CallSeen { ok, fallback, elapsed },
        );
    }

    /// Sets the span's outcome, status and serving instance, and ends it.
    fn end_span(&self, outcome: &str, code: tonic::Code, detail: Option<&CallOutcome>, elapsed: std::time::Duration) {
        let span = self.cx.span();
        // A span that is not recorded ignores attributes: none are built for it.
        let recording = span.is_recording();
        if recording {
            span.set_attribute(KeyValue::new("agent_reach.outcome", outcome.to_string()));
            span.set_attribute(semconv::grpc_status(code as i32));
        }
        if let Some(d) = detail {
            if recording {
                for kv in semconv::invoke_agent(d.agent(), d.instance()) {
                    span.set_attribute(kv);
                }
                span.set_attribute(KeyValue::new("agent_reach.instance", d.instance().to_string()));
                span.set_attribute(KeyValue::new("agent_reach.agent", d.agent().to_string()));
                span.set_attribute(KeyValue::new("agent_reach.agent_version", d.agent_version().to_string()));
                span.set_attribute(KeyValue::new("agent_reach.attempts", i64::from(d.attempts)));
            }
            tracing::debug!(
                target: "agent_reach::route",
                call_target = %self.target, agent = %d.agent(), version = %d.agent_version(), instance = %d.instance(),
                attempts = d.attempts, strategy = d.strategy, outcome = %outcome, elapsed_us = elapsed.as_micros() as u64,
                "routed"
            );
        } else {
            tracing::debug!(target: "agent_reach::route", call_target = %self.target, outcome = %outcome, "not routed");
        }
        // A span that records nothing is not ended (see `end_attempt_span`).
        if recording {
            if outcome != "OK" {
                span.set_status(SpanStatus::error(outcome.to_string()));
            }
            span.end();
        }
    }
}
