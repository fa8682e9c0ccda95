//! The certificate authority of the mesh: it signs sidecars' certificate signing requests
//! with a SPIFFE id the caller has already been authorized for, and a short lifetime.
//!
//! The CA comes from PEM files (its certificate and private key) or, in development, is
//! generated in memory. The trust bundle it hands out (the CAs a peer is checked against)
//! may hold two CAs, the signing one and another, so a CA can be replaced without
//! downtime: first every peer trusts both, then the new one signs, then the old one goes.
//!
//! A CSR only contributes its public key and proof of possession of the private key: its
//! subject, names and extensions are ignored and replaced by the identity the control
//! service authorized, so a CSR can never ask for more than that.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::OffsetDateTime;

use crate::IdentityError;
use crate::spiffe::control_uri;
use crate::workload::cert_info;

/// How far back a new certificate's validity starts, for peers whose clocks lag.
const BACKDATE: Duration = Duration::from_secs(300);

/// A certificate authority that can sign.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    bundle_pem: String,
    trust_domain: String,
}

/// A signed certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub not_after: SystemTime,
}

impl Ca {
    /// A new CA with a fresh ECDSA P-256 key, valid for ten years (development).
    pub fn generate(trust_domain: &str) -> Result<Ca, IdentityError> {
        Ca::generate_named(trust_domain, "Agent-Reach development CA")
    }

    /// [`Ca::generate`] with a common name of its own (tests make several CAs).
    pub fn generate_named(trust_domain: &str, common_name: &str) -> Result<Ca, IdentityError> {
        let key = KeyPair::generate().map_err(|e| IdentityError::Ca(e.to_string()))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key).map_err(|e| IdentityError::Ca(e.to_string()))?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        Ca::from_pem(trust_domain, &cert_pem, &key_pem, None)
    }

    /// A CA from its certificate and private key (PEM). `bundle_pem` is the trust bundle to
    /// hand out (it must contain the CA's certificate); `None` hands out the CA alone.
    pub fn from_pem(
        trust_domain: &str,
        cert_pem: &str,
        key_pem: &str,
        bundle_pem: Option<&str>,
    ) -> Result<Ca, IdentityError> {
        crate::spiffe::PeerId::parse(&control_uri(trust_domain))
            .map_err(|_| IdentityError::Ca(format!("bad trust domain {trust_domain:?}")))?;
        let key = KeyPair::from_pem(key_pem).map_err(|e| IdentityError::InvalidKey(e.to_string()))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| IdentityError::InvalidCertificate(format!("CA certificate: {e}")))?;
        let ca_der = crate::tls::parse_certs(cert_pem)?;
        let Some(ca_der) = ca_der.first() else {
            return Err(IdentityError::InvalidCertificate("no certificate in the CA file".into()));
        };
        let bundle_pem = match bundle_pem {
            Some(b) => {
                let bundle = crate::tls::parse_certs(b)?;
                if !bundle.iter().any(|c| c == ca_der) {
                    return Err(IdentityError::Ca("the trust bundle does not contain the signing CA".into()));
                }
                b.to_string()
            }
            None => cert_pem.to_string(),
        };
        Ok(Ca {
            issuer,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            bundle_pem,
            trust_domain: trust_domain.to_string(),
        })
    }

    /// The same CA handing out `bundle_pem` as its trust bundle.
    pub fn with_bundle(&self, bundle_pem: &str) -> Result<Ca, IdentityError> {
        Ca::from_pem(&self.trust_domain, &self.cert_pem, &self.key_pem, Some(bundle_pem))
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The CA's own certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PEM), to write development files.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The CAs peers are checked against (PEM, one or two certificates).
    pub fn bundle_pem(&self) -> &str {
        &self.bundle_pem
    }

    /// Signs `csr_pem` (whose signature proves possession of its key) for `uri`, valid
    /// for `ttl` from now. Only the CSR's public key is used.
    pub fn sign_csr(&self, csr_pem: &str, uri: &str, ttl: Duration) -> Result<Issued, IdentityError> {
        let mut csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| IdentityError::InvalidCsr(e.to_string()))?;
        let now = OffsetDateTime::now_utc();
        csr.params = self.leaf_params(uri, now - BACKDATE, now + ttl)?;
        let cert = csr.signed_by(&self.issuer).map_err(|e| IdentityError::Ca(e.to_string()))?;
        issued(cert.pem())
    }

    /// A key pair and a certificate for `uri` valid from `not_before` to `not_after`,
    /// made here: for the control service's own certificate and for tests (expired
    /// certificates, certificates of another CA). Returns (certificate PEM, key PEM).
    pub fn issue_with_key(
        &self,
        uri: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(Issued, String), IdentityError> {
        let key = KeyPair::generate().map_err(|e| IdentityError::Ca(e.to_string()))?;
        let params = self.leaf_params(uri, not_before.into(), not_after.into())?;
        let cert = params.signed_by(&key, &self.issuer).map_err(|e| IdentityError::Ca(e.to_string()))?;
        Ok((issued(cert.pem())?, key.serialize_pem()))
    }

    /// The control service's certificate and key, valid for `ttl`.
    pub fn issue_control(&self, ttl: Duration) -> Result<(Issued, String), IdentityError> {
        let now = SystemTime::now();
        self.issue_with_key(&control_uri(&self.trust_domain), now - BACKDATE, now + ttl)
    }

    fn leaf_params(
        &self,
        uri: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<CertificateParams, IdentityError> {
        let peer = crate::spiffe::PeerId::parse(uri)?;
        if peer.trust_domain() != self.trust_domain {
            return Err(IdentityError::InvalidId(uri.into(), format!("not in trust domain {}", self.trust_domain)));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(
            uri.try_into().map_err(|e: rcgen::Error| IdentityError::InvalidId(uri.into(), e.to_string()))?,
        )];
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial()?);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }
}

fn issued(cert_pem: String) -> Result<Issued, IdentityError> {
    let der = crate::tls::parse_certs(&cert_pem)?;
    let info = cert_info(der.first().ok_or_else(|| IdentityError::Ca("signed nothing".into()))?)?;
    Ok(Issued { cert_pem, not_after: info.not_after })
}

fn random_serial() -> Result<SerialNumber, IdentityError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| IdentityError::Ca("no randomness".into()))?;
    // Positive, never zero.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spiffe::{PeerId, WorkloadId};
    use crate::workload::WorkloadKey;

    #[test]
    fn signs_a_csr_with_the_authorized_identity_only() {
        let ca = Ca::generate("mesh.test").unwrap();
        // The CSR asks for another tenant; the certificate carries what control authorized.
        let asked = WorkloadId::new("mesh.test", "victim", "s1");
        let key = WorkloadKey::generate().unwrap();
        let csr = key.csr_pem(&asked).unwrap();
        let granted = WorkloadId::new("mesh.test", "team-a", "s1");
        let issued = ca.sign_csr(&csr, &granted.uri(), Duration::from_secs(3600)).unwrap();
        let der = crate::tls::parse_certs(&issued.cert_pem).unwrap();
        let info = cert_info(&der[0]).unwrap();
        assert_eq!(info.peer, PeerId::Sidecar(granted));
        let lifetime = info.not_after.duration_since(SystemTime::now()).unwrap();
        assert!(lifetime > Duration::from_secs(3590) && lifetime <= Duration::from_secs(3600), "{lifetime:?}");
    }

    #[test]
    fn refuses_bad_csrs_and_foreign_trust_domains() {
        let ca = Ca::generate("mesh.test").unwrap();
        assert!(matches!(
            ca.sign_csr("not a csr", "spiffe://mesh.test/control", Duration::from_secs(60)),
            Err(IdentityError::InvalidCsr(_))
        ));
        let key = WorkloadKey::generate().unwrap();
        let id = WorkloadId::new("other.test", "a", "s");
        let csr = key.csr_pem(&id).unwrap();
        assert!(matches!(ca.sign_csr(&csr, &id.uri(), Duration::from_secs(60)), Err(IdentityError::InvalidId(..))));
    }

    #[test]
    fn the_bundle_must_hold_the_signing_ca() {
        let a = Ca::generate_named("mesh.test", "A").unwrap();
        let b = Ca::generate_named("mesh.test", "B").unwrap();
        assert!(a.with_bundle(b.cert_pem()).is_err());
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        let rotated = b.with_bundle(&both).unwrap();
        assert_eq!(crate::tls::parse_certs(rotated.bundle_pem()).unwrap().len(), 2);
    }
}
