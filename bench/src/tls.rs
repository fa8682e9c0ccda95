//! TLS mode of the benchmark (`run --tls`): the same paths with TLS 1.3 and client
//! certificates on the hop between the two proxies, the mesh's secure defaults against
//! what an operator would configure for nginx and Envoy.
//!
//! - Mesh: control with `--mtls required`, a CA from files made here and an Admin token; each
//!   sidecar buys its certificate with a join token (Admin `CreateJoinToken`) and speaks
//!   mutual TLS to control and to the other sidecar, as in production.
//! - nginx A → nginx B: `grpc_pass grpcs://` with a client certificate, the CA as trust
//!   anchor and the name checked; nginx B requires a client certificate of that CA.
//! - Envoy A → Envoy B: an `UpstreamTlsContext` with a client certificate and the name
//!   checked; Envoy B's listener a `DownstreamTlsContext` requiring a client certificate.
//!
//! The client's hop to the first proxy and the last hop to the agent stay plaintext on
//! every path (the mesh's local API is loopback plaintext by design). The proxies' shared
//! certificate is for the DNS name `localhost`, from a CA of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::proto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// The name on the proxies' certificate (and checked by the client side of each hop).
pub const PROXY_NAME: &str = "localhost";

/// The files of a TLS run, all under one directory.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The mesh CA (control signs sidecars' certificates with it).
    pub mesh_ca_cert: PathBuf,
    pub mesh_ca_key: PathBuf,
    /// Control writes its bootstrap admin token here.
    pub admin_token: PathBuf,
    /// The proxies' CA, certificate and key.
    pub proxy: HopTls,
    dir: PathBuf,
}

/// TLS material of one proxy hop.
#[derive(Clone, Debug)]
pub struct HopTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

impl TlsFiles {
    /// Makes both CAs and the proxies' certificate under `dir`.
    pub fn create(dir: &Path) -> Result<TlsFiles, String> {
        let mesh = agent_reach_identity::Ca::generate(agent_reach_identity::DEFAULT_TRUST_DOMAIN)
            .map_err(|e| format!("mesh CA: {e}"))?;
        let files = TlsFiles {
            mesh_ca_cert: dir.join("mesh-ca.pem"),
            mesh_ca_key: dir.join("mesh-ca.key"),
            admin_token: dir.join("admin.token"),
            proxy: HopTls { ca: dir.join("proxy-ca.pem"), cert: dir.join("proxy.pem"), key: dir.join("proxy.key") },
            dir: dir.to_path_buf(),
        };
        write(&files.mesh_ca_cert, mesh.cert_pem())?;
        write(&files.mesh_ca_key, mesh.key_pem())?;
        let (ca_pem, cert_pem, key_pem) = proxy_certificates().map_err(|e| format!("proxy certificates: {e}"))?;
        write(&files.proxy.ca, &ca_pem)?;
        write(&files.proxy.cert, &cert_pem)?;
        write(&files.proxy.key, &key_pem)?;
        Ok(files)
    }

    /// Control's flags: mutual TLS required, the mesh CA, the admin token file.
    pub fn control_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec!["--mtls".into(), "required".into()];
        for (flag, path) in [
            ("--ca-cert-file", &self.mesh_ca_cert),
            ("--ca-key-file", &self.mesh_ca_key),
            ("--admin-token-file", &self.admin_token),
        ] {
            args.push(flag.into());
            args.push(path.display().to_string());
        }
        args
    }

    /// `plain`, control's flags of a plaintext run ([`crate::procs::control_args`]), made
    /// those of a TLS run: the Admin API closed, `--mtls off` replaced by
    /// [`TlsFiles::control_args`].
    pub fn control_args_of(&self, mut plain: Vec<String>) -> Result<Vec<String>, String> {
        plain.retain(|a| a != "--insecure-open-admin-api");
        let mtls = plain.iter().position(|a| a == "--mtls").ok_or("no --mtls flag")?;
        plain.drain(mtls..(mtls + 2).min(plain.len()));
        plain.extend(self.control_args());
        Ok(plain)
    }

    /// `plain`, a sidecar's flags of a plaintext run ([`crate::procs::sidecar_args`]), made
    /// those of a TLS run: TLS toward control at `control`, and the identity flags of
    /// [`TlsFiles::sidecar_args`] (a fresh join token).
    pub async fn sidecar_args_of(
        &self,
        mut plain: Vec<String>,
        control: u16,
        sidecar: &str,
    ) -> Result<Vec<String>, String> {
        plain.retain(|a| a != "--insecure-plaintext-control");
        plain.extend(self.sidecar_args(control, sidecar).await?);
        Ok(plain)
    }

    /// A sidecar's identity flags, with a fresh join token from control at `control`.
    pub async fn sidecar_args(&self, control: u16, sidecar: &str) -> Result<Vec<String>, String> {
        let token = self.join_token(control).await?;
        let token_file = self.dir.join(format!("{sidecar}.join-token"));
        write(&token_file, &token)?;
        Ok(vec![
            "--trust-bundle-file".into(),
            self.mesh_ca_cert.display().to_string(),
            "--join-token-file".into(),
            token_file.display().to_string(),
            // Nothing of the run outlives it.
            "--table-file".into(),
            "off".into(),
        ])
    }

    /// A join token of the default tenant, through the Admin API with the admin token.
    async fn join_token(&self, control: u16) -> Result<String, String> {
        let admin_token = std::fs::read_to_string(&self.admin_token)
            .map_err(|e| format!("{}: {e}", self.admin_token.display()))?
            .trim()
            .to_string();
        let bundle = std::fs::read_to_string(&self.mesh_ca_cert).map_err(|e| e.to_string())?;
        let tls = agent_reach_identity::tls::bootstrap_client(&bundle, agent_reach_identity::DEFAULT_TRUST_DOMAIN)
            .map_err(|e| format!("TLS toward control: {e}"))?;
        let channel = agent_reach_sidecar::identity::TlsConnector::fixed(std::sync::Arc::new(tls))
            .channel(&format!("http://127.0.0.1:{control}"))?;
        let mut admin = proto::admin_client::AdminClient::new(channel);
        let mut request = tonic::Request::new(proto::CreateJoinTokenRequest {
            tenant: "default".into(),
            ttl_ms: 3_600_000,
            single_use: true,
            description: "agent-reach-bench".into(),
        });
        request.set_timeout(Duration::from_secs(10));
        let bearer = format!("Bearer {admin_token}").parse().map_err(|_| "the admin token is not ASCII")?;
        request.metadata_mut().insert("authorization", bearer);
        let reply = admin.create_join_token(request).await.map_err(|s| format!("CreateJoinToken: {s}"))?;
        Ok(reply.into_inner().secret)
    }
}

/// A CA and one certificate for [`PROXY_NAME`] (server and client use) signed by it:
/// (CA PEM, certificate PEM, key PEM).
fn proxy_certificates() -> Result<(String, String, String), rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "agent-reach-bench proxies CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec![PROXY_NAME.to_string()])?;
    leaf.distinguished_name.push(DnType::CommonName, PROXY_NAME);
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_made_and_control_is_told_where() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles::create(dir.path()).unwrap();
        for p in [&files.mesh_ca_cert, &files.mesh_ca_key, &files.proxy.ca, &files.proxy.cert, &files.proxy.key] {
            assert!(std::fs::read_to_string(p).unwrap().starts_with("-----BEGIN"), "{}", p.display());
        }
        let args = files.control_args();
        assert_eq!(&args[..2], ["--mtls", "required"]);
        assert!(args.contains(&"--admin-token-file".to_string()));
        let of_plain = files.control_args_of(crate::procs::control_args(1, &[]).unwrap()).unwrap();
        assert!(!of_plain.iter().any(|a| a == "--insecure-open-admin-api"), "{of_plain:?}");
        assert_eq!(of_plain.iter().filter(|a| *a == "--mtls").count(), 1, "{of_plain:?}");
        let mtls = of_plain.iter().position(|a| a == "--mtls").unwrap();
        assert_eq!(of_plain[mtls + 1], "required", "{of_plain:?}");
        assert!(of_plain.contains(&"--listen".to_string()), "the plaintext run's other flags are kept");
    }
}
