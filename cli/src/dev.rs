//! Development identity for `agent-reach up` and the demo: the control service generates
//! its CA in memory, and each in-process sidecar gets a join token of its tenant made
//! straight in the store, so the default path runs mutual TLS with no set-up.

use std::path::PathBuf;
use std::sync::Arc;

use agent_reach_control::ControlHandle;
use agent_reach_control::identity::JoinTokens;
use agent_reach_sidecar::identity::IdentitySettings;
use agent_reach_store::Store;

/// Identity settings for a sidecar of `tenant`: control's trust bundle and a fresh join
/// token (24 h, reusable).
pub async fn identity(
    store: &Arc<dyn Store>,
    control: &ControlHandle,
    tenant: &str,
) -> Result<IdentitySettings, String> {
    let created = JoinTokens::new(store.clone())
        .create(tenant, std::time::Duration::ZERO, false, "development")
        .await
        .map_err(|e| format!("cannot create a development join token: {e}"))?;
    Ok(IdentitySettings {
        trust_domain: control.ca().trust_domain().to_string(),
        trust_bundle_pem: control.ca().bundle_pem().to_string(),
        join_token: created.secret,
    })
}

/// Writes control's trust bundle where `agent-reach ctl --trust-bundle-file` can read it:
/// agent-reach/dev-trust-bundle.pem in the temporary directory.
pub fn write_bundle(control: &ControlHandle) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join("agent-reach");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("dev-trust-bundle.pem");
    std::fs::write(&path, control.ca().bundle_pem()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// A fresh bootstrap admin token, written (readable by this user only) to
/// agent-reach/dev-admin-token in the temporary directory for `agent-reach ctl --token-file`.
pub fn admin_token() -> Result<(agent_reach_control::config::BootstrapToken, PathBuf), String> {
    let token: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let dir = std::env::temp_dir().join("agent-reach");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("dev-admin-token");
    let _ = std::fs::remove_file(&path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut file, token.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((agent_reach_control::config::BootstrapToken(token), path))
}
