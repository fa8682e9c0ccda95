//! The target's sidecar side of a call, as tower layers:
//!
//! ```text
//! Telemetry → Idempotency → Admission → Deliver (gRPC agent, or the HTTP/JSON adapter)
//! ```
//! - [`idempotency`]: at-most-once execution of calls with an idempotency key;
//! - [`admission`]: per-instance slots with priority shares and short queues;
//! - delivery to the local agent, with the instance's load in every reply's `ar-load`
//!   trailer (so callers see load changes on the next call, not the next heartbeat).
//!
//! Calls from other sidecars (`Mesh/Deliver`) and calls whose chosen instance is local go
//! through the same stack. Lock-free lookup of an instance's gate on the call path (an
//! `ArcSwap`ed map, updated only when an instance or its settings change).

pub mod admission;
pub mod idempotency;

use std::collections::HashMap;
use std::sync::Arc;

use agent_reach::policy::Admission as Settings;
use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue};

pub use admission::{Gate, Permit, Refusal};

/// Trailer (or trailers-only header) carrying the serving instance's load ratio.
pub const HEADER_LOAD: HeaderName = HeaderName::from_static("ar-load");

/// A delivery in progress: its admission slot, released when the answer ends.
pub type InboundGuard = Permit;

impl Permit {
    /// Writes the instance's load into `headers` as `ar-load`, not counting this call.
    pub fn annotate(&self, headers: &mut HeaderMap) {
        let gate = self.gate();
        let ratio = if gate.max() == 0 {
            0.0
        } else {
            f64::from((gate.in_use() + gate.queued()).saturating_sub(1)) / f64::from(gate.max())
        };
        if let Ok(v) = HeaderValue::from_str(&format!("{ratio:.3}")) {
            headers.insert(HEADER_LOAD, v);
        }
    }
}

#[derive(Debug)]
struct Entry {
    gate: Arc<Gate>,
    max: u32,
    settings: Settings,
}

/// The gates of every local instance.
#[derive(Default)]
pub struct Inbound {
    gates: ArcSwap<HashMap<String, Arc<Entry>>>,
}

impl Inbound {
    /// The gate of `instance_id` for `max` slots and `settings`, made anew when either
    /// changed (calls holding the old gate finish under it).
    pub fn gate(&self, instance_id: &str, max: u32, settings: Settings) -> Arc<Gate> {
        if let Some(e) = self.gates.load().get(instance_id)
            && e.max == max
            && e.settings == settings
        {
            return e.gate.clone();
        }
        let fresh = Arc::new(Entry { gate: Arc::new(Gate::new(max, settings)), max, settings });
        let mut out = fresh.gate.clone();
        self.gates.rcu(|m| {
            let mut m = HashMap::clone(m);
            let e = m.entry(instance_id.to_string()).or_insert_with(|| fresh.clone());
            if e.max != max || e.settings != settings {
                *e = fresh.clone();
            }
            out = e.gate.clone();
            m
        });
        out
    }

    /// Calls delivered to any local instance and not yet answered.
    pub fn total_in_flight(&self) -> u32 {
        self.gates.load().values().map(|e| e.gate.in_use()).sum()
    }

    /// Forgets instances that left.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.gates.rcu(|m| {
            m.iter().filter(|(id, _)| keep(id)).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>()
        });
    }
}

/// The load ratio in an `ar-load` value.
pub fn parse_load(headers: &HeaderMap) -> Option<f64> {
    headers.get(HEADER_LOAD)?.to_str().ok()?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

/// A call for a local instance, on its way through the inbound stack.
pub struct InboundCall {
    pub local: Arc<crate::registry::LocalInstance>,
    pub body: crate::grpc::Body,
    /// Time left of the caller's deadline (already shrunk by the reserve), if any.
    pub remaining: Option<std::time::Duration>,
    pub headers: Arc<HeaderMap>,
    pub shape: crate::outbound::Shape,
    pub priority: agent_reach::model::Priority,
    pub idempotency_key: Option<String>,
    pub tenant: String,
    /// The trace context: the caller's attempt span on arrival, the server span once the
    /// telemetry layer opened it.
    pub trace: opentelemetry::Context,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type Attempt = crate::forward::Attempt;

/// Service: replays answers of calls whose idempotency key was already answered, and
/// makes in-flight duplicates wait for the first.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: Arc<crate::Inner>,
    service: S,
}

impl<S> Idempotent<S> {
    pub fn new(inner: Arc<crate::Inner>, service: S) -> Idempotent<S> {
        Idempotent { inner, service }
    }
}

impl<S> tower::Service<InboundCall> for Idempotent<S>
where
    S: tower::Service<InboundCall, Response = Attempt, Error = std::convert::Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Attempt;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Attempt, std::convert::Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        use tower::ServiceExt;
        let key = match (&call.idempotency_key, call.shape) {
            (Some(k), crate::outbound::Shape::Unary) if !k.is_empty() => k.clone(),
            _ => return Box::pin(self.service.clone().oneshot(call)),
        };
        let (inner, service) = (self.inner.clone(), self.service.clone());
        Box::pin(async move {
            let replay = |outcome: idempotency::Outcome, inner: &crate::Inner| match outcome {
                idempotency::Outcome::Answer(a) => {
                    crate::outbound::Rejections::count(&inner.rejections.idempotency_replays);
                    Some(Ok(Attempt::Answered(a.to_response(), None)))
                }
                idempotency::Outcome::TooLarge => {
                    crate::outbound::Rejections::count(&inner.rejections.idempotency_refused);
                    Some(Ok(Attempt::Failed(agent_reach::reason::status(
                        agent_reach::reason::Reason::IdempotentReplyNotStored,
                        "a call with this idempotency key already ran; its reply was too large to keep, so it is not run again",
                        &[("mechanism", "idempotency".into())],
                    ))))
                }
                idempotency::Outcome::Abandoned => None,
            };
            let mut call = Some(call);
            loop {
                match inner.idempotency.claim(&call.as_ref().map(|c| c.tenant.clone()).unwrap_or_default(), &key) {
                    idempotency::Claim::Done(outcome) => {
                        if let Some(r) = replay(outcome, &inner) {
                            return r;
                        }
                    }
                    idempotency::Claim::Wait(rx) => {
                        if let Some(r) = replay(idempotency::wait(rx).await, &inner) {
                            return r;
                        }
                    }
                    idempotency::Claim::First(done) => {
                        let Some(call) = call.take() else { continue };
                        let limit = inner.config.max_payload_bytes + crate::forward::ENVELOPE_ALLOWANCE;
                        return match service.oneshot(call).await {
                            Ok(Attempt::Answered(resp, permit)) => {
                                let stored = crate::grpc::StoredResponse::collect(resp, limit).await;
                                drop(permit);
                                match stored {
                                    Ok(stored) => {
                                        let resp = stored.to_response();
                                        done.finish(stored);
                                        Ok(Attempt::Answered(resp, None))
                                    }
                                    Err(e) => Ok(Attempt::Failed(tonic::Status::unavailable(format!(
                                        "reading the agent's answer failed: {e}"
                                    )))),
                                }
                            }
                            other => other,
                        };
                    }
                }
            }
        })
    }
}

/// Service: per-instance admission by priority.
#[derive(Clone)]
pub struct Admitted<S> {
    inner: Arc<crate::Inner>,
    service: S,
}

impl<S> Admitted<S> {
    pub fn new(inner: Arc<crate::Inner>, service: S) -> Admitted<S> {
        Admitted { inner, service }
    }
}

impl<S> tower::Service<InboundCall> for Admitted<S>
where
    S: tower::Service<InboundCall, Response = Attempt, Error = std::convert::Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Attempt;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Attempt, std::convert::Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        use tower::ServiceExt;
        let table = self.inner.table.load();
        let agent = &call.local.registration.agent;
        let settings = table
            .policy(agent_reach::policy::PolicyKind::Agent, agent)
            .and_then(|p| p.spec.admission)
            .unwrap_or_default();
        let gate = self.inner.inbound.gate(&call.local.instance_id, call.local.registration.max_concurrency, settings);
        let (inner, service) = (self.inner.clone(), self.service.clone());
        Box::pin(async move {
            let deadline = call.remaining.map(|r| tokio::time::Instant::now() + r);
            let queued_since = std::time::SystemTime::now();
            let started = agent_reach_routing::clock();
            let admitted = gate.acquire(call.priority, deadline).await;
            let waited = std::time::Duration::from_nanos(agent_reach_routing::clock().saturating_sub(started));
            inner.metrics.queue_duration.observe(waited.as_secs_f64());
            if waited >= std::time::Duration::from_micros(100) {
                // Time spent waiting for a slot shows as its own span, apart from the agent's.
                crate::telemetry::record_queue_span(&inner, &call.trace, queued_since, admitted.is_ok());
            }
            let permit = match admitted {
                Ok(p) => p,
                Err(refusal) => {
                    crate::outbound::Rejections::count(&inner.rejections.overloaded);
                    let why = match refusal {
                        Refusal::QueueFull => "its queue is full".to_string(),
                        Refusal::Timeout(w) => format!("no slot within {w:?}"),
                    };
                    let status = agent_reach::reason::status_retry_after(
                        agent_reach::reason::Reason::AgentOverloaded,
                        format!(
                            "instance {} is overloaded ({} of {} slots busy, {} waiting): {why}",
                            call.local.instance_id,
                            gate.in_use(),
                            gate.max(),
                            gate.queued()
                        ),
                        &[
                            ("mechanism", "admission".into()),
                            ("policy", format!("agent/{}", call.local.registration.agent)),
                            ("instance", call.local.instance_id.clone()),
                        ],
                        std::time::Duration::from_millis(50),
                    );
                    // Refused before the agent saw it: the caller may try elsewhere.
                    return Ok(Attempt::NotDelivered(status));
                }
            };
            let attempt = service.oneshot(call).await?;
            Ok(match attempt {
                Attempt::Answered(mut resp, _) => {
                    if resp.headers().contains_key(crate::grpc::HEADER_GRPC_STATUS) {
                        permit.annotate(resp.headers_mut());
                    }
                    Attempt::Answered(resp, Some(permit))
                }
                other => other,
            })
        })
    }
}

/// The end of the inbound stack: hands the call to the local agent.
#[derive(Clone)]
pub struct Deliver {
    pub inner: Arc<crate::Inner>,
}

impl tower::Service<InboundCall> for Deliver {
    type Response = Attempt;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Attempt, std::convert::Infallible>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(crate::forward::deliver_to_agent(&inner, call).await) })
    }
}

/// The inbound stack.
pub type InboundService = tower::util::BoxCloneSyncService<InboundCall, Attempt, std::convert::Infallible>;

/// Builds the inbound stack.
pub fn stack(inner: Arc<crate::Inner>) -> InboundService {
    let service = tower::ServiceBuilder::new()
        // The server span and hop metric cover everything the target's sidecar does.
        .layer(crate::layer(&inner, crate::telemetry::InboundTelemetry::new))
        // Duplicates are answered first: a replay needs no slot and never reaches the agent.
        .layer(crate::layer(&inner, Idempotent::new))
        // Then slots by priority: over its share a call waits briefly, then is refused
        // before the agent sees it.
        .layer(crate::layer(&inner, Admitted::new))
        .service(Deliver { inner });
    tower::util::BoxCloneSyncService::new(service)
}

#[cfg(test)]
mod tests {
    use agent_reach::model::Priority;

    use super::*;

    #[tokio::test]
    async fn load_excludes_the_call_being_answered() {
        let inbound = Inbound::default();
        let g = inbound.gate("a-1", 4, Settings::default());
        let p1 = g.acquire(Priority::Normal, None).await.unwrap();
        let _p2 = g.acquire(Priority::Normal, None).await.unwrap();
        assert_eq!(inbound.total_in_flight(), 2);
        let mut h = HeaderMap::new();
        p1.annotate(&mut h);
        assert_eq!(h[HEADER_LOAD], "0.250");
        assert_eq!(parse_load(&h), Some(0.25));
        drop(p1);
        assert_eq!(g.in_use(), 1);
        assert!(Arc::ptr_eq(&g, &inbound.gate("a-1", 4, Settings::default())));
        assert!(!Arc::ptr_eq(&g, &inbound.gate("a-1", 8, Settings::default())), "new settings, new gate");
        inbound.retain(|_| false);
        assert_eq!(inbound.total_in_flight(), 0);
    }
}
