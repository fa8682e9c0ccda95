//! Calls to another tenant's capability, in the caller's sidecar. A caller names one as
//! capability `"<tenant>/<capability>"` (a name no capability of its own can have); the
//! caller's tenant is always this sidecar's, the one its certificate names.
//!
//! The call goes out only with the caller tenant's grant: its tenant policy's `egress`
//! (read from this sidecar's own table, so a revoked grant stops calls as soon as the
//! Watch delivers the change). The target's instances come from control's
//! `LookupGranted`, which answers only when the target capability's policy grants this
//! tenant too; they are kept as a small routing table of their own (offering the granted
//! capability only), looked up again when older than [`REFRESH`], and never mixed into the
//! tenant's table. The call is routed over that table by the capability's own name. The target's sidecar decides
//! every call again by its own policy (agent-level grants included).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::convert::instance_from_proto;
use agent_reach::model::{FieldError, Instance, validate_name, validate_tenant};
use agent_reach::policy::{PolicyKind, egress_allows};
use agent_reach::proto;
use agent_reach::reason::{self, Reason};
use agent_reach_routing::RoutingTable;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::control::ControlClients;
use crate::error::SidecarError;

/// A looked-up table older than this is looked up again before the next call uses it.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// Most foreign capabilities whose tables are kept (the oldest are dropped past it).
const MAX_TARGETS: usize = 256;

/// `"team-b/work"` → `("team-b", "work")`, checked; `None` for a capability of the tenant.
pub(crate) fn split(capability: &str) -> Result<Option<(&str, &str)>, FieldError> {
    let Some((tenant, name)) = capability.split_once('/') else { return Ok(None) };
    validate_tenant("target.capability", tenant)?;
    validate_name("target.capability", name)?;
    Ok(Some((tenant, name)))
}

struct Cached {
    table: Arc<RoutingTable>,
    fetched: Instant,
}

type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// The tables of the foreign capabilities this sidecar's callers use.
pub(crate) struct Foreign {
    tenant: Arc<str>,
    sidecar: proto::SidecarIdentity,
    control: Arc<ControlClients>,
    slots: Mutex<HashMap<(String, String), Slot>>,
}

impl Foreign {
    pub(crate) fn new(tenant: &str, sidecar: proto::SidecarIdentity, control: Arc<ControlClients>) -> Foreign {
        Foreign { tenant: tenant.into(), sidecar, control, slots: Mutex::default() }
    }

    /// The routing table for `capability` of `target_tenant`, if this tenant's `egress`
    /// (in `own`, its routing table) and control both allow it.
    pub(crate) async fn table(
        &self,
        own: &RoutingTable,
        target_tenant: &str,
        capability: &str,
    ) -> Result<Arc<RoutingTable>, SidecarError> {
        let egress = own.tenant_policy().map(|p| p.spec.egress.as_slice()).unwrap_or_default();
        if !egress_allows(egress, target_tenant, capability) {
            return Err(SidecarError::NotAuthorized {
                caller: format!("tenant {}", self.tenant),
                target: format!("capability {target_tenant}/{capability}"),
                policy: "tenant/default".into(),
            });
        }
        let slot = self.slot(target_tenant, capability);
        let mut cached = slot.lock().await;
        if let Some(c) = cached.as_ref().filter(|c| c.fetched.elapsed() < REFRESH) {
            return Ok(c.table.clone());
        }
        match self.lookup(own, target_tenant, capability, cached.as_ref().map(|c| &*c.table)).await {
            Ok(table) => {
                *cached = Some(Cached { table: table.clone(), fetched: Instant::now() });
                Ok(table)
            }
            // Control away: the last answer routes until it is back (the target's sidecar
            // still decides every call).
            Err(status) if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) && cached.is_some() => {
                tracing::debug!(target_tenant, capability, "routing with the last granted instances: {status}");
                Ok(cached.as_ref().map(|c| c.table.clone()).unwrap_or_default())
            }
            Err(status) => {
                *cached = None;
                Err(refusal(status, &self.tenant, target_tenant, capability))
            }
        }
    }

    fn slot(&self, tenant: &str, capability: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let key = (tenant.to_string(), capability.to_string());
        if !slots.contains_key(&key) && slots.len() >= MAX_TARGETS {
            // Unused ones first: a slot nobody holds has no call waiting on it.
            let idle: Vec<_> =
                slots.iter().filter(|(_, s)| Arc::strong_count(s) == 1).map(|(k, _)| k.clone()).collect();
            for k in idle.into_iter().take(MAX_TARGETS / 4 + 1) {
                slots.remove(&k);
            }
        }
        slots.entry(key).or_default().clone()
    }

    async fn lookup(
        &self,
        own: &RoutingTable,
        target_tenant: &str,
        capability: &str,
        previous: Option<&RoutingTable>,
    ) -> Result<Arc<RoutingTable>, Status> {
        let request = proto::LookupGrantedRequest {
            tenant: self.tenant.to_string(),
            sidecar: Some(self.sidecar.clone()),
            target_tenant: target_tenant.to_string(),
            capability: capability.to_string(),
        };
        let reply = self
            .control
            .call(|mut client| {
                let request = request.clone();
                async move { client.lookup_granted(request).await }
            })
            .await?;
        Ok(Arc::new(granted_table(own, target_tenant, capability, reply, previous)))
    }
}

/// The table of a lookup's instances: only those of `target_tenant`, each offering only
/// the granted capability; with this tenant's own tenant policy (its tenant-wide rate limit
/// covers foreign calls too).
fn granted_table(
    own: &RoutingTable,
    target_tenant: &str,
    capability: &str,
    reply: proto::LookupGrantedReply,
    previous: Option<&RoutingTable>,
) -> RoutingTable {
    let instances: HashMap<String, Arc<Instance>> = reply
        .instances
        .into_iter()
        .filter(|i| i.tenant == target_tenant)
        .filter_map(|i| instance_from_proto(i).ok())
        .filter_map(|mut i| {
            let reg = &mut i.record.registration;
            reg.capabilities.retain(|c| c.name == capability);
            (!reg.capabilities.is_empty()).then(|| (i.record.instance_id.clone(), Arc::new(i)))
        })
        .collect();
    let policies = own.tenant_policy().map(|p| ((PolicyKind::Tenant, "default".to_string()), p.clone())).into_iter();
    RoutingTable::build(reply.revision, instances, policies.collect(), previous)
}

/// What the caller sees when control did not give the instances.
fn refusal(status: Status, tenant: &str, target_tenant: &str, capability: &str) -> SidecarError {
    let info = reason::error_info(&status);
    let detail = |key: &str| info.as_ref().and_then(|i| i.metadata.get(key).cloned());
    match info.as_ref().and_then(|i| Reason::parse(&i.reason)) {
        Some(Reason::NotAuthorized) => SidecarError::NotAuthorized {
            caller: detail("caller").unwrap_or_else(|| format!("tenant {tenant}")),
            target: detail("target").unwrap_or_else(|| format!("capability {target_tenant}/{capability}")),
            policy: detail("policy").unwrap_or_default(),
        },
        _ if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) => {
            SidecarError::ControlUnavailable(status.message().to_string())
        }
        _ => SidecarError::Internal(format!(
            "control did not give the instances of {target_tenant}/{capability}: {:?} {}",
            status.code(),
            status.message()
        )),
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::fixture;
    use agent_reach::policy::{Policy, PolicySpec};

    use super::*;

    fn instance(tenant: &str, id: &str, caps: &[&str]) -> proto::Instance {
        let mut reg = fixture::registration("worker");
        for c in caps {
            reg = reg.capability(c, &[]);
        }
        proto::Instance {
            instance_id: id.into(),
            tenant: tenant.into(),
            registration: Some(reg.registration().into()),
            sidecar_id: "s".into(),
            sidecar_address: "127.0.0.1:1".into(),
            state: proto::HealthState::Up as i32,
            ..Default::default()
        }
    }

    #[test]
    fn a_foreign_capability_is_tenant_slash_name() {
        assert_eq!(split("work"), Ok(None));
        assert_eq!(split("team-b/work"), Ok(Some(("team-b", "work"))));
        assert_eq!(split("Team_B/work").unwrap_err().field, "target.capability");
        assert_eq!(split("team-b/a/b").unwrap_err().field, "target.capability");
        assert_eq!(split("team-b/").unwrap_err().field, "target.capability");
    }

    #[test]
    fn the_granted_table_holds_the_target_tenants_instances_of_the_capability_only() {
        let tenant_policy = Policy {
            tenant: "team-a".into(),
            kind: PolicyKind::Tenant,
            name: "default".into(),
            spec: PolicySpec { egress: vec!["team-b/work".into()], ..Default::default() },
            description: String::new(),
        };
        let own = RoutingTable::build(
            3,
            HashMap::new(),
            agent_reach_routing::table::Policies::from_iter([(
                (PolicyKind::Tenant, "default".to_string()),
                Arc::new(tenant_policy),
            )]),
            None,
        );
        let reply = proto::LookupGrantedReply {
            instances: vec![
                instance("team-b", "w-1", &["work", "secret"]),
                instance("team-c", "x-1", &["work"]),
                instance("team-b", "o-1", &["other"]),
            ],
            revision: 9,
        };
        let t = granted_table(&own, "team-b", "work", reply, None);
        assert_eq!(t.revision, 9);
        let ids: Vec<&str> = t.instances.keys().map(String::as_str).collect();
        assert_eq!(ids, ["w-1"], "another tenant's instance and one without the capability are dropped");
        let caps: Vec<&str> = t.by_capability.keys().map(String::as_str).collect();
        assert_eq!(caps, ["work"], "only the granted capability");
        assert!(t.tenant_policy().is_some(), "the caller tenant's own tenant policy");
    }

    #[test]
    fn controls_refusal_keeps_its_policy() {
        let status = reason::status(
            Reason::NotAuthorized,
            "no",
            &[
                ("caller", "tenant team-a".into()),
                ("target", "capability team-b/work".into()),
                ("policy", "team-b/capability/work".into()),
            ],
        );
        match refusal(status, "team-a", "team-b", "work") {
            SidecarError::NotAuthorized { policy, target, .. } => {
                assert_eq!((policy.as_str(), target.as_str()), ("team-b/capability/work", "capability team-b/work"));
            }
            other => panic!("unexpected {other}"),
        }
        let e = refusal(Status::unavailable("down"), "team-a", "team-b", "work");
        assert_eq!(e.reason(), Reason::ControlUnavailable);
    }
}
