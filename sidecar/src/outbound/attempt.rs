//! One attempt of a call on the instance the router chose: the instance's circuit breaker
//! ([`Breakered`]), then [`Dispatch`], which sends the attempt to the instance's sidecar
//! over `Mesh`, or through the inbound stack when the instance is local.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach::model::Priority;
use agent_reach_routing::clock;
use http::{HeaderMap, HeaderValue};
use tonic::{Code, Status};
use tower::Service;

use crate::call::{Attempt, AttemptRequest, BoxFuture, BoxedAttempt, InboundCall, InboundData, Shape, boxed};
use crate::error::{DeliveryError, SidecarError};
use crate::grpc::{self, Body, header};
use crate::hop::Hop;
use crate::inbound::InboundService;
use crate::pool::{Pool, SendError, To, collect_chunks, send_h2};
use crate::registry::Registry;
use crate::telemetry::Rejections;

/// The attempt stack: a concrete type, not a boxed one, so that the router's clone of it
/// per attempt is two reference counts (no allocation, no copy of the inbound stack that
/// [`Dispatch`] holds).
pub(crate) type AttemptService = Breakered<Dispatch>;

/// Service: the circuit breaker of the chosen instance, which also records how the
/// attempt ended.
#[derive(Clone)]
pub(crate) struct Breakered<S> {
    rejections: Arc<Rejections>,
    inner: S,
}

/// The layer of [`Breakered`].
pub(crate) fn breaker_layer<S>(rejections: Arc<Rejections>) -> impl tower::Layer<S, Service = Breakered<S>> + Clone {
    tower::layer::layer_fn(move |inner| Breakered { rejections: rejections.clone(), inner })
}

/// Whether an attempt's outcome counts as a failure for the breaker (overload answers do
/// not: the balancer penalises them instead).
pub(crate) fn breaker_failure(attempt: &Attempt) -> bool {
    let failing = |code: Code| {
        matches!(code, Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown | Code::DataLoss)
    };
    match attempt {
        Attempt::Answered(resp, _) => grpc::status_code(resp.headers()).is_some_and(failing),
        Attempt::NotDelivered(e) | Attempt::Failed(e) => e.code() != Code::ResourceExhausted && failing(e.code()),
    }
}

impl<S> Service<BoxedAttempt> for Breakered<S>
where
    S: Service<BoxedAttempt, Response = Attempt, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: BoxedAttempt) -> Self::Future {
        let stats = req.member.stats.clone();
        let settings = req.breaker;
        if !stats.breaker.acquire(clock(), &settings) {
            let error = DeliveryError::CircuitOpen { instance: req.member.id().to_string() };
            return Rejections::refuse(&self.rejections.breaker_open, Ok(Attempt::NotDelivered(error)));
        }
        // The inner service is ready (`poll_ready` above): called here, not cloned into
        // the future, which holds only its answer's future.
        let answer = self.inner.call(req);
        boxed!(async move {
            let attempt = answer.await?;
            stats.breaker.record(clock(), breaker_failure(&attempt), &settings);
            Ok(attempt)
        })
    }
}

/// The end of the attempt stack: sends the attempt to the local agent (through the inbound
/// stack) or to the instance's sidecar. Cloned per attempt: its state is shared.
#[derive(Clone)]
pub(crate) struct Dispatch(Arc<DispatchState>);

struct DispatchState {
    sidecar_id: Arc<str>,
    tenant: Arc<str>,
    /// `ar-tenant` toward the instance's sidecar, made once (a clone is a reference count).
    tenant_header: Option<HeaderValue>,
    /// Local instances, reached through `inbound` without a network hop.
    registry: Arc<Registry>,
    inbound: InboundService,
    pool: Arc<Pool>,
    /// The largest call read whole.
    limit: usize,
}

impl Dispatch {
    pub(crate) fn new(
        sidecar_id: &str,
        tenant: &str,
        registry: Arc<Registry>,
        inbound: InboundService,
        pool: Arc<Pool>,
        limit: usize,
    ) -> Dispatch {
        Dispatch(Arc::new(DispatchState {
            sidecar_id: sidecar_id.into(),
            tenant: tenant.into(),
            tenant_header: HeaderValue::from_str(tenant).ok(),
            registry,
            inbound,
            pool,
            limit,
        }))
    }
}

impl Service<BoxedAttempt> for Dispatch {
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: BoxedAttempt) -> Self::Future {
        let me = self.clone();
        let rec = &req.member.instance.record;
        // Sidecar ids are unique within a tenant only: another tenant's instance (a
        // granted cross-tenant call) is never local. Two futures, each as large as its own
        // path needs.
        if *rec.sidecar_id == *me.0.sidecar_id && *rec.tenant == *me.0.tenant {
            return boxed!(async move { Ok(me.0.local(req).await) });
        }
        boxed!(async move { Ok(me.0.remote(req).await) })
    }
}

impl DispatchState {
    /// Through the inbound stack, to an instance of this sidecar.
    async fn local(&self, req: BoxedAttempt) -> Attempt {
        let rec = &req.member.instance.record;
        let Some(local) = self.registry.get(&rec.instance_id) else {
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!(
                "instance {} is not registered here any more",
                rec.instance_id
            )));
        };
        let req = *req;
        let call = InboundCall::new(InboundData {
            local,
            body: req.body,
            remaining: Some(req.remaining),
            headers: req.headers,
            shape: req.shape,
            priority: req.priority,
            idempotency_key: req.idempotency_key,
            payload_digest: req.payload_digest,
            tenant: self.tenant.clone(),
            trace: req.trace,
            caller: req.caller,
            capability: req.capability,
        });
        self.inbound.attempt(call).await
    }

    /// Over `Mesh`, to the instance's sidecar.
    async fn remote(&self, req: BoxedAttempt) -> Attempt {
        let rec = &req.member.instance.record;
        let conn = match self.pool.get(&rec.sidecar_address).await {
            Ok(c) => c,
            Err(e) => return Attempt::NotDelivered(DeliveryError::Unavailable(e.to_string())),
        };
        let path = match req.shape {
            Shape::Unary => grpc::DELIVER.get(),
            Shape::Stream => grpc::DELIVER_STREAM.get(),
        };
        let speaks = Speaks { hop: conn.speaks_hop(), whole: conn.answers_whole(), token: conn.hop_token() };
        let (headers, hop) = mesh_headers(&req, &self.tenant, self.tenant_header.as_ref(), speaks);
        let data = match req.body {
            Body::Frames(f) => grpc::frames_data(f),
            other => match collect_chunks(other, self.limit).await {
                Ok(d) => d,
                Err(e) => return Attempt::Failed(DeliveryError::Internal(e)),
            },
        };
        match send_h2(conn, path, headers, data, To::Sidecar { hop }).await {
            Ok(resp) if resp.headers().contains_key(header::NOT_DELIVERED) => {
                Attempt::NotDelivered(match Status::from_header_map(resp.headers()) {
                    Some(status) => DeliveryError::Remote(status),
                    None => DeliveryError::Unavailable("refused by the remote sidecar".into()),
                })
            }
            Ok(resp) => Attempt::Answered(resp, None),
            Err(SendError::NotSent(e)) => {
                Attempt::NotDelivered(DeliveryError::Unavailable(format!("sidecar {}: {e}", rec.sidecar_address)))
            }
            Err(SendError::Failed(e)) => Attempt::Failed(
                SidecarError::InstanceUnreachable {
                    instance: rec.instance_id.clone(),
                    cause: format!("connection to sidecar {} failed mid-call: {e}", rec.sidecar_address),
                }
                .into(),
            ),
        }
    }
}

/// What the connection to the target's sidecar knows of it (see [`crate::hop`]).
struct Speaks<'a> {
    /// It reads `ar-hop`.
    hop: bool,
    /// It answers a unary call whole when `ar-hop` asks.
    whole: bool,
    /// The connection's `ar-hop-ask` token.
    token: &'a HeaderValue,
}

/// The headers of a call to the instance's sidecar: those that travel on, the deadline and
/// trace, what the target's sidecar reads (priority, idempotency key, session) and the
/// call's routing fields, in `ar-hop` when the connection's peer reads it (`speaks.hop`,
/// with the sixth field when it answers whole and the call is unary; see [`crate::hop`]),
/// else in their separate headers with the connection's `ar-hop-ask` token
/// (`tenant_header`: `tenant`'s, made once). Also returns whether `ar-hop` was used.
fn mesh_headers(
    req: &AttemptRequest,
    tenant: &str,
    tenant_header: Option<&HeaderValue>,
    speaks: Speaks<'_>,
) -> (HeaderMap, bool) {
    let rec = &req.member.instance.record;
    let mut headers = HeaderMap::with_capacity(req.headers.len() + 8);
    grpc::copy_forwardable(&req.headers, &mut headers);
    grpc::set_timeout(&mut headers, req.remaining);
    agent_reach_telemetry::trace::inject(&req.trace, &mut headers);
    let routing = Hop {
        instance: &rec.instance_id,
        tenant,
        capability: &req.capability,
        caller: req.caller.as_ref().map(|c| (&*c.agent, &*c.instance)),
        // A stream's answer goes on as it comes.
        whole: speaks.whole && req.shape == Shape::Unary,
    };
    let hop = match speaks.hop.then(|| routing.value()).flatten() {
        Some(v) => {
            headers.insert(header::HOP, v);
            true
        }
        None => {
            separate_headers(&mut headers, &routing, tenant_header);
            headers.insert(header::HOP_ASK, speaks.token.clone());
            false
        }
    };
    if req.priority != Priority::Normal {
        headers.insert(header::PRIORITY, HeaderValue::from_static(req.priority.as_str()));
    }
    if let Some(k) = &req.idempotency_key
        && let Ok(v) = HeaderValue::from_str(k)
    {
        headers.insert(header::IDEMPOTENCY_KEY, v);
        if let Some(d) = &req.payload_digest
            && let Ok(v) = HeaderValue::from_str(&crate::call::digest_hex(d))
        {
            headers.insert(header::IDEMPOTENCY_DIGEST, v);
        }
    }
    if let Some(s) = &req.session_id
        && let Ok(v) = HeaderValue::from_str(s)
    {
        headers.insert(header::SESSION, v);
        if req.headers.contains_key(header::SESSION_NEW) {
            headers.insert(header::SESSION_NEW, HeaderValue::from_static("1"));
        }
    }
    (headers, hop)
}

/// The routing fields in their separate headers, for a sidecar that has not said it reads
/// `ar-hop` (`tenant`: the tenant's header, made once).
fn separate_headers(headers: &mut HeaderMap, routing: &Hop<'_>, tenant: Option<&HeaderValue>) {
    if let Ok(v) = HeaderValue::from_str(routing.instance) {
        headers.insert(header::INSTANCE, v);
    }
    if let Some(v) = tenant {
        headers.insert(header::TENANT, v.clone());
    }
    // This sidecar vouches for the caller it verified; the target's sidecar trusts it
    // only over mutual TLS from a sidecar of the tenant.
    if let Some((agent, instance)) = routing.caller
        && let (Ok(agent), Ok(instance)) = (HeaderValue::from_str(agent), HeaderValue::from_str(instance))
    {
        headers.insert(header::CALLER_AGENT, agent);
        headers.insert(header::CALLER_INSTANCE, instance);
    }
    if !routing.capability.is_empty()
        && let Ok(v) = HeaderValue::from_str(routing.capability)
    {
        headers.insert(header::CAPABILITY, v);
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::reason::{self, Reason};

    use super::*;

    #[test]
    fn overload_is_not_a_breaker_failure() {
        let overloaded =
            Attempt::NotDelivered(DeliveryError::Remote(reason::status(Reason::AgentOverloaded, "busy", &[])));
        assert!(!breaker_failure(&overloaded));
        assert!(breaker_failure(&Attempt::NotDelivered(DeliveryError::Remote(Status::unavailable("refused")))));
        assert!(breaker_failure(&Attempt::Failed(DeliveryError::Remote(Status::internal("boom")))));
        assert!(!breaker_failure(&Attempt::Failed(DeliveryError::Remote(Status::invalid_argument("bad")))));
    }

    fn attempt(capability: &str, caller: Option<crate::call::Caller>) -> AttemptRequest {
        AttemptRequest {
            trace: opentelemetry::Context::new(),
            member: agent_reach_routing::Member {
                instance: Arc::new(agent_reach::model::fixture::instance("i-1").build()),
                stats: Arc::default(),
            },
            breaker: Default::default(),
            body: Body::Empty,
            remaining: std::time::Duration::from_secs(1),
            headers: Arc::default(),
            shape: Shape::Unary,
            priority: Priority::Normal,
            idempotency_key: None,
            payload_digest: None,
            session_id: None,
            caller,
            capability: capability.into(),
        }
    }

    /// The `ar-` names among a request's headers, sorted.
    fn mesh_names(headers: &HeaderMap) -> Vec<&str> {
        let mut names: Vec<&str> = headers.keys().map(|n| n.as_str()).filter(|n| n.starts_with("ar-")).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn the_routing_fields_go_in_ar_hop_only_to_a_sidecar_that_reads_it() {
        let tenant = HeaderValue::from_static("acme");
        let token = HeaderValue::from_static("t0k3n");
        let caller = crate::call::Caller { agent: "planner".into(), instance: "p-1".into() };
        let req = attempt("text.echo", Some(caller));
        let speaks = |hop, whole| Speaks { hop, whole, token: &token };
        let (separate, used) = mesh_headers(&req, "acme", Some(&tenant), speaks(false, false));
        assert!(!used);
        assert_eq!(
            mesh_names(&separate),
            ["ar-caller-agent", "ar-caller-instance", "ar-capability", "ar-hop-ask", "ar-instance", "ar-tenant"]
        );
        assert_eq!(separate["ar-hop-ask"], "t0k3n");
        assert_eq!(
            [&separate["ar-instance"], &separate["ar-tenant"], &separate["ar-capability"]],
            ["i-1", "acme", "text.echo"]
        );
        let (hop, used) = mesh_headers(&req, "acme", Some(&tenant), speaks(true, false));
        assert!(used);
        assert_eq!(mesh_names(&hop), ["ar-hop"]);
        assert_eq!(hop["ar-hop"], "i-1|acme|text.echo|planner|p-1");
        // A sidecar that answers whole is asked to, for a unary call only.
        let (whole, _) = mesh_headers(&req, "acme", Some(&tenant), speaks(true, true));
        assert_eq!(whole["ar-hop"], "i-1|acme|text.echo|planner|p-1|w");
        let stream = AttemptRequest { shape: Shape::Stream, ..attempt("text.echo", None) };
        let (streamed, _) = mesh_headers(&stream, "acme", Some(&tenant), speaks(true, true));
        assert_eq!(streamed["ar-hop"], "i-1|acme|text.echo||");
        // What a name cannot hold goes as before, in the separate headers.
        let (odd, used) = mesh_headers(&attempt("a b", None), "acme", Some(&tenant), speaks(true, true));
        assert!(!used, "the answer may still say the peer reads ar-hop");
        assert_eq!(mesh_names(&odd), ["ar-capability", "ar-hop-ask", "ar-instance", "ar-tenant"]);
        // The rest of the request is the same either way.
        for headers in [&separate, &hop, &whole] {
            assert_eq!(headers["grpc-timeout"], "1000m");
        }
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use crate::outbound::size_of_output;

    #[test]
    fn the_dispatch_futures_stay_small() {
        // Boxed once per attempt, which copies them whole (a debug build's sizes). 4,088
        // bytes of the remote one are `Pool::get`'s future, whose connect is inline.
        let remote = size_of_output(|(d, a): (Dispatch, BoxedAttempt)| async move { d.0.remote(a).await });
        assert!(remote <= 4352, "DispatchState::remote's future is {remote} bytes (6,080 with the attempt inline)");
        let local = size_of_output(|(d, a): (Dispatch, BoxedAttempt)| async move { d.0.local(a).await });
        assert!(local <= 1024, "DispatchState::local's future is {local} bytes");
    }
}
