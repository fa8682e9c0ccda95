//! The target's-sidecar side of a call: [`InboundTelemetry`] opens the server span whose
//! context reaches the agent and records the inbound hop; admission queueing is a span of
//! its own ([`record_queue_span`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use agent_reach_routing::clock;
use agent_reach_telemetry::Tracing;
use agent_reach_telemetry::semconv;
use opentelemetry::trace::{Span, SpanKind, Status as SpanStatus, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use prometheus_client::metrics::histogram::Histogram;
use tower::Service;

use super::{BoxFuture, HopLabels, SidecarMetrics, delivery_outcome, outcome_of};
use crate::call::{Attempt, InboundCall, boxed};
use crate::grpc;

/// Service: the target's-sidecar server span and the inbound hop metric.
#[derive(Clone)]
pub(crate) struct InboundTelemetry<S> {
    /// Shared: a clone of the layer is one reference count.
    state: Arc<State>,
    inner: S,
}

struct State {
    tracing: Tracing,
    /// The inbound hop's histogram, looked up once.
    hop: Histogram,
}

/// The layer of [`InboundTelemetry`].
pub(crate) fn inbound_layer<S>(
    tracing: Tracing,
    metrics: Arc<SidecarMetrics>,
) -> impl tower::Layer<S, Service = InboundTelemetry<S>> + Clone {
    let hop = metrics.hop_duration.get_or_create(&HopLabels { hop: "inbound" }).clone();
    let state = Arc::new(State { tracing, hop });
    tower::layer::layer_fn(move |inner| InboundTelemetry { state: state.clone(), inner })
}

impl<S> Service<InboundCall> for InboundTelemetry<S>
where
    S: Service<InboundCall, Response = Attempt, Error = std::convert::Infallible>,
    S::Future: Send + 'static,
{
    type Response = Attempt;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Attempt, std::convert::Infallible>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: InboundCall) -> Self::Future {
        let reg = &call.local.registration;
        let span = self.state.tracing.start_span(
            &call.trace,
            SpanKind::Server,
            false,
            || format!("deliver {}", reg.agent),
            || {
                let method = if call.shape == crate::call::Shape::Stream { "DeliverStream" } else { "Deliver" };
                let mut attrs = vec![
                    KeyValue::new("agent_reach.tenant", call.tenant.to_string()),
                    KeyValue::new("agent_reach.instance", call.local.instance_id.clone()),
                    KeyValue::new("agent_reach.agent", reg.agent.clone()),
                    KeyValue::new("agent_reach.agent_version", reg.version.clone()),
                    KeyValue::new("agent_reach.priority", call.priority.as_str()),
                ];
                attrs.extend(semconv::grpc("agentreach.v1.Mesh", method));
                attrs.extend(semconv::invoke_agent(&reg.agent, &call.local.instance_id));
                attrs
            },
        );
        let cx = call.trace.with_span(span);
        call.trace = cx.clone();
        let started = clock();
        // The inner layer is ready (`poll_ready` above): called here, not cloned into the
        // future, which holds only its answer's future.
        let answer = self.inner.call(call);
        let state = self.state.clone();
        boxed!(async move {
            let attempt = answer.await?;
            let elapsed = Duration::from_nanos(clock().saturating_sub(started));
            state.hop.observe(elapsed.as_secs_f64());
            let span = cx.span();
            if span.is_recording() {
                let (outcome, code) = outcome(&attempt);
                span.set_attribute(KeyValue::new("agent_reach.outcome", outcome.clone()));
                span.set_attribute(semconv::grpc_status(code as i32));
                if outcome != "OK" {
                    span.set_status(SpanStatus::error(outcome));
                }
                // A span that records nothing is not ended: that would only lock it and
                // read the wall clock.
                span.end();
            }
            Ok(attempt)
        })
    }
}

/// The outcome label and status code of how a delivery ended (an answer's status is in
/// its headers only when it is trailers-only; otherwise it is OK so far).
fn outcome(attempt: &Attempt) -> (Cow<'static, str>, tonic::Code) {
    match attempt {
        Attempt::Answered(resp, _) => match grpc::failed_status(resp.headers()) {
            Some(s) => (outcome_of(&s).into(), s.code()),
            None => (Cow::Borrowed("OK"), tonic::Code::Ok),
        },
        Attempt::NotDelivered(e) | Attempt::Failed(e) => (delivery_outcome(e).into(), e.code()),
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
