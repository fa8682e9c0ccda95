//! How the control service stores things: JSON values (readable with
//! `etcdctl get --prefix /agent-reach/`), decoded back into domain types.
//!
//! An instance is stored as [`StoredInstance`]: the record the sidecar registered with the
//! state the instance *reports*, plus the operator holds copied onto it and the generation
//! of the registration. What routing sees ([`StoredInstance::status`]) is computed from it:
//! a hold wins over the reported state. The store revision of a value travels beside it,
//! not inside. The key, not the value, decides the tenant, agent and instance id of a
//! record.

use agent_reach::model::{HealthState, InstanceRecord, InstanceStatus, StateHold, TenantRecord};
use agent_reach::policy::Policy;
use agent_reach_store::KeyValue;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::ControlError;

/// An instance as stored under `/agent-reach/v1/tenants/{tenant}/agents/{agent}/{instance}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredInstance {
    /// `record.state` is the state the instance (or its sidecar's probes) reported.
    #[serde(flatten)]
    pub record: InstanceRecord,
    /// An operator's hold on this instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_hold: Option<StateHold>,
    /// A copy of the operator's hold on the whole agent, kept in step with the agent's
    /// hold key, so that each record alone says what routing must do with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_hold: Option<StateHold>,
    /// Registrations of this instance id so far (1 for the first).
    #[serde(default)]
    pub generation: u64,
}

impl StoredInstance {
    /// The state routing uses: the instance hold's, else the agent hold's, else the reported
    /// state.
    pub fn effective_state(&self) -> HealthState {
        self.instance_hold.as_ref().or(self.agent_hold.as_ref()).map_or(self.record.state, |hold| hold.state)
    }

    /// The instance as routing and operators see it, at `revision`.
    pub fn status(&self, revision: i64) -> InstanceStatus {
        let mut record = self.record.clone();
        record.state = self.effective_state();
        InstanceStatus {
            record,
            revision,
            reported_state: self.record.state,
            holds: self.instance_hold.iter().chain(self.agent_hold.iter()).cloned().collect(),
            generation: self.generation,
        }
    }
}

/// Encodes a value as JSON.
pub fn encode<T: Serialize>(value: &T) -> Bytes {
    // The stored types are plain structs of strings, numbers, maps with string keys and
    // enums: serializing them to JSON cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, ControlError> {
    serde_json::from_slice(&kv.value).map_err(|e| ControlError::Corrupt { key: kv.key.clone(), why: e.to_string() })
}

/// Decodes an instance stored under `tenant`, `agent` and `instance_id` (from its key).
pub fn decode_instance(
    kv: &KeyValue,
    tenant: &str,
    agent: &str,
    instance_id: &str,
) -> Result<StoredInstance, ControlError> {
    let mut stored: StoredInstance = decode(kv)?;
    if stored.record.registration.agent != agent {
        return Err(ControlError::Corrupt {
            key: kv.key.clone(),
            why: format!("record names agent {:?}", stored.record.registration.agent),
        });
    }
    stored.record.tenant = tenant.to_string();
    stored.record.instance_id = instance_id.to_string();
    Ok(stored)
}

pub fn decode_policy(kv: &KeyValue, tenant: &str) -> Result<Policy, ControlError> {
    let mut policy: Policy = decode(kv)?;
    policy.tenant = tenant.to_string();
    Ok(policy)
}

pub fn decode_hold(kv: &KeyValue) -> Result<StateHold, ControlError> {
    decode(kv)
}

pub fn decode_tenant(kv: &KeyValue) -> Result<TenantRecord, ControlError> {
    decode(kv)
}

#[cfg(test)]
mod tests {
    use agent_reach::model::{HoldScope, fixture};

    use super::*;

    fn stored() -> StoredInstance {
        StoredInstance {
            record: fixture::instance("a-1").agent("a").capability("c", &[]).registered_at_ms(1).record(),
            instance_hold: None,
            agent_hold: None,
            generation: 1,
        }
    }

    fn hold(scope: HoldScope) -> StateHold {
        StateHold { state: HealthState::Paused, reason: "r".into(), scope, set_at_ms: 0 }
    }

    #[test]
    fn holds_win_over_reports() {
        let mut s = stored();
        assert_eq!(s.effective_state(), HealthState::Up);
        s.agent_hold = Some(hold(HoldScope::Agent));
        assert_eq!(s.effective_state(), HealthState::Paused);
        s.instance_hold = Some(hold(HoldScope::Instance));
        let status = s.status(9);
        assert_eq!((status.record.state, status.reported_state), (HealthState::Paused, HealthState::Up));
        assert_eq!(status.holds.iter().map(|h| h.scope).collect::<Vec<_>>(), [HoldScope::Instance, HoldScope::Agent]);
    }

    #[test]
    fn the_key_decides_names() {
        let s = stored();
        let kv = |value: Bytes| KeyValue {
            key: "k".into(),
            value,
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        };
        let decoded = decode_instance(&kv(encode(&s)), "other", "a", "a-9").unwrap();
        assert_eq!((decoded.record.tenant.as_str(), decoded.record.instance_id.as_str()), ("other", "a-9"));
        assert!(matches!(decode_instance(&kv(encode(&s)), "t", "b", "x"), Err(ControlError::Corrupt { .. })));
        assert!(matches!(
            decode_instance(&kv(Bytes::from_static(b"{")), "t", "a", "x"),
            Err(ControlError::Corrupt { .. })
        ));
        // Records written before holds and generations existed still read.
        let old = serde_json::to_vec(&s.record).unwrap();
        assert_eq!(decode_instance(&kv(Bytes::from(old)), "default", "a", "a-1").unwrap().generation, 0);
    }
}
