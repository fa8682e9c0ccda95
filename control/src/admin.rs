//! The `agentreach.v1.Admin` gRPC service: what operators see and change.
//!
//! Every request names a tenant, which is validated before anything else and is the only
//! tenant whose keys the request reads or writes: a name of another tenant's agent,
//! instance or policy is simply not found, exactly as a name that exists nowhere. Reads go
//! to the store at its current revision, so an Admin change shows in the next Admin read.
//! Route explanations run the sidecars' own routing code on a table built from that read.
//! Errors become statuses in [`crate::error`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agent_reach::convert::{
    health_state_from_i32, policy_from_proto, policy_kind_from_i32, policy_to_proto, priority_from_i32,
    target_from_proto, tenant_from_proto, tenant_to_proto,
};
use agent_reach::model::{
    AgentSummary, FieldError, HealthState, HoldScope, Instance, InstanceStatus, validate_name, validate_tag,
    validate_tenant,
};
use agent_reach::proto;
use agent_reach::proto::admin_server::Admin;
use agent_reach_routing::RoutingTable;
use tonic::{Request, Response, Status};

use crate::error::ControlError;
use crate::identity::JoinTokens;
use crate::identity::operators::{self, Action, OperatorAuth, Principal, Role};
use crate::registry::{Registry, TenantView, hold_from_request};

/// Candidates an explanation returns when the request does not say.
const DEFAULT_CANDIDATES: usize = 5;

/// The Admin service.
pub struct AdminService {
    registry: Arc<Registry>,
    tokens: Arc<JoinTokens>,
    auth: Arc<OperatorAuth>,
    /// Session contexts, for `GetSession` (none: refused as UNAVAILABLE).
    sessions: Option<Arc<dyn agent_reach_session::SessionStore>>,
}

/// The `authorization` header of a request.
fn authorization<T>(request: &Request<T>) -> Option<String> {
    request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string)
}

impl AdminService {
    pub fn new(registry: Arc<Registry>, tokens: Arc<JoinTokens>, auth: Arc<OperatorAuth>) -> AdminService {
        AdminService { registry, tokens, auth, sessions: None }
    }

    /// Serves `GetSession` from `store`.
    pub fn with_sessions(mut self, store: Arc<dyn agent_reach_session::SessionStore>) -> AdminService {
        self.sessions = Some(store);
        self
    }

    /// Checks a read of `tenant` (`None`: cluster-wide).
    async fn read(&self, authorization: Option<String>, tenant: Option<&str>) -> Result<Principal, ControlError> {
        let who = self.auth.principal(authorization.as_deref()).await?;
        who.authorize(Action::Read, tenant)?;
        Ok(who)
    }

    /// Runs a change of `tenant` after checking the caller may make it, and writes the
    /// audit line (also of a refusal).
    async fn change<R>(
        &self,
        authorization: Option<String>,
        what: &str,
        tenant: Option<&str>,
        action: Action,
        change: impl std::future::Future<Output = Result<R, ControlError>>,
    ) -> Result<Response<R>, Status> {
        let scope = tenant.unwrap_or("(cluster)");
        let who = match self.auth.principal(authorization.as_deref()).await {
            Ok(who) => who,
            Err(e) => {
                let nobody = Principal { name: "unauthenticated".into(), role: Role::Viewer, tenants: vec![] };
                operators::audit(&nobody, what, scope, &Err::<(), _>(&e));
                return Err(e.into());
            }
        };
        if let Err(e) = who.authorize(action, tenant) {
            operators::audit(&who, what, scope, &Err::<(), _>(&e));
            return Err(e.into());
        }
        let result = change.await;
        operators::audit(&who, what, scope, &result);
        result.map(Response::new).map_err(Status::from)
    }

    async fn view(&self, tenant: &str) -> Result<TenantView, ControlError> {
        validate_tenant("tenant", tenant)?;
        self.registry.tenant_view(tenant).await
    }
}

/// Which instances a listing returns.
#[derive(Debug, Default)]
struct Filter {
    agent: Option<String>,
    capability: Option<String>,
    tags: Vec<String>,
    states: Vec<HealthState>,
}

impl Filter {
    fn from_proto(f: Option<proto::InstanceFilter>) -> Result<Filter, FieldError> {
        let Some(f) = f else { return Ok(Filter::default()) };
        let name = |field: &str, v: String| -> Result<Option<String>, FieldError> {
            if v.is_empty() {
                return Ok(None);
            }
            validate_name(field, &v)?;
            Ok(Some(v))
        };
        for (i, tag) in f.tags.iter().enumerate() {
            validate_tag(&format!("filter.tags[{i}]"), tag)?;
        }
        let states = f
            .states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                health_state_from_i32(*s)
                    .ok_or_else(|| FieldError::new(format!("filter.states[{i}]"), format!("unknown state {s}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Filter {
            agent: name("filter.agent", f.agent)?,
            capability: name("filter.capability", f.capability)?,
            tags: f.tags,
            states,
        })
    }

    fn matches(&self, status: &InstanceStatus) -> bool {
        let reg = &status.record.registration;
        if self.agent.as_ref().is_some_and(|a| a != &reg.agent) {
            return false;
        }
        if !self.states.is_empty() && !self.states.contains(&status.record.state) {
            return false;
        }
        match &self.capability {
            Some(c) => reg.capabilities.iter().any(|cap| &cap.name == c && cap.has_tags(&self.tags)),
            None => self.tags.iter().all(|t| reg.capabilities.iter().any(|cap| cap.tags.contains(t))),
        }
    }
}

fn summaries(view: &TenantView, instances: &[&InstanceStatus]) -> Vec<AgentSummary> {
    let mut by_agent: BTreeMap<&str, Vec<&InstanceStatus>> = BTreeMap::new();
    for status in instances {
        by_agent.entry(status.record.registration.agent.as_str()).or_default().push(status);
    }
    by_agent
        .into_iter()
        .map(|(agent, list)| {
            let mut summary = AgentSummary::of(agent, list);
            summary.hold = view.agent_holds.get(agent).cloned();
            summary
        })
        .collect()
}

fn find_instance<'v>(view: &'v TenantView, instance_id: &str) -> Result<&'v InstanceStatus, ControlError> {
    view.instances
        .iter()
        .find(|s| s.record.instance_id == instance_id)
        .ok_or_else(|| ControlError::InstanceNotFound(instance_id.to_string()))
}

fn agent_not_found(view: &TenantView, agent: &str) -> ControlError {
    let mut names: Vec<&str> = view.instances.iter().map(|s| s.record.registration.agent.as_str()).collect();
    names.dedup();
    ControlError::AgentNotFound {
        target: format!("agent {agent}"),
        suggestions: agent_reach_routing::suggestions(names.into_iter(), agent),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_agents(
        &self,
        request: Request<proto::ListAgentsRequest>,
    ) -> Result<Response<proto::ListAgentsReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let view = self.view(&r.tenant).await?;
        let filter = Filter::from_proto(r.filter).map_err(ControlError::from)?;
        let matching: Vec<&InstanceStatus> = view.instances.iter().filter(|s| filter.matches(s)).collect();
        let agents = summaries(&view, &matching).iter().map(proto::AgentSummary::from).collect();
        Ok(Response::new(proto::ListAgentsReply { agents, revision: view.revision }))
    }

    async fn get_agent(
        &self,
        request: Request<proto::GetAgentRequest>,
    ) -> Result<Response<proto::GetAgentReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let view = self.view(&r.tenant).await?;
        validate_name("agent", &r.agent).map_err(ControlError::from)?;
        let instances: Vec<&InstanceStatus> =
            view.instances.iter().filter(|s| s.record.registration.agent == r.agent).collect();
        let Some(summary) = summaries(&view, &instances).into_iter().next() else {
            return Err(agent_not_found(&view, &r.agent).into());
        };
        Ok(Response::new(proto::GetAgentReply {
            agent: Some(proto::AgentSummary::from(&summary)),
            instances: instances.into_iter().map(proto::Instance::from).collect(),
            revision: view.revision,
        }))
    }

    async fn list_instances(
        &self,
        request: Request<proto::ListInstancesRequest>,
    ) -> Result<Response<proto::ListInstancesReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let view = self.view(&r.tenant).await?;
        let filter = Filter::from_proto(r.filter).map_err(ControlError::from)?;
        let instances = view.instances.iter().filter(|s| filter.matches(s)).map(proto::Instance::from).collect();
        Ok(Response::new(proto::ListInstancesReply { instances, revision: view.revision }))
    }

    async fn get_instance(
        &self,
        request: Request<proto::GetInstanceRequest>,
    ) -> Result<Response<proto::GetInstanceReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let view = self.view(&r.tenant).await?;
        validate_name("instance_id", &r.instance_id).map_err(ControlError::from)?;
        let status = find_instance(&view, &r.instance_id)?;
        Ok(Response::new(proto::GetInstanceReply {
            instance: Some(proto::Instance::from(status)),
            revision: view.revision,
        }))
    }

    async fn set_instance_state(
        &self,
        request: Request<proto::SetInstanceStateRequest>,
    ) -> Result<Response<proto::SetStateReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        let tenant = r.tenant.clone();
        self.change(auth, "SetInstanceState", Some(&tenant), Action::Change, async move {
            validate_tenant("tenant", &r.tenant)?;
            let hold = hold_from_request(health_state_from_i32(r.state), r.reason, HoldScope::Instance)?;
            let (status, revision) = self.registry.set_instance_hold(&r.tenant, &r.instance_id, hold).await?;
            Ok(proto::SetStateReply { instances: vec![proto::Instance::from(&status)], revision })
        })
        .await
    }

    async fn set_agent_state(
        &self,
        request: Request<proto::SetAgentStateRequest>,
    ) -> Result<Response<proto::SetStateReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        let tenant = r.tenant.clone();
        self.change(auth, "SetAgentState", Some(&tenant), Action::Change, async move {
            validate_tenant("tenant", &r.tenant)?;
            let hold = hold_from_request(health_state_from_i32(r.state), r.reason, HoldScope::Agent)?;
            let (instances, revision) = self.registry.set_agent_hold(&r.tenant, &r.agent, hold).await?;
            Ok(proto::SetStateReply { instances: instances.iter().map(proto::Instance::from).collect(), revision })
        })
        .await
    }

    async fn put_policy(
        &self,
        request: Request<proto::PutPolicyRequest>,
    ) -> Result<Response<proto::PutPolicyReply>, Status> {
        let auth = authorization(&request);
        let wire =
            request.into_inner().policy.ok_or_else(|| ControlError::from(FieldError::new("policy", "is required")))?;
        let tenant = wire.tenant.clone();
        self.change(auth, "PutPolicy", Some(&tenant), Action::Change, async move {
            let policy = policy_from_proto(wire)
                .map_err(|e| ControlError::from(FieldError::new(format!("policy.{}", e.field), e.reason)))?;
            let revision = self.registry.put_policy(&policy).await.map_err(|e| match e {
                ControlError::Invalid(f) => {
                    ControlError::Invalid(FieldError::new(format!("policy.{}", f.field), f.reason))
                }
                other => other,
            })?;
            Ok(proto::PutPolicyReply { policy: Some(policy_to_proto(&policy, revision)) })
        })
        .await
    }

    async fn get_policy(
        &self,
        request: Request<proto::GetPolicyRequest>,
    ) -> Result<Response<proto::GetPolicyReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let kind = policy_kind_from_i32("kind", r.kind).map_err(ControlError::from)?;
        let (policy, revision) = self.registry.get_policy(&r.tenant, kind, &r.name).await?;
        Ok(Response::new(proto::GetPolicyReply { policy: Some(policy_to_proto(&policy, revision)) }))
    }

    async fn get_session(
        &self,
        request: Request<proto::GetSessionRequest>,
    ) -> Result<Response<proto::GetSessionReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        validate_tenant("tenant", &r.tenant).map_err(ControlError::from)?;
        self.read(auth, Some(&r.tenant)).await?;
        let Some(sessions) = &self.sessions else {
            return Err(agent_reach::reason::status(
                agent_reach::reason::Reason::StoreUnavailable,
                "this control service serves no session contexts",
                &[],
            ));
        };
        let session = sessions.get(&r.tenant, &r.session_id).await.map_err(crate::sessions::status)?;
        Ok(Response::new(crate::sessions::session_to_proto(session, &r.fields)))
    }

    async fn list_policies(
        &self,
        request: Request<proto::ListPoliciesRequest>,
    ) -> Result<Response<proto::ListPoliciesReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let kind = match r.kind {
            0 => None,
            k => Some(policy_kind_from_i32("kind", k).map_err(ControlError::from)?),
        };
        let view = self.view(&r.tenant).await?;
        let policies = view
            .policies
            .iter()
            .filter(|(p, _)| kind.is_none_or(|k| p.kind == k))
            .map(|(p, revision)| policy_to_proto(p, *revision))
            .collect();
        Ok(Response::new(proto::ListPoliciesReply { policies, revision: view.revision }))
    }

    async fn delete_policy(
        &self,
        request: Request<proto::DeletePolicyRequest>,
    ) -> Result<Response<proto::DeletePolicyReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        let tenant = r.tenant.clone();
        self.change(auth, "DeletePolicy", Some(&tenant), Action::Change, async move {
            let kind = policy_kind_from_i32("kind", r.kind)?;
            let revision = self.registry.delete_policy(&r.tenant, kind, &r.name).await?;
            Ok(proto::DeletePolicyReply { revision })
        })
        .await
    }

    async fn put_tenant(
        &self,
        request: Request<proto::PutTenantRequest>,
    ) -> Result<Response<proto::PutTenantReply>, Status> {
        let auth = authorization(&request);
        let tenant =
            request.into_inner().tenant.ok_or_else(|| ControlError::from(FieldError::new("tenant", "is required")))?;
        let name = tenant.name.clone();
        self.change(auth, "PutTenant", Some(&name), Action::Change, async move {
            let (tenant, revision) = self.registry.put_tenant(tenant_from_proto(tenant)).await?;
            Ok(proto::PutTenantReply { tenant: Some(tenant_to_proto(&tenant, revision)) })
        })
        .await
    }

    async fn list_tenants(
        &self,
        request: Request<proto::ListTenantsRequest>,
    ) -> Result<Response<proto::ListTenantsReply>, Status> {
        self.read(authorization(&request), None).await?;
        let tenants = self.registry.list_tenants().await?;
        Ok(Response::new(proto::ListTenantsReply {
            tenants: tenants.iter().map(|(t, revision)| tenant_to_proto(t, *revision)).collect(),
        }))
    }

    async fn create_join_token(
        &self,
        request: Request<proto::CreateJoinTokenRequest>,
    ) -> Result<Response<proto::CreateJoinTokenReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        let tenant = r.tenant.clone();
        self.change(auth, "CreateJoinToken", Some(&tenant), Action::Change, async move {
            let ttl = std::time::Duration::from_millis(r.ttl_ms);
            let created = self.tokens.create(&r.tenant, ttl, r.single_use, &r.description).await?;
            Ok(proto::CreateJoinTokenReply { token: Some(join_token_to_proto(&created.token)), secret: created.secret })
        })
        .await
    }

    async fn list_join_tokens(
        &self,
        request: Request<proto::ListJoinTokensRequest>,
    ) -> Result<Response<proto::ListJoinTokensReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        let tokens = self.tokens.list(&r.tenant).await?;
        Ok(Response::new(proto::ListJoinTokensReply { tokens: tokens.iter().map(join_token_to_proto).collect() }))
    }

    async fn revoke_join_token(
        &self,
        request: Request<proto::RevokeJoinTokenRequest>,
    ) -> Result<Response<proto::RevokeJoinTokenReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        let tenant = r.tenant.clone();
        self.change(auth, "RevokeJoinToken", Some(&tenant), Action::Change, async move {
            let token = self.tokens.revoke(&r.tenant, &r.id).await?;
            Ok(proto::RevokeJoinTokenReply { token: Some(join_token_to_proto(&token)) })
        })
        .await
    }

    async fn create_operator_token(
        &self,
        request: Request<proto::CreateOperatorTokenRequest>,
    ) -> Result<Response<proto::CreateOperatorTokenReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.change(auth, "CreateOperatorToken", None, Action::ManageTokens, async move {
            let role = role_from_proto(r.role)?;
            let ttl = std::time::Duration::from_millis(r.ttl_ms);
            let (token, secret) = self.auth.create(role, r.tenants, ttl, &r.description).await?;
            Ok(proto::CreateOperatorTokenReply { token: Some(operator_token_to_proto(&token)), secret })
        })
        .await
    }

    async fn list_operator_tokens(
        &self,
        request: Request<proto::ListOperatorTokensRequest>,
    ) -> Result<Response<proto::ListOperatorTokensReply>, Status> {
        let who = self.auth.principal(authorization(&request).as_deref()).await?;
        who.authorize(Action::ManageTokens, None)?;
        let tokens = self.auth.list().await?;
        Ok(Response::new(proto::ListOperatorTokensReply {
            tokens: tokens.iter().map(operator_token_to_proto).collect(),
        }))
    }

    async fn revoke_operator_token(
        &self,
        request: Request<proto::RevokeOperatorTokenRequest>,
    ) -> Result<Response<proto::RevokeOperatorTokenReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.change(auth, "RevokeOperatorToken", None, Action::ManageTokens, async move {
            let token = self.auth.revoke(&r.id).await?;
            Ok(proto::RevokeOperatorTokenReply { token: Some(operator_token_to_proto(&token)) })
        })
        .await
    }

    async fn explain_route(
        &self,
        request: Request<proto::ExplainRouteRequest>,
    ) -> Result<Response<proto::ExplainRouteReply>, Status> {
        let auth = authorization(&request);
        let r = request.into_inner();
        self.read(auth, Some(&r.tenant)).await?;
        validate_tenant("tenant", &r.tenant).map_err(ControlError::from)?;
        let target = target_from_proto(r.target).map_err(ControlError::from)?;
        let view = self.view(&r.tenant).await?;
        let statuses: HashMap<&str, &InstanceStatus> =
            view.instances.iter().map(|s| (s.record.instance_id.as_str(), s)).collect();
        let instances: HashMap<String, Arc<Instance>> =
            view.instances.iter().map(|s| (s.record.instance_id.clone(), Arc::new(s.instance()))).collect();
        let policies: agent_reach_routing::table::Policies =
            view.policies.iter().map(|(p, _)| ((p.kind, p.name.clone()), Arc::new(p.clone()))).collect();
        let table = RoutingTable::build(view.revision, instances, policies, None);
        if let Err(agent_reach_routing::RouteError::NotFound { target, suggestions }) =
            agent_reach_routing::resolve(&table, &target)
        {
            return Err(ControlError::AgentNotFound { target, suggestions }.into());
        }
        let max = if r.max_candidates == 0 { DEFAULT_CANDIDATES } else { r.max_candidates as usize };
        let request = agent_reach_routing::PickRequest {
            target: &target,
            priority: priority_from_i32(r.priority),
            hash_key: (!r.session_id.is_empty()).then_some(r.session_id.as_str()),
            exclude: &[],
            // As the sidecars' own Route answers: before a canary split picks a version.
            version: None,
            now: agent_reach_routing::clock(),
            prefer: None,
        };
        let explanation = agent_reach_routing::explain(&table, &request, max);
        Ok(Response::new(proto::ExplainRouteReply {
            candidates: explanation
                .candidates
                .iter()
                .map(|c| proto::RouteCandidate {
                    instance: Some(match statuses.get(c.member.id()) {
                        Some(status) => proto::Instance::from(*status),
                        None => proto::Instance::from(&*c.member.instance),
                    }),
                    score: c.score,
                    note: c.note.clone(),
                })
                .collect(),
            skipped: explanation.skipped.into_iter().map(proto::SkippedInstance::from).collect(),
            revision: view.revision,
            strategy: explanation.strategy.unwrap_or_default().as_str().to_string(),
        }))
    }
}

/// A stored join token on the wire (never with its secret or hash).
fn join_token_to_proto(t: &crate::identity::JoinToken) -> proto::JoinToken {
    proto::JoinToken {
        id: t.id.clone(),
        tenant: t.tenant.clone(),
        created_unix_ms: t.created_ms as i64,
        expires_unix_ms: t.expires_ms as i64,
        single_use: t.single_use,
        used_by: t.used_by.clone().unwrap_or_default(),
        revoked_unix_ms: t.revoked_ms.unwrap_or(0) as i64,
        description: t.description.clone(),
    }
}

fn role_from_proto(role: i32) -> Result<Role, FieldError> {
    match proto::OperatorRole::try_from(role) {
        Ok(proto::OperatorRole::Viewer) => Ok(Role::Viewer),
        Ok(proto::OperatorRole::Operator) => Ok(Role::Operator),
        Ok(proto::OperatorRole::Admin) => Ok(Role::Admin),
        _ => Err(FieldError::new("role", "must be viewer, operator or admin")),
    }
}

/// A stored operator token on the wire (never with its secret or hash).
fn operator_token_to_proto(t: &operators::OperatorToken) -> proto::OperatorToken {
    proto::OperatorToken {
        id: t.id.clone(),
        role: match t.role {
            Role::Viewer => proto::OperatorRole::Viewer,
            Role::Operator => proto::OperatorRole::Operator,
            Role::Admin => proto::OperatorRole::Admin,
        } as i32,
        tenants: t.tenants.clone(),
        created_unix_ms: t.created_ms as i64,
        expires_unix_ms: t.expires_ms as i64,
        revoked_unix_ms: t.revoked_ms.unwrap_or(0) as i64,
        description: t.description.clone(),
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::fixture;

    use super::*;

    fn status(agent: &str, caps: &[(&str, &[&str])], state: HealthState) -> InstanceStatus {
        InstanceStatus {
            record: caps
                .iter()
                .fold(fixture::instance(&format!("{agent}-1")).tenant("t").agent(agent).state(state), |b, (n, tags)| {
                    b.capability(n, tags)
                })
                .record(),
            revision: 1,
            reported_state: state,
            holds: vec![],
            generation: 1,
        }
    }

    #[test]
    fn filters_match_capability_tags_and_states() {
        let s = status("tr", &[("text.translate", &["zh", "en"]), ("text.detect", &["fr"])], HealthState::Up);
        let f = |agent: &str, cap: &str, tags: &[&str], states: &[proto::HealthState]| {
            Filter::from_proto(Some(proto::InstanceFilter {
                agent: agent.into(),
                capability: cap.into(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                states: states.iter().map(|s| *s as i32).collect(),
            }))
            .unwrap()
        };
        assert!(f("", "", &[], &[]).matches(&s));
        assert!(f("tr", "text.translate", &["zh"], &[proto::HealthState::Up]).matches(&s));
        assert!(!f("other", "", &[], &[]).matches(&s));
        assert!(!f("", "text.translate", &["fr"], &[]).matches(&s));
        // Without a capability, tags may come from any capability.
        assert!(f("", "", &["fr", "zh"], &[]).matches(&s));
        assert!(!f("", "", &[], &[proto::HealthState::Paused, proto::HealthState::Down]).matches(&s));
        let bad = Filter::from_proto(Some(proto::InstanceFilter { agent: "a/b".into(), ..Default::default() }));
        assert_eq!(bad.unwrap_err().field, "filter.agent");
        let bad = Filter::from_proto(Some(proto::InstanceFilter { states: vec![0], ..Default::default() }));
        assert_eq!(bad.unwrap_err().field, "filter.states[0]");
    }

    /// The fields of every event on the `audit` target.
    #[derive(Clone, Default)]
    struct AuditLines(Arc<std::sync::Mutex<Vec<std::collections::BTreeMap<String, String>>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditLines {
        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);
            impl tracing::field::Visit for Fields<'_> {
                fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                    self.0.insert(field.name().to_string(), value.to_string());
                }
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    self.0.insert(field.name().to_string(), format!("{value:?}"));
                }
            }
            if event.metadata().target() == "audit" {
                let mut fields = std::collections::BTreeMap::new();
                event.record(&mut Fields(&mut fields));
                self.0.lock().unwrap().push(fields);
            }
        }
    }

    #[tokio::test]
    async fn every_change_and_every_refused_change_writes_an_audit_line() {
        use tracing_subscriber::layer::SubscriberExt;
        let lines = AuditLines::default();
        // A current-thread runtime: every event of the test is on this thread.
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(lines.clone()));
        let store: Arc<dyn agent_reach_store::Store> = Arc::new(agent_reach_store::EmbeddedStore::default());
        let stats = Arc::new(crate::stats::ControlStats::default());
        let feeds = Arc::new(crate::feed::Feeds::new(store.clone(), stats.clone(), 64));
        let config = crate::registry::RegistryConfig {
            lease_ttl: std::time::Duration::from_secs(4),
            load_step: 0.1,
            load_report_interval: std::time::Duration::from_secs(5),
        };
        let registry = Arc::new(Registry::new(store.clone(), config, stats, feeds));
        let auth = Arc::new(OperatorAuth::new(store.clone(), "boot-secret"));
        let (viewer, viewer_secret) =
            auth.create(Role::Viewer, vec![], std::time::Duration::ZERO, "").await.expect("viewer token");
        let admin = AdminService::new(registry, Arc::new(JoinTokens::new(store.clone())), auth);
        let create = |token: Option<&str>| {
            let mut request =
                Request::new(proto::CreateJoinTokenRequest { tenant: "team-a".into(), ..Default::default() });
            if let Some(token) = token {
                request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
            }
            request
        };
        let refused = admin.create_join_token(create(None)).await.expect_err("no token");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let refused = admin.create_join_token(create(Some(&viewer_secret))).await.expect_err("a viewer");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        admin.create_join_token(create(Some("boot-secret"))).await.expect("the bootstrap admin");
        // A read writes no audit line.
        let mut list = Request::new(proto::ListJoinTokensRequest { tenant: "team-a".into() });
        list.metadata_mut().insert("authorization", "Bearer boot-secret".parse().unwrap());
        assert_eq!(admin.list_join_tokens(list).await.expect("list").into_inner().tokens.len(), 1);

        let lines = lines.0.lock().unwrap().clone();
        let seen: Vec<_> = lines
            .iter()
            .map(|l| (l["who"].as_str(), l["role"].as_str(), l["what"].as_str(), l["tenant"].as_str()))
            .collect();
        let viewer_name = format!("token:{}", viewer.id);
        assert_eq!(
            seen,
            [
                ("unauthenticated", "viewer", "CreateJoinToken", "team-a"),
                (viewer_name.as_str(), "viewer", "CreateJoinToken", "team-a"),
                ("bootstrap", "admin", "CreateJoinToken", "team-a"),
            ]
        );
        assert_ne!(lines[0]["result"], "ok");
        assert!(lines[1]["result"].contains("role"), "the refusal names its reason: {}", lines[1]["result"]);
        assert_eq!(lines[2]["result"], "ok");
    }
}
