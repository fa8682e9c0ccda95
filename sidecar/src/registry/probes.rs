//! Health probes of the instances whose heartbeats went silent (see [`super::health`]
//! for what a probe's answer does to an instance's state).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::instance::lock;
use super::{LocalInstance, Registry};

impl Registry {
    /// Until `shutdown`: probes every instance whose heartbeats went silent.
    pub(crate) async fn run_probes(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let tick = (self.timers.heartbeat_interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                _ = ticker.tick() => {}
            }
            let now = Instant::now();
            for inst in self.instances.load().values() {
                let due = {
                    let mut health = lock(&inst.judged);
                    let due = health.probe_due(now, &self.timers);
                    if due {
                        health.probe_started(now);
                    }
                    due
                };
                if due {
                    tokio::spawn(self.clone().probe(inst.clone(), now));
                }
            }
        }
    }

    async fn probe(self: Arc<Self>, inst: Arc<LocalInstance>, started: Instant) {
        self.stats.probes.fetch_add(1, Ordering::Relaxed);
        let serving =
            crate::probe::healthy(&inst.registration, &inst.authority, &inst.health, self.timers.probe_timeout).await;
        if !serving {
            self.stats.probe_failures.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        let (before, after) = {
            let mut health = lock(&inst.judged);
            let before = inst.state_at(&health, now);
            health.probe_finished(serving, started, now);
            (before, inst.state_at(&health, now))
        };
        if before != after {
            tracing::warn!(instance = %inst.instance_id, "health probe: {before} -> {after}");
        }
        if Some(after) != *lock(&inst.published) {
            self.report(&[inst]).await;
        }
    }
}
