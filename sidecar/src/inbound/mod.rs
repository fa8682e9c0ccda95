//! The target's sidecar side of a call, as tower layers:
//!
//! ```text
//! MeshEntry → Telemetry → Authz → Idempotency → Admission → Deliver (gRPC agent, or the HTTP/JSON adapter)
//! ```
//! - [`deliver::MeshEntry`]: `Mesh/Deliver` from other sidecars: reads the call's headers;
//! - [`crate::telemetry`]: the server span and the inbound hop metric;
//! - [`authz`]: whether the verified caller may call the instance (authorization policies);
//! - [`idempotent`]: at-most-once execution of calls with an idempotency key (the keys seen
//!   in [`idempotency`]), across instances through [`claims`] with control; a duplicate
//!   asking something else is refused (IDEMPOTENCY_KEY_REUSED);
//! - [`admission`]: per-instance slots with priority shares and short queues, and the
//!   instance's load in every reply's `ar-load` trailer (so callers see load changes on the
//!   next call, not the next heartbeat);
//! - [`deliver::Deliver`]: hands the call to the local agent, over gRPC or through
//!   [`http_agent`].
//!
//! Calls from other sidecars (`Mesh/Deliver`) and calls whose chosen instance is local go
//! through the same stack. Each layer holds only its own state.

pub(crate) mod a2a_agent;
pub(crate) mod a2a_forward;
pub(crate) mod admission;
pub(crate) mod authz;
pub(crate) mod claims;
pub(crate) mod deliver;
pub(crate) mod http_agent;
pub(crate) mod idempotency;
pub(crate) mod idempotent;
pub(crate) mod session_attach;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use agent_reach_routing::TableHandle;
use agent_reach_telemetry::Tracing;
use tower::{Service, ServiceExt};

use crate::call::{Attempt, BoxFuture, InboundCall};
use crate::pool::Pool;
use crate::telemetry::{Rejections, SidecarMetrics};

/// Refuses a call whose message names, in its `tenant` field, another tenant than the one
/// its caller was verified as (`verified`: the certificate's, or this sidecar's for a local
/// or plaintext call). The caller's sidecar writes that field after the caller's own
/// fields (the last value is the one an agent decodes); a sidecar that writes another
/// tenant's name there is lying to the agent. An empty field claims nothing.
pub(crate) fn check_tenant_field(claimed: &str, verified: &str) -> Result<(), crate::error::DeliveryError> {
    if claimed.is_empty() || claimed == verified {
        return Ok(());
    }
    Err(crate::error::DeliveryError::TenantMismatch { claimed: claimed.to_string(), verified: verified.to_string() })
}

/// What the inbound stack answers.
pub(crate) type Answer = BoxFuture<Result<Attempt, Infallible>>;

/// The inbound stack, shared: a clone is one reference count, and a call goes straight to
/// the outermost layer's `call`, without the allocation of cloning a boxed service or a
/// `tower::util::Oneshot` holding the call.
#[derive(Clone)]
pub(crate) struct InboundService(Arc<dyn Shared>);

impl InboundService {
    /// Sends `call` through the stack.
    pub(crate) fn call(&self, call: InboundCall) -> Answer {
        self.0.send(call)
    }

    /// The attempt `call` ends in.
    pub(crate) async fn attempt(&self, call: InboundCall) -> Attempt {
        match self.call(call).await {
            Ok(a) => a,
            Err(never) => match never {},
        }
    }
}

/// A stack called through a shared reference.
trait Shared: Send + Sync {
    fn send(&self, call: InboundCall) -> Answer;
}

impl<S> Shared for S
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible, Future = Answer> + Clone + Send + Sync + 'static,
{
    fn send(&self, call: InboundCall) -> Answer {
        // A clone of each layer's handles (one reference count each), whose readiness this
        // call then uses, as `tower` asks.
        let mut stack = self.clone();
        match stack.poll_ready(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(())) => Service::call(&mut stack, call),
            Poll::Ready(Err(never)) => match never {},
            // No layer waits today; if one ever does, wait for it with the task's waker.
            Poll::Pending => Box::pin(async move { stack.ready().await?.call(call).await }),
        }
    }
}

/// What the inbound stack's layers hold.
pub(crate) struct Parts {
    pub table: TableHandle,
    /// This sidecar's tenant (callers of another one need a grant).
    pub tenant: Arc<str>,
    pub pool: Arc<Pool>,
    pub gates: Arc<admission::Gates>,
    pub idempotency: Arc<idempotency::Store>,
    /// Claims of idempotency keys with control (`None`: per sidecar only).
    pub claims: Option<Arc<claims::Claims>>,
    pub rejections: Arc<Rejections>,
    pub metrics: Arc<SidecarMetrics>,
    pub tracing: Tracing,
    /// The largest call or answer read whole.
    pub limit: usize,
    /// Delivers calls' sessions with them.
    pub snapshots: session_attach::Snapshots,
}

/// Builds the inbound stack.
pub(crate) fn stack(p: Parts) -> InboundService {
    let service = tower::ServiceBuilder::new()
        // The server span and hop metric cover everything the target's sidecar does.
        .layer(crate::telemetry::inbound_layer(p.tracing.clone(), p.metrics.clone()))
        // Who may call comes first: a refused caller gets no replay, no slot, no agent.
        .layer(authz::layer(p.table.clone(), p.rejections.clone(), p.tenant))
        // Duplicates are answered first: a replay needs no slot and never reaches the agent.
        .layer(idempotent::layer(p.idempotency, p.claims, p.rejections.clone(), p.limit))
        // Then slots by priority: over its share a call waits briefly, then is refused
        // before the agent sees it.
        .layer(admission::layer(p.gates, p.table.clone(), p.rejections, p.metrics, p.tracing))
        .service(deliver::Deliver::new(p.table, p.pool, p.limit, p.snapshots));
    InboundService(Arc::new(service))
}

#[cfg(test)]
mod tests {
    use agent_reach::model::Priority;

    use std::sync::Arc;

    use agent_reach::policy::Admission as Settings;
    use http::HeaderMap;

    use super::admission::{Gates, parse_load};
    use crate::grpc::header;

    #[tokio::test]
    async fn load_excludes_the_call_being_answered() {
        let inbound = Gates::default();
        let g = inbound.gate("a-1", 4, Settings::default());
        let p1 = g.acquire(Priority::Normal, None).await.unwrap();
        let _p2 = g.acquire(Priority::Normal, None).await.unwrap();
        assert_eq!(inbound.total_in_flight(), 2);
        let mut h = HeaderMap::new();
        p1.annotate(&mut h);
        assert_eq!(h[header::LOAD], "0.250");
        assert_eq!(parse_load(&h), Some(0.25));
        drop(p1);
        assert_eq!(g.in_use(), 1);
        assert!(Arc::ptr_eq(&g, &inbound.gate("a-1", 4, Settings::default())));
        assert!(!Arc::ptr_eq(&g, &inbound.gate("a-1", 8, Settings::default())), "new settings, new gate");
        inbound.retain(|_| false);
        assert_eq!(inbound.total_in_flight(), 0);
    }

    #[tokio::test]
    async fn idle_gates_are_dropped_past_the_cap_and_busy_ones_kept() {
        use super::admission::MAX_IDLE_GATES;
        let gates = Gates::default();
        let busy = gates.gate("busy", 1, Settings::default());
        let permit = busy.acquire(Priority::Normal, None).await.unwrap();
        drop(busy);
        let held = gates.gate("held", 1, Settings::default());
        for i in 0..MAX_IDLE_GATES * 3 {
            drop(gates.gate(&format!("gone-{i}"), 4, Settings::default()));
            assert!(gates.len() <= MAX_IDLE_GATES + 1, "{} gates after {i}", gates.len());
        }
        // The gate with a call admitted and the one a caller holds were never dropped.
        assert_eq!(gates.total_in_flight(), 1);
        assert!(Arc::ptr_eq(&held, &gates.gate("held", 1, Settings::default())));
        drop(permit);
    }
}
