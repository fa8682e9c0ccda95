//! The innermost outbound service: resolves the target, picks an instance with the
//! target's strategy, and sends the caller's bytes (plus a few appended fields) one attempt
//! at a time through the attempt stack ([`super::attempt`]), trying again as
//! [`super::retry`] decides. When no instance can take the call, the target's policy may
//! name a fallback capability or agent; the reply then says so. Deadlines shrink by the
//! configured reserve at each hop. Payloads are never decoded or copied (beyond coalescing
//! small messages).

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::model::{Target, TargetKind};
use agent_reach::policy::{CircuitBreaker, Fallback, RetryPolicy, Strategy};
use agent_reach_routing::{self as route, CallGuard, Group, GroupState, Member, PickRequest, RouteError, clock};
use agent_reach_telemetry::{Tracing, semconv};
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanKind, TraceContextExt};
use prometheus_client::metrics::histogram::Histogram;
use prost::Message;
use tokio::time::Instant;
use tonic::{Code, Status};
use tower::Service;

use super::attempt::AttemptService;
use super::owners::Owners;
use super::reply::{Finished, Served, deadline_exceeded, finish, with_attempts};
use super::retry::{self, Ended, MAX_ATTEMPTS, Rules};
use crate::call::{
    Attempt, AttemptRequest, BoxedAttempt, InvokeMetadata, OutboundCall, PayloadDigest, payload_digest, policy_of,
};
use crate::call::{BoxFuture, boxed};
use crate::error::SidecarError;
use crate::grpc::{self, Body, Field, Frames, header};
use crate::telemetry::{HopLabels, Rejections, Routed, SidecarMetrics, delivery_outcome, outcome_of};

const HOP_OUTBOUND: HopLabels = HopLabels { hop: "outbound" };

/// The innermost outbound service: routes, retries and falls back. Cloned per call (its
/// future owns it): its state is shared.
#[derive(Clone)]
pub(crate) struct Router(Arc<RouterState>);

pub(crate) struct RouterState {
    tenant: Arc<str>,
    /// Taken off the caller's remaining time at this hop.
    deadline_reserve: Duration,
    /// The largest reply read whole.
    limit: usize,
    tracing: Tracing,
    /// The outbound hop's latency histogram, looked up once (not per attempt).
    hop_outbound: Histogram,
    rejections: Arc<Rejections>,
    attempts: AttemptService,
    /// The owners of the keys of keyed calls sent through here ([`super::owners`]).
    owners: Arc<Owners>,
}

/// What the router needs besides the attempt stack.
pub(crate) struct RouterParts {
    pub tenant: Arc<str>,
    pub deadline_reserve: Duration,
    pub limit: usize,
    pub tracing: Tracing,
    pub metrics: Arc<SidecarMetrics>,
    pub rejections: Arc<Rejections>,
    pub owners: Arc<Owners>,
}

impl Router {
    pub(crate) fn new(p: RouterParts, attempts: AttemptService) -> Router {
        let RouterParts { tenant, deadline_reserve, limit, tracing, metrics, rejections, owners } = p;
        let hop_outbound = metrics.hop_duration.get_or_create(&HOP_OUTBOUND).clone();
        Router(Arc::new(RouterState {
            tenant,
            deadline_reserve,
            limit,
            tracing,
            hop_outbound,
            rejections,
            attempts,
            owners,
        }))
    }
}

impl std::ops::Deref for Router {
    type Target = RouterState;

    fn deref(&self) -> &RouterState {
        &self.0
    }
}

impl Service<OutboundCall> for Router {
    type Response = Routed;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Routed, SidecarError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let router = self.clone();
        boxed!(async move { router.route(call).await })
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

/// Routing a call to one target, worked out once before the first attempt.
struct Plan<'c> {
    target: &'c Target,
    /// The target's group in the call's table, looked up once for every attempt.
    group: &'c Group,
    fallback_from: Option<&'c Target>,
    retry: RetryPolicy,
    rules: Rules,
    breaker: CircuitBreaker,
    /// The call's idempotency key ("" when none).
    key: &'c str,
    /// With a key: what the call asks, so a duplicate asking something else is refused.
    digest: Option<PayloadDigest>,
    hash_key: Option<&'c str>,
    version: Option<&'c str>,
    /// The capability routed by ("" when by agent name).
    capability: &'c str,
    /// The strategy of the target's group.
    strategy: &'static str,
    /// Filled in when the caller left the message id empty.
    message_id: Option<MessageId>,
    /// When the call was planned ([`clock`]): counted in the retry budget then, and the
    /// time its first instance is picked at.
    planned_at: u64,
}

/// A random message id: 32 lowercase hex digits (as `format!("{:032x}")` of a random
/// `u128` wrote them), kept on the stack.
struct MessageId([u8; 32]);

impl MessageId {
    fn random() -> MessageId {
        let mut n = rand::random::<u128>();
        let mut digits = [0u8; 32];
        for d in digits.iter_mut().rev() {
            *d = b"0123456789abcdef"[(n & 0xf) as usize];
            n >>= 4;
        }
        MessageId(digits)
    }

    /// Its digits, as the message's string field takes them (ASCII hex: checking them as
    /// UTF-8 again cost 160 instructions per call).
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The attempts so far on one target.
#[derive(Default)]
struct Tries {
    attempt: u32,
    tried: Vec<String>,
    last_failure: String,
    /// A failed answer that stands if no other instance does better.
    last_answer: Option<Routed>,
    /// Why the last instance refused the call.
    last_refusal: Option<Status>,
}

/// What the retry loop does after an attempt.
// Moved once per attempt; boxing the answer would allocate per call.
#[allow(clippy::large_enum_variant)]
enum Step {
    Answer(Routed),
    Retry,
    Stop,
}

/// The fields of the call's metadata the target's policy routes on, decoded only then.
fn metadata_for(call: &OutboundCall, target: &Target) -> HashMap<String, String> {
    let needs = policy_of(&call.table, target).is_some_and(|s| {
        (s.strategy == Some(Strategy::ConsistentHash) && !s.hash_key.is_empty())
            || s.split.as_ref().is_some_and(|v| !v.match_key.is_empty())
    });
    if needs { InvokeMetadata::decode(call.message.clone()).unwrap_or_default().metadata } else { HashMap::new() }
}

impl<'c> Plan<'c> {
    fn new(
        call: &'c OutboundCall,
        target: &'c Target,
        fallback_from: Option<&'c Target>,
        metadata: &'c HashMap<String, String>,
    ) -> Result<Plan<'c>, SidecarError> {
        let group = route::resolve(&call.table, target)?;
        let spec = policy_of(&call.table, target);
        let retry = spec.and_then(|s| s.retry).unwrap_or_default();
        let key = call.head.idempotency_key.as_str();
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
        let planned_at = clock();
        group.state.retry_budget.record_call(planned_at);
        let capability = match &target.kind {
            TargetKind::Capability(c) => c.as_str(),
            TargetKind::Agent(_) => "",
        };
        Ok(Plan {
            target,
            group,
            fallback_from,
            rules: Rules::new(&retry, key, call.head.payload.len()),
            retry,
            breaker: route::breaker_settings(group),
            key,
            hash_key,
            version,
            digest: (!key.is_empty()).then(|| payload_digest(capability, &call.head.content_type, &call.head.payload)),
            capability,
            strategy: group.strategy().as_str(),
            message_id: call.head.message_id.is_empty().then(MessageId::random),
            planned_at,
        })
    }
}

impl Tries {
    /// No instance is left to try: the last answer stands, or the last overload (with when
    /// to come back), or no instance could take the call (so a fallback may).
    fn give_up(mut self, target: &Target, attempts: u32, why: String) -> Result<Routed, Exhausted> {
        if let Some(answer) = self.last_answer.take() {
            return Ok(answer);
        }
        if let Some(status) = self.last_refusal.take().filter(|s| s.code() == Code::ResourceExhausted) {
            return Ok(Routed::unrouted(with_attempts(grpc::status_response(status), attempts, &self.tried)));
        }
        Err(Exhausted {
            error: SidecarError::NoHealthyInstance { target: target.to_string(), why, tried: self.tried.clone() },
            attempts,
            tried: self.tried,
        })
    }
}

impl Router {
    async fn route(&self, call: OutboundCall) -> Result<Routed, SidecarError> {
        let primary = call.target.clone();
        let (error, attempts, tried) = match self.route_and_send(&call, &primary, None).await {
            Ok(resp) => return Ok(resp),
            Err(Exhausted { error, attempts, tried }) => (error, attempts, tried),
        };
        // The policy's fallback takes calls no instance of the target could take (not a
        // call pinned to one instance).
        let Some(fallback) = call.spec().and_then(|s| s.fallback.clone()).filter(|_| call.pin.is_none()) else {
            return Err(error);
        };
        let fallback_target = Target {
            kind: match fallback {
                Fallback::Capability(c) => TargetKind::Capability(c),
                Fallback::Agent(a) => TargetKind::Agent(a),
            },
            tags: Vec::new(),
        };
        tracing::debug!(target = %primary, fallback = %fallback_target, "using the fallback: {error}");
        Rejections::count(&self.rejections.fallbacks);
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

    /// Routes the call to `target` and sends it, retrying as [`retry::again`] decides.
    /// `Err` only when no instance could take it (so a fallback may); errors from agents
    /// come back as `Ok` responses carrying the agent's status.
    async fn route_and_send(
        &self,
        call: &OutboundCall,
        target: &Target,
        fallback_from: Option<&Target>,
    ) -> Result<Routed, Exhausted> {
        let metadata = metadata_for(call, target);
        let plan = Plan::new(call, target, fallback_from, &metadata)?;
        // A duplicate goes to the instance whose call of the key ran, while it can take it.
        let owner = (!plan.key.is_empty()).then(|| self.owners.owner(&target.to_string(), plan.key)).flatten();
        let mut tries = Tries::default();
        while tries.attempt < MAX_ATTEMPTS {
            tries.attempt += 1;
            let request = PickRequest {
                target,
                priority: call.priority,
                hash_key: plan.hash_key,
                exclude: &tries.tried,
                version: plan.version,
                // The first pick follows the plan at once: its clock reading serves.
                now: if tries.attempt == 1 { plan.planned_at } else { clock() },
                prefer: owner.as_deref(),
            };
            let picked = match call.pin.as_deref() {
                Some(pin) => super::pin::pick_instance(&call.table, target, pin, &tries.tried, request.now),
                None => route::pick_from(&call.table, plan.group, &request),
            };
            let (member, group) = match picked {
                Ok(p) => p,
                Err(e) if tries.attempt > 1 => {
                    let why = match e {
                        RouteError::NoHealthyInstance { why, .. } => why,
                        RouteError::NotFound { .. } => "the target left the routing table".into(),
                    };
                    let why = format!("{}; no other instance: {why}", tries.last_failure);
                    let attempts = tries.attempt - 1;
                    return tries.give_up(target, attempts, why);
                }
                Err(e) => return Err(SidecarError::from(e).into()),
            };
            let remaining =
                call.deadline.saturating_duration_since(Instant::now()).saturating_sub(self.deadline_reserve);
            if remaining.is_zero() {
                return Ok(Routed::unrouted(deadline_exceeded(call, tries.attempt - 1, tries.tried)));
            }
            match self.try_once(call, &plan, member, &group, remaining, &mut tries).await {
                Step::Answer(answer) => return Ok(answer),
                Step::Retry => continue,
                Step::Stop => break,
            }
        }
        let why = format!("{} (gave up after {} attempts)", tries.last_failure, tries.attempt);
        let attempts = tries.attempt;
        tries.give_up(target, attempts, why)
    }

    /// One attempt on `member`, and what to do after it.
    async fn try_once(
        &self,
        call: &OutboundCall,
        plan: &Plan<'_>,
        member: Member,
        group: &Arc<GroupState>,
        remaining: Duration,
        tries: &mut Tries,
    ) -> Step {
        let attempt = tries.attempt;
        let guard = CallGuard::begin(&member, group);
        let id = member.id();
        // The instance joins the list of those tried only when the call goes on or fails
        // (a retry must not pick it, an error names it); an answer that ends the call
        // names it from `member` (see `Served::tried`), so the usual call copies no id.
        let listed = |tries: &mut Tries| tries.tried.push(id.to_string());
        let (outcome, sent_at, now) = self.send(call, plan, &member, attempt, remaining).await;
        if attempt > 1 {
            Rejections::count(&self.rejections.retries);
        }
        let budget = || self.budget(group, &plan.retry);
        let (resp, hold) = match outcome {
            None => {
                // Cut at the deadline, the attempt never reached the breaker's count: it is a
                // failure there too, or an instance behind a blackholed or half-open link
                // (which answers nothing, not even an error) would never be taken out.
                member.stats.breaker.record(clock(), true, &plan.breaker);
                listed(tries);
                return Step::Answer(Routed::unrouted(deadline_exceeded(
                    call,
                    attempt,
                    std::mem::take(&mut tries.tried),
                )));
            }
            Some(Attempt::NotDelivered(e)) => {
                tracing::debug!(instance = %id, attempt, "not delivered: {e}");
                // Avoid it for a while, until its sidecar's probes or its lease settle it.
                member.stats.mark_overloaded(clock());
                listed(tries);
                tries.last_failure = format!("{id} not delivered: {e}");
                tries.last_refusal = Some(e.into_status());
                return if retry::again(Ended::NotDelivered, attempt, &plan.rules, budget) {
                    Step::Retry
                } else {
                    Step::Stop
                };
            }
            Some(Attempt::Failed(e)) => {
                listed(tries);
                tries.last_failure = format!("{id}: {e}");
                let status = e.into_status();
                let again = retry::again(Ended::Failed(&status), attempt, &plan.rules, budget);
                if again {
                    tries.last_answer = Some(Routed::unrouted(grpc::status_response(status)));
                    return Step::Retry;
                }
                return Step::Answer(Routed::unrouted(with_attempts(
                    grpc::status_response(status),
                    attempt,
                    &tries.tried,
                )));
            }
            Some(Attempt::Answered(resp, hold)) => (resp, hold),
        };
        let served = Served {
            call,
            member: &member,
            attempts: attempt,
            tried: &tries.tried,
            target: plan.target,
            fallback_from: plan.fallback_from,
            strategy: plan.strategy,
        };
        match finish(resp, hold, guard, &served, self.limit, now).await {
            Finished::Done(answer) => {
                member.stats.observe(Duration::from_nanos(now.saturating_sub(sent_at)), now);
                if !plan.key.is_empty()
                    && let Some(owner) =
                        answer.resp.headers().get(header::IDEMPOTENCY_OWNER).and_then(|v| v.to_str().ok())
                {
                    self.owners.learn(&plan.target.to_string(), plan.key, owner);
                }
                Step::Answer(answer)
            }
            Finished::Failed { status, .. }
                if status.code() == Code::Cancelled && Instant::now() + self.deadline_reserve * 2 >= call.deadline =>
            {
                // The agent's server gave up at the deadline it was handed (tonic says
                // CANCELLED "Timeout expired"): to the caller that is its deadline.
                listed(tries);
                Step::Answer(Routed::unrouted(deadline_exceeded(call, attempt, std::mem::take(&mut tries.tried))))
            }
            Finished::Failed { status, answer } => {
                listed(tries);
                member.stats.observe(Duration::from_nanos(now.saturating_sub(sent_at)), now);
                if status.code() == Code::ResourceExhausted {
                    // An overloaded instance is avoided for a while instead of being
                    // treated as broken.
                    member.stats.mark_overloaded(clock());
                }
                tries.last_failure = format!("{id}: {:?} {}", status.code(), status.message());
                if retry::again(Ended::Failed(&status), attempt, &plan.rules, budget) {
                    tries.last_answer = Some(answer);
                    return Step::Retry;
                }
                Step::Answer(answer)
            }
        }
    }

    /// Sends one attempt to `member` through the attempt stack and records its span and
    /// hop time. Returns what it ended with (None: cut a reserve before the caller's
    /// deadline), when it was sent and when it ended ([`clock`] times).
    async fn send(
        &self,
        call: &OutboundCall,
        plan: &Plan<'_>,
        member: &Member,
        attempt: u32,
        remaining: Duration,
    ) -> (Option<Attempt>, u64, u64) {
        let trace = self.attempt_span(call, plan.target, member, attempt);
        let request = self.request(call, plan, member, attempt, remaining, trace.clone());
        let sent_at = clock();
        // Stop waiting a reserve before the caller does, so the answer (or the
        // DEADLINE_EXCEEDED) still reaches it in time.
        let answer_by = call.deadline.checked_sub(self.deadline_reserve).unwrap_or(call.deadline);
        let outcome = tokio::time::timeout_at(answer_by, self.attempt(request)).await;
        let ended = clock();
        let hop = Duration::from_nanos(ended.saturating_sub(sent_at));
        self.hop_outbound.observe(hop.as_secs_f64());
        let outcome = match outcome {
            Ok(Ok(attempt)) => Some(attempt),
            Ok(Err(never)) => match never {},
            Err(_) => None,
        };
        end_attempt_span(&trace, outcome.as_ref());
        (outcome, sent_at, ended)
    }

    /// The attempt as the attempt stack takes it: the caller's message with the fields
    /// of a `HandleRequest` appended.
    fn request(
        &self,
        call: &OutboundCall,
        plan: &Plan<'_>,
        member: &Member,
        attempt: u32,
        remaining: Duration,
        trace: opentelemetry::Context,
    ) -> BoxedAttempt {
        // The `HandleRequest` fields the mesh adds, after the caller's.
        let fields = [
            (8, Field::Str(plan.message_id.as_ref().map_or(&[][..], MessageId::as_bytes))),
            (16, Field::text(member.id())),
            (17, Field::U32(attempt)),
            (18, Field::text(plan.capability)),
            (19, Field::text(&self.tenant)),
        ];
        Box::new(AttemptRequest {
            trace,
            member: member.clone(),
            breaker: plan.breaker,
            body: Body::Frames(Frames::message_fields(call.message.clone(), &fields)),
            remaining,
            headers: call.headers.clone(),
            shape: call.shape,
            priority: call.priority,
            idempotency_key: (!plan.key.is_empty()).then(|| plan.key.to_string()),
            payload_digest: plan.digest,
            session_id: (!call.head.session_id.is_empty()).then(|| call.head.session_id.clone()),
            caller: call.caller.clone(),
            capability: plan.capability.into(),
        })
    }

    /// Sends one attempt through the attempt stack: a clone of its handles (two reference
    /// counts) whose readiness the call uses, as `tower` asks; no `tower::util::Oneshot`
    /// holding the attempt.
    fn attempt(&self, request: BoxedAttempt) -> BoxFuture<Result<Attempt, std::convert::Infallible>> {
        let mut attempts = self.attempts.clone();
        match attempts.poll_ready(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(Ok(())) => attempts.call(request),
            Poll::Ready(Err(never)) => match never {},
            // Neither the breaker nor the dispatch waits today; if one ever does, wait for
            // it with the task's waker.
            Poll::Pending => Box::pin(async move {
                let Ok(ready) = tower::ServiceExt::ready(&mut attempts).await;
                ready.call(request).await
            }),
        }
    }

    /// Opens the client span of one attempt.
    fn attempt_span(
        &self,
        call: &OutboundCall,
        target: &Target,
        member: &Member,
        attempt: u32,
    ) -> opentelemetry::Context {
        let rec = &member.instance.record;
        let span = self.tracing.start_span(
            &call.trace,
            SpanKind::Client,
            false,
            || format!("attempt {target}"),
            || {
                let mut attrs = vec![
                    KeyValue::new("agent_reach.tenant", self.tenant.to_string()),
                    KeyValue::new("agent_reach.target", target.to_string()),
                    KeyValue::new("agent_reach.instance", member.id().to_string()),
                    KeyValue::new("agent_reach.agent", rec.registration.agent.clone()),
                    KeyValue::new("agent_reach.agent_version", rec.registration.version.clone()),
                    KeyValue::new("agent_reach.attempt", i64::from(attempt)),
                    KeyValue::new("agent_reach.priority", call.priority.as_str()),
                    KeyValue::new("agent_reach.sidecar", rec.sidecar_id.clone()),
                ];
                let method = if call.shape == crate::call::Shape::Stream { "DeliverStream" } else { "Deliver" };
                attrs.extend(semconv::grpc("agentreach.v1.Mesh", method));
                attrs.extend(semconv::server(&rec.sidecar_address));
                attrs.extend(semconv::invoke_agent(&rec.registration.agent, member.id()));
                attrs
            },
        );
        call.trace.with_span(span)
    }

    /// Spends from the target's retry budget.
    fn budget(&self, group: &GroupState, retry: &RetryPolicy) -> bool {
        let ok = group.retry_budget.try_retry(clock(), retry.budget_ratio(), retry.budget_min_per_second());
        if !ok {
            Rejections::count(&self.rejections.retry_budget_exhausted);
        }
        ok
    }
}

/// Ends an attempt's span with how the attempt ended (`None`: the deadline passed).
fn end_attempt_span(cx: &opentelemetry::Context, attempt: Option<&Attempt>) {
    let span = cx.span();
    // A span that is not recorded (most, at the default sampling ratio) ignores its status
    // and attributes: none are built for it. Nor is it ended: that would only lock it and
    // read the wall clock (the SDK takes the end time before it looks at the span).
    if !span.is_recording() {
        return;
    }
    let (outcome, error) = match attempt {
        None => ("DEADLINE_EXCEEDED".to_string(), true),
        Some(Attempt::Answered(resp, _)) => match grpc::failed_status(resp.headers()) {
            Some(s) => (outcome_of(&s), true),
            None => ("ANSWERED".to_string(), false),
        },
        Some(Attempt::NotDelivered(e)) => (format!("NOT_DELIVERED: {}", delivery_outcome(e)), true),
        Some(Attempt::Failed(e)) => (delivery_outcome(e), true),
    };
    if error {
        span.set_status(opentelemetry::trace::Status::error(outcome.clone()));
    }
    let code = match attempt {
        None => Code::DeadlineExceeded,
        Some(Attempt::Answered(resp, _)) => grpc::status_code(resp.headers()).unwrap_or(Code::Ok),
        Some(Attempt::NotDelivered(e) | Attempt::Failed(e)) => e.code(),
    };
    span.set_attribute(semconv::grpc_status(code as i32));
    span.set_attribute(KeyValue::new("agent_reach.outcome", outcome));
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::size_of_output;

    #[test]
    fn the_routing_future_stays_small() {
        // Made once per call and boxed, which copies it whole (a debug build's size here;
        // 4,368 bytes when the attempt stack's `Oneshot` and the attempt sat in it).
        let route = size_of_output(|(r, c): (Router, OutboundCall)| async move { r.route(c).await });
        // 3,328 before a whole answer's trailers were kept across the read of its body.
        assert!(route <= 3392, "Router::route's future is {route} bytes");
    }
}
