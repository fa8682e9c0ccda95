//! HTTP/2 client connections, one per peer (another sidecar's mesh API, or a local agent),
//! multiplexing every call to that peer, on the `h2` crate directly.
//!
//! Sending on `h2` from the calling task queues a call's HEADERS and DATA frames together,
//! so they leave in one write (a client whose body is sent from a separate task pays an
//! extra write, segment and wake-up per hop). A connection is made on first use and
//! replaced when its connection task ends. Connection failures are reported as
//! [`ConnectError`], which the forwarding path treats as "never delivered" (safe to retry
//! elsewhere). [`send_h2`] sends one call on a connection. The pool does not retry or time
//! calls; the caller does. The answer's stream of a call that ended cleanly is kept on its
//! connection until the next call is sent ([`grpc::Parked`]), which saves the connection's
//! task a poll per call.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_routing::table::FastMap;
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Request, Response, Uri};
use tokio::net::TcpStream;

use crate::coalesce;
use crate::grpc::{self, Body};

/// A failed connection attempt.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {authority}: {cause}")]
pub(crate) struct ConnectError {
    pub authority: String,
    pub cause: String,
}

/// An open connection to a peer.
#[derive(Clone)]
pub(crate) struct Conn {
    pub sender: SendRequest<Bytes>,
    /// The peer's `host:port`, parsed once.
    pub authority: Authority,
    /// What is known of the connection.
    state: Arc<ConnState>,
    /// The last cleanly ended answer stream, dropped when the next call is sent.
    parked: Arc<grpc::Parked>,
}

#[derive(Debug)]
struct ConnState {
    /// Calls sent on the connection (see [`PRIME_EVERY`]).
    sent: AtomicU32,
    /// The peer sidecar echoed [`ConnState::token`] in `ar-hop-ok`: it reads `ar-hop`.
    hop: AtomicBool,
    /// Its echo had one more [`crate::hop::WHOLE_MARK`]: it answers unary calls whole when
    /// `ar-hop` asks it to.
    whole: AtomicBool,
    /// The connection's `ar-hop-ask` token: random, ending with `WHOLE_MARK` (this sidecar
    /// reads whole answers; see [`crate::hop`]).
    token: http::HeaderValue,
}

impl Default for ConnState {
    fn default() -> ConnState {
        let mark = char::from(crate::hop::WHOLE_MARK);
        let token = http::HeaderValue::from_str(&format!("{:016x}{mark}", rand::random::<u64>()))
            .unwrap_or(http::HeaderValue::from_static("0+"));
        ConnState { sent: AtomicU32::new(0), hop: AtomicBool::new(false), whole: AtomicBool::new(false), token }
    }
}

impl ConnState {
    /// Reads the peer's answer to `ar-hop-ask`: the token as sent (it reads `ar-hop`), or
    /// with one more `WHOLE_MARK` (it also writes whole answers); anything else changes
    /// nothing.
    fn learn(&self, echo: &http::HeaderValue) {
        let (echo, token) = (echo.as_bytes(), self.token.as_bytes());
        let whole = match echo.strip_prefix(token) {
            Some(b"") => false,
            Some([crate::hop::WHOLE_MARK]) => true,
            _ => return,
        };
        self.whole.store(whole, Ordering::Relaxed);
        self.hop.store(true, Ordering::Relaxed);
    }
}

impl Conn {
    /// Whether the peer, a sidecar, said on this connection that it reads `ar-hop` (see
    /// [`crate::hop`]): calls on it then carry their routing fields in that one header.
    pub(crate) fn speaks_hop(&self) -> bool {
        self.state.hop.load(Ordering::Relaxed)
    }

    /// Whether the peer sidecar said it answers a unary call whole when its `ar-hop` asks
    /// (see [`crate::hop`]).
    pub(crate) fn answers_whole(&self) -> bool {
        self.state.whole.load(Ordering::Relaxed)
    }

    /// The token a call with the separate headers asks the peer sidecar to echo if it
    /// reads `ar-hop`.
    pub(crate) fn hop_token(&self) -> &http::HeaderValue {
        &self.state.token
    }
}

/// One call in this many on a connection (the first one first) sends `grpc-timeout` and
/// `traceparent` indexable, which puts their names in the peer's HPACK table: the other
/// calls send them never-indexed (their values change with every call and would only churn
/// the table), and a never-indexed header whose name is not in the table spells its name out
/// (Huffman-coded) on every call, which the peer decodes into a new `HeaderName` each time.
/// Again every so often, in case newer entries pushed the names out of the table.
const PRIME_EVERY: u32 = 1024;

struct Open {
    conn: Conn,
    closed: Arc<AtomicBool>,
}

/// HTTP/2 connections keyed by `host:port`.
#[derive(Default)]
pub(crate) struct Pool {
    slots: Mutex<FastMap<String, Arc<Slot>>>,
    /// TLS with the sidecar's current certificate (connections to other sidecars' mesh
    /// ports when the sidecar has an identity); `None`: plaintext.
    tls: Option<Arc<crate::identity::ControlTls>>,
}

#[derive(Default)]
struct Slot {
    open: ArcSwapOption<Open>,
    connecting: tokio::sync::Mutex<()>,
}

/// Slots kept at most before those without an open connection are dropped (a slot whose
/// connection closed, or whose connect failed, is the same as a new one). Slots with an
/// open connection or a connect in progress are kept; they are bounded by the peers the
/// routing table names. Without it every address ever tried would keep a slot.
pub(crate) const MAX_IDLE_SLOTS: usize = 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle connection is checked with a PING, and how long the answer may take.
const KEEPALIVE: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Pool {
    /// A pool whose connections are TLS with `tls`'s current configuration.
    pub fn with_tls(tls: Arc<crate::identity::ControlTls>) -> Pool {
        Pool { slots: Mutex::default(), tls: Some(tls) }
    }

    /// An open connection to `authority`, connecting if there is none.
    pub(crate) async fn get(&self, authority: &str) -> Result<Conn, ConnectError> {
        let slot = {
            // Held only for the map lookup, never across an await.
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(authority) {
                Some(s) => s.clone(),
                None => {
                    if slots.len() >= MAX_IDLE_SLOTS {
                        slots.retain(|_, s| Arc::strong_count(s) > 1 || open(s).is_some());
                    }
                    slots.entry(authority.to_string()).or_default().clone()
                }
            }
        };
        if let Some(conn) = open(&slot) {
            return Ok(conn);
        }
        let _connecting = slot.connecting.lock().await;
        if let Some(conn) = open(&slot) {
            return Ok(conn);
        }
        let opened = connect(authority, self.tls.as_deref()).await?;
        let conn = opened.conn.clone();
        slot.open.store(Some(Arc::new(opened)));
        Ok(conn)
    }

    /// Slots kept now, with a connection or not (read by /metrics at scrape time).
    pub(crate) fn slots(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn open(slot: &Slot) -> Option<Conn> {
    slot.open.load().as_ref().filter(|o| !o.closed.load(Ordering::Relaxed)).map(|o| o.conn.clone())
}

async fn connect(authority: &str, tls: Option<&crate::identity::ControlTls>) -> Result<Open, ConnectError> {
    let err = |cause: String| ConnectError { authority: authority.to_string(), cause };
    let parsed: Authority = authority.parse().map_err(|e| err(format!("bad address: {e}")))?;
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| err(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| err(e.to_string()))?;
    tcp.set_nodelay(true).map_err(|e| err(e.to_string()))?;
    let closed = Arc::new(AtomicBool::new(false));
    let sender = match tls {
        None => {
            let (io, drain) = coalesce::coalesced(tcp);
            let (sender, mut connection) = handshake(io).await.map_err(|e| err(e.to_string()))?;
            let ping = connection.ping_pong();
            let connection = coalesce::Flushing::new(connection, drain);
            drive(connection, ping, authority.to_string(), closed.clone());
            sender
        }
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from(agent_reach_identity::tls::SERVER_NAME)
                .map_err(|e| err(e.to_string()))?;
            let stream = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio_rustls::TlsConnector::from(tls.client_config()).connect(name, tcp),
            )
            .await
            .map_err(|_| err(format!("no TLS handshake within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| err(format!("TLS: {e}")))?;
            // A poll's frames leave as one write to the TLS stream: records of up to
            // 16 KiB in one socket write, not a record and a write per DATA frame.
            let (io, drain) = coalesce::coalesced_stream(stream);
            let (sender, mut connection) = handshake(io).await.map_err(|e| err(e.to_string()))?;
            let ping = connection.ping_pong();
            let connection = coalesce::Flushing::new(connection, drain);
            drive(connection, ping, authority.to_string(), closed.clone());
            sender
        }
    };
    Ok(Open { conn: Conn { sender, authority: parsed, state: Arc::default(), parked: Arc::default() }, closed })
}

/// The HTTP/2 client handshake with the sidecar's settings.
async fn handshake<T>(io: T) -> Result<(SendRequest<Bytes>, h2::client::Connection<T, Bytes>), h2::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_concurrent_reset_streams(1024)
        .handshake::<_, Bytes>(io)
        .await
}

/// Runs a connection on a task of its own until it ends, then marks it closed; a second
/// task PINGs the peer while the connection runs and ends the connection if the peer stops
/// answering. (In one task, every wake-up of the busy connection would poll the keepalive's
/// timer too: ~120 instructions per poll, two polls per call.)
fn drive<F>(connection: F, ping: Option<h2::PingPong>, peer: String, closed: Arc<AtomicBool>)
where
    F: std::future::Future<Output = Result<(), h2::Error>> + Send + 'static,
{
    let ended = closed.clone();
    let peer_name = peer.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(peer = %peer_name, "connection closed: {e}");
        }
        ended.store(true, Ordering::Relaxed);
    });
    if let Some(ping) = ping {
        tokio::spawn(keepalive(ping, task.abort_handle(), peer, closed));
    }
}

/// Detects a peer that vanished without closing the connection: PINGs it when idle, and
/// drops the connection (its task) when the answer does not come in time. Ends with the
/// connection.
async fn keepalive(
    mut ping: h2::PingPong,
    connection: tokio::task::AbortHandle,
    peer: String,
    closed: Arc<AtomicBool>,
) {
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        if connection.is_finished() {
            return;
        }
        match tokio::time::timeout(KEEPALIVE_TIMEOUT, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            _ => {
                if !connection.is_finished() {
                    tracing::debug!(peer = %peer, "no PING answer; dropping the connection");
                }
                closed.store(true, Ordering::Relaxed);
                connection.abort();
                return;
            }
        }
    }
}

/// Why an `h2` call failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The request never left (no connection, or the peer refused the stream unprocessed).
    NotSent(String),
    /// The request may have been processed.
    Failed(String),
}

/// Whom [`send_h2`] calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum To {
    /// An agent's gRPC server (or an A2A agent's): the request carries the headers gRPC
    /// requires, `content-type: application/grpc` and `te: trailers`.
    Agent,
    /// Another sidecar's mesh port. It reads neither header (no sidecar version ever has),
    /// so the hop goes without them: two headers fewer to encode, decode and check per
    /// call. Its answer is a gRPC answer as before. `hop`: the call's routing fields are in
    /// `ar-hop` (else, in the separate headers, the answer may say the peer reads it).
    Sidecar { hop: bool },
}

/// Sends a gRPC call with a unary request on `conn`: HEADERS and DATA are queued from this
/// task together, so they leave in one write. The answer streams back as [`Body::H2`].
pub(crate) async fn send_h2(
    conn: Conn,
    path: PathAndQuery,
    mut headers: HeaderMap,
    data: Vec<Bytes>,
    to: To,
) -> Result<Response<Body>, SendError> {
    let mut sender = conn.sender.ready().await.map_err(|e| SendError::NotSent(e.to_string()))?;
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(conn.authority);
    parts.path_and_query = Some(path);
    let uri = Uri::from_parts(parts).map_err(|e| SendError::NotSent(e.to_string()))?;
    if conn.state.sent.fetch_add(1, Ordering::Relaxed).is_multiple_of(PRIME_EVERY) {
        for name in [grpc::HEADER_GRPC_TIMEOUT, agent_reach_telemetry::trace::TRACEPARENT] {
            if let Some(v) = headers.get_mut(name) {
                v.set_sensitive(false);
            }
        }
    }
    if to == To::Agent {
        headers.insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
        headers.insert(grpc::HEADER_TE, grpc::TRAILERS);
    }
    let mut request = Request::new(());
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let (response, mut stream) =
        sender.send_request(request, data.is_empty()).map_err(|e| SendError::NotSent(e.to_string()))?;
    // Queuing the HEADERS woke the connection's task: dropping the previous call's stream
    // now wakes nothing (see `grpc::Parked`).
    conn.parked.release();
    let last = data.len().saturating_sub(1);
    let mut unsent = None;
    for (i, chunk) in data.into_iter().enumerate() {
        if let Err(e) = stream.send_data(chunk, i == last) {
            // The peer may answer before reading the request (a shed call's trailers-only
            // reply, then RST_STREAM(NO_ERROR), RFC 9113 §8.1): its answer still counts.
            unsent = Some(e.to_string());
            break;
        }
    }
    match response.await {
        // A stream whose request was not all sent is not closed at its answer's end: it is
        // not kept.
        Ok(mut resp) => {
            // A sidecar that reads `ar-hop` echoes the call's `ar-hop-ask` token; the answer
            // goes on without it.
            if to == (To::Sidecar { hop: false })
                && let Some(echo) = resp.headers_mut().remove(grpc::header::HOP_OK)
            {
                conn.state.learn(&echo);
            }
            let parked = unsent.is_none().then_some(conn.parked);
            Ok(resp.map(|recv| Body::H2(grpc::H2Body::new(recv, parked))))
        }
        Err(e) if unsent.is_some() => {
            Err(SendError::Failed(format!("{e} (sending the call: {})", unsent.unwrap_or_default())))
        }
        // REFUSED_STREAM: the peer did not process the stream (RFC 9113 §8.7).
        Err(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => Err(SendError::NotSent(e.to_string())),
        Err(e) => Err(SendError::Failed(e.to_string())),
    }
}

/// The data chunks of a (unary request) body, up to `limit` bytes, without copying.
pub(crate) async fn collect_chunks(mut body: Body, limit: usize) -> Result<Vec<Bytes>, String> {
    use http_body_util::BodyExt;
    let mut out = Vec::with_capacity(2);
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the call: {e}"))?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total > limit {
                return Err(format!("the call is larger than {limit} bytes"));
            }
            if !data.is_empty() {
                out.push(data);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use http::HeaderMap;

    use super::*;

    #[tokio::test]
    async fn slots_without_a_connection_are_dropped_past_the_cap() {
        // A peer that accepts HTTP/2 connections and keeps them open.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut conn) = h2::server::handshake(tcp).await {
                        while conn.accept().await.is_some() {}
                    }
                });
            }
        });
        let pool = Pool::default();
        let conn = pool.get(&live).await.expect("connects");
        // Addresses that never connect: their slots stay behind until the cap.
        for i in 0..MAX_IDLE_SLOTS * 2 {
            assert!(pool.get(&format!("not an address {i}")).await.is_err());
            let n = pool.slots.lock().unwrap().len();
            assert!(n <= MAX_IDLE_SLOTS + 1, "{n} slots after {i}");
        }
        // The slot with an open connection was kept, and serves the same connection.
        assert!(pool.slots.lock().unwrap().contains_key(&live));
        assert_eq!(pool.get(&live).await.unwrap().authority, conn.authority);
    }

    /// The next frame a raw peer reads: its 9-byte header and its payload (`None` once
    /// the connection ended).
    async fn read_frame(tcp: &mut tokio::net::TcpStream) -> Option<([u8; 9], Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await.ok()?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await.unwrap();
        Some((head, payload))
    }

    /// A peer written frame by frame, so that an answer and a reset leave in one write:
    /// it never opens a stream's receive window (no request body can be sent) and ends
    /// each stream as soon as its HEADERS arrive: the first with a trailers-only answer
    /// followed by RST_STREAM(NO_ERROR) (how a shed call ends, RFC 9113 §8.1), the second
    /// with REFUSED_STREAM, the third with INTERNAL_ERROR.
    /// Returns its address, a signal that the client has applied its settings, and the
    /// count of DATA frames it received.
    async fn peer_that_answers_before_reading()
    -> (String, tokio::sync::oneshot::Receiver<()>, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
            let len = (payload.len() as u32).to_be_bytes();
            let mut f = vec![len[1], len[2], len[3], kind, flags];
            f.extend_from_slice(&stream.to_be_bytes());
            f.extend_from_slice(payload);
            f
        }
        fn literal(name: &str, value: &str) -> Vec<u8> {
            // HPACK literal without indexing, new name, no Huffman coding.
            let mut b = vec![0, name.len() as u8];
            b.extend_from_slice(name.as_bytes());
            b.push(value.len() as u8);
            b.extend_from_slice(value.as_bytes());
            b
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (settled_tx, settled) = tokio::sync::oneshot::channel();
        let mut settled_tx = Some(settled_tx);
        let data_frames = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = data_frames.clone();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 24];
            tcp.read_exact(&mut preface).await.unwrap();
            // SETTINGS_INITIAL_WINDOW_SIZE = 0.
            tcp.write_all(&frame(0x4, 0, 0, &[0, 4, 0, 0, 0, 0])).await.unwrap();
            let mut requests = 0;
            while let Some((head, _)) = read_frame(&mut tcp).await {
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let out = match head[3] {
                    0x0 => {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    0x4 if head[4] & 1 == 0 => frame(0x4, 1, 0, &[]),
                    0x4 => {
                        // The client acknowledged the zero window.
                        if let Some(tx) = settled_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    0x1 => {
                        requests += 1;
                        match requests {
                            1 => {
                                let mut block = vec![0x88]; // :status 200
                                block.extend(literal("content-type", "application/grpc"));
                                block.extend(literal("grpc-status", "8"));
                                block.extend(literal("grpc-message", "shed"));
                                let mut both = frame(0x1, 0x1 | 0x4, stream, &block);
                                both.extend(frame(0x3, 0, stream, &0u32.to_be_bytes()));
                                both
                            }
                            2 => frame(0x3, 0, stream, &7u32.to_be_bytes()),
                            _ => frame(0x3, 0, stream, &2u32.to_be_bytes()),
                        }
                    }
                    _ => continue,
                };
                tcp.write_all(&out).await.unwrap();
            }
        });
        (addr, settled, data_frames)
    }

    #[tokio::test]
    async fn an_answer_before_the_body_was_sent_counts_and_resets_say_if_the_call_may_have_run() {
        let (addr, settled, data_frames) = peer_that_answers_before_reading().await;
        let pool = Pool::default();
        let body = || vec![Bytes::from(vec![7u8; 1024])];
        let conn = pool.get(&addr).await.unwrap();
        settled.await.unwrap();
        let resp = send_h2(conn.clone(), PathAndQuery::from_static("/a"), HeaderMap::new(), body(), To::Agent)
            .await
            .expect("the answer is used");
        assert_eq!(resp.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"8"[..]));
        let refused =
            send_h2(conn.clone(), PathAndQuery::from_static("/b"), HeaderMap::new(), body(), To::Agent).await.err();
        assert!(matches!(refused, Some(SendError::NotSent(_))), "{refused:?}");
        let reset = send_h2(conn, PathAndQuery::from_static("/c"), HeaderMap::new(), body(), To::Agent).await.err();
        assert!(matches!(reset, Some(SendError::Failed(_))), "{reset:?}");
        assert_eq!(data_frames.load(std::sync::atomic::Ordering::Relaxed), 0, "no request body was sent");
    }

    /// The header fields of an HPACK block that spell their names out (index 0), by walking
    /// its representations (RFC 7541 §6).
    fn literal_names(block: &[u8]) -> usize {
        fn int(b: &[u8], at: &mut usize, prefix: u8) -> usize {
            let max = (1usize << prefix) - 1;
            let mut n = usize::from(b[*at]) & max;
            *at += 1;
            if n == max {
                let mut shift = 0;
                loop {
                    let byte = b[*at];
                    *at += 1;
                    n += usize::from(byte & 0x7f) << shift;
                    shift += 7;
                    if byte & 0x80 == 0 {
                        break;
                    }
                }
            }
            n
        }
        fn skip_string(b: &[u8], at: &mut usize) {
            let len = int(b, at, 7);
            *at += len;
        }
        let (mut at, mut literal) = (0, 0);
        while at < block.len() {
            let first = block[at];
            let prefix = match first {
                f if f & 0x80 != 0 => {
                    int(block, &mut at, 7); // indexed field
                    continue;
                }
                f if f & 0xc0 == 0x40 => 6, // literal, incremental indexing
                f if f & 0xe0 == 0x20 => {
                    int(block, &mut at, 5); // table size update
                    continue;
                }
                _ => 4, // literal without indexing / never indexed
            };
            if int(block, &mut at, prefix) == 0 {
                literal += 1;
                skip_string(block, &mut at);
            }
            skip_string(block, &mut at);
        }
        literal
    }

    #[tokio::test]
    async fn the_per_call_headers_names_are_indexed_after_the_first_call_of_a_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A peer that keeps each request's header block and answers it trailers-only.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (blocks_tx, mut blocks) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 24];
            tcp.read_exact(&mut preface).await.unwrap();
            tcp.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
            while let Some((head, payload)) = read_frame(&mut tcp).await {
                let out = match head[3] {
                    0x4 if head[4] & 1 == 0 => vec![0, 0, 0, 0x4, 1, 0, 0, 0, 0],
                    0x1 => {
                        assert_eq!(head[4] & 0x4, 0x4, "one HEADERS frame per request");
                        let _ = blocks_tx.send(payload);
                        // :status 200, then grpc-status 0 (literal without indexing, new
                        // name), ending the stream.
                        let mut block = vec![0x88, 0, 11];
                        block.extend_from_slice(b"grpc-status");
                        block.extend_from_slice(&[1, b'0']);
                        let mut f = vec![0, 0, block.len() as u8, 0x1, 0x5];
                        f.extend_from_slice(&head[5..9]);
                        f.extend_from_slice(&block);
                        f
                    }
                    _ => continue,
                };
                tcp.write_all(&out).await.unwrap();
            }
        });
        let pool = Pool::default();
        let conn = pool.get(&addr).await.unwrap();
        let mut counts = Vec::new();
        for call in 0..3u64 {
            // As a hop sends them: both never-indexed, values new on every call.
            let mut headers = HeaderMap::new();
            grpc::set_timeout(&mut headers, Duration::from_millis(5_000 - call));
            let mut trace =
                http::HeaderValue::from_str(&format!("00-{:032x}-{:016x}-01", u128::from(call) + 1, call + 1)).unwrap();
            trace.set_sensitive(true);
            headers.insert(agent_reach_telemetry::trace::TRACEPARENT, trace);
            headers.insert("ar-instance", http::HeaderValue::from_static("i-1"));
            let resp = send_h2(
                conn.clone(),
                PathAndQuery::from_static("/a"),
                headers,
                vec![Bytes::from_static(b"x")],
                To::Agent,
            )
            .await
            .unwrap();
            assert_eq!(resp.headers()["grpc-status"], "0");
            counts.push(literal_names(&blocks.recv().await.unwrap()));
        }
        // The first call spells out every name not in the static table (te, ar-instance,
        // grpc-timeout, traceparent), indexing them; the calls after it refer to them
        // by index, the two never-indexed values' names included.
        assert_eq!(counts, [4, 0, 0]);
    }
    #[tokio::test]
    async fn a_call_to_an_agent_carries_the_grpc_headers_and_one_to_a_sidecar_does_not() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut server = h2::server::handshake(server_io).await.unwrap();
            while let Some(Ok((request, mut respond))) = server.accept().await {
                seen_tx.send(request.headers().clone()).unwrap();
                let mut send = respond.send_response(http::Response::new(()), false).unwrap();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                send.send_trailers(trailers).unwrap();
            }
        });
        let (sender, connection) = handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        let conn =
            Conn { sender, authority: Authority::from_static("peer:1"), state: Arc::default(), parked: Arc::default() };
        for to in [To::Agent, To::Sidecar { hop: false }] {
            let mut headers = HeaderMap::new();
            grpc::set_timeout(&mut headers, Duration::from_millis(1_000));
            headers.insert("ar-instance", http::HeaderValue::from_static("i-1"));
            let resp =
                send_h2(conn.clone(), PathAndQuery::from_static("/a"), headers, vec![Bytes::from_static(b"x")], to)
                    .await
                    .unwrap();
            assert_eq!(resp.status(), http::StatusCode::OK);
            let got = seen.recv().await.unwrap();
            let mut names: Vec<&str> = got.keys().map(http::HeaderName::as_str).collect();
            names.sort_unstable();
            let expected: &[&str] = match to {
                To::Agent => &["ar-instance", "content-type", "grpc-timeout", "te"],
                To::Sidecar { .. } => &["ar-instance", "grpc-timeout"],
            };
            assert_eq!(names, expected, "{to:?}");
            if to == To::Agent {
                assert_eq!(got["content-type"], "application/grpc");
                assert_eq!(got["te"], "trailers");
            }
        }
    }

    #[tokio::test]
    async fn a_sidecar_connection_learns_from_one_answer_that_its_peer_reads_ar_hop() {
        // Answers every call with `ar-hop-ok: <the request's ar-hop-ask>`, as a sidecar
        // answers a call made with the separate headers.
        let serve = |server_io| async move {
            let mut server = h2::server::handshake(server_io).await.unwrap();
            while let Some(Ok((request, mut respond))) = server.accept().await {
                let mut head = http::Response::new(());
                if let Some(token) = request.headers().get(grpc::header::HOP_ASK) {
                    head.headers_mut().insert(grpc::header::HOP_OK, token.clone());
                }
                let mut send = respond.send_response(head, false).unwrap();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                send.send_trailers(trailers).unwrap();
            }
        };
        for to in [To::Agent, To::Sidecar { hop: true }, To::Sidecar { hop: false }] {
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            tokio::spawn(serve(server_io));
            let (sender, connection) = handshake(client_io).await.unwrap();
            tokio::spawn(connection);
            let conn = Conn {
                sender,
                authority: Authority::from_static("peer:1"),
                state: Arc::default(),
                parked: Arc::default(),
            };
            assert!(!conn.speaks_hop(), "a new connection starts with the separate headers");
            // An answer echoing another token (an agent's own, passed on by an older
            // sidecar) teaches nothing.
            let mut headers = HeaderMap::new();
            headers.insert(grpc::header::HOP_ASK, http::HeaderValue::from_static("not-the-token"));
            let resp =
                send_h2(conn.clone(), PathAndQuery::from_static("/a"), headers, vec![Bytes::from_static(b"x")], to)
                    .await
                    .unwrap();
            assert!(!conn.speaks_hop(), "{to:?}: another token");
            assert_eq!(resp.headers().contains_key("ar-hop-ok"), to == To::Agent || to == (To::Sidecar { hop: true }));
            let mut headers = HeaderMap::new();
            headers.insert(grpc::header::HOP_ASK, conn.hop_token().clone());
            let resp =
                send_h2(conn.clone(), PathAndQuery::from_static("/a"), headers, vec![Bytes::from_static(b"x")], to)
                    .await
                    .unwrap();
            match to {
                // An agent's answer is passed on as it came, and teaches nothing; nor does an
                // answer to a call that was already in `ar-hop` (no sidecar says it then).
                To::Agent | To::Sidecar { hop: true } => {
                    assert!(!conn.speaks_hop(), "{to:?}");
                    assert_eq!(resp.headers()["ar-hop-ok"], conn.hop_token());
                }
                To::Sidecar { hop: false } => {
                    assert!(conn.speaks_hop());
                    // The token came back as sent: a sidecar that reads `ar-hop` but answers
                    // as gRPC does.
                    assert!(!conn.answers_whole());
                    assert!(!resp.headers().contains_key("ar-hop-ok"), "not passed on to the caller");
                }
            }
        }
    }

    #[test]
    fn the_echo_of_the_token_says_whether_the_peer_answers_whole() {
        let token = ConnState::default().token.to_str().unwrap().to_string();
        assert!(token.ends_with('+') && token.len() == 17, "{token}");
        let echo = |v: &str| {
            let state = ConnState::default();
            let token = state.token.to_str().unwrap().to_string();
            let v = v.replace("TOKEN", &token).replace("BARE", &token[..16]);
            state.learn(&http::HeaderValue::from_str(&v).unwrap());
            (state.hop.load(Ordering::Relaxed), state.whole.load(Ordering::Relaxed))
        };
        // A sidecar of the previous version echoes the token as it came.
        assert_eq!(echo("TOKEN"), (true, false));
        assert_eq!(echo("TOKEN+"), (true, true));
        // Nor is the token without its mark.
        for other in ["TOKEN++", "TOKENx", "x", "", "TOKEN +", "BARE", "BARE+x"] {
            assert_eq!(echo(other), (false, false), "{other:?}");
        }
    }

    /// A client connection over an in-memory pipe to an `h2` server that answers every call
    /// with HEADERS, one DATA frame and trailers; the connection's task counts its polls.
    async fn counted_connection() -> (Conn, Arc<std::sync::atomic::AtomicUsize>) {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut server = h2::server::handshake(server_io).await.unwrap();
            while let Some(Ok((_request, mut respond))) = server.accept().await {
                let mut send = respond.send_response(http::Response::new(()), false).unwrap();
                send.send_data(Bytes::from_static(b"answer"), false).unwrap();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                send.send_trailers(trailers).unwrap();
            }
        });
        let (sender, connection) = handshake(client_io).await.unwrap();
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = polls.clone();
        let mut connection = Box::pin(connection);
        tokio::spawn(std::future::poll_fn(move |cx| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            connection.as_mut().poll(cx)
        }));
        let conn =
            Conn { sender, authority: Authority::from_static("peer:1"), state: Arc::default(), parked: Arc::default() };
        (conn, polls)
    }

    /// Lets every task that is ready run until none is (one thread: nothing runs meanwhile).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// Reads a body to its end and returns its data and trailers, keeping the body.
    async fn read_all(body: &mut Body) -> (Vec<u8>, Option<HeaderMap>) {
        use http_body_util::BodyExt;
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    #[tokio::test]
    async fn an_ended_answer_dropped_between_calls_does_not_poll_the_connection_again() {
        let (conn, polls) = counted_connection().await;
        let polled = || polls.load(std::sync::atomic::Ordering::Relaxed);
        for call in 0..3 {
            let resp = send_h2(
                conn.clone(),
                PathAndQuery::from_static("/a"),
                HeaderMap::new(),
                vec![Bytes::from_static(b"x")],
                To::Agent,
            )
            .await
            .unwrap();
            assert!(!conn.parked.is_kept(), "call {call}: sending it dropped the previous call's stream");
            let mut body = resp.into_body();
            let (data, trailers) = read_all(&mut body).await;
            assert!(conn.parked.is_kept(), "call {call}: its stream is kept once it ended");
            assert_eq!(data, b"answer");
            assert_eq!(trailers.unwrap()["grpc-status"], "0");
            settle().await;
            let before = polled();
            drop(body);
            settle().await;
            assert_eq!(polled(), before, "call {call}: dropping the ended answer polled the connection");
        }

        // The same answer read without a slot: h2 wakes the connection when the stream's
        // last handle drops (what the slot saves).
        let mut sender = conn.sender.clone().ready().await.unwrap();
        let mut request = Request::new(());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = Uri::from_static("http://peer:1/a");
        let (response, send) = sender.send_request(request, true).unwrap();
        drop(send);
        let recv = response.await.unwrap().into_body();
        let mut body = Body::H2(grpc::H2Body::new(recv, None));
        assert_eq!(read_all(&mut body).await.0, b"answer");
        settle().await;
        let before = polled();
        drop(body);
        settle().await;
        assert_eq!(polled(), before + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_answering_pings_loses_its_connection() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        // The peer answers (its connection is polled) until told to stop, then keeps the
        // connection open without ever polling it again: a host that vanished.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let peer = tokio::spawn(async move {
            let mut server = h2::server::handshake(server_io).await.unwrap();
            tokio::select! {
                _ = async { while server.accept().await.is_some() {} } => unreachable!("the client keeps it open"),
                _ = stopped => {}
            }
            server
        });
        let (sender, mut connection) = handshake(client_io).await.unwrap();
        let ping = connection.ping_pong();
        let closed = Arc::new(AtomicBool::new(false));
        drive(connection, ping, "peer:1".into(), closed.clone());
        let start = tokio::time::Instant::now();
        // The first PING (at KEEPALIVE) is answered.
        tokio::time::sleep(KEEPALIVE + Duration::from_secs(1)).await;
        assert!(!closed.load(Ordering::Relaxed));
        stop.send(()).unwrap();
        let _vanished = peer.await.unwrap();
        // The second (at 2 × KEEPALIVE) is not: the connection goes KEEPALIVE_TIMEOUT later.
        tokio::time::sleep_until(start + KEEPALIVE * 2 + KEEPALIVE_TIMEOUT - Duration::from_millis(100)).await;
        assert!(!closed.load(Ordering::Relaxed), "closed before the PING's answer was due");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(closed.load(Ordering::Relaxed), "still open after the PING went unanswered");
        assert!(sender.ready().await.is_err(), "the connection's task ended");
    }
}
