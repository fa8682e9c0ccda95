//! Operators' holds: PAUSED on one instance (kept in its own key as well as in the record,
//! so it survives the record's lease and returns with the instance's next registration), or
//! on every instance of an agent (present and future, through the agent's hold key),
//! written with compare-and-swap so a heartbeat never undoes a hold and a registration at
//! the same moment is held too.

use agent_reach::model::{
    FieldError, HealthState, HoldScope, InstanceStatus, MAX_REASON_LEN, StateHold, validate_name, validate_tenant,
};
use agent_reach_store::{Compare, KeyValue, Op, Revision, StoreError, Txn};

use super::{CAS_ATTEMPTS, Registry, now_ms};
use crate::error::ControlError;
use crate::keys;
use crate::record::{self, StoredInstance, encode};

impl Registry {
    /// Holds one instance (`hold` = Some) or lifts its instance-level hold (None); returns
    /// the instance as it is afterwards.
    pub async fn set_instance_hold(
        &self,
        tenant: &str,
        instance_id: &str,
        hold: Option<StateHold>,
    ) -> Result<(InstanceStatus, Revision), ControlError> {
        validate_tenant("tenant", tenant)?;
        validate_name("instance_id", instance_id)?;
        if let Some(h) = &hold {
            validate_hold(h)?;
        }
        let agents = keys::agents_prefix(tenant);
        for _ in 0..CAS_ATTEMPTS {
            // Instance ids are unique within a tenant, but the key also names the agent.
            let range = self.store.get_prefix(&agents).await?;
            let found = range.kvs.iter().find_map(|kv| {
                let (agent, id) = keys::parse_instance_key(&agents, &kv.key)?;
                (id == instance_id).then(|| (agent.to_string(), kv))
            });
            let Some((agent, kv)) = found else {
                return Err(ControlError::InstanceNotFound(instance_id.to_string()));
            };
            let mut stored = record::decode_instance(kv, tenant, &agent, instance_id)?;
            // First the hold's own key, which registrations read (so the hold survives the
            // record's lease); then the record, while that key is still what this wrote.
            let hold_key = keys::instance_hold_key(tenant, &agent, instance_id);
            let hold_revision = match &hold {
                Some(h) => self.store.put(&hold_key, encode(h), None).await?,
                None => self.store.delete(&hold_key).await?.0,
            };
            let guard = vec![Compare::ModRevision(hold_key, if hold.is_some() { hold_revision } else { 0 })];
            stored.instance_hold = hold.clone();
            match self.rewrite(kv, &stored, guard).await? {
                Some(revision) => return Ok((stored.status(revision), revision)),
                None => continue,
            }
        }
        Err(ControlError::Conflict(format!("instance {instance_id}")))
    }

    /// Holds every instance of `agent`, present and future (`hold` = Some), or lifts the
    /// agent-level hold (None); returns the agent's instances as they are afterwards.
    pub async fn set_agent_hold(
        &self,
        tenant: &str,
        agent: &str,
        hold: Option<StateHold>,
    ) -> Result<(Vec<InstanceStatus>, Revision), ControlError> {
        validate_tenant("tenant", tenant)?;
        validate_name("agent", agent)?;
        if let Some(h) = &hold {
            validate_hold(h)?;
        }
        let hold_key = keys::agent_hold_key(tenant, agent);
        // First the hold key, which registrations read; then every record already there.
        let hold_revision = match &hold {
            Some(h) => self.store.put(&hold_key, encode(h), None).await?,
            None => self.store.delete(&hold_key).await?.0,
        };
        let prefix = keys::agent_instances_prefix(tenant, agent);
        let mut out = Vec::new();
        let mut revision = hold_revision;
        let range = self.store.get_prefix(&prefix).await?;
        'instances: for kv in range.kvs {
            let Some(instance_id) = kv.key.strip_prefix(&prefix).map(str::to_string) else { continue };
            let mut kv = kv;
            for _ in 0..CAS_ATTEMPTS {
                let mut stored = match record::decode_instance(&kv, tenant, agent, &instance_id) {
                    Ok(stored) => stored,
                    Err(e) => {
                        tracing::warn!("skipping {e}");
                        continue 'instances;
                    }
                };
                if stored.agent_hold == hold {
                    out.push(stored.status(kv.mod_revision));
                    continue 'instances;
                }
                stored.agent_hold = hold.clone();
                // Only while the hold key is still what this call wrote: a later call owns
                // the records from then on.
                let guard =
                    vec![Compare::ModRevision(hold_key.clone(), if hold.is_some() { hold_revision } else { 0 })];
                match self.rewrite(&kv, &stored, guard).await? {
                    Some(r) => {
                        revision = revision.max(r);
                        out.push(stored.status(r));
                        continue 'instances;
                    }
                    None => match self.store.get(&kv.key).await? {
                        Some(fresh) => {
                            let current = self.store.get(&hold_key).await?;
                            let ours = match (&hold, current) {
                                (Some(_), Some(c)) => c.mod_revision == hold_revision,
                                (None, None) => true,
                                _ => false,
                            };
                            if !ours {
                                return Err(ControlError::Conflict(format!("agent {agent}'s hold")));
                            }
                            kv = fresh;
                        }
                        None => continue 'instances, // The instance left meanwhile.
                    },
                }
            }
            return Err(ControlError::Conflict(format!("instance {}", kv.key)));
        }
        Ok((out, revision))
    }

    /// Writes `stored` over `kv` if it is unchanged (and `extra` compares hold); keeps its
    /// lease. `None` when something changed.
    async fn rewrite(
        &self,
        kv: &KeyValue,
        stored: &StoredInstance,
        extra: Vec<Compare>,
    ) -> Result<Option<Revision>, ControlError> {
        let mut compares = vec![Compare::ModRevision(kv.key.clone(), kv.mod_revision)];
        compares.extend(extra);
        let lease = (kv.lease != 0).then_some(kv.lease);
        let txn = Txn {
            compares,
            success: vec![Op::Put { key: kv.key.clone(), value: encode(stored), lease }],
            failure: vec![],
        };
        match self.store.txn(txn).await {
            Ok(r) => Ok(r.succeeded.then_some(r.revision)),
            // The record's lease expired meanwhile, taking the record with it.
            Err(StoreError::LeaseNotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn validate_hold(hold: &StateHold) -> Result<(), FieldError> {
    if hold.state != HealthState::Paused {
        return Err(FieldError::new("state", "set PAUSED to hold, or UP to lift a hold"));
    }
    if hold.reason.trim().is_empty() {
        return Err(FieldError::new("reason", "a hold needs a reason"));
    }
    if hold.reason.len() > MAX_REASON_LEN {
        return Err(FieldError::new("reason", format!("longer than {MAX_REASON_LEN} bytes")));
    }
    if hold.reason.chars().any(char::is_control) {
        return Err(FieldError::new("reason", "control characters are not allowed"));
    }
    Ok(())
}

/// A hold from an Admin request: PAUSED with a reason holds, UP lifts.
pub fn hold_from_request(
    state: Option<HealthState>,
    reason: String,
    scope: HoldScope,
) -> Result<Option<StateHold>, FieldError> {
    match state {
        Some(HealthState::Paused) => {
            Ok(Some(StateHold { state: HealthState::Paused, reason, scope, set_at_ms: now_ms() }))
        }
        Some(HealthState::Up) => Ok(None),
        _ => Err(FieldError::new("state", "set PAUSED to hold, or UP to lift a hold")),
    }
}
