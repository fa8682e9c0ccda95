//! Per-instance admission with priority shares, in the target's sidecar.
//!
//! An instance has `max_concurrency` slots (from its registration; 0 = unlimited, nothing
//! is limited). HIGH calls may use every slot; NORMAL and LOW calls together at most
//! `normal_percent` of them, and LOW calls alone at most `low_percent` — so the rest
//! (30 % by default) is always kept for HIGH, however much lower-priority load arrives. A
//! call is not given a slot while a call of higher priority waits (LOW uses only what is
//! idle). Calls over their share wait in a
//! bounded queue per priority for at most the queue timeout — never past their deadline —
//! and are then refused with AGENT_OVERLOADED, fast, before touching the agent. A freed
//! slot goes to the highest-priority waiter first.
//!
//! One short `std::sync::Mutex` per instance guards the counters and queues; it is never
//! held across an await (waiters park on a oneshot channel).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::model::Priority;
use agent_reach::policy::Admission as Settings;
use agent_reach_routing::TableHandle;
use agent_reach_telemetry::Tracing;
use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderValue};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use crate::call::{Attempt, BoxFuture, InboundCall, boxed};
use crate::error::DeliveryError;
use crate::grpc::{HEADER_GRPC_STATUS, TrailersHook, header};
use crate::registry::LocalInstance;
use crate::telemetry::{Rejections, SidecarMetrics};

fn index(p: Priority) -> usize {
    match p {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

const PRIORITIES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

#[derive(Debug, Default)]
struct State {
    in_use: [u32; 3],
    queues: [VecDeque<(u64, oneshot::Sender<()>)>; 3],
    next_waiter: u64,
}

/// Why a call was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The queue of its priority is full.
    QueueFull,
    /// It waited the queue timeout (or until its deadline) without a slot.
    Timeout(Duration),
}

/// The admission gate of one instance.
#[derive(Debug)]
pub(crate) struct Gate {
    max: u32,
    caps: [u32; 3],
    queue_length: usize,
    queue_timeout: Duration,
    /// Calls admitted and not finished (all priorities), readable without the lock.
    in_use: AtomicU32,
    queued: AtomicU32,
    state: Mutex<State>,
}

impl Gate {
    /// A gate for `max` slots (0 = unlimited) with `settings`' shares.
    pub(crate) fn new(max: u32, settings: Settings) -> Gate {
        let share = |percent: u32| ((u64::from(max) * u64::from(percent)).div_ceil(100) as u32).max(1).min(max.max(1));
        Gate {
            max,
            caps: [max, share(settings.normal_percent()), share(settings.low_percent())],
            queue_length: settings.queue_length() as usize,
            queue_timeout: settings.queue_timeout(),
            in_use: AtomicU32::new(0),
            queued: AtomicU32::new(0),
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    /// Calls admitted and running.
    pub(crate) fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Calls waiting for a slot.
    pub(crate) fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the counters stay consistent
        // because every update completes before any call that could panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn can_admit(&self, s: &State, p: Priority) -> bool {
        let i = index(p);
        let total: u32 = s.in_use.iter().sum();
        let waiting_above = match p {
            Priority::High => false,
            Priority::Normal => !s.queues[0].is_empty(),
            // LOW only takes what is idle: nothing HIGH waits, and no NORMAL waiter could
            // take the slot.
            Priority::Low => {
                !s.queues[0].is_empty() || (!s.queues[1].is_empty() && s.in_use[1] + s.in_use[2] < self.caps[1])
            }
        };
        // The NORMAL share bounds NORMAL and LOW together; the LOW share bounds LOW alone.
        let used = match p {
            Priority::High => total,
            Priority::Normal => s.in_use[1] + s.in_use[2],
            Priority::Low => s.in_use[2],
        };
        total < self.max && used < self.caps[i] && !waiting_above
    }

    /// Admits a call of `priority` now if a slot is free for it (`None`: it would wait,
    /// or be refused; [`Gate::acquire`] decides again under the lock).
    pub(crate) fn admit_now(self: &Arc<Self>, priority: Priority) -> Option<Permit> {
        if self.max == 0 {
            self.in_use.fetch_add(1, Ordering::Relaxed);
            return Some(Permit { gate: self.clone(), priority: None });
        }
        let mut s = self.lock();
        if !self.can_admit(&s, priority) {
            return None;
        }
        s.in_use[index(priority)] += 1;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Some(Permit { gate: self.clone(), priority: Some(priority) })
    }

    /// Admits a call of `priority`, waiting in its queue for at most the queue timeout and
    /// never past `deadline`.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> Result<Permit, Refusal> {
        if self.max == 0 {
            self.in_use.fetch_add(1, Ordering::Relaxed);
            return Ok(Permit { gate: self.clone(), priority: None });
        }
        let i = index(priority);
        let (id, rx) = {
            let mut s = self.lock();
            if self.can_admit(&s, priority) {
                s.in_use[i] += 1;
                self.in_use.fetch_add(1, Ordering::Relaxed);
                return Ok(Permit { gate: self.clone(), priority: Some(priority) });
            }
            if s.queues[i].len() >= self.queue_length {
                return Err(Refusal::QueueFull);
            }
            let (tx, rx) = oneshot::channel();
            let id = s.next_waiter;
            s.next_waiter += 1;
            s.queues[i].push_back((id, tx));
            self.queued.fetch_add(1, Ordering::Relaxed);
            (id, rx)
        };
        let mut wait = self.queue_timeout;
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        let granted = tokio::time::timeout(wait, rx).await;
        if let Ok(Ok(())) = granted {
            // The dispatcher counted the slot and dequeued us.
            return Ok(Permit { gate: self.clone(), priority: Some(priority) });
        }
        let mut s = self.lock();
        if let Some(pos) = s.queues[i].iter().position(|(w, _)| *w == id) {
            s.queues[i].remove(pos);
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Timeout(wait));
        }
        // Dequeued by a release just as we timed out: the slot is ours.
        drop(s);
        Ok(Permit { gate: self.clone(), priority: Some(priority) })
    }

    fn release(&self, priority: Priority) {
        let mut s = self.lock();
        s.in_use[index(priority)] -= 1;
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        // Hand freed slots to waiters, highest priority first.
        for p in PRIORITIES {
            let i = index(p);
            while !s.queues[i].is_empty() && self.can_admit(&s, p) {
                let Some((_, tx)) = s.queues[i].pop_front() else { break };
                self.queued.fetch_sub(1, Ordering::Relaxed);
                s.in_use[i] += 1;
                self.in_use.fetch_add(1, Ordering::Relaxed);
                if tx.send(()).is_err() {
                    // The waiter gave up between its timeout and our lock.
                    s.in_use[i] -= 1;
                    self.in_use.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A slot held until dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<Gate>,
    /// `None` for unlimited gates (only counted).
    priority: Option<Priority>,
}

impl Permit {
    pub(crate) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.priority {
            Some(p) => self.gate.release(p),
            None => {
                self.gate.in_use.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The load ratio in an `ar-load` value (written by [`Permit::annotate`]).
pub(crate) fn parse_load(headers: &HeaderMap) -> Option<f64> {
    let value = headers.get(header::LOAD)?.as_bytes();
    // The form [`load_value`] writes, `<digits>.<three digits>`, read by hand (`f64`'s
    // parser cost 130 instructions per answer); anything else by the parser.
    if let [whole @ .., b'.', a, b, c] = value
        && (1..=9).contains(&whole.len())
        && let Some(thousandths) = whole
            .iter()
            .chain([a, b, c])
            .try_fold(0u64, |n, d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
    {
        // Exact as an integer; one rounding, as the parser's, in the division.
        return Some(thousandths as f64 / 1000.0);
    }
    std::str::from_utf8(value).ok()?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

impl Permit {
    /// Writes the instance's load into `headers` as `ar-load`, not counting this call.
    pub(crate) fn annotate(&self, headers: &mut HeaderMap) {
        let gate = self.gate();
        let busy = (gate.in_use() + gate.queued()).saturating_sub(1);
        headers.insert(header::LOAD, load_value(busy, gate.max()));
    }
}

/// `busy / max` with three decimals (`0` for a gate of no slots), rounded half up; written
/// by hand, not by `format!("{:.3}")`, which cost about a thousand instructions per answer.
fn load_value(busy: u32, max: u32) -> HeaderValue {
    let thousandths = match max {
        0 => 0,
        m => (u64::from(busy) * 2000 + u64::from(m)) / (2 * u64::from(m)),
    };
    if thousandths == 0 {
        // No other call in flight, the usual answer: no digits to write, no copy to make.
        return HeaderValue::from_static("0.000");
    }
    let mut digits = [0; 10];
    let whole = crate::grpc::decimal(u32::try_from(thousandths / 1000).unwrap_or(u32::MAX), &mut digits).as_bytes();
    let frac = thousandths % 1000;
    let mut out = [0u8; 14];
    out[..whole.len()].copy_from_slice(whole);
    out[whole.len()..whole.len() + 4].copy_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
    HeaderValue::from_bytes(&out[..whole.len() + 4]).expect("digits and a dot")
}

impl TrailersHook for Permit {
    fn on_trailers(&self, trailers: &mut HeaderMap) {
        self.annotate(trailers);
    }
}

#[derive(Debug)]
struct Entry {
    gate: Arc<Gate>,
    max: u32,
    settings: Settings,
}

/// Gates kept at most before idle ones are dropped. A gate with no call admitted, queued
/// or about to ask is the same as a new one, so dropping it loses nothing; busy gates are
/// kept (they are bounded by the calls in flight), so the map holds at most this many
/// gates plus the busy ones. Without it, every instance that ever registered (agents
/// restarting with new instance ids) would keep a gate for the life of the sidecar.
pub(crate) const MAX_IDLE_GATES: usize = 1024;

/// The gates of every local instance.
#[derive(Default)]
pub(crate) struct Gates {
    gates: ArcSwap<HashMap<String, Arc<Entry>>>,
}

impl Entry {
    /// No call holds, waits on or is about to ask this gate.
    fn idle(&self) -> bool {
        Arc::strong_count(&self.gate) == 1 && self.gate.in_use() == 0 && self.gate.queued() == 0
    }
}

impl Gates {
    /// The gate of `instance_id` for `max` slots and `settings`, made anew when either
    /// changed (calls holding the old gate finish under it).
    pub(crate) fn gate(&self, instance_id: &str, max: u32, settings: Settings) -> Arc<Gate> {
        if let Some(e) = self.gates.load().get(instance_id)
            && e.max == max
            && e.settings == settings
        {
            return e.gate.clone();
        }
        let fresh = Arc::new(Entry { gate: Arc::new(Gate::new(max, settings)), max, settings });
        let mut out = fresh.gate.clone();
        self.gates.rcu(|m| {
            let mut m = HashMap::clone(m);
            if m.len() >= MAX_IDLE_GATES && !m.contains_key(instance_id) {
                m.retain(|_, e| !e.idle());
            }
            let e = m.entry(instance_id.to_string()).or_insert_with(|| fresh.clone());
            if e.max != max || e.settings != settings {
                *e = fresh.clone();
            }
            out = e.gate.clone();
            m
        });
        out
    }

    /// Gates kept now (read by /metrics at scrape time).
    pub(crate) fn len(&self) -> usize {
        self.gates.load().len()
    }

    /// Calls delivered to any local instance and not yet answered.
    pub(crate) fn total_in_flight(&self) -> u32 {
        self.gates.load().values().map(|e| e.gate.in_use()).sum()
    }

    #[cfg(test)]
    /// Forgets instances that left.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.gates.rcu(|m| {
            m.iter().filter(|(id, _)| keep(id)).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>()
        });
    }
}

/// Service: per-instance admission by priority.
#[derive(Clone)]
pub(crate) struct Admitted<S> {
    /// Shared: a clone of the layer is one reference count.
    state: Arc<Shared>,
    inner: S,
}

/// What [`Admitted`] holds.
struct Shared {
    gates: Arc<Gates>,
    table: TableHandle,
    rejections: Arc<Rejections>,
    metrics: Arc<SidecarMetrics>,
    tracing: Tracing,
}

/// The layer of [`Admitted`]: the gates of local instances, the routing table (for
/// policies), and where refusals and queueing are recorded.
pub(crate) fn layer<S>(
    gates: Arc<Gates>,
    table: TableHandle,
    rejections: Arc<Rejections>,
    metrics: Arc<SidecarMetrics>,
    tracing: Tracing,
) -> impl tower::Layer<S, Service = Admitted<S>> + Clone {
    let state = Arc::new(Shared { gates, table, rejections, metrics, tracing });
    tower::layer::layer_fn(move |inner| Admitted { state: state.clone(), inner })
}

impl<S> Service<InboundCall> for Admitted<S>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible, Future = BoxFuture<Result<Attempt, Infallible>>>
        + Clone
        + Send
        + 'static,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let state = &self.state;
        let agent = &call.local.registration.agent;
        let settings = state
            .table
            .load()
            .policy(agent_reach::policy::PolicyKind::Agent, agent)
            .and_then(|p| p.spec.admission)
            .unwrap_or_default();
        let gate = state.gates.gate(&call.local.instance_id, call.local.registration.max_concurrency, settings);
        if let Some(permit) = gate.admit_now(call.priority) {
            // A free slot: no wait to record but its zero, and the inner layer (ready,
            // `poll_ready` above) is called now; the future holds its answer and the slot.
            state.metrics.queue_duration.observe(0.0);
            let answer = self.inner.call(call);
            return boxed!(async move { Ok(with_permit(answer.await?, permit)) });
        }
        // The call waits for a slot: the readied inner layer goes with it, a clone stays
        // for the next call's `poll_ready`.
        let fresh = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, fresh);
        let state = state.clone();
        boxed!(async move {
            match state.queue(&gate, call.priority, call.remaining, &call.trace, &call.local).await {
                Ok(permit) => Ok(with_permit(call_ready(service, call).await?, permit)),
                Err(refused) => Ok(refused),
            }
        })
    }
}

/// Calls `service`, readied before (`Admitted::poll_ready`).
fn call_ready<S: Service<InboundCall>>(mut service: S, call: InboundCall) -> S::Future {
    service.call(call)
}

/// The answer of an admitted call: the slot is held until its answer ends, and the load
/// goes out with a trailers-only answer's status (other answers get it in their trailers,
/// [`Permit`]'s `TrailersHook`).
fn with_permit(attempt: Attempt, permit: Permit) -> Attempt {
    match attempt {
        Attempt::Answered(mut resp, _) => {
            if resp.headers().contains_key(HEADER_GRPC_STATUS) {
                permit.annotate(resp.headers_mut());
            }
            Attempt::Answered(resp, Some(Box::new(permit)))
        }
        other => other,
    }
}

impl Shared {
    /// Waits for a slot of `gate` for a call of `priority` to `local` with `remaining`
    /// time (within its queue timeout and deadline), and records the wait; refused, the
    /// call's answer (never delivered). (Given the call's parts: the call is not `Sync`.)
    async fn queue(
        &self,
        gate: &Arc<Gate>,
        priority: Priority,
        remaining: Option<Duration>,
        trace: &opentelemetry::Context,
        local: &LocalInstance,
    ) -> Result<Permit, Attempt> {
        let deadline = remaining.map(|r| tokio::time::Instant::now() + r);
        let queued_since = std::time::SystemTime::now();
        let started = agent_reach_routing::clock();
        let admitted = gate.acquire(priority, deadline).await;
        let waited = std::time::Duration::from_nanos(agent_reach_routing::clock().saturating_sub(started));
        self.metrics.queue_duration.observe(waited.as_secs_f64());
        if waited >= std::time::Duration::from_micros(100) {
            // Time spent waiting for a slot shows as its own span, apart from the agent's.
            crate::telemetry::record_queue_span(&self.tracing, trace, queued_since, admitted.is_ok());
        }
        admitted.map_err(|refusal| {
            Rejections::count(&self.rejections.overloaded);
            let why = match refusal {
                Refusal::QueueFull => "its queue is full".to_string(),
                Refusal::Timeout(w) => format!("no slot within {w:?}"),
            };
            // Refused before the agent saw it: the caller may try elsewhere.
            Attempt::NotDelivered(DeliveryError::Overloaded {
                instance: local.instance_id.clone(),
                agent: local.registration.agent.clone(),
                busy: gate.in_use(),
                max: gate.max(),
                waiting: gate.queued(),
                why,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_is_written_with_three_decimals() {
        for (busy, max, want) in [
            (0, 4, "0.000"),
            (1, 4, "0.250"),
            (1, 3, "0.333"),
            (2, 3, "0.667"),
            (1, 2000, "0.001"),
            (1, 2001, "0.000"),
            (4, 4, "1.000"),
            (7, 2, "3.500"),
            (u32::MAX, 1, "4294967295.000"),
            (5, 0, "0.000"),
        ] {
            assert_eq!(load_value(busy, max), want, "{busy}/{max}");
        }
    }

    #[test]
    fn the_load_reads_back_as_the_float_parser_reads_it() {
        let read = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::LOAD, HeaderValue::from_str(v).unwrap());
            parse_load(&headers)
        };
        let written = [
            (0, 4),
            (1, 4),
            (1, 3),
            (2, 3),
            (4, 3),
            (13, 7),
            (1, 2000),
            (4, 4),
            (7, 2),
            (999_999_999, 7),
            (u32::MAX, 1),
        ];
        for (busy, max) in written {
            let value = load_value(busy, max);
            let text = value.to_str().unwrap();
            assert_eq!(read(text), Some(text.parse::<f64>().unwrap()), "{text}");
        }
        // Other forms go to the parser; what is not a finite load is none.
        assert_eq!(read("0.5"), Some(0.5));
        assert_eq!(read("12.0625"), Some(12.0625));
        assert_eq!(read("1e-3"), Some(0.001));
        assert_eq!(read(".250"), Some(0.25));
        for bad in ["-1.000", "NaN", "inf", "1.2x5", "", "abc"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }

    fn gate(max: u32) -> Arc<Gate> {
        Arc::new(Gate::new(
            max,
            Settings { normal_percent: 70, low_percent: 30, queue_length: 100, queue_timeout_ms: 100 },
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn shares_cap_normal_and_low_but_not_high() {
        let g = gate(10);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(g.acquire(Priority::Low, None).await.unwrap());
        }
        assert_eq!(g.acquire(Priority::Low, None).await.unwrap_err(), Refusal::Timeout(Duration::from_millis(100)));
        // NORMAL and LOW share 7 slots: 3 LOW leave 4 for NORMAL.
        for _ in 0..4 {
            held.push(g.acquire(Priority::Normal, None).await.unwrap());
        }
        assert_eq!(g.acquire(Priority::Normal, None).await.unwrap_err(), Refusal::Timeout(Duration::from_millis(100)));
        // The other 3 are HIGH's alone.
        for _ in 0..3 {
            held.push(g.acquire(Priority::High, None).await.unwrap());
        }
        assert_eq!(g.in_use(), 10);
        // Full: even HIGH waits now, and gets the first freed slot.
        let g2 = g.clone();
        let high = tokio::spawn(async move { g2.acquire(Priority::High, None).await });
        let g3 = g.clone();
        let low = tokio::spawn(async move { g3.acquire(Priority::Low, None).await });
        tokio::task::yield_now().await;
        assert_eq!(g.queued(), 2);
        drop(held.remove(5)); // a NORMAL slot frees
        let high = high.await.unwrap().unwrap();
        assert_eq!(g.in_use(), 10);
        // LOW is at its cap (3) anyway, and times out.
        assert!(low.await.unwrap().is_err());
        drop(high);
        drop(held);
        assert_eq!((g.in_use(), g.queued()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn normal_and_low_flood_leaves_high_its_reserve() {
        // 10 slots, NORMAL share 70 %: however many NORMAL and LOW calls come, 3 slots stay
        // free for HIGH, which is admitted at once.
        let g = gate(10);
        let mut held = Vec::new();
        for p in [Priority::Low, Priority::Normal, Priority::Normal, Priority::Low, Priority::Normal] {
            for _ in 0..3 {
                if let Ok(permit) = g.acquire(p, Some(Instant::now())).await {
                    held.push(permit);
                }
            }
        }
        assert_eq!(g.in_use(), 7);
        let t0 = Instant::now();
        for _ in 0..3 {
            held.push(g.acquire(Priority::High, None).await.unwrap());
        }
        assert_eq!((g.in_use(), Instant::now() - t0), (10, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn low_never_gets_a_slot_while_high_waits() {
        let g = gate(4);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(g.acquire(Priority::High, None).await.unwrap());
        }
        // A LOW waiter queues first, then a HIGH one; a freed slot goes to HIGH.
        let gl = g.clone();
        let low = tokio::spawn(async move { gl.acquire(Priority::Low, None).await });
        tokio::task::yield_now().await;
        let gh = g.clone();
        let high = tokio::spawn(async move { gh.acquire(Priority::High, None).await });
        tokio::task::yield_now().await;
        drop(held.pop());
        let _high = high.await.unwrap().unwrap();
        assert_eq!(g.queued(), 1, "LOW still waits");
        drop(held.pop());
        let _low = low.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_waits_past_the_deadline_or_the_queue_timeout() {
        let g = gate(1);
        let _held = g.acquire(Priority::High, None).await.unwrap();
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(30);
        assert_eq!(
            g.acquire(Priority::High, Some(deadline)).await.unwrap_err(),
            Refusal::Timeout(Duration::from_millis(30))
        );
        assert_eq!(Instant::now() - t0, Duration::from_millis(30));
        let t0 = Instant::now();
        assert!(g.acquire(Priority::Normal, None).await.is_err());
        assert_eq!(Instant::now() - t0, Duration::from_millis(100), "the queue timeout bounds the wait");
        assert_eq!(g.queued(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let g = Arc::new(Gate::new(1, Settings { queue_length: 1, ..Default::default() }));
        let _held = g.acquire(Priority::High, None).await.unwrap();
        let g2 = g.clone();
        let _waiting = tokio::spawn(async move { g2.acquire(Priority::High, None).await });
        tokio::task::yield_now().await;
        assert_eq!(g.acquire(Priority::High, None).await.unwrap_err(), Refusal::QueueFull);
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_with_three_priorities_keeps_the_cap_and_serves_high() {
        // 8 slots; 60 callers of each priority, each holding its slot 10 ms, deadline 50 ms.
        let g = gate(8);
        let peak = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for p in PRIORITIES {
            for _ in 0..60 {
                let (g, peak) = (g.clone(), peak.clone());
                tasks.push(tokio::spawn(async move {
                    let start = Instant::now();
                    let deadline = start + Duration::from_millis(50);
                    let result = g.acquire(p, Some(deadline)).await;
                    let waited = Instant::now() - start;
                    assert!(waited <= Duration::from_millis(50), "{p:?} waited {waited:?}, past its deadline");
                    if let Ok(permit) = result {
                        peak.fetch_max(g.in_use(), Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        drop(permit);
                        (p, true)
                    } else {
                        (p, false)
                    }
                }));
            }
        }
        let mut admitted = [0u32; 3];
        for t in tasks {
            let (p, ok) = t.await.unwrap();
            if ok {
                admitted[index(p)] += 1;
            }
        }
        assert!(peak.load(Ordering::Relaxed) <= 8, "in flight above the cap");
        assert!(admitted[0] >= admitted[1] && admitted[1] >= admitted[2], "admitted by priority: {admitted:?}");
        assert!(admitted[0] >= 30, "HIGH got its share: {admitted:?}");
    }
}
