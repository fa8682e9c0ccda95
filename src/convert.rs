//! The one place where domain types ([`crate::model`]) and protobuf messages
//! ([`crate::proto`]) are converted into each other.
//!
//! Conversions from the wire validate what the domain type needs and report the offending
//! field as a [`FieldError`]; they never panic on bad input.

use crate::model::{
    AgentSummary, Capability, FieldError, HealthState, HoldScope, Instance, InstanceRecord, InstanceStatus, Load,
    Priority, Registration, StateHold, Target, TargetKind, TenantRecord, Transport,
};
use crate::policy::{
    Admission, Authorization, CircuitBreaker, Fallback, Policy, PolicyKind, PolicySpec, RateLimit, RetryPolicy,
    SessionFieldRule, SessionWritePolicy, SessionWriters, Strategy, VersionSplit,
};
use crate::policy_alerts::AlertThresholds;
use crate::proto;

impl From<proto::Priority> for Priority {
    fn from(p: proto::Priority) -> Self {
        match p {
            proto::Priority::High => Priority::High,
            proto::Priority::Low => Priority::Low,
            proto::Priority::Normal | proto::Priority::Unspecified => Priority::Normal,
        }
    }
}

impl From<Priority> for proto::Priority {
    fn from(p: Priority) -> Self {
        match p {
            Priority::High => proto::Priority::High,
            Priority::Normal => proto::Priority::Normal,
            Priority::Low => proto::Priority::Low,
        }
    }
}

/// A priority from its wire value; unknown values are NORMAL.
pub fn priority_from_i32(v: i32) -> Priority {
    proto::Priority::try_from(v).map(Priority::from).unwrap_or_default()
}

impl From<HealthState> for proto::HealthState {
    fn from(s: HealthState) -> Self {
        match s {
            HealthState::Starting => proto::HealthState::Starting,
            HealthState::Up => proto::HealthState::Up,
            HealthState::Degraded => proto::HealthState::Degraded,
            HealthState::Paused => proto::HealthState::Paused,
            HealthState::Down => proto::HealthState::Down,
            HealthState::Unknown => proto::HealthState::Unknown,
        }
    }
}

/// A health state from its wire value; `None` for UNSPECIFIED or unknown values.
pub fn health_state_from_i32(v: i32) -> Option<HealthState> {
    Some(match proto::HealthState::try_from(v).ok()? {
        proto::HealthState::Unspecified => return None,
        proto::HealthState::Starting => HealthState::Starting,
        proto::HealthState::Up => HealthState::Up,
        proto::HealthState::Degraded => HealthState::Degraded,
        proto::HealthState::Paused => HealthState::Paused,
        proto::HealthState::Down => HealthState::Down,
        proto::HealthState::Unknown => HealthState::Unknown,
    })
}

impl From<Load> for proto::Load {
    fn from(l: Load) -> Self {
        proto::Load {
            in_flight: l.in_flight,
            queue_length: l.queue_length,
            load_ratio: l.load_ratio,
            avg_latency_ms: l.avg_latency_ms,
        }
    }
}

impl From<proto::Load> for Load {
    fn from(l: proto::Load) -> Self {
        Load {
            in_flight: l.in_flight,
            queue_length: l.queue_length,
            load_ratio: if l.load_ratio.is_finite() { l.load_ratio.max(0.0) } else { 0.0 },
            avg_latency_ms: l.avg_latency_ms,
        }
    }
}

impl From<Registration> for proto::AgentRegistration {
    fn from(r: Registration) -> Self {
        proto::AgentRegistration {
            agent: r.agent,
            version: r.version,
            capabilities: r
                .capabilities
                .into_iter()
                .map(|c| proto::Capability { name: c.name, tags: c.tags })
                .collect(),
            endpoint: r.endpoint,
            transport: match r.transport {
                Transport::Grpc => proto::Transport::Grpc,
                Transport::Http => proto::Transport::Http,
                Transport::A2a => proto::Transport::A2a,
            } as i32,
            max_concurrency: r.max_concurrency,
            metadata: r.metadata.into_iter().collect(),
        }
    }
}

/// A registration from the wire. Does not validate names (see [`Registration::validate`]).
pub fn registration_from_proto(field: &str, r: Option<proto::AgentRegistration>) -> Result<Registration, FieldError> {
    let r = r.ok_or_else(|| FieldError::new(field, "is required"))?;
    let transport = match proto::Transport::try_from(r.transport) {
        Ok(proto::Transport::Grpc | proto::Transport::Unspecified) => Transport::Grpc,
        Ok(proto::Transport::Http) => Transport::Http,
        Ok(proto::Transport::A2a) => Transport::A2a,
        Err(_) => {
            return Err(FieldError::new(format!("{field}.transport"), format!("unknown transport {}", r.transport)));
        }
    };
    Ok(Registration {
        agent: r.agent,
        version: r.version,
        capabilities: r.capabilities.into_iter().map(|c| Capability { name: c.name, tags: c.tags }).collect(),
        endpoint: r.endpoint,
        transport,
        max_concurrency: r.max_concurrency,
        metadata: r.metadata.into_iter().collect(),
    })
}

impl From<Target> for proto::Target {
    fn from(t: Target) -> Self {
        proto::Target {
            kind: Some(match t.kind {
                TargetKind::Agent(a) => proto::target::Kind::Agent(a),
                TargetKind::Capability(c) => proto::target::Kind::Capability(c),
            }),
            tags: t.tags,
        }
    }
}

/// A target from the wire, validated.
pub fn target_from_proto(t: Option<proto::Target>) -> Result<Target, FieldError> {
    let t = t.ok_or_else(|| FieldError::new("target", "is required (set target.agent or target.capability)"))?;
    let kind = match t.kind {
        Some(proto::target::Kind::Agent(a)) => TargetKind::Agent(a),
        Some(proto::target::Kind::Capability(c)) => TargetKind::Capability(c),
        None => return Err(FieldError::new("target", "set target.agent or target.capability")),
    };
    let target = Target { kind, tags: t.tags };
    target.validate()?;
    Ok(target)
}

impl From<&Instance> for proto::Instance {
    fn from(i: &Instance) -> Self {
        let r = &i.record;
        proto::Instance {
            instance_id: r.instance_id.clone(),
            tenant: r.tenant.clone(),
            registration: Some(r.registration.clone().into()),
            sidecar_id: r.sidecar_id.clone(),
            sidecar_address: r.sidecar_address.clone(),
            state: proto::HealthState::from(r.state) as i32,
            load: Some(r.load.into()),
            revision: i.revision,
            registered_at_ms: r.registered_at_ms,
            // Without the control service's view, the record's state is all there is.
            reported_state: proto::HealthState::from(r.state) as i32,
            holds: Vec::new(),
            generation: 0,
        }
    }
}

/// An instance from the wire (as streamed by the control service's Watch).
pub fn instance_from_proto(i: proto::Instance) -> Result<Instance, FieldError> {
    let registration = registration_from_proto("instance.registration", i.registration)?;
    let state = health_state_from_i32(i.state)
        .ok_or_else(|| FieldError::new("instance.state", format!("unknown state {}", i.state)))?;
    Ok(Instance {
        record: InstanceRecord {
            instance_id: i.instance_id,
            tenant: i.tenant,
            registration,
            sidecar_id: i.sidecar_id,
            sidecar_address: i.sidecar_address,
            state,
            load: i.load.map(Load::from).unwrap_or_default(),
            registered_at_ms: i.registered_at_ms,
        },
        revision: i.revision,
    })
}

impl From<&StateHold> for proto::StateHold {
    fn from(h: &StateHold) -> Self {
        proto::StateHold {
            state: proto::HealthState::from(h.state) as i32,
            reason: h.reason.clone(),
            scope: match h.scope {
                HoldScope::Instance => proto::HoldScope::Instance,
                HoldScope::Agent => proto::HoldScope::Agent,
            } as i32,
            set_at_ms: h.set_at_ms,
        }
    }
}

/// A hold from the wire.
pub fn state_hold_from_proto(field: &str, h: proto::StateHold) -> Result<StateHold, FieldError> {
    let state = health_state_from_i32(h.state)
        .ok_or_else(|| FieldError::new(format!("{field}.state"), format!("unknown state {}", h.state)))?;
    let scope = match proto::HoldScope::try_from(h.scope) {
        Ok(proto::HoldScope::Instance) => HoldScope::Instance,
        Ok(proto::HoldScope::Agent) => HoldScope::Agent,
        _ => return Err(FieldError::new(format!("{field}.scope"), format!("unknown scope {}", h.scope))),
    };
    Ok(StateHold { state, reason: h.reason, scope, set_at_ms: h.set_at_ms })
}

impl From<&InstanceStatus> for proto::Instance {
    fn from(s: &InstanceStatus) -> Self {
        let mut wire = proto::Instance::from(&Instance { record: s.record.clone(), revision: s.revision });
        wire.reported_state = proto::HealthState::from(s.reported_state) as i32;
        wire.holds = s.holds.iter().map(proto::StateHold::from).collect();
        wire.generation = s.generation;
        wire
    }
}

/// An instance with its reported state, holds and generation, from the wire.
pub fn instance_status_from_proto(mut i: proto::Instance) -> Result<InstanceStatus, FieldError> {
    let reported_state = health_state_from_i32(i.reported_state).unwrap_or_else(|| {
        // Senders that predate `reported_state` report only the effective state.
        health_state_from_i32(i.state).unwrap_or_default()
    });
    let holds = std::mem::take(&mut i.holds)
        .into_iter()
        .enumerate()
        .map(|(n, h)| state_hold_from_proto(&format!("instance.holds[{n}]"), h))
        .collect::<Result<Vec<_>, _>>()?;
    let generation = i.generation;
    let instance = instance_from_proto(i)?;
    Ok(InstanceStatus { record: instance.record, revision: instance.revision, reported_state, holds, generation })
}

impl From<&AgentSummary> for proto::AgentSummary {
    fn from(a: &AgentSummary) -> Self {
        proto::AgentSummary {
            agent: a.agent.clone(),
            versions: a.versions.clone(),
            capabilities: a
                .capabilities
                .iter()
                .map(|c| proto::Capability { name: c.name.clone(), tags: c.tags.clone() })
                .collect(),
            instances: a.instances,
            instances_by_state: a.instances_by_state.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            hold: a.hold.as_ref().map(proto::StateHold::from),
        }
    }
}

/// An agent summary from the wire.
pub fn agent_summary_from_proto(a: proto::AgentSummary) -> Result<AgentSummary, FieldError> {
    Ok(AgentSummary {
        agent: a.agent,
        versions: a.versions,
        capabilities: a.capabilities.into_iter().map(|c| Capability { name: c.name, tags: c.tags }).collect(),
        instances: a.instances,
        instances_by_state: a.instances_by_state.into_iter().collect(),
        hold: a.hold.map(|h| state_hold_from_proto("agent.hold", h)).transpose()?,
    })
}

/// A tenant record on the wire, with the store revision it was read at.
pub fn tenant_to_proto(t: &TenantRecord, revision: i64) -> proto::Tenant {
    proto::Tenant { name: t.name.clone(), description: t.description.clone(), created_at_ms: t.created_at_ms, revision }
}

/// A tenant record from the wire (not validated).
pub fn tenant_from_proto(t: proto::Tenant) -> TenantRecord {
    TenantRecord { name: t.name, description: t.description, created_at_ms: t.created_at_ms }
}

impl From<PolicyKind> for proto::PolicyKind {
    fn from(k: PolicyKind) -> Self {
        match k {
            PolicyKind::Capability => proto::PolicyKind::Capability,
            PolicyKind::Agent => proto::PolicyKind::Agent,
            PolicyKind::Tenant => proto::PolicyKind::Tenant,
        }
    }
}

/// A policy kind from its wire value.
pub fn policy_kind_from_i32(field: &str, v: i32) -> Result<PolicyKind, FieldError> {
    match proto::PolicyKind::try_from(v) {
        Ok(proto::PolicyKind::Capability) => Ok(PolicyKind::Capability),
        Ok(proto::PolicyKind::Agent) => Ok(PolicyKind::Agent),
        Ok(proto::PolicyKind::Tenant) => Ok(PolicyKind::Tenant),
        _ => Err(FieldError::new(field, "set CAPABILITY, AGENT or TENANT")),
    }
}

fn strategy_to_proto(s: Option<Strategy>) -> i32 {
    (match s {
        None => proto::Strategy::Unspecified,
        Some(Strategy::LeastLoaded) => proto::Strategy::LeastLoaded,
        Some(Strategy::RoundRobin) => proto::Strategy::RoundRobin,
        Some(Strategy::Random) => proto::Strategy::Random,
        Some(Strategy::Weighted) => proto::Strategy::Weighted,
        Some(Strategy::ConsistentHash) => proto::Strategy::ConsistentHash,
    }) as i32
}

fn strategy_from_proto(v: i32) -> Result<Option<Strategy>, FieldError> {
    Ok(match proto::Strategy::try_from(v) {
        Ok(proto::Strategy::Unspecified) => None,
        Ok(proto::Strategy::LeastLoaded) => Some(Strategy::LeastLoaded),
        Ok(proto::Strategy::RoundRobin) => Some(Strategy::RoundRobin),
        Ok(proto::Strategy::Random) => Some(Strategy::Random),
        Ok(proto::Strategy::Weighted) => Some(Strategy::Weighted),
        Ok(proto::Strategy::ConsistentHash) => Some(Strategy::ConsistentHash),
        Err(_) => return Err(FieldError::new("spec.strategy", format!("unknown strategy {v}"))),
    })
}

impl From<&PolicySpec> for proto::PolicySpec {
    fn from(s: &PolicySpec) -> Self {
        proto::PolicySpec {
            strategy: strategy_to_proto(s.strategy),
            hash_key: s.hash_key.clone(),
            weights: s.weights.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            default_timeout_ms: s.default_timeout_ms.unwrap_or(0),
            retry: s.retry.map(|r| proto::RetryPolicy {
                idempotent: r.idempotent,
                budget_ratio: r.budget_ratio,
                budget_min_per_second: r.budget_min_per_second,
                max_payload_bytes: r.max_payload_bytes,
            }),
            fallback: s.fallback.as_ref().map(|f| proto::Fallback {
                target: Some(match f {
                    Fallback::Capability(c) => proto::fallback::Target::Capability(c.clone()),
                    Fallback::Agent(a) => proto::fallback::Target::Agent(a.clone()),
                }),
            }),
            rate_limit: s.rate_limit.map(|r| proto::RateLimit { per_second: r.per_second, burst: r.burst }),
            breaker: s.breaker.map(|b| proto::CircuitBreaker {
                consecutive_failures: b.consecutive_failures,
                failure_rate: b.failure_rate,
                window_ms: b.window_ms,
                min_requests: b.min_requests,
                open_ms: b.open_ms,
                max_open_ms: b.max_open_ms,
                half_open_probes: b.half_open_probes,
            }),
            split: s.split.as_ref().map(|v| proto::VersionSplit {
                weights: v
                    .weights
                    .iter()
                    .map(|(version, percent)| proto::VersionWeight { version: version.clone(), percent: *percent })
                    .collect(),
                match_key: v.match_key.clone(),
                match_value: v.match_value.clone(),
                match_version: v.match_version.clone(),
            }),
            read_only: s.read_only,
            cache_ttl_ms: s.cache_ttl_ms,
            admission: s.admission.map(|a| proto::Admission {
                normal_percent: a.normal_percent,
                low_percent: a.low_percent,
                queue_length: a.queue_length,
                queue_timeout_ms: a.queue_timeout_ms,
            }),
            authorization: s.authorization.as_ref().map(|a| proto::Authorization {
                allowed_agents: a.allowed_agents.clone(),
                allow_anonymous: a.allow_anonymous,
                allowed_tenants: a.allowed_tenants.clone(),
            }),
            session: s
                .session
                .iter()
                .map(|(name, rule)| {
                    let rule = proto::SessionFieldRule {
                        policy: write_policy_to_proto(rule.policy) as i32,
                        allow_override: rule.allow_override,
                    };
                    (name.clone(), rule)
                })
                .collect(),
            alerts: (!s.alerts.is_empty()).then(|| alert_thresholds_to_proto(&s.alerts)),
            session_writers: s.session_writers.iter().map(session_writers_to_proto).collect(),
            egress: s.egress.clone(),
        }
    }
}

/// Alert thresholds on the wire.
pub fn alert_thresholds_to_proto(a: &AlertThresholds) -> proto::AlertThresholds {
    proto::AlertThresholds {
        min_healthy: a.min_healthy,
        lost_count: a.lost_count,
        lost_window_ms: a.lost_window_ms,
        fallback_calls: a.fallback_calls,
        breakers_open_percent: a.breakers_open_percent,
    }
}

/// Alert thresholds from the wire (not validated; see [`Policy::validate`]).
pub fn alert_thresholds_from_proto(a: &proto::AlertThresholds) -> AlertThresholds {
    AlertThresholds {
        min_healthy: a.min_healthy,
        lost_count: a.lost_count,
        lost_window_ms: a.lost_window_ms,
        fallback_calls: a.fallback_calls,
        breakers_open_percent: a.breakers_open_percent,
    }
}

/// A session writer rule on the wire.
pub fn session_writers_to_proto(r: &SessionWriters) -> proto::SessionWriters {
    proto::SessionWriters { fields: r.fields.clone(), agents: r.agents.clone(), capabilities: r.capabilities.clone() }
}

/// A session writer rule from the wire (not validated; see [`Policy::validate`]).
pub fn session_writers_from_proto(r: proto::SessionWriters) -> SessionWriters {
    SessionWriters { fields: r.fields, agents: r.agents, capabilities: r.capabilities }
}

/// A declared session write policy on the wire.
pub fn write_policy_to_proto(p: SessionWritePolicy) -> proto::WritePolicy {
    match p {
        SessionWritePolicy::LastWriter => proto::WritePolicy::LastWriter,
        SessionWritePolicy::FirstWriter => proto::WritePolicy::FirstWriter,
        SessionWritePolicy::CompareAndSet => proto::WritePolicy::CompareAndSet,
    }
}

/// A session write policy from the wire; `None` for UNSPECIFIED.
pub fn write_policy_from_i32(field: &str, v: i32) -> Result<Option<SessionWritePolicy>, FieldError> {
    match proto::WritePolicy::try_from(v) {
        Ok(proto::WritePolicy::Unspecified) => Ok(None),
        Ok(proto::WritePolicy::LastWriter) => Ok(Some(SessionWritePolicy::LastWriter)),
        Ok(proto::WritePolicy::FirstWriter) => Ok(Some(SessionWritePolicy::FirstWriter)),
        Ok(proto::WritePolicy::CompareAndSet) => Ok(Some(SessionWritePolicy::CompareAndSet)),
        Err(_) => Err(FieldError::new(field, format!("unknown write policy {v}"))),
    }
}

/// Policy rules from the wire (not validated; see [`Policy::validate`]).
pub fn policy_spec_from_proto(s: proto::PolicySpec) -> Result<PolicySpec, FieldError> {
    Ok(PolicySpec {
        strategy: strategy_from_proto(s.strategy)?,
        hash_key: s.hash_key,
        weights: s.weights.into_iter().collect(),
        default_timeout_ms: (s.default_timeout_ms != 0).then_some(s.default_timeout_ms),
        retry: s.retry.map(|r| RetryPolicy {
            idempotent: r.idempotent,
            budget_ratio: r.budget_ratio,
            budget_min_per_second: r.budget_min_per_second,
            max_payload_bytes: r.max_payload_bytes,
        }),
        fallback: match s.fallback {
            None => None,
            Some(proto::Fallback { target: Some(proto::fallback::Target::Capability(c)) }) => {
                Some(Fallback::Capability(c))
            }
            Some(proto::Fallback { target: Some(proto::fallback::Target::Agent(a)) }) => Some(Fallback::Agent(a)),
            Some(proto::Fallback { target: None }) => {
                return Err(FieldError::new("spec.fallback", "set fallback.capability or fallback.agent"));
            }
        },
        rate_limit: s.rate_limit.map(|r| RateLimit { per_second: r.per_second, burst: r.burst }),
        breaker: s.breaker.map(|b| CircuitBreaker {
            consecutive_failures: b.consecutive_failures,
            failure_rate: b.failure_rate,
            window_ms: b.window_ms,
            min_requests: b.min_requests,
            open_ms: b.open_ms,
            max_open_ms: b.max_open_ms,
            half_open_probes: b.half_open_probes,
        }),
        split: s.split.map(|v| VersionSplit {
            weights: v.weights.into_iter().map(|w| (w.version, w.percent)).collect(),
            match_key: v.match_key,
            match_value: v.match_value,
            match_version: v.match_version,
        }),
        read_only: s.read_only,
        cache_ttl_ms: s.cache_ttl_ms,
        admission: s.admission.map(|a| Admission {
            normal_percent: a.normal_percent,
            low_percent: a.low_percent,
            queue_length: a.queue_length,
            queue_timeout_ms: a.queue_timeout_ms,
        }),
        authorization: s.authorization.map(|a| Authorization {
            allowed_agents: a.allowed_agents,
            allow_anonymous: a.allow_anonymous,
            allowed_tenants: a.allowed_tenants,
        }),
        session: s
            .session
            .into_iter()
            .map(|(name, rule)| {
                let policy = write_policy_from_i32(&format!("spec.session.{name}.policy"), rule.policy)?;
                Ok((name, SessionFieldRule { policy: policy.unwrap_or_default(), allow_override: rule.allow_override }))
            })
            .collect::<Result<_, FieldError>>()?,
        alerts: s.alerts.as_ref().map(alert_thresholds_from_proto).unwrap_or_default(),
        session_writers: s.session_writers.into_iter().map(session_writers_from_proto).collect(),
        egress: s.egress,
    })
}

/// A policy on the wire, with the store revision it was read at.
pub fn policy_to_proto(p: &Policy, revision: i64) -> proto::Policy {
    proto::Policy {
        tenant: p.tenant.clone(),
        kind: proto::PolicyKind::from(p.kind) as i32,
        name: p.name.clone(),
        spec: Some(proto::PolicySpec::from(&p.spec)),
        revision,
        description: p.description.clone(),
    }
}

/// A policy from the wire (not validated; see [`Policy::validate`]).
pub fn policy_from_proto(p: proto::Policy) -> Result<Policy, FieldError> {
    Ok(Policy {
        tenant: p.tenant,
        kind: policy_kind_from_i32("kind", p.kind)?,
        name: p.name,
        spec: policy_spec_from_proto(p.spec.unwrap_or_default())?,
        description: p.description,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixture;
    use prost::Message;

    #[test]
    fn instance_round_trips() {
        let inst = fixture::instance("a-1")
            .agent("a")
            .version("1")
            .capability("c", &["x"])
            .max_concurrency(4)
            .metadata("k", "v")
            .state(HealthState::Degraded)
            .load(Load { in_flight: 1, queue_length: 2, load_ratio: 0.5, avg_latency_ms: 3 })
            .registered_at_ms(9)
            .revision(42)
            .build();
        assert_eq!(instance_from_proto(proto::Instance::from(&inst)).unwrap(), inst);
    }

    #[test]
    fn instance_status_round_trips() {
        let status = InstanceStatus {
            record: fixture::instance("a-1")
                .agent("a")
                .capability("c", &[])
                .state(HealthState::Paused)
                .registered_at_ms(1)
                .record(),
            revision: 5,
            reported_state: HealthState::Up,
            holds: vec![StateHold {
                state: HealthState::Paused,
                reason: "maintenance".into(),
                scope: HoldScope::Agent,
                set_at_ms: 3,
            }],
            generation: 2,
        };
        let wire = proto::Instance::from(&status);
        assert_eq!(wire.state, proto::HealthState::Paused as i32);
        assert_eq!(wire.reported_state, proto::HealthState::Up as i32);
        assert_eq!(instance_status_from_proto(wire).unwrap(), status);
        let summary = AgentSummary::of("a", [&status]);
        assert_eq!(summary.instances_by_state.get("PAUSED"), Some(&1));
        assert_eq!(summary.hold.as_ref().map(|h| h.reason.as_str()), Some("maintenance"));
        assert_eq!(agent_summary_from_proto(proto::AgentSummary::from(&summary)).unwrap(), summary);
    }

    #[test]
    fn policy_round_trips() {
        let policy = Policy {
            tenant: "default".into(),
            kind: PolicyKind::Capability,
            name: "text.summarize".into(),
            spec: PolicySpec {
                strategy: Some(Strategy::Weighted),
                hash_key: String::new(),
                weights: [("1.0".to_string(), 3), ("2.0".to_string(), 1)].into(),
                default_timeout_ms: Some(500),
                retry: Some(RetryPolicy { idempotent: true, budget_ratio: 0.1, ..Default::default() }),
                fallback: Some(Fallback::Agent("backup".into())),
                rate_limit: Some(RateLimit { per_second: 5.5, burst: 3 }),
                breaker: Some(CircuitBreaker { consecutive_failures: 3, ..Default::default() }),
                split: Some(VersionSplit {
                    weights: vec![("1.0".into(), 90), ("2.0".into(), 10)],
                    match_key: "x-canary".into(),
                    match_value: "true".into(),
                    match_version: "2.0".into(),
                }),
                read_only: true,
                cache_ttl_ms: 100,
                admission: None,
                authorization: Some(Authorization {
                    allowed_agents: vec!["planner".into()],
                    allow_anonymous: true,
                    allowed_tenants: vec!["team-b/auditor".into()],
                }),
                session: [(
                    "user_id".to_string(),
                    SessionFieldRule { policy: SessionWritePolicy::FirstWriter, allow_override: true },
                )]
                .into(),
                alerts: AlertThresholds { fallback_calls: Some(0), ..Default::default() },
                session_writers: vec![SessionWriters {
                    fields: "refund.*".into(),
                    agents: vec!["refund".into()],
                    capabilities: vec!["finance.approve".into()],
                }],
                egress: vec!["team-b/work".into(), "team-c".into()],
            },
            description: "d".into(),
        };
        let wire = policy_to_proto(&policy, 7);
        assert_eq!(wire.revision, 7);
        assert_eq!(policy_from_proto(wire).unwrap(), policy);
        assert_eq!(policy_kind_from_i32("kind", 0).unwrap_err().field, "kind");
    }

    #[test]
    fn target_requires_a_kind() {
        assert_eq!(target_from_proto(None).unwrap_err().field, "target");
        let t = proto::Target { kind: None, tags: vec![] };
        assert_eq!(target_from_proto(Some(t)).unwrap_err().field, "target");
        let t = proto::Target { kind: Some(proto::target::Kind::Capability(String::new())), tags: vec![] };
        assert_eq!(target_from_proto(Some(t)).unwrap_err().field, "target.capability");
    }

    /// The mesh forwards an InvokeRequest's bytes as a HandleRequest and appends fields
    /// 16+; an agent's HandleReply bytes become an InvokeReply the same way. Guard the
    /// shared field numbers.
    #[test]
    fn invoke_and_handle_messages_are_wire_compatible() {
        let req = proto::InvokeRequest {
            target: Some(Target::capability("c").into()),
            payload: bytes::Bytes::from_static(b"hello"),
            content_type: "text/plain".into(),
            session_id: "s".into(),
            priority: proto::Priority::High as i32,
            idempotency_key: "k".into(),
            metadata: [("a".to_string(), "b".to_string())].into(),
            message_id: "m".into(),
            caller: Some(proto::Caller { agent: "x".into(), instance_id: "x-1".into() }),
        };
        let mut wire = req.encode_to_vec();
        proto::HandleRequest { instance_id: "i".into(), attempt: 2, ..Default::default() }.encode(&mut wire).unwrap();
        let h = proto::HandleRequest::decode(&wire[..]).unwrap();
        assert_eq!(h.target, req.target);
        assert_eq!(h.payload, req.payload);
        assert_eq!(h.content_type, req.content_type);
        assert_eq!(h.session_id, req.session_id);
        assert_eq!(h.priority, req.priority);
        assert_eq!(h.idempotency_key, req.idempotency_key);
        assert_eq!(h.metadata, req.metadata);
        assert_eq!(h.message_id, req.message_id);
        assert_eq!(h.caller, req.caller);
        assert_eq!((h.instance_id.as_str(), h.attempt), ("i", 2));

        let reply = proto::HandleReply {
            payload: bytes::Bytes::from_static(b"out"),
            content_type: "text/plain".into(),
            metadata: [("m".to_string(), "n".to_string())].into(),
        };
        let mut wire = reply.encode_to_vec();
        proto::InvokeReply { instance_id: "i".into(), attempts: 1, ..Default::default() }.encode(&mut wire).unwrap();
        let r = proto::InvokeReply::decode(&wire[..]).unwrap();
        assert_eq!((r.payload, r.content_type, r.metadata), (reply.payload, reply.content_type, reply.metadata));
        assert_eq!((r.instance_id.as_str(), r.attempts), ("i", 1));
    }
}
