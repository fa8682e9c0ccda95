//! Authorization in the target's sidecar: whether the call's caller may call the local
//! instance, by the policies of the capability the call was routed by and of the instance's
//! agent (each that has an `authorization` must allow the caller; when neither has one, the
//! tenant policy's decides; when no policy has one, every caller of the tenant may call).
//!
//! The caller is the agent its own sidecar verified and vouched for over mutual TLS
//! (`InboundCall::caller`), never a name written in the call; without one the call is
//! anonymous. A refusal is PERMISSION_DENIED `NOT_AUTHORIZED` naming the policy, reaches
//! no agent, and is not retried on another instance (the same policy holds there).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach::policy::{Authorization, PolicyKind};
use agent_reach_routing::{RoutingTable, TableHandle};
use tower::{Service, ServiceExt};

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

/// Service: refuses calls the policies do not allow.
#[derive(Clone)]
pub(crate) struct Authorized<S> {
    table: TableHandle,
    rejections: Arc<Rejections>,
    inner: S,
}

/// The layer of [`Authorized`].
pub(crate) fn layer<S>(
    table: TableHandle,
    rejections: Arc<Rejections>,
) -> impl tower::Layer<S, Service = Authorized<S>> + Clone {
    tower::layer::layer_fn(move |inner| Authorized { table: table.clone(), rejections: rejections.clone(), inner })
}

impl<S> Service<InboundCall> for Authorized<S>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let caller = call.caller.as_ref().map(|c| &*c.agent);
        let refused = check(&self.table.load(), caller, &call.local.registration.agent, &call.capability).err();
        if let Some(e) = refused {
            return Rejections::refuse(&self.rejections.not_authorized, Ok(Attempt::Failed(DeliveryError::Sidecar(e))));
        }
        Box::pin(self.inner.clone().oneshot(call))
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
