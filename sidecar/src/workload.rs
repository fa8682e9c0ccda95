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
//! ones carry on. The private key never leaves this process, except into the sidecar's
//! own `--identity-file` (mode 0600, see [`crate::identity_file`]), from which a restart
//! while control is unreachable takes its certificate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use agent_reach::proto;
use agent_reach_identity::{ClientAuth, Credentials, ExpectedPeer, TlsConfigs, WorkloadId, WorkloadKey};
use tokio::sync::watch;

use crate::control::ControlClients;
use crate::identity::{ControlTls, IdentityError, IdentitySettings};
use crate::identity_file::{IdentityFile, Issued, fresh};

/// Counters of the sidecar's certificates.
#[derive(Debug, Default)]
pub struct IdentityStats {
    /// Certificates received (the first one and every renewal).
    pub issued: AtomicU64,
    /// Renewals that failed (each is retried).
    pub renewal_failures: AtomicU64,
}

/// A sidecar's identity at run time: its TLS toward control (and the mesh), its id and
/// certificate counters.
pub(crate) struct Workload {
    pub(crate) tls: Arc<ControlTls>,
    pub(crate) id: WorkloadId,
    pub(crate) stats: Arc<IdentityStats>,
    /// Where every certificate received is kept (`--identity-file`).
    file: Option<Arc<IdentityFile>>,
}

impl Workload {
    /// Buys the first certificate for the sidecar `config` describes, when it has identity
    /// settings; `None` (with a warning) when it has none.
    pub(crate) async fn start(
        config: &crate::config::SidecarConfig,
    ) -> Result<Option<Workload>, crate::error::StartError> {
        let Some(settings) = &config.identity else {
            tracing::warn!(
                "no identity (--trust-bundle-file, --join-token-file): plaintext to control and on the mesh \
                 port, where the ar-tenant header is trusted as sent"
            );
            return Ok(None);
        };
        let id = WorkloadId::new(&settings.trust_domain, &config.tenant, &config.sidecar_id);
        let workload = Workload {
            tls: Arc::new(ControlTls::new(settings)?),
            id,
            stats: Arc::new(IdentityStats::default()),
            file: config.identity_file.clone().map(|path| Arc::new(IdentityFile::new(path))),
        };
        // A saved certificate before its renewal point is used as is: no control needed.
        let now = SystemTime::now();
        let saved = workload.file.as_ref().and_then(|file| match file.load(&workload.id, now) {
            Ok(creds) => creds,
            Err(e) => {
                tracing::warn!(path = %file.path().display(), "ignoring the saved workload certificate: {e}");
                None
            }
        });
        let saved = match saved {
            Some(creds) if fresh(&creds.info, now) => {
                tracing::info!(identity = %workload.id, not_after_ms = unix_ms(creds.info.not_after),
                    "using the saved workload certificate");
                install(&workload.tls, creds)?;
                return Ok(Some(workload));
            }
            other => other,
        };
        // The first certificate over connections of their own, without a client
        // certificate; they close afterwards, so no Control call ever rides on them.
        let clients = ControlClients::with_tls(
            &config.control,
            config.control_timeout,
            Some(Arc::new(ControlTls::new(settings)?)),
        )
        .map_err(crate::error::StartError::Config)?;
        match bootstrap(&clients, &workload, settings).await {
            Ok(()) => {}
            // Past its renewal point but not expired: better than not starting.
            Err(e) if saved.is_some() => {
                tracing::warn!(identity = %workload.id, "no new certificate ({e}); using the saved one until it expires");
                install(&workload.tls, saved.expect("checked"))?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Some(workload))
    }

    /// Renews the certificate until `shutdown` (see [`run_renewals`]).
    pub(crate) fn renewals(
        &self,
        control: Arc<ControlClients>,
        shutdown: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send + 'static {
        run_renewals(control, self.tls.clone(), self.id.clone(), self.stats.clone(), self.file.clone(), shutdown)
    }
}

/// Keeps a certificate just received in `file`, if any (a failure only costs the next
/// start without control).
fn keep(file: Option<&IdentityFile>, id: &WorkloadId, issued: &Issued) {
    if let Some(file) = file
        && let Err(e) = file.save(id, issued)
    {
        tracing::warn!(path = %file.path().display(), "cannot save the workload certificate: {e}");
    }
}

/// Makes `creds` the sidecar's certificate.
fn install(tls: &ControlTls, creds: Credentials) -> Result<(), IdentityError> {
    tls.install(TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain)?);
    Ok(())
}

/// Buys a certificate for `id` (with the join token, or with the current certificate
/// when `join_token` is empty).
async fn issue(control: &ControlClients, id: &WorkloadId, join_token: &str) -> Result<Issued, IdentityError> {
    let key = WorkloadKey::generate()?;
    let request = proto::IssueCertificateRequest {
        tenant: id.tenant.clone(),
        sidecar_id: id.sidecar.clone(),
        csr_pem: key.csr_pem(id)?,
        join_token: join_token.to_string(),
    };
    let reply = control.issue_certificate(request).await.map_err(IdentityError::Refused)?;
    Ok(Issued {
        certificate_pem: reply.certificate_pem,
        key_pkcs8: key.private_key_der().secret_der().to_vec(),
        trust_bundle_pem: reply.trust_bundle_pem,
    })
}

/// Buys the first certificate with the join token, installs it and keeps it.
async fn bootstrap(
    control: &ControlClients,
    workload: &Workload,
    settings: &IdentitySettings,
) -> Result<(), IdentityError> {
    let issued = issue(control, &workload.id, &settings.join_token).await?;
    let creds = issued.credentials()?;
    let not_after_ms = unix_ms(creds.info.not_after);
    install(&workload.tls, creds)?;
    tracing::info!(identity = %workload.id, not_after_ms, "got a workload certificate");
    keep(workload.file.as_deref(), &workload.id, &issued);
    workload.stats.issued.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Renews the certificate at two thirds of its lifetime until `shutdown`; after a failed
/// renewal it tries again after a tenth of the remaining lifetime (at least 1 s, at most
/// 1 min).
pub(crate) async fn run_renewals(
    control: Arc<ControlClients>,
    tls: Arc<ControlTls>,
    id: WorkloadId,
    stats: Arc<IdentityStats>,
    file: Option<Arc<IdentityFile>>,
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
        let renewed = issue(&control, &id, "").await.and_then(|issued| {
            configs.update(issued.credentials()?)?;
            Ok(issued)
        });
        match renewed {
            Ok(issued) => {
                keep(file.as_deref(), &id, &issued);
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
