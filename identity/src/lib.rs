//! Workload identity of the mesh: who a sidecar or the control service is, proven by an
//! X.509 certificate.
//!
//! - [`spiffe`]: the identities, as SPIFFE ids
//!   (`spiffe://<trust-domain>/tenant/<tenant>/sidecar/<sidecar-id>` for a sidecar,
//!   `spiffe://<trust-domain>/control` for the control service);
//! - [`ca`]: the certificate authority that signs certificate signing requests (CSRs) with
//!   short lifetimes, from PEM files or generated (development);
//! - [`workload`]: a workload's own key pair and CSR (private keys never leave the process
//!   that made them), and what a certificate says (identity, validity);
//! - [`tls`]: TLS 1.3 configurations with client certificates for both ends of a link,
//!   swappable while connections stay open, and the peer identity of a connection;
//! - [`net`]: TLS handshakes on accepted and outgoing TCP connections.
//!
//! Everything uses rustls with the `ring` provider. This crate knows nothing of gRPC, the
//! store or tenants' state: it decides who someone is, not what they may do.

pub mod ca;
pub mod net;
pub mod spiffe;
pub mod tls;
pub mod workload;

pub use ca::{Ca, Issued};
pub use spiffe::{PeerId, WorkloadId};
pub use tls::{ClientAuth, Credentials, ExpectedPeer, TlsConfigs};
pub use workload::{CertInfo, WorkloadKey, cert_info};

/// Why an identity operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("invalid identity {0:?}: {1}")]
    InvalidId(String, String),
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    #[error("invalid certificate: {0}")]
    InvalidCertificate(String),
    #[error("invalid private key: {0}")]
    InvalidKey(String),
    #[error("certificate authority: {0}")]
    Ca(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// Default lifetime of a sidecar's certificate.
pub const DEFAULT_CERT_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Default trust domain.
pub const DEFAULT_TRUST_DOMAIN: &str = "agent-reach.local";
