//! The health of one local instance, as its sidecar judges it (DESIGN §4):
//!
//! - While the agent heartbeats, its own report rules: STARTING, UP, DEGRADED, PAUSED or
//!   DOWN, with its load.
//! - When its last heartbeat is more than two heartbeat intervals old, it is UNKNOWN and
//!   the sidecar probes it (`grpc.health.v1`, 2 s timeout), again every probe interval
//!   while it stays silent. A probe settles it UP (serving) or DOWN (anything else).
//! - The next heartbeat brings back the agent's own report at once.
//! - With no heartbeat and no successful probe for `dead_after`, it is dead: the sidecar
//!   removes it.
//!
//! Pure state and time arithmetic on tokio's clock (so tests run on a paused clock); the
//! probing and publishing happen in the registry.

use std::time::Duration;

use agent_reach::model::{HealthState, Load};
use tokio::time::Instant;

/// The timers of the health model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timers {
    /// How often agents heartbeat; two missed intervals make an instance UNKNOWN.
    pub heartbeat_interval: Duration,
    /// How often a silent instance is probed.
    pub probe_interval: Duration,
    /// Timeout of one probe.
    pub probe_timeout: Duration,
    /// No heartbeat and no successful probe for this long: the instance is removed.
    pub dead_after: Duration,
}

impl Timers {
    /// Heartbeats older than this make an instance UNKNOWN.
    pub(crate) fn stale_after(&self) -> Duration {
        self.heartbeat_interval * 2
    }
}

/// The health of one instance.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    reported: HealthState,
    load: Load,
    last_heartbeat: Instant,
    /// The last heartbeat or successful probe.
    last_alive: Instant,
    /// The outcome of the last probe since the last heartbeat.
    probed: Option<bool>,
    probe_started: Option<Instant>,
    probing: bool,
}

impl Health {
    /// A just-registered instance in `initial` state.
    pub(crate) fn new(initial: HealthState, now: Instant) -> Health {
        Health {
            reported: initial,
            load: Load::default(),
            last_heartbeat: now,
            last_alive: now,
            probed: None,
            probe_started: None,
            probing: false,
        }
    }

    /// A heartbeat: the agent's report (when it sent one) rules again.
    pub(crate) fn heartbeat(&mut self, state: Option<HealthState>, load: Option<Load>, now: Instant) {
        if let Some(s) = state.filter(|s| *s != HealthState::Unknown) {
            self.reported = s;
        }
        if let Some(l) = load {
            self.load = l;
        }
        self.last_heartbeat = now;
        self.last_alive = now;
        self.probed = None;
    }

    /// When the agent last heartbeated (its registration, before the first one).
    pub(crate) fn last_heartbeat(&self) -> Instant {
        self.last_heartbeat
    }

    pub(crate) fn load(&self) -> Load {
        self.load
    }

    /// Whether the last heartbeat is more than two intervals old.
    pub(crate) fn stale(&self, now: Instant, timers: &Timers) -> bool {
        now.saturating_duration_since(self.last_heartbeat) > timers.stale_after()
    }

    /// The state routing should see.
    pub(crate) fn state(&self, now: Instant, timers: &Timers) -> HealthState {
        if !self.stale(now, timers) {
            return self.reported;
        }
        match self.probed {
            None => HealthState::Unknown,
            Some(true) => HealthState::Up,
            Some(false) => HealthState::Down,
        }
    }

    /// Whether a probe should start now.
    pub(crate) fn probe_due(&self, now: Instant, timers: &Timers) -> bool {
        self.stale(now, timers)
            && !self.probing
            && self.probe_started.is_none_or(|at| now.saturating_duration_since(at) >= timers.probe_interval)
    }

    pub(crate) fn probe_started(&mut self, now: Instant) {
        self.probing = true;
        self.probe_started = Some(now);
    }

    /// A probe's outcome. One that a heartbeat overtook changes nothing but the timer.
    pub(crate) fn probe_finished(&mut self, serving: bool, started: Instant, now: Instant) {
        self.probing = false;
        if started < self.last_heartbeat {
            return;
        }
        self.probed = Some(serving);
        if serving {
            self.last_alive = now;
        }
    }

    /// Whether the instance has shown no sign of life for `dead_after`.
    pub(crate) fn dead(&self, now: Instant, timers: &Timers) -> bool {
        now.saturating_duration_since(self.last_alive) >= timers.dead_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timers() -> Timers {
        Timers {
            heartbeat_interval: Duration::from_secs(2),
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(2),
            dead_after: Duration::from_secs(30),
        }
    }

    async fn advance(ms: u64) -> Instant {
        tokio::time::advance(Duration::from_millis(ms)).await;
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn reports_rule_while_heartbeats_are_fresh() {
        let t = timers();
        let mut h = Health::new(HealthState::Starting, Instant::now());
        assert_eq!(h.state(Instant::now(), &t), HealthState::Starting);
        for (report, expected) in [
            (Some(HealthState::Up), HealthState::Up),
            (Some(HealthState::Degraded), HealthState::Degraded),
            (None, HealthState::Degraded),
            (Some(HealthState::Unknown), HealthState::Degraded), // not the agent's to say
            (Some(HealthState::Paused), HealthState::Paused),
            (Some(HealthState::Up), HealthState::Up),
            (Some(HealthState::Down), HealthState::Down),
        ] {
            let now = advance(1000).await;
            h.heartbeat(report, Some(Load { in_flight: 3, ..Default::default() }), now);
            assert_eq!(h.state(now, &t), expected);
            assert!(!h.probe_due(now, &t));
        }
        assert_eq!(h.load().in_flight, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_gives_unknown_then_probes_settle_it() {
        let t = timers();
        let mut h = Health::new(HealthState::Up, Instant::now());
        // Exactly two intervals is still fresh; just past it is UNKNOWN and due a probe.
        let now = advance(4000).await;
        assert_eq!(h.state(now, &t), HealthState::Up);
        assert!(!h.probe_due(now, &t));
        let now = advance(1).await;
        assert_eq!(h.state(now, &t), HealthState::Unknown);
        assert!(h.probe_due(now, &t));
        // A probe in flight is not started twice.
        let started = now;
        h.probe_started(started);
        assert!(!h.probe_due(advance(3000).await, &t));
        let now = Instant::now();
        h.probe_finished(true, started, now);
        assert_eq!(h.state(now, &t), HealthState::Up);
        // The next probe is due a probe interval after the last one started.
        assert!(h.probe_due(now, &t));
        let started = now;
        h.probe_started(started);
        let now = advance(2000).await;
        h.probe_finished(false, started, now);
        assert_eq!(h.state(now, &t), HealthState::Down);
        assert!(h.probe_due(now, &t));
        // A heartbeat brings the agent's own report back at once.
        h.heartbeat(Some(HealthState::Degraded), None, now);
        assert_eq!(h.state(now, &t), HealthState::Degraded);
        assert!(!h.probe_due(now, &t));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_overtaken_by_a_heartbeat_changes_nothing() {
        let t = timers();
        let mut h = Health::new(HealthState::Up, Instant::now());
        let started = advance(4001).await;
        h.probe_started(started);
        let now = advance(500).await;
        h.heartbeat(Some(HealthState::Up), None, now);
        h.probe_finished(false, started, advance(100).await);
        assert_eq!(h.state(Instant::now(), &t), HealthState::Up);
    }

    #[tokio::test(start_paused = true)]
    async fn a_ten_second_pause_is_survived_and_silence_is_fatal() {
        let t = timers();
        let mut h = Health::new(HealthState::Up, Instant::now());
        // An agent frozen for 10 s (a GC pause): UNKNOWN, then DOWN once a probe times out,
        // and UP again with its first heartbeat. It is never dead.
        let start = Instant::now();
        let mut states = Vec::new();
        let mut probe: Option<Instant> = None;
        while Instant::now() < start + Duration::from_secs(10) {
            let now = advance(100).await;
            if let Some(started) = probe.filter(|s| now.saturating_duration_since(*s) >= t.probe_timeout) {
                h.probe_finished(false, started, now);
                probe = None;
            }
            if h.probe_due(now, &t) {
                h.probe_started(now);
                probe = Some(now);
            }
            let s = h.state(now, &t);
            if states.last() != Some(&s) {
                states.push(s);
            }
            assert!(!h.dead(now, &t));
        }
        h.heartbeat(Some(HealthState::Up), None, Instant::now());
        states.push(h.state(Instant::now(), &t));
        assert_eq!(states, [HealthState::Up, HealthState::Unknown, HealthState::Down, HealthState::Up]);
        // Silence with failing probes: dead exactly `dead_after` after the last heartbeat.
        let last = Instant::now();
        tokio::time::advance(t.dead_after - Duration::from_millis(1)).await;
        assert!(!h.dead(Instant::now(), &t));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(h.dead(Instant::now(), &t));
        // A successful probe counts as a sign of life.
        let now = Instant::now();
        h.probe_started(now);
        h.probe_finished(true, now, now);
        assert!(!h.dead(now, &t));
        assert!(now - last >= t.dead_after);
    }
}
