//! The store key layout, in one place:
//! `/agent-reach/v1/tenants/{tenant}/agents/{agent}/{instance}` → instance record (JSON).
//!
//! Tenant, agent and instance names are validated before they reach a key (no `/`), so a
//! key always parses back into exactly the names it was built from.

/// Root of everything Agent-Reach stores.
pub const ROOT: &str = "/agent-reach/v1/tenants/";

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
    }
}
