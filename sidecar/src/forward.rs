//! The call path's handlers and its routing core.
//!
//! [`invoke`] runs in the caller's sidecar: it reads the caller's message, decodes only the
//! routing fields, and sends the call through the outbound stack ([`crate::outbound`]),
//! whose innermost service is the [`Router`]: it picks an instance with the target's
//! strategy and forwards the caller's bytes (plus a few appended fields) to the instance's
//! sidecar over `Mesh`, one attempt at a time through the attempt stack (the instance's
//! circuit breaker, then [`Send`]). [`deliver`] runs in the target's sidecar and sends the
//! call through the inbound stack ([`crate::inbound`]) to the local agent, passing the body
//! through without decoding it.
//!
//! Retries happen in the router, in the caller's sidecar only, so they never multiply
//! across hops:
//! - a call that provably never reached an agent (connection refused, instance gone,
//!   paused or overloaded at its sidecar, breaker open) is retried on a different
//!   instance, the first time always;
//! - a call that may have run is retried (on a different instance) only when the target's
//!   policy marks it idempotent or the call carries an idempotency key, the failure is
//!   UNAVAILABLE or an overload, the payload is under the policy's retry size limit, and
//!   the target's retry budget has room.
//!
//! When no instance can take the call, the target's policy may name a fallback capability
//! or agent; the reply then says so. Deadlines shrink by the configured reserve at each
//! hop. Payloads are never decoded or copied (beyond coalescing small messages).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::convert::{priority_from_i32, target_from_proto};
use agent_reach::grpc_timeout;
use agent_reach::model::{FieldError, Priority, Target, TargetKind};
use agent_reach::policy::{CircuitBreaker, Fallback, RetryPolicy, Strategy};
use agent_reach::proto;
use agent_reach::reason::{self, Reason};
use agent_reach_routing::{self as route, CallGuard, GroupState, Member, PickRequest, RouteError, RoutingTable, clock};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
use prost::Message;
use tokio::time::Instant;
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use crate::Inner;
use crate::error::SidecarError;
use crate::grpc::{self, Body, Frames, ReadError};
use crate::inbound::{InboundCall, InboundService, Permit};
use crate::outbound::{InvokeHead, InvokeMetadata, OutboundCall, Rejections, Shape, policy_of};
use crate::telemetry::CallOutcome;

/// Room for the envelope fields around a payload of the maximum size.
pub const ENVELOPE_ALLOWANCE: usize = 64 * 1024;
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
/// Response metadata: the version of the agent that served the call.
pub const HEADER_AGENT_VERSION: HeaderName = HeaderName::from_static("ar-agent-version");
/// Response metadata: a short digest of the routing decision.
pub const HEADER_ROUTE: HeaderName = HeaderName::from_static("ar-route");
/// `Mesh` request metadata: the caller's tenant, checked by the target's sidecar.
pub const HEADER_TENANT: HeaderName = HeaderName::from_static("ar-tenant");
/// `Mesh` request metadata: the call's priority (admission at the target).
pub const HEADER_PRIORITY: HeaderName = HeaderName::from_static("ar-priority");
/// `Mesh` request metadata: the call's idempotency key (at-most-once at the target).
pub const HEADER_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("ar-idempotency-key");

/// How one forwarding attempt ended.
// Short-lived and moved once per attempt; boxing the large variant would allocate per call.
#[allow(clippy::large_enum_variant)]
pub enum Attempt {
    /// The target's sidecar (or agent) answered; the call may have run. When the agent is
    /// local, the permit holds its admission slot until the answer ends.
    Answered(Response<Body>, Option<Permit>),
    /// The call provably never reached an agent; the status says why.
    NotDelivered(Status),
    /// The call failed after it may have reached an agent.
    Failed(Status),
}

/// The services a handler needs, built once per sidecar.
#[derive(Clone)]
pub struct Stacks {
    pub outbound: tower::util::BoxCloneSyncService<OutboundCall, Response<Body>, SidecarError>,
    pub inbound: InboundService,
}

impl Stacks {
    /// Builds the outbound, attempt and inbound stacks.
    pub fn new(inner: Arc<Inner>) -> Stacks {
        let inbound = crate::inbound::stack(inner.clone());
        let attempts = tower::util::BoxCloneSyncService::new(
            tower::ServiceBuilder::new()
                // Each attempt passes the chosen instance's breaker, which also records
                // how the attempt ended.
                .layer(crate::layer(&inner, Breakered::new))
                .service(Send { inner: inner.clone(), inbound: inbound.clone() }),
        );
        let outbound = tower::util::BoxCloneSyncService::new(
            tower::ServiceBuilder::new()
                // The call's span and metrics see every outcome, refusals included.
                .layer(crate::layer(&inner, crate::telemetry::OutboundTelemetry::new))
                // Rate limits first: a refused call costs nothing further and never
                // reaches a target.
                .layer(crate::layer(&inner, crate::outbound::RateLimited::new))
                // The cache before routing: a hit needs no instance at all.
                .layer(crate::layer(&inner, crate::outbound::Cached::new))
                .service(Router { inner, attempts }),
        );
        Stacks { outbound, inbound }
    }
}

/// Serves `Sidecar/Invoke` and `Sidecar/InvokeStream`.
pub async fn invoke(inner: Arc<Inner>, stacks: Stacks, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    let _call = inner.calls.begin();
    let call = match read_call(&inner, req, shape).await {
        Ok(c) => c,
        Err(e) => return grpc::status_response(e.into_status()),
    };
    match stacks.outbound.oneshot(call).await {
        Ok(resp) => resp,
        Err(e) => grpc::status_response(e.into_status()),
    }
}

/// Reads and checks the caller's message.
async fn read_call(inner: &Inner, req: Request<Incoming>, shape: Shape) -> Result<OutboundCall, SidecarError> {
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
    let timeout = parts
        .headers
        .get(grpc::HEADER_GRPC_TIMEOUT)
        .and_then(|v| grpc_timeout::parse(v.as_bytes()))
        .or_else(|| {
            policy_of(&table, &target).and_then(|s| s.default_timeout_ms).map(|ms| Duration::from_millis(u64::from(ms)))
        })
        .unwrap_or(cfg.default_timeout);
    Ok(OutboundCall {
        message,
        head,
        target,
        priority,
        headers: Arc::new(parts.headers),
        shape,
        started,
        timeout,
        deadline: started + timeout,
        table,
        trace: opentelemetry::Context::new(),
    })
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + std::marker::Send>>;
type AttemptService = tower::util::BoxCloneSyncService<AttemptRequest, Attempt, Infallible>;

/// The innermost outbound service: routes, retries and falls back.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
    attempts: AttemptService,
}

impl Service<OutboundCall> for Router {
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Response<Body>, SidecarError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let router = self.clone();
        Box::pin(async move { router.route(call).await })
    }
}

impl Router {
    async fn route(&self, call: OutboundCall) -> Result<Response<Body>, SidecarError> {
        let primary = call.target.clone();
        match self.route_and_send(&call, &primary, None).await {
            Ok(resp) => Ok(resp),
            Err(Exhausted { error, attempts, tried }) => {
                // The policy's fallback takes calls no instance of the target could take.
                let Some(fallback) = call.spec().and_then(|s| s.fallback.clone()) else { return Err(error) };
                let fallback_target = Target {
                    kind: match fallback {
                        Fallback::Capability(c) => TargetKind::Capability(c),
                        Fallback::Agent(a) => TargetKind::Agent(a),
                    },
                    tags: Vec::new(),
                };
                tracing::debug!(target = %primary, fallback = %fallback_target, "using the fallback: {error}");
                Rejections::count(&self.inner.rejections.fallbacks);
                self.route_and_send(&call, &fallback_target, Some(&primary)).await.map_err(|e| match e.error {
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
        }
    }

    /// Routes the call to `target` and sends it, retrying as the module documentation
    /// says. `Err` only when no instance could take it (so a fallback may); errors from
    /// agents come back as `Ok` responses carrying the agent's status.
    async fn route_and_send(
        &self,
        call: &OutboundCall,
        target: &Target,
        fallback_from: Option<&Target>,
    ) -> Result<Response<Body>, Exhausted> {
        let inner = &self.inner;
        let cfg = &inner.config;
        let table: &RoutingTable = &call.table;
        let group = route::resolve(table, target).map_err(SidecarError::from)?;
        let spec = policy_of(table, target);
        let retry = spec.and_then(|s| s.retry).unwrap_or_default();
        let breaker = route::breaker_settings(group);
        let key = call.head.idempotency_key.as_str();
        let may_rerun = retry.idempotent || !key.is_empty();
        let retry_payload_ok = call.head.payload.len() <= retry.max_payload_bytes() as usize;
        let needs_metadata = spec.is_some_and(|s| {
            (s.strategy == Some(Strategy::ConsistentHash) && !s.hash_key.is_empty())
                || s.split.as_ref().is_some_and(|v| !v.match_key.is_empty())
        });
        let metadata = if needs_metadata {
            InvokeMetadata::decode(call.message.clone()).unwrap_or_default().metadata
        } else {
            Default::default()
        };
        let session = (!call.head.session_id.is_empty()).then_some(call.head.session_id.as_str());
        let hash_key: Option<&str> = match spec {
            // Duplicates of an idempotency key meet at one instance (and its sidecar's store).
            _ if !key.is_empty() => Some(key),
            Some(s) if s.strategy == Some(Strategy::ConsistentHash) && !s.hash_key.is_empty() => {
                metadata.get(&s.hash_key).map(String::as_str)
            }
            _ => session,
        };
        let version = spec.and_then(|s| s.split.as_ref()).and_then(|split| {
            let matched =
                (!split.match_key.is_empty()).then(|| metadata.get(&split.match_key).map(String::as_str)).flatten();
            route::choose_version(split, session, matched)
        });
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
        let mut last_refusal: Option<Status> = None;
        let mut attempt = 0;
        while attempt < MAX_ATTEMPTS {
            attempt += 1;
            let request = PickRequest {
                target,
                priority: call.priority,
                hash_key: if key.is_empty() { hash_key } else { Some(key) },
                exclude: &tried,
                version,
                now: clock(),
            };
            let (member, group_state) = match route::pick(table, &request) {
                Ok(p) => p,
                Err(e) if attempt > 1 => {
                    // Nothing left to try: the last answer stands, or say why nothing worked.
                    if let Some(resp) = last_answer {
                        return Ok(resp);
                    }
                    if let Some(status) = last_refusal.filter(|s| s.code() == Code::ResourceExhausted) {
                        return Ok(with_attempts(grpc::status_response(status), attempt - 1, &tried));
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
            let remaining =
                call.deadline.saturating_duration_since(Instant::now()).saturating_sub(cfg.deadline_reserve);
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
            let rec = &member.instance.record;
            let tracer = inner.tracing.tracer();
            let span = tracer
                .span_builder(format!("attempt {target}"))
                .with_kind(SpanKind::Client)
                .with_attributes([
                    KeyValue::new("agent_reach.tenant", cfg.tenant.clone()),
                    KeyValue::new("agent_reach.target", target.to_string()),
                    KeyValue::new("agent_reach.instance", id.clone()),
                    KeyValue::new("agent_reach.agent", rec.registration.agent.clone()),
                    KeyValue::new("agent_reach.agent_version", rec.registration.version.clone()),
                    KeyValue::new("agent_reach.attempt", i64::from(attempt)),
                    KeyValue::new("agent_reach.priority", call.priority.as_str()),
                    KeyValue::new("agent_reach.sidecar", rec.sidecar_id.clone()),
                ])
                .start_with_context(tracer, &call.trace);
            let attempt_cx = call.trace.with_span(span);
            let request = AttemptRequest {
                trace: attempt_cx.clone(),
                member: member.clone(),
                breaker,
                body: Body::Frames(Frames::message(call.message.clone(), &extension)),
                remaining,
                headers: call.headers.clone(),
                shape: call.shape,
                priority: call.priority,
                idempotency_key: (!key.is_empty()).then(|| key.to_string()),
            };
            let sent_at = clock();
            // Stop waiting a reserve before the caller does, so the answer (or the
            // DEADLINE_EXCEEDED) still reaches it in time.
            let answer_by = call.deadline.checked_sub(cfg.deadline_reserve).unwrap_or(call.deadline);
            let outcome = tokio::time::timeout_at(answer_by, self.attempts.clone().oneshot(request)).await;
            let hop = Duration::from_nanos(clock().saturating_sub(sent_at));
            inner.metrics.hop_duration.get_or_create(&HOP_OUTBOUND).observe(hop.as_secs_f64());
            end_attempt_span(&attempt_cx, &outcome);
            tried.push(id.clone());
            if attempt > 1 {
                Rejections::count(&inner.rejections.retries);
            }
            let answer = match outcome {
                Err(_) => return Ok(deadline_exceeded(call, attempt, tried)),
                Ok(Err(never)) => match never {},
                Ok(Ok(Attempt::NotDelivered(status))) => {
                    tracing::debug!(instance = %id, attempt, "not delivered: {}", status.message());
                    // Avoid it for a while, until its sidecar's probes or its lease settle it.
                    member.stats.mark_overloaded(clock());
                    last_failure = format!("{id} not delivered: {}", status.message());
                    last_refusal = Some(status);
                    // The first such retry is always allowed; later ones spend budget.
                    if attempt < MAX_ATTEMPTS && (attempt == 1 || self.budget(&group_state, &retry)) {
                        continue;
                    }
                    break;
                }
                Ok(Ok(Attempt::Failed(status))) => {
                    last_failure = format!("{id}: {}", status.message());
                    if attempt < MAX_ATTEMPTS
                        && may_rerun
                        && retry_payload_ok
                        && retryable(&status)
                        && self.budget(&group_state, &retry)
                    {
                        last_answer = Some(grpc::status_response(status));
                        continue;
                    }
                    return Ok(with_attempts(grpc::status_response(status), attempt, &tried));
                }
                Ok(Ok(Attempt::Answered(resp, permit))) => (resp, permit),
            };
            let now = clock();
            match finish(inner, answer, &member, guard, attempt, &tried, call, fallback_from).await {
                Finished::Done(resp) => {
                    member.stats.observe(Duration::from_nanos(now.saturating_sub(sent_at)), now);
                    return Ok(resp);
                }
                Finished::Failed { status, .. }
                    if status.code() == Code::Cancelled
                        && Instant::now() + cfg.deadline_reserve * 2 >= call.deadline =>
                {
                    // The agent's server gave up at the deadline it was handed (tonic says
                    // CANCELLED "Timeout expired"): to the caller that is its deadline.
                    return Ok(deadline_exceeded(call, attempt, tried));
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
                        && self.budget(&group_state, &retry)
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
        if let Some(status) = last_refusal.filter(|s| s.code() == Code::ResourceExhausted) {
            // Every instance tried was overloaded: say so, with when to come back.
            return Ok(with_attempts(grpc::status_response(status), attempt, &tried));
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

    fn budget(&self, group: &GroupState, retry: &RetryPolicy) -> bool {
        let ok = group.retry_budget.try_retry(clock(), retry.budget_ratio(), retry.budget_min_per_second());
        if !ok {
            Rejections::count(&self.inner.rejections.retry_budget_exhausted);
        }
        ok
    }
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

/// Failures worth another instance, for calls that may run twice.
fn retryable(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        // Overloaded elsewhere is worth a try; a rate limit on this caller is not.
        Code::ResourceExhausted => reason::error_info(status).is_none_or(|i| i.reason != Reason::RateLimited.as_str()),
        _ => false,
    }
}

fn deadline_exceeded(call: &OutboundCall, attempts: u32, tried: Vec<String>) -> Response<Body> {
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

const HOP_OUTBOUND: crate::telemetry::HopLabels = crate::telemetry::HopLabels { hop: "outbound" };

/// Ends an attempt's span with how the attempt ended.
fn end_attempt_span(
    cx: &opentelemetry::Context,
    outcome: &Result<Result<Attempt, Infallible>, tokio::time::error::Elapsed>,
) {
    let span = cx.span();
    let (outcome, error) = match outcome {
        Err(_) => ("DEADLINE_EXCEEDED".to_string(), true),
        Ok(Err(never)) => match *never {},
        Ok(Ok(Attempt::Answered(resp, _))) => match Status::from_header_map(resp.headers()) {
            Some(s) if s.code() != Code::Ok => (crate::telemetry::outcome_of(&s), true),
            _ => ("ANSWERED".to_string(), false),
        },
        Ok(Ok(Attempt::NotDelivered(s))) => (format!("NOT_DELIVERED: {}", crate::telemetry::outcome_of(s)), true),
        Ok(Ok(Attempt::Failed(s))) => (crate::telemetry::outcome_of(s), true),
    };
    if error {
        span.set_status(opentelemetry::trace::Status::error(outcome.clone()));
    }
    span.set_attribute(KeyValue::new("agent_reach.outcome", outcome));
    span.end();
}

/// One attempt, as the attempt stack sees it.
pub struct AttemptRequest {
    /// The attempt's client span.
    pub trace: opentelemetry::Context,
    pub member: Member,
    /// The breaker settings of the group the call was routed by.
    pub breaker: CircuitBreaker,
    pub body: Body,
    pub remaining: Duration,
    pub headers: Arc<HeaderMap>,
    pub shape: Shape,
    pub priority: Priority,
    pub idempotency_key: Option<String>,
}

/// Service: the circuit breaker of the chosen instance.
#[derive(Clone)]
pub struct Breakered<S> {
    inner: Arc<Inner>,
    service: S,
}

impl<S> Breakered<S> {
    pub fn new(inner: Arc<Inner>, service: S) -> Breakered<S> {
        Breakered { inner, service }
    }
}

/// Whether an attempt's outcome counts as a failure for the breaker (overload answers do
/// not: the balancer penalises them instead).
fn breaker_failure(attempt: &Attempt) -> bool {
    let failing = |code: Code| {
        matches!(code, Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown | Code::DataLoss)
    };
    match attempt {
        Attempt::Answered(resp, _) => Status::from_header_map(resp.headers()).is_some_and(|s| failing(s.code())),
        Attempt::NotDelivered(s) | Attempt::Failed(s) => s.code() != Code::ResourceExhausted && failing(s.code()),
    }
}

impl<S> Service<AttemptRequest> for Breakered<S>
where
    S: Service<AttemptRequest, Response = Attempt, Error = Infallible> + Clone + std::marker::Send + 'static,
    S::Future: std::marker::Send,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, req: AttemptRequest) -> Self::Future {
        let stats = req.member.stats.clone();
        let settings = req.breaker;
        if !stats.breaker.acquire(clock(), &settings) {
            Rejections::count(&self.inner.rejections.breaker_open);
            let status = reason::status(
                Reason::CircuitOpen,
                format!("the circuit breaker of {} is open", req.member.id()),
                &[("mechanism", "circuit_breaker".into()), ("instance", req.member.id().to_string())],
            );
            return Box::pin(std::future::ready(Ok(Attempt::NotDelivered(status))));
        }
        let service = self.service.clone();
        Box::pin(async move {
            let attempt = service.oneshot(req).await?;
            stats.breaker.record(clock(), breaker_failure(&attempt), &settings);
            Ok(attempt)
        })
    }
}

/// The end of the attempt stack: sends the attempt to the local agent (through the inbound
/// stack) or to the instance's sidecar.
#[derive(Clone)]
pub struct Send {
    inner: Arc<Inner>,
    inbound: InboundService,
}

impl Service<AttemptRequest> for Send {
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: AttemptRequest) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { Ok(me.send(req).await) })
    }
}

impl Send {
    async fn send(&self, req: AttemptRequest) -> Attempt {
        let inner = &self.inner;
        let rec = &req.member.instance.record;
        if rec.sidecar_id == inner.config.sidecar_id {
            let Some(local) = inner.registry.get(&rec.instance_id) else {
                return Attempt::NotDelivered(Status::unavailable(format!(
                    "instance {} is not registered here any more",
                    rec.instance_id
                )));
            };
            let call = InboundCall {
                local,
                body: req.body,
                remaining: Some(req.remaining),
                headers: req.headers,
                shape: req.shape,
                priority: req.priority,
                idempotency_key: req.idempotency_key,
                tenant: inner.config.tenant.clone(),
                trace: req.trace,
            };
            return match self.inbound.clone().oneshot(call).await {
                Ok(a) => a,
                Err(never) => match never {},
            };
        }
        let conn = match inner.pool.get(&rec.sidecar_address).await {
            Ok(c) => c,
            Err(e) => return Attempt::NotDelivered(Status::unavailable(e.to_string())),
        };
        let path = match req.shape {
            Shape::Unary => PATH_DELIVER,
            Shape::Stream => PATH_DELIVER_STREAM,
        };
        let mut headers = HeaderMap::with_capacity(req.headers.len() + 8);
        copy_forwardable(&req.headers, &mut headers);
        set_timeout(&mut headers, req.remaining);
        agent_reach_telemetry::trace::inject(&req.trace, &mut headers);
        if let Ok(v) = HeaderValue::from_str(&rec.instance_id) {
            headers.insert(grpc::HEADER_INSTANCE, v);
        }
        if let Ok(v) = HeaderValue::from_str(&inner.config.tenant) {
            headers.insert(HEADER_TENANT, v);
        }
        if req.priority != Priority::Normal {
            headers.insert(HEADER_PRIORITY, HeaderValue::from_static(req.priority.as_str()));
        }
        if let Some(k) = &req.idempotency_key
            && let Ok(v) = HeaderValue::from_str(k)
        {
            headers.insert(HEADER_IDEMPOTENCY_KEY, v);
        }
        let data = match req.body {
            Body::Frames(f) => grpc::frames_data(f),
            other => match collect_chunks(other, inner.config.max_payload_bytes + ENVELOPE_ALLOWANCE).await {
                Ok(d) => d,
                Err(e) => return Attempt::Failed(Status::internal(e)),
            },
        };
        match send_h2(conn, path, headers, data).await {
            Ok(resp) if resp.headers().contains_key(grpc::HEADER_NOT_DELIVERED) => {
                let status = Status::from_header_map(resp.headers())
                    .unwrap_or_else(|| Status::unavailable("refused by the remote sidecar"));
                Attempt::NotDelivered(status)
            }
            Ok(resp) => Attempt::Answered(resp, None),
            Err(SendError::NotSent(e)) => {
                Attempt::NotDelivered(Status::unavailable(format!("sidecar {}: {e}", rec.sidecar_address)))
            }
            Err(SendError::Failed(e)) => Attempt::Failed(
                SidecarError::InstanceUnreachable {
                    instance: rec.instance_id.clone(),
                    cause: format!("connection to sidecar {} failed mid-call: {e}", rec.sidecar_address),
                }
                .into_status(),
            ),
        }
    }
}

/// Why an `h2` call failed.
#[derive(Debug)]
enum SendError {
    /// The request never left (no connection, or the peer refused the stream unprocessed).
    NotSent(String),
    /// The request may have been processed.
    Failed(String),
}

/// Sends a gRPC call with a unary request on `conn`: HEADERS and DATA are queued from this
/// task together, so they leave in one write. The answer streams back as [`Body::H2`].
async fn send_h2(
    conn: crate::pool::Conn,
    path: &'static str,
    mut headers: HeaderMap,
    data: Vec<Bytes>,
) -> Result<Response<Body>, SendError> {
    let mut sender = conn.sender.ready().await.map_err(|e| SendError::NotSent(e.to_string()))?;
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(conn.authority);
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(path));
    let uri = Uri::from_parts(parts).map_err(|e| SendError::NotSent(e.to_string()))?;
    headers.insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    headers.insert(grpc::HEADER_TE, grpc::TRAILERS);
    let mut request = Request::new(());
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let (response, mut stream) =
        sender.send_request(request, data.is_empty()).map_err(|e| SendError::NotSent(e.to_string()))?;
    let last = data.len().saturating_sub(1);
    let mut unsent = None;
    for (i, chunk) in data.into_iter().enumerate() {
        if let Err(e) = stream.send_data(chunk, i == last) {
            // The peer may answer before reading the request (a shed call's trailers-only
            // reply, then RST_STREAM(NO_ERROR), RFC 9113 §8.1): its answer still counts.
            unsent = Some(e.to_string());
            break;
        }
    }
    match response.await {
        Ok(resp) => Ok(resp.map(|recv| Body::H2(grpc::H2Body::new(recv)))),
        Err(e) if unsent.is_some() => {
            Err(SendError::Failed(format!("{e} (sending the call: {})", unsent.unwrap_or_default())))
        }
        // REFUSED_STREAM: the peer did not process the stream (RFC 9113 §8.7).
        Err(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => Err(SendError::NotSent(e.to_string())),
        Err(e) => Err(SendError::Failed(e.to_string())),
    }
}

/// The data chunks of a (unary request) body, up to `limit` bytes, without copying.
async fn collect_chunks(mut body: Body, limit: usize) -> Result<Vec<Bytes>, String> {
    use http_body_util::BodyExt;
    let mut out = Vec::with_capacity(2);
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the call: {e}"))?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total > limit {
                return Err(format!("the call is larger than {limit} bytes"));
            }
            if !data.is_empty() {
                out.push(data);
            }
        }
    }
    Ok(out)
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
    (resp, permit): (Response<Body>, Option<Permit>),
    member: &Member,
    guard: CallGuard,
    attempts: u32,
    tried: &[String],
    call: &OutboundCall,
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
    if let Ok(v) = HeaderValue::from_str(&rec.registration.version) {
        h.insert(HEADER_AGENT_VERSION, v);
    }
    let strategy = call
        .table
        .by_capability
        .get(target_name(&call.target))
        .map(|g| g.strategy().as_str())
        .unwrap_or("least_loaded");
    if let Ok(v) =
        HeaderValue::from_str(&format!("{strategy} {} -> {} (attempt {attempts})", call.target, rec.instance_id))
    {
        h.insert(HEADER_ROUTE, v);
    }
    let mut outcome = CallOutcome {
        outcome: "OK".into(),
        instance: rec.instance_id.clone(),
        agent: rec.registration.agent.clone(),
        agent_version: rec.registration.version.clone(),
        attempts,
        strategy,
    };
    if let Some(load) = crate::inbound::parse_load(&parts.headers) {
        member.stats.report_load(load, clock());
    }
    if let Some(status) = Status::from_header_map(&parts.headers).filter(|s| s.code() != Code::Ok) {
        // Trailers-only: an error from the agent or the target's sidecar.
        outcome.outcome = crate::telemetry::outcome_of(&status);
        parts.extensions.insert(outcome);
        return Finished::Failed { status, resp: Response::from_parts(parts, Body::Empty) };
    }
    parts.extensions.insert(outcome.clone());
    if call.shape == Shape::Stream {
        let body = body.tap(permit, Some((guard, member.stats.clone())));
        return Finished::Done(Response::from_parts(parts, body));
    }
    let limit = inner.config.max_payload_bytes + ENVELOPE_ALLOWANCE;
    let collected = match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit)).await {
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
    drop((guard, permit));
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    if let Some(load) = trailers.as_ref().and_then(crate::inbound::parse_load) {
        member.stats.report_load(load, clock());
    }
    let status = trailers.as_ref().and_then(Status::from_header_map);
    if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
        outcome.outcome = crate::telemetry::outcome_of(&status);
        parts.extensions.insert(outcome);
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

/// Serves `Mesh/Deliver` and `Mesh/DeliverStream`: sends the call for the local instance
/// named by the `ar-instance` header through the inbound stack, body undecoded.
pub async fn deliver(inner: Arc<Inner>, stacks: Stacks, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    let _call = inner.calls.begin();
    let (parts, body) = req.into_parts();
    let Some(instance_id) = parts.headers.get(grpc::HEADER_INSTANCE).and_then(|v| v.to_str().ok()) else {
        return grpc::status_response(
            SidecarError::from(FieldError::new("ar-instance", "header naming the instance is required")).into_status(),
        );
    };
    // A sidecar serves one tenant; a call from another tenant's sidecar is refused without
    // saying whether the instance exists.
    let tenant = parts.headers.get(HEADER_TENANT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    if tenant != inner.config.tenant {
        return grpc::status_response(reason::status(
            Reason::PermissionDenied,
            format!("this sidecar does not serve tenant {tenant:?}"),
            &[],
        ));
    }
    let Some(local) = inner.registry.get(instance_id) else {
        return grpc::not_delivered_response(Status::unavailable(format!(
            "instance {instance_id} is not registered at sidecar {}",
            inner.config.sidecar_id
        )));
    };
    let timeout = parts.headers.get(grpc::HEADER_GRPC_TIMEOUT).and_then(|v| grpc_timeout::parse(v.as_bytes()));
    let priority = match parts.headers.get(HEADER_PRIORITY).map(|v| v.as_bytes()) {
        Some(b"HIGH") => Priority::High,
        Some(b"LOW") => Priority::Low,
        _ => Priority::Normal,
    };
    let idempotency_key = parts.headers.get(HEADER_IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok()).map(str::to_string);
    let trace = agent_reach_telemetry::trace::extract(&parts.headers);
    let call = InboundCall {
        local,
        body: Body::Incoming(body),
        remaining: timeout.map(|t| t.saturating_sub(inner.config.deadline_reserve)),
        headers: Arc::new(parts.headers),
        shape,
        priority,
        idempotency_key,
        tenant,
        trace,
    };
    let attempt = match stacks.inbound.oneshot(call).await {
        Ok(a) => a,
        Err(never) => match never {},
    };
    match attempt {
        Attempt::Answered(resp, permit) => {
            let (mut parts, body) = resp.into_parts();
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, body.tap(permit, None))
        }
        Attempt::NotDelivered(status) => grpc::not_delivered_response(status),
        Attempt::Failed(status) => grpc::status_response(status),
    }
}

/// Hands a call to its local agent (the end of the inbound stack).
pub(crate) async fn deliver_to_agent(inner: &Inner, call: InboundCall) -> Attempt {
    let instance_id = call.local.instance_id.as_str();
    let state = call.local.effective_state();
    if !state.routable() {
        return Attempt::NotDelivered(Status::unavailable(format!("instance {instance_id} is {state}")));
    }
    // An operator's hold (PAUSED at control) counts even while the agent reports UP.
    if let Some(m) = inner.table.load().instances.get(instance_id)
        && m.instance.record.state == agent_reach::model::HealthState::Paused
    {
        let state = m.instance.record.state;
        return Attempt::NotDelivered(Status::unavailable(format!("instance {instance_id} is {state} at control")));
    }
    if call.remaining.is_some_and(|r| r.is_zero()) {
        return Attempt::Failed(
            SidecarError::DeadlineExceeded { deadline: Duration::ZERO, attempts: 0, tried: Vec::new() }.into_status(),
        );
    }
    if call.local.registration.transport == agent_reach::model::Transport::Http {
        let mut trace = HeaderMap::new();
        agent_reach_telemetry::trace::inject(&call.trace, &mut trace);
        return crate::http_agent::deliver(&call.local, call.body, call.remaining, &trace, call.shape).await;
    }
    let conn = match inner.pool.get(&call.local.authority).await {
        Ok(c) => c,
        Err(e) => return Attempt::NotDelivered(Status::unavailable(format!("instance {instance_id}: {e}"))),
    };
    let path = match call.shape {
        Shape::Unary => PATH_HANDLE,
        Shape::Stream => PATH_HANDLE_STREAM,
    };
    let mut headers = HeaderMap::with_capacity(call.headers.len() + 4);
    copy_forwardable(&call.headers, &mut headers);
    if let Some(r) = call.remaining {
        set_timeout(&mut headers, r);
    }
    // The agent sees the target sidecar's server span as its parent.
    agent_reach_telemetry::trace::inject(&call.trace, &mut headers);
    // The request is one message: read it whole, so HEADERS and DATA leave together.
    let data = match call.body {
        Body::Frames(f) => grpc::frames_data(f),
        other => match collect_chunks(other, inner.config.max_payload_bytes + ENVELOPE_ALLOWANCE).await {
            Ok(d) => d,
            Err(e) => return Attempt::Failed(Status::internal(e)),
        },
    };
    // No timer here: the caller's sidecar enforces the deadline (its cancellation reaches
    // the agent), and the agent sees the remaining time in grpc-timeout.
    match send_h2(conn, path, headers, data).await {
        Ok(resp) => Attempt::Answered(resp, None),
        Err(SendError::NotSent(e)) => {
            Attempt::NotDelivered(Status::unavailable(format!("instance {instance_id}: {e}")))
        }
        Err(SendError::Failed(e)) => Attempt::Failed(
            SidecarError::InstanceUnreachable { instance: instance_id.to_string(), cause: e }.into_status(),
        ),
    }
}

fn target_name(target: &Target) -> &str {
    match &target.kind {
        TargetKind::Capability(c) | TargetKind::Agent(c) => c,
    }
}

fn copy_forwardable(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if grpc::forwardable_header(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Writes the remaining deadline as `grpc-timeout`, in whole milliseconds (rounded down, so
/// the next hop never believes it has more time than the caller), as a never-indexed
/// header: a value that changes with every call would only churn the HPACK table.
fn set_timeout(headers: &mut HeaderMap, remaining: Duration) {
    let ms = remaining.as_millis().max(1);
    if let Ok(mut v) = HeaderValue::from_str(&format!("{}m", ms.min(99_999_999))) {
        v.set_sensitive(true);
        headers.insert(grpc::HEADER_GRPC_TIMEOUT, v);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

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
            caller: Some(proto::Caller { agent: "a".into(), instance_id: "a-1".into() }),
        };
        let wire = Bytes::from(req.encode_to_vec());
        let head = InvokeHead::decode(wire.clone()).unwrap();
        assert_eq!(head.target, req.target);
        assert_eq!(head.payload, req.payload);
        assert_eq!((head.content_type.as_str(), head.session_id.as_str()), ("x", "s"));
        assert_eq!((head.priority, head.idempotency_key.as_str()), (3, "k"));
        assert_eq!(head.message_id, "m");
        assert_eq!(head.caller, req.caller);
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

    #[test]
    fn overload_is_not_a_breaker_failure() {
        let overloaded = Attempt::NotDelivered(reason::status(Reason::AgentOverloaded, "busy", &[]));
        assert!(!breaker_failure(&overloaded));
        assert!(breaker_failure(&Attempt::NotDelivered(Status::unavailable("refused"))));
        assert!(breaker_failure(&Attempt::Failed(Status::internal("boom"))));
        assert!(!breaker_failure(&Attempt::Failed(Status::invalid_argument("bad"))));
    }
    /// A peer written frame by frame, so that an answer and a reset leave in one write:
    /// it never opens a stream's receive window (no request body can be sent) and ends
    /// each stream as soon as its HEADERS arrive: the first with a trailers-only answer
    /// followed by RST_STREAM(NO_ERROR) (how a shed call ends, RFC 9113 §8.1), the second
    /// with REFUSED_STREAM, the third with INTERNAL_ERROR.
    /// Returns its address, a signal that the client has applied its settings, and the
    /// count of DATA frames it received.
    async fn peer_that_answers_before_reading()
    -> (String, tokio::sync::oneshot::Receiver<()>, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
            let len = (payload.len() as u32).to_be_bytes();
            let mut f = vec![len[1], len[2], len[3], kind, flags];
            f.extend_from_slice(&stream.to_be_bytes());
            f.extend_from_slice(payload);
            f
        }
        fn literal(name: &str, value: &str) -> Vec<u8> {
            // HPACK literal without indexing, new name, no Huffman coding.
            let mut b = vec![0, name.len() as u8];
            b.extend_from_slice(name.as_bytes());
            b.push(value.len() as u8);
            b.extend_from_slice(value.as_bytes());
            b
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (settled_tx, settled) = tokio::sync::oneshot::channel();
        let mut settled_tx = Some(settled_tx);
        let data_frames = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = data_frames.clone();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 24];
            tcp.read_exact(&mut preface).await.unwrap();
            // SETTINGS_INITIAL_WINDOW_SIZE = 0.
            tcp.write_all(&frame(0x4, 0, 0, &[0, 4, 0, 0, 0, 0])).await.unwrap();
            let mut requests = 0;
            loop {
                let mut head = [0u8; 9];
                if tcp.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                let mut payload = vec![0u8; len];
                tcp.read_exact(&mut payload).await.unwrap();
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let out = match head[3] {
                    0x0 => {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    0x4 if head[4] & 1 == 0 => frame(0x4, 1, 0, &[]),
                    0x4 => {
                        // The client acknowledged the zero window.
                        if let Some(tx) = settled_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    0x1 => {
                        requests += 1;
                        match requests {
                            1 => {
                                let mut block = vec![0x88]; // :status 200
                                block.extend(literal("content-type", "application/grpc"));
                                block.extend(literal("grpc-status", "8"));
                                block.extend(literal("grpc-message", "shed"));
                                let mut both = frame(0x1, 0x1 | 0x4, stream, &block);
                                both.extend(frame(0x3, 0, stream, &0u32.to_be_bytes()));
                                both
                            }
                            2 => frame(0x3, 0, stream, &7u32.to_be_bytes()),
                            _ => frame(0x3, 0, stream, &2u32.to_be_bytes()),
                        }
                    }
                    _ => continue,
                };
                tcp.write_all(&out).await.unwrap();
            }
        });
        (addr, settled, data_frames)
    }

    #[tokio::test]
    async fn an_answer_before_the_body_was_sent_counts_and_resets_say_if_the_call_may_have_run() {
        let (addr, settled, data_frames) = peer_that_answers_before_reading().await;
        let pool = crate::pool::Pool::default();
        let body = || vec![Bytes::from(vec![7u8; 1024])];
        let conn = pool.get(&addr).await.unwrap();
        settled.await.unwrap();
        let resp = send_h2(conn.clone(), "/a", HeaderMap::new(), body()).await.expect("the answer is used");
        assert_eq!(resp.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"8"[..]));
        let refused = send_h2(conn.clone(), "/b", HeaderMap::new(), body()).await.err();
        assert!(matches!(refused, Some(SendError::NotSent(_))), "{refused:?}");
        let reset = send_h2(conn, "/c", HeaderMap::new(), body()).await.err();
        assert!(matches!(reset, Some(SendError::Failed(_))), "{reset:?}");
        assert_eq!(data_frames.load(std::sync::atomic::Ordering::Relaxed), 0, "no request body was sent");
    }
}
