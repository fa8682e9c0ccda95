//! The open-loop load generator (`agent-reach-bench load`): gRPC unary calls at a fixed
//! rate, whatever the server's speed, with each call's latency measured from the moment it
//! was *scheduled* (so a slow server cannot slow the generator down and hide its own
//! latency: no coordinated omission).
//!
//! Pacing is a kernel `timerfd` with a nanosecond period (tokio's timer wheel has 1 ms
//! granularity, too coarse for sub-millisecond latencies); each expiry launches the calls
//! that became due. Calls go over a few HTTP/2 connections (raw `h2`, round robin) with the
//! request body encoded once and shared, so the generator's own cost per call is small.
//! Every answer's `grpc-status` is checked; anything but 0 (or an HTTP error, a reset, a
//! timeout, a short reply) is counted as an error, with a few samples kept. Latencies go
//! into an HdrHistogram (3 significant digits). Single-threaded: pin it to one CPU.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use hdrhistogram::Histogram;
use http::{Request, Uri};
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use serde::{Deserialize, Serialize};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

use crate::wire::{self, Kind};

/// Errors kept as samples in a result.
const ERROR_SAMPLES: usize = 5;

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub addr: SocketAddr,
    pub kind: Kind,
    /// Payload bytes per call.
    pub payload: usize,
    /// Calls per second.
    pub rate: f64,
    /// Measured period (after the warm-up).
    pub duration: Duration,
    /// Calls made at the same rate before measuring (their errors still count).
    pub warmup: Duration,
    pub connections: usize,
    /// A call not answered within this is an error.
    pub timeout: Duration,
}

/// Latency percentiles, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    /// From a histogram of nanoseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Percentiles {
        let ms = |ns: u64| ns as f64 / 1e6;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1e6,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadResult {
    pub target_rate: f64,
    pub measured_s: f64,
    /// Calls sent, warm-up included.
    pub sent: u64,
    /// Calls answered with grpc-status 0, warm-up included.
    pub ok: u64,
    /// Calls that failed in any way, warm-up included.
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Successful calls in the measured period.
    pub recorded: u64,
    /// `recorded` per second of the measured period.
    pub achieved_rate: f64,
    pub latency_ms: Percentiles,
    /// Largest delay between a call's scheduled time and its launch (generator overload
    /// shows here; it is included in the latencies).
    pub max_launch_lag_ms: f64,
}

/// Runs `spec` on a single-threaded runtime of its own.
pub fn run(spec: &LoadSpec) -> Result<LoadResult, String> {
    if !(spec.rate.is_finite() && spec.rate > 0.0) {
        return Err(format!("rate must be positive, got {}", spec.rate));
    }
    if spec.connections == 0 {
        return Err("at least one connection is needed".into());
    }
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, drive(spec.clone()))
}

/// Counters shared by the call tasks (all on one thread).
struct Tally {
    histogram: Histogram<u64>,
    ok: u64,
    errors: u64,
    samples: Vec<String>,
    in_flight: usize,
}

async fn drive(spec: LoadSpec) -> Result<LoadResult, String> {
    let mut senders = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        senders.push(connect(spec.addr).await?);
    }
    let uri: Uri =
        format!("http://{}{}", spec.addr, spec.kind.path()).parse().map_err(|e| format!("bad address: {e}"))?;
    let body = wire::request_body(spec.kind, spec.payload);
    let period_ns = (1e9 / spec.rate).round().max(1.0) as u64;
    let warmup_calls = (spec.warmup.as_secs_f64() * spec.rate).round() as u64;
    let total = warmup_calls + (spec.duration.as_secs_f64() * spec.rate).round().max(1.0) as u64;
    let histogram = Histogram::new_with_bounds(1, 120_000_000_000, 3).map_err(|e| format!("histogram: {e}"))?;
    let tally = Rc::new(RefCell::new(Tally { histogram, ok: 0, errors: 0, samples: Vec::new(), in_flight: 0 }));

    let pacer = Pacer::start(Duration::from_nanos(period_ns)).map_err(|e| format!("timerfd: {e}"))?;
    let mut launched: u64 = 0;
    let mut max_lag = Duration::ZERO;
    while launched < total {
        let due = pacer.wait().await.map_err(|e| format!("timerfd: {e}"))?;
        let now = Instant::now();
        for _ in 0..due {
            if launched >= total {
                break;
            }
            launched += 1;
            let scheduled = pacer.start + Duration::from_nanos(period_ns * launched);
            max_lag = max_lag.max(now.saturating_duration_since(scheduled));
            let measured = launched > warmup_calls;
            let sender = senders[(launched % senders.len() as u64) as usize].clone();
            tally.borrow_mut().in_flight += 1;
            let (uri, body, tally, timeout, min_len) =
                (uri.clone(), body.clone(), tally.clone(), spec.timeout, spec.payload);
            tokio::task::spawn_local(async move {
                let outcome = match tokio::time::timeout(timeout, call(sender, uri, body, min_len)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                };
                let latency = scheduled.elapsed();
                let mut t = tally.borrow_mut();
                t.in_flight -= 1;
                match outcome {
                    Ok(()) => {
                        t.ok += 1;
                        if measured {
                            t.histogram.saturating_record(latency.as_nanos() as u64);
                        }
                    }
                    Err(e) => {
                        t.errors += 1;
                        if t.samples.len() < ERROR_SAMPLES {
                            t.samples.push(e);
                        }
                    }
                }
            });
        }
    }
    let until = Instant::now() + spec.timeout + Duration::from_secs(1);
    while tally.borrow().in_flight > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let t = tally.borrow();
    let measured_s = spec.duration.as_secs_f64();
    let recorded = t.histogram.len();
    Ok(LoadResult {
        target_rate: spec.rate,
        measured_s,
        sent: launched,
        ok: t.ok,
        errors: t.errors + t.in_flight as u64,
        error_samples: t.samples.clone(),
        recorded,
        achieved_rate: recorded as f64 / measured_s.max(1e-9),
        latency_ms: Percentiles::from_histogram(&t.histogram),
        max_launch_lag_ms: max_lag.as_secs_f64() * 1e3,
    })
}

/// One HTTP/2 connection to `addr` (stream window 1 MiB, connection window 8 MiB,
/// TCP_NODELAY), its driver spawned on the current `LocalSet`.
pub(crate) async fn connect(addr: SocketAddr) -> Result<SendRequest<Bytes>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(|e| format!("HTTP/2 handshake with {addr}: {e}"))?;
    tokio::task::spawn_local(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// One unary call; Ok only for HTTP 200, grpc-status 0 and a reply of at least `min_len`
/// bytes of message.
async fn call(sender: SendRequest<Bytes>, uri: Uri, body: Bytes, min_len: usize) -> Result<(), String> {
    let mut sender = sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let request = Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = sender.send_request(request, false).map_err(|e| format!("send: {e}"))?;
    stream.send_data(body, true).map_err(|e| format!("send: {e}"))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    let (parts, mut reply) = response.into_parts();
    if parts.headers.contains_key("grpc-status") {
        grpc_ok(&parts.headers)?;
        return Err("trailers-only answer without a reply message".into());
    }
    let mut received = 0usize;
    while let Some(data) = reply.data().await {
        let data = data.map_err(|e| format!("reply: {e}"))?;
        received += data.len();
        let _ = reply.flow_control().release_capacity(data.len());
    }
    let trailers = reply.trailers().await.map_err(|e| format!("trailers: {e}"))?.ok_or("no trailers")?;
    grpc_ok(&trailers)?;
    if received < 5 + min_len {
        return Err(format!("reply of {received} bytes is shorter than the payload"));
    }
    Ok(())
}

/// Ok for `grpc-status: 0`; else the status and message.
pub(crate) fn grpc_ok(headers: &http::HeaderMap) -> Result<(), String> {
    match headers.get("grpc-status").map(|v| v.as_bytes()) {
        Some(b"0") => Ok(()),
        Some(code) => Err(format!(
            "grpc-status {} {}",
            String::from_utf8_lossy(code),
            headers.get("grpc-message").map(|m| String::from_utf8_lossy(m.as_bytes())).unwrap_or_default()
        )),
        None => Err("no grpc-status".into()),
    }
}

/// A periodic kernel timer: `wait` returns how many periods elapsed since the last call.
struct Pacer {
    fd: AsyncFd<OwnedFd>,
    /// The first expiry is at `start + period`, the n-th at `start + n * period`.
    start: Instant,
}

impl Pacer {
    fn start(period: Duration) -> std::io::Result<Pacer> {
        let fd =
            rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        let ts = Timespec { tv_sec: period.as_secs() as i64, tv_nsec: i64::from(period.subsec_nanos()) };
        let start = Instant::now();
        rustix::time::timerfd_settime(&fd, TimerfdTimerFlags::empty(), &Itimerspec { it_interval: ts, it_value: ts })?;
        // SAFETY: the OwnedFd is moved into the AsyncFd, which alone owns it from here on:
        // the descriptor stays open and the same until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        Ok(Pacer { fd, start })
    }

    async fn wait(&self) -> std::io::Result<u64> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut buf = [0u8; 8];
            match rustix::io::read(self.fd.get_ref(), &mut buf) {
                Ok(8) => return Ok(u64::from_ne_bytes(buf)),
                Ok(n) => return Err(std::io::Error::other(format!("timerfd read {n} bytes"))),
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_counts_periods() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let pacer = Pacer::start(Duration::from_micros(500)).unwrap();
            let mut n = 0;
            while n < 20 {
                n += pacer.wait().await.unwrap();
            }
            let elapsed = pacer.start.elapsed();
            assert!(elapsed >= Duration::from_micros(500 * n), "{elapsed:?} for {n} periods");
        });
    }
}
