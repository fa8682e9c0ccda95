//! Policies in the store: one JSON value per tenant, kind and name, validated before it is
//! written; sidecars see them through the watch feed.

use agent_reach::model::{FieldError, validate_name, validate_tenant};
use agent_reach::policy::{Policy, PolicyKind};
use agent_reach_store::Revision;

use super::Registry;
use crate::error::ControlError;
use crate::keys;
use crate::record::{self, encode};

impl Registry {
    /// Validates and stores a policy; returns its revision.
    pub async fn put_policy(&self, policy: &Policy) -> Result<Revision, ControlError> {
        policy.validate()?;
        let key = keys::policy_key(&policy.tenant, policy.kind, &policy.name);
        Ok(self.store.put(&key, encode(policy), None).await?)
    }

    pub async fn get_policy(
        &self,
        tenant: &str,
        kind: PolicyKind,
        name: &str,
    ) -> Result<(Policy, Revision), ControlError> {
        validate_tenant("tenant", tenant)?;
        validate_policy_name(kind, name)?;
        let not_found = || ControlError::PolicyNotFound { kind, name: name.to_string() };
        let kv = self.store.get(&keys::policy_key(tenant, kind, name)).await?.ok_or_else(not_found)?;
        Ok((record::decode_policy(&kv, tenant)?, kv.mod_revision))
    }

    /// Removes a policy; returns the store revision of the deletion.
    pub async fn delete_policy(&self, tenant: &str, kind: PolicyKind, name: &str) -> Result<Revision, ControlError> {
        validate_tenant("tenant", tenant)?;
        validate_policy_name(kind, name)?;
        let (revision, existed) = self.store.delete(&keys::policy_key(tenant, kind, name)).await?;
        if !existed {
            return Err(ControlError::PolicyNotFound { kind, name: name.to_string() });
        }
        Ok(revision)
    }
}

/// A policy as the store holds it (JSON).
pub fn encode_policy(policy: &Policy) -> bytes::Bytes {
    encode(policy)
}

fn validate_policy_name(kind: PolicyKind, name: &str) -> Result<(), FieldError> {
    match kind {
        PolicyKind::Tenant if name != "default" => Err(FieldError::new("name", "a tenant policy is named \"default\"")),
        _ => validate_name("name", name),
    }
}
