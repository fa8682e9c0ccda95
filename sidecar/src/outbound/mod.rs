//! The caller's sidecar: the outbound stack every `Invoke` goes through, as tower layers.
//!
//! ```text
//! Invoke → Telemetry → RateLimit → Cache → Router ──(per attempt)──▶ Breaker → Dispatch
//! ```
//! - [`invoke::InvokeEntry`]: `Sidecar/Invoke` from local agents: reads and checks the
//!   caller's message, decoding only the routing fields;
//! - [`crate::telemetry`]: the call's span and metrics;
//! - [`ratelimit`]: token buckets per caller → target and per tenant;
//! - [`cache`]: answers of read-only capabilities;
//! - [`router`]: resolves the target, picks instances (a keyed call's duplicates the
//!   instance owning the key, [`owners`]), retries ([`retry`]), falls back, and stamps the
//!   route on the answer ([`reply`]);
//! - per attempt ([`attempt`]), the circuit breaker of the chosen instance, then the
//!   dispatch to the instance's sidecar, or through the inbound stack when it is local.
//!
//! Every refusal names its mechanism and the policy behind it, and is counted in
//! [`Rejections`]. Each layer holds only its own state.

pub(crate) mod attempt;
pub(crate) mod cache;
pub(crate) mod foreign;
pub(crate) mod invoke;
pub(crate) mod owners;
pub(crate) mod pin;
pub(crate) mod ratelimit;
pub(crate) mod reply;
pub(crate) mod retry;
pub(crate) mod router;

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Response;
use tower::{Service, ServiceExt};

use crate::call::{BoxFuture, OutboundCall};
use crate::error::SidecarError;
use crate::grpc::Body;
use crate::telemetry::{Rejections, SidecarMetrics};

/// What the outbound stack answers.
type Answer = BoxFuture<Result<Response<Body>, SidecarError>>;

/// The outbound stack, shared: a clone is one reference count (the entry is cloned per
/// request), and a call goes straight to the outermost layer's `call`, without the
/// allocation of cloning a boxed service or a `tower::util::Oneshot` holding the call.
#[derive(Clone)]
pub(crate) struct OutboundService(Arc<dyn Shared>);

impl OutboundService {
    /// Sends `call` through the stack.
    pub(crate) fn call(&self, call: OutboundCall) -> Answer {
        self.0.send(call)
    }
}

/// A stack called through a shared reference.
trait Shared: Send + Sync {
    fn send(&self, call: OutboundCall) -> Answer;
}

impl<S> Shared for S
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError, Future = Answer>
        + Clone
        + Send
        + Sync
        + 'static,
{
    fn send(&self, call: OutboundCall) -> Answer {
        // A clone of each layer's handles (reference counts), whose readiness this call
        // then uses, as `tower` asks.
        let mut stack = self.clone();
        match stack.poll_ready(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(())) => Service::call(&mut stack, call),
            Poll::Ready(Err(e)) => Box::pin(std::future::ready(Err(e))),
            // No layer waits today; if one ever does, wait for it with the task's waker.
            Poll::Pending => Box::pin(async move { stack.ready().await?.call(call).await }),
        }
    }
}

/// What the outbound stack's layers hold.
pub(crate) struct Parts {
    pub rate_limits: Arc<ratelimit::RateLimits>,
    pub cache: Arc<cache::ResultCache>,
    pub router: router::RouterParts,
    pub dispatch: attempt::Dispatch,
    pub rejections: Arc<Rejections>,
    pub metrics: Arc<SidecarMetrics>,
}

/// Builds the outbound stack and, inside its router, the attempt stack.
pub(crate) fn stack(p: Parts) -> OutboundService {
    let attempts = tower::ServiceBuilder::new()
        // Each attempt passes the chosen instance's breaker, which also records how the
        // attempt ended.
        .layer(attempt::breaker_layer(p.rejections.clone()))
        .service(p.dispatch);
    let limit = p.router.limit;
    let (tracing, tenant) = (p.router.tracing.clone(), p.router.tenant.clone());
    OutboundService(Arc::new(
        tower::ServiceBuilder::new()
            // The call's span and metrics see every outcome, refusals included.
            .layer(crate::telemetry::outbound_layer(tracing, p.metrics, tenant))
            // Rate limits first: a refused call costs nothing further and never reaches a
            // target.
            .layer(ratelimit::layer(p.rate_limits, p.rejections.clone()))
            // The cache before routing: a hit needs no instance at all.
            .layer(cache::layer(p.cache, p.rejections, limit))
            .service(router::Router::new(p.router, attempts)),
    ))
}

/// The size in bytes of what `f` returns (a future, here), without making one.
#[cfg(test)]
pub(crate) fn size_of_output<A, R>(_f: impl FnOnce(A) -> R) -> usize {
    std::mem::size_of::<R>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack of one service that answers every call at once.
    #[derive(Clone)]
    struct Answering;

    impl Service<OutboundCall> for Answering {
        type Response = Response<Body>;
        type Error = SidecarError;
        type Future = Answer;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _call: OutboundCall) -> Answer {
            Box::pin(std::future::ready(Ok(Response::new(Body::Empty))))
        }
    }

    #[tokio::test]
    async fn a_shared_stack_calls_its_outermost_layer() {
        let stack = OutboundService(Arc::new(Answering));
        for _ in 0..2 {
            assert!(stack.clone().call(crate::call::test_call()).await.is_ok());
        }
    }
}
