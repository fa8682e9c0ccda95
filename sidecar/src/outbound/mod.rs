//! The caller's sidecar: the outbound stack every `Invoke` goes through, as tower layers.
//!
//! ```text
//! Telemetry → RateLimit → Cache → Router ──(per attempt)──▶ Breaker → Send
//! ```
//! - [`crate::telemetry`]: the call's span and metrics;
//! - [`ratelimit`]: token buckets per caller → target and per tenant;
//! - [`cache`]: answers of read-only capabilities;
//! - the router ([`crate::forward`]): picks instances, retries, falls back;
//! - per attempt, the circuit breaker of the chosen instance, then the send itself.
//!
//! Every refusal names its mechanism and the policy behind it, and is counted in
//! [`Rejections`].

pub mod cache;
pub mod ratelimit;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::model::{Priority, Target, TargetKind};
use agent_reach::policy::{PolicyKind, PolicySpec};
use agent_reach::proto;
use agent_reach_routing::RoutingTable;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use crate::Inner;
use crate::error::SidecarError;
use crate::grpc::{Body, StoredResponse};

/// The fields of an `InvokeRequest` the caller's sidecar needs. Same field numbers as
/// `InvokeRequest`; metadata is skipped unread (decoded only when a policy needs it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct InvokeHead {
    #[prost(message, optional, tag = "1")]
    pub target: Option<proto::Target>,
    #[prost(bytes = "bytes", tag = "2")]
    pub payload: Bytes,
    #[prost(string, tag = "3")]
    pub content_type: String,
    #[prost(string, tag = "4")]
    pub session_id: String,
    #[prost(int32, tag = "5")]
    pub priority: i32,
    #[prost(string, tag = "6")]
    pub idempotency_key: String,
    #[prost(string, tag = "8")]
    pub message_id: String,
    #[prost(message, optional, tag = "9")]
    pub caller: Option<proto::Caller>,
}

/// The metadata of an `InvokeRequest`, decoded only when a policy needs it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InvokeMetadata {
    #[prost(map = "string, string", tag = "7")]
    pub metadata: std::collections::HashMap<String, String>,
}

/// Unary or server-streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Unary,
    Stream,
}

/// A call read from the caller, on its way through the outbound stack.
pub struct OutboundCall {
    /// The caller's `InvokeRequest`, forwarded as is.
    pub message: Bytes,
    pub head: InvokeHead,
    pub target: Target,
    pub priority: Priority,
    pub headers: Arc<HeaderMap>,
    pub shape: Shape,
    pub started: Instant,
    pub timeout: Duration,
    pub deadline: Instant,
    /// The routing table the call is routed with (one table for the whole call).
    pub table: Arc<RoutingTable>,
    /// The caller's-sidecar span of the call (set by the telemetry layer).
    pub trace: opentelemetry::Context,
}

impl OutboundCall {
    /// The policy of the group the target names.
    pub fn spec(&self) -> Option<&PolicySpec> {
        policy_of(&self.table, &self.target)
    }

    /// The calling agent, as the caller said ("" when it did not).
    pub fn caller_agent(&self) -> &str {
        self.head.caller.as_ref().map(|c| c.agent.as_str()).unwrap_or_default()
    }
}

/// The policy of the group a target names.
pub fn policy_of<'t>(table: &'t RoutingTable, target: &Target) -> Option<&'t PolicySpec> {
    let (kind, name) = match &target.kind {
        TargetKind::Capability(c) => (PolicyKind::Capability, c),
        TargetKind::Agent(a) => (PolicyKind::Agent, a),
    };
    table.policy(kind, name).map(|p| &p.spec)
}

/// "capability/x" or "agent/y": how errors name the policy behind them.
pub fn policy_name(target: &Target) -> String {
    match &target.kind {
        TargetKind::Capability(c) => format!("capability/{c}"),
        TargetKind::Agent(a) => format!("agent/{a}"),
    }
}

/// Refusals and shortcuts by mechanism, for metrics.
#[derive(Debug, Default)]
pub struct Rejections {
    pub rate_limited: AtomicU64,
    pub breaker_open: AtomicU64,
    pub overloaded: AtomicU64,
    pub idempotency_replays: AtomicU64,
    pub idempotency_refused: AtomicU64,
    pub cache_hits: AtomicU64,
    pub retries: AtomicU64,
    pub retry_budget_exhausted: AtomicU64,
    pub fallbacks: AtomicU64,
}

impl Rejections {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// What the outbound stack answers.
pub type Outcome = Result<Response<Body>, SidecarError>;

/// Service: token buckets.
#[derive(Clone)]
pub struct RateLimited<S> {
    inner: Arc<Inner>,
    service: S,
}

impl<S> RateLimited<S> {
    pub fn new(inner: Arc<Inner>, service: S) -> RateLimited<S> {
        RateLimited { inner, service }
    }
}

impl<S> Service<OutboundCall> for RateLimited<S>
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Outcome>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let tenant = call.table.tenant_policy().and_then(|p| p.spec.rate_limit).map(|limit| {
            let sidecars = call
                .table
                .instances
                .values()
                .map(|m| m.instance.record.sidecar_id.as_str())
                .collect::<std::collections::HashSet<_>>()
                .len()
                .max(1);
            (limit, sidecars as u32)
        });
        let target = call.target.to_string();
        let policy = policy_name(&call.target);
        let pair = call
            .spec()
            .and_then(|s| s.rate_limit)
            .map(|limit| (limit, call.caller_agent(), target.as_str(), policy.as_str()));
        if (tenant.is_some() || pair.is_some())
            && let Err(limited) = self.inner.rate_limits.check(Instant::now(), tenant, pair)
        {
            Rejections::count(&self.inner.rejections.rate_limited);
            return Box::pin(std::future::ready(Err(SidecarError::RateLimited {
                bucket: limited.bucket,
                policy: limited.policy,
                retry_after: limited.retry_after,
            })));
        }
        let service = self.service.clone();
        Box::pin(service.oneshot(call))
    }
}

/// Service: the result cache of read-only capabilities.
#[derive(Clone)]
pub struct Cached<S> {
    inner: Arc<Inner>,
    service: S,
}

impl<S> Cached<S> {
    pub fn new(inner: Arc<Inner>, service: S) -> Cached<S> {
        Cached { inner, service }
    }
}

/// The cache key: target (with tags), content type and payload.
fn cache_key(call: &OutboundCall) -> u64 {
    let mut bytes = Vec::with_capacity(call.head.payload.len() + 64);
    bytes.extend_from_slice(call.target.to_string().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(call.head.content_type.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&call.head.payload);
    agent_reach_routing::ring::hash64(&bytes)
}

impl<S> Service<OutboundCall> for Cached<S>
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Outcome>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let ttl = match call.spec() {
            Some(s) if s.read_only && s.cache_ttl_ms > 0 && call.shape == Shape::Unary => {
                Duration::from_millis(u64::from(s.cache_ttl_ms))
            }
            _ => return Box::pin(self.service.clone().oneshot(call)),
        };
        let key = cache_key(&call);
        if let Some(hit) = self.inner.cache.get(key, Instant::now()) {
            Rejections::count(&self.inner.rejections.cache_hits);
            let mut resp = hit.to_response();
            resp.headers_mut().insert("ar-cache", HeaderValue::from_static("hit"));
            return Box::pin(std::future::ready(Ok(resp)));
        }
        let (inner, service) = (self.inner.clone(), self.service.clone());
        let limit = inner.config.max_payload_bytes + crate::forward::ENVELOPE_ALLOWANCE;
        Box::pin(async move {
            let resp = service.oneshot(call).await?;
            let stored = StoredResponse::collect(resp, limit).await.map_err(SidecarError::Internal)?;
            if stored.status_code() == Some(tonic::Code::Ok) {
                inner.cache.put(key, stored.clone(), ttl, Instant::now());
            }
            Ok(stored.to_response())
        })
    }
}
