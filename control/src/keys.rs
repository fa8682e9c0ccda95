//! The store key layout, in one place:
//! - `/agent-reach/v1/tenants/{tenant}/agents/{agent}/{instance}` → instance record (JSON);
//! - `/agent-reach/v1/tenants/{tenant}/policies/{kind}/{name}` → policy (JSON).
//!
//! Tenant, agent and instance names are validated before they reach a key (no `/`), so a
//! key always parses back into exactly the names it was built from.

use agent_reach::policy::PolicyKind;

/// Root of everything Agent-Reach stores.
pub const ROOT: &str = "/agent-reach/v1/tenants/";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let key = instance_key("default", "summarizer", "summarizer-abc");
        assert_eq!(key, "/agent-reach/v1/tenants/default/agents/summarizer/summarizer-abc");
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
    }
}
