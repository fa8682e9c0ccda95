//! The identity service (`agentreach.v1.Identity`): control's certificate authority signs
//! the CSRs sidecars make with their own keys, for
//! `spiffe://<trust-domain>/tenant/<tenant>/sidecar/<sidecar-id>`, valid for a short time
//! (24 h by default).
//!
//! A sidecar's first certificate is bought with a credential an [`Authenticator`] checks:
//! a join token of the tenant ([`JoinTokenAuthenticator`], see [`tokens`]); a Kubernetes
//! service-account authenticator can follow behind the same trait. A renewal presents the
//! current certificate over mutual TLS instead, and may only renew that same identity.
//! This module decides who gets a certificate; what a certificate's holder may do is
//! decided where calls arrive.

pub mod authz;
pub mod operators;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use agent_reach::model::{validate_name, validate_tenant};
use agent_reach::proto;
use agent_reach_identity::{Ca, ClientAuth, Credentials, ExpectedPeer, PeerId, TlsConfigs, WorkloadId};
use tonic::{Request, Response, Status};

use crate::error::ControlError;
pub use crate::error::TokenRefusal;
pub use authz::{Authorizer, Mtls};
pub use operators::{Action, OperatorAuth, Principal, Role};
pub use tokens::{JoinToken, JoinTokens};

/// What an authenticator vouches for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    /// Who was authenticated, for the log ("join-token:3f9a…").
    pub subject: String,
}

/// Decides whether a bootstrap credential entitles its holder to a certificate.
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// Checks `credential` for a certificate of `sidecar` in `tenant`; an error says why
    /// not (with its reason).
    async fn authenticate(&self, credential: &str, tenant: &str, sidecar: &str) -> Result<Authenticated, ControlError>;
}

/// Join tokens as bootstrap credentials.
pub struct JoinTokenAuthenticator {
    tokens: Arc<JoinTokens>,
}

impl JoinTokenAuthenticator {
    pub fn new(tokens: Arc<JoinTokens>) -> JoinTokenAuthenticator {
        JoinTokenAuthenticator { tokens }
    }
}

#[async_trait::async_trait]
impl Authenticator for JoinTokenAuthenticator {
    async fn authenticate(&self, credential: &str, tenant: &str, sidecar: &str) -> Result<Authenticated, ControlError> {
        match self.tokens.redeem(credential, tenant, sidecar).await? {
            Ok(token) => Ok(Authenticated { subject: format!("join-token:{}", token.id) }),
            Err(refusal) => Err(ControlError::Refused(refusal)),
        }
    }
}

/// The certificate authority and how long its certificates live.
#[derive(Clone)]
pub struct IdentityConfig {
    pub ca: Arc<Ca>,
    pub cert_ttl: Duration,
}

impl IdentityConfig {
    /// A CA generated in memory for development, with the default trust domain and
    /// certificate lifetime. Logged loudly: nothing else trusts it.
    pub fn development() -> IdentityConfig {
        // Generating an ECDSA key and self-signing with the default trust domain only
        // fails without a random source, when nothing else would work either.
        let ca = Ca::generate(agent_reach_identity::DEFAULT_TRUST_DOMAIN).expect("generate a development CA");
        tracing::warn!("no CA configured: generated a development CA in memory");
        IdentityConfig { ca: Arc::new(ca), cert_ttl: agent_reach_identity::DEFAULT_CERT_TTL }
    }
}

impl std::fmt::Debug for IdentityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityConfig")
            .field("trust_domain", &self.ca.trust_domain())
            .field("cert_ttl", &self.cert_ttl)
            .finish()
    }
}

/// The Identity service.
pub struct IdentityService {
    config: IdentityConfig,
    authenticator: Arc<dyn Authenticator>,
}

impl IdentityService {
    pub fn new(config: IdentityConfig, authenticator: Arc<dyn Authenticator>) -> IdentityService {
        IdentityService { config, authenticator }
    }

    async fn issue(
        &self,
        peer: Option<PeerId>,
        r: proto::IssueCertificateRequest,
    ) -> Result<proto::IssueCertificateReply, ControlError> {
        validate_tenant("tenant", &r.tenant)?;
        validate_name("sidecar_id", &r.sidecar_id)?;
        let id = WorkloadId::new(self.config.ca.trust_domain(), &r.tenant, &r.sidecar_id);
        id.validate().map_err(|e| agent_reach::model::FieldError::new("sidecar_id", e.to_string()))?;
        let subject = if r.join_token.is_empty() {
            match peer {
                Some(PeerId::Sidecar(current)) if current == id => format!("certificate:{current}"),
                Some(PeerId::Sidecar(current)) if current.tenant != id.tenant => {
                    return Err(ControlError::TenantMismatch {
                        field: "tenant".into(),
                        claimed: id.tenant,
                        verified: current.tenant,
                    });
                }
                Some(PeerId::Sidecar(current)) => {
                    return Err(ControlError::SidecarMismatch { claimed: id.sidecar, verified: current.sidecar });
                }
                _ => {
                    return Err(ControlError::Unauthenticated(
                        "a join token, or the current certificate over mutual TLS, is required".into(),
                    ));
                }
            }
        } else {
            self.authenticator.authenticate(&r.join_token, &r.tenant, &r.sidecar_id).await?.subject
        };
        let uri = id.uri();
        let issued = self.config.ca.sign_csr(&r.csr_pem, &uri, self.config.cert_ttl)?;
        let not_after_ms = tokens::unix_ms(issued.not_after);
        tracing::info!(identity = %uri, by = %subject, not_after_ms, "issued a workload certificate");
        Ok(proto::IssueCertificateReply {
            certificate_pem: issued.cert_pem,
            trust_bundle_pem: self.config.ca.bundle_pem().to_string(),
            not_after_unix_ms: not_after_ms as i64,
            spiffe_id: uri,
        })
    }
}

/// The verified identity of a request's peer, from its TLS certificate (none over
/// plaintext or without a client certificate).
pub fn request_peer<T>(request: &Request<T>) -> Option<PeerId> {
    if let Some(crate::permissive::ConnPeer(peer)) = request.extensions().get::<crate::permissive::ConnPeer>() {
        return peer.clone();
    }
    let certs = request.peer_certs()?;
    agent_reach_identity::tls::peer_identity(Some(&certs)).ok().flatten()
}

#[tonic::async_trait]
impl proto::identity_server::Identity for IdentityService {
    async fn issue_certificate(
        &self,
        request: Request<proto::IssueCertificateRequest>,
    ) -> Result<Response<proto::IssueCertificateReply>, Status> {
        let peer = request_peer(&request);
        self.issue(peer, request.into_inner()).await.map(Response::new).map_err(Status::from)
    }
}

/// Lifetime of the control service's own server certificate.
const CONTROL_CERT_TTL: Duration = Duration::from_secs(24 * 3600);

/// The control port's TLS configuration: a server certificate for
/// `spiffe://<trust-domain>/control` from the CA, and client certificates checked against
/// the trust bundle but not required at the handshake (a sidecar without a certificate
/// yet must reach `Identity.IssueCertificate`; the Control calls refuse it).
pub fn server_tls(config: &IdentityConfig) -> Result<Arc<TlsConfigs>, agent_reach_identity::IdentityError> {
    let (issued, key) = config.ca.issue_control(CONTROL_CERT_TTL)?;
    let creds = Credentials::from_pem(&issued.cert_pem, &key, config.ca.bundle_pem())?;
    Ok(Arc::new(TlsConfigs::new(creds, ClientAuth::Permissive, ExpectedPeer::AnyInTrustDomain)?))
}

/// Renews the control service's own certificate at two thirds of its lifetime, forever.
pub async fn renew_own_certificate(config: IdentityConfig, tls: Arc<TlsConfigs>) {
    loop {
        let due = tls.info().renew_in(std::time::SystemTime::now());
        tokio::time::sleep(due.max(Duration::from_secs(1))).await;
        let renewed = config
            .ca
            .issue_control(CONTROL_CERT_TTL)
            .and_then(|(issued, key)| Credentials::from_pem(&issued.cert_pem, &key, config.ca.bundle_pem()))
            .and_then(|creds| tls.update(creds));
        if let Err(e) = renewed {
            tracing::error!("cannot renew the control service's certificate: {e}");
        }
    }
}
