//! What a caller's sidecar has seen of each instance: calls in flight from this sidecar, a
//! peak-EWMA of their latency, the load the instance's sidecar last reported, and recent
//! overload answers. Kept in atomics shared by every routing-table version, so a table swap
//! keeps what was learned and no lock is taken on the call path.
//!
//! Times are nanoseconds on the [`clock`] passed in, so the arithmetic is testable without
//! real time. Values are approximate under races (two updates may interleave); that only
//! blurs a load-balancing estimate.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since the first call in this process (monotonic).
pub fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How fast lower samples pull a latency estimate down (time constant of the exponential
/// blend, as in linkerd2-proxy's peak-EWMA).
const DECAY_NS: f64 = 0.2e9;
/// How fast the estimate of an instance that gets no calls decays toward the default (0, an
/// instance never measured): an instance that was slow once is probed again after a
/// fraction of a second, and a recovered one gets its share back within seconds.
const IDLE_DECAY_NS: f64 = 0.05e9;
/// Added to every latency estimate so an instance never costs nothing.
const BASE_COST_NS: f64 = 100_000.0;
/// How long a RESOURCE_EXHAUSTED answer keeps an instance marked overloaded.
pub const OVERLOAD_PENALTY: Duration = Duration::from_secs(1);
/// Reported load this old no longer counts.
const LOAD_REPORT_TTL_NS: u64 = 30_000_000_000;

/// Per-instance observations. See the module documentation.
#[derive(Debug, Default)]
pub struct InstanceStats {
    in_flight: AtomicU32,
    /// Latency estimate in nanoseconds, as f64 bits.
    ewma: AtomicU64,
    /// Clock time of the last estimate update.
    stamp: AtomicU64,
    /// Load ratio the instance's sidecar last reported, in thousandths.
    load_milli: AtomicU32,
    load_stamp: AtomicU64,
    /// Clock time until which the instance counts as overloaded.
    overloaded_until: AtomicU64,
    /// This sidecar's circuit breaker for the instance.
    pub breaker: crate::breaker::Breaker,
}

impl InstanceStats {
    /// Calls from this sidecar currently in flight to the instance.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The latency estimate at `now`. While no call to the instance is in flight it decays
    /// toward the default (0, the estimate of an instance never measured), so an instance
    /// that was slow once is tried again soon and gets its share back once it answers
    /// fast. While calls are in flight it holds: they are the probe, and a slow instance
    /// is not sent more calls just because it has not answered yet.
    pub fn latency_estimate(&self, now: u64) -> f64 {
        if self.in_flight() > 0 { f64::from_bits(self.ewma.load(Ordering::Relaxed)) } else { self.decayed(now) }
    }

    /// The estimate decayed for the time since the last sample.
    fn decayed(&self, now: u64) -> f64 {
        let est = f64::from_bits(self.ewma.load(Ordering::Relaxed));
        let idle = now.saturating_sub(self.stamp.load(Ordering::Relaxed)) as f64;
        est * (-idle / IDLE_DECAY_NS).exp()
    }

    /// Records one call's latency: a sample above the estimate decayed since the last
    /// sample replaces it (peak), a lower one blends in with weight growing with the time
    /// since the last sample.
    pub fn observe(&self, latency: Duration, now: u64) {
        let sample = latency.as_nanos() as f64;
        let prev = self.decayed(now);
        let elapsed = now.saturating_sub(self.stamp.load(Ordering::Relaxed)) as f64;
        let next = if sample >= prev {
            sample
        } else {
            let w = (-elapsed / DECAY_NS).exp();
            prev * w + sample * (1.0 - w)
        };
        self.ewma.store(next.to_bits(), Ordering::Relaxed);
        self.stamp.store(now, Ordering::Relaxed);
    }

    /// Records the load ratio reported by the instance's sidecar.
    pub fn report_load(&self, ratio: f64, now: u64) {
        let milli = (ratio.clamp(0.0, 100.0) * 1000.0) as u32;
        self.load_milli.store(milli, Ordering::Relaxed);
        self.load_stamp.store(now, Ordering::Relaxed);
    }

    /// The last reported load ratio, if recent.
    pub fn reported_load(&self, now: u64) -> Option<f64> {
        let at = self.load_stamp.load(Ordering::Relaxed);
        (at != 0 && now.saturating_sub(at) < LOAD_REPORT_TTL_NS)
            .then(|| f64::from(self.load_milli.load(Ordering::Relaxed)) / 1000.0)
    }

    /// Marks the instance overloaded (it answered RESOURCE_EXHAUSTED) for a while.
    pub fn mark_overloaded(&self, now: u64) {
        let until = now.saturating_add(OVERLOAD_PENALTY.as_nanos() as u64);
        self.overloaded_until.store(until, Ordering::Relaxed);
    }

    /// Whether the instance should be avoided: it refused work recently, or reports a load
    /// ratio of 1 or more.
    pub fn overloaded(&self, now: u64) -> bool {
        now < self.overloaded_until.load(Ordering::Relaxed) || self.reported_load(now).is_some_and(|l| l >= 1.0)
    }

    /// The least_loaded cost at `now`: latency estimate × (in flight + 1), raised by the
    /// reported load ratio. Lower is better.
    pub fn cost(&self, now: u64) -> f64 {
        let load = self.reported_load(now).unwrap_or(0.0);
        (self.latency_estimate(now) + BASE_COST_NS) * f64::from(self.in_flight() + 1) * (1.0 + 2.0 * load)
    }

    /// Counts a call in flight until the returned guard is dropped.
    pub fn begin(self: &std::sync::Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { stats: self.clone() }
    }
}

/// A call in flight to an instance; dropping it ends the count.
#[derive(Debug)]
pub struct InFlight {
    stats: std::sync::Arc<InstanceStats>,
}

impl InFlight {
    pub fn stats(&self) -> &InstanceStats {
        &self.stats
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn peak_ewma_jumps_up_and_decays_down() {
        let s = InstanceStats::default();
        s.observe(Duration::from_millis(10), 1000 * MS);
        assert_eq!(s.latency_estimate(1000 * MS), 10.0 * MS as f64);
        // A lower sample 1 ms later blends into the (1 ms decayed) estimate with weight
        // 1 − e^(−1 ms / DECAY); after a long gap it dominates.
        s.observe(Duration::from_millis(1), 1001 * MS);
        let decayed = 10.0 * MS as f64 * (-(MS as f64) / IDLE_DECAY_NS).exp();
        let w = (-(MS as f64) / DECAY_NS).exp();
        let expected = decayed * w + MS as f64 * (1.0 - w);
        assert!((s.latency_estimate(1001 * MS) - expected).abs() < 1.0, "{expected}");
        s.observe(Duration::from_millis(1), 100_000 * MS);
        assert!(s.latency_estimate(100_000 * MS) < 1.1 * MS as f64);
        // A higher sample replaces it at once.
        s.observe(Duration::from_millis(50), 100_001 * MS);
        assert_eq!(s.latency_estimate(100_001 * MS), 50.0 * MS as f64);
        // Unused, it decays toward the default (0): after one time constant to ~37 %.
        let later = s.latency_estimate(100_001 * MS + IDLE_DECAY_NS as u64);
        assert!((later / (50.0 * MS as f64) - (-1f64).exp()).abs() < 1e-6);
        // The next sample starts from the decayed estimate: a sample above it is the new
        // peak, not blended with the stale 50 ms.
        let after = 100_001 * MS + 5 * IDLE_DECAY_NS as u64;
        s.observe(Duration::from_millis(2), after);
        assert_eq!(s.latency_estimate(after), 2.0 * MS as f64);
    }

    #[test]
    fn the_estimate_holds_while_a_call_is_in_flight() {
        let s = Arc::new(InstanceStats::default());
        s.observe(Duration::from_millis(30), 1000 * MS);
        let probe = s.begin();
        // However long the probe takes, the instance does not look cheaper meanwhile.
        assert_eq!(s.latency_estimate(2000 * MS), 30.0 * MS as f64);
        drop(probe);
        assert!(s.latency_estimate(2000 * MS) < 1e-3 * MS as f64);
    }

    #[test]
    fn cost_grows_with_in_flight_and_load() {
        let s = Arc::new(InstanceStats::default());
        s.observe(Duration::from_millis(1), 5 * MS);
        let idle = s.cost(5 * MS);
        let g1 = s.begin();
        let _g2 = s.begin();
        assert_eq!(s.in_flight(), 2);
        assert!((s.cost(5 * MS) / idle - 3.0).abs() < 1e-9);
        drop(g1);
        assert_eq!(s.in_flight(), 1);
        s.report_load(0.5, 5 * MS);
        assert!((s.cost(5 * MS) / idle - 4.0).abs() < 1e-9);
        assert!(!s.overloaded(5 * MS));
        s.report_load(1.0, 5 * MS);
        assert!(s.overloaded(5 * MS));
        // Old reports stop counting.
        assert!(!s.overloaded(5 * MS + LOAD_REPORT_TTL_NS));
    }

    #[test]
    fn stats_of_an_instance_never_called_are_small() {
        // Every instance of the table has one; a table of 10,000 instances holds 10,000.
        assert!(std::mem::size_of::<InstanceStats>() <= 64, "{}", std::mem::size_of::<InstanceStats>());
    }

    #[test]
    fn overload_marks_expire() {
        let s = InstanceStats::default();
        s.mark_overloaded(10 * MS);
        assert!(s.overloaded(10 * MS));
        assert!(s.overloaded(10 * MS + 999 * MS));
        assert!(!s.overloaded(10 * MS + 1000 * MS));
    }
}
