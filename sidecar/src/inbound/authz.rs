//! Authorization in the target's sidecar: whether the call's caller may call the local
//! instance, by the policies of the capability the call was routed by and of the instance's
//! agent (each that has an `authorization` must allow the caller; when neither has one, the
//! tenant policy's decides; when no policy has one, every caller of the tenant may call).
//!
//! The caller is the agent its own sidecar verified and vouched for over mutual TLS
//! (`InboundCall::caller`), never a name written in the call; without one the call is
//! anonymous. A refusal is PERMISSION_DENIED `NOT_AUTHORIZED` naming the policy, reaches
//! no agent, and is not retried on another instance (the same policy holds there).
//!
//! A caller of another tenant (its sidecar's certificate names that tenant) is allowed
//! only by explicit grant ([`check_foreign`]): the call must be routed by capability, the
//! capability's policy must name the caller's tenant (or tenant/agent) in
//! `allowed_tenants`, and so must the agent's policy if it has an authorization. No
//! policy, tenant-wide or absent, ever lets another tenant in.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach::policy::{Authorization, PolicyKind};
use agent_reach_routing::{RoutingTable, TableHandle};
use tower::Service;

use crate::call::BoxFuture;
use crate::call::{Attempt, InboundCall};
use crate::error::{DeliveryError, SidecarError};
use crate::telemetry::Rejections;

/// The refusal of a call `caller` (`None`: anonymous) makes to an instance of `agent`,
/// routed by `capability` ("" when by agent name), if the policies refuse it.
pub(crate) fn check(
    table: &RoutingTable,
    caller: Option<&str>,
    agent: &str,
    capability: &str,
) -> Result<(), SidecarError> {
    let authz_of = |kind: PolicyKind, name: &str| {
        table.policy(kind, name).and_then(|p| p.spec.authorization.as_ref()).map(|a| (format!("{kind}/{name}"), a))
    };
    let mut rules: Vec<(String, &Authorization)> = Vec::with_capacity(2);
    if !capability.is_empty() {
        rules.extend(authz_of(PolicyKind::Capability, capability));
    }
    rules.extend(authz_of(PolicyKind::Agent, agent));
    if rules.is_empty() {
        rules.extend(authz_of(PolicyKind::Tenant, "default"));
    }
    match rules.into_iter().find(|(_, a)| !a.allows(caller)) {
        None => Ok(()),
        Some((policy, _)) => Err(SidecarError::NotAuthorized {
            caller: caller.map_or_else(|| "(anonymous)".to_string(), |c| format!("agent {c}")),
            target: if capability.is_empty() { format!("agent {agent}") } else { format!("capability {capability}") },
            policy,
        }),
    }
}

/// Whether another tenant's caller may be let in for `capability` at all (before the
/// instance is looked up, so a caller without a grant learns nothing about it): the
/// capability's policy names `tenant`.
pub(crate) fn foreign_granted(
    table: &RoutingTable,
    tenant: &str,
    caller: Option<&str>,
    capability: &str,
) -> Result<(), SidecarError> {
    let granted = table
        .policy(PolicyKind::Capability, capability)
        .and_then(|p| p.spec.authorization.as_ref())
        .is_some_and(|a| a.grants_tenant(tenant));
    if granted {
        return Ok(());
    }
    Err(not_authorized_foreign(tenant, caller, capability, &format!("capability/{capability}")))
}

/// The refusal of a call agent `caller` (`None`: anonymous) of another tenant `tenant`
/// makes to an instance of `agent`, routed by `capability` ("" when by agent name).
pub(crate) fn check_foreign(
    table: &RoutingTable,
    tenant: &str,
    caller: Option<&str>,
    agent: &str,
    capability: &str,
) -> Result<(), SidecarError> {
    let authz_of = |kind: PolicyKind, name: &str| table.policy(kind, name).and_then(|p| p.spec.authorization.clone());
    if capability.is_empty() {
        // Another tenant addresses capabilities; a call by agent name has no grant.
        return Err(not_authorized_foreign(tenant, caller, capability, &format!("agent/{agent}")));
    }
    let policy = format!("capability/{capability}");
    if !authz_of(PolicyKind::Capability, capability).is_some_and(|a| a.allows_foreign(tenant, caller)) {
        return Err(not_authorized_foreign(tenant, caller, capability, &policy));
    }
    match authz_of(PolicyKind::Agent, agent) {
        Some(a) if !a.allows_foreign(tenant, caller) => {
            Err(not_authorized_foreign(tenant, caller, capability, &format!("agent/{agent}")))
        }
        _ => Ok(()),
    }
}

fn not_authorized_foreign(tenant: &str, caller: Option<&str>, capability: &str, policy: &str) -> SidecarError {
    SidecarError::NotAuthorized {
        caller: caller.map_or_else(|| format!("(anonymous) of tenant {tenant}"), |c| format!("agent {tenant}/{c}")),
        target: format!("capability {capability}"),
        policy: policy.to_string(),
    }
}

/// Service: refuses calls the policies do not allow.
#[derive(Clone)]
pub(crate) struct Authorized<S> {
    /// Shared: a clone of the layer is one reference count.
    state: Arc<State>,
    inner: S,
}

struct State {
    table: TableHandle,
    rejections: Arc<Rejections>,
    /// This sidecar's tenant: a call whose caller is of another one needs a grant.
    tenant: Arc<str>,
}

/// The layer of [`Authorized`].
pub(crate) fn layer<S>(
    table: TableHandle,
    rejections: Arc<Rejections>,
    tenant: Arc<str>,
) -> impl tower::Layer<S, Service = Authorized<S>> + Clone {
    let state = Arc::new(State { table, rejections, tenant });
    tower::layer::layer_fn(move |inner| Authorized { state: state.clone(), inner })
}

impl<S> Service<InboundCall> for Authorized<S>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible, Future = BoxFuture<Result<Attempt, Infallible>>>,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let caller = call.caller.as_ref().map(|c| &*c.agent);
        let (table, agent) = (self.state.table.load(), &call.local.registration.agent);
        let refused = if *call.tenant == *self.state.tenant {
            check(&table, caller, agent, &call.capability).err()
        } else {
            check_foreign(&table, &call.tenant, caller, agent, &call.capability).err()
        };
        if let Some(e) = refused {
            let refusal = Ok(Attempt::Failed(DeliveryError::Sidecar(e)));
            return Rejections::refuse(&self.state.rejections.not_authorized, refusal);
        }
        // Allowed: the inner layer's own future is the answer (it is ready, `poll_ready`
        // above), with no future of this layer around it.
        self.inner.call(call)
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::policy::{Policy, PolicySpec};
    use agent_reach::reason::Reason;

    use super::*;

    fn policy(kind: PolicyKind, name: &str, allowed: &[&str], allow_anonymous: bool) -> Policy {
        Policy {
            tenant: "t".into(),
            kind,
            name: name.into(),
            spec: PolicySpec {
                authorization: Some(Authorization {
                    allowed_agents: allowed.iter().map(|a| a.to_string()).collect(),
                    allow_anonymous,
                    allowed_tenants: Vec::new(),
                }),
                ..Default::default()
            },
            description: String::new(),
        }
    }

    fn table(policies: Vec<Policy>) -> RoutingTable {
        let policies = policies.into_iter().map(|p| ((p.kind, p.name.clone()), Arc::new(p))).collect();
        RoutingTable::build(1, Default::default(), policies, None)
    }

    fn refused_by(t: &RoutingTable, caller: Option<&str>, agent: &str, capability: &str) -> Option<String> {
        match check(t, caller, agent, capability) {
            Ok(()) => None,
            Err(e) => {
                assert_eq!(e.reason(), Reason::NotAuthorized);
                match e {
                    SidecarError::NotAuthorized { policy, .. } => Some(policy),
                    other => panic!("unexpected {other}"),
                }
            }
        }
    }

    fn granting(kind: PolicyKind, name: &str, allowed_agents: &[&str], tenants: &[&str]) -> Policy {
        let mut p = policy(kind, name, allowed_agents, false);
        if let Some(a) = p.spec.authorization.as_mut() {
            a.allowed_tenants = tenants.iter().map(|t| t.to_string()).collect();
        }
        p
    }

    fn foreign_refused_by(t: &RoutingTable, caller: Option<&str>, agent: &str, capability: &str) -> Option<String> {
        match check_foreign(t, "team-a", caller, agent, capability) {
            Ok(()) => None,
            Err(SidecarError::NotAuthorized { policy, caller: who, .. }) => {
                assert!(who.contains("team-a"), "the refusal names the caller's tenant: {who}");
                Some(policy)
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn another_tenant_calls_only_a_capability_that_grants_it() {
        // No policy, and a tenant policy allowing everyone: neither lets another tenant in.
        let open = table(vec![policy(PolicyKind::Tenant, "default", &[], true)]);
        assert_eq!(foreign_refused_by(&open, Some("planner"), "worker", "work").as_deref(), Some("capability/work"));
        assert_eq!(refused_by(&open, Some("planner"), "worker", "work"), None, "the tenant's own callers may");
        assert!(foreign_granted(&open, "team-a", Some("planner"), "work").is_err());

        let t = table(vec![
            granting(PolicyKind::Capability, "work", &["local-only"], &["team-a/planner"]),
            granting(PolicyKind::Capability, "wide", &[], &["team-a"]),
            granting(PolicyKind::Agent, "guarded", &[], &["team-c"]),
        ]);
        assert_eq!(foreign_refused_by(&t, Some("planner"), "worker", "work"), None);
        assert!(foreign_granted(&t, "team-a", Some("planner"), "work").is_ok());
        assert_eq!(foreign_refused_by(&t, Some("intruder"), "worker", "work").as_deref(), Some("capability/work"));
        assert_eq!(foreign_refused_by(&t, None, "worker", "wide").as_deref(), Some("capability/wide"));
        assert_eq!(foreign_refused_by(&t, Some("anyone"), "worker", "wide"), None);
        // The agent's own authorization must grant the tenant too.
        assert_eq!(foreign_refused_by(&t, Some("anyone"), "guarded", "wide").as_deref(), Some("agent/guarded"));
        // By agent name there is no grant.
        assert_eq!(foreign_refused_by(&t, Some("planner"), "worker", "").as_deref(), Some("agent/worker"));
        // allowed_agents names agents of the tenant itself, never another tenant's.
        assert_eq!(foreign_refused_by(&t, Some("local-only"), "worker", "work").as_deref(), Some("capability/work"));
        assert_eq!(
            foreign_granted(&t, "team-b", Some("planner"), "work").map_err(|e| e.reason()),
            Err(Reason::NotAuthorized)
        );
    }

    #[test]
    fn without_policies_every_caller_of_the_tenant_may_call() {
        let t = table(vec![]);
        assert_eq!(refused_by(&t, None, "worker", "work"), None);
        assert_eq!(refused_by(&t, Some("anyone"), "worker", ""), None);
    }

    #[test]
    fn a_capability_policy_allows_only_its_agents_and_no_anonymous_caller() {
        let t = table(vec![policy(PolicyKind::Capability, "work", &["planner"], false)]);
        assert_eq!(refused_by(&t, Some("planner"), "worker", "work"), None);
        assert_eq!(refused_by(&t, Some("intruder"), "worker", "work").as_deref(), Some("capability/work"));
        assert_eq!(refused_by(&t, None, "worker", "work").as_deref(), Some("capability/work"));
        // Routed by agent name, the capability's policy does not apply.
        assert_eq!(refused_by(&t, Some("intruder"), "worker", ""), None);
    }

    #[test]
    fn agent_and_capability_policies_must_both_allow_and_the_tenant_policy_is_the_fallback() {
        let t = table(vec![
            policy(PolicyKind::Capability, "work", &[], true),
            policy(PolicyKind::Agent, "worker", &["planner", "auditor"], false),
            policy(PolicyKind::Tenant, "default", &["nobody"], false),
        ]);
        assert_eq!(refused_by(&t, Some("auditor"), "worker", "work"), None);
        assert_eq!(refused_by(&t, None, "worker", "work").as_deref(), Some("agent/worker"));
        assert_eq!(refused_by(&t, Some("intruder"), "worker", "").as_deref(), Some("agent/worker"));
        // Another agent without policies of its own: the tenant's decides.
        assert_eq!(refused_by(&t, Some("planner"), "other", "").as_deref(), Some("tenant/default"));
        assert_eq!(refused_by(&t, Some("nobody"), "other", ""), None);
    }
}
