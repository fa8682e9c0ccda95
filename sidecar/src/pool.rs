//! HTTP/2 client connections, one per peer (another sidecar's mesh API, or a local agent),
//! multiplexing every call to that peer.
//!
//! A connection is made on first use and replaced when it closes. Connection failures are
//! reported as [`ConnectError`], which the forwarding path treats as "never delivered" (safe
//! to retry elsewhere). The pool does not retry or time calls; the caller does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::grpc::Body;

/// A failed connection attempt.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {authority}: {cause}")]
pub struct ConnectError {
    pub authority: String,
    pub cause: String,
}

/// HTTP/2 connections keyed by `host:port`.
#[derive(Default)]
pub struct Pool {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    sender: ArcSwapOption<SendRequest<Body>>,
    connecting: tokio::sync::Mutex<()>,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl Pool {
    /// A ready sender to `authority`, connecting if there is no open connection.
    pub async fn get(&self, authority: &str) -> Result<SendRequest<Body>, ConnectError> {
        let slot = {
            // Held only for the map lookup, never across an await.
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(authority) {
                Some(s) => s.clone(),
                None => slots.entry(authority.to_string()).or_default().clone(),
            }
        };
        if let Some(sender) = open(&slot) {
            return Ok(sender);
        }
        let _connecting = slot.connecting.lock().await;
        if let Some(sender) = open(&slot) {
            return Ok(sender);
        }
        let sender = connect(authority).await?;
        slot.sender.store(Some(Arc::new(sender.clone())));
        Ok(sender)
    }

    /// Forgets the connection to `authority` (e.g. after the peer left).
    pub fn remove(&self, authority: &str) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(authority);
    }
}

fn open(slot: &Slot) -> Option<SendRequest<Body>> {
    slot.sender.load().as_ref().filter(|s| !s.is_closed()).map(|s| SendRequest::clone(s))
}

async fn connect(authority: &str) -> Result<SendRequest<Body>, ConnectError> {
    let err = |cause: String| ConnectError { authority: authority.to_string(), cause };
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| err(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| err(e.to_string()))?;
    tcp.set_nodelay(true).map_err(|e| err(e.to_string()))?;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // Detect peers that vanished without closing the connection.
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_concurrent_reset_streams(1024)
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| err(e.to_string()))?;
    let peer = authority.to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(peer = %peer, "connection closed: {e}");
        }
    });
    Ok(sender)
}
