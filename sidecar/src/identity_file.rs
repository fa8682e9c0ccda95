//! The workload certificate kept on disk, so a sidecar with identity starts (and serves
//! its saved routing table over mutual TLS) while control is unreachable.
//!
//! Every certificate the sidecar receives (the first and each renewal) is written with its
//! private key and the trust bundle to `--identity-file` (JSON, mode 0600, written
//! atomically in a directory others cannot write to, like the table file). At start a saved
//! certificate of this very identity (trust domain, tenant, sidecar id) is used without
//! asking control while it is before two thirds of its lifetime, the point where the
//! sidecar would renew it anyway; after that point the sidecar asks control with its join
//! token first and falls back to the saved certificate, until it expires, when control
//! cannot be reached. An expired, foreign or unreadable file is ignored (with a warning).
//! The key is as safe as the file: keep the directory private.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use agent_reach_identity::{CertInfo, Credentials, IdentityError, WorkloadId};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};

/// A certificate as control issued it, with the key made for it.
pub(crate) struct Issued {
    pub certificate_pem: String,
    /// The private key, PKCS#8 DER.
    pub key_pkcs8: Vec<u8>,
    pub trust_bundle_pem: String,
}

impl Issued {
    pub(crate) fn credentials(&self) -> Result<Credentials, IdentityError> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.clone()));
        Credentials::from_parts(&self.certificate_pem, key, &self.trust_bundle_pem)
    }
}

#[derive(Serialize, Deserialize)]
struct Saved {
    /// The SPIFFE id the certificate was requested for.
    identity: String,
    certificate_pem: String,
    private_key_pkcs8_base64: String,
    trust_bundle_pem: String,
}

/// Where the sidecar keeps its certificate.
pub(crate) struct IdentityFile {
    path: PathBuf,
}

impl IdentityFile {
    pub(crate) fn new(path: PathBuf) -> IdentityFile {
        IdentityFile { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `issued` (for `id`) over the file.
    pub(crate) fn save(&self, id: &WorkloadId, issued: &Issued) -> std::io::Result<()> {
        let saved = Saved {
            identity: id.uri(),
            certificate_pem: issued.certificate_pem.clone(),
            private_key_pkcs8_base64: STANDARD.encode(&issued.key_pkcs8),
            trust_bundle_pem: issued.trust_bundle_pem.clone(),
        };
        let json = serde_json::to_vec(&saved).map_err(std::io::Error::other)?;
        crate::persist::write_private(&self.path, &json)
    }

    /// The saved credentials of `id` that have not expired at `now` (`Ok(None)`: no file).
    pub(crate) fn load(&self, id: &WorkloadId, now: SystemTime) -> Result<Option<Credentials>, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let saved: Saved = serde_json::from_slice(&bytes).map_err(|e| format!("not an identity file: {e}"))?;
        if saved.identity != id.uri() {
            return Err(format!("it holds the certificate of {}, not of {}", saved.identity, id.uri()));
        }
        let key_pkcs8 = STANDARD.decode(&saved.private_key_pkcs8_base64).map_err(|e| format!("bad key: {e}"))?;
        let issued =
            Issued { certificate_pem: saved.certificate_pem, key_pkcs8, trust_bundle_pem: saved.trust_bundle_pem };
        let creds = issued.credentials().map_err(|e| e.to_string())?;
        if creds.info.peer.to_string() != id.uri() {
            return Err(format!("its certificate is for {}, not {}", creds.info.peer, id.uri()));
        }
        if creds.info.not_after <= now {
            return Err("its certificate has expired".into());
        }
        Ok(Some(creds))
    }
}

/// Whether a certificate is young enough at `now` to be used without asking control: before
/// two thirds of its lifetime, when the sidecar renews.
pub(crate) fn fresh(info: &CertInfo, now: SystemTime) -> bool {
    let lifetime = info.not_after.duration_since(info.not_before).unwrap_or_default();
    let left = info.not_after.duration_since(now).unwrap_or_default();
    left > lifetime / 3
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_certificate_is_fresh_until_two_thirds_of_its_lifetime() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let info = CertInfo {
            peer: agent_reach_identity::PeerId::parse("spiffe://d/tenant/t/sidecar/s").unwrap(),
            not_before: start,
            not_after: start + Duration::from_secs(300),
        };
        assert!(fresh(&info, start + Duration::from_secs(199)));
        assert!(!fresh(&info, start + Duration::from_secs(201)));
        assert!(!fresh(&info, start + Duration::from_secs(400)));
    }

    #[test]
    fn the_file_holds_the_key_for_its_owner_only_and_for_one_identity() {
        use std::os::unix::fs::PermissionsExt;
        let ca = agent_reach_identity::Ca::generate("d").unwrap();
        let id = WorkloadId::new("d", "t", "s");
        let key = agent_reach_identity::WorkloadKey::generate().unwrap();
        let signed = ca.sign_csr(&key.csr_pem(&id).unwrap(), &id.uri(), Duration::from_secs(3600)).unwrap();
        let issued = Issued {
            certificate_pem: signed.cert_pem.clone(),
            key_pkcs8: key.private_key_der().secret_der().to_vec(),
            trust_bundle_pem: ca.bundle_pem().to_string(),
        };
        let dir = tempfile::tempdir().unwrap();
        let file = IdentityFile::new(dir.path().join("state/s.identity.json"));
        assert!(file.load(&id, SystemTime::now()).unwrap().is_none(), "no file yet");
        file.save(&id, &issued).unwrap();
        assert_eq!(std::fs::metadata(file.path()).unwrap().permissions().mode() & 0o777, 0o600);
        let creds = file.load(&id, SystemTime::now()).unwrap().expect("saved");
        assert_eq!(creds.info.peer.to_string(), id.uri());
        assert!(fresh(&creds.info, SystemTime::now()));
        let other = WorkloadId::new("d", "t", "other");
        let refused = |r: Result<Option<Credentials>, String>| r.err().unwrap_or_default();
        assert!(refused(file.load(&other, SystemTime::now())).contains("not of"));
        let later = SystemTime::now() + Duration::from_secs(7200);
        assert!(refused(file.load(&id, later)).contains("expired"));
    }
}
