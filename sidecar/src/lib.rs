//! The Agent-Reach sidecar: one per host or pod, next to the agents.
//!
//! It serves two gRPC APIs over HTTP/2:
//! - the local API (`agentreach.v1.Sidecar`, default 127.0.0.1:7700): agents register,
//!   heartbeat, ask for routes and invoke capabilities;
//! - the mesh API (`agentreach.v1.Mesh`, default :7701): other sidecars deliver calls for
//!   the agents on this host.
//!
//! It keeps a routing table fed by the control service's watch stream ([`control`]), routes
//! each call from it without asking control, and forwards calls without decoding payloads.
//! It keeps serving from its last table when control is unreachable.
//!
//! A call's path, and the folders that hold it:
//! - `outbound/` in the caller's sidecar: the `Invoke` entry, then rate limits, cache,
//!   routing with retries and fallbacks, and per attempt a circuit breaker and the dispatch
//!   to the instance's sidecar;
//! - `inbound/` in the target's sidecar: the `Mesh/Deliver` entry, then idempotency,
//!   authorization, admission by priority, and delivery to the local agent (gRPC, HTTP/JSON
//!   or A2A).
//!
//! Each is a chain of tower layers, each layer holding its own state. Above them, the
//! front ends that send calls through the outbound stack: durable tasks (`tasks/`: the
//! local API's task methods and the dispatch of the tasks this sidecar claims, through its
//! own local API like any call) and the A2A bindings ([`a2a`]). Beneath them: session
//! context and its cache (`session`, which the mesh entry prewarms), telemetry, the call
//! types every layer passes along (`call`), the registry of local agents, the
//! configuration, the gRPC framing (`grpc`), connections (`pool`), errors and their one
//! mapping to statuses (`error`), and the watch of control. Nothing beneath imports what
//! is above it (telemetry's scrape reads the sizes of the stacks' maps through closures
//! handed in at start). The ports themselves: `serve` (HTTP/2
//! settings, accept loop, graceful shutdown), `api` (which method of the local and mesh
//! APIs goes where), `shared` (what their handlers share), and `limits` and `stall` (what
//! one client may hold on a port: connections, streams, headers, timeouts, stalled replies).
//!
//! [`Sidecar::start`] takes already-bound listeners, so tests run sidecars on port 0.

pub mod a2a;
mod a2a_wire;
pub mod alloc;
mod api;
mod bounded;
mod call;
mod coalesce;
pub mod config;
mod conn_streams;
pub mod control;
mod credentials;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod grace;
mod grpc;
mod hop;
mod http_client;
pub mod identity;
mod identity_file;
mod inbound;
mod limits;
pub mod local_access;
mod mesh_tls;
mod outbound;
mod persist;
mod pool;
mod probe;
mod registry;
mod report;
mod serve;
mod session;
mod session_writer;
mod shared;
mod stall;
mod tasks;
mod telemetry;
mod workload;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::proto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use agent_reach_routing::{RoutingTable, TableHandle};
pub use config::{SidecarArgs, SidecarConfig};
pub use control::WatchStats;
pub use error::StartError;
pub use limits::PortLimits;
pub use registry::{Registry, RegistryStats};
pub use session::{MAX_CACHED as MAX_CACHED_SESSIONS, SessionCache, SessionStats};
pub use tasks::sign as sign_task_push;
pub use tasks::{TaskStats, Tasks};
pub use workload::IdentityStats;

use api::{local_api, mesh_api};
use inbound::deliver::MeshEntry;
use outbound::invoke::InvokeEntry;
use serve::serve_http2;
use shared::Inner;
use telemetry::{Calls, Rejections, SidecarMetrics};

/// A running sidecar.
pub struct Sidecar {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
    mesh_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    /// The A2A JSON-RPC port, when served.
    a2a_addr: Option<SocketAddr>,
    revision: watch::Receiver<i64>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// The sidecar's identity, when it has one.
    identity: Option<workload::Workload>,
}

impl Sidecar {
    /// Starts serving on already-bound listeners and starts watching control.
    pub async fn start(config: SidecarConfig, local: TcpListener, mesh: TcpListener) -> Result<Sidecar, StartError> {
        Sidecar::start_with_admin(config, local, mesh, None).await
    }

    /// Like [`Sidecar::start`], also serving the admin HTTP port (metrics, health,
    /// readiness, recent traces) on `admin`.
    pub async fn start_with_admin(
        mut config: SidecarConfig,
        local: TcpListener,
        mesh: TcpListener,
        admin: Option<TcpListener>,
    ) -> Result<Sidecar, StartError> {
        let local_addr = local.local_addr()?;
        let mesh_addr = mesh.local_addr()?;
        let advertise = match config.advertise.clone() {
            Some(a) => a,
            None if mesh_addr.ip().is_unspecified() => {
                format!("{}:{}", config::hostname().unwrap_or_else(|| "localhost".into()), mesh_addr.port())
            }
            None => mesh_addr.to_string(),
        };
        config.advertise = Some(advertise.clone());
        let identity = proto::SidecarIdentity { sidecar_id: config.sidecar_id.clone(), mesh_address: advertise };
        // With identity settings, the first certificate is bought before anything else is
        // asked of control, and every connection to control is TLS with it.
        let workload = workload::Workload::start(&config).await?;
        let control = Arc::new(
            control::ControlClients::with_tls(
                &config.control,
                config.control_timeout,
                workload.as_ref().map(|w| w.tls.clone()),
            )
            .map_err(StartError::Config)?,
        );
        let registry = Arc::new(registry::Registry::new(
            config.tenant.clone(),
            identity.clone(),
            control.clone(),
            registry::Timers::from(&config),
            config.http_agent_allowed_hosts.clone(),
        ));
        // The overall status ("") starts SERVING.
        let health = tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(tonic_health::server::HealthReporter::new()),
        );
        let table = TableHandle::default();
        let watch_stats = Arc::new(WatchStats::default());
        if let Some(path) = &config.table_file {
            match persist::load(path, &config.tenant) {
                Ok(Some((saved, saved_at_ms))) => {
                    tracing::info!(
                        path = %path.display(), revision = saved.revision, instances = saved.len(),
                        "routing from the saved table until control confirms it"
                    );
                    table.store(saved);
                    watch_stats.confirmed_at_ms.store(saved_at_ms, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("ignoring the saved routing table: {e}"),
            }
        }
        let tracing = agent_reach_telemetry::Tracing::new(&agent_reach_telemetry::TraceConfig {
            service_name: "agent-reach-sidecar".into(),
            service_instance: config.sidecar_id.clone(),
            otlp_endpoint: config.otlp_endpoint.clone(),
            sample_ratio: config.trace_sample_ratio,
            recent_spans: config.recent_spans,
        })
        .map_err(StartError::Config)?;
        let calls = Arc::new(Calls::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let sessions = Arc::new(
            session::SessionCache::new(
                config.tenant.clone(),
                control.channels(),
                config.control_timeout,
                shutdown_rx.clone(),
            )
            .map_err(StartError::Config)?,
        );
        let durable =
            Arc::new(tasks::Tasks::new(&config, control.channels(), shutdown_rx.clone()).map_err(StartError::Config)?);
        let claims = inbound::claims::Claims::new(
            config.tenant.clone(),
            control.channels(),
            config.control_timeout,
            config.idempotency_window,
            config.idempotency_max_reply_bytes,
        )
        .map_err(StartError::Config)?;
        let inner = Arc::new(Inner {
            sessions,
            tasks: durable.clone(),
            claims,
            tracing,
            config: config.clone(),
            table: table.clone(),
            registry: registry.clone(),
            watch_stats: watch_stats.clone(),
            calls: calls.clone(),
            health,
            limit_stats: Default::default(),
        });
        let (revision_tx, revision) = watch::channel(0i64);
        let mut tasks = JoinSet::new();
        if let Some(path) = config.table_file.clone() {
            tasks.spawn(persist::run_saver(
                path,
                config.tenant.clone(),
                table.clone(),
                revision.clone(),
                shutdown_rx.clone(),
            ));
        }
        let watch_request =
            proto::WatchRequest { tenant: config.tenant.clone(), sidecar: Some(identity), from_revision: 0 };
        tasks.spawn(control::run_watch_holding(
            control.clone(),
            watch_request,
            table,
            revision_tx,
            watch_stats,
            None,
            config.removal_grace,
            shutdown_rx.clone(),
        ));
        tasks.spawn(registry.clone().run_renewals(shutdown_rx.clone()));
        if let Some(w) = &workload {
            tasks.spawn(w.renewals(control.clone(), shutdown_rx.clone()));
        }
        tasks.spawn(registry.run_probes(shutdown_rx.clone()));
        let (invoke, mesh_entry, metrics) = entries(&inner, workload.as_ref().map(|w| w.tls.clone()));
        durable.set_invoker(invoke.clone(), config.max_payload_bytes + grpc::ENVELOPE_ALLOWANCE);
        tasks.spawn(durable.run_recovery());
        let admin_addr = match admin {
            Some(listener) => {
                let addr = listener.local_addr()?;
                let r = inner.clone();
                let state = agent_reach_telemetry::AdminState {
                    metrics: Box::new(move || metrics.encode()),
                    ready: Box::new(move || readiness(&r)),
                    spans: Some(inner.tracing.recent().clone()),
                };
                tasks.spawn(agent_reach_telemetry::serve_admin(listener, Arc::new(state), shutdown_rx.clone()));
                Some(addr)
            }
            None => None,
        };
        let [local_stats, mesh_stats] = inner.limit_stats.clone();
        let local_port = Arc::new(limits::Port::new(config.limits.clone(), local_stats));
        let mesh_port = Arc::new(limits::Port::new(config.limits.clone(), mesh_stats));
        let (a2a, a2a_addr) = a2a::start(
            &config,
            inner.table.clone(),
            invoke.clone(),
            inner.tasks.clone(),
            local_addr,
            shutdown_rx.clone(),
            &mut tasks,
        )
        .await?;
        let local_inner = inner.clone();
        let local_handler = move |req| local_api(local_inner.clone(), invoke.clone(), a2a.clone(), req);
        if let Some((path, mode)) = &config.local_uds {
            let uds = local_access::bind_uds(path, *mode)?;
            tasks.spawn(local_access::serve_uds(
                uds,
                path.clone(),
                local_port.clone(),
                shutdown_rx.clone(),
                local_handler.clone(),
            ));
        }
        tasks.spawn(serve_http2(local, local_port, shutdown_rx.clone(), local_handler));
        let mesh_inner = inner.clone();
        let mesh_handler = move |req| mesh_api(mesh_inner.clone(), mesh_entry.clone(), req);
        // With an identity the mesh port is mutual TLS with the sidecar's certificate.
        match workload.as_ref().and_then(|w| w.tls.workload()) {
            Some(tls) => {
                tasks.spawn(mesh_tls::serve(mesh, tls, config.mesh_permissive, mesh_port, shutdown_rx, mesh_handler))
            }
            None => tasks.spawn(serve_http2(mesh, mesh_port, shutdown_rx, mesh_handler)),
        };
        tracing::info!(
            sidecar = %config.sidecar_id, tenant = %config.tenant, local = %local_addr, mesh = %mesh_addr,
            advertise = ?config.advertise, control = ?config.control, "sidecar started"
        );
        Ok(Sidecar {
            inner,
            local_addr,
            mesh_addr,
            admin_addr,
            a2a_addr,
            revision,
            shutdown,
            tasks,
            identity: workload,
        })
    }

    /// The sidecar's current TLS configurations (its certificate), when it has an identity.
    pub fn tls(&self) -> Option<Arc<agent_reach_identity::TlsConfigs>> {
        self.identity.as_ref().and_then(|w| w.tls.workload())
    }

    /// Certificate counters, when the sidecar has an identity.
    pub fn identity_stats(&self) -> Option<&workload::IdentityStats> {
        self.identity.as_ref().map(|w| &*w.stats)
    }

    /// Address of the local API.
    /// Counters of the session cache.
    pub fn session_stats(&self) -> &SessionStats {
        self.inner.sessions.stats()
    }

    /// The session cache (what the local `GetSession` asks first; benchmarks time it).
    pub fn session_cache(&self) -> &Arc<SessionCache> {
        &self.inner.sessions
    }

    /// Durable tasks: the API the local task methods (and other front ends) call.
    /// Counters of this sidecar's claims of idempotency keys with control.
    pub fn claim_stats(&self) -> &inbound::claims::ClaimStats {
        self.inner.claims.stats()
    }

    pub fn tasks(&self) -> &Arc<tasks::Tasks> {
        &self.inner.tasks
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
    /// Address of the mesh API.
    pub fn mesh_addr(&self) -> SocketAddr {
        self.mesh_addr
    }
    /// Address of the admin HTTP port, when serving one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }
    /// Span export and the recent-span buffer.
    /// Address of the A2A JSON-RPC port (`--a2a-listen`), when served.
    pub fn a2a_addr(&self) -> Option<SocketAddr> {
        self.a2a_addr
    }

    pub fn tracing(&self) -> &agent_reach_telemetry::Tracing {
        &self.inner.tracing
    }
    pub fn id(&self) -> &str {
        &self.inner.config.sidecar_id
    }
    /// The current routing table.
    pub fn table(&self) -> Arc<RoutingTable> {
        self.inner.table.load_full()
    }
    pub fn watch_stats(&self) -> &WatchStats {
        &self.inner.watch_stats
    }
    /// Agents registered through this sidecar.
    pub fn local_instances(&self) -> usize {
        self.inner.registry.len()
    }

    /// The registry of local agents (their health, lease and counters).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// Waits until the routing table satisfies `pred` (checked after every change).
    pub async fn wait_for_table(&self, timeout: Duration, pred: impl Fn(&RoutingTable) -> bool) -> Result<(), String> {
        let mut rx = self.revision.clone();
        let check = async {
            loop {
                if pred(&self.inner.table.load()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, check).await.map_err(|_| {
            let t = self.inner.table.load();
            format!(
                "routing table did not converge within {timeout:?} (revision {}, {} instances)",
                t.revision,
                t.len()
            )
        })
    }

    /// Graceful shutdown: reports the local agents PAUSED (callers stop sending them new
    /// calls), lets calls in flight finish (up to the drain timeout), deregisters the local
    /// agents, then closes the listeners and ends streams and background loops.
    pub async fn shutdown(self) {
        let inner = self.inner.clone();
        inner.registry.pause_all().await;
        if tokio::time::timeout(inner.config.drain_timeout, inner.calls.idle()).await.is_err() {
            tracing::warn!(in_flight = inner.calls.in_flight(), "calls still in flight after the drain timeout");
        }
        inner.registry.deregister_all().await;
        self.stop().await;
    }

    /// Stops at once: closes listeners, ends streams and background loops, without
    /// draining or deregistering (local agents' leases then expire).
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.inner.tracing.shutdown();
    }

    /// Requests and connections refused by `limit` (e.g. "max_header_list_bytes",
    /// "idle_timeout"; the `limit` label of `agent_reach_limit_refusals_total` on
    /// /metrics) on the local port (`mesh == false`) or the mesh port.
    pub fn limit_refusals(&self, mesh: bool, limit: &str) -> u64 {
        let stats = &self.inner.limit_stats[usize::from(mesh)];
        stats.counts().into_iter().find(|(l, _)| *l == limit).map_or(0, |(_, n)| n)
    }

    /// Calls in flight through this sidecar.
    pub fn calls_in_flight(&self) -> u64 {
        self.inner.calls.in_flight()
    }

    /// Runs until `signal` completes, then shuts down.
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        self.shutdown().await;
    }
}

/// Builds the call path: the inbound stack, the outbound stack (whose attempts reach local
/// instances through the inbound one) and the two entries serving them; and the metrics
/// they record into.
fn entries(
    inner: &Inner,
    mesh_tls: Option<Arc<identity::ControlTls>>,
) -> (InvokeEntry, MeshEntry, Arc<SidecarMetrics>) {
    let config = &inner.config;
    let limit = config.max_payload_bytes + grpc::ENVELOPE_ALLOWANCE;
    let rejections = Arc::new(Rejections::default());
    let pool = Arc::new(pool::Pool::default());
    // Connections to other sidecars: TLS with the sidecar's certificate when it has an
    // identity (local agents stay on plaintext loopback connections).
    let mesh_pool = match mesh_tls {
        Some(tls) => Arc::new(pool::Pool::with_tls(tls)),
        None => pool.clone(),
    };
    let gates = Arc::new(inbound::admission::Gates::default());
    let in_flight = gates.clone();
    let rate_limits = Arc::new(outbound::ratelimit::RateLimits::default());
    let cache = Arc::new(outbound::cache::ResultCache::new(config.cache_max_entries, config.cache_max_bytes));
    let idempotency = inbound::idempotency::Store::bounded(
        config.idempotency_window,
        config.idempotency_max_reply_bytes,
        config.idempotency_max_keys,
        config.idempotency_max_bytes,
    );
    // The owners of keys this sidecar's callers sent: for the window, as many as keys kept.
    let owners = outbound::owners::Owners::new(config.idempotency_window, config.idempotency_max_keys);
    let pools = if Arc::ptr_eq(&pool, &mesh_pool) { vec![pool.clone()] } else { vec![pool.clone(), mesh_pool.clone()] };
    let metrics = Arc::new(
        SidecarMetrics::new()
            .with_collector(telemetry::ScrapeCollector {
                rejections: rejections.clone(),
                calls: inner.calls.clone(),
                watch_stats: inner.watch_stats.clone(),
                table: inner.table.clone(),
                inbound_in_flight: Box::new(move || in_flight.total_in_flight()),
                limits: [("local", inner.limit_stats[0].clone()), ("mesh", inner.limit_stats[1].clone())],
                bounded: bounded::sizes(bounded::Maps {
                    rate_limits: &rate_limits,
                    gates: &gates,
                    pools,
                    cache: &cache,
                    idempotency: &idempotency,
                    owners: &owners,
                    sessions: &inner.sessions,
                }),
            })
            .with(Box::new(session::SessionMetrics(inner.sessions.clone()))),
    );
    // The heartbeats to control carry what the outbound stack counts.
    inner.registry.set_reporter(registry::Reporter {
        traffic: metrics.traffic.clone(),
        table: inner.table.clone(),
        spans: inner.tracing.recent().clone(),
        interval: config.report_interval,
        last: std::sync::Mutex::new(None),
    });
    let inbound = inbound::stack(inbound::Parts {
        table: inner.table.clone(),
        tenant: config.tenant.as_str().into(),
        pool: pool.clone(),
        gates,
        idempotency,
        claims: Some(inner.claims.clone()),
        rejections: rejections.clone(),
        metrics: metrics.clone(),
        tracing: inner.tracing.clone(),
        limit,
        snapshots: inbound::session_attach::Snapshots::new(inner.sessions.clone(), config),
    });
    let outbound = outbound::stack(outbound::Parts {
        rate_limits,
        cache,
        router: outbound::router::RouterParts {
            tenant: config.tenant.as_str().into(),
            deadline_reserve: config.deadline_reserve,
            limit,
            tracing: inner.tracing.clone(),
            metrics: metrics.clone(),
            rejections: rejections.clone(),
            owners,
        },
        dispatch: outbound::attempt::Dispatch::new(
            &config.sidecar_id,
            &config.tenant,
            inner.registry.clone(),
            inbound.clone(),
            mesh_pool,
            limit,
        ),
        rejections: rejections.clone(),
        metrics: metrics.clone(),
    });
    let body_read =
        |stats: &Arc<limits::LimitStats>| limits::BodyRead::new(config.limits.body_read_timeout, stats.clone());
    let invoke = InvokeEntry::new(
        inner.table.clone(),
        config.max_payload_bytes,
        config.default_timeout,
        body_read(&inner.limit_stats[0]),
        outbound,
        inner.registry.clone(),
    )
    .with_foreign(Arc::new(outbound::foreign::Foreign::new(
        &config.tenant,
        proto::SidecarIdentity {
            sidecar_id: config.sidecar_id.clone(),
            mesh_address: config.advertise.clone().unwrap_or_default(),
        },
        inner.registry.control().clone(),
    )));
    let mesh = MeshEntry::new(
        inner.registry.clone(),
        &config.tenant,
        &config.sidecar_id,
        config.deadline_reserve,
        inbound,
        inner.sessions.clone(),
        limit,
        body_read(&inner.limit_stats[1]),
        (inner.table.clone(), rejections),
    );
    (invoke, mesh, metrics)
}

/// `/readyz`: a routing table, and control reachable or the table fresh enough.
fn readiness(inner: &Inner) -> Result<String, String> {
    let table = inner.table.load();
    if table.revision == 0 {
        return Err("no routing table yet (control not reached, nothing saved)".into());
    }
    let (stale, age) = inner.watch_stats.staleness();
    if !stale {
        return Ok(format!("watching control, table at revision {} with {} instances", table.revision, table.len()));
    }
    if age <= inner.config.ready_max_stale {
        return Ok(format!("control unreachable; routing from a table {}s old", age.as_secs()));
    }
    Err(format!(
        "control unreachable and the table is {}s old (limit {}s)",
        age.as_secs(),
        inner.config.ready_max_stale.as_secs()
    ))
}
