//! The Agent-Reach control service: stateless, several replicas on one store.
//!
//! - [`registry`]: registrations on the sidecars' leases, heartbeats that renew them (and
//!   write state and load only when they change meaningfully, see [`load`]), operator
//!   holds, policies and tenant records, all with compare-and-swap transactions.
//! - [`feed`] and [`watch`]: each replica watches the store once per tenant and streams the
//!   tenant's routing state to its sidecars: a snapshot, then deltas strictly in revision
//!   order, resumable from any revision the store still has.
//! - [`service`] (`agentreach.v1.Control`, for sidecars), [`identity`]
//!   (`agentreach.v1.Identity`: the CA signing sidecars' certificates, join tokens),
//!   [`sessions`] (`agentreach.v1.Sessions`, the session context, for sidecars), [`tasks`]
//!   (`agentreach.v1.Tasks`, durable tasks, for sidecars), [`idempotency`]
//!   (`agentreach.v1.Idempotency`, claims of idempotency keys, for sidecars) and
//!   [`admin`] (`agentreach.v1.Admin`, for operators) on one gRPC port; [`error`] turns
//!   every failure into a status.
//!
//! - [`dashboard`]: the operators' web page, live over server-sent events from the tenant
//!   feeds; [`alerts`]: rules over the same feeds, to the dashboard, `/metrics` and a
//!   signed webhook; [`reports`]: the sidecars' traffic reports (call edges, breakers,
//!   last heartbeats, recent spans), stored on their leases and followed by every replica.
//!
//! All state lives in the store (`agent_reach_store`): etcd in production, the embedded
//! store in development. Counters are in [`stats`]. [`serve`] takes an already-bound
//! listener and a shutdown future; every watch stream ends on shutdown.

pub mod admin;
pub mod alerts;
pub mod config;
pub mod conn;
pub mod dashboard;
pub mod error;
pub mod feed;
pub mod grants;
pub mod idempotency;
pub mod identity;
pub mod keys;
pub mod limit_stats;
pub mod limits;
pub mod load;
pub mod metrics;
mod permissive;
pub mod record;
pub mod refusals;
pub mod registry;
pub mod report_leases;
pub mod reports;
pub mod routes;
pub mod service;
pub mod session_stats;
pub mod session_writers;
pub mod sessions;
pub mod stats;
pub mod tasks;
pub mod watch;
pub mod wire;

use std::future::Future;
use std::sync::Arc;

use agent_reach::proto::admin_server::AdminServer;
use agent_reach::proto::control_server::ControlServer;
use agent_reach::proto::identity_server::IdentityServer;
use agent_reach_store::{EmbeddedStore, EtcdOptions, EtcdStore, EtcdTls, Store};
use tokio::net::TcpListener;

pub use admin::AdminService;
pub use config::{ControlArgs, ControlConfig};
pub use error::ControlError;
pub use registry::{Registry, RegistryConfig};
pub use service::ControlService;
pub use stats::{ControlStats, CountingStore};

/// How control connects to etcd beyond its endpoints: the files of the TLS connection, and
/// the etcd user (etcd RBAC) with the file holding its password.
#[derive(Clone, Debug, Default)]
pub struct EtcdTlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    pub username: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
}

impl EtcdTlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The etcd user, with its password read from its file (one line; the trailing newline
    /// is not part of it). The error names the flag.
    fn user(&self) -> Result<Option<agent_reach_store::EtcdUser>, String> {
        match (&self.username, &self.password_file) {
            (None, None) => Ok(None),
            (Some(name), Some(path)) => {
                let password = std::fs::read_to_string(path)
                    .map_err(|e| format!("--etcd-password-file {}: {e}", path.display()))?;
                let password = password.trim_end_matches(['\r', '\n']).to_string();
                if password.is_empty() {
                    return Err(format!("--etcd-password-file {}: the file is empty", path.display()));
                }
                Ok(Some(agent_reach_store::EtcdUser { name: name.clone(), password }))
            }
            _ => Err("--etcd-username and --etcd-password-file go together".into()),
        }
    }

    /// Reads the PEM files; the error names the flag and the file.
    fn load(&self) -> Result<EtcdTls, String> {
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
        };
        let ca_pem = self.ca.as_deref().map(|p| read("--etcd-ca-file", p)).transpose()?;
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((read("--etcd-cert-file", c)?, read("--etcd-key-file", k)?)),
            (None, None) => None,
            _ => return Err("--etcd-cert-file and --etcd-key-file go together".into()),
        };
        Ok(EtcdTls { ca_pem, identity })
    }
}

/// Connects to etcd when endpoints are given, else creates the embedded store.
pub async fn open_store(
    etcd_endpoints: &[String],
    timeout: std::time::Duration,
    tls: &EtcdTlsFiles,
) -> Result<Arc<dyn Store>, String> {
    if etcd_endpoints.is_empty() {
        return Ok(Arc::new(EmbeddedStore::default()));
    }
    let user = tls.user()?;
    let tls = if tls.is_empty() { None } else { Some(tls.load()?) };
    let store = EtcdStore::connect(EtcdOptions {
        endpoints: etcd_endpoints.to_vec(),
        connect_timeout: timeout,
        request_timeout: timeout,
        tls,
        user,
    })
    .await
    .map_err(|e| format!("--etcd-endpoints: {e}"))?;
    Ok(Arc::new(store))
}

/// Runs the control service as the `agent-reach-control` binary does: opens the store the
/// flags name, binds `--listen`, serves until ctrl-c or SIGTERM.
pub async fn run(args: ControlArgs, config: ControlConfig) -> Result<(), String> {
    let tls = EtcdTlsFiles {
        ca: args.etcd_ca_file.clone(),
        cert: args.etcd_cert_file.clone(),
        key: args.etcd_key_file.clone(),
        username: args.etcd_username.clone(),
        password_file: args.etcd_password_file.clone(),
    };
    let store = open_store(&args.etcd_endpoints, args.etcd_timeout, &tls).await?;
    let mut config = config;
    if let Some(url) = &args.session_redis {
        let redis = agent_reach_session::RedisSessions::connect(url, config.session_limits.clone())
            .await
            .map_err(|e| format!("--session-redis {url}: {e}"))?;
        config.session_store = Some(config::SessionBackend(Arc::new(redis)));
    }
    let listener = TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let stats = Arc::new(ControlStats::default());
    let (stop_admin, admin_stopped) = tokio::sync::watch::channel(false);
    if args.admin_listen != "off" {
        let admin = TcpListener::bind(&args.admin_listen)
            .await
            .map_err(|e| format!("--admin-listen {}: {e}", args.admin_listen))?;
        let state = metrics::admin_state(store.clone(), stats.clone(), admin_stopped.clone());
        tokio::spawn(agent_reach_telemetry::serve_admin(admin, Arc::new(state), admin_stopped));
    }
    let dashboard = match args.dashboard_listen.as_str() {
        "off" => None,
        addr => Some(TcpListener::bind(addr).await.map_err(|e| format!("--dashboard-listen {addr}: {e}"))?),
    };
    if let Some(addr) = dashboard.as_ref().and_then(|l| l.local_addr().ok()) {
        match config.admin_token {
            Some(_) => tracing::info!("dashboard at http://{addr}/ (log in with an operator token)"),
            None => tracing::info!("dashboard at http://{addr}/ (loopback only and read-only: no operator tokens)"),
        }
    }
    tracing::info!(
        listen = %args.listen, admin = %args.admin_listen, store = store.backend(), lease_ttl = ?config.lease_ttl,
        "control service started"
    );
    let served =
        serve_parts(store, config, stats, listener, dashboard, agent_reach_support::process::shutdown_signal()).await;
    let _ = stop_admin.send(true);
    served.map_err(|e| e.to_string())
}

/// Serves the Control and Admin APIs (and grpc.health.v1) on `listener` until `shutdown`
/// completes.
pub async fn serve(
    store: Arc<dyn Store>,
    config: ControlConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with_stats(store, config, Arc::new(ControlStats::default()), listener, shutdown).await
}

/// [`serve`], counting into `stats`.
pub async fn serve_with_stats(
    store: Arc<dyn Store>,
    config: ControlConfig,
    stats: Arc<ControlStats>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_parts(store, config, stats, listener, None, shutdown).await
}

/// [`serve_with_stats`], also serving the dashboard on `dashboard` when given.
pub async fn serve_parts(
    store: Arc<dyn Store>,
    mut config: ControlConfig,
    stats: Arc<ControlStats>,
    listener: TcpListener,
    dashboard: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let store: Arc<dyn Store> = Arc::new(CountingStore::new(store, stats.clone()));
    let feeds = Arc::new(
        feed::Feeds::new(store.clone(), stats.clone(), config.watch_history).with_max_feeds(config.max_tenant_feeds),
    );
    let registry = Arc::new(Registry::new(
        store.clone(),
        RegistryConfig {
            lease_ttl: config.lease_ttl,
            load_step: config.load_step,
            load_report_interval: config.load_report_interval,
        },
        stats.clone(),
        feeds.clone(),
    ));
    let janitor = tokio::spawn(feeds.clone().run_janitor(stop_rx.clone()));
    let handshakes = stats.tls.clone();
    let stats_conn = stats.conn.clone();
    let tokens = Arc::new(identity::JoinTokens::new(store.clone()));
    let identity_config = config.identity.get_or_insert_with(identity::IdentityConfig::development).clone();
    let authz = Arc::new(identity::Authorizer::new(config.mtls, stats.clone()));
    let identity = identity::IdentityService::new(
        identity_config.clone(),
        Arc::new(identity::JoinTokenAuthenticator::new(tokens.clone())),
    );
    let operator_auth = Arc::new(match &config.admin_token {
        Some(token) => identity::OperatorAuth::new(store.clone(), &token.0),
        None => {
            tracing::warn!(
                "INSECURE: the Admin API is open (--insecure-open-admin-api): anyone who reaches the control \
                 port can read and change every tenant's routing"
            );
            identity::OperatorAuth::off(store.clone())
        }
    });
    let reports = reports::Reports::start(store.clone(), stop_rx.clone());
    let alerts = alerts::Alerts::start(
        config.alerts.clone(),
        feeds.clone(),
        reports.clone(),
        store.clone(),
        stats.clone(),
        stop_rx.clone(),
    );
    if let Some(listener) = dashboard {
        let page = dashboard::Dashboard::new(
            feeds.clone(),
            registry.clone(),
            alerts,
            reports,
            // With operator tokens people log in; without them, loopback only and read-only.
            match config.admin_token {
                Some(_) => dashboard::auth::Access::Tokens(operator_auth.clone()),
                None => dashboard::auth::Access::LoopbackOnly,
            },
        )
        .with_trace_url(config.dashboard_trace_url.clone());
        tokio::spawn(dashboard::serve(listener, Arc::new(page), stop_rx.clone()));
    }
    let session_store: Arc<dyn agent_reach_session::SessionStore> = match &config.session_store {
        Some(backend) => backend.0.clone(),
        None => Arc::new(agent_reach_session::KvSessions::new(store.clone(), config.session_limits.clone())),
    };
    let sessions = sessions::SessionService::new(
        session_store.clone(),
        stop_rx.clone(),
        authz.clone(),
        feeds.clone(),
        stats.clone(),
    );
    let idempotency = idempotency::IdempotencyService::new(store.clone(), authz.clone());
    let tasks = tasks::TaskService::new(store.clone(), config.task_limits.clone(), stop_rx.clone(), authz.clone());
    let control = ControlService::new(registry.clone(), feeds, store.clone(), stats, stop_rx, authz);
    let admin = AdminService::new(registry, tokens, operator_auth).with_sessions(session_store);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<ControlServer<ControlService>>().await;
    health_reporter.set_serving::<AdminServer<AdminService>>().await;
    health_reporter.set_serving::<IdentityServer<identity::IdentityService>>().await;
    let router = config
        .grpc_limits
        .apply(tonic::transport::Server::builder(), stats_conn.clone())
        .tcp_nodelay(true)
        .add_service(agent_reach::strict::Strict::<_, tonic_health::pb::HealthCheckRequest>::new(health))
        .add_service(routes::ControlRoutes::new(control))
        .add_service(AdminServer::new(admin))
        .add_service(IdentityServer::new(identity))
        .add_service(agent_reach::proto::sessions_server::SessionsServer::new(sessions))
        .add_service(agent_reach::proto::tasks_server::TasksServer::new(tasks))
        .add_service(agent_reach::proto::idempotency_server::IdempotencyServer::new(idempotency))
        .add_service(agent_reach::reflection::v1(agent_reach::reflection::CONTROL_SERVICES))
        .add_service(agent_reach::reflection::v1alpha(agent_reach::reflection::CONTROL_SERVICES));
    let shutdown = async move {
        shutdown.await;
        // End every watch stream so the graceful shutdown does not wait on them.
        let _ = stop_tx.send(true);
    };
    let gate = conn::Gate::new(&config.grpc_limits, stats_conn);
    let served = match config.mtls {
        identity::Mtls::Off => {
            tracing::warn!(
                "INSECURE: mutual TLS is off (--mtls off): anyone who reaches the control port can act for any \
                 sidecar of any tenant"
            );
            router.serve_with_incoming_shutdown(gate.plaintext(listener), shutdown).await
        }
        mode => {
            if mode == identity::Mtls::Permissive {
                tracing::warn!(
                    "mutual TLS is PERMISSIVE: plaintext connections and Control calls without a sidecar \
                     certificate are let through as anonymous (migration only; use --mtls required)"
                );
            }
            let tls = match identity::server_tls(&identity_config) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("cannot serve TLS: {e}");
                    janitor.abort();
                    return Ok(());
                }
            };
            let renew = tokio::spawn(identity::renew_own_certificate(identity_config.clone(), tls.clone()));
            let admit = {
                let gate = gate.clone();
                move |_| gate.admit()
            };
            let served = if mode == identity::Mtls::Permissive {
                let accepted =
                    agent_reach_identity::net::accept_either_admitted(listener, tls, handshakes, admit, true);
                let incoming = futures_util::StreamExt::map(
                    tokio_stream::wrappers::ReceiverStream::new(accepted),
                    move |accepted| accepted.map(|(io, slot)| gate.guarded(permissive::Either::new(io), slot)),
                );
                router.serve_with_incoming_shutdown(incoming, shutdown).await
            } else {
                let accepted = agent_reach_identity::net::accept_tls_admitted(listener, tls, handshakes, admit);
                let incoming = futures_util::StreamExt::map(
                    tokio_stream::wrappers::ReceiverStream::new(accepted),
                    move |accepted| accepted.map(|(tls, slot)| gate.guarded(tls, slot)),
                );
                router.serve_with_incoming_shutdown(incoming, shutdown).await
            };
            renew.abort();
            served
        }
    };
    janitor.abort();
    served
}

/// A control service running in this process (tests, `agent-reach up` and `demo`).
pub struct ControlHandle {
    addr: std::net::SocketAddr,
    stats: Arc<ControlStats>,
    identity: identity::IdentityConfig,
    /// Stops the admin port, when there is one.
    admin_stop: Option<tokio::sync::watch::Sender<bool>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ControlHandle {
    /// Starts serving on `listener` in a background task.
    pub fn spawn(
        store: Arc<dyn Store>,
        mut config: ControlConfig,
        listener: TcpListener,
    ) -> std::io::Result<ControlHandle> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(ControlStats::default());
        let identity = config.identity.get_or_insert_with(identity::IdentityConfig::development).clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with_stats(store, config, stats.clone(), listener, async move {
            let _ = stopped.await;
        }));
        Ok(ControlHandle { addr, stats, identity, admin_stop: None, stop: Some(stop), task })
    }

    /// Like [`ControlHandle::spawn`], also serving the dashboard on `dashboard` (a loopback
    /// listener).
    pub fn spawn_with_dashboard(
        store: Arc<dyn Store>,
        mut config: ControlConfig,
        listener: TcpListener,
        dashboard: TcpListener,
    ) -> std::io::Result<ControlHandle> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(ControlStats::default());
        let identity = config.identity.get_or_insert_with(identity::IdentityConfig::development).clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_parts(store, config, stats.clone(), listener, Some(dashboard), async move {
            let _ = stopped.await;
        }));
        Ok(ControlHandle { addr, stats, identity, admin_stop: None, stop: Some(stop), task })
    }

    /// Like [`ControlHandle::spawn`], also serving the admin HTTP port on `admin` (it stops
    /// with the handle).
    pub fn spawn_with_admin(
        store: Arc<dyn Store>,
        config: ControlConfig,
        listener: TcpListener,
        admin: TcpListener,
    ) -> std::io::Result<ControlHandle> {
        let mut handle = ControlHandle::spawn(store.clone(), config, listener)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let state = metrics::admin_state(store, handle.stats.clone(), stopped.clone());
        tokio::spawn(agent_reach_telemetry::serve_admin(admin, Arc::new(state), stopped));
        handle.admin_stop = Some(stop);
        Ok(handle)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// "http://host:port", as sidecars are configured.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// This replica's counters.
    pub fn stats(&self) -> &Arc<ControlStats> {
        &self.stats
    }

    /// The CA signing sidecars' certificates (its bundle is what sidecars trust).
    pub fn ca(&self) -> &Arc<agent_reach_identity::Ca> {
        &self.identity.ca
    }

    /// Stops serving: ends every watch stream and closes the listener.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Stops at once, as a crash looks to sidecars: connections are dropped without a
    /// graceful goodbye.
    pub fn kill(self) {
        self.task.abort();
    }
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(stop) = &self.admin_stop {
            let _ = stop.send(true);
        }
    }
}

/// A control replica on a runtime of its own, connected to etcd by its own client.
/// [`ControlReplica::kill`] drops the runtime at once, so to its sidecars it looks exactly
/// like a crashed process: connections reset, nothing said. Tests and the scale benchmark
/// use it; its threads carry a name so their CPU time can be measured.
pub struct ControlReplica {
    runtime: Option<tokio::runtime::Runtime>,
    addr: std::net::SocketAddr,
    stats: Arc<ControlStats>,
}

impl ControlReplica {
    /// Starts serving on `listener` (already bound) with `threads` worker threads named
    /// `thread_name`, on etcd at `etcd_endpoints` (the embedded store when empty).
    pub fn start(
        etcd_endpoints: Vec<String>,
        config: ControlConfig,
        listener: std::net::TcpListener,
        threads: usize,
        thread_name: &str,
    ) -> std::io::Result<ControlReplica> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(thread_name)
            .enable_all()
            .build()?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(ControlStats::default());
        let counters = stats.clone();
        runtime.spawn(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => return tracing::error!("control replica {addr}: {e}"),
            };
            let store =
                match open_store(&etcd_endpoints, std::time::Duration::from_secs(5), &EtcdTlsFiles::default()).await {
                    Ok(s) => s,
                    Err(e) => return tracing::error!("control replica {addr}: {e}"),
                };
            if let Err(e) = serve_with_stats(store, config, counters, listener, std::future::pending()).await {
                tracing::error!("control replica {addr}: {e}");
            }
        });
        Ok(ControlReplica { runtime: Some(runtime), addr, stats })
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// "http://host:port", as sidecars are configured.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// This replica's counters.
    pub fn stats(&self) -> &Arc<ControlStats> {
        &self.stats
    }

    /// Stops the replica abruptly (see the type's documentation).
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for ControlReplica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod etcd_user_tests {
    use super::EtcdTlsFiles;

    #[test]
    fn the_etcd_password_is_read_from_its_file_without_the_newline() {
        let dir = std::env::temp_dir().join(format!("ar-etcd-user-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("password");
        std::fs::write(&path, "s3cret\n").unwrap();
        let files =
            EtcdTlsFiles { username: Some("u".into()), password_file: Some(path.clone()), ..Default::default() };
        let user = files.user().unwrap().unwrap();
        assert_eq!((user.name.as_str(), user.password.as_str()), ("u", "s3cret"));
        assert!(!format!("{user:?}").contains("s3cret"), "the password is never printed");
        std::fs::write(&path, "\n").unwrap();
        assert!(files.user().unwrap_err().contains("--etcd-password-file"));
        let missing = EtcdTlsFiles { password_file: Some(dir.join("none")), ..files };
        assert!(missing.user().unwrap_err().contains("--etcd-password-file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
