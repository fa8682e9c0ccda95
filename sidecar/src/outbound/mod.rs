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

use http::Response;

use crate::call::OutboundCall;
use crate::error::SidecarError;
use crate::grpc::Body;
use crate::telemetry::{Rejections, SidecarMetrics};

/// The outbound stack.
pub(crate) type OutboundService = tower::util::BoxCloneSyncService<OutboundCall, Response<Body>, SidecarError>;

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
    tower::util::BoxCloneSyncService::new(
        tower::ServiceBuilder::new()
            // The call's span and metrics see every outcome, refusals included.
            .layer(crate::telemetry::outbound_layer(tracing, p.metrics, tenant))
            // Rate limits first: a refused call costs nothing further and never reaches a
            // target.
            .layer(ratelimit::layer(p.rate_limits, p.rejections.clone()))
            // The cache before routing: a hit needs no instance at all.
            .layer(cache::layer(p.cache, p.rejections, limit))
            .service(router::Router::new(p.router, attempts)),
    )
}
