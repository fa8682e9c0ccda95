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
            let set: [(&str, bool); 11] = [
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
            ];
            if let Some((field, _)) = set.iter().find(|(_, on)| *on) {
                return Err(not_for(field, self.kind));
            }
        }
        if self.kind == PolicyKind::Capability && s.admission.is_some() {
            return Err(FieldError::new(
                "spec.admission",
                "admission applies to agent policies (it limits an agent's instances)",
            ));
        }
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
        if let Some(t) = s.default_timeout_ms
            && (t == 0 || t > MAX_DEFAULT_TIMEOUT_MS)
        {
            return Err(FieldError::new("spec.default_timeout_ms", "must be between 1 and 3600000"));
        }
        if let Some(r) = &s.retry
            && (!r.budget_ratio.is_finite() || !(0.0..=1.0).contains(&r.budget_ratio))
        {
            return Err(FieldError::new("spec.retry.budget_ratio", "must be between 0 and 1"));
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
        if let Some(r) = &s.rate_limit {
            if !r.per_second.is_finite() || r.per_second <= 0.0 {
                return Err(FieldError::new("spec.rate_limit.per_second", "must be greater than 0"));
            }
            if r.burst == 0 {
                return Err(FieldError::new("spec.rate_limit.burst", "must be at least 1"));
            }
        }
        if let Some(b) = &s.breaker {
            if !b.failure_rate.is_finite() || !(0.0..=1.0).contains(&b.failure_rate) {
                return Err(FieldError::new("spec.breaker.failure_rate", "must be between 0 and 1"));
            }
            if b.max_open_ms != 0 && b.max_open_ms < b.open_ms {
                return Err(FieldError::new("spec.breaker.max_open_ms", "must not be less than open_ms"));
            }
        }
        if let Some(split) = &s.split {
            validate_split(split)?;
        }
        if s.cache_ttl_ms != 0 && !s.read_only {
            return Err(FieldError::new("spec.cache_ttl_ms", "caching requires read_only: true"));
        }
        if let Some(a) = &s.admission {
            if a.normal_percent > 100 {
                return Err(FieldError::new("spec.admission.normal_percent", "must be at most 100"));
            }
            if a.low_percent > 100 {
                return Err(FieldError::new("spec.admission.low_percent", "must be at most 100"));
            }
            if a.low_percent > a.normal_percent() {
                return Err(FieldError::new("spec.admission.low_percent", "must not exceed normal_percent"));
            }
        }
        Ok(())
    }
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
        total += percent;
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
}
