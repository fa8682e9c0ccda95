//! Limits of the HTTP/1.1 admin ports (the sidecar's and control's admin port, control's
//! dashboard): a cap on connections served at once, a header-read timeout, and a back-off
//! on accept errors, so that a client that opens many connections, sends its headers a
//! byte at a time, or exhausts the process's file descriptors cannot take the port (or a
//! CPU spinning on failed accepts) from the operators.
//!
//! [`Acceptor`] hands out accepted connections with their slot; [`builder`] is the
//! HTTP/1.1 server configuration with the header-read timeout. Not here: what the ports
//! answer.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections served at once on one admin port; one more is closed when accepted.
pub const MAX_CONNECTIONS: usize = 128;
/// Time a client has to send a request's headers (hyper answers 408 and closes after it).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest pause after a failed accept (doubling in between).
const BACKOFF_MIN: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The HTTP/1.1 server settings of an admin port.
pub fn builder() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder
}

/// Accepts connections on an admin port within its connection cap.
pub struct Acceptor {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    backoff: Duration,
    refused: u64,
}

impl Acceptor {
    pub fn new(listener: TcpListener) -> Acceptor {
        Acceptor::with_cap(listener, MAX_CONNECTIONS)
    }

    /// An acceptor serving at most `cap` connections at once.
    pub fn with_cap(listener: TcpListener, cap: usize) -> Acceptor {
        Acceptor { listener, slots: Arc::new(Semaphore::new(cap.max(1))), backoff: BACKOFF_MIN, refused: 0 }
    }

    /// The next connection and its slot (release it by dropping it when the connection
    /// ends). Connections past the cap are closed at once; after a failed accept (e.g. no
    /// file descriptor left) it waits, twice as long after each failure in a row, up to 1 s.
    pub async fn accept(&mut self) -> (TcpStream, OwnedSemaphorePermit) {
        loop {
            match self.listener.accept().await {
                Ok((tcp, _)) => {
                    self.backoff = BACKOFF_MIN;
                    match self.slots.clone().try_acquire_owned() {
                        Ok(slot) => return (tcp, slot),
                        Err(_) => {
                            self.refused += 1;
                            tracing::debug!(max = MAX_CONNECTIONS, "admin connection refused: too many open");
                            drop(tcp);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}; retrying in {:?}", self.backoff);
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Connections closed because the cap was reached.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_and_a_freed_slot_serves_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut acceptor = Acceptor::with_cap(listener, 2);
        let _a = TcpStream::connect(addr).await.unwrap();
        let (_, slot_a) = acceptor.accept().await;
        let _b = TcpStream::connect(addr).await.unwrap();
        let (_, _slot_b) = acceptor.accept().await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        // `c` is over the cap: closed as soon as accepted, and nothing is handed out.
        assert!(tokio::time::timeout(Duration::from_millis(300), acceptor.accept()).await.is_err());
        assert_eq!(acceptor.refused(), 1);
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).await.unwrap(), 0, "the refused connection is closed");
        // A freed slot serves the next connection.
        drop(slot_a);
        let mut d = TcpStream::connect(addr).await.unwrap();
        let (mut served, _slot) = acceptor.accept().await;
        d.write_all(b"x").await.unwrap();
        served.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"x");
    }
}
