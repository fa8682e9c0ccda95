//! The circuit breaker of one instance, as one caller's sidecar sees it.
//!
//! Closed: calls flow; the breaker opens after `consecutive_failures` failures in a row, or
//! when the failure rate over the last `window` reaches `failure_rate` with at least
//! `min_requests` calls. Open: the instance is not picked until the open period ends. Half
//! open: exactly `half_open_probes` real calls are let through; if all succeed the breaker
//! closes, if one fails it opens again for twice as long (capped at `max_open`).
//!
//! Overload answers (RESOURCE_EXHAUSTED) are not failures here: the balancer penalises
//! them instead. Times are nanoseconds on [`crate::clock`], passed in, so the state
//! machine is tested without real time. One short `std::sync::Mutex` per instance; never
//! held across an await. The counters behind it are allocated on the first recorded
//! outcome and dropped again when the breaker closes after probation, so the breakers of
//! instances this sidecar never calls (most of a large table) cost a lock word, not the
//! window's slices.

use std::sync::Mutex;
use std::time::Duration;

use agent_reach::policy::CircuitBreaker as Settings;

/// The state of a breaker, for explanations and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    open: bool,
    /// Open: until when. Half-open when `open` and now ≥ `until`.
    until: u64,
    /// The current open period (doubles on each failed probation).
    period: u64,
    consecutive: u32,
    /// Probes let through in this half-open period, and how many succeeded.
    probes_sent: u32,
    probes_ok: u32,
    /// Outcomes over the window, in [`SLICES`] time slices: (slice number, calls, failures).
    slices: [(u64, u32, u32); SLICES],
}

/// Time slices of the failure-rate window: recording and reading are O(1) per call.
const SLICES: usize = 10;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Breaker {
    /// None: closed with no outcome in the window (the state of a breaker never called).
    inner: Mutex<Option<Box<Inner>>>,
    /// Mirrors `inner.open`, so the common case (closed) takes no lock.
    tripped: std::sync::atomic::AtomicBool,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Breaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<Inner>>> {
        // A poisoned lock only means a panic elsewhere; the counters stay usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state at `now`.
    pub fn state(&self, now: u64) -> BreakerState {
        let guard = self.lock();
        let Some(b) = guard.as_deref() else {
            return BreakerState::Closed;
        };
        if !b.open {
            BreakerState::Closed
        } else if now < b.until {
            BreakerState::Open
        } else {
            BreakerState::HalfOpen
        }
    }

    /// Whether a call may be sent now: always when closed, never when open, and while half
    /// open only until `half_open_probes` probes are out.
    pub fn can_pass(&self, now: u64, settings: &Settings) -> bool {
        if !self.tripped.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let guard = self.lock();
        guard.as_deref().is_none_or(|b| !b.open || (now >= b.until && b.probes_sent < settings.half_open_probes()))
    }

    /// Takes a pass for a call about to be sent (a probe slot when half open). False when
    /// the breaker does not let it through.
    pub fn acquire(&self, now: u64, settings: &Settings) -> bool {
        if !self.tripped.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let mut guard = self.lock();
        let Some(b) = guard.as_deref_mut().filter(|b| b.open) else {
            return true;
        };
        if now < b.until || b.probes_sent >= settings.half_open_probes() {
            return false;
        }
        b.probes_sent += 1;
        true
    }

    /// Records the outcome of a call that was let through.
    pub fn record(&self, now: u64, failed: bool, settings: &Settings) {
        let mut guard = self.lock();
        let b = guard.get_or_insert_with(Box::default);
        if b.open {
            if now < b.until {
                return; // a straggler from before the breaker opened
            }
            if failed {
                let period = (b.period.saturating_mul(2)).min(ns(settings.max_open()));
                open(b, now, period);
            } else {
                b.probes_ok += 1;
                if b.probes_ok >= settings.half_open_probes() {
                    *guard = None;
                    self.tripped.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            }
            return;
        }
        let width = (ns(settings.window()) / SLICES as u64).max(1);
        let slice = now / width;
        let current = &mut b.slices[(slice % SLICES as u64) as usize];
        if current.0 != slice {
            *current = (slice, 0, 0);
        }
        current.1 += 1;
        if failed {
            current.2 += 1;
        }
        b.consecutive = if failed { b.consecutive + 1 } else { 0 };
        let (total, failures) = b
            .slices
            .iter()
            .filter(|(s, _, _)| *s + SLICES as u64 > slice)
            .fold((0u32, 0u32), |(t, f), (_, c, x)| (t + c, f + x));
        let rate_trips =
            total >= settings.min_requests() && f64::from(failures) / f64::from(total) >= settings.failure_rate();
        if failed && (b.consecutive >= settings.consecutive_failures() || rate_trips) {
            open(b, now, ns(settings.open()));
            self.tripped.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn open(b: &mut Inner, now: u64, period: u64) {
    b.open = true;
    b.until = now.saturating_add(period);
    b.period = period;
    b.consecutive = 0;
    b.probes_sent = 0;
    b.probes_ok = 0;
    b.slices = Default::default();
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn settings() -> Settings {
        Settings {
            consecutive_failures: 3,
            failure_rate: 0.5,
            window_ms: 10_000,
            min_requests: 10,
            open_ms: 1_000,
            max_open_ms: 4_000,
            half_open_probes: 2,
        }
    }

    #[test]
    fn opens_after_exactly_n_consecutive_failures() {
        let (b, s) = (Breaker::default(), settings());
        b.record(0, true, &s);
        b.record(MS, true, &s);
        assert_eq!(b.state(2 * MS), BreakerState::Closed);
        b.record(2 * MS, false, &s); // a success resets the run
        b.record(3 * MS, true, &s);
        b.record(4 * MS, true, &s);
        assert_eq!(b.state(5 * MS), BreakerState::Closed);
        b.record(5 * MS, true, &s);
        assert_eq!(b.state(5 * MS), BreakerState::Open);
        assert!(!b.can_pass(5 * MS, &s));
        assert!(!b.acquire(500 * MS, &s), "no call while open");
    }

    #[test]
    fn opens_on_the_failure_rate_with_enough_requests() {
        let (b, s) = (Breaker::default(), settings());
        // Alternate: never 3 in a row, but half fail.
        for i in 0..9 {
            b.record(i * MS, i % 2 == 0, &s);
        }
        assert_eq!(b.state(9 * MS), BreakerState::Closed, "only 9 requests: below min_requests");
        b.record(9 * MS, true, &s);
        assert_eq!(b.state(9 * MS), BreakerState::Open, "10 requests, 6 failed");
    }

    #[test]
    fn outcomes_older_than_the_window_stop_counting() {
        let (b, s) = (Breaker::default(), settings());
        for i in 0..9 {
            b.record(i * MS, i % 2 == 0, &s);
        }
        // 11 s later the nine earlier outcomes have left the 10 s window: one more failure
        // makes 1 request, below min_requests, so the breaker stays closed.
        b.record(11_000 * MS, true, &s);
        assert_eq!(b.state(11_000 * MS), BreakerState::Closed);
        let guard = b.lock();
        let inner = guard.as_deref().expect("outcomes were recorded");
        let live: u32 =
            inner.slices.iter().filter(|(sl, _, _)| *sl + 10 > 11_000 * MS / (1_000 * MS)).map(|(_, c, _)| c).sum();
        assert_eq!(live, 1);
    }

    #[test]
    fn half_open_lets_exactly_the_probes_through_then_closes() {
        let (b, s) = (Breaker::default(), settings());
        for i in 0..3 {
            b.record(i, true, &s);
        }
        let after = 2 + 1000 * MS;
        assert_eq!(b.state(after), BreakerState::HalfOpen);
        assert!(b.acquire(after, &s));
        assert!(b.acquire(after, &s));
        assert!(!b.acquire(after, &s), "exactly two probes");
        assert!(!b.can_pass(after, &s));
        b.record(after + MS, false, &s);
        assert_eq!(b.state(after + MS), BreakerState::HalfOpen);
        b.record(after + 2 * MS, false, &s);
        assert_eq!(b.state(after + 2 * MS), BreakerState::Closed);
        assert!(b.lock().is_none(), "closing after probation drops the window");
        assert!(b.acquire(after + 3 * MS, &s));
        // Closed afresh: the old failures are gone, three new ones open it again.
        for i in 0..2 {
            b.record(after + (4 + i) * MS, true, &s);
        }
        assert_eq!(b.state(after + 6 * MS), BreakerState::Closed);
        b.record(after + 6 * MS, true, &s);
        assert_eq!(b.state(after + 6 * MS), BreakerState::Open);
    }

    #[test]
    fn a_breaker_never_called_holds_no_window() {
        let (b, s) = (Breaker::default(), settings());
        assert_eq!(b.state(5 * MS), BreakerState::Closed);
        assert!(b.can_pass(5 * MS, &s));
        assert!(b.acquire(5 * MS, &s));
        assert!(b.lock().is_none(), "state, can_pass and acquire allocate nothing");
        b.record(6 * MS, false, &s);
        assert!(b.lock().is_some(), "the first outcome starts the window");
        assert!(std::mem::size_of::<Breaker>() <= 24, "{}", std::mem::size_of::<Breaker>());
    }

    #[test]
    fn a_failed_probe_reopens_for_longer_up_to_the_cap() {
        let (b, s) = (Breaker::default(), settings());
        for i in 0..3 {
            b.record(i, true, &s);
        }
        let mut t = 2 + 1000 * MS;
        for expected_period in [2000, 4000, 4000] {
            assert!(b.acquire(t, &s));
            b.record(t, true, &s);
            assert_eq!(b.state(t + expected_period * MS - 1), BreakerState::Open);
            assert_eq!(b.state(t + expected_period * MS), BreakerState::HalfOpen);
            t += expected_period * MS;
        }
    }
}
