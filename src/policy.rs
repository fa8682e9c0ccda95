//! Policies, as the domain sees them: the routing and governance rules of a capability, an
//! agent or a whole tenant, with their defaults and validation.
//!
//! A policy is validated whole before it is stored: the first offending field is reported
//! with its path (e.g. `spec.breaker.failure_rate`) and nothing is applied. Fields that do
//! not apply to a policy's kind are rejected rather than ignored. Stored as JSON by the
//! control service; converted to protobuf in [`crate::convert`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::{FieldError, validate_name, validate_tenant};
use crate::policy_alerts::AlertThresholds;

/// What a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Calls routed by capability; the name is the capability.
    Capability,
    /// Calls routed by agent name, and admission at the agent's instances.
    Agent,
    /// The whole tenant; the name is always `default`.
    Tenant,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Capability => "capability",
            PolicyKind::Agent => "agent",
            PolicyKind::Tenant => "tenant",
        }
    }

    pub fn parse(s: &str) -> Option<PolicyKind> {
        match s {
            "capability" => Some(PolicyKind::Capability),
            "agent" => Some(PolicyKind::Agent),
            "tenant" => Some(PolicyKind::Tenant),
            _ => None,
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How calls are spread over instances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    #[default]
    LeastLoaded,
    RoundRobin,
    Random,
    Weighted,
    ConsistentHash,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastLoaded => "least_loaded",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::Weighted => "weighted",
            Strategy::ConsistentHash => "consistent_hash",
        }
    }
}

/// A token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// When a call may be retried after it reached an agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    #[serde(default)]
    pub idempotent: bool,
    /// 0 = default.
    #[serde(default)]
    pub budget_ratio: f64,
    /// 0 = default.
    #[serde(default)]
    pub budget_min_per_second: u32,
    /// 0 = default.
    #[serde(default)]
    pub max_payload_bytes: u32,
}

impl RetryPolicy {
    pub const DEFAULT_BUDGET_RATIO: f64 = 0.2;
    pub const DEFAULT_BUDGET_MIN_PER_SECOND: u32 = 10;
    pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 1024 * 1024;

    pub fn budget_ratio(&self) -> f64 {
        if self.budget_ratio > 0.0 { self.budget_ratio } else { Self::DEFAULT_BUDGET_RATIO }
    }
    pub fn budget_min_per_second(&self) -> u32 {
        if self.budget_min_per_second > 0 { self.budget_min_per_second } else { Self::DEFAULT_BUDGET_MIN_PER_SECOND }
    }
    pub fn max_payload_bytes(&self) -> u32 {
        if self.max_payload_bytes > 0 { self.max_payload_bytes } else { Self::DEFAULT_MAX_PAYLOAD_BYTES }
    }
}

/// Where a call goes when its target cannot take it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    Capability(String),
    Agent(String),
}

/// Circuit breaker settings; zero fields take the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CircuitBreaker {
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub window_ms: u32,
    pub min_requests: u32,
    pub open_ms: u32,
    pub max_open_ms: u32,
    pub half_open_probes: u32,
}

impl CircuitBreaker {
    pub fn consecutive_failures(&self) -> u32 {
        or(self.consecutive_failures, 5)
    }
    pub fn failure_rate(&self) -> f64 {
        if self.failure_rate > 0.0 { self.failure_rate } else { 0.5 }
    }
    pub fn window(&self) -> Duration {
        Duration::from_millis(u64::from(or(self.window_ms, 10_000)))
    }
    pub fn min_requests(&self) -> u32 {
        or(self.min_requests, 20)
    }
    pub fn open(&self) -> Duration {
        Duration::from_millis(u64::from(or(self.open_ms, 5_000)))
    }
    pub fn max_open(&self) -> Duration {
        Duration::from_millis(u64::from(or(self.max_open_ms, 60_000)))
    }
    pub fn half_open_probes(&self) -> u32 {
        or(self.half_open_probes, 1)
    }
}

fn or(v: u32, default: u32) -> u32 {
    if v == 0 { default } else { v }
}

/// Canary / weighted split between agent versions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VersionSplit {
    /// (version, percent), summing to 100.
    pub weights: Vec<(String, u32)>,
    pub match_key: String,
    pub match_value: String,
    pub match_version: String,
}

/// Inbound admission at an agent's instances; zero fields take the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Admission {
    pub normal_percent: u32,
    pub low_percent: u32,
    pub queue_length: u32,
    pub queue_timeout_ms: u32,
}

impl Admission {
    pub fn normal_percent(&self) -> u32 {
        or(self.normal_percent, 70)
    }
    pub fn low_percent(&self) -> u32 {
        or(self.low_percent, 30)
    }
    pub fn queue_length(&self) -> u32 {
        or(self.queue_length, 64)
    }
    pub fn queue_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(or(self.queue_timeout_ms, 100)))
    }
}

/// Who may call a capability or an agent (enforced by the target's sidecar). The caller is
/// the agent its own sidecar verified by its agent credential and vouched for over mutual
/// TLS; a call without one is anonymous.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Authorization {
    /// Agents allowed to call; empty: any verified agent of the tenant.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_agents: Vec<String>,
    /// Anonymous calls are allowed too.
    pub allow_anonymous: bool,
    /// Other tenants whose verified agents may call: "tenant" (any of its agents) or
    /// "tenant/agent"; empty: none (see [`Authorization::allows_foreign`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_tenants: Vec<String>,
}

/// Most agents one authorization may list.
pub const MAX_ALLOWED_AGENTS: usize = 1000;

impl Authorization {
    /// Whether a call from `caller` (`None`: anonymous) is allowed.
    pub fn allows(&self, caller: Option<&str>) -> bool {
        match caller {
            None => self.allow_anonymous,
            Some(agent) => self.allowed_agents.is_empty() || self.allowed_agents.iter().any(|a| a == agent),
        }
    }

    /// Whether a call from agent `agent` of another tenant `tenant` is allowed (`None`:
    /// anonymous, never allowed from another tenant).
    pub fn allows_foreign(&self, tenant: &str, agent: Option<&str>) -> bool {
        let Some(agent) = agent else { return false };
        self.allowed_tenants.iter().any(|entry| match entry.split_once('/') {
            None => entry == tenant,
            Some((t, a)) => t == tenant && a == agent,
        })
    }

    /// Whether any entry of `allowed_tenants` names `tenant` (with or without an agent).
    pub fn grants_tenant(&self, tenant: &str) -> bool {
        self.allowed_tenants.iter().any(|entry| entry.split_once('/').map_or(entry.as_str(), |(t, _)| t) == tenant)
    }
}

/// Whether a tenant policy's `egress` lets the tenant's agents call `capability` of
/// `tenant`.
pub fn egress_allows(egress: &[String], tenant: &str, capability: &str) -> bool {
    egress.iter().any(|entry| match entry.split_once('/') {
        None => entry == tenant,
        Some((t, c)) => t == tenant && c == capability,
    })
}

/// Checks one "tenant" or "tenant/name" entry of a cross-tenant grant.
fn validate_grant(field: &str, entry: &str, own: &str) -> Result<(), FieldError> {
    let (tenant, name) = match entry.split_once('/') {
        Some((t, n)) => (t, Some(n)),
        None => (entry, None),
    };
    validate_tenant(field, tenant)?;
    if let Some(n) = name {
        validate_name(field, n)?;
    }
    if tenant == own {
        return Err(FieldError::new(
            field,
            format!("names the policy's own tenant {own:?}; a grant is for other tenants"),
        ));
    }
    Ok(())
}

/// The write policy a session context field gets (see [`SessionFieldRule`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionWritePolicy {
    /// Later writes win.
    #[default]
    LastWriter,
    /// The first value stands; later writes are refused.
    FirstWriter,
    /// A write holds only if the field is still at the version the writer read.
    CompareAndSet,
}

impl SessionWritePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionWritePolicy::LastWriter => "last_writer",
            SessionWritePolicy::FirstWriter => "first_writer",
            SessionWritePolicy::CompareAndSet => "compare_and_set",
        }
    }
}

/// A session field's write policy as an agent or capability policy declares it: writes of
/// the field by that agent (or by an instance offering that capability) get `policy`, and
/// may name another policy only when `allow_override` is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionFieldRule {
    pub policy: SessionWritePolicy,
    pub allow_override: bool,
}

/// Most session fields one policy declares rules for.
pub const MAX_SESSION_RULES: usize = 256;

/// Which agents may write some session context fields (the tenant policy's
/// `session_writers`). A field a rule covers may only be written (or deleted) by a verified
/// writer whose agent the rule names, or whose instance offers a capability it names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionWriters {
    /// One field name, or a prefix ending in `*` (`refund.*`; `*` alone covers every field).
    pub fields: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// Most `session_writers` rules a tenant policy holds.
pub const MAX_SESSION_WRITER_RULES: usize = 256;

impl SessionWriters {
    /// How specifically the rule covers `field`: `None` when it does not; an exact name
    /// beats every prefix, and a longer prefix a shorter one.
    pub fn covers(&self, field: &str) -> Option<usize> {
        match self.fields.strip_suffix('*') {
            Some(prefix) => field.starts_with(prefix).then_some(prefix.len()),
            None => (self.fields == field).then_some(usize::MAX),
        }
    }

    /// The rule that decides who may write `field` (`None`: no rule covers it, anyone of
    /// the tenant may).
    pub fn deciding<'r>(rules: &'r [SessionWriters], field: &str) -> Option<&'r SessionWriters> {
        rules
            .iter()
            .filter_map(|r| r.covers(field).map(|score| (score, r)))
            .max_by_key(|(score, _)| *score)
            .map(|(_, r)| r)
    }

    /// Whether the writer `agent`, whose instance offers `capabilities`, is one the rule
    /// allows. (A writer that is not verified is never allowed; that is the caller's check.)
    pub fn allows(&self, agent: &str, capabilities: &[String]) -> bool {
        self.agents.iter().any(|a| a == agent) || self.capabilities.iter().any(|c| capabilities.contains(c))
    }
}

/// The rules of a policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicySpec {
    pub strategy: Option<Strategy>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hash_key: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, u32>,
    pub default_timeout_ms: Option<u32>,
    pub retry: Option<RetryPolicy>,
    pub fallback: Option<Fallback>,
    pub rate_limit: Option<RateLimit>,
    pub breaker: Option<CircuitBreaker>,
    pub split: Option<VersionSplit>,
    pub read_only: bool,
    pub cache_ttl_ms: u32,
    pub admission: Option<Admission>,
    /// Who may call; `None`: the tenant policy's, else any caller of the tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
    /// Write policies of session context fields, by field name (agent and capability
    /// policies).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub session: BTreeMap<String, SessionFieldRule>,
    /// Thresholds of control's alert rules (see [`crate::policy_alerts`]).
    #[serde(skip_serializing_if = "AlertThresholds::is_empty")]
    pub alerts: AlertThresholds,
    /// Which agents may write which session context fields (tenant policy).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub session_writers: Vec<SessionWriters>,
    /// Capabilities of other tenants the tenant's agents may call (tenant policy):
    /// "tenant/capability" or "tenant".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
}

/// A policy: kind, name and rules, within a tenant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    pub tenant: String,
    pub kind: PolicyKind,
    pub name: String,
    pub spec: PolicySpec,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// Longest default timeout a policy may set.
pub const MAX_DEFAULT_TIMEOUT_MS: u32 = 3_600_000;

/// The documented range of every numeric field of a policy (inclusive bounds). A policy
/// with a value outside its range is refused with the field's path and the range; zero,
/// where a field documents it as "0 = default", is always accepted. The sidecar's
/// computations stay panic-free for any value, but these ranges keep values meaningful.
pub mod ranges {
    /// `spec.weights.*`: relative weight of an agent version or instance.
    pub const WEIGHT: (u32, u32) = (0, 1_000_000);
    /// `spec.retry.budget_ratio`: retries per call allowed by the retry budget.
    pub const RETRY_BUDGET_RATIO: (f64, f64) = (0.0, 1.0);
    /// `spec.retry.budget_min_per_second`.
    pub const RETRY_BUDGET_MIN_PER_SECOND: (u32, u32) = (0, 100_000);
    /// `spec.retry.max_payload_bytes`: largest payload kept for a retry (64 MiB).
    pub const RETRY_MAX_PAYLOAD_BYTES: (u32, u32) = (0, 64 * 1024 * 1024);
    /// `spec.rate_limit.per_second`: from one call per 1,000 s to a million a second.
    pub const RATE_PER_SECOND: (f64, f64) = (0.001, 1_000_000.0);
    /// `spec.rate_limit.burst`.
    pub const RATE_BURST: (u32, u32) = (1, 1_000_000);
    /// `spec.breaker.consecutive_failures`.
    pub const BREAKER_CONSECUTIVE_FAILURES: (u32, u32) = (0, 1_000_000);
    /// `spec.breaker.failure_rate`.
    pub const BREAKER_FAILURE_RATE: (f64, f64) = (0.0, 1.0);
    /// `spec.breaker.window_ms`: up to one hour.
    pub const BREAKER_WINDOW_MS: (u32, u32) = (0, 3_600_000);
    /// `spec.breaker.min_requests`.
    pub const BREAKER_MIN_REQUESTS: (u32, u32) = (0, 1_000_000);
    /// `spec.breaker.open_ms`: up to one hour.
    pub const BREAKER_OPEN_MS: (u32, u32) = (0, 3_600_000);
    /// `spec.breaker.max_open_ms`: up to one day.
    pub const BREAKER_MAX_OPEN_MS: (u32, u32) = (0, 86_400_000);
    /// `spec.breaker.half_open_probes`.
    pub const BREAKER_HALF_OPEN_PROBES: (u32, u32) = (0, 1_000);
    /// `spec.split.weights[i].percent`.
    pub const SPLIT_PERCENT: (u32, u32) = (0, 100);
    /// `spec.cache_ttl_ms`: up to one day.
    pub const CACHE_TTL_MS: (u32, u32) = (0, 86_400_000);
    /// `spec.default_timeout_ms`.
    pub const DEFAULT_TIMEOUT_MS: (u32, u32) = (1, super::MAX_DEFAULT_TIMEOUT_MS);
    /// `spec.admission.normal_percent` and `spec.admission.low_percent`.
    pub const ADMISSION_PERCENT: (u32, u32) = (0, 100);
    /// `spec.admission.queue_length`: waiting calls per priority.
    pub const ADMISSION_QUEUE_LENGTH: (u32, u32) = (0, 100_000);
    /// `spec.admission.queue_timeout_ms`: up to one minute.
    pub const ADMISSION_QUEUE_TIMEOUT_MS: (u32, u32) = (0, 60_000);
}

fn check_u32(field: &str, value: u32, (min, max): (u32, u32)) -> Result<(), FieldError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(FieldError::new(format!("spec.{field}"), format!("must be between {min} and {max}")))
    }
}

fn check_f64(field: &str, value: f64, (min, max): (f64, f64)) -> Result<(), FieldError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(FieldError::new(format!("spec.{field}"), format!("must be a number between {min} and {max}")))
    }
}

/// Checks every numeric field of a spec against [`ranges`].
fn validate_ranges(s: &PolicySpec) -> Result<(), FieldError> {
    use ranges::*;
    for w in s.weights.values() {
        check_u32("weights", *w, WEIGHT)?;
    }
    if let Some(t) = s.default_timeout_ms {
        check_u32("default_timeout_ms", t, DEFAULT_TIMEOUT_MS)?;
    }
    if let Some(r) = &s.retry {
        check_f64("retry.budget_ratio", r.budget_ratio, RETRY_BUDGET_RATIO)?;
        check_u32("retry.budget_min_per_second", r.budget_min_per_second, RETRY_BUDGET_MIN_PER_SECOND)?;
        check_u32("retry.max_payload_bytes", r.max_payload_bytes, RETRY_MAX_PAYLOAD_BYTES)?;
    }
    if let Some(r) = &s.rate_limit {
        check_f64("rate_limit.per_second", r.per_second, RATE_PER_SECOND)?;
        check_u32("rate_limit.burst", r.burst, RATE_BURST)?;
    }
    if let Some(b) = &s.breaker {
        check_u32("breaker.consecutive_failures", b.consecutive_failures, BREAKER_CONSECUTIVE_FAILURES)?;
        check_f64("breaker.failure_rate", b.failure_rate, BREAKER_FAILURE_RATE)?;
        check_u32("breaker.window_ms", b.window_ms, BREAKER_WINDOW_MS)?;
        check_u32("breaker.min_requests", b.min_requests, BREAKER_MIN_REQUESTS)?;
        check_u32("breaker.open_ms", b.open_ms, BREAKER_OPEN_MS)?;
        check_u32("breaker.max_open_ms", b.max_open_ms, BREAKER_MAX_OPEN_MS)?;
        check_u32("breaker.half_open_probes", b.half_open_probes, BREAKER_HALF_OPEN_PROBES)?;
    }
    if let Some(split) = &s.split {
        for (i, (_, percent)) in split.weights.iter().enumerate() {
            check_u32(&format!("split.weights[{i}].percent"), *percent, SPLIT_PERCENT)?;
        }
    }
    check_u32("cache_ttl_ms", s.cache_ttl_ms, CACHE_TTL_MS)?;
    if let Some(a) = &s.admission {
        check_u32("admission.normal_percent", a.normal_percent, ADMISSION_PERCENT)?;
        check_u32("admission.low_percent", a.low_percent, ADMISSION_PERCENT)?;
        check_u32("admission.queue_length", a.queue_length, ADMISSION_QUEUE_LENGTH)?;
        check_u32("admission.queue_timeout_ms", a.queue_timeout_ms, ADMISSION_QUEUE_TIMEOUT_MS)?;
    }
    Ok(())
}

impl Policy {
    /// Checks the whole policy; the error names the first offending field.
    pub fn validate(&self) -> Result<(), FieldError> {
        validate_tenant("tenant", &self.tenant)?;
        match self.kind {
            PolicyKind::Tenant if self.name != "default" => {
                return Err(FieldError::new("name", "a tenant policy is named \"default\""));
            }
            _ => validate_name("name", &self.name)?,
        }
        if self.description.len() > 1024 {
            return Err(FieldError::new("description", "longer than 1024 bytes"));
        }
        let s = &self.spec;
        let not_for = |field: &str, kind: PolicyKind| {
            FieldError::new(format!("spec.{field}"), format!("does not apply to {kind} policies"))
        };
        if self.kind == PolicyKind::Tenant {
            let set: [(&str, bool); 12] = [
                ("strategy", s.strategy.is_some()),
                ("hash_key", !s.hash_key.is_empty()),
                ("weights", !s.weights.is_empty()),
                ("default_timeout_ms", s.default_timeout_ms.is_some()),
                ("retry", s.retry.is_some()),
                ("fallback", s.fallback.is_some()),
                ("breaker", s.breaker.is_some()),
                ("split", s.split.is_some()),
                ("read_only", s.read_only),
                ("cache_ttl_ms", s.cache_ttl_ms != 0),
                ("admission", s.admission.is_some()),
                ("session", !s.session.is_empty()),
            ];
            if let Some((field, _)) = set.iter().find(|(_, on)| *on) {
                return Err(not_for(field, self.kind));
            }
        }
        if self.kind != PolicyKind::Tenant && !s.egress.is_empty() {
            return Err(FieldError::new(
                "spec.egress",
                "applies to the tenant policy (what the tenant's agents may call)",
            ));
        }
        if self.kind == PolicyKind::Tenant && s.authorization.as_ref().is_some_and(|a| !a.allowed_tenants.is_empty()) {
            return Err(FieldError::new(
                "spec.authorization.allowed_tenants",
                "applies to capability and agent policies (other tenants are granted a capability)",
            ));
        }
        if s.egress.len() > MAX_ALLOWED_AGENTS {
            return Err(FieldError::new("spec.egress", format!("at most {MAX_ALLOWED_AGENTS} entries")));
        }
        for (i, entry) in s.egress.iter().enumerate() {
            validate_grant(&format!("spec.egress[{i}]"), entry, &self.tenant)?;
        }
        for (i, entry) in s.authorization.iter().flat_map(|a| a.allowed_tenants.iter()).enumerate() {
            validate_grant(&format!("spec.authorization.allowed_tenants[{i}]"), entry, &self.tenant)?;
        }
        if self.kind != PolicyKind::Tenant && !s.session_writers.is_empty() {
            return Err(FieldError::new(
                "spec.session_writers",
                "applies to the tenant policy (who may write a field is the same for every writer)",
            ));
        }
        if self.kind == PolicyKind::Capability && s.admission.is_some() {
            return Err(FieldError::new(
                "spec.admission",
                "admission applies to agent policies (it limits an agent's instances)",
            ));
        }
        validate_ranges(s)?;
        validate_session_rules(&s.session)?;
        s.alerts.validate(self.kind == PolicyKind::Capability)?;
        validate_session_writers(&s.session_writers)?;
        let strategy = s.strategy.unwrap_or_default();
        if !s.hash_key.is_empty() {
            if strategy != Strategy::ConsistentHash {
                return Err(FieldError::new("spec.hash_key", "only applies with strategy consistent_hash"));
            }
            validate_name("spec.hash_key", &s.hash_key)?;
        }
        if !s.weights.is_empty() && strategy != Strategy::Weighted {
            return Err(FieldError::new("spec.weights", "only applies with strategy weighted"));
        }
        if strategy == Strategy::Weighted && !s.weights.is_empty() && s.weights.values().all(|w| *w == 0) {
            return Err(FieldError::new("spec.weights", "at least one weight must be greater than 0"));
        }
        if let Some(f) = &s.fallback {
            let (field, name, same) = match f {
                Fallback::Capability(c) => {
                    ("spec.fallback.capability", c, self.kind == PolicyKind::Capability && c == &self.name)
                }
                Fallback::Agent(a) => ("spec.fallback.agent", a, self.kind == PolicyKind::Agent && a == &self.name),
            };
            validate_name(field, name)?;
            if same {
                return Err(FieldError::new(field, "a target cannot be its own fallback"));
            }
        }
        if let Some(b) = &s.breaker
            && b.max_open_ms != 0
            && b.max_open_ms < b.open_ms
        {
            return Err(FieldError::new("spec.breaker.max_open_ms", "must not be less than open_ms"));
        }
        if let Some(split) = &s.split {
            validate_split(split)?;
        }
        if s.cache_ttl_ms != 0 && !s.read_only {
            return Err(FieldError::new("spec.cache_ttl_ms", "caching requires read_only: true"));
        }
        if let Some(a) = &s.admission
            && a.low_percent > a.normal_percent()
        {
            return Err(FieldError::new("spec.admission.low_percent", "must not exceed normal_percent"));
        }
        if let Some(authz) = &s.authorization {
            if authz.allowed_agents.len() > MAX_ALLOWED_AGENTS {
                return Err(FieldError::new(
                    "spec.authorization.allowed_agents",
                    format!("at most {MAX_ALLOWED_AGENTS} agents"),
                ));
            }
            for (i, agent) in authz.allowed_agents.iter().enumerate() {
                validate_name(&format!("spec.authorization.allowed_agents[{i}]"), agent)?;
            }
            if authz.allowed_tenants.len() > MAX_ALLOWED_AGENTS {
                return Err(FieldError::new(
                    "spec.authorization.allowed_tenants",
                    format!("at most {MAX_ALLOWED_AGENTS} entries"),
                ));
            }
        }
        Ok(())
    }
}

/// Session field names as the session store accepts them: 1 to 128 of `[A-Za-z0-9._@-]`.
fn validate_session_rules(rules: &BTreeMap<String, SessionFieldRule>) -> Result<(), FieldError> {
    if rules.len() > MAX_SESSION_RULES {
        return Err(FieldError::new("spec.session", format!("at most {MAX_SESSION_RULES} fields")));
    }
    for name in rules.keys() {
        let valid = !name.is_empty()
            && name.len() <= 128
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
        if !valid {
            return Err(FieldError::new(
                "spec.session",
                format!("field name {name:?}: 1 to 128 letters, digits and . _ - @"),
            ));
        }
    }
    Ok(())
}

/// Session writer rules: at most [`MAX_SESSION_WRITER_RULES`], each covering a valid
/// field name or prefix (no two the same) and naming at least one agent or capability.
fn validate_session_writers(rules: &[SessionWriters]) -> Result<(), FieldError> {
    if rules.len() > MAX_SESSION_WRITER_RULES {
        return Err(FieldError::new("spec.session_writers", format!("at most {MAX_SESSION_WRITER_RULES} rules")));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, rule) in rules.iter().enumerate() {
        let at = |what: &str| format!("spec.session_writers[{i}].{what}");
        let name = rule.fields.strip_suffix('*').unwrap_or(&rule.fields);
        let valid = name.len() <= 128
            && (!name.is_empty() || rule.fields == "*")
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
        if !valid {
            return Err(FieldError::new(
                at("fields"),
                format!(
                    "{:?}: a field name (1 to 128 letters, digits and . _ - @), or a prefix ending in *",
                    rule.fields
                ),
            ));
        }
        if !seen.insert(rule.fields.as_str()) {
            return Err(FieldError::new(at("fields"), format!("{:?} has another rule already", rule.fields)));
        }
        if rule.agents.is_empty() && rule.capabilities.is_empty() {
            return Err(FieldError::new(at("agents"), "name at least one agent or capability"));
        }
        if rule.agents.len() + rule.capabilities.len() > MAX_ALLOWED_AGENTS {
            return Err(FieldError::new(at("agents"), format!("at most {MAX_ALLOWED_AGENTS} agents and capabilities")));
        }
        for (j, agent) in rule.agents.iter().enumerate() {
            validate_name(&at(&format!("agents[{j}]")), agent)?;
        }
        for (j, capability) in rule.capabilities.iter().enumerate() {
            validate_name(&at(&format!("capabilities[{j}]")), capability)?;
        }
    }
    Ok(())
}

fn validate_split(split: &VersionSplit) -> Result<(), FieldError> {
    let mut total = 0u32;
    for (i, (version, percent)) in split.weights.iter().enumerate() {
        if version.is_empty() {
            return Err(FieldError::new(format!("spec.split.weights[{i}].version"), "must not be empty"));
        }
        if split.weights[..i].iter().any(|(v, _)| v == version) {
            return Err(FieldError::new(format!("spec.split.weights[{i}].version"), "listed twice"));
        }
        if *percent > 100 {
            return Err(FieldError::new(format!("spec.split.weights[{i}].percent"), "must be at most 100"));
        }
        total = total.saturating_add(*percent);
    }
    if !split.weights.is_empty() && total != 100 {
        return Err(FieldError::new("spec.split.weights", format!("percentages sum to {total}, not 100")));
    }
    let matching = [&split.match_key, &split.match_value, &split.match_version];
    if matching.iter().any(|f| !f.is_empty()) && matching.iter().any(|f| f.is_empty()) {
        return Err(FieldError::new("spec.split.match_key", "match_key, match_value and match_version go together"));
    }
    if split.weights.is_empty() && split.match_key.is_empty() {
        return Err(FieldError::new("spec.split", "set weights, a metadata match, or both"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(kind: PolicyKind, name: &str, spec: PolicySpec) -> Policy {
        Policy { tenant: "default".into(), kind, name: name.into(), spec, description: String::new() }
    }

    #[test]
    fn a_full_capability_policy_is_valid() {
        let spec = PolicySpec {
            strategy: Some(Strategy::ConsistentHash),
            hash_key: "user".into(),
            default_timeout_ms: Some(2000),
            retry: Some(RetryPolicy { idempotent: true, ..Default::default() }),
            fallback: Some(Fallback::Capability("text.summarize.cheap".into())),
            rate_limit: Some(RateLimit { per_second: 100.0, burst: 20 }),
            breaker: Some(CircuitBreaker::default()),
            split: Some(VersionSplit { weights: vec![("1.0".into(), 90), ("1.1".into(), 10)], ..Default::default() }),
            read_only: true,
            cache_ttl_ms: 1000,
            ..Default::default()
        };
        assert_eq!(policy(PolicyKind::Capability, "text.summarize", spec).validate(), Ok(()));
    }

    #[test]
    fn cross_tenant_grants_name_other_tenants_and_sit_on_their_kinds_of_policy() {
        let grant = |entries: &[&str]| PolicySpec {
            authorization: Some(Authorization {
                allowed_tenants: entries.iter().map(|e| e.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let egress = |entries: &[&str]| PolicySpec {
            egress: entries.iter().map(|e| e.to_string()).collect(),
            ..Default::default()
        };
        let err = |p: Policy| p.validate().unwrap_err().field;
        assert_eq!(policy(PolicyKind::Capability, "work", grant(&["team-b", "team-c/planner"])).validate(), Ok(()));
        assert_eq!(policy(PolicyKind::Agent, "worker", grant(&["team-b"])).validate(), Ok(()));
        assert_eq!(
            err(policy(PolicyKind::Tenant, "default", grant(&["team-b"]))),
            "spec.authorization.allowed_tenants"
        );
        assert_eq!(
            err(policy(PolicyKind::Capability, "work", grant(&["Team_B"]))),
            "spec.authorization.allowed_tenants[0]"
        );
        assert_eq!(
            err(policy(PolicyKind::Capability, "work", grant(&["team-b/a b"]))),
            "spec.authorization.allowed_tenants[0]"
        );
        let own = policy(PolicyKind::Capability, "work", grant(&["team-b", "default"])).validate().unwrap_err();
        assert_eq!(own.field, "spec.authorization.allowed_tenants[1]");
        assert!(own.reason.contains("own tenant"), "{}", own.reason);
        assert_eq!(policy(PolicyKind::Tenant, "default", egress(&["team-b/work", "team-c"])).validate(), Ok(()));
        assert_eq!(err(policy(PolicyKind::Capability, "work", egress(&["team-b/work"]))), "spec.egress");
        assert_eq!(err(policy(PolicyKind::Tenant, "default", egress(&["default/work"]))), "spec.egress[0]");
        let many: Vec<String> = (0..=MAX_ALLOWED_AGENTS).map(|i| format!("t{i}")).collect();
        let many = PolicySpec { egress: many, ..Default::default() };
        assert_eq!(err(policy(PolicyKind::Tenant, "default", many)), "spec.egress");

        let a = Authorization { allowed_tenants: vec!["team-b".into(), "team-c/planner".into()], ..Default::default() };
        assert!(a.allows_foreign("team-b", Some("anyone")));
        assert!(!a.allows_foreign("team-b", None), "anonymous callers of another tenant are never allowed");
        assert!(a.allows_foreign("team-c", Some("planner")));
        assert!(!a.allows_foreign("team-c", Some("intruder")));
        assert!(!a.allows_foreign("team-d", Some("planner")));
        assert!(a.grants_tenant("team-c") && !a.grants_tenant("team-d"));
        assert!(!a.allows(Some("anyone")) || a.allowed_agents.is_empty());
        let e = ["team-b/work".to_string(), "team-c".to_string()];
        assert!(egress_allows(&e, "team-b", "work") && !egress_allows(&e, "team-b", "other"));
        assert!(egress_allows(&e, "team-c", "anything") && !egress_allows(&e, "team-d", "work"));
        let spec: PolicySpec =
            serde_json::from_str(r#"{"egress":["team-b/work"],"authorization":{"allowed_tenants":["team-c"]}}"#)
                .unwrap();
        assert_eq!(spec.egress, vec!["team-b/work".to_string()]);
        assert_eq!(spec.authorization.unwrap().allowed_tenants, vec!["team-c".to_string()]);
    }

    #[test]
    fn session_rules_apply_to_agents_and_capabilities_with_valid_field_names() {
        let rules = |name: &str| PolicySpec {
            session: [(
                name.to_string(),
                SessionFieldRule { policy: SessionWritePolicy::FirstWriter, ..Default::default() },
            )]
            .into(),
            ..Default::default()
        };
        assert_eq!(policy(PolicyKind::Agent, "intake", rules("user_id")).validate(), Ok(()));
        assert_eq!(policy(PolicyKind::Capability, "refund.decide", rules("user_id")).validate(), Ok(()));
        assert_eq!(
            policy(PolicyKind::Tenant, "default", rules("user_id")).validate().unwrap_err().field,
            "spec.session"
        );
        assert_eq!(policy(PolicyKind::Agent, "intake", rules("a/b")).validate().unwrap_err().field, "spec.session");
        let many = PolicySpec {
            session: (0..=MAX_SESSION_RULES).map(|i| (format!("f{i}"), SessionFieldRule::default())).collect(),
            ..Default::default()
        };
        assert_eq!(policy(PolicyKind::Agent, "intake", many).validate().unwrap_err().field, "spec.session");
        let json = r#"{"session":{"n":{"policy":"compare_and_set"}}}"#;
        let spec: PolicySpec = serde_json::from_str(json).unwrap();
        assert_eq!(
            spec.session["n"],
            SessionFieldRule { policy: SessionWritePolicy::CompareAndSet, allow_override: false }
        );
    }

    #[test]
    fn session_writer_rules_pick_the_most_specific_and_belong_to_the_tenant_policy() {
        let rule = |fields: &str, agents: &[&str], capabilities: &[&str]| SessionWriters {
            fields: fields.into(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        };
        let rules = vec![
            rule("*", &["ops"], &[]),
            rule("refund.*", &["refund"], &[]),
            rule("refund.approved", &[], &["finance.approve"]),
        ];
        let deciding = |field| SessionWriters::deciding(&rules, field).map(|r| r.fields.as_str());
        assert_eq!(deciding("refund.amount"), Some("refund.*"));
        assert_eq!(deciding("refund.approved"), Some("refund.approved"));
        assert_eq!(deciding("user_id"), Some("*"));
        assert_eq!(SessionWriters::deciding(&rules[1..], "user_id"), None);
        assert!(rules[1].allows("refund", &[]));
        assert!(!rules[1].allows("support", &["refund".into()]));
        assert!(rules[2].allows("support", &["a".into(), "finance.approve".into()]));
        assert!(!rules[2].allows("finance.approve", &[]));

        let spec = |rules: Vec<SessionWriters>| PolicySpec { session_writers: rules, ..Default::default() };
        assert_eq!(policy(PolicyKind::Tenant, "default", spec(rules.clone())).validate(), Ok(()));
        let refused = |kind, rules| policy(kind, "x", spec(rules)).validate().unwrap_err().field;
        assert_eq!(refused(PolicyKind::Agent, rules.clone()), "spec.session_writers");
        assert_eq!(refused(PolicyKind::Capability, rules.clone()), "spec.session_writers");
        let tenant = |rules| policy(PolicyKind::Tenant, "default", spec(rules)).validate().unwrap_err().field;
        assert_eq!(tenant(vec![rule("a/b", &["x"], &[])]), "spec.session_writers[0].fields");
        assert_eq!(tenant(vec![rule("", &["x"], &[])]), "spec.session_writers[0].fields");
        assert_eq!(tenant(vec![rule("a", &["x"], &[]), rule("a", &["y"], &[])]), "spec.session_writers[1].fields");
        assert_eq!(tenant(vec![rule("a", &[], &[])]), "spec.session_writers[0].agents");
        assert_eq!(tenant(vec![rule("a", &["x"], &["bad name"])]), "spec.session_writers[0].capabilities[0]");
        let many = (0..=MAX_SESSION_WRITER_RULES).map(|i| rule(&format!("f{i}"), &["x"], &[])).collect();
        assert_eq!(tenant(many), "spec.session_writers");
        let json = r#"{"session_writers":[{"fields":"refund.*","agents":["refund"]}]}"#;
        let parsed: PolicySpec = serde_json::from_str(json).unwrap();
        assert_eq!(parsed.session_writers, vec![rule("refund.*", &["refund"], &[])]);
    }

    #[test]
    fn bad_policies_name_the_field() {
        let cases: Vec<(PolicyKind, &str, PolicySpec, &str)> = vec![
            (PolicyKind::Tenant, "other", PolicySpec::default(), "name"),
            (
                PolicyKind::Tenant,
                "default",
                PolicySpec { strategy: Some(Strategy::Random), ..Default::default() },
                "spec.strategy",
            ),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec { admission: Some(Admission::default()), ..Default::default() },
                "spec.admission",
            ),
            (PolicyKind::Capability, "c", PolicySpec { hash_key: "k".into(), ..Default::default() }, "spec.hash_key"),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec { rate_limit: Some(RateLimit { per_second: 0.0, burst: 1 }), ..Default::default() },
                "spec.rate_limit.per_second",
            ),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec { rate_limit: Some(RateLimit { per_second: 1.0, burst: 0 }), ..Default::default() },
                "spec.rate_limit.burst",
            ),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec {
                    breaker: Some(CircuitBreaker { failure_rate: 1.5, ..Default::default() }),
                    ..Default::default()
                },
                "spec.breaker.failure_rate",
            ),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec {
                    split: Some(VersionSplit {
                        weights: vec![("a".into(), 50), ("b".into(), 40)],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "spec.split.weights",
            ),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec { fallback: Some(Fallback::Capability("c".into())), ..Default::default() },
                "spec.fallback.capability",
            ),
            (PolicyKind::Capability, "c", PolicySpec { cache_ttl_ms: 5, ..Default::default() }, "spec.cache_ttl_ms"),
            (
                PolicyKind::Capability,
                "c",
                PolicySpec { default_timeout_ms: Some(0), ..Default::default() },
                "spec.default_timeout_ms",
            ),
            (
                PolicyKind::Agent,
                "a",
                PolicySpec {
                    admission: Some(Admission { normal_percent: 20, low_percent: 30, ..Default::default() }),
                    ..Default::default()
                },
                "spec.admission.low_percent",
            ),
        ];
        for (kind, name, spec, field) in cases {
            let err = policy(kind, name, spec).validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn defaults_fill_zero_fields() {
        let b = CircuitBreaker::default();
        assert_eq!((b.consecutive_failures(), b.min_requests(), b.half_open_probes()), (5, 20, 1));
        assert_eq!(b.open(), Duration::from_secs(5));
        let a = Admission::default();
        assert_eq!((a.normal_percent(), a.low_percent(), a.queue_length()), (70, 30, 64));
        let r = RetryPolicy::default();
        assert_eq!((r.budget_ratio(), r.budget_min_per_second()), (0.2, 10));
    }

    fn capability(spec: PolicySpec) -> Policy {
        policy(PolicyKind::Capability, "c", spec)
    }

    fn agent(spec: PolicySpec) -> Policy {
        policy(PolicyKind::Agent, "a", spec)
    }

    /// Asserts `p` is refused naming `field` with `reason`.
    fn refused(p: Policy, field: &str, reason: &str) {
        let err = p.validate().unwrap_err();
        assert_eq!((err.field.as_str(), err.reason.as_str()), (field, reason), "{err}");
    }

    #[test]
    fn rate_limit_per_second_has_a_range() {
        let rl = |per_second| {
            capability(PolicySpec { rate_limit: Some(RateLimit { per_second, burst: 1 }), ..Default::default() })
        };
        for bad in [1e-30, 0.0009, -1.0, 0.0, 1_000_000.5, f64::NAN, f64::INFINITY, f64::MIN_POSITIVE] {
            refused(rl(bad), "spec.rate_limit.per_second", "must be a number between 0.001 and 1000000");
        }
        for good in [0.001, 1.0, 1_000_000.0] {
            assert_eq!(rl(good).validate(), Ok(()));
        }
    }

    #[test]
    fn rate_limit_burst_has_a_range() {
        let rl = |burst| {
            capability(PolicySpec { rate_limit: Some(RateLimit { per_second: 1.0, burst }), ..Default::default() })
        };
        for bad in [0, 1_000_001, u32::MAX] {
            refused(rl(bad), "spec.rate_limit.burst", "must be between 1 and 1000000");
        }
        assert_eq!(rl(1_000_000).validate(), Ok(()));
    }

    #[test]
    fn retry_fields_have_ranges() {
        let r = |retry| capability(PolicySpec { retry: Some(retry), ..Default::default() });
        for bad in [-0.1, 1.01, f64::NAN, f64::NEG_INFINITY] {
            refused(
                r(RetryPolicy { budget_ratio: bad, ..Default::default() }),
                "spec.retry.budget_ratio",
                "must be a number between 0 and 1",
            );
        }
        refused(
            r(RetryPolicy { budget_min_per_second: 100_001, ..Default::default() }),
            "spec.retry.budget_min_per_second",
            "must be between 0 and 100000",
        );
        refused(
            r(RetryPolicy { max_payload_bytes: 64 * 1024 * 1024 + 1, ..Default::default() }),
            "spec.retry.max_payload_bytes",
            "must be between 0 and 67108864",
        );
        let max = RetryPolicy {
            idempotent: true,
            budget_ratio: 1.0,
            budget_min_per_second: 100_000,
            max_payload_bytes: 64 * 1024 * 1024,
        };
        assert_eq!(r(max).validate(), Ok(()));
    }

    #[test]
    fn breaker_fields_have_ranges() {
        let b = |breaker| capability(PolicySpec { breaker: Some(breaker), ..Default::default() });
        let cases: [(CircuitBreaker, &str, &str); 8] = [
            (
                CircuitBreaker { consecutive_failures: 1_000_001, ..Default::default() },
                "spec.breaker.consecutive_failures",
                "must be between 0 and 1000000",
            ),
            (
                CircuitBreaker { failure_rate: f64::NAN, ..Default::default() },
                "spec.breaker.failure_rate",
                "must be a number between 0 and 1",
            ),
            (
                CircuitBreaker { failure_rate: 1.5, ..Default::default() },
                "spec.breaker.failure_rate",
                "must be a number between 0 and 1",
            ),
            (
                CircuitBreaker { window_ms: 3_600_001, ..Default::default() },
                "spec.breaker.window_ms",
                "must be between 0 and 3600000",
            ),
            (
                CircuitBreaker { min_requests: u32::MAX, ..Default::default() },
                "spec.breaker.min_requests",
                "must be between 0 and 1000000",
            ),
            (
                CircuitBreaker { open_ms: 3_600_001, ..Default::default() },
                "spec.breaker.open_ms",
                "must be between 0 and 3600000",
            ),
            (
                CircuitBreaker { max_open_ms: 86_400_001, ..Default::default() },
                "spec.breaker.max_open_ms",
                "must be between 0 and 86400000",
            ),
            (
                CircuitBreaker { half_open_probes: 1_001, ..Default::default() },
                "spec.breaker.half_open_probes",
                "must be between 0 and 1000",
            ),
        ];
        for (breaker, field, reason) in cases {
            refused(b(breaker), field, reason);
        }
        let max = CircuitBreaker {
            consecutive_failures: 1_000_000,
            failure_rate: 1.0,
            window_ms: 3_600_000,
            min_requests: 1_000_000,
            open_ms: 3_600_000,
            max_open_ms: 86_400_000,
            half_open_probes: 1_000,
        };
        assert_eq!(b(max).validate(), Ok(()));
    }

    #[test]
    fn weights_timeout_cache_and_split_have_ranges() {
        let weighted = PolicySpec {
            strategy: Some(Strategy::Weighted),
            weights: BTreeMap::from([("a".to_string(), 1_000_001)]),
            ..Default::default()
        };
        refused(capability(weighted), "spec.weights", "must be between 0 and 1000000");
        refused(
            capability(PolicySpec { default_timeout_ms: Some(3_600_001), ..Default::default() }),
            "spec.default_timeout_ms",
            "must be between 1 and 3600000",
        );
        refused(
            capability(PolicySpec { read_only: true, cache_ttl_ms: 86_400_001, ..Default::default() }),
            "spec.cache_ttl_ms",
            "must be between 0 and 86400000",
        );
        let split = VersionSplit { weights: vec![("a".into(), 101)], ..Default::default() };
        refused(
            capability(PolicySpec { split: Some(split), ..Default::default() }),
            "spec.split.weights[0].percent",
            "must be between 0 and 100",
        );
        // Many entries cannot overflow the sum.
        let split = VersionSplit { weights: (0..100).map(|i| (format!("v{i}"), 100)).collect(), ..Default::default() };
        refused(
            capability(PolicySpec { split: Some(split), ..Default::default() }),
            "spec.split.weights",
            "percentages sum to 10000, not 100",
        );
    }

    #[test]
    fn admission_fields_have_ranges() {
        let a = |admission| agent(PolicySpec { admission: Some(admission), ..Default::default() });
        refused(
            a(Admission { normal_percent: 101, ..Default::default() }),
            "spec.admission.normal_percent",
            "must be between 0 and 100",
        );
        refused(
            a(Admission { low_percent: 101, ..Default::default() }),
            "spec.admission.low_percent",
            "must be between 0 and 100",
        );
        refused(
            a(Admission { queue_length: 100_001, ..Default::default() }),
            "spec.admission.queue_length",
            "must be between 0 and 100000",
        );
        refused(
            a(Admission { queue_timeout_ms: 60_001, ..Default::default() }),
            "spec.admission.queue_timeout_ms",
            "must be between 0 and 60000",
        );
        let max = Admission { normal_percent: 100, low_percent: 100, queue_length: 100_000, queue_timeout_ms: 60_000 };
        assert_eq!(a(max).validate(), Ok(()));
    }

    mod properties {
        use proptest::prelude::*;
        use proptest::strategy::Strategy;

        use super::super::{
            Admission, Authorization, CircuitBreaker, Fallback, Policy, PolicyKind, PolicySpec, RateLimit, RetryPolicy,
            VersionSplit,
        };

        /// Any f64, weighted towards the edges of the ranges.
        fn number() -> impl Strategy<Value = f64> {
            prop_oneof![
                Just(0.0),
                Just(1e-30),
                Just(0.001),
                Just(1.0),
                Just(1_000_000.0),
                Just(-1.0),
                Just(f64::MAX),
                Just(f64::MIN_POSITIVE),
                0.0..1.5f64,
                0.0..2_000_000.0f64,
                any::<f64>(),
            ]
        }

        fn count() -> impl Strategy<Value = u32> {
            prop_oneof![Just(0u32), Just(1), Just(100), Just(101), 0..2_000_000u32, any::<u32>()]
        }

        fn name() -> impl Strategy<Value = String> {
            prop_oneof![Just("c".to_string()), Just("a".to_string()), "[a-z][a-z0-9.-]{0,12}", ".{0,8}"]
        }

        fn spec() -> impl Strategy<Value = PolicySpec> {
            let strategy = proptest::option::of(prop_oneof![
                Just(super::super::Strategy::LeastLoaded),
                Just(super::super::Strategy::Weighted),
                Just(super::super::Strategy::ConsistentHash),
                Just(super::super::Strategy::Random),
                Just(super::super::Strategy::RoundRobin),
            ]);
            let retry = proptest::option::of((any::<bool>(), number(), count(), count()).prop_map(|(i, r, m, p)| {
                RetryPolicy { idempotent: i, budget_ratio: r, budget_min_per_second: m, max_payload_bytes: p }
            }));
            let rate = proptest::option::of(
                (number(), count()).prop_map(|(per_second, burst)| RateLimit { per_second, burst }),
            );
            let breaker =
                proptest::option::of((count(), number(), count(), count(), count(), count(), count()).prop_map(
                    |(c, f, w, m, o, mo, h)| CircuitBreaker {
                        consecutive_failures: c,
                        failure_rate: f,
                        window_ms: w,
                        min_requests: m,
                        open_ms: o,
                        max_open_ms: mo,
                        half_open_probes: h,
                    },
                ));
            let split = proptest::option::of(
                (proptest::collection::vec((name(), count()), 0..4), name(), name(), name()).prop_map(
                    |(w, k, v, mv)| VersionSplit { weights: w, match_key: k, match_value: v, match_version: mv },
                ),
            );
            let admission = proptest::option::of((count(), count(), count(), count()).prop_map(|(n, l, q, t)| {
                Admission { normal_percent: n, low_percent: l, queue_length: q, queue_timeout_ms: t }
            }));
            let fallback = proptest::option::of(prop_oneof![
                name().prop_map(Fallback::Capability),
                name().prop_map(Fallback::Agent)
            ]);
            let authorization =
                proptest::option::of((proptest::collection::vec(name(), 0..3), any::<bool>()).prop_map(
                    |(allowed_agents, allow_anonymous)| Authorization {
                        allowed_agents,
                        allow_anonymous,
                        allowed_tenants: Vec::new(),
                    },
                ));
            (
                (strategy, proptest::collection::btree_map(name(), count(), 0..3), proptest::option::of(count())),
                (retry, fallback, rate, breaker),
                (split, any::<bool>(), count(), admission, authorization),
            )
                .prop_map(
                    |(
                        (strategy, weights, timeout),
                        (retry, fallback, rate_limit, breaker),
                        (split, ro, ttl, admission, authorization),
                    )| {
                        PolicySpec {
                            strategy,
                            hash_key: String::new(),
                            weights,
                            default_timeout_ms: timeout,
                            retry,
                            fallback,
                            rate_limit,
                            breaker,
                            split,
                            read_only: ro,
                            cache_ttl_ms: ttl,
                            admission,
                            authorization,
                            session: std::collections::BTreeMap::new(),
                            alerts: crate::policy_alerts::AlertThresholds::default(),
                            session_writers: Vec::new(),
                            egress: Vec::new(),
                        }
                    },
                )
        }

        fn policy() -> impl Strategy<Value = Policy> {
            let kind = prop_oneof![Just(PolicyKind::Capability), Just(PolicyKind::Agent), Just(PolicyKind::Tenant)];
            (kind, name(), spec()).prop_map(|(kind, name, spec)| Policy {
                tenant: "default".into(),
                kind,
                name: if kind == PolicyKind::Tenant { "default".into() } else { name },
                spec,
                description: String::new(),
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Arbitrary bytes: the parser and the validator never panic.
            #[test]
            fn the_policy_json_parser_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(p) = serde_json::from_slice::<Policy>(&bytes) {
                    let _ = p.validate();
                }
            }

            /// Well-formed JSON with arbitrary values: every accepted policy round-trips
            /// through JSON (how control stores it) and protobuf (how Admin and the
            /// sidecars see it), and still validates.
            #[test]
            fn every_accepted_policy_round_trips(p in policy()) {
                let json = serde_json::to_vec(&p).unwrap();
                let parsed: Policy = serde_json::from_slice(&json).unwrap();
                if parsed.validate().is_ok() {
                    prop_assert_eq!(&parsed, &p);
                    let back = crate::convert::policy_from_proto(crate::convert::policy_to_proto(&parsed, 1)).unwrap();
                    prop_assert_eq!(&back, &p);
                    prop_assert_eq!(back.validate(), Ok(()));
                    let again: Policy = serde_json::from_slice(&serde_json::to_vec(&back).unwrap()).unwrap();
                    prop_assert_eq!(again, p);
                }
            }

            /// A policy's JSON with one field's number replaced by any text: no panic.
            #[test]
            fn any_number_text_in_any_field_never_panics(
                field in prop_oneof![Just("per_second"), Just("burst"), Just("failure_rate"), Just("budget_ratio"), Just("queue_length")],
                text in prop_oneof![Just("1e-30".to_string()), Just("1e400".to_string()), Just("-0".to_string()), "-?[0-9]{1,30}(\\.[0-9]{0,20})?(e-?[0-9]{1,4})?"],
            ) {
                let json = format!(
                    r#"{{"tenant":"default","kind":"agent","name":"a","spec":{{"rate_limit":{{"per_second":{},"burst":{}}},"breaker":{{"failure_rate":{}}},"retry":{{"budget_ratio":{}}},"admission":{{"queue_length":{}}}}}}}"#,
                    if field == "per_second" { &text } else { "1" },
                    if field == "burst" { &text } else { "1" },
                    if field == "failure_rate" { &text } else { "0" },
                    if field == "budget_ratio" { &text } else { "0" },
                    if field == "queue_length" { &text } else { "0" },
                );
                if let Ok(p) = serde_json::from_str::<Policy>(&json)
                    && p.validate().is_ok()
                {
                    let again: Policy = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
                    prop_assert_eq!(again, p);
                }
            }
        }
    }
}
