//! What one client may hold on the sidecar's local and mesh ports, and how the ports
//! enforce it: connections per port, HTTP/2 streams per connection, the size of a
//! request's header list, and the time a connection may take to send its first request
//! headers, may stay idle between requests, and a request may take to send its body;
//! on the mesh port with mutual TLS, also connections per verified peer; and the
//! control frames (PING, SETTINGS, PRIORITY, empty DATA) a connection may send per second
//! ([`agent_reach_support::h2guard`], GOAWAY ENHANCE_YOUR_CALM past it).
//!
//! [`Port`] holds one port's [`PortLimits`] and counters. Its accept loop asks
//! [`Port::admit`] for a connection slot (over the cap the connection is closed at once),
//! serves each connection through [`Port::service`] (which refuses an oversized header
//! list on that stream only, with `LIMIT_EXCEEDED`, and tracks the requests in flight) and
//! drives it with [`Port::drive`] (which closes it gracefully when it sent no request
//! headers in time, stayed idle too long, or the sidecar shuts down). h2 itself advertises
//! the streams limit and refuses streams past it (REFUSED_STREAM), and keeps its
//! protections against reset floods (CVE-2023-44487) on. A connection accepted over TCP
//! has its peer watched by the kernel ([`serve_tcp`]: keep-alive probes and
//! `TCP_USER_TIMEOUT`), so one whose host vanished is closed.
//!
//! Not here: the body-read timeout is applied where bodies are read (the `Invoke` and
//! `Deliver` entries, [`PortLimits::body_read_timeout`]); TLS handshakes have their own
//! timeout in `agent_reach_identity::net`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;
use tonic::Status;

use agent_reach_support::h2guard::{FloodLimit, FrameGuard};

use crate::grpc::{self, Body};
use crate::stall::{SendStall, StallExec};

/// The body of every reply of the local and mesh ports.
pub(crate) type Tracked = crate::stall::Tracked<ActiveGuard>;

/// Limits of the local and mesh ports (each port has its own connection count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortLimits {
    /// Largest request header list (HPACK-decoded size: name + value + 32 per field,
    /// pseudo-headers included) a request may carry; larger ones are refused on their
    /// stream with `LIMIT_EXCEEDED` (`--max-header-list-bytes`).
    pub max_header_list_bytes: u32,
    /// HTTP/2 streams open at once on one connection (`--max-concurrent-streams`).
    pub max_concurrent_streams: u32,
    /// Connections open at once on one port (`--max-connections`). On the mesh port with
    /// mutual TLS a connection counts from its accept, its handshake included.
    pub max_connections: usize,
    /// Connections open at once from one verified peer (one sidecar identity) on the mesh
    /// port with mutual TLS (`--max-connections-per-peer`).
    pub max_connections_per_peer: usize,
    /// PING, SETTINGS, PRIORITY and empty DATA frames one connection may send within a
    /// second; one more closes it (`--max-control-frames-per-second`).
    pub max_control_frames_per_second: u32,
    /// Time a new connection has to send its first request headers
    /// (`--header-read-timeout`).
    pub header_read_timeout: Duration,
    /// Time a request has to send its whole (single-message) body
    /// (`--body-read-timeout`).
    pub body_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed
    /// (`--idle-timeout`).
    pub idle_timeout: Duration,
    /// A reply that waits this long for the client's flow-control window has its stream
    /// reset (`--send-stall-timeout`, [`crate::stall`]).
    pub send_stall_timeout: Duration,
}

impl Default for PortLimits {
    fn default() -> Self {
        PortLimits {
            max_header_list_bytes: 16 * 1024,
            max_concurrent_streams: 256,
            max_connections: 1024,
            max_connections_per_peer: 64,
            max_control_frames_per_second: 1000,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(300),
            send_stall_timeout: Duration::from_secs(30),
        }
    }
}

impl PortLimits {
    /// Checks that every limit is usable; the error names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_header_list_bytes < 1024 {
            return Err("--max-header-list-bytes must be at least 1024".into());
        }
        if self.max_concurrent_streams == 0 {
            return Err("--max-concurrent-streams must be greater than 0".into());
        }
        if self.max_connections == 0 || self.max_connections > Semaphore::MAX_PERMITS {
            return Err("--max-connections must be greater than 0".into());
        }
        if self.max_connections_per_peer == 0 {
            return Err("--max-connections-per-peer must be greater than 0".into());
        }
        if self.max_control_frames_per_second == 0 {
            return Err("--max-control-frames-per-second must be greater than 0".into());
        }
        for (flag, d) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-read-timeout", self.body_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--send-stall-timeout", self.send_stall_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{flag} must be greater than 0"));
            }
        }
        Ok(())
    }

    /// The SETTINGS_MAX_HEADER_LIST_SIZE advertised to clients: eight times the limit, so
    /// a header list past the limit still reaches [`Port::service`] and is refused there
    /// with a reason. h2 answers a list past the advertised size with HTTP 431 on its
    /// stream, and closes the connection (ENHANCE_YOUR_CALM) past four times that.
    pub(crate) fn advertised_header_list_bytes(&self) -> u32 {
        self.max_header_list_bytes.saturating_mul(8)
    }
}

/// Refusals by limit, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct LimitStats {
    pub header_list: AtomicU64,
    pub connections: AtomicU64,
    pub header_read_timeout: AtomicU64,
    pub body_read_timeout: AtomicU64,
    pub idle_timeout: AtomicU64,
    /// Connections closed for a control-frame flood (shared with their guards).
    pub control_frames: Arc<AtomicU64>,
    pub connections_per_peer: AtomicU64,
    /// Streams reset because their reply stalled (shared with the ports' executors).
    pub send_stall_timeout: Arc<AtomicU64>,
    /// Plaintext connections a permissive mesh port served (not a refusal: not in
    /// [`LimitStats::counts`]).
    pub plaintext_connections: AtomicU64,
}

impl LimitStats {
    /// `(limit label, count)` for each limit.
    pub(crate) fn counts(&self) -> [(&'static str, u64); 8] {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("max_header_list_bytes", load(&self.header_list)),
            ("max_connections", load(&self.connections)),
            ("header_read_timeout", load(&self.header_read_timeout)),
            ("body_read_timeout", load(&self.body_read_timeout)),
            ("idle_timeout", load(&self.idle_timeout)),
            ("max_control_frames_per_second", load(&self.control_frames)),
            ("max_connections_per_peer", load(&self.connections_per_peer)),
            ("send_stall_timeout", load(&self.send_stall_timeout)),
        ]
    }
}

/// The body-read timeout of one port's calls, and the counter of calls it refused.
#[derive(Clone, Debug)]
pub(crate) struct BodyRead {
    timeout: Duration,
    stats: Arc<LimitStats>,
}

impl BodyRead {
    pub(crate) fn new(timeout: Duration, stats: Arc<LimitStats>) -> BodyRead {
        BodyRead { timeout, stats }
    }

    /// `read` (reading a request's body), refused with `LIMIT_EXCEEDED` when it takes
    /// longer than the body-read timeout.
    ///
    /// A body that is already here when the read starts (a unary call's DATA frame comes
    /// in the same read as its HEADERS) is taken without the timer: no clock reading, no
    /// timer entry made and dropped on every call. The timer starts at the first read
    /// that has to wait, the same instant as before to within that one poll.
    pub(crate) async fn within<T>(&self, read: impl Future<Output = T>) -> Result<T, crate::error::SidecarError> {
        let mut read = std::pin::pin!(read);
        let here = std::future::poll_fn(|cx| {
            Poll::Ready(match read.as_mut().poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await;
        if let Some(v) = here {
            return Ok(v);
        }
        tokio::time::timeout(self.timeout, read).await.map_err(|_| {
            self.stats.body_read_timeout.fetch_add(1, Ordering::Relaxed);
            crate::error::SidecarError::LimitExceeded {
                flag: "--body-read-timeout",
                message: format!("the request body did not arrive within {:?}", self.timeout),
            }
        })
    }
}

use crate::error::limit_refusal as refusal;

/// HPACK size of a request's header list (RFC 7541 §4.1: name + value + 32 per field),
/// pseudo-headers included.
pub(crate) fn header_list_size<B>(req: &Request<B>) -> usize {
    const FIELD: usize = 32;
    let uri = req.uri();
    let pseudo = (":method".len() + req.method().as_str().len() + FIELD)
        + (":path".len() + uri.path_and_query().map_or(1, |p| p.as_str().len()) + FIELD)
        + uri.scheme_str().map_or(0, |s| ":scheme".len() + s.len() + FIELD)
        + uri.authority().map_or(0, |a| ":authority".len() + a.as_str().len() + FIELD);
    pseudo + req.headers().iter().map(|(n, v)| n.as_str().len() + v.len() + FIELD).sum::<usize>()
}

/// One port's limits, counters and connection slots.
pub(crate) struct Port {
    limits: PortLimits,
    stats: Arc<LimitStats>,
    slots: Arc<Semaphore>,
    /// Connections open per verified peer (mesh port with mutual TLS); a peer is removed
    /// when its last connection ends, so there are never more entries than connections.
    peers: Arc<Mutex<HashMap<String, usize>>>,
}

/// One connection of a verified peer, counted until it drops.
pub(crate) struct PeerSlot {
    peers: Arc<Mutex<HashMap<String, usize>>>,
    peer: String,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = peers.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

type HandlerFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

impl Port {
    pub(crate) fn new(limits: PortLimits, stats: Arc<LimitStats>) -> Port {
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        Port { limits, stats, slots, peers: Arc::default() }
    }

    /// `io` guarded against control-frame floods with the port's budget.
    pub(crate) fn guard<IO>(&self, io: IO) -> FrameGuard<IO> {
        let limit = FloodLimit { max_control_frames_per_second: self.limits.max_control_frames_per_second };
        FrameGuard::new(io, limit, self.stats.control_frames.clone())
    }

    /// Counts a plaintext connection served by a permissive mesh port.
    pub(crate) fn count_plaintext(&self) {
        self.stats.plaintext_connections.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("plaintext connection served by the permissive mesh port");
    }

    /// A slot for one more connection of the verified `peer`, or `None` (counted) when
    /// it has `--max-connections-per-peer` open already.
    pub(crate) fn admit_peer(&self, peer: &str) -> Option<PeerSlot> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let open = peers.entry(peer.to_string()).or_default();
        if *open >= self.limits.max_connections_per_peer {
            drop(peers);
            self.stats.connections_per_peer.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, max = self.limits.max_connections_per_peer, "connection refused: --max-connections-per-peer reached");
            return None;
        }
        *open += 1;
        Some(PeerSlot { peers: self.peers.clone(), peer: peer.to_string() })
    }

    /// The HTTP/2 server settings of the port.
    pub(crate) fn builder(&self) -> hyper::server::conn::http2::Builder<StallExec> {
        let exec = StallExec::new(self.limits.send_stall_timeout, self.stats.send_stall_timeout.clone());
        let mut builder = hyper::server::conn::http2::Builder::new(exec);
        // No timer: hyper's HTTP/2 server uses one only for keep-alive PINGs, which these
        // ports do not send (see below).
        builder
            // gRPC has no use for `date`; hyper would read the clock for it and every
            // hop would encode and decode it once per answer.
            .auto_date_header(false)
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(8 << 20)
            .max_concurrent_streams(self.limits.max_concurrent_streams)
            .max_header_list_size(self.limits.advertised_header_list_bytes())
            // Streams the client resets before they are answered (rapid reset,
            // CVE-2023-44487), and streams reset for its protocol errors: past these the
            // connection gets GOAWAY. The values are hyper's and h2's defaults, stated
            // so that they cannot be switched off by accident.
            .max_pending_accept_reset_streams(20)
            // No HTTP/2 keep-alive: hyper's ran a timer and a lock on every poll and
            // frame of every connection. Dead peers are found by the kernel instead
            // ([`serve_tcp`]); on the Unix socket a peer's end closes with its process.
            .max_local_error_reset_streams(1024);
        builder
    }

    /// A slot for one more connection, or `None` (counted) when the port is full.
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.slots.clone().try_acquire_owned().ok();
        if slot.is_none() {
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(max = self.limits.max_connections, "connection refused: --max-connections reached");
        }
        slot
    }

    /// The service of one connection: refuses a request whose header list is over the
    /// limit (on its stream only), hands the others to `handler`, and counts each request
    /// in `activity` until its response body ends.
    pub(crate) fn service<F>(
        self: Arc<Self>,
        activity: Arc<Activity>,
        handler: F,
    ) -> impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<Tracked>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Tracked>, Infallible>> + Send,
    > + Clone
    + Send
    + 'static
    where
        F: Fn(Request<Incoming>) -> HandlerFuture + Clone + Send + Sync + 'static,
    {
        let max = self.limits.max_header_list_bytes as usize;
        let stats = self.stats.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let guard = activity.begin();
            // hyper spawns this stream's task right after this call (crate::stall).
            let stall = SendStall::new();
            crate::stall::hand_off(stall.clone());
            let size = header_list_size(&req);
            let answer: Result<HandlerFuture, Status> = if size > max {
                stats.header_list.fetch_add(1, Ordering::Relaxed);
                Err(refusal(
                    "--max-header-list-bytes",
                    format!("the request's header list is {size} bytes; this port accepts at most {max}"),
                ))
            } else {
                Ok(handler(req))
            };
            async move {
                let resp = match answer {
                    Ok(fut) => fut.await,
                    Err(status) => grpc::status_response(status),
                };
                Ok::<_, Infallible>(resp.map(|body| Tracked::new(body, stall, guard)))
            }
        })
    }

    /// Runs one connection until it ends: starts a graceful close (GOAWAY, requests in
    /// flight finish) when the client sends no request headers within the header-read
    /// timeout, when it has had no request in flight for the idle timeout, or at shutdown;
    /// drops it when a close started for a timeout has not finished one header-read
    /// timeout later. `slot` and `_running` are held until the connection ends.
    ///
    /// The timeouts and the shutdown signal are watched by a task of their own
    /// ([`watchdog`]), which hands its orders to this one through [`Orders`]: here every
    /// wake-up of a busy connection polls the connection and loads one atomic, where
    /// polling a timer and the shutdown signal as well cost ~300 instructions per wake-up,
    /// two per call.
    pub(crate) async fn drive<C, E>(
        self: &Arc<Self>,
        conn: C,
        graceful: impl Fn(Pin<&mut C>),
        activity: Arc<Activity>,
        shutdown: watch::Receiver<bool>,
        slot: OwnedSemaphorePermit,
        _running: mpsc::Sender<()>,
    ) where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let orders = Arc::new(Orders::default());
        let watching = tokio::spawn(watchdog(self.clone(), activity, shutdown, orders.clone())).abort_handle();
        tokio::pin!(conn);
        let mut closing = false;
        // The stream tasks the connection starts run in this task (on a current-thread
        // runtime); they are dropped with it on a DROP order.
        let mut own = crate::conn_streams::OwnStreams::for_this_runtime();
        let mut ended = None;
        std::future::poll_fn(|cx| {
            orders.task.register(cx.waker());
            match orders.order.load(Ordering::Acquire) {
                DROP => {
                    tracing::debug!("connection dropped: it did not close after GOAWAY");
                    return Poll::Ready(());
                }
                GRACEFUL if !closing => {
                    closing = true;
                    graceful(conn.as_mut());
                    if let Some(own) = &own {
                        own.poll_conn_next();
                    }
                }
                _ => {}
            }
            let done = match own.as_mut() {
                Some(own) => own.poll(conn.as_mut(), &mut ended, cx),
                None => conn.as_mut().poll(cx).map(|out| ended = Some(out)),
            };
            done.map(|()| {
                if let Some(Err(e)) = ended.take() {
                    tracing::debug!("connection ended: {e}");
                }
            })
        })
        .await;
        watching.abort();
        drop(slot);
    }
}

/// Close the connection gracefully.
const GRACEFUL: u8 = 1;
/// Drop the connection.
const DROP: u8 = 2;

/// What a connection's [`watchdog`] tells its connection's task ([`Port::drive`]): the
/// order is stored, then the task woken; the task registers its waker, then loads the order.
#[derive(Default)]
struct Orders {
    /// 0 (none yet), [`GRACEFUL`] or [`DROP`].
    order: AtomicU8,
    task: AtomicWaker,
}

impl Orders {
    fn give(&self, order: u8) {
        self.order.store(order, Ordering::Release);
        self.task.wake();
    }
}

/// Watches one connection's timeouts and the shutdown signal, and gives its task the
/// orders of [`Port::drive`]; ends after a shutdown's or a drop's order (a timeout's
/// graceful close is followed by a drop if the connection is still there one header-read
/// timeout later), or when the connection's task aborts it.
async fn watchdog(port: Arc<Port>, activity: Arc<Activity>, mut shutdown: watch::Receiver<bool>, orders: Arc<Orders>) {
    let mut closing: Option<Instant> = None;
    loop {
        let check = match closing {
            Some(give_up) => give_up,
            None => activity.deadline(&port.limits),
        };
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => {
                orders.give(GRACEFUL);
                return;
            }
            _ = tokio::time::sleep_until(check) => {
                if closing.is_some() {
                    orders.give(DROP);
                    return;
                }
                if let Some(limit) = activity.expired(&port.limits) {
                    let counter = match limit {
                        Expired::HeaderRead => &port.stats.header_read_timeout,
                        Expired::Idle => &port.stats.idle_timeout,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(?limit, "closing the connection");
                    orders.give(GRACEFUL);
                    closing = Some(Instant::now() + port.limits.header_read_timeout);
                }
            }
        }
    }
}

/// Which timeout closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No request headers within the header-read timeout of the connection's start.
    HeaderRead,
    /// No request in flight for the idle timeout.
    Idle,
}

/// Requests in flight on one connection and when the last one ended.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Requests seen so far.
    requests: AtomicU64,
    /// When the connection last had no request in flight, in µs after `start`.
    quiet_since_us: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            quiet_since_us: AtomicU64::new(0),
        })
    }

    /// Counts one request until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> ActiveGuard {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        ActiveGuard(self.clone())
    }

    fn since_start(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// When to check the connection next.
    fn deadline(&self, limits: &PortLimits) -> Instant {
        if self.requests.load(Ordering::Relaxed) == 0 {
            return self.start + limits.header_read_timeout;
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Instant::now() + limits.idle_timeout;
        }
        self.start + Duration::from_micros(self.quiet_since_us.load(Ordering::Relaxed)) + limits.idle_timeout
    }

    /// Whether the connection is past a timeout now.
    fn expired(&self, limits: &PortLimits) -> Option<Expired> {
        let now = self.start.elapsed();
        if self.requests.load(Ordering::Relaxed) == 0 {
            return (now >= limits.header_read_timeout).then_some(Expired::HeaderRead);
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let quiet = Duration::from_micros(self.quiet_since_us.load(Ordering::Relaxed));
        (now.saturating_sub(quiet) >= limits.idle_timeout).then_some(Expired::Idle)
    }
}

/// A request in flight on a connection.
pub(crate) struct ActiveGuard(Arc<Activity>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.quiet_since_us.store(self.0.since_start(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a served TCP connection may be silent before the kernel probes its peer
/// (TCP keep-alive), how often it probes then, and after how many unanswered probes it
/// gives up on the peer.
const PEER_PROBE_AFTER: Duration = Duration::from_secs(20);
const PEER_PROBE_EVERY: Duration = Duration::from_secs(5);
const PEER_PROBES: u32 = 2;
/// How long bytes sent on a served TCP connection may stay unacknowledged before the
/// kernel drops it (`TCP_USER_TIMEOUT`, Linux).
const PEER_ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets up a TCP connection accepted on the local or mesh port (plaintext or before its
/// TLS handshake): no Nagle delay, and dead-peer detection by the kernel. A peer whose
/// host vanished (power loss, a partition) is found by keep-alive probes once the
/// connection has been silent [`PEER_PROBE_AFTER`] (about 30 s in all) and, while our
/// bytes go unacknowledged, by `TCP_USER_TIMEOUT` after [`PEER_ACK_TIMEOUT`]; the
/// connection then fails, and hyper ends its streams. This replaces HTTP/2 PINGs, which
/// cost every call a timer and a lock on the connection. What it does not find, a peer
/// process that hangs while its kernel answers, is bounded by the port's other limits:
/// its connection closes at the idle timeout once its calls end, a reply it stops reading
/// is reset at the send-stall timeout, and a call it never finishes sending at the
/// body-read timeout.
pub(crate) fn serve_tcp(tcp: &tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
    let sock = socket2::SockRef::from(tcp);
    let probes = socket2::TcpKeepalive::new()
        .with_time(PEER_PROBE_AFTER)
        .with_interval(PEER_PROBE_EVERY)
        .with_retries(PEER_PROBES);
    if let Err(e) = sock.set_tcp_keepalive(&probes) {
        tracing::debug!("TCP keep-alive not set on a served connection: {e}");
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = sock.set_tcp_user_timeout(Some(PEER_ACK_TIMEOUT)) {
        tracing::debug!("TCP_USER_TIMEOUT not set on a served connection: {e}");
    }
}

/// Asserts that the socket of this process serving the TCP connection from `peer` to
/// `local` has the options [`serve_tcp`] sets.
#[cfg(test)]
pub(crate) fn assert_served_tcp(local: std::net::SocketAddr, peer: std::net::SocketAddr) {
    let mut served = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else { continue };
        // SAFETY: the descriptor is only read from (its addresses and options) while this
        // loop runs; should another test close it meanwhile, those reads fail.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&fd);
        let at = |a: std::io::Result<socket2::SockAddr>| a.ok().and_then(|a| a.as_socket());
        if at(sock.local_addr()) == Some(local) && at(sock.peer_addr()) == Some(peer) {
            assert_options(sock);
            served += 1;
        }
    }
    assert_eq!(served, 1, "one socket serves {peer} -> {local}");
}

/// The options [`serve_tcp`] sets, read back from the socket.
#[cfg(test)]
fn assert_options(sock: socket2::SockRef<'_>) {
    assert!(sock.tcp_nodelay().unwrap());
    assert!(sock.keepalive().unwrap());
    assert_eq!(sock.tcp_keepalive_time().unwrap(), PEER_PROBE_AFTER);
    assert_eq!(sock.tcp_keepalive_interval().unwrap(), PEER_PROBE_EVERY);
    assert_eq!(sock.tcp_keepalive_retries().unwrap(), PEER_PROBES);
    #[cfg(target_os = "linux")]
    assert_eq!(sock.tcp_user_timeout().unwrap(), Some(PEER_ACK_TIMEOUT));
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach::reason;

    /// A body already here is read without the timer; one that has to wait gets the
    /// whole timeout from that first wait, and is refused (and counted) past it.
    #[tokio::test(start_paused = true)]
    async fn a_body_read_waits_the_timeout_from_its_first_wait() {
        let stats = Arc::new(LimitStats::default());
        let reads = BodyRead::new(Duration::from_secs(2), stats.clone());
        assert_eq!(reads.within(std::future::ready(7)).await.ok(), Some(7));

        let start = Instant::now();
        let slow = reads.within(tokio::time::sleep(Duration::from_millis(1999))).await;
        assert!(slow.is_ok());
        assert_eq!(start.elapsed(), Duration::from_millis(1999));
        assert_eq!(stats.body_read_timeout.load(Ordering::Relaxed), 0);

        let start = Instant::now();
        let stalled = reads.within(tokio::time::sleep(Duration::from_secs(3))).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        match stalled {
            Err(crate::error::SidecarError::LimitExceeded { flag, .. }) => assert_eq!(flag, "--body-read-timeout"),
            other => panic!("expected LIMIT_EXCEEDED, got {other:?}"),
        }
        assert_eq!(stats.body_read_timeout.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_served_tcp_connection_has_its_peer_watched_by_the_kernel() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(listener.local_addr().unwrap()), listener.accept());
        let (_client, (served, _)) = (client.unwrap(), accepted.unwrap());
        // What an accepted socket has before (the kernel's defaults: no probes).
        assert!(!socket2::SockRef::from(&served).keepalive().unwrap());
        serve_tcp(&served);
        assert_options(socket2::SockRef::from(&served));
    }

    #[tokio::test]
    async fn the_tcp_accept_loop_sets_up_every_connection_it_serves() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let port = Arc::new(Port::new(limits(), Arc::default()));
        let (_stop, shutdown) = watch::channel(false);
        let handler =
            |_| -> crate::serve::HandlerFuture { Box::pin(async { grpc::status_response(Status::not_found("none")) }) };
        tokio::spawn(crate::serve::serve_http2(listener, port, shutdown, handler));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let client = tcp.local_addr().unwrap();
        let (mut send, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        // Answered: the loop has accepted the connection and set it up.
        let (answer, _) = send.send_request(Request::post("http://sidecar/x").body(()).unwrap(), true).unwrap();
        assert_eq!(answer.await.unwrap().headers()["grpc-status"], "5");
        assert_served_tcp(addr, client);
    }

    fn limits() -> PortLimits {
        PortLimits {
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(5),
            ..PortLimits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_request_headers_expires_after_the_header_read_timeout() {
        let l = limits();
        let a = Activity::new();
        assert_eq!(a.deadline(&l), a.start + Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(a.expired(&l), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(a.expired(&l), Some(Expired::HeaderRead));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idles_out_only_with_nothing_in_flight() {
        let l = limits();
        let a = Activity::new();
        tokio::time::advance(Duration::from_secs(1)).await;
        let g = a.begin();
        // A request in flight for far longer than the idle timeout keeps it open.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(a.expired(&l), None);
        drop(g);
        assert_eq!(a.deadline(&l), a.start + Duration::from_secs(61 + 5));
        tokio::time::advance(Duration::from_millis(4999)).await;
        assert_eq!(a.expired(&l), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(a.expired(&l), Some(Expired::Idle));
    }

    #[test]
    fn the_header_list_size_counts_pseudo_headers_and_fields() {
        let req = Request::post("http://127.0.0.1:7700/agentreach.v1.Sidecar/Invoke")
            .header("content-type", "application/grpc")
            .header("x-big", "v".repeat(1000))
            .body(())
            .unwrap();
        let pseudo = (7 + 4 + 32) + (5 + 29 + 32) + (7 + 4 + 32) + (10 + 14 + 32);
        let fields = (12 + 16 + 32) + (5 + 1000 + 32);
        assert_eq!(header_list_size(&req), pseudo + fields);
    }

    #[test]
    fn limits_are_validated_by_flag() {
        assert_eq!(PortLimits::default().validate(), Ok(()));
        let bad = PortLimits { max_concurrent_streams: 0, ..PortLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-concurrent-streams"));
        let bad = PortLimits { idle_timeout: Duration::ZERO, ..PortLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--idle-timeout"));
        let bad = PortLimits { max_header_list_bytes: 100, ..PortLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-header-list-bytes"));
        let bad = PortLimits { max_connections_per_peer: 0, ..PortLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-connections-per-peer"));
        let bad = PortLimits { max_control_frames_per_second: 0, ..PortLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-control-frames-per-second"));
    }

    #[test]
    fn connections_are_counted_per_peer_and_freed_when_they_end() {
        let l = PortLimits { max_connections_per_peer: 2, ..PortLimits::default() };
        let port = Port::new(l, Arc::default());
        let a1 = port.admit_peer("a").unwrap();
        let a2 = port.admit_peer("a").unwrap();
        assert!(port.admit_peer("a").is_none());
        let b = port.admit_peer("b").expect("another peer has its own count");
        assert_eq!(port.stats.connections_per_peer.load(Ordering::Relaxed), 1);
        drop(a1);
        let a3 = port.admit_peer("a").expect("a freed slot serves again");
        drop((a2, a3, b));
        assert!(port.peers.lock().unwrap().is_empty(), "peers without connections are forgotten");
    }

    #[test]
    fn a_refusal_names_the_limit() {
        let s = refusal("--max-header-list-bytes", "too big");
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let info = reason::error_info(&s).unwrap();
        assert_eq!(info.reason, "LIMIT_EXCEEDED");
        assert_eq!(info.metadata.get("limit").map(String::as_str), Some("max-header-list-bytes"));
    }

    /// A connection that counts its graceful closes, and ends at its first graceful close
    /// if `ends_on_graceful`.
    struct FakeConn {
        gracefuls: Arc<AtomicUsize>,
        ends_on_graceful: bool,
    }

    impl Future for FakeConn {
        type Output = Result<(), String>;
        fn poll(self: Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
            if self.ends_on_graceful && self.gracefuls.load(Ordering::Relaxed) > 0 {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
    }

    /// Drives a [`FakeConn`] on a task of its own; returns its graceful closes, the task,
    /// the port and the shutdown sender.
    fn driven(
        ends_on_graceful: bool,
    ) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>, Arc<Port>, watch::Sender<bool>) {
        let port = Arc::new(Port::new(limits(), Arc::default()));
        let gracefuls = Arc::new(AtomicUsize::new(0));
        let conn = FakeConn { gracefuls: gracefuls.clone(), ends_on_graceful };
        let (stop, shutdown) = watch::channel(false);
        let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let (running, _) = mpsc::channel(1);
        let driving = port.clone();
        let task = tokio::spawn(async move {
            let graceful = |c: Pin<&mut FakeConn>| {
                c.gracefuls.fetch_add(1, Ordering::Relaxed);
            };
            driving.drive(conn, graceful, Activity::new(), shutdown, slot, running).await;
        });
        (gracefuls, task, port, stop)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_at_the_header_read_timeout_and_dropped_one_later() {
        let (gracefuls, task, port, _stop) = driven(false);
        let start = Instant::now();
        tokio::time::sleep_until(start + Duration::from_millis(1999)).await;
        assert_eq!(gracefuls.load(Ordering::Relaxed), 0);
        tokio::time::sleep_until(start + Duration::from_millis(2001)).await;
        assert_eq!(gracefuls.load(Ordering::Relaxed), 1, "GOAWAY at the header-read timeout");
        assert_eq!(port.stats.header_read_timeout.load(Ordering::Relaxed), 1);
        tokio::time::sleep_until(start + Duration::from_millis(3999)).await;
        assert!(!task.is_finished(), "still given time to close");
        tokio::time::sleep_until(start + Duration::from_millis(4001)).await;
        assert!(task.is_finished(), "dropped when it did not close after GOAWAY");
        assert_eq!(gracefuls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn at_shutdown_a_connection_closes_gracefully_and_is_never_cut() {
        // One that closes when asked ends at once.
        let (gracefuls, task, _port, stop) = driven(true);
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(gracefuls.load(Ordering::Relaxed), 1);
        assert!(task.is_finished());
        // One still finishing its requests is left to finish them: no drop, no timeout.
        let (gracefuls, task, port, stop) = driven(false);
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.send(true).unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(gracefuls.load(Ordering::Relaxed), 1);
        assert!(!task.is_finished());
        assert_eq!(port.stats.header_read_timeout.load(Ordering::Relaxed), 0);
    }
}
