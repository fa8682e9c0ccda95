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
    /// Connections that did not start with a TLS record, served in plaintext by a
    /// permissive port ([`accept_either_admitted`]).
    pub plaintext: AtomicU64,
}

/// A connection accepted by a permissive port: TLS when it began with a TLS handshake
/// record, plaintext otherwise.
pub enum Accepted {
    Tls(Box<server::TlsStream<TcpStream>>),
    Plain(TcpStream),
}

/// The first byte of a TLS record carrying a handshake (a ClientHello to a server).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Accepts TCP connections on `listener` and completes TLS handshakes with the server
/// configuration current at each accept. Finished handshakes come out of the receiver; it
/// ends when the receiver is dropped.
pub fn accept_tls(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
) -> mpsc::Receiver<std::io::Result<server::TlsStream<TcpStream>>> {
    run_accept(
        listener,
        configs,
        stats,
        |_| Some(()),
        false,
        |tls, ()| match tls {
            Accepted::Tls(tls) => Some(*tls),
            Accepted::Plain(_) => None,
        },
    )
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
    run_accept(listener, configs, stats, admit, false, |tls, slot| match tls {
        Accepted::Tls(tls) => Some((*tls, slot)),
        Accepted::Plain(_) => None,
    })
}

/// [`accept_tls_admitted`], and with `permissive` (migration only) a connection whose
/// first byte is not a TLS handshake record (an HTTP/2 preface, say) comes out as
/// [`Accepted::Plain`], counted in [`HandshakeStats::plaintext`]; the others complete
/// their handshake as before. The first byte is waited for within the handshake timeout.
/// Without `permissive` every connection comes out as [`Accepted::Tls`].
pub fn accept_either_admitted<T: Send + 'static>(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
    admit: impl Fn(std::net::SocketAddr) -> Option<T> + Send + 'static,
    permissive: bool,
) -> mpsc::Receiver<std::io::Result<(Accepted, T)>> {
    run_accept(listener, configs, stats, admit, permissive, |accepted, slot| Some((accepted, slot)))
}

fn run_accept<T: Send + 'static, O: Send + 'static>(
    listener: TcpListener,
    configs: Arc<TlsConfigs>,
    stats: Arc<HandshakeStats>,
    admit: impl Fn(std::net::SocketAddr) -> Option<T> + Send + 'static,
    plaintext_too: bool,
    output: fn(Accepted, T) -> Option<O>,
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
                let handshake = async {
                    if plaintext_too && !starts_with_tls(&tcp).await? {
                        return Ok(Accepted::Plain(tcp));
                    }
                    acceptor.accept(tcp).await.map(|tls| Accepted::Tls(Box::new(tls)))
                };
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(accepted)) => {
                        let counter = match accepted {
                            Accepted::Tls(_) => &stats.accepted,
                            Accepted::Plain(_) => &stats.plaintext,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        if let Some(out) = output(accepted, slot) {
                            let _ = tx.send(Ok(out)).await;
                        }
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

/// Whether the connection's first byte (waited for, not consumed) opens a TLS handshake.
async fn starts_with_tls(tcp: &TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(first[0] == TLS_HANDSHAKE_RECORD),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::Ca;
    use crate::spiffe::WorkloadId;
    use crate::tls::{ClientAuth, Credentials, ExpectedPeer};
    use std::time::SystemTime;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn configs(ca: &Ca, sidecar: &str) -> Arc<TlsConfigs> {
        let now = SystemTime::now();
        let id = WorkloadId::new("mesh.test", "a", sidecar);
        let (issued, key) = ca.issue_with_key(&id.uri(), now, now + Duration::from_secs(60)).unwrap();
        let creds = Credentials::from_pem(&issued.cert_pem, &key, ca.bundle_pem()).unwrap();
        Arc::new(TlsConfigs::new(creds, ClientAuth::Required, ExpectedPeer::AnyInTrustDomain).unwrap())
    }

    #[tokio::test]
    async fn a_permissive_port_serves_plaintext_and_tls_and_counts_each() {
        let ca = Ca::generate("mesh.test").unwrap();
        let (server, client) = (configs(&ca, "server"), configs(&ca, "client"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stats = Arc::new(HandshakeStats::default());
        let mut accepted = accept_either_admitted(listener, server, stats.clone(), |_| Some(7u8), true);

        let mut plain = TcpStream::connect(&addr).await.unwrap();
        plain.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let (conn, slot) = accepted.recv().await.unwrap().unwrap();
        assert_eq!(slot, 7);
        let Accepted::Plain(mut conn) = conn else { panic!("a plaintext connection came out as TLS") };
        let mut preface = [0u8; 16];
        conn.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, b"PRI * HTTP/2.0\r\n", "the sniffed byte is not consumed");

        let _tls = connect_tls(&addr, client.client()).await.expect("TLS on the permissive port");
        let (conn, _) = accepted.recv().await.unwrap().unwrap();
        let Accepted::Tls(tls) = conn else { panic!("a TLS connection came out as plaintext") };
        assert!(tls.get_ref().1.peer_certificates().is_some(), "the client certificate is verified");
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 1);
        assert_eq!(stats.plaintext.load(Ordering::Relaxed), 1);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_strict_port_closes_plaintext_connections() {
        let ca = Ca::generate("mesh.test").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stats = Arc::new(HandshakeStats::default());
        let _accepted = accept_tls_admitted(listener, configs(&ca, "server"), stats.clone(), |_| Some(()));
        let mut plain = TcpStream::connect(&addr).await.unwrap();
        plain.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "closed, not left open: {read:?}");
        assert_eq!(stats.plaintext.load(Ordering::Relaxed), 0);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 1);
    }
}
