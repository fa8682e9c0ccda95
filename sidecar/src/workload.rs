//! The sidecar's workload certificate over its lifetime.
//!
//! At start the sidecar makes its own key pair and a CSR for
//! `spiffe://<trust-domain>/tenant/<tenant>/sidecar/<sidecar-id>`, and buys its first
//! certificate from control's `Identity.IssueCertificate` with a join token, over TLS that
//! checks control's certificate against the configured trust bundle. From then on every
//! connection to control presents that certificate. At two thirds of its lifetime the
//! sidecar makes a new key and CSR and renews over mutual TLS with the current
//! certificate; the new one (and the trust bundle that came with it) is swapped into the
//! TLS configuration for the next connections ([`crate::identity::ControlTls`]), while open
//! ones carry on. The private key never leaves this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use agent_reach::proto;
use agent_reach_identity::{ClientAuth, Credentials, ExpectedPeer, TlsConfigs, WorkloadId, WorkloadKey};
use tokio::sync::watch;

use crate::control::ControlClients;
use crate::identity::{ControlTls, IdentityError, IdentitySettings};

/// Counters of the sidecar's certificates.
#[derive(Debug, Default)]
pub struct IdentityStats {
    /// Certificates received (the first one and every renewal).
    pub issued: AtomicU64,
    pub renewal_failures: AtomicU64,
}

/// A sidecar's identity at run time: its TLS toward control (and the mesh), its id and
/// certificate counters.
pub struct Workload {
    pub tls: Arc<ControlTls>,
    pub id: WorkloadId,
    pub stats: Arc<IdentityStats>,
}

impl Workload {
    /// Buys the first certificate for the sidecar `config` describes, when it has identity
    /// settings; `None` (with a warning) when it has none.
    pub async fn start(config: &crate::SidecarConfig) -> Result<Option<Workload>, crate::StartError> {
        let Some(settings) = &config.identity else {
            tracing::warn!(
                "no identity (--trust-bundle-file, --join-token-file): plaintext to control and on the mesh \
                 port, where the ar-tenant header is trusted as sent"
            );
            return Ok(None);
        };
        let id = WorkloadId::new(&settings.trust_domain, &config.tenant, &config.sidecar_id);
        let workload =
            Workload { tls: Arc::new(ControlTls::new(settings)?), id, stats: Arc::new(IdentityStats::default()) };
        // The first certificate over connections of their own, without a client
        // certificate; they close afterwards, so no Control call ever rides on them.
        let clients = ControlClients::with_tls(
            &config.control,
            config.control_timeout,
            Some(Arc::new(ControlTls::new(settings)?)),
        )
        .map_err(crate::StartError::Config)?;
        bootstrap(&clients, &workload.tls, &workload.id, settings, &workload.stats).await?;
        Ok(Some(workload))
    }

    /// Renews the certificate until `shutdown` (see [`run_renewals`]).
    pub fn renewals(
        &self,
        control: Arc<ControlClients>,
        shutdown: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send + 'static {
        run_renewals(control, self.tls.clone(), self.id.clone(), self.stats.clone(), shutdown)
    }
}

/// Buys a certificate for `id` (with the join token, or with the current certificate
/// when `join_token` is empty) and returns its credentials.
async fn issue(control: &ControlClients, id: &WorkloadId, join_token: &str) -> Result<Credentials, IdentityError> {
    let key = WorkloadKey::generate()?;
    let request = proto::IssueCertificateRequest {
        tenant: id.tenant.clone(),
        sidecar_id: id.sidecar.clone(),
        csr_pem: key.csr_pem(id)?,
        join_token: join_token.to_string(),
    };
    let reply = control.issue_certificate(request).await.map_err(IdentityError::Refused)?;
    Ok(Credentials::from_parts(&reply.certificate_pem, key.private_key_der(), &reply.trust_bundle_pem)?)
}

/// Buys the first certificate with the join token and installs it into `tls`.
pub async fn bootstrap(
    control: &ControlClients,
    tls: &ControlTls,
    id: &WorkloadId,
    settings: &IdentitySettings,
    stats: &IdentityStats,
) -> Result<(), IdentityError> {
    let creds = issue(control, id, &settings.join_token).await?;
    tracing::info!(identity = %id, not_after_ms = unix_ms(creds.info.not_after), "got a workload certificate");
    let configs = TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain)?;
    tls.install(configs);
    stats.issued.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Renews the certificate at two thirds of its lifetime until `shutdown`; after a failed
/// renewal it tries again after a tenth of the remaining lifetime (at least 1 s, at most
/// 1 min).
pub async fn run_renewals(
    control: Arc<ControlClients>,
    tls: Arc<ControlTls>,
    id: WorkloadId,
    stats: Arc<IdentityStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut wait = match tls.workload() {
        Some(configs) => configs.info().renew_in(SystemTime::now()),
        None => return,
    };
    loop {
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let Some(configs) = tls.workload() else { return };
        match issue(&control, &id, "").await.and_then(|creds| Ok(configs.update(creds)?)) {
            Ok(()) => {
                stats.issued.fetch_add(1, Ordering::Relaxed);
                let info = configs.info();
                tracing::info!(identity = %id, not_after_ms = unix_ms(info.not_after), "renewed the workload certificate");
                wait = info.renew_in(SystemTime::now());
            }
            Err(e) => {
                stats.renewal_failures.fetch_add(1, Ordering::Relaxed);
                let left = until(configs.info().not_after);
                wait = (left / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
                tracing::warn!(identity = %id, "cannot renew the workload certificate ({left:?} left): {e}");
            }
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO)
}
