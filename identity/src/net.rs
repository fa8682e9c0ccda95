//! TLS handshakes on TCP connections with a workload's current [`TlsConfigs`]: an accept
//! loop that hands out finished handshakes (each runs in its own task with a timeout, so
//! a slow or silent client never holds up the next one), optionally admitting each TCP
//! connection before its handshake ([`accept_tls_admitted`], for connection caps that
//! count handshakes in progress), and an outgoing connect.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};

use crate::tls::{SERVER_NAME, TlsConfigs};

/// Longest time a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes finished but not yet taken by the server, at most.
const ACCEPT_QUEUE: usize = 256;

/// Handshakes refused, by why (for metrics and tests).
#[derive(Debug, Default)]
pub struct HandshakeStats {
    pub accepted: AtomicU64,
    pub failed: AtomicU64,
}

/// Accepts TCP connections on `listener` and completes TLS handshakes with the server
/// configuration current at each accept. Finished handshakes come out of the receiver; it
/// ends when the receiver is dropped.
pub fn accept_tls(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
) -> mpsc::Receiver<std::io::Result<server::TlsStream<TcpStream>>> {
    run_accept(listener, configs, stats, |_| Some(()), |tls, ()| tls)
}

/// [`accept_tls`], asking `admit` for each TCP connection before its handshake: `None`
/// closes the connection at once; `Some(slot)` comes out with the finished handshake (a
/// connection cap's permit, held for the handshake and then by the server).
pub fn accept_tls_admitted<T: Send + 'static>(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
    admit: impl Fn(std::net::SocketAddr) -> Option<T> + Send + 'static,
) -> mpsc::Receiver<std::io::Result<(server::TlsStream<TcpStream>, T)>> {
    run_accept(listener, configs, stats, admit, |tls, slot| (tls, slot))
}

fn run_accept<T: Send + 'static, O: Send + 'static>(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
    admit: impl Fn(std::net::SocketAddr) -> Option<T> + Send + 'static,
    output: fn(server::TlsStream<TcpStream>, T) -> O,
) -> mpsc::Receiver<std::io::Result<O>> {
    let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(slot) = admit(peer) else { continue };
            let _ = tcp.set_nodelay(true);
            let acceptor = TlsAcceptor::from(configs.server());
            let (tx, stats) = (tx.clone(), stats.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        stats.accepted.fetch_add(1, Ordering::Relaxed);
                        let _ = tx.send(Ok(output(tls, slot))).await;
                    }
                    Ok(Err(e)) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "TLS handshake refused: {e}");
                    }
                    Err(_) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    rx
}

/// Connects to `addr` ("host:port") and completes a TLS handshake with `config`.
pub async fn connect_tls(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(SERVER_NAME).map_err(std::io::Error::other)?;
    TlsConnector::from(config).connect(name, tcp).await
}
