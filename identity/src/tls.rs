//! TLS 1.3 with client certificates for the mesh's links, on rustls with `ring`.
//!
//! [`TlsConfigs`] holds a workload's current server and client configurations; a renewed
//! certificate or a new trust bundle is swapped in with [`TlsConfigs::update`] and applies
//! to the next handshake, while connections already open keep going. Peers are checked
//! against the trust bundle (one or two CAs) and must carry a SPIFFE id of the same trust
//! domain; which tenant or sidecar may do what is decided by the caller of
//! [`peer_identity`], not here. Server names are not used: identities are SPIFFE ids.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use crate::IdentityError;
use crate::spiffe::PeerId;
use crate::workload::{CertInfo, cert_info};

/// The server name clients put in their handshakes (identities are checked by SPIFFE id).
pub const SERVER_NAME: &str = "agent-reach.mesh";

/// The `ring` crypto provider.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of a PEM text.
pub fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, IdentityError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| IdentityError::InvalidCertificate(e.to_string()))?;
    if certs.is_empty() {
        return Err(IdentityError::InvalidCertificate("no certificate in PEM".into()));
    }
    Ok(certs)
}

/// The private key of a PEM text.
pub fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, IdentityError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| IdentityError::InvalidKey(e.to_string()))
}

/// Whether a server requires client certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// Every client presents a certificate of the trust bundle (the default).
    Required,
    /// Clients without a certificate are let in as anonymous (migration only).
    Permissive,
}

/// Which peers a client accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpectedPeer {
    /// The control service of the trust domain.
    Control,
    /// Any sidecar or the control service of the trust domain.
    AnyInTrustDomain,
}

/// A workload's certificate chain, key and the trust bundle to check peers with.
pub struct Credentials {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub bundle: Vec<CertificateDer<'static>>,
    pub info: CertInfo,
}

impl Credentials {
    /// From PEM texts: the certificate (chain), its key and the trust bundle.
    pub fn from_pem(cert_pem: &str, key_pem: &str, bundle_pem: &str) -> Result<Credentials, IdentityError> {
        let chain = parse_certs(cert_pem)?;
        let info = cert_info(&chain[0])?;
        Ok(Credentials { chain, key: parse_key(key_pem)?, bundle: parse_certs(bundle_pem)?, info })
    }

    /// From a signed certificate (PEM), a key made here, and the trust bundle (PEM).
    pub fn from_parts(
        cert_pem: &str,
        key: PrivateKeyDer<'static>,
        bundle_pem: &str,
    ) -> Result<Credentials, IdentityError> {
        let chain = parse_certs(cert_pem)?;
        let info = cert_info(&chain[0])?;
        Ok(Credentials { chain, key, bundle: parse_certs(bundle_pem)?, info })
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, IdentityError> {
        let mut roots = RootCertStore::empty();
        for ca in &self.bundle {
            roots.add(ca.clone()).map_err(|e| IdentityError::InvalidCertificate(format!("trust bundle: {e}")))?;
        }
        Ok(Arc::new(roots))
    }
}

/// A workload's current TLS configurations, swappable while connections stay open.
pub struct TlsConfigs {
    server: ArcSwap<ServerConfig>,
    client: ArcSwap<ClientConfig>,
    info: ArcSwap<CertInfo>,
    client_auth: ClientAuth,
    expect: ExpectedPeer,
}

impl TlsConfigs {
    pub fn new(creds: Credentials, client_auth: ClientAuth, expect: ExpectedPeer) -> Result<TlsConfigs, IdentityError> {
        let (server, client) = build(&creds, client_auth, &expect)?;
        Ok(TlsConfigs {
            server: ArcSwap::from_pointee(server),
            client: ArcSwap::from_pointee(client),
            info: ArcSwap::from_pointee(creds.info),
            client_auth,
            expect,
        })
    }

    /// Swaps in new credentials for the next handshakes.
    pub fn update(&self, creds: Credentials) -> Result<(), IdentityError> {
        let (server, client) = build(&creds, self.client_auth, &self.expect)?;
        self.server.store(Arc::new(server));
        self.client.store(Arc::new(client));
        self.info.store(Arc::new(creds.info));
        Ok(())
    }

    /// The configuration for the next accepted connection.
    pub fn server(&self) -> Arc<ServerConfig> {
        self.server.load_full()
    }

    /// The configuration for the next outgoing connection.
    pub fn client(&self) -> Arc<ClientConfig> {
        self.client.load_full()
    }

    /// What the current certificate says.
    pub fn info(&self) -> Arc<CertInfo> {
        self.info.load_full()
    }

    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth
    }
}

fn build(
    creds: &Credentials,
    client_auth: ClientAuth,
    expect: &ExpectedPeer,
) -> Result<(ServerConfig, ClientConfig), IdentityError> {
    let tls = |e: rustls::Error| IdentityError::Tls(e.to_string());
    let provider = provider();
    let roots = creds.roots()?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
    let verifier = match client_auth {
        ClientAuth::Required => verifier,
        ClientAuth::Permissive => verifier.allow_unauthenticated(),
    }
    .build()
    .map_err(|e| IdentityError::Tls(e.to_string()))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(tls)?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeVerifier {
            roots,
            provider,
            trust_domain: creds.info.peer.trust_domain().to_string(),
            expect: expect.clone(),
        }))
        .with_client_auth_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(tls)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok((server, client))
}

/// A client configuration without a certificate of its own, trusting `bundle_pem` and
/// expecting the control service of `trust_domain`: what a sidecar uses to buy its first
/// certificate.
pub fn bootstrap_client(bundle_pem: &str, trust_domain: &str) -> Result<ClientConfig, IdentityError> {
    client_without_certificate(bundle_pem, trust_domain, ExpectedPeer::Control)
}

/// A client configuration without a certificate of its own, trusting `bundle_pem` and
/// expecting a peer of `trust_domain` as `expect` says (a server that requires client
/// certificates refuses it).
pub fn client_without_certificate(
    bundle_pem: &str,
    trust_domain: &str,
    expect: ExpectedPeer,
) -> Result<ClientConfig, IdentityError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for ca in parse_certs(bundle_pem)? {
        roots.add(ca).map_err(|e| IdentityError::InvalidCertificate(format!("trust bundle: {e}")))?;
    }
    let mut client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| IdentityError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeVerifier {
            roots: Arc::new(roots),
            provider,
            trust_domain: trust_domain.to_string(),
            expect,
        }))
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(client)
}

/// Checks a server's chain against the trust bundle and its SPIFFE id against what the
/// client expects (instead of a DNS name).
#[derive(Debug)]
struct SpiffeVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    trust_domain: String,
    expect: ExpectedPeer,
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let peer = cert_info(end_entity).map_err(|e| rustls::Error::General(format!("server identity: {e}")))?.peer;
        let ok = peer.trust_domain() == self.trust_domain
            && match self.expect {
                ExpectedPeer::Control => matches!(peer, PeerId::Control { .. }),
                ExpectedPeer::AnyInTrustDomain => true,
            };
        if !ok {
            return Err(rustls::Error::General(format!("unexpected server identity {peer}")));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The identity of a connection's peer from its certificate chain (already verified by
/// the handshake); `None` when it presented none (permissive mode).
pub fn peer_identity(certs: Option<&[CertificateDer<'_>]>) -> Result<Option<PeerId>, IdentityError> {
    match certs.and_then(|c| c.first()) {
        None => Ok(None),
        Some(leaf) => Ok(Some(cert_info(leaf)?.peer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::Ca;
    use crate::spiffe::WorkloadId;
    use std::time::{Duration, SystemTime};

    #[test]
    fn configs_build_and_swap() {
        let ca = Ca::generate("mesh.test").unwrap();
        let id = WorkloadId::new("mesh.test", "a", "s1");
        let now = SystemTime::now();
        let (issued, key) = ca.issue_with_key(&id.uri(), now, now + Duration::from_secs(60)).unwrap();
        let creds = Credentials::from_pem(&issued.cert_pem, &key, ca.bundle_pem()).unwrap();
        let configs = TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain).unwrap();
        let first = configs.server();
        let (issued, key) = ca.issue_with_key(&id.uri(), now, now + Duration::from_secs(120)).unwrap();
        configs.update(Credentials::from_pem(&issued.cert_pem, &key, ca.bundle_pem()).unwrap()).unwrap();
        assert!(!Arc::ptr_eq(&first, &configs.server()));
        assert_eq!(configs.info().peer, PeerId::Sidecar(id));
        assert_eq!(configs.server().alpn_protocols, vec![b"h2".to_vec()]);
    }
}
