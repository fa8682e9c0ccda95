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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::Priority;
use agent_reach::policy::Admission as Settings;
use tokio::sync::oneshot;
use tokio::time::Instant;

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
pub enum Refusal {
    /// The queue of its priority is full.
    QueueFull,
    /// It waited the queue timeout (or until its deadline) without a slot.
    Timeout(Duration),
}

/// The admission gate of one instance.
#[derive(Debug)]
pub struct Gate {
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
    pub fn new(max: u32, settings: Settings) -> Gate {
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

    pub fn max(&self) -> u32 {
        self.max
    }

    /// Calls admitted and running.
    pub fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Calls waiting for a slot.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Load ratio: (running + waiting) / slots; 0 when unlimited.
    pub fn load_ratio(&self) -> f64 {
        if self.max == 0 { 0.0 } else { f64::from(self.in_use() + self.queued()) / f64::from(self.max) }
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

    /// Admits a call of `priority`, waiting in its queue for at most the queue timeout and
    /// never past `deadline`.
    pub async fn acquire(self: &Arc<Self>, priority: Priority, deadline: Option<Instant>) -> Result<Permit, Refusal> {
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
pub struct Permit {
    gate: Arc<Gate>,
    /// `None` for unlimited gates (only counted).
    priority: Option<Priority>,
}

impl Permit {
    pub fn gate(&self) -> &Arc<Gate> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
