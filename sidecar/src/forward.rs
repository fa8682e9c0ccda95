//! The call path. [`invoke`] runs in the caller's sidecar: it reads the caller's message,
//! decodes only the routing fields, picks an instance with the target's strategy, and
//! forwards the caller's bytes (plus a few appended fields) to the instance's sidecar over
//! `Mesh`. [`deliver`] runs in the target's sidecar: it passes the body through to the
//! local agent without decoding it, and reports the instance's load in the trailers.
//!
//! Retries happen here, in the caller's sidecar only, so they never multiply across hops:
//! - a call that provably never reached an agent (connection refused, instance gone or
//!   paused at its sidecar) is retried on a different instance, the first time always;
//! - a call that may have run is retried (on a different instance) only when the target's
//!   policy marks it idempotent or the call carries an idempotency key, the failure is
//!   UNAVAILABLE or an overload, the payload is under the policy's retry size limit, and
//!   the target's retry budget has room.
//!
//! When no instance can take the call, the target's policy may name a fallback capability
//! or agent; the reply then says so. Deadlines shrink by the configured reserve at each
//! hop. Payloads are never decoded or copied (beyond coalescing small messages).

use std::sync::Arc;
use std::time::Duration;

use agent_reach::convert::{priority_from_i32, target_from_proto};
use agent_reach::grpc_timeout;
use agent_reach::model::{FieldError, Priority, Target, TargetKind};
use agent_reach::policy::{Fallback, PolicyKind, PolicySpec, RetryPolicy, Strategy};
use agent_reach::proto;
use agent_reach::reason::{self, Reason};
use agent_reach_routing::{self as route, CallGuard, Member, PickRequest, RouteError, RoutingTable, clock};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prost::Message;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::Inner;
use crate::error::SidecarError;
use crate::grpc::{self, Body, Frames, ReadError};

/// Room for the envelope fields around a payload of the maximum size.
const ENVELOPE_ALLOWANCE: usize = 64 * 1024;
/// Most instances one call is tried on.
const MAX_ATTEMPTS: u32 = 3;

pub const PATH_INVOKE: &str = "/agentreach.v1.Sidecar/Invoke";
pub const PATH_INVOKE_STREAM: &str = "/agentreach.v1.Sidecar/InvokeStream";
pub const PATH_DELIVER: &str = "/agentreach.v1.Mesh/Deliver";
pub const PATH_DELIVER_STREAM: &str = "/agentreach.v1.Mesh/DeliverStream";
const PATH_HANDLE: &str = "/agentreach.v1.Agent/Handle";
const PATH_HANDLE_STREAM: &str = "/agentreach.v1.Agent/HandleStream";

/// Response metadata: attempts the caller's sidecar made.
pub const HEADER_ATTEMPTS: HeaderName = HeaderName::from_static("ar-attempts");
/// Response metadata: instances tried, comma-separated, in order.
pub const HEADER_TRIED: HeaderName = HeaderName::from_static("ar-instances-tried");
/// Response metadata: set when a fallback served the call; names the original target.
pub const HEADER_FALLBACK_FROM: HeaderName = HeaderName::from_static("ar-fallback-from");
/// Request metadata on `Mesh` calls: the caller's tenant, checked by the target's sidecar.
pub const HEADER_TENANT: HeaderName = HeaderName::from_static("ar-tenant");

/// The fields of an `InvokeRequest` the caller's sidecar needs for routing. Same field
/// numbers as `InvokeRequest`; content type and metadata are skipped unread.
#[derive(Clone, PartialEq, Message)]
struct InvokeHead {
    #[prost(message, optional, tag = "1")]
    target: Option<proto::Target>,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
    #[prost(string, tag = "4")]
    session_id: String,
    #[prost(int32, tag = "5")]
    priority: i32,
    #[prost(string, tag = "6")]
    idempotency_key: String,
    #[prost(string, tag = "8")]
    message_id: String,
}

/// The metadata of an `InvokeRequest`, decoded only when a policy needs it.
#[derive(Clone, PartialEq, Message)]
struct InvokeMetadata {
    #[prost(map = "string, string", tag = "7")]
    metadata: std::collections::HashMap<String, String>,
}

/// Unary or server-streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Unary,
    Stream,
}

/// How one forwarding attempt ended.
// Short-lived and moved once per attempt; boxing the large variant would allocate per call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Attempt {
    /// The target's sidecar (or agent) answered; the call may have run. When the agent is
    /// local, the guard counts the delivery until the answer ends.
    Answered(Response<Body>, Option<crate::inbound::InboundGuard>),
    /// The call provably never reached an agent.
    NotDelivered(String),
    /// The call failed after it may have reached an agent.
    Failed(Status),
}

/// Serves `Sidecar/Invoke` and `Sidecar/InvokeStream`.
pub async fn invoke(inner: Arc<Inner>, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    let _call = inner.calls.begin();
    match invoke_inner(&inner, req, shape).await {
        Ok(resp) => resp,
        Err(e) => grpc::status_response(e.into_status()),
    }
}

/// What is known about the call once its message is read.
struct Call {
    message: Bytes,
    head: InvokeHead,
    target: Target,
    priority: Priority,
    headers: HeaderMap,
    shape: Shape,
    started: Instant,
    timeout: Duration,
    deadline: Instant,
}

async fn invoke_inner(inner: &Inner, req: Request<Incoming>, shape: Shape) -> Result<Response<Body>, SidecarError> {
    let started = Instant::now();
    let cfg = &inner.config;
    let (parts, mut body) = req.into_parts();
    let limit = cfg.max_payload_bytes;
    let message = match grpc::read_message(&mut body, limit + ENVELOPE_ALLOWANCE).await {
        Ok(m) => m,
        Err(ReadError::TooLarge(size)) => return Err(SidecarError::PayloadTooLarge { size, limit }),
        Err(ReadError::Compressed) => {
            return Err(FieldError::new("grpc-encoding", "compressed requests are not supported; use identity").into());
        }
        Err(ReadError::Malformed(why)) => return Err(FieldError::new("request", why).into()),
        Err(ReadError::Body(e)) => return Err(SidecarError::Internal(format!("reading the request: {e}"))),
    };
    let head = InvokeHead::decode(message.clone())
        .map_err(|e| FieldError::new("request", format!("not a valid InvokeRequest: {e}")))?;
    if head.payload.len() > limit {
        return Err(SidecarError::PayloadTooLarge { size: head.payload.len(), limit });
    }
    let target = target_from_proto(head.target.clone())?;
    let priority = priority_from_i32(head.priority);
    let table = inner.table.load_full();
    let spec = policy_of(&table, &target).cloned();
    let timeout = parts
        .headers
        .get(grpc::HEADER_GRPC_TIMEOUT)
        .and_then(|v| grpc_timeout::parse(v.as_bytes()))
        .or_else(|| spec.as_ref().and_then(|s| s.default_timeout_ms).map(|ms| Duration::from_millis(u64::from(ms))))
        .unwrap_or(cfg.default_timeout);
    let call = Call {
        message,
        head,
        target,
        priority,
        headers: parts.headers,
        shape,
        started,
        timeout,
        deadline: started + timeout,
    };
    let primary = call.target.clone();
    match route_and_send(inner, &table, &call, &primary, spec.as_ref(), None).await {
        Err(Exhausted { error, attempts, tried }) => {
            // The policy's fallback takes calls no instance of the target could take.
            let Some(fallback) = spec.as_ref().and_then(|s| s.fallback.clone()) else { return Err(error) };
            let fallback_target = Target {
                kind: match fallback {
                    Fallback::Capability(c) => TargetKind::Capability(c),
                    Fallback::Agent(a) => TargetKind::Agent(a),
                },
                tags: Vec::new(),
            };
            tracing::debug!(target = %primary, fallback = %fallback_target, "using the fallback: {error}");
            let fallback_spec = policy_of(&table, &fallback_target).cloned();
            route_and_send(inner, &table, &call, &fallback_target, fallback_spec.as_ref(), Some(&primary))
                .await
                .map_err(|e| match e.error {
                    SidecarError::AgentNotFound { target, .. } | SidecarError::NoHealthyInstance { target, .. } => {
                        SidecarError::NoHealthyInstance {
                            target: primary.to_string(),
                            why: format!(
                                "{error} (after {attempts} attempt(s)); the fallback {target} could not take it either"
                            ),
                            tried: tried.into_iter().chain(e.tried).collect(),
                        }
                    }
                    other => other,
                })
        }
        Ok(resp) => Ok(resp),
    }
}

/// The policy of the group a target names.
fn policy_of<'t>(table: &'t RoutingTable, target: &Target) -> Option<&'t PolicySpec> {
    let (kind, name) = match &target.kind {
        TargetKind::Capability(c) => (PolicyKind::Capability, c),
        TargetKind::Agent(a) => (PolicyKind::Agent, a),
    };
    table.policy(kind, name).map(|p| &p.spec)
}

/// Every instance that could take the call failed or refused it.
struct Exhausted {
    error: SidecarError,
    attempts: u32,
    tried: Vec<String>,
}

impl From<SidecarError> for Exhausted {
    fn from(error: SidecarError) -> Self {
        Exhausted { error, attempts: 0, tried: Vec::new() }
    }
}

/// Routes the call to `target` and sends it, retrying as the module documentation says.
/// `Err` only when no instance could take it (so a fallback may); errors from agents come
/// back as `Ok` responses carrying the agent's status.
async fn route_and_send(
    inner: &Inner,
    table: &RoutingTable,
    call: &Call,
    target: &Target,
    spec: Option<&PolicySpec>,
    fallback_from: Option<&Target>,
) -> Result<Response<Body>, Exhausted> {
    let cfg = &inner.config;
    let group = route::resolve(table, target).map_err(SidecarError::from)?;
    let retry = spec.and_then(|s| s.retry).unwrap_or_default();
    let may_rerun = retry.idempotent || !call.head.idempotency_key.is_empty();
    let retry_payload_ok = call.head.payload.len() <= retry.max_payload_bytes() as usize;
    let metadata;
    let hash_key: Option<&str> = match spec {
        Some(s) if s.strategy == Some(Strategy::ConsistentHash) && !s.hash_key.is_empty() => {
            metadata = InvokeMetadata::decode(call.message.clone()).unwrap_or_default();
            metadata.metadata.get(&s.hash_key).map(String::as_str)
        }
        _ => (!call.head.session_id.is_empty()).then_some(call.head.session_id.as_str()),
    };
    let capability = match &target.kind {
        TargetKind::Capability(c) => c.clone(),
        TargetKind::Agent(_) => String::new(),
    };
    let message_id =
        if call.head.message_id.is_empty() { format!("{:032x}", rand::random::<u128>()) } else { String::new() };
    group.state.retry_budget.record_call(clock());

    let mut tried: Vec<String> = Vec::new();
    let mut last_failure = String::new();
    let mut last_answer: Option<Response<Body>> = None;
    let mut attempt = 0;
    while attempt < MAX_ATTEMPTS {
        attempt += 1;
        let request = PickRequest { target, priority: call.priority, hash_key, exclude: &tried, now: clock() };
        let (member, group_state) = match route::pick(table, &request) {
            Ok(p) => p,
            Err(e) if attempt > 1 => {
                // Nothing left to try: the last answer stands, or say why nothing worked.
                if let Some(resp) = last_answer {
                    return Ok(resp);
                }
                let why = match e {
                    RouteError::NoHealthyInstance { why, .. } => why,
                    RouteError::NotFound { .. } => "the target left the routing table".into(),
                };
                return Err(Exhausted {
                    error: SidecarError::NoHealthyInstance {
                        target: target.to_string(),
                        why: format!("{last_failure}; no other instance: {why}"),
                        tried: tried.clone(),
                    },
                    attempts: attempt - 1,
                    tried,
                });
            }
            Err(e) => return Err(SidecarError::from(e).into()),
        };
        let remaining = call.deadline.saturating_duration_since(Instant::now()).saturating_sub(cfg.deadline_reserve);
        if remaining.is_zero() {
            return Ok(deadline_exceeded(call, attempt - 1, tried));
        }
        let guard = CallGuard::begin(&member, &group_state);
        let id = member.id().to_string();
        let extension = proto::HandleRequest {
            message_id: message_id.clone(),
            instance_id: id.clone(),
            attempt,
            capability: capability.clone(),
            tenant: cfg.tenant.clone(),
            ..Default::default()
        }
        .encode_to_vec();
        let body = Body::Frames(Frames::message(call.message.clone(), &extension));
        let sent_at = clock();
        let outcome =
            tokio::time::timeout_at(call.deadline, send(inner, &member, body, remaining, &call.headers, call.shape))
                .await;
        tried.push(id.clone());
        let answer = match outcome {
            Err(_) => return Ok(deadline_exceeded(call, attempt, tried)),
            Ok(Attempt::NotDelivered(why)) => {
                tracing::debug!(instance = %id, attempt, "not delivered: {why}");
                // Avoid it for a while, until its sidecar's probes or its lease settle it.
                member.stats.mark_overloaded(clock());
                last_failure = format!("{id} not delivered: {why}");
                // The first such retry is always allowed; later ones spend budget.
                if attempt < MAX_ATTEMPTS && (attempt == 1 || budget(&group_state, &retry)) {
                    continue;
                }
                break;
            }
            Ok(Attempt::Failed(status)) => {
                last_failure = format!("{id}: {}", status.message());
                if attempt < MAX_ATTEMPTS
                    && may_rerun
                    && retry_payload_ok
                    && retryable(&status)
                    && budget(&group_state, &retry)
                {
                    last_answer = Some(grpc::status_response(status));
                    continue;
                }
                return Ok(with_attempts(grpc::status_response(status), attempt, &tried));
            }
            Ok(Attempt::Answered(resp, inbound)) => (resp, inbound),
        };
        let now = clock();
        match finish(inner, answer, &member, guard, attempt, &tried, call, fallback_from).await {
            Finished::Done(resp) => {
                member.stats.observe(Duration::from_nanos(now.saturating_sub(sent_at)), now);
                return Ok(resp);
            }
            Finished::Failed { status, resp } => {
                member.stats.observe(Duration::from_nanos(clock().saturating_sub(sent_at)), clock());
                if status.code() == Code::ResourceExhausted {
                    // An overloaded instance is avoided for a while instead of being
                    // treated as broken.
                    member.stats.mark_overloaded(clock());
                }
                last_failure = format!("{id}: {:?} {}", status.code(), status.message());
                if attempt < MAX_ATTEMPTS
                    && may_rerun
                    && retry_payload_ok
                    && retryable(&status)
                    && budget(&group_state, &retry)
                {
                    last_answer = Some(resp);
                    continue;
                }
                return Ok(resp);
            }
        }
    }
    if let Some(resp) = last_answer {
        return Ok(resp);
    }
    Err(Exhausted {
        error: SidecarError::NoHealthyInstance {
            target: target.to_string(),
            why: format!("{last_failure} (gave up after {attempt} attempts)"),
            tried: tried.clone(),
        },
        attempts: attempt,
        tried,
    })
}

fn budget(group: &route::GroupState, retry: &RetryPolicy) -> bool {
    group.retry_budget.try_retry(clock(), retry.budget_ratio(), retry.budget_min_per_second())
}

/// Failures worth another instance, for calls that may run twice.
fn retryable(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        // Overloaded elsewhere is worth a try; a rate limit on this caller is not.
        Code::ResourceExhausted => reason::error_info(status).is_none_or(|i| i.reason != Reason::RateLimited.as_str()),
        _ => false,
    }
}

fn deadline_exceeded(call: &Call, attempts: u32, tried: Vec<String>) -> Response<Body> {
    tracing::debug!(after = ?call.started.elapsed(), "deadline exceeded");
    let status =
        SidecarError::DeadlineExceeded { deadline: call.timeout, attempts, tried: tried.clone() }.into_status();
    with_attempts(grpc::status_response(status), attempts, &tried)
}

/// Adds the attempts and instances tried to an answer's headers.
fn with_attempts(mut resp: Response<Body>, attempts: u32, tried: &[String]) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(HEADER_ATTEMPTS, HeaderValue::from(attempts));
    if let Ok(v) = HeaderValue::from_str(&tried.join(",")) {
        h.insert(HEADER_TRIED, v);
    }
    resp
}

/// Sends one attempt to `member`: straight to the agent when it is local, else to its
/// sidecar's mesh API.
async fn send(
    inner: &Inner,
    member: &Member,
    body: Body,
    remaining: Duration,
    headers: &HeaderMap,
    shape: Shape,
) -> Attempt {
    let rec = &member.instance.record;
    if rec.sidecar_id == inner.config.sidecar_id {
        return deliver_local(inner, &rec.instance_id, body, Some(remaining), headers, shape).await;
    }
    let mut sender = match inner.pool.get(&rec.sidecar_address).await {
        Ok(s) => s,
        Err(e) => return Attempt::NotDelivered(e.to_string()),
    };
    let path = match shape {
        Shape::Unary => PATH_DELIVER,
        Shape::Stream => PATH_DELIVER_STREAM,
    };
    let uri = match uri(&rec.sidecar_address, path) {
        Ok(u) => u,
        Err(e) => return Attempt::NotDelivered(e),
    };
    let mut req = grpc::grpc_request(uri, body);
    copy_forwardable(headers, req.headers_mut());
    set_timeout(req.headers_mut(), remaining);
    let h = req.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&rec.instance_id) {
        h.insert(grpc::HEADER_INSTANCE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&inner.config.tenant) {
        h.insert(HEADER_TENANT, v);
    }
    match sender.send_request(req).await {
        Ok(resp) if resp.headers().contains_key(grpc::HEADER_NOT_DELIVERED) => {
            let why = Status::from_header_map(resp.headers())
                .map(|s| s.message().to_string())
                .unwrap_or_else(|| "refused by the remote sidecar".into());
            Attempt::NotDelivered(why)
        }
        Ok(resp) => Attempt::Answered(resp.map(Body::Incoming), None),
        // Canceled: the connection closed before the request was written.
        Err(e) if e.is_canceled() => Attempt::NotDelivered(format!("sidecar {}: {e}", rec.sidecar_address)),
        Err(e) => Attempt::Failed(
            SidecarError::InstanceUnreachable {
                instance: rec.instance_id.clone(),
                cause: format!("connection to sidecar {} failed mid-call: {e}", rec.sidecar_address),
            }
            .into_status(),
        ),
    }
}

/// The caller's answer, or the failure it carries.
enum Finished {
    Done(Response<Body>),
    /// The agent (or the target's sidecar) answered with an error status.
    Failed {
        status: Status,
        resp: Response<Body>,
    },
}

/// Turns the target side's answer into the caller's answer: status-only answers and
/// streams pass through; a unary reply gets the serving instance appended.
#[allow(clippy::too_many_arguments)]
async fn finish(
    inner: &Inner,
    (resp, inbound): (Response<Body>, Option<crate::inbound::InboundGuard>),
    member: &Member,
    guard: CallGuard,
    attempts: u32,
    tried: &[String],
    call: &Call,
    fallback_from: Option<&Target>,
) -> Finished {
    let (mut parts, body) = resp.into_parts();
    let rec = &member.instance.record;
    let h = &mut parts.headers;
    // The body is rebuilt (or re-framed), so the upstream length does not hold.
    h.remove(http::header::CONTENT_LENGTH);
    if let Ok(v) = HeaderValue::from_str(&rec.instance_id) {
        h.insert(grpc::HEADER_INSTANCE, v);
    }
    h.insert(HEADER_ATTEMPTS, HeaderValue::from(attempts));
    if let Ok(v) = HeaderValue::from_str(&tried.join(",")) {
        h.insert(HEADER_TRIED, v);
    }
    if let Some(from) = fallback_from
        && let Ok(v) = HeaderValue::from_str(&from.to_string())
    {
        h.insert(HEADER_FALLBACK_FROM, v);
    }
    if let Some(load) = crate::inbound::parse_load(&parts.headers) {
        member.stats.report_load(load, clock());
    }
    if let Some(status) = Status::from_header_map(&parts.headers).filter(|s| s.code() != Code::Ok) {
        // Trailers-only: an error from the agent or the target's sidecar.
        return Finished::Failed { status, resp: Response::from_parts(parts, Body::Empty) };
    }
    if call.shape == Shape::Stream {
        let body = body.tap(inbound, Some((guard, member.stats.clone())));
        return Finished::Done(Response::from_parts(parts, body));
    }
    let limit = inner.config.max_payload_bytes + ENVELOPE_ALLOWANCE;
    let collected = match Limited::new(body, limit).collect().await {
        Ok(c) => c,
        Err(e) => {
            let status = SidecarError::InstanceUnreachable {
                instance: rec.instance_id.clone(),
                cause: format!("reading its reply failed: {e}"),
            }
            .into_status();
            return Finished::Failed { resp: grpc::status_response(status.clone()), status };
        }
    };
    drop((guard, inbound));
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    if let Some(load) = trailers.as_ref().and_then(crate::inbound::parse_load) {
        member.stats.report_load(load, clock());
    }
    let status = trailers.as_ref().and_then(Status::from_header_map);
    if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
        let resp = Response::from_parts(parts, Body::Frames(Frames::raw(data).with_trailers(trailers)));
        return Finished::Failed { status, resp };
    }
    let Some(message) = grpc::single_message(&data) else {
        let status = reason::status(
            Reason::Internal,
            format!("the reply of {} is not a single uncompressed message", rec.instance_id),
            &[],
        );
        return Finished::Failed { resp: grpc::status_response(status.clone()), status };
    };
    let reg = &rec.registration;
    let extension = proto::InvokeReply {
        instance_id: rec.instance_id.clone(),
        agent: reg.agent.clone(),
        agent_version: reg.version.clone(),
        attempts,
        fallback_from: fallback_from.map(Target::to_string).unwrap_or_default(),
        ..Default::default()
    }
    .encode_to_vec();
    Finished::Done(Response::from_parts(
        parts,
        Body::Frames(Frames::message(message, &extension).with_trailers(trailers)),
    ))
}

/// Serves `Mesh/Deliver` and `Mesh/DeliverStream`: delivers to the local instance named by
/// the `ar-instance` header, passing the body through undecoded.
pub async fn deliver(inner: Arc<Inner>, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    let _call = inner.calls.begin();
    let (parts, body) = req.into_parts();
    let Some(instance_id) = parts.headers.get(grpc::HEADER_INSTANCE).and_then(|v| v.to_str().ok()) else {
        return grpc::status_response(
            SidecarError::from(FieldError::new("ar-instance", "header naming the instance is required")).into_status(),
        );
    };
    // A sidecar serves one tenant; a call from another tenant's sidecar is refused without
    // saying whether the instance exists.
    let tenant = parts.headers.get(HEADER_TENANT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if tenant != inner.config.tenant {
        return grpc::status_response(reason::status(
            Reason::PermissionDenied,
            format!("this sidecar does not serve tenant {tenant:?}"),
            &[],
        ));
    }
    let timeout = parts.headers.get(grpc::HEADER_GRPC_TIMEOUT).and_then(|v| grpc_timeout::parse(v.as_bytes()));
    let remaining = timeout.map(|t| t.saturating_sub(inner.config.deadline_reserve));
    match deliver_local(&inner, instance_id, Body::Incoming(body), remaining, &parts.headers, shape).await {
        Attempt::Answered(resp, inbound) => {
            let (mut parts, body) = resp.into_parts();
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, body.tap(inbound, None))
        }
        Attempt::NotDelivered(why) => grpc::not_delivered_response(Status::unavailable(why)),
        Attempt::Failed(status) => grpc::status_response(status),
    }
}

/// Hands a call to a local agent instance; the answer's trailers carry the instance's load.
pub(crate) async fn deliver_local(
    inner: &Inner,
    instance_id: &str,
    body: Body,
    remaining: Option<Duration>,
    headers: &HeaderMap,
    shape: Shape,
) -> Attempt {
    let Some(local) = inner.registry.get(instance_id) else {
        return Attempt::NotDelivered(format!(
            "instance {instance_id} is not registered at sidecar {}",
            inner.config.sidecar_id
        ));
    };
    let state = local.effective_state();
    if !state.routable() {
        return Attempt::NotDelivered(format!("instance {instance_id} is {state}"));
    }
    if let Some(r) = remaining
        && r.is_zero()
    {
        return Attempt::Failed(
            SidecarError::DeadlineExceeded { deadline: Duration::ZERO, attempts: 0, tried: Vec::new() }.into_status(),
        );
    }
    let counters = inner.inbound.get(instance_id, local.registration.max_concurrency);
    let guard = counters.begin();
    if local.registration.transport == agent_reach::model::Transport::Http {
        return crate::http_agent::deliver(inner, &local, body, remaining, headers, shape, guard).await;
    }
    let mut sender = match inner.pool.get(&local.authority).await {
        Ok(s) => s,
        Err(e) => return Attempt::NotDelivered(format!("instance {instance_id}: {e}")),
    };
    let path = match shape {
        Shape::Unary => PATH_HANDLE,
        Shape::Stream => PATH_HANDLE_STREAM,
    };
    let uri = match uri(&local.authority, path) {
        Ok(u) => u,
        Err(e) => return Attempt::NotDelivered(e),
    };
    let mut req = grpc::grpc_request(uri, body);
    copy_forwardable(headers, req.headers_mut());
    if let Some(r) = remaining {
        set_timeout(req.headers_mut(), r);
    }
    let sent = sender.send_request(req);
    let result = match remaining {
        Some(r) => match tokio::time::timeout(r, sent).await {
            Ok(r) => r,
            Err(_) => {
                return Attempt::Failed(
                    SidecarError::DeadlineExceeded { deadline: r, attempts: 1, tried: vec![instance_id.to_string()] }
                        .into_status(),
                );
            }
        },
        None => sent.await,
    };
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            if parts.headers.contains_key(grpc::HEADER_GRPC_STATUS) {
                counters.annotate(&mut parts.headers);
            }
            Attempt::Answered(Response::from_parts(parts, Body::Incoming(body)), Some(guard))
        }
        Err(e) if e.is_canceled() => Attempt::NotDelivered(format!("instance {instance_id}: {e}")),
        Err(e) => Attempt::Failed(
            SidecarError::InstanceUnreachable { instance: instance_id.to_string(), cause: e.to_string() }.into_status(),
        ),
    }
}

fn uri(authority: &str, path: &'static str) -> Result<Uri, String> {
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("bad address {authority:?}: {e}"))
}

fn copy_forwardable(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if grpc::forwardable_header(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

fn set_timeout(headers: &mut HeaderMap, remaining: Duration) {
    if let Ok(v) = HeaderValue::from_str(&grpc_timeout::format(remaining)) {
        headers.insert(grpc::HEADER_GRPC_TIMEOUT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invoke_head_reads_the_routing_fields_of_an_invoke_request() {
        let req = proto::InvokeRequest {
            target: Some(agent_reach::model::Target::capability("c").into()),
            payload: Bytes::from_static(b"payload"),
            content_type: "x".into(),
            session_id: "s".into(),
            priority: proto::Priority::Low as i32,
            idempotency_key: "k".into(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            message_id: "m".into(),
            ..Default::default()
        };
        let wire = Bytes::from(req.encode_to_vec());
        let head = InvokeHead::decode(wire.clone()).unwrap();
        assert_eq!(head.target, req.target);
        assert_eq!(head.payload, req.payload);
        assert_eq!((head.session_id.as_str(), head.priority, head.idempotency_key.as_str()), ("s", 3, "k"));
        assert_eq!(head.message_id, "m");
        assert_eq!(InvokeMetadata::decode(wire).unwrap().metadata, req.metadata);
    }

    #[test]
    fn only_unavailable_and_overload_are_retryable() {
        assert!(retryable(&Status::unavailable("x")));
        assert!(retryable(&reason::status(Reason::AgentOverloaded, "busy", &[])));
        assert!(!retryable(&reason::status(Reason::RateLimited, "slow down", &[])));
        assert!(!retryable(&Status::internal("x")));
        assert!(!retryable(&Status::invalid_argument("x")));
    }
}
