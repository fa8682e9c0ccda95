//! Cross-tenant grants at control: `Control.LookupGranted` gives a sidecar the instances of
//! another tenant's capability, and only when both tenants granted it: the caller tenant's
//! tenant policy lists the target in `egress`, and the target capability's policy lists the
//! caller tenant in `authorization.allowed_tenants`. No tenant's Watch ever carries another
//! tenant's instances; this lookup is the one way a sidecar learns them.
//!
//! Denials are PERMISSION_DENIED `NOT_AUTHORIZED` naming the policy that lacks the grant,
//! qualified by its tenant (`team-a/tenant/default`, `team-b/capability/work`), the
//! caller's side checked first. Finer rules (which agents of the caller tenant) are the
//! target sidecar's to enforce on every call.

use agent_reach::model::{FieldError, validate_name, validate_tenant};
use agent_reach::policy::{PolicyKind, egress_allows};
use agent_reach::proto;

use crate::error::ControlError;
use crate::registry::Registry;

/// The instances of `capability` of `target_tenant` that `caller_tenant` may call, if both
/// grants exist.
pub async fn lookup(
    registry: &Registry,
    caller_tenant: &str,
    target_tenant: &str,
    capability: &str,
) -> Result<proto::LookupGrantedReply, ControlError> {
    validate_tenant("target_tenant", target_tenant)?;
    validate_name("capability", capability)?;
    if target_tenant == caller_tenant {
        return Err(
            FieldError::new("target_tenant", "is the caller's own tenant (its Watch has those instances)").into()
        );
    }
    let refused = |policy: String| ControlError::NotAuthorized {
        caller: format!("tenant {caller_tenant}"),
        target: format!("capability {target_tenant}/{capability}"),
        policy,
    };
    let egress = match registry.get_policy(caller_tenant, PolicyKind::Tenant, "default").await {
        Ok((policy, _)) => policy.spec.egress,
        Err(ControlError::PolicyNotFound { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    if !egress_allows(&egress, target_tenant, capability) {
        return Err(refused(format!("{caller_tenant}/tenant/default")));
    }
    let view = registry.tenant_view(target_tenant).await?;
    let granted = view.policies.iter().any(|(p, _)| {
        p.kind == PolicyKind::Capability
            && p.name == capability
            && p.spec.authorization.as_ref().is_some_and(|a| a.grants_tenant(caller_tenant))
    });
    if !granted {
        return Err(refused(format!("{target_tenant}/capability/{capability}")));
    }
    let instances = view
        .instances
        .iter()
        .filter(|s| s.record.registration.capabilities.iter().any(|c| c.name == capability))
        .map(proto::Instance::from)
        .collect();
    Ok(proto::LookupGrantedReply { instances, revision: view.revision })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use agent_reach::model::fixture;
    use agent_reach::policy::{Authorization, Policy, PolicySpec};
    use agent_reach::reason::Reason;
    use agent_reach_store::{EmbeddedStore, Store};

    use super::*;
    use crate::feed::Feeds;
    use crate::registry::{NewInstance, RegistryConfig};
    use crate::stats::ControlStats;

    fn registry() -> Registry {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let stats = Arc::new(ControlStats::default());
        let feeds = Arc::new(Feeds::new(store.clone(), stats.clone(), 64));
        let config = RegistryConfig {
            lease_ttl: Duration::from_secs(30),
            load_step: 0.1,
            load_report_interval: Duration::from_secs(5),
        };
        Registry::new(store, config, stats, feeds)
    }

    fn policy(tenant: &str, kind: PolicyKind, name: &str, spec: PolicySpec) -> Policy {
        Policy { tenant: tenant.into(), kind, name: name.into(), spec, description: String::new() }
    }

    fn refused_by(r: Result<proto::LookupGrantedReply, ControlError>) -> String {
        match r {
            Err(ControlError::NotAuthorized { policy, .. }) => policy,
            other => panic!("expected NOT_AUTHORIZED, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn instances_of_another_tenant_come_only_with_both_grants() {
        let registry = registry();
        for (tenant, id, cap) in [("team-b", "w-1", "work"), ("team-b", "o-1", "other"), ("team-a", "p-1", "work")] {
            registry
                .register(NewInstance {
                    tenant: tenant.into(),
                    instance_id: id.into(),
                    sidecar_id: "s".into(),
                    sidecar_address: "127.0.0.1:1".into(),
                    registration: fixture::registration("agent").capability(cap, &[]).registration(),
                    state: agent_reach::model::HealthState::Up,
                    lease: 0,
                })
                .await
                .unwrap();
        }
        let egress = policy(
            "team-a",
            PolicyKind::Tenant,
            "default",
            PolicySpec { egress: vec!["team-b/work".into()], ..Default::default() },
        );
        let grant = policy(
            "team-b",
            PolicyKind::Capability,
            "work",
            PolicySpec {
                authorization: Some(Authorization {
                    allowed_tenants: vec!["team-a/planner".into()],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let granted = || lookup(&registry, "team-a", "team-b", "work");
        assert_eq!(refused_by(granted().await), "team-a/tenant/default", "no grant at all");
        registry.put_policy(&grant).await.unwrap();
        assert_eq!(refused_by(granted().await), "team-a/tenant/default", "only the target granted");
        registry.put_policy(&egress).await.unwrap();
        let reply = granted().await.unwrap();
        let ids: Vec<&str> = reply.instances.iter().map(|i| i.instance_id.as_str()).collect();
        assert_eq!(ids, ["w-1"], "only team-b's instances of the granted capability");
        assert!(reply.instances.iter().all(|i| i.tenant == "team-b"));
        // The egress does not cover team-b's other capability, nor team-b calling team-a.
        assert_eq!(refused_by(lookup(&registry, "team-a", "team-b", "other").await), "team-a/tenant/default");
        assert_eq!(refused_by(lookup(&registry, "team-b", "team-a", "work").await), "team-b/tenant/default");
        registry.delete_policy("team-b", PolicyKind::Capability, "work").await.unwrap();
        assert_eq!(refused_by(granted().await), "team-b/capability/work", "only the caller granted");
        let status = tonic::Status::from(granted().await.unwrap_err());
        assert_eq!(agent_reach::reason::error_info(&status).unwrap().reason, Reason::NotAuthorized.as_str());
        let own = lookup(&registry, "team-a", "team-a", "work").await.unwrap_err();
        assert!(own.to_string().contains("own tenant"), "{own}");
    }
}
