//! One agent instance registered through this sidecar, as the registry keeps it and the
//! call path reads it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use agent_reach::model::{HealthState, Registration};
use agent_reach::proto;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

use super::health::{Health, Timers};

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the plain values inside stay valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One agent instance registered through this sidecar.
pub(crate) struct LocalInstance {
    pub instance_id: String,
    pub registration: Registration,
    /// `host:port` of the agent's endpoint.
    pub authority: String,
    /// The lease its record is on.
    pub(super) lease: AtomicI64,
    pub(super) timers: Timers,
    pub(super) judged: Mutex<Health>,
    /// The state control last accepted (None: not reported yet).
    pub(super) published: Mutex<Option<HealthState>>,
    /// Set when the sidecar drains: PAUSED whatever the agent reports.
    pub(super) draining: AtomicBool,
    pub(crate) health: HealthClient<Channel>,
    /// The SHA-256 of the secret of the agent credential `Register` returned.
    pub(crate) credential: crate::credentials::CredentialHash,
}

impl LocalInstance {
    /// The state routing should see, now, as this sidecar judges it (operator holds are
    /// applied by control, not here).
    pub(crate) fn effective_state(&self) -> HealthState {
        self.state_at(&lock(&self.judged), Instant::now())
    }

    /// The state routing should see at `now`, given `health`.
    pub(super) fn state_at(&self, health: &Health, now: Instant) -> HealthState {
        if self.draining.load(Ordering::Relaxed) { HealthState::Paused } else { health.state(now, &self.timers) }
    }

    /// The lease its record is on (0: none yet, or lost).
    pub(crate) fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    pub(super) fn heartbeat_message(&self) -> (proto::InstanceHeartbeat, HealthState) {
        let (state, load) = {
            let health = lock(&self.judged);
            (self.state_at(&health, Instant::now()), health.load())
        };
        let beat = proto::InstanceHeartbeat {
            instance_id: self.instance_id.clone(),
            agent: self.registration.agent.clone(),
            lease_id: self.lease.load(Ordering::Relaxed),
            state: proto::HealthState::from(state) as i32,
            load: Some(load.into()),
        };
        (beat, state)
    }
}
