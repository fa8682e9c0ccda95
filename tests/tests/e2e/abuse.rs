//! Hostile HTTP/2 clients against the sidecar's local and mesh ports and control's gRPC
//! port, written with the `h2` crate directly (frames the SDKs would never send): oversized
//! header lists, stalled bodies, silent and idle connections, connections past the cap,
//! rapid resets. Each test checks what happens to the abuser's stream or connection (the
//! refusal, its reason, the counter on /metrics) and that a legitimate caller running at the
//! same time sees no failed call. The ports are plaintext here (control without identity),
//! so the raw client speaks HTTP/2 directly; the same HTTP/2 server serves them behind TLS.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_reach::{Agent, Client, Reply};
use agent_reach_e2e::{
    Backend, TestStore, init_logging, sidecar_config, start_control_plaintext, start_sidecar, start_sidecar_with_admin,
    wait_for_instances,
};
use bytes::Bytes;
use http::HeaderMap;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::Code;

pub(crate) const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
pub(crate) const INVOKE: &str = "/agentreach.v1.Sidecar/Invoke";
pub(crate) const DELIVER: &str = "/agentreach.v1.Mesh/Deliver";
/// An empty protobuf message in a gRPC frame.
pub(crate) const EMPTY_MESSAGE: &[u8] = &[0, 0, 0, 0, 0];
/// A rapid-reset abuser gives up after this many streams...
const RAPID_RESET_CAP: usize = 200_000;
/// ...or this long; the server must close the connection first.
const RAPID_RESET_WITHIN: Duration = Duration::from_secs(30);

/// One raw HTTP/2 connection.
pub(crate) struct RawH2 {
    addr: SocketAddr,
    send: h2::client::SendRequest<Bytes>,
    /// Ends when the connection does (with its error, e.g. a GOAWAY).
    pub(crate) conn: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl RawH2 {
    pub(crate) async fn connect(addr: SocketAddr) -> RawH2 {
        RawH2::over(TcpStream::connect(addr).await.unwrap(), addr, h2::client::Builder::new()).await
    }

    /// HTTP/2 with `builder`'s settings over `io`, a connection to `addr` (e.g. TLS).
    pub(crate) async fn over<IO>(io: IO, addr: SocketAddr, builder: h2::client::Builder) -> RawH2
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, conn) = builder.handshake(io).await.unwrap();
        RawH2 { addr, send, conn: tokio::spawn(conn) }
    }

    /// Sends a POST to `path` with `headers`, the body left open.
    pub(crate) async fn start(
        &mut self,
        path: &str,
        headers: &[(String, String)],
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        let mut req = http::Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let send = self.send.clone().ready().await.unwrap();
        self.send = send;
        self.send.send_request(req.body(()).unwrap(), false).unwrap()
    }

    /// Rapid reset (CVE-2023-44487): opens streams to `path` and cancels each at once,
    /// until the server closes the connection. Asserts the server cut it off (GOAWAY
    /// ENHANCE_YOUR_CALM or a closed socket) before [`RAPID_RESET_CAP`] streams and within
    /// [`RAPID_RESET_WITHIN`].
    ///
    /// How many streams that takes depends on how far the server's reads lag the client's
    /// writes (h2 counts resets of streams not yet accepted), so the test bounds it loosely
    /// and asserts who closed the connection, not an exact count.
    pub(crate) async fn rapid_reset(&mut self, path: &str) {
        let started = Instant::now();
        let mut sent = 0;
        while sent < RAPID_RESET_CAP && started.elapsed() < RAPID_RESET_WITHIN {
            let Ok(send) = self.send.clone().ready().await else { break };
            self.send = send;
            let req = http::Request::post(format!("http://{}{path}", self.addr))
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let Ok((_resp, mut stream)) = self.send.send_request(req, false) else { break };
            stream.send_reset(h2::Reason::CANCEL);
            sent += 1;
            if sent % 64 == 0 {
                // Let the connection task write the frames and read the server's GOAWAY.
                tokio::task::yield_now().await;
            }
        }
        let ended = tokio::time::timeout(Duration::from_secs(5), &mut self.conn).await;
        let ended = ended.expect("the abuser's connection is closed").unwrap();
        assert_cut_off(ended.expect_err("closed with an error"));
        assert!(
            sent < RAPID_RESET_CAP && started.elapsed() < RAPID_RESET_WITHIN,
            "{sent} streams sent in {:?} and the connection still open",
            started.elapsed()
        );
        tracing::info!(sent, elapsed = ?started.elapsed(), "rapid reset stopped");
    }

    /// A whole unary call: its gRPC status.
    pub(crate) async fn call(&mut self, path: &str, headers: &[(String, String)], body: &[u8]) -> tonic::Status {
        let (resp, mut stream) = self.start(path, headers).await;
        stream.send_data(Bytes::copy_from_slice(body), true).unwrap();
        status_of(resp).await
    }
}

/// The gRPC status of a response (trailers-only or in the trailers).
pub(crate) async fn status_of(resp: h2::client::ResponseFuture) -> tonic::Status {
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200, "HTTP status of a gRPC answer");
    let (parts, mut body) = resp.into_parts();
    if let Some(s) = tonic::Status::from_header_map(&parts.headers) {
        return s;
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_else(HeaderMap::new);
    tonic::Status::from_header_map(&trailers).expect("grpc-status in the trailers")
}

/// GET `path` on an HTTP/1.1 admin port: the body.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

pub(crate) fn assert_limit(status: &tonic::Status, limit: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = agent_reach::reason::error_info(status).expect("ErrorInfo");
    assert_eq!(info.reason, "LIMIT_EXCEEDED");
    assert_eq!(info.metadata.get("limit").map(String::as_str), Some(limit));
    assert!(status.message().len() + status.details().len() <= 1024, "the refusal fits in 1 KiB");
}

/// The server cut the abuser off: GOAWAY ENHANCE_YOUR_CALM, or (when the abuser was still
/// writing as the server closed) a broken or reset socket.
fn assert_cut_off(err: h2::Error) {
    let io = err.get_io().map(std::io::Error::kind);
    assert!(
        err.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)
            || matches!(io, Some(std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset)),
        "{err}"
    );
}

/// An agent `worker` answering capability "echo", at most `max_concurrency` calls at once.
pub(crate) async fn worker(sidecar: SocketAddr, max_concurrency: u32) -> agent_reach::RunningAgent {
    Agent::builder("worker")
        .version("1.0.0")
        .sidecar(sidecar.to_string())
        .max_concurrency(max_concurrency)
        .capability("echo", Vec::<String>::new())
        .handle("echo", |call| async move { Ok(Reply::text(call.text()?.to_string())) })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent start")
}

/// A legitimate caller: one call every 20 ms on its own connection until stopped; counts
/// the calls that succeeded and failed.
pub(crate) struct Legit {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Legit {
    pub(crate) async fn start(local: SocketAddr) -> Legit {
        let client = Client::connect(&local.to_string()).await.unwrap();
        let (ok, failed, stop) =
            (Arc::<AtomicU64>::default(), Arc::<AtomicU64>::default(), Arc::<AtomicBool>::default());
        let (o, f, s) = (ok.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                match client.invoke("echo").text("hello").timeout(Duration::from_secs(2)).send().await {
                    Ok(r) if r.text() == "hello" => o.fetch_add(1, Ordering::Relaxed),
                    other => {
                        tracing::error!("legitimate call failed: {:?}", other.err());
                        f.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Legit { ok, failed, stop, task }
    }

    /// Stops; (calls that succeeded, calls that failed).
    pub(crate) async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_header_list_is_refused_on_its_stream_only() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let sidecar = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-a")).await;
    let agent = worker(sidecar.local_addr(), 0).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;
    let legit = Legit::start(sidecar.local_addr()).await;

    let mut abuser = RawH2::connect(sidecar.local_addr()).await;
    // An unrelated call on the abuser's connection, in flight (body not sent yet).
    let (pending, mut pending_body) = abuser.start(HEALTH_CHECK, &[]).await;
    // One 64 KiB header; then 300 headers of 200 bytes: each refused on its own stream.
    let big = vec![("x-big".to_string(), "x".repeat(64 * 1024))];
    assert_limit(&abuser.call(INVOKE, &big, EMPTY_MESSAGE).await, "max-header-list-bytes");
    let many: Vec<_> = (0..300).map(|i| (format!("x-h{i}"), "v".repeat(200))).collect();
    assert_limit(&abuser.call(HEALTH_CHECK, &many, EMPTY_MESSAGE).await, "max-header-list-bytes");
    // The call in flight and a new one on the same connection are answered.
    pending_body.send_data(Bytes::from_static(EMPTY_MESSAGE), true).unwrap();
    assert_eq!(status_of(pending).await.code(), Code::Ok);
    assert_eq!(abuser.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    assert!(!abuser.conn.is_finished(), "the abuser's connection is still open");
    // Just under the limit passes.
    let fits = vec![("x-fits".to_string(), "y".repeat(15 * 1024))];
    assert_eq!(abuser.call(HEALTH_CHECK, &fits, EMPTY_MESSAGE).await.code(), Code::Ok);

    assert_eq!(sidecar.limit_refusals(false, "max_header_list_bytes"), 2);
    let metrics = get(sidecar.admin_addr().unwrap(), "/metrics").await;
    assert!(
        metrics.contains("agent_reach_limit_refusals_total{port=\"local\",limit=\"max_header_list_bytes\"} 2\n"),
        "{metrics}"
    );
    let (ok, failed) = legit.finish().await;
    assert_eq!(failed, 0, "legitimate calls failed");
    assert!(ok > 0);
    agent.shutdown().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_no_admission_slot_and_are_refused_after_the_body_read_timeout() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.body_read_timeout = Duration::from_millis(1500);
    let sidecar = start_sidecar(config).await;
    let agent = worker(sidecar.local_addr(), 2).await;
    let instance = agent.instance_id();
    wait_for_instances(&sidecar, std::slice::from_ref(&instance)).await;

    // Two deliveries to the agent (max_concurrency 2) on the mesh port and one Invoke on
    // the local port, each sending its headers and half a body, then nothing.
    let started = Instant::now();
    let half = |len: u8| {
        let mut b = vec![0, 0, 0, 0, len];
        b.extend(std::iter::repeat_n(0u8, usize::from(len / 2)));
        Bytes::from(b)
    };
    let deliver_headers =
        vec![("ar-instance".to_string(), instance.clone()), ("ar-tenant".to_string(), "default".to_string())];
    let mut mesh = RawH2::connect(sidecar.mesh_addr()).await;
    let mut local = RawH2::connect(sidecar.local_addr()).await;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let (resp, mut body) = mesh.start(DELIVER, &deliver_headers).await;
        body.send_data(half(100), false).unwrap();
        stalled.push((resp, body));
    }
    let (invoke_resp, mut invoke_body) = local.start(INVOKE, &[]).await;
    invoke_body.send_data(half(100), false).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A legitimate call is served at once: the stalled calls hold no admission slot.
    let client = Client::connect(&sidecar.local_addr().to_string()).await.unwrap();
    let t = Instant::now();
    let reply = client.invoke("echo").text("hello").timeout(Duration::from_secs(1)).send().await.unwrap();
    assert_eq!(reply.text(), "hello");
    assert!(t.elapsed() < Duration::from_secs(1), "legitimate call took {:?}", t.elapsed());

    // The stalled calls are refused after the body-read timeout, naming it.
    for (resp, _body) in stalled {
        assert_limit(&status_of(resp).await, "body-read-timeout");
    }
    assert_limit(&status_of(invoke_resp).await, "body-read-timeout");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400) && waited < Duration::from_secs(5), "refused after {waited:?}");
    assert_eq!(sidecar.limit_refusals(true, "body_read_timeout"), 2);
    assert_eq!(sidecar.limit_refusals(false, "body_read_timeout"), 1);
    // Nothing is left in flight.
    assert_eq!(sidecar.calls_in_flight(), 0);
    drop(invoke_body);
    agent.shutdown().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_idle_and_surplus_connections_are_closed() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.header_read_timeout = Duration::from_millis(600);
    config.limits.idle_timeout = Duration::from_millis(900);
    config.limits.max_connections = 3;
    let sidecar = start_sidecar(config).await;
    let agent = worker(sidecar.local_addr(), 0).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;
    // Calls every 20 ms: never idle, never closed.
    let legit = Legit::start(sidecar.local_addr()).await;
    // The mesh port has no other client here, so its counts are exact.
    let mesh = sidecar.mesh_addr();

    // Silent: a TCP connection that never sends the HTTP/2 preface.
    let started = Instant::now();
    let mut silent = TcpStream::connect(mesh).await.unwrap();
    // Idle: one call, then nothing.
    let mut idle = RawH2::connect(mesh).await;
    assert_eq!(idle.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    // A third connection fills the port; a fourth is closed at once.
    let mut third = RawH2::connect(mesh).await;
    let mut surplus = TcpStream::connect(mesh).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_millis(500), surplus.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the connection past the cap is closed: {read:?}");
    assert_eq!(sidecar.limit_refusals(true, "max_connections"), 1);

    // The silent one is closed after the header-read timeout.
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "the silent connection is closed");
    let closed_after = started.elapsed();
    assert!(closed_after >= Duration::from_millis(550), "closed after {closed_after:?}");
    // The idle one gets GOAWAY after the idle timeout and ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut idle.conn).await;
    assert!(ended.is_ok(), "the idle connection is closed");
    // The third made no request either: closed for the header-read timeout too.
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut third.conn).await;
    assert!(ended.is_ok(), "the third connection is closed");
    assert_eq!(sidecar.limit_refusals(true, "header_read_timeout"), 2);
    assert_eq!(sidecar.limit_refusals(true, "idle_timeout"), 1);
    // Their slots are free again.
    let mut again = RawH2::connect(mesh).await;
    assert_eq!(again.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);

    let (ok, failed) = legit.finish().await;
    assert_eq!(failed, 0, "legitimate calls failed");
    assert!(ok > 20, "{ok} legitimate calls");
    assert_eq!(sidecar.limit_refusals(false, "idle_timeout"), 0, "the busy local connection was never idle");
    agent.shutdown().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_resets_close_the_abusers_connection_and_spare_legitimate_callers() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.max_concurrent_streams = 32;
    let sidecar = start_sidecar(config).await;
    let agent = worker(sidecar.local_addr(), 0).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;
    let legit = Legit::start(sidecar.local_addr()).await;

    // The sidecar advertises its streams limit.
    let tcp = TcpStream::connect(sidecar.local_addr()).await.unwrap();
    let (send, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let (advertised, settings) = tokio::sync::oneshot::channel();
    let conn = tokio::spawn(async move {
        let mut advertised = Some(advertised);
        std::future::poll_fn(|cx| {
            let polled = std::pin::Pin::new(&mut conn).poll(cx);
            if conn.max_concurrent_send_streams() == 32
                && let Some(tx) = advertised.take()
            {
                let _ = tx.send(());
            }
            polled
        })
        .await
    });
    let mut probe = RawH2 { addr: sidecar.local_addr(), send, conn };
    assert_eq!(probe.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    tokio::time::timeout(Duration::from_secs(5), settings)
        .await
        .expect("SETTINGS_MAX_CONCURRENT_STREAMS = 32")
        .unwrap();

    // Rapid reset (CVE-2023-44487): open streams and cancel each at once.
    let mut abuser = RawH2::connect(sidecar.local_addr()).await;
    abuser.rapid_reset(INVOKE).await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failed) = legit.finish().await;
    assert_eq!(failed, 0, "legitimate calls failed");
    assert!(ok > 0);
    assert_eq!(sidecar.calls_in_flight(), 0, "no call of the abuser is left in flight");
    agent.shutdown().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_resets_on_the_control_port_close_that_connection_only() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let addr: SocketAddr = control.endpoint().trim_start_matches("http://").parse().unwrap();
    let mut abuser = RawH2::connect(addr).await;
    abuser.rapid_reset("/agentreach.v1.Admin/ListAgents").await;
    // Another client is served.
    let mut other = RawH2::connect(addr).await;
    assert_eq!(other.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    // A header list over the limit (16 KiB) is refused on its stream with a reason; one
    // past eight times it gets h2's HTTP 431; the connection lives through both.
    let big = [("x-big".to_string(), "x".repeat(32 * 1024))];
    assert_limit(&other.call(HEALTH_CHECK, &big, EMPTY_MESSAGE).await, "max-header-list-bytes");
    let huge = [("x-huge".to_string(), "x".repeat(200 * 1024))];
    let (resp, mut body) = other.start(HEALTH_CHECK, &huge).await;
    let _ = body.send_data(Bytes::from_static(EMPTY_MESSAGE), true);
    assert_eq!(resp.await.unwrap().status(), 431);
    assert_eq!(other.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    assert_eq!(control.stats().conn.count("max_header_list_bytes"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_resets_on_the_mtls_mesh_port_close_that_connection_only() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = agent_reach_e2e::start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.limits.max_concurrent_streams = 32;
    let sidecar = start_sidecar(config).await;
    let agent = worker(sidecar.local_addr(), 0).await;
    let instance = agent.instance_id();
    wait_for_instances(&sidecar, std::slice::from_ref(&instance)).await;
    let mesh = sidecar.mesh_addr();
    // A peer sidecar delivering calls over its own mutual-TLS connection all along.
    let mut peer = RawH2::over(tls(mesh, "well-behaved").await, mesh, h2::client::Builder::new()).await;
    let deliver_headers =
        vec![("ar-instance".to_string(), instance.clone()), ("ar-tenant".to_string(), "default".to_string())];
    let served = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let legit = tokio::spawn({
        let (served, stop) = (served.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let status = peer.call(DELIVER, &deliver_headers, &crate::slow_clients::echo_request(b"hello")).await;
                assert_eq!(status.code(), Code::Ok, "a delivery on the well-behaved connection: {status:?}");
                served.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    // Rapid reset over mutual TLS, from a verified peer of the same tenant.
    let mut abuser = RawH2::over(tls(mesh, "abuser").await, mesh, h2::client::Builder::new()).await;
    abuser.rapid_reset(DELIVER).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    legit.await.expect("no delivery of the well-behaved peer failed");
    assert!(served.load(Ordering::Relaxed) > 0);
    // Another connection of the abuser's identity is served: only that connection was closed.
    let mut again = RawH2::over(tls(mesh, "abuser").await, mesh, h2::client::Builder::new()).await;
    assert_eq!(again.call(HEALTH_CHECK, &[], EMPTY_MESSAGE).await.code(), Code::Ok);
    assert_eq!(sidecar.calls_in_flight(), 0, "no call of the abuser is left in flight");
    agent.shutdown().await;
    sidecar.stop().await;
}

/// A TLS connection to a mesh or control port, presenting the certificate of sidecar `id`.
///
/// The certificate of each `id` is issued once per test process: issuing one (a key pair
/// and a CA signature, in a debug build) for every connection made the abusers of
/// `abuse_rss`, which open a connection a round, spend a third of a core on it, taken
/// from the two cores the process under abuse and the legitimate caller share.
pub(crate) async fn tls(
    addr: SocketAddr,
    id: &str,
) -> impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {
    type Issued = std::sync::Mutex<Vec<(String, Arc<agent_reach_identity::tls::TlsConfigs>)>>;
    static ISSUED: Issued = std::sync::Mutex::new(Vec::new());
    let configs = {
        let mut issued = ISSUED.lock().unwrap();
        match issued.iter().find(|(name, _)| name == id) {
            Some((_, configs)) => configs.clone(),
            None => {
                let configs = Arc::new(agent_reach_e2e::secure::sidecar_tls("default", id));
                issued.push((id.to_string(), configs.clone()));
                configs
            }
        }
    };
    agent_reach_identity::net::connect_tls(&addr.to_string(), configs.client()).await.unwrap()
}
