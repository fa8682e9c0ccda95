//! Which heartbeats become store writes.
//!
//! A heartbeat always renews its lease, but it rewrites the instance's record only when
//! something routing cares about changed: the reported state (written at once), or the
//! load ratio moving by at least the configured step from the value last written (written
//! at most once per load-report interval per instance; a change that arrives sooner waits
//! for a later heartbeat, which still carries it). So thousands of heartbeats per second
//! become a handful of writes, and a load that hovers near a value writes nothing.
//!
//! The "last written" times live in this replica's memory: a sidecar that moves to another
//! replica may get one early write there. That bounds, it does not break, the rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use agent_reach::model::{HealthState, Load};
use tokio::time::Instant;

/// What to do with one heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing routing cares about changed.
    Skip,
    /// The reported state changed: write now.
    WriteState,
    /// The load moved by at least a step and the last write is an interval old: write now.
    WriteLoad,
    /// The load moved by at least a step, but the record was written less than an
    /// interval ago.
    Defer,
}

/// Decides which heartbeats are written (see the module documentation).
#[derive(Debug)]
pub struct LoadGate {
    step: f64,
    interval: Duration,
    last_write: Mutex<Written>,
}

#[derive(Debug)]
struct Written {
    at: HashMap<String, Instant>,
    next_prune: Option<Instant>,
}

impl LoadGate {
    pub fn new(step: f64, interval: Duration) -> LoadGate {
        LoadGate { step, interval, last_write: Mutex::new(Written { at: HashMap::new(), next_prune: None }) }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, Written> {
        // Poisoning only means a panic elsewhere; the map of instants stays valid.
        self.last_write.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `load` differs meaningfully from `stored`.
    pub fn moved(&self, stored: &Load, load: &Load) -> bool {
        (load.load_ratio - stored.load_ratio).abs() >= self.step
    }

    /// Decides for a heartbeat of the instance under `key`, whose record holds
    /// `stored_state` and `stored_load`.
    pub fn decide(
        &self,
        key: &str,
        stored_state: HealthState,
        stored_load: &Load,
        state: Option<HealthState>,
        load: Option<&Load>,
        now: Instant,
    ) -> Decision {
        if state.is_some_and(|s| s != stored_state) {
            return Decision::WriteState;
        }
        if !load.is_some_and(|l| self.moved(stored_load, l)) {
            return Decision::Skip;
        }
        match self.written().at.get(key) {
            Some(at) if now.saturating_duration_since(*at) < self.interval => Decision::Defer,
            _ => Decision::WriteLoad,
        }
    }

    /// Records that the instance under `key` was written at `now`.
    pub fn record_write(&self, key: &str, now: Instant) {
        let mut written = self.written();
        written.at.insert(key.to_string(), now);
        // Entries older than an interval no longer decide anything: drop them once per
        // interval, so the map holds only recently written instances.
        if written.next_prune.is_none_or(|at| now >= at) {
            let interval = self.interval;
            written.at.retain(|_, at| now.saturating_duration_since(*at) < interval);
            written.next_prune = Some(now + interval);
        }
    }

    /// Instances remembered (for tests).
    pub fn remembered(&self) -> usize {
        self.written().at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(ratio: f64) -> Load {
        Load { load_ratio: ratio, ..Default::default() }
    }

    #[tokio::test(start_paused = true)]
    async fn state_changes_write_at_once_and_load_at_most_once_per_interval() {
        let gate = LoadGate::new(0.1, Duration::from_secs(5));
        let up = HealthState::Up;
        let t0 = Instant::now();
        // Noise below the step: nothing.
        assert_eq!(gate.decide("k", up, &load(0.30), Some(up), Some(&load(0.39)), t0), Decision::Skip);
        assert_eq!(gate.decide("k", up, &load(0.30), Some(up), Some(&load(0.21)), t0), Decision::Skip);
        assert_eq!(gate.decide("k", up, &load(0.30), None, None, t0), Decision::Skip);
        // A step: written, then the next step within the interval waits.
        assert_eq!(gate.decide("k", up, &load(0.30), Some(up), Some(&load(0.40)), t0), Decision::WriteLoad);
        gate.record_write("k", t0);
        tokio::time::advance(Duration::from_secs(4)).await;
        let t4 = Instant::now();
        assert_eq!(gate.decide("k", up, &load(0.40), Some(up), Some(&load(0.90)), t4), Decision::Defer);
        // A state change does not wait.
        let degraded = Some(HealthState::Degraded);
        assert_eq!(gate.decide("k", up, &load(0.40), degraded, Some(&load(0.90)), t4), Decision::WriteState);
        tokio::time::advance(Duration::from_secs(1)).await;
        let t5 = Instant::now();
        assert_eq!(gate.decide("k", up, &load(0.40), Some(up), Some(&load(0.90)), t5), Decision::WriteLoad);
        // Other instances are independent.
        assert_eq!(gate.decide("j", up, &load(0.0), Some(up), Some(&load(0.5)), t4), Decision::WriteLoad);
    }

    #[tokio::test(start_paused = true)]
    async fn old_entries_are_pruned() {
        let gate = LoadGate::new(0.1, Duration::from_secs(5));
        for i in 0..100 {
            gate.record_write(&format!("k{i}"), Instant::now());
        }
        assert_eq!(gate.remembered(), 100);
        tokio::time::advance(Duration::from_secs(6)).await;
        gate.record_write("fresh", Instant::now());
        assert_eq!(gate.remembered(), 1);
    }
}
