//! HTTP/2 frame floods from a hostile client written frame by frame on a raw socket (PING,
//! SETTINGS, empty DATA and CONTINUATION floods), against the sidecar's local port, its
//! mesh port over mutual TLS, and control's gRPC port over TLS and in plaintext. Each: the
//! abuser gets GOAWAY ENHANCE_YOUR_CALM naming the flood (or, when it was still writing as
//! the server closed, a reset socket) and its connection ends within seconds, the counter
//! of the limit is exact, and a well-behaved client on the same port running at the same
//! time sees every call succeed. PING and SETTINGS floods are closed by our guard
//! (`agent_reach_support::h2guard`); empty DATA and CONTINUATION floods by h2 itself. Also the connection caps: per verified peer on the mesh
//! port, and in all on control's port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent_reach_e2e::secure::sidecar_tls;
use agent_reach_e2e::{
    Backend, TestStore, init_logging, sidecar_config, start_control, start_control_plaintext, start_sidecar,
};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const EMPTY_MESSAGE: &[u8] = &[0, 0, 0, 0, 0];
const ENHANCE_YOUR_CALM: u32 = 0xb;

pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The floods: what one frame of each is, and how it starts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Flood {
    Ping,
    Settings,
    EmptyData,
    Continuation,
}

impl Flood {
    /// Bytes sent once after the preface and SETTINGS.
    fn opening(self) -> Vec<u8> {
        match self {
            // A request left open, for the empty DATA frames to go on.
            Flood::EmptyData => frame(1, 0x4, 1, &hpack_request()),
            // A HEADERS frame without END_HEADERS: CONTINUATION frames must follow.
            Flood::Continuation => frame(1, 0, 1, &[]),
            Flood::Ping | Flood::Settings => Vec::new(),
        }
    }

    fn frame(self) -> Vec<u8> {
        match self {
            Flood::Ping => frame(6, 0, 0, &[1; 8]),
            Flood::Settings => frame(4, 0, 0, &[]),
            Flood::EmptyData => frame(0, 0, 1, &[]),
            Flood::Continuation => frame(9, 0, 1, &[]),
        }
    }

    /// The GOAWAY debug data expected.
    fn debug(self) -> &'static str {
        match self {
            Flood::Ping => "ping_flood",
            Flood::Settings => "settings_flood",
            // h2's own protections: 100 empty DATA frames per connection, and CONTINUATION
            // frames past what the header list limit needs.
            Flood::EmptyData => "too_many_data_frames",
            Flood::Continuation => "too_many_continuations",
        }
    }

    /// Whether our guard (and its counter) closes this flood, rather than h2.
    fn guarded(self) -> bool {
        matches!(self, Flood::Ping | Flood::Settings)
    }
}

/// A POST of Health/Check, HPACK-encoded without Huffman or indexing.
pub(crate) fn hpack_request() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    for (name, value) in [(":path", HEALTH_CHECK), (":authority", "x"), ("content-type", "application/grpc")] {
        block.push(0x00);
        block.push(u8::try_from(name.len()).unwrap());
        block.extend_from_slice(name.as_bytes());
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// How the server ended the abuser's connection.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The GOAWAY's error code and debug data, if one arrived.
    goaway: Option<(u32, String)>,
    /// The read error that ended the connection, if any (a reset).
    error: Option<std::io::ErrorKind>,
    /// Flood frames written before the server closed.
    sent: usize,
}

/// Sends `flood` (at most `max` frames) on `io` and reads the server's frames until the
/// connection ends; panics if it has not ended 10 s after the flood.
pub(crate) async fn flood<S: AsyncRead + AsyncWrite + Send + 'static>(io: S, flood: Flood, max: usize) -> Ended {
    let (mut rd, mut wr) = tokio::io::split(io);
    let reader = tokio::spawn(async move {
        let mut goaway = None;
        let mut head = [0u8; 9];
        loop {
            if let Err(e) = rd.read_exact(&mut head).await {
                let error = (e.kind() != std::io::ErrorKind::UnexpectedEof).then_some(e.kind());
                return (goaway, error);
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if let Err(e) = rd.read_exact(&mut payload).await {
                return (goaway, Some(e.kind()));
            }
            if head[3] == 7 && len >= 8 {
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                goaway = Some((code, String::from_utf8_lossy(&payload[8..]).into_owned()));
            }
        }
    });
    let mut start = PREFACE.to_vec();
    start.extend(frame(4, 0, 0, &[]));
    start.extend(flood.opening());
    let mut sent = 0;
    if wr.write_all(&start).await.is_ok() {
        let batch: Vec<u8> = (0..64).flat_map(|_| flood.frame()).collect();
        while sent < max && !reader.is_finished() {
            if wr.write_all(&batch).await.is_err() {
                break;
            }
            sent += 64;
        }
    }
    let (goaway, error) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .unwrap_or_else(|_| panic!("{flood:?}: the connection is still open 10 s after {sent} frames"))
        .unwrap();
    Ended { goaway, error, sent }
}

/// The abuser was cut off for `flood`: GOAWAY ENHANCE_YOUR_CALM naming it, or a reset
/// socket when the server closed while the abuser was still writing. (How many frames the
/// abuser wrote says little: the kernel takes megabytes before a reset comes back; the
/// counters of the ports say which limit closed it.)
pub(crate) fn assert_cut_off(ended: &Ended, flood: Flood) {
    match &ended.goaway {
        Some((code, debug)) => {
            assert_eq!(*code, ENHANCE_YOUR_CALM, "{flood:?}: {ended:?}");
            assert_eq!(debug, flood.debug(), "{flood:?}: {ended:?}");
        }
        None => assert!(
            matches!(ended.error, Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)),
            "{flood:?}: the connection ended without GOAWAY or reset: {ended:?}"
        ),
    }
    tracing::info!(?flood, sent = ended.sent, "abuser cut off");
}

/// A well-behaved client: Health/Check every 20 ms on its own HTTP/2 connection until
/// stopped; counts the calls that succeeded and failed.
pub(crate) struct Legit {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Legit {
    pub(crate) async fn start<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: S) -> Legit {
        let (send, conn) = h2::client::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let (ok, failed, stop) =
            (Arc::<AtomicU64>::default(), Arc::<AtomicU64>::default(), Arc::<AtomicBool>::default());
        let (o, f, s) = (ok.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut send = send;
            while !s.load(Ordering::Relaxed) {
                match health_check(&mut send).await {
                    Ok(()) => o.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::error!("legitimate call failed: {e}");
                        f.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Legit { ok, failed, stop, task }
    }

    /// Waits (5 s at most) until one call succeeded: the server has admitted the
    /// connection. Panics if none did.
    pub(crate) async fn served(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.ok.load(Ordering::Relaxed) == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(self.ok.load(Ordering::Relaxed) > 0, "{what}: no call served within 5 s");
    }

    /// Stops once it made three calls at least (5 s at most); panics unless every call
    /// succeeded.
    pub(crate) async fn assert_all_served(self, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.ok.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed) < 3
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let (ok, failed) = (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        assert_eq!(failed, 0, "{what}: legitimate calls failed ({ok} succeeded)");
        assert!(ok >= 3, "{what}: only {ok} legitimate calls");
    }
}

async fn health_check(send: &mut h2::client::SendRequest<Bytes>) -> Result<(), String> {
    let req = http::Request::post(format!("http://x{HEALTH_CHECK}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let ready = send.clone().ready().await.map_err(|e| e.to_string())?;
    *send = ready;
    let (resp, mut body) = send.send_request(req, false).map_err(|e| e.to_string())?;
    body.send_data(Bytes::from_static(EMPTY_MESSAGE), true).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(2), resp)
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
        .map_err(|e| e.to_string())?;
    let (parts, mut body) = resp.into_parts();
    if let Some(s) = tonic::Status::from_header_map(&parts.headers) {
        return if s.code() == tonic::Code::Ok { Ok(()) } else { Err(format!("{s:?}")) };
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.map_err(|e| e.to_string())?.unwrap_or_default();
    match tonic::Status::from_header_map(&trailers) {
        Some(s) if s.code() == tonic::Code::Ok => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// A TLS connection to a mesh or control port, presenting the certificate of sidecar `id`.
async fn tls(addr: SocketAddr, id: &str) -> impl AsyncRead + AsyncWrite + Unpin + Send + 'static {
    let config = sidecar_tls("default", id).client();
    agent_reach_identity::net::connect_tls(&addr.to_string(), config).await.unwrap()
}

const FLOODS: [Flood; 4] = [Flood::Ping, Flood::Settings, Flood::EmptyData, Flood::Continuation];
/// Frames an abuser sends at most: far past the budget (1,000 a second by default).
pub(crate) const MAX_FRAMES: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_floods_on_the_local_and_mtls_mesh_ports_close_the_abuser_only() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let sidecar = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let (local, mesh) = (sidecar.local_addr(), sidecar.mesh_addr());
    let legit_local = Legit::start(TcpStream::connect(local).await.unwrap()).await;
    let legit_mesh = Legit::start(tls(mesh, "well-behaved").await).await;

    for f in FLOODS {
        let ended = flood(TcpStream::connect(local).await.unwrap(), f, MAX_FRAMES).await;
        assert_cut_off(&ended, f);
        let ended = flood(tls(mesh, "abuser").await, f, MAX_FRAMES).await;
        assert_cut_off(&ended, f);
    }
    // Our guard counted the two floods it closed on each port; h2 closed the others.
    let guarded = u64::try_from(FLOODS.iter().filter(|f| f.guarded()).count()).unwrap();
    assert_eq!(sidecar.limit_refusals(false, "max_control_frames_per_second"), guarded);
    assert_eq!(sidecar.limit_refusals(true, "max_control_frames_per_second"), guarded);

    legit_local.assert_all_served("local port").await;
    legit_mesh.assert_all_served("mesh port").await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_floods_on_the_control_port_close_the_abuser_only() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    // Over TLS (a sidecar certificate) and in plaintext.
    let secure = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let plain = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let legit_secure = Legit::start(tls(secure.addr(), "well-behaved").await).await;
    let legit_plain = Legit::start(TcpStream::connect(plain.addr()).await.unwrap()).await;

    for f in FLOODS {
        let ended = flood(tls(secure.addr(), "abuser").await, f, MAX_FRAMES).await;
        assert_cut_off(&ended, f);
        let ended = flood(TcpStream::connect(plain.addr()).await.unwrap(), f, MAX_FRAMES).await;
        assert_cut_off(&ended, f);
    }
    let guarded = u64::try_from(FLOODS.iter().filter(|f| f.guarded()).count()).unwrap();
    for control in [&secure, &plain] {
        let conn = &control.stats().conn;
        assert_eq!(conn.count("max_connections"), 0);
        assert_eq!(conn.count("max_control_frames_per_second"), guarded);
    }

    legit_secure.assert_all_served("control over TLS").await;
    legit_plain.assert_all_served("control in plaintext").await;
}

/// Whether the server closes `io` within 2 s without sending anything.
async fn closed_at_once<S: AsyncRead + Unpin>(io: &mut S) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(Duration::from_secs(2), io.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mtls_mesh_port_caps_connections_per_peer_and_in_all_handshakes_included() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.max_connections = 4;
    config.limits.max_connections_per_peer = 2;
    let sidecar = start_sidecar(config).await;
    let mesh = sidecar.mesh_addr();

    // Two connections of peer x are served; its third is closed after the handshake.
    // The server finishes handshakes in any order, so the third connects only once the
    // first two are served.
    let x1 = Legit::start(tls(mesh, "peer-x").await).await;
    let x2 = Legit::start(tls(mesh, "peer-x").await).await;
    x1.served("peer x, first connection").await;
    x2.served("peer x, second connection").await;
    let mut x3 = tls(mesh, "peer-x").await;
    assert!(closed_at_once(&mut x3).await, "peer x's third connection is closed");
    assert_eq!(sidecar.limit_refusals(true, "max_connections_per_peer"), 1);
    // Peer y has its own count.
    let y1 = Legit::start(tls(mesh, "peer-y").await).await;
    // Three of four slots are taken; a TCP connection that never starts its handshake takes
    // the fourth, and the next is closed at once, before any handshake.
    let _silent = TcpStream::connect(mesh).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut surplus = TcpStream::connect(mesh).await.unwrap();
    assert!(closed_at_once(&mut surplus).await, "the connection past the cap is closed");
    assert_eq!(sidecar.limit_refusals(true, "max_connections"), 1);
    assert_eq!(sidecar.limit_refusals(true, "max_connections_per_peer"), 1);

    x1.assert_all_served("peer x, first connection").await;
    x2.assert_all_served("peer x, second connection").await;
    y1.assert_all_served("peer y").await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_port_caps_connections_handshakes_included() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let mut config = agent_reach_control::ControlConfig { lease_ttl: Duration::from_secs(15), ..Default::default() };
    config.grpc_limits.max_connections = 2;
    let control = agent_reach_e2e::start_control_with(ts.store.clone(), config, agent_reach_e2e::listener().await);
    let addr = control.addr();

    let served = Legit::start(tls(addr, "well-behaved").await).await;
    // A TCP connection that never starts its handshake holds the second slot.
    let silent = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut surplus = TcpStream::connect(addr).await.unwrap();
    assert!(closed_at_once(&mut surplus).await, "the connection past the cap is closed");
    assert_eq!(control.stats().conn.counts()[0], ("max_connections", 1));
    // Its slot freed, a new client is served.
    drop(silent);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = Legit::start(tls(addr, "another").await).await;
    again.assert_all_served("a client after a slot was freed").await;
    served.assert_all_served("the first client").await;
    assert_eq!(control.stats().conn.counts()[0], ("max_connections", 1));
}
