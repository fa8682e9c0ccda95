//! Slow hostile HTTP/2 clients, against the sidecar's local port, its mesh port over mutual
//! TLS, and control's gRPC port over TLS and in plaintext: slowloris on headers (the
//! HEADERS frame, or the preface itself, trickled a byte at a time), a connection idle
//! after one call, a request body that never ends on control, and a reply stalled at
//! flow-control window 0 (the client advertises a window of 0 and never sends
//! WINDOW_UPDATE; the sidecar resets the stream, control closes the connection). Each:
//! the abuser's connection (or stream) is closed within the configured time, the counter
//! of the limit is exact, and a well-behaved client on the same port at the same time sees
//! every call succeed.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::{
    Backend, TestStore, init_logging, sidecar_config, start_control, start_control_plaintext, start_sidecar,
    start_sidecar_with_admin, wait_for_instances,
};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use crate::abuse::{DELIVER, EMPTY_MESSAGE, HEALTH_CHECK, INVOKE, Legit, RawH2, assert_limit, get, tls, worker};
use crate::floods::{PREFACE, frame, hpack_request};

/// A request for capability "echo" with `payload`, in a gRPC frame (an `InvokeRequest`,
/// or the `HandleRequest` of a delivery: fields 1 and 2 are the same).
pub(crate) fn echo_request(payload: &[u8]) -> Bytes {
    fn varint(mut n: usize, out: &mut Vec<u8>) {
        while n >= 0x80 {
            out.push(u8::try_from(n & 0x7f).unwrap() | 0x80);
            n >>= 7;
        }
        out.push(u8::try_from(n).unwrap());
    }
    let mut msg = vec![0x0a, 6, 0x12, 4];
    msg.extend_from_slice(b"echo");
    msg.push(0x12);
    varint(payload.len(), &mut msg);
    msg.extend_from_slice(payload);
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    framed.extend(msg);
    Bytes::from(framed)
}

/// How a slowloris trickles its bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slowloris {
    /// The preface and SETTINGS at once, then a HEADERS frame a byte at a time.
    Headers,
    /// The preface itself a byte at a time.
    Preface,
}

impl Slowloris {
    /// (Bytes sent at once, bytes trickled.)
    fn bytes(self) -> (Vec<u8>, Vec<u8>) {
        let mut settings = PREFACE.to_vec();
        settings.extend(frame(4, 0, 0, &[]));
        match self {
            Slowloris::Headers => (settings, frame(1, 0x4, 1, &hpack_request())),
            Slowloris::Preface => (Vec::new(), settings),
        }
    }
}

/// Connects, then writes `kind`'s bytes, one every `every`, reading whatever the server sends,
/// until the server closes the connection: how long that took. Panics if it is still
/// open once every byte was sent.
pub(crate) async fn slowloris<S>(connect: impl Future<Output = S>, kind: Slowloris, every: Duration) -> Duration
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let io = connect.await;
    let started = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(io);
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    });
    let (head, slow) = kind.bytes();
    let mut written = wr.write_all(&head).await.is_ok();
    for b in &slow {
        if !written || reader.is_finished() {
            break;
        }
        tokio::time::sleep(every).await;
        written = wr.write_all(std::slice::from_ref(b)).await.is_ok();
    }
    let closed = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap_or_else(|_| panic!("{kind:?}: the connection is still open"))
        .unwrap();
    closed - started
}

/// The value of the metric line starting with `name ` (no labels) in `/metrics` at `admin`.
async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let metrics = get(admin, "/metrics").await;
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

async fn tcp(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

const HEADER_READ: Duration = Duration::from_secs(1);
/// How much later than the server the client may start its clock (connections of a
/// `join!` are made together, TLS handshakes taking turns on the client's runtime).
const SKEW: Duration = Duration::from_millis(100);
/// A trickled byte every 150 ms: a HEADERS frame (60 bytes) takes 9 s, the preface 5 s.
const TRICKLE: Duration = Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_on_the_local_and_mtls_mesh_ports_is_closed_after_the_header_read_timeout() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.header_read_timeout = HEADER_READ;
    let sidecar = start_sidecar(config).await;
    let agent = worker(sidecar.local_addr(), 0).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;
    let (local, mesh) = (sidecar.local_addr(), sidecar.mesh_addr());
    let legit_local = Legit::start(local).await;
    let legit_mesh = crate::floods::Legit::start(tls(mesh, "well-behaved").await).await;

    let closed = tokio::join!(
        slowloris(tcp(local), Slowloris::Headers, TRICKLE),
        slowloris(tcp(local), Slowloris::Preface, TRICKLE),
        slowloris(tls(mesh, "abuser"), Slowloris::Headers, TRICKLE),
        slowloris(tls(mesh, "abuser"), Slowloris::Preface, TRICKLE),
    );
    // GOAWAY at the timeout; the sidecar drops a connection that has not closed after
    // GOAWAY one more header-read timeout later (the abuser never answers its PING).
    for (what, after) in [
        ("local headers", closed.0),
        ("local preface", closed.1),
        ("mesh headers", closed.2),
        ("mesh preface", closed.3),
    ] {
        assert!(
            after >= HEADER_READ - SKEW && after < HEADER_READ * 2 + Duration::from_secs(1),
            "{what}: closed after {after:?}"
        );
    }
    assert_eq!(sidecar.limit_refusals(false, "header_read_timeout"), 2);
    assert_eq!(sidecar.limit_refusals(true, "header_read_timeout"), 2);

    let (ok, failed) = legit_local.finish().await;
    assert_eq!(failed, 0, "legitimate calls failed on the local port");
    assert!(ok > 10, "{ok} legitimate calls");
    legit_mesh.assert_all_served("mesh port").await;
    agent.shutdown().await;
    sidecar.stop().await;
}

/// Control on a fresh port with `limits`: over TLS with the harness's identity, or in
/// plaintext.
fn control_with(ts: &TestStore, limits: agent_reach_control::limits::GrpcLimits, tls: bool) -> ControlHandle {
    let config = ControlConfig { lease_ttl: Duration::from_secs(15), grpc_limits: limits, ..ControlConfig::default() };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    if tls {
        agent_reach_e2e::start_control_with(ts.store.clone(), config, listener)
    } else {
        ControlHandle::spawn(ts.store.clone(), config, listener).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_idle_connections_and_stalled_bodies_on_the_control_port_are_closed_in_time() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let limits = agent_reach_control::limits::GrpcLimits {
        header_read_timeout: HEADER_READ,
        idle_timeout: Duration::from_millis(1500),
        request_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let secure = control_with(&ts, limits.clone(), true);
    let plain = control_with(&ts, limits, false);
    let legit_secure = crate::floods::Legit::start(tls(secure.addr(), "well-behaved").await).await;
    let legit_plain = crate::floods::Legit::start(TcpStream::connect(plain.addr()).await.unwrap()).await;

    let closed = tokio::join!(
        slowloris(tls(secure.addr(), "abuser"), Slowloris::Headers, TRICKLE),
        slowloris(tls(secure.addr(), "abuser"), Slowloris::Preface, TRICKLE),
        slowloris(tcp(plain.addr()), Slowloris::Headers, TRICKLE),
        slowloris(tcp(plain.addr()), Slowloris::Preface, TRICKLE),
    );
    // Control's guard closes the connection at the deadline itself.
    for (what, after) in
        [("TLS headers", closed.0), ("TLS preface", closed.1), ("plain headers", closed.2), ("plain preface", closed.3)]
    {
        assert!(
            after >= HEADER_READ - SKEW && after < HEADER_READ + Duration::from_secs(1),
            "{what}: closed after {after:?}"
        );
    }

    // A connection that makes one call and then nothing is closed after the idle timeout.
    let mut idle = RawH2::connect(plain.addr()).await;
    assert_eq!(idle.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    let t = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut idle.conn).await;
    assert!(ended.is_ok(), "the idle connection is closed");
    assert!(t.elapsed() >= Duration::from_millis(1400), "closed after {:?}", t.elapsed());

    // A request whose body never ends is refused at the request timeout, with a reason.
    let mut stalled = RawH2::connect(plain.addr()).await;
    let (resp, _body) = stalled.start("/agentreach.v1.Control/Register", &[]).await;
    let t = Instant::now();
    assert_limit(&crate::abuse::status_of(resp).await, "request-timeout");
    assert!(t.elapsed() >= Duration::from_millis(950), "refused after {:?}", t.elapsed());
    // (Closed now, so it cannot idle out before the counts are read.)
    drop(stalled);

    for (control, idles, timeouts) in [(&secure, 0, 0), (&plain, 1, 1)] {
        let conn = &control.stats().conn;
        assert_eq!(conn.count("header_read_timeout"), 2);
        assert_eq!(conn.count("idle_timeout"), idles);
        assert_eq!(conn.count("request_timeout"), timeouts);
    }
    legit_secure.assert_all_served("control over TLS").await;
    legit_plain.assert_all_served("control in plaintext").await;
}

/// A raw client that advertises a stream window of 0 and never raises it.
async fn window_zero(addr: SocketAddr) -> RawH2 {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    RawH2::over(TcpStream::connect(addr).await.unwrap(), addr, builder).await
}

/// The same over TLS (a harness certificate named `abuser`).
async fn window_zero_tls(addr: SocketAddr) -> RawH2 {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    RawH2::over(tls(addr, "abuser").await, addr, builder).await
}

/// Waits for the connection of a stalled call to be closed: how long after `started`.
async fn closed_after(started: Instant, conn: &mut RawH2) -> Duration {
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut conn.conn).await;
    assert!(ended.is_ok(), "the stalled connection is closed");
    started.elapsed()
}

const CONTROL_SEND_STALL: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_stalled_at_window_zero_on_the_control_port_close_the_connection_after_the_send_stall_timeout() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let limits =
        agent_reach_control::limits::GrpcLimits { send_stall_timeout: CONTROL_SEND_STALL, ..Default::default() };
    let secure = control_with(&ts, limits.clone(), true);
    let plain = control_with(&ts, limits, false);
    let legit_secure = crate::floods::Legit::start(tls(secure.addr(), "well-behaved").await).await;
    let legit_plain = crate::floods::Legit::start(TcpStream::connect(plain.addr()).await.unwrap()).await;

    // A health check each, whose answer (a 5-byte message) a window of 0 lets none of
    // through: the stream's window is 0 from its request on.
    let mut over_tls = window_zero_tls(secure.addr()).await;
    let mut in_plain = window_zero(plain.addr()).await;
    let body = Bytes::from_static(EMPTY_MESSAGE);
    let tls_sent = Instant::now();
    let (tls_started, _tls_body) = stalled_call(&mut over_tls, HEALTH_CHECK, &[], body.clone()).await;
    let plain_sent = Instant::now();
    let (plain_started, _plain_body) = stalled_call(&mut in_plain, HEALTH_CHECK, &[], body).await;
    let (tls_after, plain_after) =
        tokio::join!(closed_after(tls_sent, &mut over_tls), closed_after(plain_sent, &mut in_plain));
    // Closed no earlier than the timeout after the answer's headers, and within 0.5 s of
    // it after the request was sent.
    for (what, after, headers_at, sent) in
        [("TLS", tls_after, tls_started, tls_sent), ("plain", plain_after, plain_started, plain_sent)]
    {
        let since_headers = after.saturating_sub(headers_at - sent);
        assert!(
            since_headers >= CONTROL_SEND_STALL - SKEW && after < CONTROL_SEND_STALL + Duration::from_millis(500),
            "{what}: closed {after:?} after the request ({since_headers:?} after the answer's headers)"
        );
    }
    for control in [&secure, &plain] {
        let conn = &control.stats().conn;
        assert_eq!(conn.count("send_stall_timeout"), 1);
        assert_eq!(conn.count("idle_timeout"), 0);
        assert_eq!(conn.count("header_read_timeout"), 0);
    }
    // The legitimate clients, whose windows stay open, were served all along.
    legit_secure.assert_all_served("control over TLS").await;
    legit_plain.assert_all_served("control in plaintext").await;
    for control in [&secure, &plain] {
        assert_eq!(control.stats().conn.count("send_stall_timeout"), 1);
    }
}

/// Starts a call to `path` on `conn` sending `body`: the answer's headers arrived, and
/// its body, which cannot arrive.
async fn stalled_call(
    conn: &mut RawH2,
    path: &str,
    headers: &[(String, String)],
    body: Bytes,
) -> (Instant, h2::RecvStream) {
    let (resp, mut send) = conn.start(path, headers).await;
    send.send_data(body, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp).await.expect("answer headers").unwrap();
    assert_eq!(resp.status(), 200);
    (Instant::now(), resp.into_body())
}

/// Waits for the stalled reply's reset: how long after its headers it came.
async fn reset_after(started: Instant, mut body: h2::RecvStream) -> Duration {
    let frame = tokio::time::timeout(Duration::from_secs(10), body.data()).await.expect("the stream is reset");
    let err = frame.expect("no data frame at window 0").expect_err("a reset, not data");
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err}");
    started.elapsed()
}

const SEND_STALL: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_stalled_at_window_zero_are_reset_after_the_send_stall_timeout_and_free_their_slots() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.send_stall_timeout = SEND_STALL;
    let sidecar = start_sidecar_with_admin(config).await;
    let admin = sidecar.admin_addr().unwrap();
    // Two slots: a stalled reply holds one until it is reset.
    let agent = worker(sidecar.local_addr(), 2).await;
    let instance = agent.instance_id();
    wait_for_instances(&sidecar, std::slice::from_ref(&instance)).await;
    let payload = vec![b'a'; 256 * 1024];

    // An Invoke on the local port and a delivery on the mesh port, each answered with
    // 256 KiB that a window of 0 lets none of through.
    let mut local = window_zero(sidecar.local_addr()).await;
    let (local_started, local_body) = stalled_call(&mut local, INVOKE, &[], echo_request(&payload)).await;
    let deliver_headers =
        vec![("ar-instance".to_string(), instance.clone()), ("ar-tenant".to_string(), "default".to_string())];
    let mut mesh = window_zero(sidecar.mesh_addr()).await;
    let (mesh_started, mesh_body) = stalled_call(&mut mesh, DELIVER, &deliver_headers, echo_request(&payload)).await;
    // The delivery holds its admission slot at the agent while it waits (its answer is
    // passed through); the Invoke's answer was read whole from the agent, so it holds no
    // agent slot, only its 256 KiB and its connection's request in flight.
    assert_eq!(metric(admin, "agent_reach_in_flight_inbound").await, 1.0);

    // Both are reset after the send-stall timeout; meanwhile a legitimate caller, whose
    // calls need a slot, is served.
    let legit = Legit::start(sidecar.local_addr()).await;
    let (local_after, mesh_after) =
        tokio::join!(reset_after(local_started, local_body), reset_after(mesh_started, mesh_body));
    for (what, after) in [("local", local_after), ("mesh", mesh_after)] {
        assert!(
            after >= SEND_STALL - Duration::from_millis(100) && after < SEND_STALL + Duration::from_secs(2),
            "{what}: reset after {after:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failed) = legit.finish().await;
    assert_eq!(failed, 0, "legitimate calls failed");
    assert!(ok > 10, "{ok} legitimate calls");
    assert_eq!(sidecar.limit_refusals(false, "send_stall_timeout"), 1);
    assert_eq!(sidecar.limit_refusals(true, "send_stall_timeout"), 1);
    // Their slots are free and nothing is in flight; the abusers' connections still serve
    // (an answer without a body needs no window).
    assert_eq!(metric(admin, "agent_reach_in_flight_inbound").await, 0.0);
    assert_eq!(sidecar.calls_in_flight(), 0);
    assert_eq!(local.call(INVOKE, &[], EMPTY_MESSAGE).await.code(), Code::InvalidArgument);
    assert!(!mesh.conn.is_finished(), "the mesh abuser's connection is open");
    let metrics = get(admin, "/metrics").await;
    for port in ["local", "mesh"] {
        let line = format!("agent_reach_limit_refusals_total{{port=\"{port}\",limit=\"send_stall_timeout\"}} 1\n");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }

    // A reader with a small window that keeps reading is not reset, however long the
    // reply takes: 256 KiB through a 4 KiB window, 40 ms a window (2.6 s in all).
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(4096);
    let addr = sidecar.local_addr();
    let mut slow = RawH2::over(TcpStream::connect(addr).await.unwrap(), addr, builder).await;
    let (resp, mut send) = slow.start(INVOKE, &[]).await;
    send.send_data(echo_request(&payload), true).unwrap();
    let mut body = resp.await.unwrap().into_body();
    let mut received = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("a slow reader that keeps reading is not reset");
        received += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(received > payload.len(), "the whole answer arrived: {received} bytes");
    assert_eq!(sidecar.limit_refusals(false, "send_stall_timeout"), 1);
    agent.shutdown().await;
    sidecar.stop().await;
}
