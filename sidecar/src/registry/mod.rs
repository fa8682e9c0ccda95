//! The agents on this sidecar's host: their registrations with the control service, the
//! one lease that keeps them all alive, and their health.
//!
//! An agent registers here (with its own stable instance id, or one the sidecar assigns);
//! the sidecar stores the record with control on the sidecar's lease, granted by the first
//! registration and shared by every local instance, so renewing it is one store request
//! per renewal period however many agents run here. When the sidecar dies, the lease
//! expires and takes all of its instances with it.
//!
//! Agents heartbeat to the sidecar with their state and load; the sidecar judges each
//! instance's health ([`health`]: the agent's report, UNKNOWN when silent, probes that
//! settle it UP or DOWN, removal when dead) and reports to control: every quarter of the
//! lease TTL one batch with every instance (which renews the lease), and at once when an
//! instance's state changes. Control decides which reports become store writes. Instances
//! whose lease was lost (control away longer than the TTL) are registered again; instances
//! whose id a newer registration took elsewhere are dropped. Routing is not done here.
//!
//! Files: this one (the instances, registration, heartbeats, removal), `renewal.rs`
//! (the lease, reports and removals at control), `probes.rs` (probing silent instances),
//! `health.rs` (judging an instance's state), `instance.rs` (one local instance).

mod health;
mod instance;
mod probes;
mod renewal;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::{FieldError, HealthState, Registration, new_instance_id, validate_name};
use agent_reach::proto;
use agent_reach_routing::table::FastMap;
use arc_swap::ArcSwap;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic_health::pb::health_client::HealthClient;

pub(crate) use health::{Health, Timers};
pub(crate) use instance::LocalInstance;
use instance::lock;
pub(crate) use renewal::Reporter;

use crate::config::SidecarConfig;
use crate::control::ControlClients;
use crate::error::SidecarError;
use crate::probe::PROBE_TIMEOUT;

impl From<&SidecarConfig> for Timers {
    fn from(c: &SidecarConfig) -> Timers {
        Timers {
            heartbeat_interval: c.heartbeat_interval,
            probe_interval: c.probe_interval,
            probe_timeout: PROBE_TIMEOUT,
            dead_after: c.dead_after,
        }
    }
}

/// Whether an HTTP agent may be reached at `authority` ("host:port"): loopback always,
/// other hosts only when `allowed` lists them (or holds "*"). The sidecar forwards calls
/// and returns error bodies from this endpoint, so an arbitrary host would let any local
/// client make the sidecar reach other machines.
pub(crate) fn http_endpoint_allowed(authority: &str, allowed: &[String]) -> Result<(), FieldError> {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback || allowed.iter().any(|a| a == "*" || *a == host) {
        return Ok(());
    }
    Err(FieldError::new(
        "registration.endpoint",
        format!(
            "host {:?} is not loopback; an HTTP agent must listen on this host unless --http-agent-allowed-hosts lists it",
            agent_reach::reason::truncate(&host, 64)
        ),
    ))
}

/// Counters of the registry.
#[derive(Debug, Default)]
pub struct RegistryStats {
    /// Heartbeat requests sent to control.
    pub reports: AtomicU64,
    /// Instance heartbeats sent to control (entries of those requests).
    pub instance_reports: AtomicU64,
    /// Health probes started.
    pub probes: AtomicU64,
    /// Probes that failed (not serving, error or timeout).
    pub probe_failures: AtomicU64,
    /// Instances registered again after their lease or record was lost.
    pub reregistrations: AtomicU64,
    /// Instances removed because they showed no sign of life for `dead_after`.
    pub dead_removed: AtomicU64,
    /// Instances dropped because a newer registration of their id was made elsewhere.
    pub replaced: AtomicU64,
}

/// The registry of local agents.
pub struct Registry {
    tenant: String,
    identity: proto::SidecarIdentity,
    control: Arc<ControlClients>,
    timers: Timers,
    instances: ArcSwap<FastMap<String, Arc<LocalInstance>>>,
    /// The sidecar's lease (0: none yet, or lost) and its TTL.
    lease: AtomicI64,
    lease_ttl: Mutex<Duration>,
    /// Held while a lease is being obtained, so concurrent registrations share one.
    lease_lock: tokio::sync::Mutex<()>,
    /// Orders reports to control, so an older state never overtakes a newer one.
    report_lock: tokio::sync::Mutex<()>,
    /// Instances removed here whose removal control has not taken yet.
    removals: Mutex<Vec<Arc<LocalInstance>>>,
    stats: RegistryStats,
    /// Non-loopback hosts an HTTP agent may name ([`http_endpoint_allowed`]).
    http_allowed_hosts: Vec<String>,
    /// What builds the traffic report added to a heartbeat now and then (set once the
    /// call path exists).
    reporter: std::sync::OnceLock<Reporter>,
}

impl Registry {
    pub(crate) fn new(
        tenant: String,
        identity: proto::SidecarIdentity,
        control: Arc<ControlClients>,
        timers: Timers,
        http_allowed_hosts: Vec<String>,
    ) -> Registry {
        Registry {
            tenant,
            identity,
            control,
            timers,
            instances: ArcSwap::default(),
            lease: AtomicI64::new(0),
            lease_ttl: Mutex::new(Duration::ZERO),
            lease_lock: tokio::sync::Mutex::new(()),
            report_lock: tokio::sync::Mutex::new(()),
            removals: Mutex::new(Vec::new()),
            stats: RegistryStats::default(),
            http_allowed_hosts,
            reporter: std::sync::OnceLock::new(),
        }
    }

    /// Starts adding traffic reports to heartbeats (a zero interval: never).
    pub(crate) fn set_reporter(&self, reporter: Reporter) {
        if !reporter.interval.is_zero() {
            let _ = self.reporter.set(reporter);
        }
    }

    /// The clients of control the registry reports through (shared with other lookups).
    pub(crate) fn control(&self) -> &Arc<ControlClients> {
        &self.control
    }

    /// A local instance by id (lock-free; used on the delivery path).
    pub(crate) fn get(&self, instance_id: &str) -> Option<Arc<LocalInstance>> {
        self.instances.load().get(instance_id).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.instances.load().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.instances.load().is_empty()
    }

    /// The sidecar's lease (0 while it has none).
    /// Counters of registrations, probes and removals.
    pub fn stats(&self) -> &RegistryStats {
        &self.stats
    }

    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    fn insert(&self, inst: Arc<LocalInstance>) {
        self.instances.rcu(|m| {
            let mut m = FastMap::clone(m);
            m.insert(inst.instance_id.clone(), inst.clone());
            m
        });
    }

    /// Removes `inst` (only that very instance, not a newer one with its id).
    fn remove(&self, inst: &Arc<LocalInstance>) -> bool {
        let mut removed = false;
        self.instances.rcu(|m| {
            let mut m = FastMap::clone(m);
            removed = false;
            if m.get(&inst.instance_id).is_some_and(|i| Arc::ptr_eq(i, inst)) {
                m.remove(&inst.instance_id);
                removed = true;
            }
            m
        });
        removed
    }

    /// Registers an agent instance with control and starts tracking it. `instance_id`
    /// empty: a new id. `state` None: UP.
    pub(crate) async fn register(
        &self,
        registration: Registration,
        instance_id: String,
        state: Option<HealthState>,
    ) -> Result<proto::RegisterReply, SidecarError> {
        registration.validate()?;
        let authority = agent_reach::model::endpoint_authority(&registration.endpoint)
            .map_err(|why| FieldError::new("registration.endpoint", why))?
            .to_string();
        if registration.transport == agent_reach::model::Transport::Http {
            http_endpoint_allowed(&authority, &self.http_allowed_hosts)?;
        }
        let instance_id = if instance_id.is_empty() {
            new_instance_id(&registration.agent)
        } else {
            validate_name("instance_id", &instance_id)?;
            if let Some(other) = self.get(&instance_id).filter(|i| i.registration.agent != registration.agent) {
                return Err(FieldError::new(
                    "instance_id",
                    format!("already used here by agent {:?}", other.registration.agent),
                )
                .into());
            }
            instance_id
        };
        let state = match state {
            None => HealthState::Up,
            Some(s @ (HealthState::Starting | HealthState::Up | HealthState::Degraded | HealthState::Paused)) => s,
            Some(s) => {
                return Err(
                    FieldError::new("state", format!("an instance cannot register {s}; use STARTING or UP")).into()
                );
            }
        };
        let reply = self.register_with_control(&instance_id, &registration, state).await?;
        let probe_endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| SidecarError::Internal(format!("agent endpoint: {e}")))?
            .connect_timeout(PROBE_TIMEOUT)
            .timeout(PROBE_TIMEOUT);
        let (credential, credential_hash) = crate::credentials::mint(&instance_id);
        let inst = Arc::new(LocalInstance {
            instance_id: instance_id.clone(),
            registration,
            authority,
            lease: AtomicI64::new(reply.lease_id),
            timers: self.timers,
            judged: Mutex::new(Health::new(state, Instant::now())),
            published: Mutex::new(Some(state)),
            draining: AtomicBool::new(false),
            health: HealthClient::new(probe_endpoint.connect_lazy()),
            credential: credential_hash,
        });
        tracing::info!(
            instance = %instance_id, agent = %inst.registration.agent, endpoint = %inst.registration.endpoint,
            generation = reply.generation, %state, "agent registered"
        );
        self.insert(inst);
        Ok(proto::RegisterReply {
            instance_id,
            heartbeat_interval_ms: millis(self.timers.heartbeat_interval),
            // An agent that stops heartbeating (and answering probes) is removed after this.
            lease_ttl_ms: millis(self.timers.dead_after),
            tenant: self.tenant.clone(),
            credential,
        })
    }

    /// Records an agent's heartbeat. Unknown instance ids get INSTANCE_NOT_FOUND, which
    /// tells the agent to register again.
    pub(crate) fn heartbeat(
        self: &Arc<Self>,
        instance_id: &str,
        state: Option<HealthState>,
        load: Option<agent_reach::model::Load>,
    ) -> Result<(), SidecarError> {
        let inst = self.get(instance_id).ok_or_else(|| SidecarError::InstanceNotFound(instance_id.to_string()))?;
        let now = Instant::now();
        let state = {
            let mut health = lock(&inst.judged);
            health.heartbeat(state, load, now);
            inst.state_at(&health, now)
        };
        // A state change reaches control at once, not at the next renewal; the agent's
        // heartbeat does not wait for it.
        if Some(state) != *lock(&inst.published) {
            let registry = self.clone();
            tokio::spawn(async move { registry.report(&[inst]).await });
        }
        Ok(())
    }

    /// Shutdown, step 1: every local instance is PAUSED from now on, whatever its agent
    /// reports, and control is told at once, so callers stop sending new calls (calls in
    /// flight finish).
    pub(crate) async fn pause_all(&self) {
        let all: Vec<Arc<LocalInstance>> = self.instances.load().values().cloned().collect();
        for inst in &all {
            inst.draining.store(true, Ordering::Relaxed);
        }
        self.report(&all).await;
    }

    /// Shutdown, last step: removes every local instance here and at control.
    pub(crate) async fn deregister_all(&self) {
        let ids: Vec<String> = self.instances.load().keys().cloned().collect();
        for id in ids {
            let _ = self.deregister(&id).await;
        }
    }

    /// Removes an instance here and at control.
    pub(crate) async fn deregister(&self, instance_id: &str) -> Result<(), SidecarError> {
        let inst = self.get(instance_id).ok_or_else(|| SidecarError::InstanceNotFound(instance_id.to_string()))?;
        if self.remove(&inst) {
            self.remove_at_control(inst).await;
        }
        tracing::info!(instance = %instance_id, "agent deregistered");
        Ok(())
    }
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::http_endpoint_allowed;

    #[test]
    fn http_endpoints_are_loopback_unless_allowed() {
        for ok in ["127.0.0.1:80", "127.9.9.9:1", "localhost:8080", "LOCALHOST:1", "[::1]:80"] {
            assert_eq!(http_endpoint_allowed(ok, &[]), Ok(()), "{ok}");
        }
        for refused in ["10.0.0.1:80", "169.254.169.254:80", "example.com:80", "[fe80::1]:80", "0.0.0.0:80"] {
            let err = http_endpoint_allowed(refused, &[]).unwrap_err();
            assert_eq!(err.field, "registration.endpoint", "{refused}");
            assert!(err.reason.ends_with("--http-agent-allowed-hosts lists it"), "{err}");
        }
        let allowed = vec!["10.0.0.1".to_string(), "example.com".to_string()];
        assert_eq!(http_endpoint_allowed("10.0.0.1:80", &allowed), Ok(()));
        assert_eq!(http_endpoint_allowed("EXAMPLE.com:80", &allowed), Ok(()));
        assert!(http_endpoint_allowed("10.0.0.2:80", &allowed).is_err());
        assert_eq!(http_endpoint_allowed("anything:1", &["*".to_string()]), Ok(()));
        // A long host is quoted short.
        let long = format!("{}:80", "h".repeat(10_000));
        assert!(http_endpoint_allowed(&long, &[]).unwrap_err().reason.len() < 256);
    }
}
