//! The agents on this sidecar's host: their registrations with the control service, the
//! leases that keep them alive, and their health.
//!
//! An agent registers here; the sidecar assigns the instance id and stores the record with
//! control on a lease. Agents heartbeat to the sidecar; the sidecar renews leases in batches
//! (only for agents whose heartbeats are fresh) and re-registers instances whose lease was
//! lost while control was away. It probes each agent with `grpc.health.v1` and reports an
//! agent that fails two probes in a row as DOWN. Routing is not done here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::{HealthState, Load, Registration, new_instance_id};
use agent_reach::proto;
use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;

use crate::control::ControlClients;
use crate::error::SidecarError;

/// Consecutive failed probes after which an agent is reported DOWN.
const PROBE_FAILURES_DOWN: u32 = 2;
/// Timeout of one health probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One agent instance registered through this sidecar.
pub struct LocalInstance {
    pub instance_id: String,
    pub registration: Registration,
    /// `host:port` of the agent's endpoint.
    pub authority: String,
    lease: AtomicI64,
    lease_ttl: Mutex<Duration>,
    last_heartbeat: Mutex<Instant>,
    last_renewal: Mutex<Instant>,
    reported: Mutex<(HealthState, Load)>,
    probe_failures: AtomicU32,
    /// State last sent to control.
    published: Mutex<HealthState>,
    pub(crate) health: HealthClient<Channel>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the plain values inside stay valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LocalInstance {
    /// The state routing should see: DOWN when probes fail, else what the agent reported.
    pub fn effective_state(&self) -> HealthState {
        if self.probe_failures.load(Ordering::Relaxed) >= PROBE_FAILURES_DOWN {
            HealthState::Down
        } else {
            lock(&self.reported).0
        }
    }

    fn heartbeat_message(&self) -> proto::InstanceHeartbeat {
        let (_, load) = *lock(&self.reported);
        proto::InstanceHeartbeat {
            instance_id: self.instance_id.clone(),
            agent: self.registration.agent.clone(),
            lease_id: self.lease.load(Ordering::Relaxed),
            state: proto::HealthState::from(self.effective_state()) as i32,
            load: Some(load.into()),
        }
    }
}

/// The registry of local agents.
pub struct Registry {
    tenant: String,
    identity: proto::SidecarIdentity,
    control: Arc<ControlClients>,
    heartbeat_interval: Duration,
    instances: ArcSwap<HashMap<String, Arc<LocalInstance>>>,
}

impl Registry {
    pub fn new(
        tenant: String,
        identity: proto::SidecarIdentity,
        control: Arc<ControlClients>,
        heartbeat_interval: Duration,
    ) -> Registry {
        Registry { tenant, identity, control, heartbeat_interval, instances: ArcSwap::default() }
    }

    /// A local instance by id (lock-free; used on the delivery path).
    pub fn get(&self, instance_id: &str) -> Option<Arc<LocalInstance>> {
        self.instances.load().get(instance_id).cloned()
    }

    pub fn len(&self) -> usize {
        self.instances.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.instances.load().is_empty()
    }

    fn insert(&self, inst: Arc<LocalInstance>) {
        self.instances.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(inst.instance_id.clone(), inst.clone());
            m
        });
    }

    fn remove(&self, instance_id: &str) -> Option<Arc<LocalInstance>> {
        let mut removed = None;
        self.instances.rcu(|m| {
            let mut m = HashMap::clone(m);
            removed = m.remove(instance_id);
            m
        });
        removed
    }

    /// Registers a new agent instance with control and starts tracking it.
    pub async fn register(&self, registration: Registration) -> Result<proto::RegisterReply, SidecarError> {
        registration.validate()?;
        let authority = agent_reach::model::endpoint_authority(&registration.endpoint)
            .map_err(|why| agent_reach::model::FieldError::new("registration.endpoint", why))?
            .to_string();
        let instance_id = new_instance_id(&registration.agent);
        let reply = self.register_with_control(&instance_id, &registration, HealthState::Up).await?;
        let health_endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| SidecarError::Internal(format!("agent endpoint: {e}")))?
            .connect_timeout(PROBE_TIMEOUT)
            .timeout(PROBE_TIMEOUT);
        let now = Instant::now();
        let ttl = Duration::from_millis(u64::from(reply.lease_ttl_ms));
        let inst = Arc::new(LocalInstance {
            instance_id: instance_id.clone(),
            registration,
            authority,
            lease: AtomicI64::new(reply.lease_id),
            lease_ttl: Mutex::new(ttl),
            last_heartbeat: Mutex::new(now),
            last_renewal: Mutex::new(now),
            reported: Mutex::new((HealthState::Up, Load::default())),
            probe_failures: AtomicU32::new(0),
            published: Mutex::new(HealthState::Up),
            health: HealthClient::new(health_endpoint.connect_lazy()),
        });
        tracing::info!(instance = %instance_id, agent = %inst.registration.agent, endpoint = %inst.registration.endpoint, "agent registered");
        self.insert(inst);
        Ok(proto::RegisterReply {
            instance_id,
            heartbeat_interval_ms: u32::try_from(self.heartbeat_interval.as_millis()).unwrap_or(u32::MAX),
            lease_ttl_ms: reply.lease_ttl_ms,
            tenant: self.tenant.clone(),
        })
    }

    async fn register_with_control(
        &self,
        instance_id: &str,
        registration: &Registration,
        state: HealthState,
    ) -> Result<proto::ControlRegisterReply, SidecarError> {
        let request = proto::ControlRegisterRequest {
            tenant: self.tenant.clone(),
            sidecar: Some(self.identity.clone()),
            instance_id: instance_id.to_string(),
            registration: Some(registration.clone().into()),
            state: proto::HealthState::from(state) as i32,
        };
        self.control
            .call(|mut c| {
                let request = request.clone();
                async move { c.register(request).await }
            })
            .await
            .map_err(control_error)
    }

    /// Records an agent's heartbeat. Unknown instance ids get INSTANCE_NOT_FOUND, which
    /// tells the agent to register again.
    pub fn heartbeat(
        self: &Arc<Self>,
        instance_id: &str,
        state: Option<HealthState>,
        load: Option<Load>,
    ) -> Result<(), SidecarError> {
        let inst = self.get(instance_id).ok_or_else(|| SidecarError::InstanceNotFound(instance_id.to_string()))?;
        *lock(&inst.last_heartbeat) = Instant::now();
        {
            let mut reported = lock(&inst.reported);
            if let Some(s) = state {
                reported.0 = s;
            }
            if let Some(l) = load {
                reported.1 = l;
            }
        }
        // A state change reaches control at once, not at the next renewal; the agent's
        // heartbeat does not wait for it.
        if inst.effective_state() != *lock(&inst.published) {
            let registry = self.clone();
            tokio::spawn(async move { registry.publish(&[inst]).await });
        }
        Ok(())
    }

    /// Removes an instance here and at control.
    pub async fn deregister(&self, instance_id: &str) -> Result<(), SidecarError> {
        let inst = self.remove(instance_id).ok_or_else(|| SidecarError::InstanceNotFound(instance_id.to_string()))?;
        let request = proto::ControlDeregisterRequest {
            tenant: self.tenant.clone(),
            instance_id: inst.instance_id.clone(),
            agent: inst.registration.agent.clone(),
            lease_id: inst.lease.load(Ordering::Relaxed),
        };
        let result = self
            .control
            .call(|mut c| {
                let request = request.clone();
                async move { c.deregister(request).await }
            })
            .await;
        match result {
            Ok(_) => tracing::info!(instance = %instance_id, "agent deregistered"),
            Err(status) => {
                // The instance is gone here, so its lease will not be renewed and expires
                // within one TTL; calls routed to it meanwhile are refused as not delivered
                // and retried elsewhere by the caller's sidecar.
                tracing::warn!(instance = %instance_id, "control did not take the deregistration ({}); the lease will expire", status.message());
            }
        }
        Ok(())
    }

    /// Shutdown, step 1: reports every local instance PAUSED so callers stop sending new
    /// calls (calls in flight finish).
    pub async fn pause_all(&self) {
        let all: Vec<Arc<LocalInstance>> = self.instances.load().values().cloned().collect();
        for inst in &all {
            lock(&inst.reported).0 = HealthState::Paused;
        }
        self.publish(&all).await;
    }

    /// Shutdown, last step: removes every local instance here and at control.
    pub async fn deregister_all(&self) {
        let ids: Vec<String> = self.instances.load().keys().cloned().collect();
        for id in ids {
            let _ = self.deregister(&id).await;
        }
    }

    /// Sends heartbeats for `instances` to control; re-registers those whose lease is gone.
    async fn publish(&self, instances: &[Arc<LocalInstance>]) {
        if instances.is_empty() {
            return;
        }
        let request = proto::ControlHeartbeatRequest {
            tenant: self.tenant.clone(),
            sidecar: Some(self.identity.clone()),
            instances: instances.iter().map(|i| i.heartbeat_message()).collect(),
        };
        let now = Instant::now();
        let result = self
            .control
            .call(|mut c| {
                let request = request.clone();
                async move { c.heartbeat(request).await }
            })
            .await;
        match result {
            Ok(reply) => {
                for inst in instances {
                    *lock(&inst.last_renewal) = now;
                    *lock(&inst.published) = inst.effective_state();
                }
                for expired in reply.expired_instance_ids {
                    if let Some(inst) = self.get(&expired) {
                        self.reregister(&inst).await;
                    }
                }
            }
            Err(status) => tracing::warn!("cannot renew {} lease(s): {}", instances.len(), status.message()),
        }
    }

    async fn reregister(&self, inst: &Arc<LocalInstance>) {
        match self.register_with_control(&inst.instance_id, &inst.registration, inst.effective_state()).await {
            Ok(reply) => {
                inst.lease.store(reply.lease_id, Ordering::Relaxed);
                *lock(&inst.lease_ttl) = Duration::from_millis(u64::from(reply.lease_ttl_ms));
                *lock(&inst.last_renewal) = Instant::now();
                *lock(&inst.published) = inst.effective_state();
                tracing::info!(instance = %inst.instance_id, "registered again after its lease was lost");
            }
            Err(e) => tracing::warn!(instance = %inst.instance_id, "cannot register again: {e}"),
        }
    }

    /// Renews leases until `shutdown`: every tick, instances whose last renewal is older
    /// than a third of their TTL and whose agent heartbeated recently are renewed in one
    /// batch. Instances whose agent stopped heartbeating are dropped and their lease left to
    /// expire.
    pub async fn run_renewals(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let tick = self.heartbeat_interval.min(Duration::from_secs(1)) / 2;
        let stale_after = self.heartbeat_interval * 2 + self.heartbeat_interval / 2;
        let mut ticker = tokio::time::interval(tick.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = agent_reach::process::stopped(&mut shutdown) => return,
                _ = ticker.tick() => {}
            }
            let now = Instant::now();
            let mut due = Vec::new();
            for inst in self.instances.load().values() {
                let since_heartbeat = now - *lock(&inst.last_heartbeat);
                if since_heartbeat > stale_after {
                    tracing::warn!(instance = %inst.instance_id, "no heartbeat for {since_heartbeat:?}; no longer renewing its lease");
                    self.remove(&inst.instance_id);
                    continue;
                }
                let ttl = *lock(&inst.lease_ttl);
                if now - *lock(&inst.last_renewal) >= ttl / 3 {
                    due.push(inst.clone());
                }
            }
            self.publish(&due).await;
        }
    }

    /// Probes every local agent each `interval` until `shutdown`.
    pub async fn run_probes(self: Arc<Self>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = agent_reach::process::stopped(&mut shutdown) => return,
                _ = ticker.tick() => {}
            }
            let instances: Vec<Arc<LocalInstance>> = self.instances.load().values().cloned().collect();
            let probes = instances.iter().map(|inst| async move {
                let ok = crate::probe::healthy(inst, PROBE_TIMEOUT).await;
                let before = inst.effective_state();
                if ok {
                    inst.probe_failures.store(0, Ordering::Relaxed);
                } else {
                    inst.probe_failures.fetch_add(1, Ordering::Relaxed);
                }
                let after = inst.effective_state();
                if before != after {
                    tracing::warn!(instance = %inst.instance_id, "health probe: {before} -> {after}");
                }
                (after != *lock(&inst.published)).then(|| inst.clone())
            });
            let changed: Vec<Arc<LocalInstance>> =
                futures_util::future::join_all(probes).await.into_iter().flatten().collect();
            self.publish(&changed).await;
        }
    }
}

/// Any failure to reach control becomes CONTROL_UNAVAILABLE; control's own refusals
/// (e.g. INVALID_ARGUMENT) keep their code and message.
fn control_error(status: Status) -> SidecarError {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument => SidecarError::InvalidArgument(agent_reach::model::FieldError::new(
            agent_reach::reason::error_info(&status)
                .and_then(|i| i.metadata.get(agent_reach::reason::META_FIELD).cloned())
                .unwrap_or_else(|| "registration".into()),
            status.message().to_string(),
        )),
        _ => SidecarError::ControlUnavailable(status.message().to_string()),
    }
}
