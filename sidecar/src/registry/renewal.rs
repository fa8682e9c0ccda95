//! What the registry tells control: registrations on the sidecar's shared lease (obtained
//! on first use, again when it is gone), the periodic report of every instance (which
//! renews the lease, carries a traffic report now and then, and brings back the instances
//! control lost or gave to a newer registration), and removals retried until control
//! takes them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::{FieldError, HealthState, Registration};
use agent_reach::proto;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use super::instance::lock;
use super::{LocalInstance, Registry};
use crate::error::SidecarError;

/// Adds a traffic report ([`crate::report`]) to at most one heartbeat per interval.
pub(crate) struct Reporter {
    pub traffic: Arc<crate::report::Traffic>,
    pub table: agent_reach_routing::TableHandle,
    pub spans: agent_reach_telemetry::RecentSpans,
    pub interval: Duration,
    /// When the last report was sent (None: never).
    pub last: Mutex<Option<Instant>>,
}

impl Registry {
    /// The traffic report for this heartbeat, when one is due.
    pub(super) fn due_report(&self) -> Option<proto::SidecarReport> {
        let reporter = self.reporter.get()?;
        let now = Instant::now();
        {
            let mut last = lock(&reporter.last);
            if last.is_some_and(|at| now.saturating_duration_since(at) < reporter.interval) {
                return None;
            }
            *last = Some(now);
        }
        let mut instances: Vec<proto::LocalInstanceReport> = self
            .instances
            .load()
            .values()
            .map(|i| proto::LocalInstanceReport {
                instance_id: i.instance_id.clone(),
                agent: i.registration.agent.clone(),
                last_heartbeat_age_ms: now.saturating_duration_since(lock(&i.judged).last_heartbeat()).as_millis()
                    as u64,
            })
            .collect();
        instances.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        let mut report =
            reporter.traffic.report(&self.identity.sidecar_id, &reporter.table, instances, &reporter.spans);
        report.interval_ms = u32::try_from(reporter.interval.as_millis()).unwrap_or(u32::MAX);
        Some(report)
    }

    /// Without local agents there is no lease to renew, but calls made through this sidecar
    /// by clients that are not agents still belong in the topology: when a report is due, it
    /// goes alone on a heartbeat with no instances and no lease (control keeps it on a lease
    /// of its own).
    async fn report_alone(&self) {
        let Some(report) = self.due_report() else { return };
        let request = proto::ControlHeartbeatRequest {
            tenant: self.tenant.clone(),
            sidecar: Some(self.identity.clone()),
            instances: vec![],
            lease_id: 0,
            report: Some(report),
        };
        self.stats.reports.fetch_add(1, Ordering::Relaxed);
        let result = self
            .control
            .call(|mut c| {
                let request = request.clone();
                async move { c.heartbeat(request).await }
            })
            .await;
        if let Err(status) = result {
            tracing::warn!("cannot send the traffic report to control: {}", status.message());
        }
    }

    /// Stores a record with control on the sidecar's lease, obtaining a lease first when
    /// there is none (or it turns out to be gone).
    pub(super) async fn register_with_control(
        &self,
        instance_id: &str,
        registration: &Registration,
        state: HealthState,
    ) -> Result<proto::ControlRegisterReply, SidecarError> {
        for attempt in 0..2 {
            let mut lease = self.lease();
            let reply = if lease != 0 {
                self.control_register(instance_id, registration, state, lease).await
            } else {
                let _obtaining = self.lease_lock.lock().await;
                // Another registration may have obtained one while this one waited.
                lease = self.lease();
                let reply = self.control_register(instance_id, registration, state, lease).await;
                if let Ok(r) = &reply
                    && lease == 0
                {
                    *lock(&self.lease_ttl) = Duration::from_millis(u64::from(r.lease_ttl_ms));
                    self.lease.store(r.lease_id, Ordering::Relaxed);
                    tracing::info!(lease = format!("{:x}", r.lease_id), ttl_ms = r.lease_ttl_ms, "obtained a lease");
                }
                reply
            };
            match reply {
                Err(status) if attempt == 0 && lease_not_found(&status) => {
                    tracing::warn!(lease = format!("{lease:x}"), "the sidecar's lease is gone; obtaining a new one");
                    let _ = self.lease.compare_exchange(lease, 0, Ordering::Relaxed, Ordering::Relaxed);
                }
                other => return other.map_err(control_error),
            }
        }
        Err(SidecarError::ControlUnavailable("no lease could be obtained".into()))
    }

    pub(super) async fn control_register(
        &self,
        instance_id: &str,
        registration: &Registration,
        state: HealthState,
        lease: i64,
    ) -> Result<proto::ControlRegisterReply, Status> {
        let request = proto::ControlRegisterRequest {
            tenant: self.tenant.clone(),
            sidecar: Some(self.identity.clone()),
            instance_id: instance_id.to_string(),
            registration: Some(registration.clone().into()),
            state: proto::HealthState::from(state) as i32,
            lease_id: lease,
        };
        self.control
            .call(|mut c| {
                let request = request.clone();
                async move { c.register(request).await }
            })
            .await
    }

    /// Removes an instance's record at control; if control cannot be reached, keeps trying
    /// on every renewal tick (the shared lease would otherwise keep the record alive).
    pub(super) async fn remove_at_control(&self, inst: Arc<LocalInstance>) {
        if let Err(status) = self.deregister_at_control(&inst).await {
            tracing::warn!(instance = %inst.instance_id, "control did not take the removal yet: {}", status.message());
            lock(&self.removals).push(inst);
        }
    }

    /// Retries the removals control has not taken yet.
    pub(super) async fn retry_removals(&self) {
        let pending = std::mem::take(&mut *lock(&self.removals));
        for inst in pending {
            self.remove_at_control(inst).await;
        }
    }

    pub(super) async fn deregister_at_control(&self, inst: &LocalInstance) -> Result<(), Status> {
        let request = proto::ControlDeregisterRequest {
            tenant: self.tenant.clone(),
            instance_id: inst.instance_id.clone(),
            agent: inst.registration.agent.clone(),
            // The lease is shared with the other local instances: never revoked here.
            lease_id: 0,
            expected_lease_id: inst.lease.load(Ordering::Relaxed),
        };
        self.control
            .call(|mut c| {
                let request = request.clone();
                async move { c.deregister(request).await }
            })
            .await
            .map(|_| ())
    }

    /// Reports `instances` to control (renewing the lease); registers again those whose
    /// lease or record is gone and drops those registered anew elsewhere. Returns whether
    /// control answered.
    pub(super) async fn report(&self, instances: &[Arc<LocalInstance>]) -> bool {
        let _ordered = self.report_lock.lock().await;
        let lease = self.lease();
        if lease == 0 {
            // No lease (lost, or the first registration failed): registering obtains one.
            let mut all = true;
            for inst in instances {
                all &= self.reregister(inst).await;
            }
            return all;
        }
        let mut states = Vec::with_capacity(instances.len());
        let beats = instances
            .iter()
            .map(|i| {
                let (beat, state) = i.heartbeat_message();
                states.push(state);
                beat
            })
            .collect();
        let request = proto::ControlHeartbeatRequest {
            tenant: self.tenant.clone(),
            sidecar: Some(self.identity.clone()),
            instances: beats,
            lease_id: lease,
            report: self.due_report(),
        };
        self.stats.reports.fetch_add(1, Ordering::Relaxed);
        self.stats.instance_reports.fetch_add(instances.len() as u64, Ordering::Relaxed);
        let result = self
            .control
            .call(|mut c| {
                let request = request.clone();
                async move { c.heartbeat(request).await }
            })
            .await;
        let reply = match result {
            Ok(reply) => reply,
            Err(status) => {
                tracing::warn!("cannot report {} instance(s) to control: {}", instances.len(), status.message());
                return false;
            }
        };
        for (inst, state) in instances.iter().zip(states) {
            *lock(&inst.published) = Some(state);
        }
        if reply.lease_expired {
            tracing::warn!(
                lease = format!("{lease:x}"),
                "the sidecar's lease expired; registering every instance again"
            );
            let _ = self.lease.compare_exchange(lease, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        for id in reply.replaced_instance_ids {
            if let Some(inst) = self.get(&id)
                && self.remove(&inst)
            {
                self.stats.replaced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(instance = %id, "a newer registration of this instance was made elsewhere; dropping it here");
            }
        }
        for id in reply.expired_instance_ids {
            if let Some(inst) = self.get(&id) {
                self.reregister(&inst).await;
            }
        }
        true
    }

    /// Registers `inst` again under its own id; returns whether control took it.
    pub(super) async fn reregister(&self, inst: &Arc<LocalInstance>) -> bool {
        let state = inst.effective_state();
        match self.register_with_control(&inst.instance_id, &inst.registration, state).await {
            Ok(reply) => {
                inst.lease.store(reply.lease_id, Ordering::Relaxed);
                *lock(&inst.published) = Some(state);
                self.stats.reregistrations.fetch_add(1, Ordering::Relaxed);
                tracing::info!(instance = %inst.instance_id, generation = reply.generation, "registered again after its lease or record was lost");
                true
            }
            Err(e) => {
                tracing::warn!(instance = %inst.instance_id, "cannot register again: {e}");
                false
            }
        }
    }

    /// Until `shutdown`: reports every instance once per quarter of the lease TTL (which
    /// renews the lease), reports state changes at once, and removes dead instances. While
    /// control does not answer, the full report is retried on every tick, so the moment
    /// control is back the lease is renewed, or, when it expired meanwhile, every instance
    /// is registered again under its own id (callers hold the removals until then: see
    /// `grace.rs`).
    pub(crate) async fn run_renewals(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let tick = (self.timers.heartbeat_interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_renewal = Instant::now();
        let mut control_answered = true;
        loop {
            tokio::select! {
                _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                _ = ticker.tick() => {}
            }
            self.retry_removals().await;
            let now = Instant::now();
            let mut changed = Vec::new();
            let mut dead = Vec::new();
            for inst in self.instances.load().values() {
                let health = lock(&inst.judged).clone();
                if health.dead(now, &self.timers) {
                    dead.push(inst.clone());
                } else if Some(inst.state_at(&health, now)) != *lock(&inst.published) {
                    changed.push(inst.clone());
                }
            }
            for inst in dead {
                if self.remove(&inst) {
                    self.stats.dead_removed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(instance = %inst.instance_id, "no heartbeat and no answer to probes for {:?}; removing it", self.timers.dead_after);
                    self.remove_at_control(inst).await;
                }
            }
            let renew_every = *lock(&self.lease_ttl) / 4;
            let renewal_due = now.saturating_duration_since(last_renewal) >= renew_every || !control_answered;
            if renewal_due && !self.is_empty() {
                last_renewal = now;
                let all: Vec<Arc<LocalInstance>> = self.instances.load().values().cloned().collect();
                control_answered = self.report(&all).await;
            } else if !changed.is_empty() {
                self.report(&changed).await;
            } else if self.is_empty() {
                self.report_alone().await;
            }
        }
    }
}

fn lease_not_found(status: &Status) -> bool {
    agent_reach::reason::error_info(status)
        .is_some_and(|i| i.reason == agent_reach::reason::Reason::LeaseNotFound.as_str())
}

/// Any failure to reach control becomes CONTROL_UNAVAILABLE; control's own refusals
/// (e.g. INVALID_ARGUMENT) keep their code and message.
fn control_error(status: Status) -> SidecarError {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument => SidecarError::InvalidArgument(FieldError::new(
            agent_reach::reason::error_info(&status)
                .and_then(|i| i.metadata.get(agent_reach::reason::META_FIELD).cloned())
                .unwrap_or_else(|| "registration".into()),
            status.message().to_string(),
        )),
        _ => SidecarError::ControlUnavailable(status.message().to_string()),
    }
}
