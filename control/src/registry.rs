//! Registrations in the store: writing an instance record on a new lease, renewing
//! leases, recording state changes, removing instances, and reading a tenant's instances.
//!
//! Records are JSON (readable with `etcdctl get --prefix /agent-reach/`); the store
//! revision of a record travels beside it, not inside. This module knows the store and the
//! domain types, not protobuf.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::model::{
    FieldError, HealthState, Instance, InstanceRecord, Load, Registration, validate_name, validate_tenant,
};
use agent_reach::policy::Policy;
use agent_reach_store::{KeyValue, LeaseId, Revision, Store, StoreError};
use bytes::Bytes;

use crate::keys;

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid argument: {0}")]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored record {key} is unreadable: {why}")]
    Corrupt { key: String, why: String },
}

/// A registration to store.
pub struct NewInstance {
    pub tenant: String,
    pub instance_id: String,
    pub sidecar_id: String,
    pub sidecar_address: String,
    pub registration: Registration,
    pub state: HealthState,
}

/// A lease renewal with the state and load the instance reports.
pub struct Renewal {
    pub instance_id: String,
    pub agent: String,
    pub lease: LeaseId,
    pub state: Option<HealthState>,
    pub load: Load,
}

/// Registrations of every tenant, in one store.
#[derive(Clone)]
pub struct Registry {
    store: Arc<dyn Store>,
    lease_ttl: Duration,
}

impl Registry {
    pub fn new(store: Arc<dyn Store>, lease_ttl: Duration) -> Registry {
        Registry { store, lease_ttl }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// Stores a registration on a new lease; returns the lease, its TTL and the revision.
    pub async fn register(&self, new: NewInstance) -> Result<(LeaseId, Duration, Revision), RegistryError> {
        validate_tenant("tenant", &new.tenant)?;
        validate_name("instance_id", &new.instance_id)?;
        new.registration.validate()?;
        if new.sidecar_address.is_empty() {
            return Err(FieldError::new("sidecar.mesh_address", "must not be empty").into());
        }
        let record = InstanceRecord {
            instance_id: new.instance_id,
            tenant: new.tenant,
            registration: new.registration,
            sidecar_id: new.sidecar_id,
            sidecar_address: new.sidecar_address,
            state: new.state,
            load: Load::default(),
            registered_at_ms: now_ms(),
        };
        let key = keys::instance_key(&record.tenant, &record.registration.agent, &record.instance_id);
        let lease = self.store.grant_lease(self.lease_ttl).await?;
        let revision = self.store.put(&key, encode(&record), Some(lease.id)).await?;
        Ok((lease.id, lease.ttl, revision))
    }

    /// Renews leases. Returns the instances whose lease or record is gone (they must
    /// register again). A record is rewritten only when its state changed.
    pub async fn renew(&self, tenant: &str, renewals: Vec<Renewal>) -> Result<Vec<String>, RegistryError> {
        validate_tenant("tenant", tenant)?;
        let mut expired = Vec::new();
        for r in renewals {
            validate_name("instances.agent", &r.agent)?;
            validate_name("instances.instance_id", &r.instance_id)?;
            match self.store.keep_alive(r.lease).await {
                Ok(_) => {}
                Err(StoreError::LeaseNotFound(_)) => {
                    expired.push(r.instance_id);
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let key = keys::instance_key(tenant, &r.agent, &r.instance_id);
            let Some(kv) = self.store.get(&key).await? else {
                // The lease lives but the record is gone (deleted by an operator or a
                // newer registration): drop the lease and have the sidecar register again.
                let _ = self.store.revoke_lease(r.lease).await;
                expired.push(r.instance_id);
                continue;
            };
            let mut record = decode(&kv)?;
            let state_changed = r.state.is_some_and(|s| s != record.state);
            if state_changed {
                record.state = r.state.unwrap_or(record.state);
                record.load = r.load;
                self.store.put(&key, encode(&record), Some(kv.lease)).await?;
            }
        }
        Ok(expired)
    }

    /// Removes an instance and revokes its lease.
    pub async fn deregister(
        &self,
        tenant: &str,
        agent: &str,
        instance_id: &str,
        lease: LeaseId,
    ) -> Result<Revision, RegistryError> {
        validate_tenant("tenant", tenant)?;
        validate_name("agent", agent)?;
        validate_name("instance_id", instance_id)?;
        let (revision, _) = self.store.delete(&keys::instance_key(tenant, agent, instance_id)).await?;
        if lease != 0 {
            match self.store.revoke_lease(lease).await {
                Ok(()) | Err(StoreError::LeaseNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(revision)
    }

    /// Every instance and policy of `tenant`, at one revision.
    pub async fn tenant_state(&self, tenant: &str) -> Result<TenantState, RegistryError> {
        let range = self.store.get_prefix(&keys::tenant_prefix(tenant)).await?;
        let agents = keys::agents_prefix(tenant);
        let policies = keys::policies_prefix(tenant);
        let mut state = TenantState { revision: range.revision, ..Default::default() };
        for kv in &range.kvs {
            if kv.key.starts_with(&agents) {
                match decode(kv) {
                    Ok(record) => state.instances.push(Instance { record, revision: kv.mod_revision }),
                    Err(e) => tracing::warn!("skipping {e}"),
                }
            } else if kv.key.starts_with(&policies) {
                match decode_policy(kv) {
                    Ok(policy) => state.policies.push((policy, kv.mod_revision)),
                    Err(e) => tracing::warn!("skipping {e}"),
                }
            }
        }
        Ok(state)
    }

    /// Every instance of `tenant`, at one revision.
    pub async fn instances(&self, tenant: &str) -> Result<(Vec<Instance>, Revision), RegistryError> {
        let prefix = keys::agents_prefix(tenant);
        let range = self.store.get_prefix(&prefix).await?;
        let mut out = Vec::with_capacity(range.kvs.len());
        for kv in &range.kvs {
            match decode(kv) {
                Ok(record) => out.push(Instance { record, revision: kv.mod_revision }),
                Err(e) => tracing::warn!("skipping {e}"),
            }
        }
        Ok((out, range.revision))
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Everything routing needs of one tenant, at one revision.
#[derive(Debug, Default)]
pub struct TenantState {
    pub revision: Revision,
    pub instances: Vec<Instance>,
    /// Each policy with the revision it was written at.
    pub policies: Vec<(Policy, Revision)>,
}

pub fn encode_policy(policy: &Policy) -> Bytes {
    // Serializing plain structs of strings and numbers to JSON cannot fail.
    Bytes::from(serde_json::to_vec(policy).unwrap_or_default())
}

pub fn decode_policy(kv: &KeyValue) -> Result<Policy, RegistryError> {
    serde_json::from_slice(&kv.value).map_err(|e| RegistryError::Corrupt { key: kv.key.clone(), why: e.to_string() })
}

pub fn encode(record: &InstanceRecord) -> Bytes {
    // Serializing plain structs of strings and numbers to JSON cannot fail.
    Bytes::from(serde_json::to_vec(record).unwrap_or_default())
}

pub fn decode(kv: &KeyValue) -> Result<InstanceRecord, RegistryError> {
    serde_json::from_slice(&kv.value).map_err(|e| RegistryError::Corrupt { key: kv.key.clone(), why: e.to_string() })
}
