//! The sidecar's TLS toward the control service: its identity settings, the client
//! configuration (without a certificate until the first one arrives, with the current one
//! afterwards) and the tonic connector that dials with it. Buying and renewing the
//! certificate is [`crate::workload`]'s, built on top of this and the control clients.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach_identity::TlsConfigs;
use arc_swap::ArcSwapOption;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What the sidecar needs to get its identity.
#[derive(Clone)]
pub struct IdentitySettings {
    pub trust_domain: String,
    /// The CAs control's certificate is checked against (PEM).
    pub trust_bundle_pem: String,
    /// The join token buying the first certificate.
    pub join_token: String,
}

impl std::fmt::Debug for IdentitySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("IdentitySettings").field("trust_domain", &self.trust_domain).finish_non_exhaustive()
    }
}

/// Why the sidecar has no identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Identity(#[from] agent_reach_identity::IdentityError),
    #[error("control refused the certificate: {}", .0.message())]
    Refused(tonic::Status),
}

/// The TLS configuration toward control: without a certificate until the first one
/// arrives, with the current one afterwards.
pub struct ControlTls {
    bootstrap: Arc<rustls::ClientConfig>,
    workload: ArcSwapOption<TlsConfigs>,
}

impl ControlTls {
    pub fn new(settings: &IdentitySettings) -> Result<ControlTls, IdentityError> {
        let bootstrap =
            agent_reach_identity::tls::bootstrap_client(&settings.trust_bundle_pem, &settings.trust_domain)?;
        Ok(ControlTls { bootstrap: Arc::new(bootstrap), workload: ArcSwapOption::empty() })
    }

    /// The configuration for the next connection.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        match &*self.workload.load() {
            Some(configs) => configs.client(),
            None => self.bootstrap.clone(),
        }
    }

    /// The current certificate's configurations, once there is one.
    pub fn workload(&self) -> Option<Arc<TlsConfigs>> {
        self.workload.load_full()
    }

    /// Uses `configs` (a new certificate) for the next connections.
    pub fn install(&self, configs: TlsConfigs) {
        self.workload.store(Some(Arc::new(configs)));
    }
}

/// A tonic connector dialling TCP and completing TLS with the configuration `config`
/// returns at each connection.
#[derive(Clone)]
pub struct TlsConnector {
    pub config: Arc<dyn Fn() -> Arc<rustls::ClientConfig> + Send + Sync>,
}

impl TlsConnector {
    /// Connections with [`ControlTls`]'s current configuration.
    pub fn control(tls: Arc<ControlTls>) -> TlsConnector {
        TlsConnector { config: Arc::new(move || tls.client_config()) }
    }

    /// Connections with one fixed configuration.
    pub fn fixed(config: Arc<rustls::ClientConfig>) -> TlsConnector {
        TlsConnector { config: Arc::new(move || config.clone()) }
    }

    /// A lazily connecting channel to `endpoint` ("http://host:port") through this connector.
    pub fn channel(self, endpoint: &str) -> Result<tonic::transport::Channel, String> {
        let ep = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?;
        Ok(ep.connect_with_connector_lazy(self))
    }
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = (self.config)();
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| std::io::Error::other(format!("no host in {uri}")))?;
            let addr =
                format!("{}:{}", host.trim_start_matches('[').trim_end_matches(']'), uri.port_u16().unwrap_or(443));
            let tls = agent_reach_identity::net::connect_tls(&addr, config).await?;
            Ok(TokioIo::new(tls))
        })
    }
}
