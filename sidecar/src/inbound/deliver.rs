//! Both ends of a delivery in the target's sidecar: the mesh entry ([`MeshEntry`], serving
//! `Mesh/Deliver` and `Mesh/DeliverStream`), which reads the call's headers and sends it
//! through the inbound stack, and the end of that stack ([`Deliver`]), which hands the call
//! to the local agent: over gRPC (body undecoded) or through the HTTP/JSON adapter.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::model::{FieldError, HealthState, Priority, Transport};
use agent_reach::reason::{self, Reason};
use agent_reach_routing::TableHandle;
use agent_reach_support::grpc_timeout;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use tower::Service;

use super::InboundService;
use super::session_attach::Scanned;
use crate::call::{Attempt, BoxFuture, Caller, InboundCall, InboundData, Shape, boxed};
use crate::error::{DeliveryError, SidecarError};
use crate::grpc::{self, Body, Frames, header};
use crate::hop::Hop;
use crate::limits::BodyRead;
use crate::pool::{Pool, SendError, To, collect_chunks, send_h2};
use crate::registry::Registry;

/// Longest wait for a session's context before delivering a call of that session.
const PREWARM_WAIT: Duration = Duration::from_millis(250);

/// Serves `Mesh/Deliver` and `Mesh/DeliverStream`. Shared: the mesh port clones it per
/// request, one reference count.
#[derive(Clone)]
pub(crate) struct MeshEntry(Arc<MeshParts>);

/// What [`MeshEntry`] holds.
struct MeshParts {
    registry: Arc<Registry>,
    tenant: Arc<str>,
    sidecar_id: Arc<str>,
    /// Taken off the caller's remaining time at this hop.
    deadline_reserve: Duration,
    stack: InboundService,
    /// Prefetches the session context of calls whose sessions are new here.
    sessions: Arc<crate::session::SessionCache>,
    /// The largest call read.
    limit: usize,
    /// How long the calling sidecar may take to send the call's body.
    body_read: BodyRead,
    /// Policies, for calls from other tenants, whose grants are checked before the
    /// instance is looked up (refusals counted with the other authorization ones).
    table: TableHandle,
    rejections: Arc<crate::telemetry::Rejections>,
}

impl MeshEntry {
    #[allow(clippy::too_many_arguments)] // the entry's parts, each passed once at start
    pub(crate) fn new(
        registry: Arc<Registry>,
        tenant: &str,
        sidecar_id: &str,
        deadline_reserve: Duration,
        stack: InboundService,
        sessions: Arc<crate::session::SessionCache>,
        limit: usize,
        body_read: BodyRead,
        (table, rejections): (TableHandle, Arc<crate::telemetry::Rejections>),
    ) -> MeshEntry {
        MeshEntry(Arc::new(MeshParts {
            table,
            rejections,
            registry,
            tenant: tenant.into(),
            sidecar_id: sidecar_id.into(),
            deadline_reserve,
            stack,
            sessions,
            limit,
            body_read,
        }))
    }

    /// Sends the call for the local instance named by the `ar-instance` header through the
    /// inbound stack, body undecoded.
    pub(crate) async fn deliver(&self, req: Request<Incoming>, shape: Shape) -> Response<Body> {
        let me = &*self.0;
        let (parts, body) = req.into_parts();
        // The headers read in a block of their own: what it found, not the whole set of
        // them, is held across the awaits below.
        let (local, tenant, timeout, priority, key, payload_digest, trace, caller, capability, session, echo, whole) = {
            let h = MeshHeaders::read(&parts.headers);
            let routing = match h.routing() {
                Ok(r) => r,
                Err(e) => return grpc::status_response(SidecarError::from(e).into_status()),
            };
            let instance_id = routing.instance;
            // A sidecar serves one tenant. A call from another tenant's sidecar comes only over
            // mutual TLS (its certificate's tenant is the header's, `mesh_tls::authorize`
            // checked) and for a capability whose policy grants that tenant; otherwise it is
            // refused without saying whether the instance exists.
            let tenant = match routing.tenant {
                // This sidecar's own tenant, the usual one: a reference count, not a copy.
                t if t == &*me.tenant => me.tenant.clone(),
                t => Arc::<str>::from(t),
            };
            if *tenant != *me.tenant {
                if parts.extensions.get::<crate::mesh_tls::MeshPeer>().is_none() {
                    return grpc::status_response(reason::status(
                        Reason::PermissionDenied,
                        format!("this sidecar does not serve tenant {tenant:?}"),
                        &[],
                    ));
                }
                let caller = routing.caller.map(|(agent, _)| agent);
                if let Err(e) = super::authz::foreign_granted(&me.table.load(), &tenant, caller, routing.capability) {
                    crate::telemetry::Rejections::count(&me.rejections.not_authorized);
                    return grpc::status_response(e.into_status());
                }
            }
            let Some(local) = me.registry.get(instance_id) else {
                return grpc::not_delivered_response(
                    DeliveryError::Unavailable(format!(
                        "instance {instance_id} is not registered at sidecar {}",
                        me.sidecar_id
                    ))
                    .into_status(),
                );
            };
            let timeout = h.timeout.and_then(|v| grpc_timeout::parse(v.as_bytes()));
            let priority = match h.priority.map(|v| v.as_bytes()) {
                Some(b"HIGH") => Priority::High,
                Some(b"LOW") => Priority::Low,
                _ => Priority::Normal,
            };
            let key = h.idempotency_key.and_then(|v| v.to_str().ok()).map(str::to_string);
            let payload_digest =
                h.idempotency_digest.and_then(|v| v.to_str().ok()).and_then(crate::call::digest_from_hex);
            let trace = agent_reach_telemetry::trace::extract(&parts.headers);
            // The caller another sidecar vouches for counts only from a mutual-TLS peer (whose
            // tenant `mesh_tls::authorize` checked: this one, or the header's for a call from
            // another tenant); on a plaintext mesh every caller is anonymous, whatever the
            // headers say.
            let caller = parts.extensions.get::<crate::mesh_tls::MeshPeer>().and_then(|_| {
                let (agent, instance) = routing.caller?;
                Some(Caller { agent: agent.into(), instance: instance.into() })
            });
            let capability: Arc<str> = routing.capability.into();
            // Prewarm: a session new to this sidecar (its calls moved here) is fetched before
            // the agent sees the call, so the agent's first read is a cache hit. Bounded, so a
            // slow control service delays the call by at most PREWARM_WAIT.
            // A session whose id the caller's sidecar made for this call has no context yet.
            let new_session = h.session_new;
            if new_session {
                me.sessions.skipped_new();
            }
            let session = h.session.filter(|_| !new_session);
            // A call with the separate headers asking whether this sidecar reads `ar-hop`
            // gets its token back (see `crate::hop`).
            // This sidecar also writes whole answers: the echo says so to a sidecar whose
            // token says it reads them.
            let echo = h.hop_ask.filter(|_| h.hop.is_none()).map(crate::hop::echo);
            // Only a unary answer is read whole; a stream's goes on as it comes.
            let whole = routing.whole && shape == Shape::Unary;
            (local, tenant, timeout, priority, key, payload_digest, trace, caller, capability, session, echo, whole)
        };
        let prewarmed = match session.and_then(|v| v.to_str().ok()) {
            Some(session) => {
                let wait = timeout.map_or(PREWARM_WAIT, |t| t.min(PREWARM_WAIT * 2) / 2);
                tokio::time::timeout(wait, me.sessions.prewarm(session)).await.unwrap_or(false)
            }
            _ => false,
        };
        // The call is one message: it is read whole before it asks for an admission slot,
        // so a caller that stalls its body holds none (and is refused after the body-read
        // timeout).
        let body = match me.body_read.within(collect_chunks(Body::Incoming(body), me.limit)).await {
            Ok(Ok(chunks)) => Body::Frames(Frames::chunks(chunks)),
            Ok(Err(e)) => return grpc::status_response(DeliveryError::Internal(e).into_status()),
            Err(e) => return grpc::status_response(e.into_status()),
        };
        // Named in the error of a whole answer that could not be read.
        let answering = whole.then(|| local.clone());
        let call = InboundCall::new(InboundData {
            local,
            body,
            remaining: timeout.map(|t| t.saturating_sub(me.deadline_reserve)),
            headers: Arc::new(parts.headers),
            shape,
            priority,
            idempotency_key: key,
            payload_digest,
            tenant,
            trace,
            caller,
            capability,
        });
        let attempt = me.stack.attempt(call).await;
        match attempt {
            Attempt::Answered(resp, permit) => {
                let (mut parts, body) = resp.into_parts();
                parts.headers.remove(http::header::CONTENT_LENGTH);
                let body = match answering {
                    Some(local) => match whole_answer(&mut parts.headers, body, permit, me.limit).await {
                        Ok(body) => body,
                        // What the caller's sidecar says when it cannot read an answer.
                        Err(e) => {
                            let cause = format!("reading its reply failed: {e}");
                            let status =
                                SidecarError::InstanceUnreachable { instance: local.instance_id.clone(), cause };
                            return grpc::status_response(status.into_status());
                        }
                    },
                    None => body.tap(permit, None),
                };
                if prewarmed {
                    parts.headers.insert(header::SESSION_PREWARMED, http::HeaderValue::from_static("1"));
                }
                if let Some(token) = echo {
                    parts.headers.insert(header::HOP_OK, token);
                }
                Response::from_parts(parts, body)
            }
            Attempt::NotDelivered(e) => grpc::not_delivered_response(e.into_status()),
            Attempt::Failed(e) => grpc::status_response(e.into_status()),
        }
    }
}

/// A unary answer read whole (at most `limit` bytes) for a calling sidecar that reads it
/// so (see [`crate::hop`]): when its trailers are an OK `grpc-status` and the load `permit`
/// writes, they go in `headers` and the body is the message alone, so the hop sends one
/// HEADERS block and DATA ending the stream instead of three frames. Any other trailers (a
/// failure's message, the agent's own metadata) stay trailers, as gRPC has them.
async fn whole_answer(
    headers: &mut HeaderMap,
    body: Body,
    permit: Option<grpc::Hook>,
    limit: usize,
) -> Result<Body, grpc::BoxError> {
    let (data, trailers) = grpc::read_whole(body, limit).await?;
    let Some(mut trailers) = trailers else {
        // No trailers: a trailers-only answer (its status in `headers`) or a broken one,
        // passed on as it came.
        return Ok(Body::Frames(Frames::raw(data)).tap(permit, None));
    };
    if let Some(permit) = &permit {
        permit.on_trailers(&mut trailers);
    }
    // One pass over the entries, nothing hashed: an OK status and at most the load.
    let mut ok = false;
    for (name, value) in &trailers {
        let status = *name == grpc::HEADER_GRPC_STATUS;
        if (status && value != "0") || (!status && *name != header::LOAD) {
            ok = false;
            break;
        }
        ok |= status;
    }
    // A name given twice (or no message) goes as gRPC has it.
    if !ok || data.is_empty() || trailers.len() != trailers.keys_len() {
        return Ok(Body::Frames(Frames::raw(data).with_trailers(Some(trailers))));
    }
    // One value per name: every entry comes with its name.
    for (name, value) in trailers {
        if let Some(name) = name {
            headers.append(name, value);
        }
    }
    Ok(Body::Frames(Frames::raw(data).with_open_length()))
}

/// The headers of a delivery the entry reads, found in one pass over the map: a `get`
/// hashes the name it looks for (a dozen lookups of `ar-` names cost ~3k instructions per
/// call). As `get`, each holds the first value of its name.
#[derive(Default)]
struct MeshHeaders<'h> {
    instance: Option<&'h HeaderValue>,
    tenant: Option<&'h HeaderValue>,
    capability: Option<&'h HeaderValue>,
    caller_agent: Option<&'h HeaderValue>,
    caller_instance: Option<&'h HeaderValue>,
    timeout: Option<&'h HeaderValue>,
    priority: Option<&'h HeaderValue>,
    idempotency_key: Option<&'h HeaderValue>,
    idempotency_digest: Option<&'h HeaderValue>,
    session: Option<&'h HeaderValue>,
    session_new: bool,
    /// The five routing fields in one header (see [`crate::hop`]).
    hop: Option<&'h HeaderValue>,
    /// The token of a caller's sidecar asking whether this one reads `ar-hop`.
    hop_ask: Option<&'h HeaderValue>,
}

impl<'h> MeshHeaders<'h> {
    fn read(headers: &'h HeaderMap) -> MeshHeaders<'h> {
        use agent_reach::headers as h;
        let mut out = MeshHeaders::default();
        for (name, value) in headers {
            let slot = match name.as_str() {
                h::INSTANCE => &mut out.instance,
                h::TENANT => &mut out.tenant,
                h::CAPABILITY => &mut out.capability,
                h::CALLER_AGENT => &mut out.caller_agent,
                h::CALLER_INSTANCE => &mut out.caller_instance,
                "grpc-timeout" => &mut out.timeout,
                h::PRIORITY => &mut out.priority,
                h::IDEMPOTENCY_KEY => &mut out.idempotency_key,
                h::IDEMPOTENCY_DIGEST => &mut out.idempotency_digest,
                h::SESSION => &mut out.session,
                h::HOP => &mut out.hop,
                h::HOP_ASK => &mut out.hop_ask,
                h::SESSION_NEW => {
                    out.session_new = true;
                    continue;
                }
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        out
    }

    /// The call's routing fields: from `ar-hop`, or from the separate headers (a request
    /// with both forms is refused, as `mesh_tls::authorize` refuses it). The error names
    /// what is wrong.
    fn routing(&self) -> Result<Hop<'h>, FieldError> {
        use agent_reach::headers as h;
        let text = |v: Option<&'h HeaderValue>| v.and_then(|v| v.to_str().ok());
        if let Some(hop) = self.hop {
            let separate = [self.instance, self.tenant, self.capability, self.caller_agent, self.caller_instance];
            if separate.iter().any(Option::is_some) {
                return Err(FieldError::new(h::HOP, "sent with the separate headers it replaces"));
            }
            return Hop::parse(hop).map_err(|why| FieldError::new(h::HOP, why));
        }
        let Some(instance) = text(self.instance).filter(|i| !i.is_empty()) else {
            return Err(FieldError::new(h::INSTANCE, "header naming the instance is required"));
        };
        let caller = text(self.caller_agent).zip(text(self.caller_instance));
        Ok(Hop {
            instance,
            tenant: text(self.tenant).unwrap_or_default(),
            capability: text(self.capability).unwrap_or_default(),
            caller,
            whole: false,
        })
    }
}

/// The end of the inbound stack: hands the call to the local agent. Shared: a clone is
/// one reference count.
#[derive(Clone)]
pub(crate) struct Deliver(Arc<DeliverParts>);

/// What [`Deliver`] holds.
struct DeliverParts {
    /// For operators' holds (PAUSED at control).
    table: TableHandle,
    pool: Arc<Pool>,
    /// The largest call read.
    limit: usize,
    /// Delivers a call's session with it to gRPC agents.
    snapshots: super::session_attach::Snapshots,
}

impl Deliver {
    pub(crate) fn new(
        table: TableHandle,
        pool: Arc<Pool>,
        limit: usize,
        snapshots: super::session_attach::Snapshots,
    ) -> Deliver {
        Deliver(Arc::new(DeliverParts { table, pool, limit, snapshots }))
    }
}

impl Service<InboundCall> for Deliver {
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let me = self.0.clone();
        boxed!(async move { Ok(me.deliver(call).await) })
    }
}

impl DeliverParts {
    async fn deliver(&self, mut call: InboundCall) -> Attempt {
        // The body is handed on; the rest of the call is read in place.
        let body = std::mem::replace(&mut call.body, Body::Empty);
        // Its fields, borrowed apart (the call itself is not `Sync`: a reference to it
        // cannot be held across an await).
        let InboundData { local, remaining, headers: call_headers, shape, trace, caller, tenant, .. } = &*call;
        let (remaining, shape) = (*remaining, *shape);
        let instance_id = local.instance_id.as_str();
        let state = local.effective_state();
        if !state.routable() {
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!("instance {instance_id} is {state}")));
        }
        // An operator's hold (PAUSED at control) counts even while the agent reports UP.
        if let Some(m) = self.table.load().instances.get(instance_id)
            && m.instance.record.state == HealthState::Paused
        {
            let state = m.instance.record.state;
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!(
                "instance {instance_id} is {state} at control"
            )));
        }
        if remaining.is_some_and(|r| r.is_zero()) {
            return Attempt::Failed(
                SidecarError::DeadlineExceeded { deadline: Duration::ZERO, attempts: 0, tried: Vec::new() }.into(),
            );
        }
        if local.registration.transport == Transport::Http {
            let mut trace_headers = HeaderMap::new();
            agent_reach_telemetry::trace::inject(trace, &mut trace_headers);
            return super::http_agent::deliver(local, body, remaining, &trace_headers, shape, tenant, caller.as_ref())
                .await;
        }
        let conn = match self.pool.get(&local.authority).await {
            Ok(c) => c,
            Err(e) => return Attempt::NotDelivered(DeliveryError::Unavailable(format!("instance {instance_id}: {e}"))),
        };
        let path = match shape {
            Shape::Unary => grpc::HANDLE.get(),
            Shape::Stream => grpc::HANDLE_STREAM.get(),
        };
        let mut headers = HeaderMap::with_capacity(call_headers.len() + 4);
        grpc::copy_forwardable(call_headers, &mut headers);
        if let Some(r) = remaining {
            grpc::set_timeout(&mut headers, r);
        }
        // The agent sees the target sidecar's server span as its parent.
        agent_reach_telemetry::trace::inject(trace, &mut headers);
        // The agent learns the verified caller from its sidecar (the `caller` in the message
        // is what the caller wrote).
        if let Some(c) = caller
            && let (Ok(agent), Ok(instance)) =
                (http::HeaderValue::from_str(&c.agent), http::HeaderValue::from_str(&c.instance))
        {
            headers.insert(header::CALLER_AGENT, agent);
            headers.insert(header::CALLER_INSTANCE, instance);
            if let Ok(tenant) = http::HeaderValue::from_str(tenant) {
                headers.insert(header::CALLER_TENANT, tenant);
            }
        }
        // The request is one message: read it whole, so HEADERS and DATA leave together.
        let data = match body {
            Body::Frames(f) => grpc::frames_data(f),
            other => match collect_chunks(other, self.limit).await {
                Ok(d) => d,
                Err(e) => return Attempt::Failed(DeliveryError::Internal(e)),
            },
        };
        let data = Scanned::new(data);
        if let Err(e) = data.check_tenant(tenant) {
            return Attempt::Failed(e);
        }
        if local.registration.transport == Transport::A2a {
            return super::a2a_agent::deliver(conn, instance_id, data.into_data(), headers, shape, self.limit).await;
        }
        let data = self.snapshots.attach(data, tenant);
        // No timer here: the caller's sidecar enforces the deadline (its cancellation
        // reaches the agent), and the agent sees the remaining time in grpc-timeout.
        match send_h2(conn, path, headers, data, To::Agent).await {
            Ok(mut resp) => {
                // The `date` that hyper-based agent servers (tonic's) put on every answer is
                // not gRPC metadata: not carried to the caller, encoded and decoded at each
                // hop on every call.
                resp.headers_mut().remove(http::header::DATE);
                Attempt::Answered(resp, None)
            }
            Err(SendError::NotSent(e)) => {
                Attempt::NotDelivered(DeliveryError::Unavailable(format!("instance {instance_id}: {e}")))
            }
            Err(SendError::Failed(e)) => Attempt::Failed(
                SidecarError::InstanceUnreachable { instance: instance_id.to_string(), cause: e }.into(),
            ),
        }
    }
}

#[cfg(test)]
mod header_tests {
    use http::HeaderName;

    use super::*;

    #[test]
    fn one_pass_finds_what_get_finds() {
        let mut map = HeaderMap::new();
        for (name, value) in [
            ("ar-instance", "i-1"),
            ("ar-tenant", "t"),
            ("ar-capability", "c"),
            ("ar-caller-agent", "planner"),
            ("ar-caller-instance", "p-1"),
            ("grpc-timeout", "250m"),
            ("ar-priority", "HIGH"),
            ("ar-idempotency-key", "k"),
            ("ar-idempotency-digest", "d"),
            ("ar-session", "s-1"),
            ("content-type", "application/grpc"),
        ] {
            map.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        map.append(header::PRIORITY, HeaderValue::from_static("LOW"));
        let h = MeshHeaders::read(&map);
        let found = [
            (h.instance, header::INSTANCE),
            (h.tenant, header::TENANT),
            (h.capability, header::CAPABILITY),
            (h.caller_agent, header::CALLER_AGENT),
            (h.caller_instance, header::CALLER_INSTANCE),
            (h.timeout, grpc::HEADER_GRPC_TIMEOUT),
            (h.priority, header::PRIORITY),
            (h.idempotency_key, header::IDEMPOTENCY_KEY),
            (h.idempotency_digest, header::IDEMPOTENCY_DIGEST),
            (h.session, header::SESSION),
        ];
        for (value, name) in found {
            assert_eq!(value, map.get(&name), "{name}");
        }
        assert_eq!(h.priority.map(HeaderValue::as_bytes), Some(&b"HIGH"[..]), "the first value, as get");
        assert!(!h.session_new);
        map.insert(header::SESSION_NEW, HeaderValue::from_static("1"));
        assert!(MeshHeaders::read(&map).session_new);
        assert!(MeshHeaders::read(&HeaderMap::new()).instance.is_none());
    }

    #[test]
    fn the_routing_fields_come_from_ar_hop_or_the_separate_headers_never_both() {
        let map = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for &(name, value) in pairs {
                map.append(HeaderName::from_static(name), HeaderValue::from_static(value));
            }
            map
        };
        let expected =
            Hop { instance: "i-1", tenant: "t", capability: "c", caller: Some(("planner", "p-1")), whole: false };
        let separate = map(&[
            ("ar-instance", "i-1"),
            ("ar-tenant", "t"),
            ("ar-capability", "c"),
            ("ar-caller-agent", "planner"),
            ("ar-caller-instance", "p-1"),
        ]);
        assert_eq!(MeshHeaders::read(&separate).routing().unwrap(), expected);
        assert!(MeshHeaders::read(&separate).hop_ask.is_none());
        let mut asking = separate.clone();
        asking.insert(header::HOP_ASK, HeaderValue::from_static("t0k3n"));
        assert_eq!(MeshHeaders::read(&asking).hop_ask.unwrap(), "t0k3n");
        assert_eq!(MeshHeaders::read(&asking).routing().unwrap(), expected);
        let hop = map(&[("ar-hop", "i-1|t|c|planner|p-1"), ("ar-priority", "HIGH")]);
        let h = MeshHeaders::read(&hop);
        assert_eq!(h.routing().unwrap(), expected);
        assert_eq!(h.priority.unwrap(), "HIGH", "the other headers are read as before");
        let why = |pairs| MeshHeaders::read(&map(pairs)).routing().unwrap_err().to_string();
        assert!(why(&[("ar-hop", "i-1|t|c||"), ("ar-instance", "i-2")]).contains("sent with the separate headers"));
        assert!(why(&[("ar-hop", "i-1|t")]).contains("must have 5 fields"));
        assert!(why(&[("ar-tenant", "t")]).contains("header naming the instance is required"));
        assert!(why(&[("ar-instance", ""), ("ar-tenant", "t")]).contains("header naming the instance is required"));
        // Without the caller's instance, the separate headers name no caller (as before).
        let half = map(&[("ar-instance", "i-1"), ("ar-caller-agent", "planner")]);
        assert_eq!(MeshHeaders::read(&half).routing().unwrap().caller, None);
    }
}

#[cfg(test)]
mod whole_tests {
    use bytes::Bytes;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    use super::*;

    /// Writes a load into the trailers, as an admission permit does.
    struct Load;

    impl grpc::TrailersHook for Load {
        fn on_trailers(&self, trailers: &mut HeaderMap) {
            trailers.insert(header::LOAD, HeaderValue::from_static("0.500"));
        }
    }

    fn answer(data: &'static [u8], trailers: &[(&'static str, &'static str)]) -> Body {
        let mut map = HeaderMap::new();
        for &(name, value) in trailers {
            map.append(http::HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        Body::Frames(Frames::raw(Bytes::from_static(data)).with_trailers((!trailers.is_empty()).then_some(map)))
    }

    /// The answer's headers and its body's data and trailers, as the caller's sidecar reads them.
    async fn sent(body: Body, hook: bool) -> (Vec<String>, Bytes, Option<HeaderMap>, bool) {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        let hook = hook.then(|| Box::new(Load) as grpc::Hook);
        let body = whole_answer(&mut headers, body, hook, 64).await.unwrap();
        let exact = body.size_hint().exact().is_some();
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        let names = headers.iter().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect();
        (names, collected.to_bytes(), trailers, exact)
    }

    #[tokio::test]
    async fn an_ok_answer_sends_its_status_and_load_in_its_headers() {
        let (headers, data, trailers, exact) = sent(answer(b"message", &[("grpc-status", "0")]), true).await;
        assert_eq!(headers, ["content-type: application/grpc", "grpc-status: 0", "ar-load: 0.500"]);
        assert_eq!((&data[..], trailers), (&b"message"[..], None));
        // No exact length: hyper would write `content-length` from it.
        assert!(!exact);
        let (headers, _, trailers, _) = sent(answer(b"message", &[("grpc-status", "0")]), false).await;
        assert_eq!((headers.len(), trailers), (2, None));
    }

    #[tokio::test]
    async fn other_trailers_stay_trailers() {
        for trailers in [
            &[("grpc-status", "0"), ("x-agent-metadata", "kept")][..],
            &[("grpc-status", "0"), ("grpc-message", "fine")],
            &[("grpc-status", "13"), ("grpc-message", "boom")],
            &[("grpc-status", "00")],
            &[("grpc-status", "0"), ("grpc-status", "13")],
            &[("grpc-status", "0"), ("grpc-status", "0")],
            &[("ar-load", "0.100")],
        ] {
            let (headers, data, read, _) = sent(answer(b"message", trailers), true).await;
            assert_eq!(headers, ["content-type: application/grpc"], "{trailers:?}");
            assert_eq!(&data[..], b"message");
            let read = read.unwrap();
            for &(name, value) in trailers.iter().filter(|(name, _)| *name != "ar-load") {
                assert!(read.get_all(name).iter().any(|v| v == value), "{trailers:?}");
            }
            // The permit still wrote the load (its own), into the trailers.
            assert_eq!(read["ar-load"], "0.500");
        }
        // An answer without a message keeps its status where it was.
        let (headers, data, read, _) = sent(answer(b"", &[("grpc-status", "0")]), false).await;
        assert_eq!((headers.len(), data.len(), read.unwrap()["grpc-status"].to_str().unwrap()), (1, 0, "0"));
    }

    #[tokio::test]
    async fn an_answer_without_trailers_goes_as_it_came_and_a_long_one_is_refused() {
        let (headers, data, read, _) = sent(answer(b"part", &[]), true).await;
        assert_eq!((headers.len(), &data[..], read), (1, &b"part"[..], None));
        let mut headers = HeaderMap::new();
        let long = Body::Frames(Frames::raw(Bytes::from(vec![0u8; 65])));
        assert!(whole_answer(&mut headers, long, None, 64).await.is_err());
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use crate::outbound::size_of_output;

    #[test]
    fn the_entry_and_the_delivery_move_small_futures() {
        // Upper bounds (debug build) on the futures each call's delivery makes: the entry's
        // (boxed by the mesh port) and the delivery's, which hold the call as a pointer.
        let entry =
            size_of_output(|(m, r): (MeshEntry, Request<Incoming>)| async move { m.deliver(r, Shape::Unary).await });
        let deliver = size_of_output(|(d, c): (Arc<DeliverParts>, InboundCall)| async move { d.deliver(c).await });
        // 3,456 before a unary answer could be read whole here (`whole_answer`).
        assert!(entry <= 3_840, "MeshEntry::deliver's future: {entry} bytes");
        assert!(deliver <= 4_608, "Deliver's future: {deliver} bytes");
    }
}
