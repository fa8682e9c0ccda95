//! A fault-injecting TCP proxy for end-to-end tests: put it between two parts of the mesh
//! (a sidecar and control, or two sidecars) and change what the link does while the test
//! runs — latency with jitter per direction, a bandwidth cap per direction, a blackhole per
//! direction (bytes are read and
//! dropped, so the link looks open but nothing arrives: both directions for a blackholed
//! link, one for a half-open one), resets of every open connection, refusal of new
//! connections (reset at once) and a share of new connections reset (deterministically: the
//! first after each change, then one in every `1 / share`).
//!
//! It replaces `tc netem`, which this project's test machines do not have. It works on
//! bytes only; it knows nothing of HTTP/2 or gRPC. Each direction of a connection is a
//! reader that stamps every chunk with its delivery time and a writer that waits until
//! then, so latency does not cap throughput and bytes keep their order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What one direction of the link does to the bytes it carries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Direction {
    /// Added to every chunk's delivery.
    pub delay: Duration,
    /// The delay varies uniformly by up to this much either way (never below zero).
    pub jitter: Duration,
    /// Bytes are read and dropped: nothing arrives, nothing fails.
    pub blackhole: bool,
    /// At most this many bytes per second pass (0: no cap), paced per connection.
    pub bytes_per_second: u64,
}

/// The faults of the link, for connections open and new.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Client → upstream.
    pub upstream: Direction,
    /// Upstream → client.
    pub downstream: Direction,
    /// Every new connection is reset at once.
    pub refuse: bool,
    /// This share (0.0..=1.0) of new connections is reset at once (the first new connection
    /// after the change, then one in every `1 / share`).
    pub reset_share: f64,
}

impl Faults {
    /// The same latency and jitter both ways.
    pub fn latency(delay: Duration, jitter: Duration) -> Faults {
        let d = Direction { delay, jitter, ..Direction::default() };
        Faults { upstream: d, downstream: d, ..Faults::default() }
    }

    /// At most `bytes_per_second` each way, per connection.
    pub fn bandwidth(bytes_per_second: u64) -> Faults {
        let d = Direction { bytes_per_second, ..Direction::default() };
        Faults { upstream: d, downstream: d, ..Faults::default() }
    }

    /// Nothing arrives either way; connections stay open.
    pub fn blackhole() -> Faults {
        let d = Direction { blackhole: true, ..Direction::default() };
        Faults { upstream: d, downstream: d, ..Faults::default() }
    }

    /// Requests arrive, replies never come back.
    pub fn half_open() -> Faults {
        Faults { downstream: Direction { blackhole: true, ..Direction::default() }, ..Faults::default() }
    }

    /// New connections are reset (use with [`FaultProxy::reset_all`] for a partition).
    pub fn refuse() -> Faults {
        Faults { refuse: true, ..Faults::default() }
    }
}

/// Counters of the proxy.
#[derive(Debug, Default)]
pub struct FaultStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections reset on arrival (refused or by `reset_share`).
    pub reset_on_arrival: AtomicU64,
    /// Open connections reset by [`FaultProxy::reset_all`].
    pub reset_open: AtomicU64,
    /// Chunks dropped by a blackhole.
    pub dropped_chunks: AtomicU64,
}

/// Whether the `n`-th new connection (from 0, counted since the faults last changed) is
/// reset when `share` of them are: deterministically the first, then one in every
/// `1 / share`, so a test that sees any new connection sees a reset.
fn resets_on_arrival(n: u64, share: f64) -> bool {
    let share = share.clamp(0.0, 1.0);
    share > 0.0 && (n == 0 || (n as f64 * share).floor() != ((n - 1) as f64 * share).floor())
}

/// When a chunk of `len` bytes due at `due` starts going out on a link capped at `rate`
/// bytes per second (0: no cap) whose previous chunk leaves it busy until `busy_until`, and
/// until when it keeps the link busy: (start, busy until).
fn paced(due: Instant, busy_until: Instant, len: usize, rate: u64) -> (Instant, Instant) {
    if rate == 0 {
        return (due, due);
    }
    let start = due.max(busy_until);
    (start, start + Duration::from_secs_f64(len as f64 / rate as f64))
}

/// Pieces a capped link sends at a time, so a 16 KiB read does not go out as one burst.
const PACED_PIECE: usize = 1024;

/// A running proxy on 127.0.0.1 port 0 in front of `upstream`; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    /// Bumped to reset every open connection.
    resets: watch::Sender<u64>,
    stats: Arc<FaultStats>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` that passes everything through.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fault proxy");
        let addr = listener.local_addr().expect("fault proxy address");
        let (faults, faults_rx) = watch::channel(Faults::default());
        let (resets, resets_rx) = watch::channel(0u64);
        let stats = Arc::new(FaultStats::default());
        let st = stats.clone();
        let task = tokio::spawn(async move {
            let mut faults_rx = faults_rx;
            // New connections since the faults last changed.
            let mut since_change = 0u64;
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                st.accepted.fetch_add(1, Ordering::Relaxed);
                if faults_rx.has_changed().unwrap_or(false) {
                    since_change = 0;
                }
                let now = *faults_rx.borrow_and_update();
                let n = since_change;
                since_change += 1;
                if now.refuse || resets_on_arrival(n, now.reset_share) {
                    st.reset_on_arrival.fetch_add(1, Ordering::Relaxed);
                    reset(client);
                    continue;
                }
                tokio::spawn(connection(client, upstream, faults_rx.clone(), resets_rx.clone(), st.clone()));
            }
        });
        FaultProxy { addr, faults, resets, stats, task }
    }

    /// The address to dial instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the link's faults (open connections follow at once).
    pub fn set(&self, faults: Faults) {
        self.faults.send_replace(faults);
    }

    /// Back to a clean link.
    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Resets every open connection (TCP RST both ways).
    pub fn reset_all(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Refuses new connections and resets the open ones: the upstream is unreachable.
    pub fn partition(&self) {
        self.set(Faults::refuse());
        self.reset_all();
    }

    pub fn stats(&self) -> &FaultStats {
        &self.stats
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset_all();
    }
}

/// Closes `stream` with a reset rather than a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    mut resets: watch::Receiver<u64>,
    stats: Arc<FaultStats>,
) {
    resets.mark_unchanged();
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let reset_now = {
        let up = pump(&mut client_read, &mut server_write, faults.clone(), |f| f.upstream, &stats);
        let down = pump(&mut server_read, &mut client_write, faults, |f| f.downstream, &stats);
        tokio::select! {
            _ = async { tokio::join!(up, down) } => false,
            _ = resets.changed() => true,
        }
    };
    if reset_now {
        stats.reset_open.fetch_add(1, Ordering::Relaxed);
        let _ = client_read.as_ref().set_zero_linger();
        let _ = server_read.as_ref().set_zero_linger();
    }
}

/// Carries bytes from `from` to `to` with the faults `direction` picks, until `from` ends.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    faults: watch::Receiver<Faults>,
    direction: fn(&Faults) -> Direction,
    stats: &FaultStats,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, u64, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let d = direction(&faults.borrow());
            if d.blackhole {
                stats.dropped_chunks.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let delay = if d.jitter.is_zero() {
                d.delay
            } else {
                let j = d.jitter.as_secs_f64();
                let offset = rand::rng().random_range(-j..=j);
                Duration::from_secs_f64((d.delay.as_secs_f64() + offset).max(0.0))
            };
            // Bytes keep their order: never delivered before the chunk ahead of them.
            last = last.max(Instant::now() + delay);
            if tx.send((last, d.bytes_per_second, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        let mut busy_until = Instant::now();
        while let Some((at, rate, bytes)) = rx.recv().await {
            let piece = if rate == 0 { bytes.len().max(1) } else { PACED_PIECE };
            for chunk in bytes.chunks(piece) {
                let (start, busy) = paced(at, busy_until, chunk.len(), rate);
                busy_until = busy;
                tokio::time::sleep_until(start).await;
                if to.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
        // The sender closed its side: pass the end on (FIN), leaving the other way open.
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> std::io::Result<Duration> {
        let mut s = TcpStream::connect(addr).await?;
        let t = Instant::now();
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        Ok(t.elapsed())
    }

    #[test]
    fn a_capped_link_paces_chunks_back_to_back() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // No cap: a chunk goes out when due.
        assert_eq!(paced(t0 + ms(5), t0 + ms(50), 1000, 0), (t0 + ms(5), t0 + ms(5)));
        // 1,000 bytes at 10,000 B/s keep the link 100 ms.
        assert_eq!(paced(t0, t0, 1000, 10_000), (t0, t0 + ms(100)));
        // The next chunk, due earlier than the link is free, waits for it.
        assert_eq!(paced(t0 + ms(10), t0 + ms(100), 500, 10_000), (t0 + ms(100), t0 + ms(150)));
        // One due after the link went idle starts when due.
        assert_eq!(paced(t0 + ms(300), t0 + ms(150), 500, 10_000), (t0 + ms(300), t0 + ms(350)));
    }

    #[tokio::test]
    async fn a_bandwidth_cap_slows_a_transfer_to_its_rate() {
        let proxy = FaultProxy::start(echo_server().await).await;
        // 32 KiB through a 128 KiB/s cap each way, back in parallel: the first 1 KiB piece
        // leaves at once and each next one when the link is free, so the last starts 31/32
        // of 250 ms (242.2 ms) after the first; without the cap it all takes about 1 ms.
        const RATE: u64 = 128 * 1024;
        proxy.set(Faults::bandwidth(RATE));
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let data = vec![7u8; 32 * 1024];
        let t = Instant::now();
        let (mut r, mut w) = s.split();
        let send = async { w.write_all(&data).await.unwrap() };
        let mut back = vec![0u8; data.len()];
        let recv = async { r.read_exact(&mut back).await.unwrap() };
        tokio::join!(send, recv);
        assert_eq!(back, data);
        let last_piece_starts = Duration::from_secs_f64((data.len() - PACED_PIECE) as f64 / RATE as f64);
        assert!(t.elapsed() >= last_piece_starts, "32 KiB at 128 KiB/s: {:?} < {last_piece_starts:?}", t.elapsed());
    }

    #[tokio::test]
    async fn the_proxy_delays_blackholes_and_resets() {
        let proxy = FaultProxy::start(echo_server().await).await;
        assert!(round_trip(proxy.addr()).await.unwrap() < Duration::from_millis(50));

        proxy.set(Faults::latency(Duration::from_millis(40), Duration::ZERO));
        let rtt = round_trip(proxy.addr()).await.unwrap();
        assert!(rtt >= Duration::from_millis(80), "two delayed directions: {rtt:?}");

        proxy.set(Faults::blackhole());
        let stalled = tokio::time::timeout(Duration::from_millis(300), round_trip(proxy.addr())).await;
        assert!(stalled.is_err(), "nothing comes back through a blackhole");

        proxy.set(Faults::refuse());
        let refused = round_trip(proxy.addr()).await;
        assert!(refused.is_err(), "a refused connection is reset: {refused:?}");

        // An open connection is reset by reset_all.
        proxy.heal();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        open.read_exact(&mut buf).await.unwrap();
        proxy.reset_all();
        let mut rest = Vec::new();
        let after = tokio::time::timeout(Duration::from_secs(2), open.read_to_end(&mut rest)).await.unwrap();
        assert!(after.is_err() || rest.is_empty(), "the connection ended: {after:?}");
        assert_eq!(proxy.stats().reset_open.load(Ordering::Relaxed), 1);
        assert!(proxy.stats().reset_on_arrival.load(Ordering::Relaxed) >= 1);
    }
}
