//! The Agent-Reach control service: stateless, several replicas on one store.
//!
//! It stores registrations on leases ([`registry`]), renews them from sidecars' batched
//! heartbeats, and streams each tenant's instances to every sidecar as a snapshot followed
//! by deltas in revision order ([`watch`]). All state lives in the store
//! (`agent_reach_store`): etcd in production, the embedded store in development.
//! Admin API, policies and multi-replica fan-out are not built yet.
//!
//! [`serve`] takes an already-bound listener and a shutdown future; every watch stream ends
//! on shutdown.

pub mod config;
pub mod keys;
pub mod registry;
pub mod service;
pub mod watch;

use std::future::Future;
use std::sync::Arc;

use agent_reach::proto::control_server::ControlServer;
use agent_reach_store::{EmbeddedStore, EtcdOptions, EtcdStore, EtcdTls, Store};
use tokio::net::TcpListener;

pub use config::{ControlArgs, ControlConfig};
pub use registry::Registry;
pub use service::ControlService;

/// Files of the TLS connection to etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdTlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

impl EtcdTlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
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
    let tls = if tls.is_empty() { None } else { Some(tls.load()?) };
    let store = EtcdStore::connect(EtcdOptions {
        endpoints: etcd_endpoints.to_vec(),
        connect_timeout: timeout,
        request_timeout: timeout,
        tls,
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
    };
    let store = open_store(&args.etcd_endpoints, args.etcd_timeout, &tls).await?;
    let listener = TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    tracing::info!(listen = %args.listen, store = store.backend(), lease_ttl = ?config.lease_ttl, "control service started");
    serve(store, config, listener, agent_reach::process::shutdown_signal()).await.map_err(|e| e.to_string())
}

/// Serves the Control API (and grpc.health.v1) on `listener` until `shutdown` completes.
pub async fn serve(
    store: Arc<dyn Store>,
    config: ControlConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let registry = Registry::new(store, config.lease_ttl);
    let service = ControlService::new(registry, stop_rx);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<ControlServer<ControlService>>().await;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(ControlServer::new(service))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            // End every watch stream so the graceful shutdown does not wait on them.
            let _ = stop_tx.send(true);
        })
        .await
}

/// A control service running in this process (tests, `agent-reach up` and `demo`).
pub struct ControlHandle {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ControlHandle {
    /// Starts serving on `listener` in a background task.
    pub fn spawn(
        store: Arc<dyn Store>,
        config: ControlConfig,
        listener: TcpListener,
    ) -> std::io::Result<ControlHandle> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(store, config, listener, async move {
            let _ = stopped.await;
        }));
        Ok(ControlHandle { addr, stop: Some(stop), task })
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// "http://host:port", as sidecars are configured.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving: ends every watch stream and closes the listener.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
