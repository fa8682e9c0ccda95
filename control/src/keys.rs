//! The store key layout, in one place:
//! - `/agent-reach/v1/tenants/{tenant}/agents/{agent}/{instance}` → instance record (JSON),
//!   on the lease of the sidecar that registered it;
//! - `/agent-reach/v1/tenants/{tenant}/policies/{kind}/{name}` → policy (JSON);
//! - `/agent-reach/v1/tenants/{tenant}/holds/{agent}` → an operator's agent-level hold
//!   (JSON), read when an instance of the agent registers;
//! - `/agent-reach/v1/tenant-registry/{tenant}` → the tenant's record (JSON);
//! - `/agent-reach/v1/idempotency/{tenant}/{agent}/{sha256 of the key}` → the claim of an
//!   idempotency key (JSON, see `crate::idempotency`), outside the tenant's prefix.
//!
//! Everything a tenant's sidecars route by lives under that tenant's prefix
//! (`/agent-reach/v1/tenants/{tenant}/`, with the trailing `/`, so tenant `a` never sees
//! tenant `a-b`), and each sidecar watches exactly that prefix. Tenant records sit in their
//! own small prefix so that listing tenants reads one key per tenant instead of every
//! tenant's instances, and so that a tenant's watch stream never carries registry changes.
//!
//! Tenant, agent and instance names are validated before they reach a key (no `/`), so a
//! key always parses back into exactly the names it was built from. This module does not
//! validate; callers must.

use agent_reach::policy::PolicyKind;

/// Root of every tenant's routing state.
pub const ROOT: &str = "/agent-reach/v1/tenants/";
/// Root of the tenant registry.
pub const TENANT_REGISTRY: &str = "/agent-reach/v1/tenant-registry/";
/// Root of the claims of idempotency keys.
pub const IDEMPOTENCY_ROOT: &str = "/agent-reach/v1/idempotency/";

/// Prefix of everything of `tenant` (ends with `/`).
pub fn tenant_prefix(tenant: &str) -> String {
    format!("{ROOT}{tenant}/")
}

/// Prefix of every policy of `tenant` (ends with `/`).
pub fn policies_prefix(tenant: &str) -> String {
    format!("{ROOT}{tenant}/policies/")
}

/// Key of one policy.
pub fn policy_key(tenant: &str, kind: PolicyKind, name: &str) -> String {
    format!("{ROOT}{tenant}/policies/{}/{name}", kind.as_str())
}

/// The (kind, name) of a policy key under `prefix` (from [`policies_prefix`]).
pub fn parse_policy_key(prefix: &str, key: &str) -> Option<(PolicyKind, String)> {
    let rest = key.strip_prefix(prefix)?;
    let (kind, name) = rest.split_once('/')?;
    let kind = PolicyKind::parse(kind)?;
    (!name.is_empty() && !name.contains('/')).then(|| (kind, name.to_string()))
}

/// Prefix of every instance of `tenant` (ends with `/`).
pub fn agents_prefix(tenant: &str) -> String {
    format!("{ROOT}{tenant}/agents/")
}

/// Prefix of every instance of one agent (ends with `/`).
pub fn agent_instances_prefix(tenant: &str, agent: &str) -> String {
    format!("{ROOT}{tenant}/agents/{agent}/")
}

/// Key of one instance.
pub fn instance_key(tenant: &str, agent: &str, instance_id: &str) -> String {
    format!("{ROOT}{tenant}/agents/{agent}/{instance_id}")
}

/// The (agent, instance id) of an instance key under `prefix`.
pub fn parse_instance_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?;
    let (agent, instance) = rest.split_once('/')?;
    (!agent.is_empty() && !instance.is_empty() && !instance.contains('/')).then_some((agent, instance))
}

/// Prefix of every agent-level hold of `tenant` (ends with `/`).
pub fn holds_prefix(tenant: &str) -> String {
    format!("{ROOT}{tenant}/holds/")
}

/// Key of an agent-level hold.
pub fn agent_hold_key(tenant: &str, agent: &str) -> String {
    format!("{ROOT}{tenant}/holds/{agent}")
}

/// Key of an operator's hold on one instance: apart from the instance's record, on no
/// lease, so the hold outlives the record's lease and is carried onto the instance when it
/// registers again (after a long control outage, say). It stays until lifted.
pub fn instance_hold_key(tenant: &str, agent: &str, instance_id: &str) -> String {
    format!("{ROOT}{tenant}/instance-holds/{agent}/{instance_id}")
}

/// Key of a tenant's record.
pub fn tenant_record_key(tenant: &str) -> String {
    format!("{TENANT_REGISTRY}{tenant}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let key = instance_key("default", "summarizer", "summarizer-abc");
        assert_eq!(key, "/agent-reach/v1/tenants/default/agents/summarizer/summarizer-abc");
        assert!(key.starts_with(&agent_instances_prefix("default", "summarizer")));
        let prefix = agents_prefix("default");
        assert_eq!(parse_instance_key(&prefix, &key), Some(("summarizer", "summarizer-abc")));
        assert_eq!(parse_instance_key(&prefix, "/agent-reach/v1/tenants/default/agents/x"), None);
        assert_eq!(parse_instance_key(&agents_prefix("other"), &key), None);
        let key = policy_key("default", PolicyKind::Capability, "text.summarize");
        assert_eq!(key, "/agent-reach/v1/tenants/default/policies/capability/text.summarize");
        assert!(key.starts_with(&tenant_prefix("default")));
        assert_eq!(
            parse_policy_key(&policies_prefix("default"), &key),
            Some((PolicyKind::Capability, "text.summarize".to_string()))
        );
        assert_eq!(parse_policy_key(&policies_prefix("default"), "/agent-reach/v1/tenants/default/policies/x/y"), None);
        assert!(agent_hold_key("default", "a").starts_with(&holds_prefix("default")));
        assert!(agent_hold_key("default", "a").starts_with(&tenant_prefix("default")));
        assert!(!tenant_record_key("default").starts_with(ROOT));
        // Instance holds are neither instances nor agent holds.
        let hold = instance_hold_key("default", "a", "a-1");
        assert!(hold.starts_with(&tenant_prefix("default")));
        assert!(!hold.starts_with(&holds_prefix("default")));
        assert_eq!(parse_instance_key(&agents_prefix("default"), &hold), None);
    }

    #[test]
    fn a_tenant_prefix_never_covers_another_tenant() {
        // "a" is a string prefix of "a-b", but not a key prefix.
        assert!(!instance_key("a-b", "x", "y").starts_with(&tenant_prefix("a")));
        assert!(!tenant_record_key("a-b").starts_with(&tenant_prefix("a")));
    }
}
