//! `agent-reach ctl`: operators' commands over the control service's Admin API.
//!
//! Every command names one tenant (`--tenant`, default `default`) and prints a
//! human-readable table, or with `--output json` the domain types as JSON (one document
//! per command). Errors print the reason and the offending field, as the API returns them,
//! and exit 2 for bad input, 1 otherwise. Several `--control` endpoints are tried in order
//! while they are unreachable. This module talks gRPC and formats output; it decides
//! nothing itself.

use std::io::Write;
use std::time::Duration;

use agent_reach::convert::{agent_summary_from_proto, instance_status_from_proto, policy_from_proto};
use agent_reach::model::{AgentSummary, HealthState, InstanceStatus, Target, TargetKind, TenantRecord};
use agent_reach::policy::{Policy, PolicyKind, PolicySpec};
use agent_reach::proto;
use agent_reach::proto::admin_client::AdminClient;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::output::row;
pub use crate::output::{CtlError, table};

/// `agent-reach ctl`: inspect and change the mesh through the control service.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Control service endpoints, comma-separated; tried in order while unreachable.
    #[arg(long, env = "AGENT_REACH_CONTROL", value_delimiter = ',', default_value = "http://127.0.0.1:7800")]
    pub control: Vec<String>,
    /// Tenant to act on.
    #[arg(long, env = "AGENT_REACH_TENANT", default_value = "default")]
    pub tenant: String,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Timeout of each request.
    #[arg(long, default_value = "5s", value_parser = agent_reach_support::duration::parse)]
    pub timeout: Duration,
    /// Trust bundle (PEM) to check the control service's certificate with: connects over
    /// TLS (for control running with --mtls required or permissive).
    #[arg(long, env = "AGENT_REACH_TRUST_BUNDLE_FILE")]
    pub trust_bundle_file: Option<std::path::PathBuf>,
    /// Trust domain of the control service's identity.
    #[arg(long, env = "AGENT_REACH_TRUST_DOMAIN", default_value = agent_reach_identity::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// File holding the operator token to send (default: $AGENT_REACH_TOKEN).
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Agents of the tenant, one line per agent name.
    Agents(Filter),
    /// One agent and its instances.
    Agent { name: String },
    /// Instances of the tenant, one line per instance.
    Instances(Filter),
    /// Join tokens: what sidecars buy their first certificate with.
    #[command(subcommand, name = "join-token")]
    JoinToken(JoinTokenCommand),
    /// One instance.
    Instance { id: String },
    /// Hold an instance or a whole agent PAUSED (drain) with a reason, until resumed.
    Pause {
        #[command(subcommand)]
        what: HoldTarget,
        /// Why (shown to other operators).
        #[arg(long)]
        reason: String,
    },
    /// Lift the hold of `pause`.
    Resume {
        #[command(subcommand)]
        what: HoldTarget,
    },
    /// Policies: put, get, list, delete.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Tenant records: put, list.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Session context: show a session's fields.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Where a sidecar of the tenant would route a call, and why every other instance of the
    /// target was skipped.
    Explain {
        /// The capability (or, with --agent, the agent name).
        target: String,
        /// TARGET names an agent, not a capability.
        #[arg(long)]
        agent: bool,
        /// Tags the instance must carry (all of them); repeat or comma-separate.
        #[arg(long = "tags", alias = "tag", value_delimiter = ',')]
        tags: Vec<String>,
        #[arg(long, value_enum, default_value_t = PriorityArg::Normal)]
        priority: PriorityArg,
        /// Session id (for consistent hashing).
        #[arg(long, default_value = "")]
        session: String,
        /// How many candidates to show.
        #[arg(long, default_value_t = 5)]
        max: u32,
    },
}

/// `ctl session ...`.
#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// A session's fields with their versions, writers and locks.
    Show {
        /// The session id.
        id: String,
    },
}

/// What `pause` and `resume` act on.
#[derive(Subcommand, Debug)]
pub enum HoldTarget {
    /// One instance, by id.
    Instance { id: String },
    /// Every instance of an agent, including ones that register later.
    Agent { name: String },
}

#[derive(Args, Debug, Default)]
pub struct Filter {
    /// Only this agent's instances.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only instances offering this capability.
    #[arg(long)]
    pub capability: Option<String>,
    /// Only instances carrying all these tags (on --capability when given); repeat or
    /// comma-separate.
    #[arg(long = "tag", alias = "tags", value_delimiter = ',')]
    pub tags: Vec<String>,
    /// Only instances in one of these states; repeat or comma-separate.
    #[arg(long = "state", value_enum, value_delimiter = ',')]
    pub states: Vec<StateArg>,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Create or replace a policy from a JSON file of its rules (the `spec` of a policy, as
    /// `policy get -o json` prints it; `-` reads standard input).
    Put {
        kind: KindArg,
        name: String,
        #[arg(long)]
        file: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    Get {
        kind: KindArg,
        name: String,
    },
    List {
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
    },
    Delete {
        kind: KindArg,
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum JoinTokenCommand {
    /// Create a join token of the tenant; prints the token (shown only once).
    Create {
        /// Lifetime, e.g. "24h" (at most 30 days).
        #[arg(long, default_value = "24h", value_parser = agent_reach_support::duration::parse)]
        ttl: Duration,
        /// The token buys one certificate only.
        #[arg(long)]
        single_use: bool,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// The tenant's join tokens (never their secrets).
    List,
    /// Revoke a join token by id.
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum TenantCommand {
    /// Create a tenant record or change its description.
    Put {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    List,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KindArg {
    Capability,
    Agent,
    Tenant,
}

impl From<KindArg> for PolicyKind {
    fn from(k: KindArg) -> PolicyKind {
        match k {
            KindArg::Capability => PolicyKind::Capability,
            KindArg::Agent => PolicyKind::Agent,
            KindArg::Tenant => PolicyKind::Tenant,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StateArg {
    Starting,
    Up,
    Degraded,
    Paused,
    Down,
    Unknown,
}

impl From<StateArg> for HealthState {
    fn from(s: StateArg) -> HealthState {
        match s {
            StateArg::Starting => HealthState::Starting,
            StateArg::Up => HealthState::Up,
            StateArg::Degraded => HealthState::Degraded,
            StateArg::Paused => HealthState::Paused,
            StateArg::Down => HealthState::Down,
            StateArg::Unknown => HealthState::Unknown,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PriorityArg {
    High,
    Normal,
    Low,
}

impl From<PriorityArg> for agent_reach::Priority {
    fn from(p: PriorityArg) -> agent_reach::Priority {
        match p {
            PriorityArg::High => agent_reach::Priority::High,
            PriorityArg::Normal => agent_reach::Priority::Normal,
            PriorityArg::Low => agent_reach::Priority::Low,
        }
    }
}

/// Runs one `ctl` command, printing to `out`.
pub async fn run(args: CtlArgs, out: &mut dyn Write) -> Result<(), CtlError> {
    let tls = match &args.trust_bundle_file {
        Some(path) => {
            let bundle = std::fs::read_to_string(path)
                .map_err(|e| CtlError::Usage(format!("--trust-bundle-file {}: {e}", path.display())))?;
            let config = agent_reach_identity::tls::bootstrap_client(&bundle, &args.trust_domain)
                .map_err(|e| CtlError::Usage(format!("--trust-bundle-file: {e}")))?;
            Some(std::sync::Arc::new(config))
        }
        None => None,
    };
    let mut admin = Admin::new(&args.control, args.timeout, tls)?;
    let token = match (&args.token_file, std::env::var("AGENT_REACH_TOKEN").ok()) {
        (Some(path), _) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| CtlError::Usage(format!("--token-file {}: {e}", path.display())))?
                .trim()
                .to_string(),
        ),
        (None, Some(token)) if !token.trim().is_empty() => Some(token.trim().to_string()),
        _ => None,
    };
    if let Some(token) = token {
        admin.bearer = Some(
            format!("Bearer {token}")
                .parse()
                .map_err(|_| CtlError::Usage("the operator token has characters a header cannot carry".into()))?,
        );
    }
    let tenant = args.tenant.clone();
    let json = args.output == Output::Json;
    match args.command {
        CtlCommand::Agents(filter) => {
            let request = proto::ListAgentsRequest { tenant, filter: Some(filter.to_proto()) };
            let reply = admin.call(request, |mut c, r| async move { c.list_agents(r).await }).await?;
            let agents = convert(reply.agents, agent_summary_from_proto)?;
            if json {
                print_json(out, &agents)?;
            } else {
                out.write_all(agents_table(&agents).as_bytes())?;
            }
        }
        CtlCommand::Agent { name } => {
            let request = proto::GetAgentRequest { tenant, agent: name };
            let reply = admin.call(request, |mut c, r| async move { c.get_agent(r).await }).await?;
            let agent = convert(reply.agent.into_iter().collect(), agent_summary_from_proto)?;
            let instances = convert(reply.instances, instance_status_from_proto)?;
            if json {
                #[derive(Serialize)]
                struct AgentView<'a> {
                    agent: Option<&'a AgentSummary>,
                    instances: &'a [InstanceStatus],
                }
                print_json(out, &AgentView { agent: agent.first(), instances: &instances })?;
            } else {
                out.write_all(agents_table(&agent).as_bytes())?;
                writeln!(out)?;
                out.write_all(instances_table(&instances).as_bytes())?;
            }
        }
        CtlCommand::Instances(filter) => {
            let request = proto::ListInstancesRequest { tenant, filter: Some(filter.to_proto()) };
            let reply = admin.call(request, |mut c, r| async move { c.list_instances(r).await }).await?;
            let instances = convert(reply.instances, instance_status_from_proto)?;
            if json {
                print_json(out, &instances)?;
            } else {
                out.write_all(instances_table(&instances).as_bytes())?;
            }
        }
        CtlCommand::Instance { id } => {
            let request = proto::GetInstanceRequest { tenant, instance_id: id };
            let reply = admin.call(request, |mut c, r| async move { c.get_instance(r).await }).await?;
            let instances = convert(reply.instance.into_iter().collect(), instance_status_from_proto)?;
            if json {
                print_json(out, &instances.first())?;
            } else {
                out.write_all(instances_table(&instances).as_bytes())?;
                for hold in instances.iter().flat_map(|i| &i.holds) {
                    writeln!(out, "held {} by the {} hold: {}", hold.state, hold.scope.as_str(), hold.reason)?;
                }
            }
        }
        CtlCommand::Pause { what, reason } => {
            let instances = set_state(&mut admin, tenant, what, proto::HealthState::Paused, reason).await?;
            report_states(out, json, "paused", &instances)?;
        }
        CtlCommand::Resume { what } => {
            let instances = set_state(&mut admin, tenant, what, proto::HealthState::Up, String::new()).await?;
            report_states(out, json, "resumed", &instances)?;
        }
        CtlCommand::Policy(command) => policy(&mut admin, tenant, command, json, out).await?,
        CtlCommand::Tenant(command) => tenants(&mut admin, command, json, out).await?,
        CtlCommand::JoinToken(command) => join_tokens(&mut admin, tenant, command, json, out).await?,
        CtlCommand::Session(SessionCommand::Show { id }) => {
            let request =
                proto::GetSessionRequest { tenant: tenant.clone(), session_id: id.clone(), ..Default::default() };
            let reply = admin.call(request, |mut c, r| async move { c.get_session(r).await }).await?;
            crate::session::show(tenant, id, reply, json, out)?
        }
        CtlCommand::Explain { target, agent, tags, priority, session, max } => {
            let target =
                Target { kind: if agent { TargetKind::Agent(target) } else { TargetKind::Capability(target) }, tags };
            let request = proto::ExplainRouteRequest {
                tenant,
                target: Some(target.clone().into()),
                max_candidates: max,
                priority: proto::Priority::from(agent_reach::Priority::from(priority)) as i32,
                session_id: session,
            };
            let reply = admin.call(request, |mut c, r| async move { c.explain_route(r).await }).await?;
            let explanation = Explanation::from_reply(&target, reply)?;
            if json {
                print_json(out, &explanation)?;
            } else {
                out.write_all(explanation.table().as_bytes())?;
            }
        }
    }
    Ok(())
}

impl Filter {
    fn to_proto(&self) -> proto::InstanceFilter {
        proto::InstanceFilter {
            agent: self.agent.clone().unwrap_or_default(),
            capability: self.capability.clone().unwrap_or_default(),
            tags: self.tags.clone(),
            states: self.states.iter().map(|s| proto::HealthState::from(HealthState::from(*s)) as i32).collect(),
        }
    }
}

async fn set_state(
    admin: &mut Admin,
    tenant: String,
    what: HoldTarget,
    state: proto::HealthState,
    reason: String,
) -> Result<Vec<InstanceStatus>, CtlError> {
    let reply = match what {
        HoldTarget::Instance { id } => {
            let request = proto::SetInstanceStateRequest { tenant, instance_id: id, state: state as i32, reason };
            admin.call(request, |mut c, r| async move { c.set_instance_state(r).await }).await?
        }
        HoldTarget::Agent { name } => {
            let request = proto::SetAgentStateRequest { tenant, agent: name, state: state as i32, reason };
            admin.call(request, |mut c, r| async move { c.set_agent_state(r).await }).await?
        }
    };
    convert(reply.instances, instance_status_from_proto)
}

fn report_states(out: &mut dyn Write, json: bool, what: &str, instances: &[InstanceStatus]) -> Result<(), CtlError> {
    if json {
        return print_json(out, &instances);
    }
    writeln!(out, "{what} {} instance(s)", instances.len())?;
    if !instances.is_empty() {
        out.write_all(instances_table(instances).as_bytes())?;
    }
    Ok(())
}

async fn policy(
    admin: &mut Admin,
    tenant: String,
    command: PolicyCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    match command {
        PolicyCommand::Put { kind, name, file, description } => {
            let text =
                if file == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(&file) }
                    .map_err(|e| CtlError::Usage(format!("--file {file}: {e}")))?;
            let spec: PolicySpec =
                serde_json::from_str(&text).map_err(|e| CtlError::Usage(format!("--file {file}: {e}")))?;
            let policy = Policy { tenant, kind: kind.into(), name, spec, description };
            // The service validates too; checking here names the field before a round trip.
            policy.validate().map_err(|e| CtlError::Usage(format!("{file}: {e}")))?;
            let request = proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(&policy, 0)) };
            let reply = admin.call(request, |mut c, r| async move { c.put_policy(r).await }).await?;
            let (policy, revision) = policy_of(reply.policy)?;
            if json {
                print_json(out, &PolicyView { policy: &policy, revision })?;
            } else {
                writeln!(out, "stored {} policy {} at revision {revision}", policy.kind, policy.name)?;
            }
        }
        PolicyCommand::Get { kind, name } => {
            let request =
                proto::GetPolicyRequest { tenant, kind: proto::PolicyKind::from(PolicyKind::from(kind)) as i32, name };
            let reply = admin.call(request, |mut c, r| async move { c.get_policy(r).await }).await?;
            let (policy, revision) = policy_of(reply.policy)?;
            if json {
                print_json(out, &PolicyView { policy: &policy, revision })?;
            } else {
                out.write_all(policies_table(&[(policy.clone(), revision)]).as_bytes())?;
                writeln!(out, "{}", serde_json::to_string_pretty(&policy.spec).unwrap_or_default())?;
            }
        }
        PolicyCommand::List { kind } => {
            let kind = kind.map_or(0, |k| proto::PolicyKind::from(PolicyKind::from(k)) as i32);
            let request = proto::ListPoliciesRequest { tenant, kind };
            let reply = admin.call(request, |mut c, r| async move { c.list_policies(r).await }).await?;
            let policies =
                reply.policies.into_iter().map(|p| policy_of(Some(p))).collect::<Result<Vec<_>, CtlError>>()?;
            if json {
                let views: Vec<PolicyView<'_>> =
                    policies.iter().map(|(p, r)| PolicyView { policy: p, revision: *r }).collect();
                print_json(out, &views)?;
            } else {
                out.write_all(policies_table(&policies).as_bytes())?;
            }
        }
        PolicyCommand::Delete { kind, name } => {
            let kind = PolicyKind::from(kind);
            let request =
                proto::DeletePolicyRequest { tenant, kind: proto::PolicyKind::from(kind) as i32, name: name.clone() };
            let reply = admin.call(request, |mut c, r| async move { c.delete_policy(r).await }).await?;
            if json {
                print_json(
                    out,
                    &serde_json::json!({ "deleted": { "kind": kind, "name": name }, "revision": reply.revision }),
                )?;
            } else {
                writeln!(out, "deleted {kind} policy {name} at revision {}", reply.revision)?;
            }
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct PolicyView<'a> {
    #[serde(flatten)]
    policy: &'a Policy,
    revision: i64,
}

fn policy_of(p: Option<proto::Policy>) -> Result<(Policy, i64), CtlError> {
    let p = p.ok_or_else(|| CtlError::Api(Status::internal("the reply carries no policy")))?;
    let revision = p.revision;
    let policy =
        policy_from_proto(p).map_err(|e| CtlError::Api(Status::internal(format!("unreadable policy: {e}"))))?;
    Ok((policy, revision))
}

async fn join_tokens(
    admin: &mut Admin,
    tenant: String,
    command: JoinTokenCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let show = |t: &proto::JoinToken| {
        let state = if t.revoked_unix_ms != 0 {
            "revoked".to_string()
        } else if !t.used_by.is_empty() {
            format!("used by {}", t.used_by)
        } else {
            "active".to_string()
        };
        serde_json::json!({
            "id": t.id, "tenant": t.tenant, "created_unix_ms": t.created_unix_ms,
            "expires_unix_ms": t.expires_unix_ms, "single_use": t.single_use, "state": state,
            "description": t.description,
        })
    };
    let write = |out: &mut dyn Write, text: String| writeln!(out, "{text}").map_err(CtlError::from);
    match command {
        JoinTokenCommand::Create { ttl, single_use, description } => {
            let request =
                proto::CreateJoinTokenRequest { tenant, ttl_ms: ttl.as_millis() as u64, single_use, description };
            let reply = admin.call(request, |mut c, r| async move { c.create_join_token(r).await }).await?;
            if json {
                let mut value = reply.token.as_ref().map(show).unwrap_or_default();
                value["token"] = serde_json::Value::String(reply.secret.clone());
                write(out, value.to_string())?;
            } else {
                write(out, reply.secret)?;
            }
        }
        JoinTokenCommand::List => {
            let request = proto::ListJoinTokensRequest { tenant };
            let reply = admin.call(request, |mut c, r| async move { c.list_join_tokens(r).await }).await?;
            for t in &reply.tokens {
                let v = show(t);
                if json {
                    write(out, v.to_string())?;
                } else {
                    write(
                        out,
                        format!(
                            "{}  expires {}  {}  {}",
                            t.id,
                            t.expires_unix_ms,
                            v["state"].as_str().unwrap_or(""),
                            t.description
                        ),
                    )?;
                }
            }
        }
        JoinTokenCommand::Revoke { id } => {
            let request = proto::RevokeJoinTokenRequest { tenant, id };
            let reply = admin.call(request, |mut c, r| async move { c.revoke_join_token(r).await }).await?;
            write(out, format!("revoked {}", reply.token.map(|t| t.id).unwrap_or_default()))?;
        }
    }
    Ok(())
}

async fn tenants(admin: &mut Admin, command: TenantCommand, json: bool, out: &mut dyn Write) -> Result<(), CtlError> {
    let tenants = match command {
        TenantCommand::Put { name, description } => {
            let request =
                proto::PutTenantRequest { tenant: Some(proto::Tenant { name, description, ..Default::default() }) };
            let reply = admin.call(request, |mut c, r| async move { c.put_tenant(r).await }).await?;
            reply.tenant.into_iter().collect::<Vec<_>>()
        }
        TenantCommand::List => {
            let reply =
                admin.call(proto::ListTenantsRequest {}, |mut c, r| async move { c.list_tenants(r).await }).await?;
            reply.tenants
        }
    };
    let tenants: Vec<TenantRecord> = tenants.into_iter().map(agent_reach::convert::tenant_from_proto).collect();
    if json {
        print_json(out, &tenants)?;
    } else {
        let mut rows = vec![row(["TENANT", "CREATED", "DESCRIPTION"])];
        for t in &tenants {
            rows.push(vec![t.name.clone(), format_ms(t.created_at_ms), t.description.clone()]);
        }
        out.write_all(table(&rows).as_bytes())?;
    }
    Ok(())
}

/// A route explanation as `ctl` prints it.
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub target: String,
    pub strategy: String,
    pub revision: i64,
    pub candidates: Vec<ExplainedCandidate>,
    pub skipped: Vec<SkippedInstance>,
}

#[derive(Debug, Serialize)]
pub struct ExplainedCandidate {
    pub instance: InstanceStatus,
    pub score: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

#[derive(Debug, Serialize)]
pub struct SkippedInstance {
    pub instance_id: String,
    pub agent: String,
    pub reason: String,
    pub detail: String,
}

impl Explanation {
    fn from_reply(target: &Target, reply: proto::ExplainRouteReply) -> Result<Explanation, CtlError> {
        let candidates = reply
            .candidates
            .into_iter()
            .map(|c| {
                let instance = instance_status_from_proto(c.instance.unwrap_or_default())
                    .map_err(|e| CtlError::Api(Status::internal(format!("unreadable instance: {e}"))))?;
                Ok(ExplainedCandidate { instance, score: c.score, note: c.note })
            })
            .collect::<Result<Vec<_>, CtlError>>()?;
        let skipped = reply
            .skipped
            .into_iter()
            .map(|s| SkippedInstance { instance_id: s.instance_id, agent: s.agent, reason: s.reason, detail: s.detail })
            .collect();
        Ok(Explanation {
            target: target.to_string(),
            strategy: reply.strategy,
            revision: reply.revision,
            candidates,
            skipped,
        })
    }

    fn table(&self) -> String {
        let mut text = format!("{} — strategy {}, revision {}\n", self.target, self.strategy, self.revision);
        if self.candidates.is_empty() {
            text.push_str("no candidate\n");
        } else {
            let mut rows = vec![row(["#", "INSTANCE", "AGENT", "VERSION", "STATE", "SCORE", "NOTE"])];
            for (i, c) in self.candidates.iter().enumerate() {
                let r = &c.instance.record;
                rows.push(vec![
                    (i + 1).to_string(),
                    r.instance_id.clone(),
                    r.registration.agent.clone(),
                    r.registration.version.clone(),
                    r.state.to_string(),
                    format!("{:.2}", c.score),
                    c.note.clone(),
                ]);
            }
            text.push_str(&table(&rows));
        }
        if !self.skipped.is_empty() {
            text.push_str("skipped:\n");
            let mut rows = vec![row(["INSTANCE", "AGENT", "REASON", "DETAIL"])];
            for s in &self.skipped {
                rows.push(vec![s.instance_id.clone(), s.agent.clone(), s.reason.clone(), s.detail.clone()]);
            }
            text.push_str(&table(&rows));
        }
        text
    }
}

fn convert<P, D>(list: Vec<P>, f: impl Fn(P) -> Result<D, agent_reach::model::FieldError>) -> Result<Vec<D>, CtlError> {
    list.into_iter()
        .map(|p| f(p).map_err(|e| CtlError::Api(Status::internal(format!("unreadable reply: {e}")))))
        .collect()
}

fn print_json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> Result<(), CtlError> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(|e| CtlError::Io(e.into()))?;
    writeln!(out)?;
    Ok(())
}

fn capabilities(caps: &[agent_reach::model::Capability]) -> String {
    caps.iter()
        .map(|c| if c.tags.is_empty() { c.name.clone() } else { format!("{}[{}]", c.name, c.tags.join(",")) })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The agents table.
pub fn agents_table(agents: &[AgentSummary]) -> String {
    let mut rows = vec![row(["AGENT", "VERSIONS", "INSTANCES", "STATES", "CAPABILITIES", "HOLD"])];
    for a in agents {
        let states = a.instances_by_state.iter().map(|(s, n)| format!("{s}:{n}")).collect::<Vec<_>>().join(",");
        rows.push(vec![
            a.agent.clone(),
            a.versions.join(","),
            a.instances.to_string(),
            states,
            capabilities(&a.capabilities),
            a.hold.as_ref().map(|h| format!("{} ({})", h.state, h.reason)).unwrap_or_default(),
        ]);
    }
    table(&rows)
}

/// The instances table (the columns of DESIGN §9's `ctl agents` sketch).
pub fn instances_table(instances: &[InstanceStatus]) -> String {
    let mut rows = vec![row(["AGENT", "VERSION", "INSTANCE", "STATE", "CAPABILITIES", "LOAD", "SIDECAR"])];
    for i in instances {
        let r = &i.record;
        let state = if i.reported_state != r.state && !i.holds.is_empty() {
            format!("{} (held; reports {})", r.state, i.reported_state)
        } else {
            r.state.to_string()
        };
        rows.push(vec![
            r.registration.agent.clone(),
            r.registration.version.clone(),
            r.instance_id.clone(),
            state,
            capabilities(&r.registration.capabilities),
            format!("{:.2}", r.load.load_ratio),
            r.sidecar_id.clone(),
        ]);
    }
    table(&rows)
}

fn policies_table(policies: &[(Policy, i64)]) -> String {
    let mut rows = vec![row(["KIND", "NAME", "REVISION", "RULES", "DESCRIPTION"])];
    for (p, revision) in policies {
        let rules = serde_json::to_value(&p.spec)
            .ok()
            .and_then(|v| {
                v.as_object().map(|o| {
                    o.iter()
                        .filter(|(_, v)| !v.is_null() && *v != &serde_json::json!(false) && *v != &serde_json::json!(0))
                        .map(|(k, _)| k.clone())
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default()
            .join(",");
        rows.push(vec![p.kind.to_string(), p.name.clone(), revision.to_string(), rules, p.description.clone()]);
    }
    table(&rows)
}

fn format_ms(ms: i64) -> String {
    // Seconds since the epoch keep the CLI free of a date library; JSON has the exact value.
    format!("{}s", ms / 1000)
}

/// Clients of the control endpoints, tried in order while unreachable.
struct Admin {
    clients: Vec<(String, AdminClient<Channel>)>,
    timeout: Duration,
    /// "Bearer <operator token>", when one is given.
    bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl Admin {
    fn new(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<Admin, CtlError> {
        let clients = endpoints
            .iter()
            .map(|e| {
                let uri = if e.contains("://") { e.clone() } else { format!("http://{e}") };
                let endpoint = Endpoint::from_shared(uri.clone())
                    .map_err(|err| CtlError::Usage(format!("--control: bad endpoint {e:?}: {err}")))?
                    .connect_timeout(timeout)
                    .timeout(timeout);
                let channel = match &tls {
                    Some(config) => endpoint.connect_with_connector_lazy(
                        agent_reach_sidecar::identity::TlsConnector::fixed(config.clone()),
                    ),
                    None => endpoint.connect_lazy(),
                };
                Ok((uri, AdminClient::new(channel)))
            })
            .collect::<Result<Vec<_>, CtlError>>()?;
        if clients.is_empty() {
            return Err(CtlError::Usage("--control: at least one endpoint is required".into()));
        }
        Ok(Admin { clients, timeout, bearer: None })
    }

    async fn call<R: Clone, T, F, Fut>(&mut self, request: R, f: F) -> Result<T, CtlError>
    where
        F: Fn(AdminClient<Channel>, tonic::Request<R>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut last = None;
        for (uri, client) in &self.clients {
            let mut request = tonic::Request::new(request.clone());
            if let Some(bearer) = &self.bearer {
                request.metadata_mut().insert("authorization", bearer.clone());
            }
            match tokio::time::timeout(self.timeout, f(client.clone(), request)).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                Ok(Err(status)) if status.code() != Code::Unavailable => return Err(CtlError::Api(status)),
                Ok(Err(status)) => last = Some(Status::unavailable(format!("{uri}: {}", status.message()))),
                Err(_) => last = Some(Status::deadline_exceeded(format!("{uri}: no answer within {:?}", self.timeout))),
            }
        }
        Err(CtlError::Api(last.unwrap_or_else(|| Status::unavailable("no control endpoint"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let text = table(&[row(["A", "BB", "C"]), row(["long value", "x", ""]), row(["y", "z", "last"])]);
        assert_eq!(text, "A           BB  C\nlong value  x\ny           z   last\n");
    }

    #[test]
    fn errors_name_the_reason_and_field() {
        let status =
            agent_reach::reason::invalid_argument("policy.spec.breaker.failure_rate", "must be between 0 and 1");
        let error = CtlError::Api(status);
        assert_eq!(error.exit_code(), 2);
        assert_eq!(
            error.to_string(),
            "INVALID_ARGUMENT: invalid policy.spec.breaker.failure_rate: must be between 0 and 1 (field policy.spec.breaker.failure_rate)"
        );
        let error = CtlError::Api(agent_reach::reason::status(
            agent_reach::reason::Reason::InstanceNotFound,
            "instance x not found",
            &[],
        ));
        assert_eq!((error.exit_code(), error.to_string().as_str()), (1, "INSTANCE_NOT_FOUND: instance x not found"));
    }
}
