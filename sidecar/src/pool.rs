//! HTTP/2 client connections, one per peer (another sidecar's mesh API, or a local agent),
//! multiplexing every call to that peer, on the `h2` crate directly.
//!
//! Sending on `h2` from the calling task queues a call's HEADERS and DATA frames together,
//! so they leave in one write (a client whose body is sent from a separate task pays an
//! extra write, segment and wake-up per hop). A connection is made on first use and
//! replaced when its connection task ends. Connection failures are reported as
//! [`ConnectError`], which the forwarding path treats as "never delivered" (safe to retry
//! elsewhere). The pool does not retry or time calls; the caller does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::Authority;
use tokio::net::TcpStream;

use crate::coalesce;

/// A failed connection attempt.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {authority}: {cause}")]
pub struct ConnectError {
    pub authority: String,
    pub cause: String,
}

/// An open connection to a peer.
#[derive(Clone)]
pub struct Conn {
    pub sender: SendRequest<Bytes>,
    /// The peer's `host:port`, parsed once.
    pub authority: Authority,
}

struct Open {
    conn: Conn,
    closed: Arc<AtomicBool>,
}

/// HTTP/2 connections keyed by `host:port`.
#[derive(Default)]
pub struct Pool {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    open: ArcSwapOption<Open>,
    connecting: tokio::sync::Mutex<()>,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle connection is checked with a PING, and how long the answer may take.
const KEEPALIVE: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Pool {
    /// An open connection to `authority`, connecting if there is none.
    pub async fn get(&self, authority: &str) -> Result<Conn, ConnectError> {
        let slot = {
            // Held only for the map lookup, never across an await.
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(authority) {
                Some(s) => s.clone(),
                None => slots.entry(authority.to_string()).or_default().clone(),
            }
        };
        if let Some(conn) = open(&slot) {
            return Ok(conn);
        }
        let _connecting = slot.connecting.lock().await;
        if let Some(conn) = open(&slot) {
            return Ok(conn);
        }
        let opened = connect(authority).await?;
        let conn = opened.conn.clone();
        slot.open.store(Some(Arc::new(opened)));
        Ok(conn)
    }

    /// Forgets the connection to `authority` (e.g. after the peer left).
    pub fn remove(&self, authority: &str) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(authority);
    }
}

fn open(slot: &Slot) -> Option<Conn> {
    slot.open.load().as_ref().filter(|o| !o.closed.load(Ordering::Relaxed)).map(|o| o.conn.clone())
}

async fn connect(authority: &str) -> Result<Open, ConnectError> {
    let err = |cause: String| ConnectError { authority: authority.to_string(), cause };
    let parsed: Authority = authority.parse().map_err(|e| err(format!("bad address: {e}")))?;
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| err(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| err(e.to_string()))?;
    tcp.set_nodelay(true).map_err(|e| err(e.to_string()))?;
    let (io, drain) = coalesce::coalesced(tcp);
    let (sender, mut connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_concurrent_reset_streams(1024)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| err(e.to_string()))?;
    let closed = Arc::new(AtomicBool::new(false));
    let ping = connection.ping_pong();
    let (peer, flag) = (authority.to_string(), closed.clone());
    let mut connection = coalesce::Flushing::new(connection, drain);
    tokio::spawn(async move {
        // Detect peers that vanished without closing the connection: PING when idle.
        let keepalive = async move {
            let Some(mut ping) = ping else { return std::future::pending::<()>().await };
            loop {
                tokio::time::sleep(KEEPALIVE).await;
                match tokio::time::timeout(KEEPALIVE_TIMEOUT, ping.ping(h2::Ping::opaque())).await {
                    Ok(Ok(_)) => {}
                    _ => return,
                }
            }
        };
        tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(peer = %peer, "connection closed: {e}");
                }
            }
            _ = keepalive => tracing::debug!(peer = %peer, "no PING answer; dropping the connection"),
        }
        flag.store(true, Ordering::Relaxed);
    });
    Ok(Open { conn: Conn { sender, authority: parsed }, closed })
}
