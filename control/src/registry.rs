//! Registrations in the store: writing an instance record on its sidecar's lease, renewing
//! leases from heartbeats, writing state and load changes, removing instances, operator
//! holds, and reading a tenant's state for the Admin API.
//!
//! Every write that depends on what is stored is a compare-and-swap transaction on the
//! record's mod revision (and, for registrations, on the agent's hold key), retried a few
//! times on conflict. So a re-registration replaces a record whole, a heartbeat never
//! undoes an operator's hold, and a hold reaches every instance of an agent including one
//! registering at the same moment. This module knows the store and the domain types, not
//! protobuf; it does not stream anything (see [`crate::feed`]).
//!
//! Operators' holds (`registry/holds.rs`), a tenant's policies (`registry/policies.rs`) and
//! the tenant records (`registry/tenants.rs`) are stored here too, each in the file named
//! for it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::model::{
    FieldError, HealthState, InstanceRecord, InstanceStatus, Load, Registration, StateHold, validate_name,
    validate_tenant,
};
use agent_reach::policy::Policy;
use agent_reach_store::{Compare, LeaseId, Op, Revision, Store, StoreError, Txn};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::error::ControlError;
use crate::feed::Feeds;
use crate::keys;
use crate::load::{Decision, LoadGate};
use crate::record::{self, StoredInstance, encode};
use crate::stats::ControlStats;

mod holds;
mod policies;
mod tenants;

pub use holds::hold_from_request;
pub use policies::encode_policy;

/// Attempts of a compare-and-swap write before giving up with `Conflict`.
const CAS_ATTEMPTS: usize = 8;

/// How the registry treats leases and load reports.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// TTL of the leases granted to sidecars.
    pub lease_ttl: Duration,
    /// A load ratio change smaller than this is not written.
    pub load_step: f64,
    /// Load changes of one instance are written at most once per this interval.
    pub load_report_interval: Duration,
}

/// A registration to store.
pub struct NewInstance {
    pub tenant: String,
    pub instance_id: String,
    pub sidecar_id: String,
    pub sidecar_address: String,
    pub registration: Registration,
    pub state: HealthState,
    /// The sidecar's lease; 0 grants a new one.
    pub lease: LeaseId,
}

/// A stored registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub lease: LeaseId,
    pub lease_ttl: Duration,
    pub revision: Revision,
    pub generation: u64,
}

/// One instance's heartbeat.
pub struct Beat {
    pub instance_id: String,
    pub agent: String,
    /// 0: the request's lease.
    pub lease: LeaseId,
    pub state: Option<HealthState>,
    pub load: Option<Load>,
}

/// What a batch of heartbeats found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BeatOutcome {
    /// Instances whose lease or record is gone.
    pub expired: Vec<String>,
    /// Instances whose id is now registered on another lease.
    pub replaced: Vec<String>,
    /// The request's own lease is gone.
    pub lease_expired: bool,
}

/// Everything of one tenant, read from the store at one revision.
#[derive(Debug, Default)]
pub struct TenantView {
    pub revision: Revision,
    /// Sorted by agent, then instance id.
    pub instances: Vec<InstanceStatus>,
    /// Each policy with the revision it was written at, sorted by kind and name.
    pub policies: Vec<(Policy, Revision)>,
    /// Agent-level holds by agent name.
    pub agent_holds: BTreeMap<String, StateHold>,
}

/// Registrations of every tenant, in one store.
pub struct Registry {
    store: Arc<dyn Store>,
    config: RegistryConfig,
    stats: Arc<ControlStats>,
    feeds: Arc<Feeds>,
    gate: LoadGate,
    recent: RecentWrites,
}

/// A record as last known: its value, mod revision and lease.
type Known = (StoredInstance, Revision, LeaseId);

/// Records this replica wrote in the last seconds, which its tenant feed may not have
/// seen yet: deciding a heartbeat against a stale record would lose a quick state change.
#[derive(Default)]
struct RecentWrites {
    written: std::sync::Mutex<Recent>,
}

/// Each record with when it was written, and when old entries are dropped next.
#[derive(Default)]
struct Recent {
    records: HashMap<String, (Known, Instant)>,
    next_prune: Option<Instant>,
}

impl RecentWrites {
    /// Longer than any feed takes to see a write.
    const KEEP: Duration = Duration::from_secs(30);

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // Poisoning only means a panic elsewhere; the map stays valid.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &str) -> Option<Known> {
        self.lock().records.get(key).map(|(known, _)| known.clone())
    }

    fn insert(&self, key: &str, known: Known, now: Instant) {
        let mut recent = self.lock();
        recent.records.insert(key.to_string(), (known, now));
        if recent.next_prune.is_none_or(|at| now >= at) {
            recent.records.retain(|_, (_, at)| now.saturating_duration_since(*at) < Self::KEEP);
            recent.next_prune = Some(now + Self::KEEP);
        }
    }
}

impl Registry {
    pub fn new(store: Arc<dyn Store>, config: RegistryConfig, stats: Arc<ControlStats>, feeds: Arc<Feeds>) -> Self {
        let gate = LoadGate::new(config.load_step, config.load_report_interval);
        Registry { store, config, stats, feeds, gate, recent: RecentWrites::default() }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    /// Stores a registration (see the module documentation). A new instance of an agent
    /// without a hold costs one transaction; re-registrations and held agents read first.
    pub async fn register(&self, new: NewInstance) -> Result<Registered, ControlError> {
        validate_tenant("tenant", &new.tenant)?;
        validate_name("instance_id", &new.instance_id)?;
        validate_name("sidecar.sidecar_id", &new.sidecar_id)?;
        new.registration.validate()?;
        if new.sidecar_address.is_empty() {
            return Err(FieldError::new("sidecar.mesh_address", "must not be empty").into());
        }
        if new.state == HealthState::Unknown {
            return Err(FieldError::new("state", "UNKNOWN is set by sidecars' probes, not registered").into());
        }
        let (lease, lease_ttl) = if new.lease == 0 {
            let grant = self.store.grant_lease(self.config.lease_ttl).await?;
            (grant.id, grant.ttl)
        } else {
            (new.lease, self.config.lease_ttl)
        };
        let key = keys::instance_key(&new.tenant, &new.registration.agent, &new.instance_id);
        let hold_key = keys::agent_hold_key(&new.tenant, &new.registration.agent);
        let instance_hold_key = keys::instance_hold_key(&new.tenant, &new.registration.agent, &new.instance_id);
        let mut stored = StoredInstance {
            record: InstanceRecord {
                instance_id: new.instance_id,
                tenant: new.tenant,
                registration: new.registration,
                sidecar_id: new.sidecar_id,
                sidecar_address: new.sidecar_address,
                state: new.state,
                load: Load::default(),
                registered_at_ms: now_ms(),
            },
            instance_hold: None,
            agent_hold: None,
            generation: 1,
        };
        // The common case: the id is new and neither the agent nor the instance is held.
        let mut expected = (0, 0, 0);
        for _ in 0..CAS_ATTEMPTS {
            let txn = Txn {
                compares: vec![
                    Compare::ModRevision(key.clone(), expected.0),
                    Compare::ModRevision(hold_key.clone(), expected.1),
                    Compare::ModRevision(instance_hold_key.clone(), expected.2),
                ],
                success: vec![Op::Put { key: key.clone(), value: encode(&stored), lease: Some(lease) }],
                failure: vec![],
            };
            let result = self.store.txn(txn).await.map_err(|e| match e {
                StoreError::LeaseNotFound(_) => ControlError::LeaseNotFound(lease),
                other => other.into(),
            })?;
            if result.succeeded {
                ControlStats::inc(&self.stats.registrations);
                return Ok(Registered { lease, lease_ttl, revision: result.revision, generation: stored.generation });
            }
            // A previous registration of this id, or a hold on the agent or the instance:
            // carry them over (the instance's hold from its own key, which outlives the
            // record's lease).
            let (existing, hold, instance_hold) = futures_util::future::try_join3(
                self.store.get(&key),
                self.store.get(&hold_key),
                self.store.get(&instance_hold_key),
            )
            .await?;
            stored.generation = 1;
            stored.instance_hold = None;
            if let Some(kv) = &existing {
                match record::decode_instance(
                    kv,
                    &stored.record.tenant,
                    &stored.record.registration.agent,
                    &stored.record.instance_id,
                ) {
                    Ok(old) => {
                        stored.generation = old.generation.max(1) + 1;
                        // A record written before instance holds had their own key.
                        if instance_hold.is_none() {
                            stored.instance_hold = old.instance_hold;
                        }
                    }
                    Err(e) => tracing::warn!("replacing an unreadable record: {e}"),
                }
            }
            stored.agent_hold = match &hold {
                Some(kv) => Some(record::decode_hold(kv)?),
                None => None,
            };
            if let Some(kv) = &instance_hold {
                stored.instance_hold = Some(record::decode_hold(kv)?);
            }
            expected = (
                existing.map_or(0, |kv| kv.mod_revision),
                hold.map_or(0, |kv| kv.mod_revision),
                instance_hold.map_or(0, |kv| kv.mod_revision),
            );
        }
        Err(ControlError::Conflict(format!("instance {key}")))
    }

    /// Renews the leases of a batch of heartbeats and writes the records whose state or
    /// load changed meaningfully (see [`crate::load`]).
    pub async fn heartbeat(
        &self,
        tenant: &str,
        request_lease: LeaseId,
        beats: Vec<Beat>,
    ) -> Result<BeatOutcome, ControlError> {
        validate_tenant("tenant", tenant)?;
        for (i, b) in beats.iter().enumerate() {
            validate_name(&format!("instances[{i}].agent"), &b.agent)?;
            validate_name(&format!("instances[{i}].instance_id"), &b.instance_id)?;
        }
        ControlStats::inc(&self.stats.heartbeat_requests);
        ControlStats::add(&self.stats.heartbeats, beats.len() as u64);
        // Each distinct lease once, however many instances it carries.
        let mut leases: Vec<LeaseId> = Vec::new();
        for lease in std::iter::once(request_lease).chain(beats.iter().map(|b| b.lease)) {
            if lease != 0 && !leases.contains(&lease) {
                leases.push(lease);
            }
        }
        let renewals = join_all(leases.iter().map(|lease| self.store.keep_alive(*lease))).await;
        let mut lost = HashSet::new();
        for (lease, renewal) in leases.iter().zip(renewals) {
            match renewal {
                Ok(_) => {}
                Err(StoreError::LeaseNotFound(_)) => {
                    lost.insert(*lease);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut outcome = BeatOutcome { lease_expired: lost.contains(&request_lease), ..Default::default() };
        let feed = self.feeds.get(tenant).await?;
        let now = Instant::now();
        let mut pending = Vec::new();
        for beat in beats {
            let lease = if beat.lease != 0 { beat.lease } else { request_lease };
            if lease == 0 || lost.contains(&lease) {
                outcome.expired.push(beat.instance_id);
                continue;
            }
            let key = keys::instance_key(tenant, &beat.agent, &beat.instance_id);
            // The newer of what the feed has seen and what this replica wrote itself (the
            // feed may not have seen that yet).
            let from_feed = feed.instance(&key).map(|e| (e.stored.clone(), e.mod_revision, e.lease));
            let known = match (from_feed, self.recent.get(&key)) {
                (Some(f), Some(r)) => Some(if r.1 > f.1 { r } else { f }),
                (f, r) => f.or(r),
            };
            pending.push(async move {
                let result = self.apply_beat(tenant, &key, lease, &beat, known, now).await;
                (beat.instance_id, result)
            });
        }
        for (instance_id, result) in join_all(pending).await {
            match result? {
                BeatResult::Ok => {}
                BeatResult::Expired => outcome.expired.push(instance_id),
                BeatResult::Replaced => outcome.replaced.push(instance_id),
            }
        }
        Ok(outcome)
    }

    /// One instance's heartbeat against its record (`known`: as the tenant's feed last saw
    /// it; read from the store when the feed has not seen it or a write conflicts).
    async fn apply_beat(
        &self,
        tenant: &str,
        key: &str,
        lease: LeaseId,
        beat: &Beat,
        mut known: Option<Known>,
        now: Instant,
    ) -> Result<BeatResult, ControlError> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut stored, mod_revision, record_lease) = match known.take() {
                Some(known) => known,
                None => match self.store.get(key).await? {
                    None => return Ok(BeatResult::Expired),
                    Some(kv) => (
                        record::decode_instance(&kv, tenant, &beat.agent, &beat.instance_id)?,
                        kv.mod_revision,
                        kv.lease,
                    ),
                },
            };
            if record_lease != lease {
                return Ok(BeatResult::Replaced);
            }
            let decision =
                self.gate.decide(key, stored.record.state, &stored.record.load, beat.state, beat.load.as_ref(), now);
            match decision {
                Decision::Skip => return Ok(BeatResult::Ok),
                Decision::Defer => {
                    ControlStats::inc(&self.stats.load_writes_deferred);
                    return Ok(BeatResult::Ok);
                }
                Decision::WriteState | Decision::WriteLoad => {}
            }
            if let Some(state) = beat.state {
                stored.record.state = state;
            }
            if let Some(load) = beat.load {
                stored.record.load = load;
            }
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.to_string(), mod_revision)],
                success: vec![Op::Put { key: key.to_string(), value: encode(&stored), lease: Some(lease) }],
                failure: vec![],
            };
            match self.store.txn(txn).await {
                Ok(r) if r.succeeded => {
                    self.gate.record_write(key, now);
                    self.recent.insert(key, (stored, r.revision, lease), now);
                    let counter = if decision == Decision::WriteState {
                        &self.stats.state_writes
                    } else {
                        &self.stats.load_writes
                    };
                    ControlStats::inc(counter);
                    return Ok(BeatResult::Ok);
                }
                // The record changed since it was read (a hold, a re-registration, or the
                // feed lagging): read it again and decide again.
                Ok(_) => known = None,
                Err(StoreError::LeaseNotFound(_)) => return Ok(BeatResult::Expired),
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControlError::Conflict(format!("instance {key}")))
    }

    /// Removes an instance. With `expected_lease`, only while the record is still on that
    /// lease; with `revoke_lease`, also revokes that lease. Returns the store revision.
    pub async fn deregister(
        &self,
        tenant: &str,
        agent: &str,
        instance_id: &str,
        revoke_lease: LeaseId,
        expected_lease: LeaseId,
    ) -> Result<Revision, ControlError> {
        validate_tenant("tenant", tenant)?;
        validate_name("agent", agent)?;
        validate_name("instance_id", instance_id)?;
        let key = keys::instance_key(tenant, agent, instance_id);
        let mut revision = 0;
        if expected_lease == 0 {
            revision = self.store.delete(&key).await?.0;
        } else {
            for attempt in 0..=CAS_ATTEMPTS {
                if attempt == CAS_ATTEMPTS {
                    return Err(ControlError::Conflict(format!("instance {key}")));
                }
                let Some(kv) = self.store.get(&key).await? else { break };
                if kv.lease != expected_lease {
                    break; // A newer registration holds the id now: leave it.
                }
                let txn = Txn {
                    compares: vec![Compare::ModRevision(key.clone(), kv.mod_revision)],
                    success: vec![Op::Delete { key: key.clone() }],
                    failure: vec![],
                };
                let result = self.store.txn(txn).await?;
                if result.succeeded {
                    revision = result.revision;
                    break;
                }
            }
        }
        if revoke_lease != 0 {
            match self.store.revoke_lease(revoke_lease).await {
                Ok(()) | Err(StoreError::LeaseNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if revision == 0 {
            revision = self.store.current_revision().await?;
        }
        Ok(revision)
    }

    /// Every instance, policy and agent hold of `tenant`, at one revision.
    pub async fn tenant_view(&self, tenant: &str) -> Result<TenantView, ControlError> {
        validate_tenant("tenant", tenant)?;
        let range = self.store.get_prefix(&keys::tenant_prefix(tenant)).await?;
        let agents = keys::agents_prefix(tenant);
        let policies = keys::policies_prefix(tenant);
        let holds = keys::holds_prefix(tenant);
        let mut view = TenantView { revision: range.revision, ..Default::default() };
        for kv in &range.kvs {
            if let Some((agent, instance)) = keys::parse_instance_key(&agents, &kv.key) {
                match record::decode_instance(kv, tenant, agent, instance) {
                    Ok(stored) => view.instances.push(stored.status(kv.mod_revision)),
                    Err(e) => tracing::warn!("skipping {e}"),
                }
            } else if keys::parse_policy_key(&policies, &kv.key).is_some() {
                match record::decode_policy(kv, tenant) {
                    Ok(policy) => view.policies.push((policy, kv.mod_revision)),
                    Err(e) => tracing::warn!("skipping {e}"),
                }
            } else if let Some(agent) = kv.key.strip_prefix(&holds) {
                match record::decode_hold(kv) {
                    Ok(hold) => {
                        view.agent_holds.insert(agent.to_string(), hold);
                    }
                    Err(e) => tracing::warn!("skipping {e}"),
                }
            }
        }
        // Keys sort by agent then instance id, and by policy kind then name.
        Ok(view)
    }
}

enum BeatResult {
    Ok,
    Expired,
    Replaced,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use agent_reach::model::{HoldScope, fixture};
    use agent_reach_store::EmbeddedStore;

    use super::*;
    use crate::feed::Feeds;

    fn registry(store: Arc<dyn Store>) -> (Registry, Arc<ControlStats>) {
        let stats = Arc::new(ControlStats::default());
        let store: Arc<dyn Store> = Arc::new(crate::stats::CountingStore::new(store, stats.clone()));
        let feeds = Arc::new(Feeds::new(store.clone(), stats.clone(), 64));
        let config = RegistryConfig {
            lease_ttl: Duration::from_secs(4),
            load_step: 0.1,
            load_report_interval: Duration::from_secs(5),
        };
        (Registry::new(store, config, stats.clone(), feeds), stats)
    }

    fn new_instance(id: &str, agent: &str, version: &str, lease: LeaseId) -> NewInstance {
        NewInstance {
            tenant: "t".into(),
            instance_id: id.into(),
            sidecar_id: "s".into(),
            sidecar_address: "s:1".into(),
            registration: fixture::registration(agent)
                .version(version)
                .capability(&format!("cap-{version}"), &[])
                .registration(),
            state: HealthState::Up,
            lease,
        }
    }

    fn beat(id: &str, agent: &str, state: HealthState) -> Beat {
        Beat { instance_id: id.into(), agent: agent.into(), lease: 0, state: Some(state), load: None }
    }

    async fn status(r: &Registry, id: &str) -> Option<InstanceStatus> {
        r.tenant_view("t").await.unwrap().instances.into_iter().find(|s| s.record.instance_id == id)
    }

    fn hold(scope: HoldScope, reason: &str) -> Option<StateHold> {
        hold_from_request(Some(HealthState::Paused), reason.into(), scope).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn reports_holds_and_lifts() {
        let (r, stats) = registry(Arc::new(EmbeddedStore::default()));
        let reg = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap();
        let lease = reg.lease;
        assert_eq!(reg.generation, 1);
        let s = status(&r, "a-1").await.unwrap();
        assert_eq!((s.record.state, s.reported_state), (HealthState::Up, HealthState::Up));
        // The instance's own report: UP -> DEGRADED -> UP, each written at once.
        for state in [HealthState::Degraded, HealthState::Up] {
            let out = r.heartbeat("t", lease, vec![beat("a-1", "a", state)]).await.unwrap();
            assert_eq!(out, BeatOutcome::default());
            assert_eq!(status(&r, "a-1").await.unwrap().record.state, state);
        }
        assert_eq!(ControlStats::get(&stats.state_writes), 2);
        // An operator's hold wins over every later report until lifted.
        r.set_instance_hold("t", "a-1", hold(HoldScope::Instance, "maintenance")).await.unwrap();
        for state in [HealthState::Up, HealthState::Degraded, HealthState::Up] {
            tokio::time::advance(Duration::from_secs(1)).await;
            r.heartbeat("t", lease, vec![beat("a-1", "a", state)]).await.unwrap();
            let s = status(&r, "a-1").await.unwrap();
            assert_eq!((s.record.state, s.reported_state), (HealthState::Paused, state));
            assert_eq!(s.holds[0].reason, "maintenance");
        }
        r.set_instance_hold("t", "a-1", None).await.unwrap();
        let s = status(&r, "a-1").await.unwrap();
        assert_eq!((s.record.state, s.holds.len()), (HealthState::Up, 0));
        // A hold needs PAUSED and a reason.
        assert_eq!(
            hold_from_request(Some(HealthState::Down), "x".into(), HoldScope::Instance).unwrap_err().field,
            "state"
        );
        let err = r.set_instance_hold("t", "a-1", hold(HoldScope::Instance, " ")).await.unwrap_err();
        assert!(matches!(err, ControlError::Invalid(f) if f.field == "reason"));
        let err = r.set_instance_hold("t", "nope", hold(HoldScope::Instance, "x")).await.unwrap_err();
        assert!(matches!(err, ControlError::InstanceNotFound(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_hold_covers_later_instances_until_lifted() {
        let (r, _) = registry(Arc::new(EmbeddedStore::default()));
        let lease = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap().lease;
        r.register(new_instance("b-1", "b", "1", lease)).await.unwrap();
        let (held, _) = r.set_agent_hold("t", "a", hold(HoldScope::Agent, "drain")).await.unwrap();
        assert_eq!(
            held.iter().map(|s| (s.record.instance_id.as_str(), s.record.state)).collect::<Vec<_>>(),
            [("a-1", HealthState::Paused)]
        );
        // A new instance of the held agent comes up held; other agents are untouched.
        r.register(new_instance("a-2", "a", "1", lease)).await.unwrap();
        assert_eq!(status(&r, "a-2").await.unwrap().record.state, HealthState::Paused);
        assert_eq!(status(&r, "b-1").await.unwrap().record.state, HealthState::Up);
        // An instance hold and the agent hold are separate: lifting one leaves the other.
        r.set_instance_hold("t", "a-1", hold(HoldScope::Instance, "disk")).await.unwrap();
        let (lifted, _) = r.set_agent_hold("t", "a", None).await.unwrap();
        assert_eq!(lifted.len(), 2);
        assert_eq!(status(&r, "a-1").await.unwrap().record.state, HealthState::Paused);
        assert_eq!(status(&r, "a-2").await.unwrap().record.state, HealthState::Up);
        assert!(r.tenant_view("t").await.unwrap().agent_holds.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reregistration_replaces_the_record_and_keeps_the_hold() {
        let (r, _) = registry(Arc::new(EmbeddedStore::default()));
        let old = r.register(new_instance("x-1", "x", "1", 0)).await.unwrap();
        r.set_instance_hold("t", "x-1", hold(HoldScope::Instance, "keep")).await.unwrap();
        // The same id again, from another sidecar's lease, with a new version.
        let other = r.store().grant_lease(Duration::from_secs(4)).await.unwrap().id;
        let new = r.register(new_instance("x-1", "x", "2", other)).await.unwrap();
        assert_eq!(new.generation, 2);
        let s = status(&r, "x-1").await.unwrap();
        assert_eq!(
            (s.record.registration.version.as_str(), s.record.registration.capabilities[0].name.as_str()),
            ("2", "cap-2")
        );
        assert_eq!((s.generation, s.record.state), (2, HealthState::Paused));
        // The old sidecar's heartbeats learn that the id moved; they change nothing.
        let out = r.heartbeat("t", old.lease, vec![beat("x-1", "x", HealthState::Down)]).await.unwrap();
        assert_eq!(out.replaced, ["x-1"]);
        assert_eq!(status(&r, "x-1").await.unwrap().reported_state, HealthState::Up);
        // Its deregistration (expecting its own lease) leaves the new record alone.
        r.deregister("t", "x", "x-1", 0, old.lease).await.unwrap();
        assert!(status(&r, "x-1").await.is_some());
        r.deregister("t", "x", "x-1", 0, other).await.unwrap();
        assert!(status(&r, "x-1").await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn lease_expiry_removes_the_instances_and_says_so() {
        let (r, _) = registry(Arc::new(EmbeddedStore::default()));
        let lease = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap().lease;
        r.register(new_instance("a-2", "a", "1", lease)).await.unwrap();
        // Renewed every 3 s, a 4 s lease lives on.
        for _ in 0..4 {
            tokio::time::advance(Duration::from_secs(3)).await;
            let out = r.heartbeat("t", lease, vec![beat("a-1", "a", HealthState::Up)]).await.unwrap();
            assert_eq!(out, BeatOutcome::default());
        }
        assert_eq!(r.tenant_view("t").await.unwrap().instances.len(), 2);
        // Silent past its TTL, it expires with both records.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(r.tenant_view("t").await.unwrap().instances.is_empty());
        let out = r
            .heartbeat("t", lease, vec![beat("a-1", "a", HealthState::Up), beat("a-2", "a", HealthState::Up)])
            .await
            .unwrap();
        assert_eq!(
            out,
            BeatOutcome { expired: vec!["a-1".into(), "a-2".into()], replaced: vec![], lease_expired: true }
        );
        // Registering on the lost lease is refused; a new lease works.
        let err = r.register(new_instance("a-1", "a", "1", lease)).await.unwrap_err();
        assert!(matches!(err, ControlError::LeaseNotFound(l) if l == lease));
        assert!(r.register(new_instance("a-1", "a", "1", 0)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_hold_survives_lease_expiry_and_returns_with_the_instance() {
        let (r, _) = registry(Arc::new(EmbeddedStore::default()));
        let lease = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap().lease;
        r.register(new_instance("a-2", "a", "1", lease)).await.unwrap();
        r.set_instance_hold("t", "a-1", hold(HoldScope::Instance, "disk check")).await.unwrap();
        // The lease expires (control away longer than the TTL): both records go.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(r.tenant_view("t").await.unwrap().instances.is_empty());
        // Registered again under their ids on a new lease: a-1 is held as before, a-2 not.
        let lease = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap().lease;
        r.register(new_instance("a-2", "a", "1", lease)).await.unwrap();
        let s = status(&r, "a-1").await.unwrap();
        assert_eq!((s.record.state, s.reported_state), (HealthState::Paused, HealthState::Up));
        assert_eq!(s.holds.len(), 1);
        assert_eq!((s.holds[0].reason.as_str(), s.holds[0].scope), ("disk check", HoldScope::Instance));
        assert_eq!(status(&r, "a-2").await.unwrap().record.state, HealthState::Up);
        // Lifted, it stays lifted through the next expiry and registration.
        r.set_instance_hold("t", "a-1", None).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        r.register(new_instance("a-1", "a", "1", 0)).await.unwrap();
        let s = status(&r, "a-1").await.unwrap();
        assert_eq!((s.record.state, s.holds.len()), (HealthState::Up, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn load_is_written_on_steps_at_most_once_per_interval() {
        let (r, stats) = registry(Arc::new(EmbeddedStore::default()));
        let lease = r.register(new_instance("a-1", "a", "1", 0)).await.unwrap().lease;
        let with_load = |ratio: f64| Beat {
            load: Some(Load { load_ratio: ratio, in_flight: 1, ..Default::default() }),
            ..beat("a-1", "a", HealthState::Up)
        };
        let writes = || ControlStats::get(&stats.store_writes);
        let before = writes();
        // 100 heartbeats hovering around 0.05: nothing written.
        for i in 0..100 {
            r.heartbeat("t", lease, vec![with_load(0.05 + f64::from(i % 5) / 100.0)]).await.unwrap();
        }
        assert_eq!((ControlStats::get(&stats.load_writes), writes() - before), (0, 0));
        r.heartbeat("t", lease, vec![with_load(0.5)]).await.unwrap();
        assert_eq!(ControlStats::get(&stats.load_writes), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        r.heartbeat("t", lease, vec![with_load(0.9)]).await.unwrap();
        assert_eq!((ControlStats::get(&stats.load_writes), ControlStats::get(&stats.load_writes_deferred)), (1, 1));
        // Heartbeats keep coming (and renewing the 4 s lease); the write waits for the
        // interval (5 s) since the last one.
        tokio::time::advance(Duration::from_secs(2)).await;
        r.heartbeat("t", lease, vec![with_load(0.9)]).await.unwrap();
        assert_eq!((ControlStats::get(&stats.load_writes), ControlStats::get(&stats.load_writes_deferred)), (1, 2));
        tokio::time::advance(Duration::from_secs(2)).await;
        r.heartbeat("t", lease, vec![with_load(0.9)]).await.unwrap();
        assert_eq!(ControlStats::get(&stats.load_writes), 2);
        assert_eq!(status(&r, "a-1").await.unwrap().record.load.load_ratio, 0.9);
        assert_eq!(writes() - before, 2);
        assert_eq!(ControlStats::get(&stats.heartbeats), 104);
    }
}
