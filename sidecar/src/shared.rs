//! What the sidecar's handlers and background tasks share (the ports' method dispatch in
//! `api`, the mesh port's tenant check, readiness), built once at start in `lib.rs`.

use std::sync::Arc;

use agent_reach_routing::TableHandle;

use crate::config::SidecarConfig;
use crate::control::WatchStats;
use crate::telemetry::Calls;
use crate::{inbound, limits, registry, session, tasks};

/// What the sidecar's handlers and background tasks share; each layer of the call path
/// holds its own state instead.
pub(crate) struct Inner {
    pub(crate) config: SidecarConfig,
    pub(crate) table: TableHandle,
    pub(crate) registry: Arc<registry::Registry>,
    /// Session context: the local API's session methods and the cache behind them.
    pub(crate) sessions: Arc<session::SessionCache>,
    /// Durable tasks: the local API's task methods and the dispatcher.
    pub(crate) tasks: Arc<tasks::Tasks>,
    /// Claims of idempotency keys with control (exactly once across instances).
    pub(crate) claims: Arc<inbound::claims::Claims>,
    pub(crate) watch_stats: Arc<WatchStats>,
    /// Span export and the recent-span buffer.
    pub(crate) tracing: agent_reach_telemetry::Tracing,
    /// Calls in flight through this sidecar (both directions), for draining.
    pub(crate) calls: Arc<Calls>,
    pub(crate) health: tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
    /// Refusals by limit on the local and the mesh port.
    pub(crate) limit_stats: [Arc<limits::LimitStats>; 2],
}
