//! Who may use the local API besides "any process on this host": an optional per-sidecar
//! API token and an optional Unix domain socket.
//!
//! - [`ApiToken`] (`--local-token-file`, Dapr-style): every local request must carry the
//!   token as the metadata `ar-api-token` (the SDKs send `$AGENT_REACH_API_TOKEN`), except
//!   `grpc.health.v1` checks, so probes keep working. A missing or wrong token is
//!   UNAUTHENTICATED `UNAUTHENTICATED`. Only the token's SHA-256 is kept in memory.
//! - [`serve_uds`] (`--local-uds <path>`): the local API also on a Unix socket whose file is
//!   created with mode 0600 (`--local-uds-mode`), so file permissions decide who connects.
//!   The socket file is removed at shutdown.
//!
//! This module does not identify agents (that is the agent credential, `credentials`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_reach::reason::{self, Reason};
use http::{HeaderMap, HeaderName, Request};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::limits::{Activity, Port};
use crate::serve::HandlerFuture;

/// The request metadata carrying the API token.
const HEADER: HeaderName = HeaderName::from_static(agent_reach::headers::API_TOKEN);

/// Shortest API token accepted (a short token is guessable).
const MIN_TOKEN_LEN: usize = 16;

/// The local API token (its SHA-256 only).
#[derive(Clone)]
pub struct ApiToken {
    hash: [u8; 32],
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(..)")
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

impl ApiToken {
    /// The token `token` (surrounding whitespace is not part of it).
    pub fn new(token: &str) -> Result<ApiToken, String> {
        let token = token.trim();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!("the API token must be at least {MIN_TOKEN_LEN} characters"));
        }
        Ok(ApiToken { hash: sha256(token.as_bytes()) })
    }

    /// Reads the token from `path`; the error names the flag.
    pub fn from_file(path: &Path) -> Result<ApiToken, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--local-token-file {}: {e}", path.display()))?;
        ApiToken::new(&text).map_err(|e| format!("--local-token-file {}: {e}", path.display()))
    }

    /// Refuses a local request without the token (health checks pass).
    pub(crate) fn check(&self, path: &str, headers: &HeaderMap) -> Result<(), Status> {
        if path.starts_with("/grpc.health.v1.Health/") {
            return Ok(());
        }
        match headers.get(HEADER) {
            // Comparing digests: a mismatch position says nothing usable about the token.
            Some(v) if sha256(v.as_bytes()) == self.hash => Ok(()),
            Some(_) => Err(reason::status(Reason::Unauthenticated, "wrong local API token (ar-api-token)", &[])),
            None => Err(reason::status(
                Reason::Unauthenticated,
                "this sidecar's local API needs its token in the metadata ar-api-token (AGENT_REACH_API_TOKEN)",
                &[],
            )),
        }
    }
}

/// Binds the local API's Unix socket at `path` with file mode `mode`: a stale socket file
/// left by a crash is replaced; any other file there fails start.
pub(crate) fn bind_uds(path: &Path, mode: u32) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("--local-uds {}: exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    // bind creates the file under the process umask (with the usual 022 nobody else may
    // connect: connecting needs write permission); the mode is set before the first accept.
    // Put the socket in a directory only the agents' user can enter to close that window
    // under a permissive umask.
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Serves HTTP/2 on the Unix socket `listener` (bound at `path`) with `handler`, within
/// the local port's limits (`port`: its connections count with the TCP port's), until
/// shutdown, then removes the socket file.
pub(crate) async fn serve_uds<F>(
    listener: UnixListener,
    path: PathBuf,
    port: Arc<Port>,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> HandlerFuture + Clone + Send + Sync + 'static,
{
    let builder = port.builder();
    let (running, mut all_ended) = mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("accept on {} failed: {e}", path.display());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = port.admit() else { continue };
        let activity = Activity::new();
        let service = port.clone().service(activity.clone(), handler.clone());
        let conn = builder.serve_connection(TokioIo::new(port.guard(stream)), service);
        let (port, shutdown, running) = (port.clone(), shutdown.clone(), running.clone());
        tokio::spawn(async move {
            port.drive(conn, |c| c.graceful_shutdown(), activity, shutdown, slot, running).await;
        });
    }
    drop(listener);
    drop(running);
    let _ = std::fs::remove_file(&path);
    if tokio::time::timeout(Duration::from_secs(10), all_ended.recv()).await.is_err() {
        tracing::warn!("local socket connections still open 10s after shutdown");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_required_except_for_health_checks() {
        assert!(ApiToken::new("short").is_err());
        let token = ApiToken::new("a-long-enough-token\n").unwrap();
        let mut headers = HeaderMap::new();
        assert!(token.check("/grpc.health.v1.Health/Check", &headers).is_ok());
        let missing = token.check("/agentreach.v1.Sidecar/Invoke", &headers).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        headers.insert(HEADER, "a-long-enough-token-but-not-this".parse().unwrap());
        assert!(token.check("/agentreach.v1.Sidecar/Register", &headers).is_err());
        headers.insert(HEADER, "a-long-enough-token".parse().unwrap());
        assert!(token.check("/agentreach.v1.Sidecar/Register", &headers).is_ok());
    }

    #[tokio::test]
    async fn the_socket_file_gets_its_mode_and_a_stale_one_is_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ar-uds-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sidecar.sock");
        let first = bind_uds(&path, 0o600).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        drop(first);
        // The socket file a crashed sidecar left behind is replaced.
        let _second = bind_uds(&path, 0o660).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
        let file = dir.join("not-a-socket");
        std::fs::write(&file, "x").unwrap();
        assert!(bind_uds(&file, 0o600).is_err(), "a regular file is never removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
