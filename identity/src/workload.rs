//! A workload's side of identity: its own key pair (made in the process that uses it and
//! never sent anywhere), the certificate signing request it sends to the control service,
//! and what a certificate says (identity and validity), read with `x509-parser`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::IdentityError;
use crate::spiffe::{PeerId, WorkloadId};

/// A workload's private key (ECDSA P-256).
pub struct WorkloadKey {
    key: KeyPair,
}

impl WorkloadKey {
    pub fn generate() -> Result<WorkloadKey, IdentityError> {
        Ok(WorkloadKey { key: KeyPair::generate().map_err(|e| IdentityError::InvalidKey(e.to_string()))? })
    }

    /// A CSR for `id`, signed with this key.
    pub fn csr_pem(&self, id: &WorkloadId) -> Result<String, IdentityError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(
            id.uri().try_into().map_err(|e: rcgen::Error| IdentityError::InvalidId(id.uri(), e.to_string()))?,
        )];
        let csr = params.serialize_request(&self.key).map_err(|e| IdentityError::InvalidCsr(e.to_string()))?;
        csr.pem().map_err(|e| IdentityError::InvalidCsr(e.to_string()))
    }

    /// The key for rustls.
    pub fn private_key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }
}

/// What a certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub peer: PeerId,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl CertInfo {
    /// How long a holder waits, from `now`, before renewing: two thirds of the lifetime
    /// left (counted from receipt, since `not_before` is backdated for clock skew).
    pub fn renew_in(&self, now: SystemTime) -> Duration {
        self.not_after.duration_since(now).unwrap_or(Duration::ZERO) * 2 / 3
    }
}

/// Reads the mesh identity (the one SPIFFE URI SAN) and validity of a certificate.
pub fn cert_info(der: &CertificateDer<'_>) -> Result<CertInfo, IdentityError> {
    let bad = |why: String| IdentityError::InvalidCertificate(why);
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| bad(e.to_string()))?;
    let san = cert.subject_alternative_name().map_err(|e| bad(e.to_string()))?;
    let uris: Vec<&str> = san
        .map(|s| {
            s.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(*u),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let [uri] = uris.as_slice() else {
        return Err(bad(format!("expected exactly one URI name, found {}", uris.len())));
    };
    let peer = PeerId::parse(uri)?;
    let time = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs < 0 { UNIX_EPOCH } else { UNIX_EPOCH + Duration::from_secs(secs as u64) }
    };
    Ok(CertInfo { peer, not_before: time(cert.validity().not_before), not_after: time(cert.validity().not_after) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_at_two_thirds() {
        let info = CertInfo {
            peer: PeerId::Control { trust_domain: "t".into() },
            not_before: UNIX_EPOCH,
            not_after: UNIX_EPOCH + Duration::from_secs(1000 + 3 * 3600),
        };
        assert_eq!(info.renew_in(UNIX_EPOCH + Duration::from_secs(1000)), Duration::from_secs(2 * 3600));
        assert_eq!(info.renew_in(UNIX_EPOCH + Duration::from_secs(99_999)), Duration::ZERO);
    }
}
