//! Domain types shared by the control service and the sidecar: registrations, instances,
//! health states, targets, priorities, and the validation rules for names.
//!
//! These types know nothing of protobuf or etcd; [`crate::convert`] maps them to and from
//! the wire, and the control service maps them to store keys and values.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "test-util"))]
pub mod fixture;

/// How urgent a call is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "HIGH",
            Priority::Normal => "NORMAL",
            Priority::Low => "LOW",
        }
    }
}

/// How a sidecar talks to its local agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    #[default]
    Grpc,
    Http,
    /// An A2A server (`lf.a2a.v1.A2AService`, gRPC binding).
    A2a,
}

/// Health of one instance (DESIGN §4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthState {
    Starting,
    #[default]
    Up,
    Degraded,
    Paused,
    Down,
    Unknown,
}

impl HealthState {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Starting => "STARTING",
            HealthState::Up => "UP",
            HealthState::Degraded => "DEGRADED",
            HealthState::Paused => "PAUSED",
            HealthState::Down => "DOWN",
            HealthState::Unknown => "UNKNOWN",
        }
    }

    /// Whether new calls may be routed to an instance in this state.
    pub fn routable(self) -> bool {
        matches!(self, HealthState::Up | HealthState::Degraded)
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named ability with tags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Capability {
    /// Whether this capability carries every one of `required` tags.
    pub fn has_tags(&self, required: &[String]) -> bool {
        required.iter().all(|t| self.tags.iter().any(|have| have == t))
    }
}

/// What an agent declares when it joins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub agent: String,
    #[serde(default)]
    pub version: String,
    pub capabilities: Vec<Capability>,
    pub endpoint: String,
    #[serde(default)]
    pub transport: Transport,
    /// 0 = unlimited.
    #[serde(default)]
    pub max_concurrency: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Load an instance reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub in_flight: u32,
    pub queue_length: u32,
    pub load_ratio: f64,
    pub avg_latency_ms: u32,
}

/// One registered instance: the record the control service stores and every sidecar
/// routes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub instance_id: String,
    pub tenant: String,
    pub registration: Registration,
    pub sidecar_id: String,
    /// Mesh API address of the instance's sidecar, "host:port".
    pub sidecar_address: String,
    pub state: HealthState,
    #[serde(default)]
    pub load: Load,
    pub registered_at_ms: i64,
}

/// An instance record together with the store revision at which it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub record: InstanceRecord,
    pub revision: i64,
}

impl Instance {
    pub fn id(&self) -> &str {
        &self.record.instance_id
    }
    pub fn agent(&self) -> &str {
        &self.record.registration.agent
    }
}

/// What an operator's hold applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldScope {
    /// One instance.
    Instance,
    /// Every instance of an agent, including instances that register later.
    Agent,
}

impl HoldScope {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldScope::Instance => "instance",
            HoldScope::Agent => "agent",
        }
    }
}

/// An operator's hold on an instance's state (pause / drain). It wins over whatever the
/// instance reports until the operator lifts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHold {
    /// The state routing sees while the hold is in force (PAUSED).
    pub state: HealthState,
    pub reason: String,
    pub scope: HoldScope,
    /// Unix milliseconds when the hold was set.
    pub set_at_ms: i64,
}

/// Longest hold reason accepted.
pub const MAX_REASON_LEN: usize = 512;

/// An instance as operators see it: the record routing uses (whose `state` is the
/// effective state), plus what the instance itself reported, the holds in force and the
/// registration's generation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    #[serde(flatten)]
    pub record: InstanceRecord,
    /// Store revision at which the record was last written.
    pub revision: i64,
    /// The state the instance (or its sidecar's probes) last reported.
    pub reported_state: HealthState,
    /// Holds in force: instance-level first, then agent-level.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<StateHold>,
    /// Registrations of this instance id so far (1 for the first).
    pub generation: u64,
}

impl InstanceStatus {
    /// The instance as routing sees it.
    pub fn instance(&self) -> Instance {
        Instance { record: self.record.clone(), revision: self.revision }
    }
}

/// One agent name across its instances.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSummary {
    pub agent: String,
    /// Versions its instances run, sorted.
    pub versions: Vec<String>,
    /// Capabilities with the union of their tags, sorted by name.
    pub capabilities: Vec<Capability>,
    pub instances: u32,
    /// Instances per effective state name.
    pub instances_by_state: BTreeMap<String, u32>,
    /// The agent-level hold in force, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<StateHold>,
}

impl AgentSummary {
    /// Summarizes `instances` (all of one agent).
    pub fn of<'a>(agent: &str, instances: impl IntoIterator<Item = &'a InstanceStatus>) -> AgentSummary {
        let mut summary = AgentSummary { agent: agent.to_string(), ..Default::default() };
        let mut capabilities: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for status in instances {
            let reg = &status.record.registration;
            if !summary.versions.contains(&reg.version) {
                summary.versions.push(reg.version.clone());
            }
            for cap in &reg.capabilities {
                let tags = capabilities.entry(cap.name.clone()).or_default();
                for tag in &cap.tags {
                    if !tags.contains(tag) {
                        tags.push(tag.clone());
                    }
                }
            }
            summary.instances += 1;
            *summary.instances_by_state.entry(status.record.state.as_str().to_string()).or_default() += 1;
            if summary.hold.is_none() {
                summary.hold = status.holds.iter().find(|h| h.scope == HoldScope::Agent).cloned();
            }
        }
        summary.versions.sort();
        summary.capabilities = capabilities
            .into_iter()
            .map(|(name, mut tags)| {
                tags.sort();
                Capability { name, tags }
            })
            .collect();
        summary
    }
}

/// A tenant's record in the tenant registry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub created_at_ms: i64,
}

/// Longest tenant description accepted.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// What a call asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Agent(String),
    Capability(String),
}

/// A call's target: an agent by name or a capability, plus required tags (all-of).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: TargetKind,
    pub tags: Vec<String>,
}

impl Target {
    pub fn capability(name: impl Into<String>) -> Self {
        Target { kind: TargetKind::Capability(name.into()), tags: Vec::new() }
    }
    pub fn agent(name: impl Into<String>) -> Self {
        Target { kind: TargetKind::Agent(name.into()), tags: Vec::new() }
    }
    /// The agent name or capability name.
    pub fn name(&self) -> &str {
        match &self.kind {
            TargetKind::Agent(n) | TargetKind::Capability(n) => n,
        }
    }
}

/// At most this many of a target's tags are shown when it is displayed (in errors).
pub const MAX_TAGS_SHOWN: usize = 8;
/// At most this many bytes of each tag shown.
pub const MAX_TAG_SHOWN_BYTES: usize = 32;

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            TargetKind::Agent(n) => write!(f, "agent {n}")?,
            TargetKind::Capability(n) => write!(f, "capability {n}")?,
        }
        if !self.tags.is_empty() {
            // Errors quote targets: a few short tags, never the whole list.
            let shown: Vec<_> = self
                .tags
                .iter()
                .take(MAX_TAGS_SHOWN)
                .map(|t| crate::reason::truncate(t, MAX_TAG_SHOWN_BYTES))
                .collect();
            write!(f, " [{}", shown.join(","))?;
            if self.tags.len() > MAX_TAGS_SHOWN {
                write!(f, ",… {} more", self.tags.len() - MAX_TAGS_SHOWN)?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// A field that failed validation: its path in the request and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { field: field.into(), reason: reason.into() }
    }
}

/// Longest agent, capability, tag or tenant name accepted.
pub const MAX_NAME_LEN: usize = 128;
/// Most capabilities one registration declares.
pub const MAX_CAPABILITIES: usize = 64;
/// Most tags one capability of a registration, or one call target, carries.
pub const MAX_TAGS: usize = 32;
/// Most metadata entries of one registration.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Most bytes of one registration's metadata (keys and values together).
pub const MAX_METADATA_BYTES: usize = 16 * 1024;
/// Longest agent endpoint.
pub const MAX_ENDPOINT_LEN: usize = 1024;
/// Longest idempotency key of a call.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;

/// Checks an agent or capability name: 1..=128 chars of `A-Z a-z 0-9 . _ - :`. Names end
/// up in store keys, so `/` and anything else are refused.
pub fn validate_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(FieldError::new(field, format!("longer than {MAX_NAME_LEN} bytes")));
    }
    // A byte loop (a name is checked on every call): a byte outside the set, ASCII or the
    // first of a multi-byte character, starts the character named in the error.
    let bad = name.bytes().position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':')));
    if let Some(c) = bad.and_then(|at| name[at..].chars().next()) {
        return Err(FieldError::new(
            field,
            format!("character {c:?} not allowed (use letters, digits, '.', '_', '-', ':')"),
        ));
    }
    Ok(())
}

/// Checks a tenant name: a DNS label (lowercase letters, digits, '-', 1..=63 chars, no
/// leading or trailing '-').
pub fn validate_tenant(field: &str, tenant: &str) -> Result<(), FieldError> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 63
        && tenant.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !tenant.starts_with('-')
        && !tenant.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{:?} is not a tenant name (lowercase letters, digits, '-', 1..=63 chars)",
                crate::reason::truncate(tenant, 64)
            ),
        ))
    }
}

/// Checks a tag: 1..=128 printable chars without ','.
pub fn validate_tag(field: &str, tag: &str) -> Result<(), FieldError> {
    if tag.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if tag.len() > MAX_NAME_LEN {
        return Err(FieldError::new(field, format!("longer than {MAX_NAME_LEN} bytes")));
    }
    if tag.chars().any(|c| c.is_control() || c == ',') {
        return Err(FieldError::new(field, "control characters and ',' are not allowed"));
    }
    Ok(())
}

impl Registration {
    /// Validates everything a sidecar must check before accepting a registration.
    pub fn validate(&self) -> Result<(), FieldError> {
        validate_name("registration.agent", &self.agent)?;
        if self.version.len() > MAX_NAME_LEN {
            return Err(FieldError::new("registration.version", "longer than 128 bytes"));
        }
        if self.capabilities.is_empty() {
            return Err(FieldError::new("registration.capabilities", "at least one capability is required"));
        }
        if self.capabilities.len() > MAX_CAPABILITIES {
            return Err(FieldError::new(
                "registration.capabilities",
                format!("{} capabilities; at most {MAX_CAPABILITIES} are allowed", self.capabilities.len()),
            ));
        }
        for (i, cap) in self.capabilities.iter().enumerate() {
            validate_name(&format!("registration.capabilities[{i}].name"), &cap.name)?;
            if cap.tags.len() > MAX_TAGS {
                return Err(FieldError::new(
                    format!("registration.capabilities[{i}].tags"),
                    format!("{} tags; at most {MAX_TAGS} are allowed", cap.tags.len()),
                ));
            }
            for (j, tag) in cap.tags.iter().enumerate() {
                validate_tag(&format!("registration.capabilities[{i}].tags[{j}]"), tag)?;
            }
            if self.capabilities[..i].iter().any(|c| c.name == cap.name) {
                return Err(FieldError::new(
                    format!("registration.capabilities[{i}].name"),
                    format!("capability {:?} is declared twice", cap.name),
                ));
            }
        }
        if self.metadata.len() > MAX_METADATA_ENTRIES {
            return Err(FieldError::new(
                "registration.metadata",
                format!("{} entries; at most {MAX_METADATA_ENTRIES} are allowed", self.metadata.len()),
            ));
        }
        let metadata_bytes: usize = self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        if metadata_bytes > MAX_METADATA_BYTES {
            return Err(FieldError::new(
                "registration.metadata",
                format!("{metadata_bytes} bytes; at most {MAX_METADATA_BYTES} are allowed"),
            ));
        }
        if self.endpoint.is_empty() {
            return Err(FieldError::new("registration.endpoint", "must not be empty"));
        }
        if self.endpoint.len() > MAX_ENDPOINT_LEN {
            return Err(FieldError::new("registration.endpoint", format!("longer than {MAX_ENDPOINT_LEN} bytes")));
        }
        endpoint_authority(&self.endpoint).map_err(|reason| FieldError::new("registration.endpoint", reason))?;
        if self.transport != Transport::Http && endpoint_path(&self.endpoint) != "/" {
            return Err(FieldError::new(
                "registration.endpoint",
                "a gRPC endpoint is http://host:port without a path (paths are for HTTP agents)",
            ));
        }
        Ok(())
    }
}

impl Target {
    /// Validates a call target.
    pub fn validate(&self) -> Result<(), FieldError> {
        match &self.kind {
            TargetKind::Agent(n) => validate_name("target.agent", n)?,
            TargetKind::Capability(n) => validate_name("target.capability", n)?,
        }
        if self.tags.len() > MAX_TAGS {
            return Err(FieldError::new(
                "target.tags",
                format!("{} tags; at most {MAX_TAGS} are allowed", self.tags.len()),
            ));
        }
        for (i, tag) in self.tags.iter().enumerate() {
            validate_tag(&format!("target.tags[{i}]"), tag)?;
        }
        Ok(())
    }
}

/// The `host:port` part of an endpoint such as `http://127.0.0.1:50051`, `127.0.0.1:50051`
/// or (HTTP agents) `http://127.0.0.1:8080/invoke`.
pub fn endpoint_authority(endpoint: &str) -> Result<&str, String> {
    if endpoint.starts_with("https://") {
        return Err("https endpoints are not supported between an agent and its local sidecar".into());
    }
    let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("grpc://")).unwrap_or(endpoint);
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("{:?} is not of the form http://host:port", crate::reason::truncate(endpoint, 128)));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => Ok(authority),
        _ => Err(format!("{:?} has no valid port (expected http://host:port)", crate::reason::truncate(endpoint, 128))),
    }
}

/// The path of an endpoint ("/" when it has none).
pub fn endpoint_path(endpoint: &str) -> &str {
    let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("grpc://")).unwrap_or(endpoint);
    match rest.find('/') {
        Some(i) if i + 1 < rest.len() => &rest[i..],
        _ => "/",
    }
}

/// A new instance id: the agent name and 12 random hex digits.
pub fn new_instance_id(agent: &str) -> String {
    format!("{agent}-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registration {
        fixture::registration("summarizer")
            .version("1.0.0")
            .capability("text.summarize", &["en"])
            .endpoint("http://127.0.0.1:5000")
            .registration()
    }

    #[test]
    fn valid_registration_passes() {
        assert_eq!(reg().validate(), Ok(()));
    }

    #[test]
    fn invalid_registrations_name_the_field() {
        type Mutation = Box<dyn Fn(&mut Registration)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|r| r.agent.clear()), "registration.agent"),
            (Box::new(|r| r.agent = "a/b".into()), "registration.agent"),
            (Box::new(|r| r.capabilities.clear()), "registration.capabilities"),
            (Box::new(|r| r.capabilities[0].name.clear()), "registration.capabilities[0].name"),
            (Box::new(|r| r.capabilities[0].tags.push(String::new())), "registration.capabilities[0].tags[1]"),
            (Box::new(|r| r.capabilities.push(r.capabilities[0].clone())), "registration.capabilities[1].name"),
            (Box::new(|r| r.endpoint.clear()), "registration.endpoint"),
            (Box::new(|r| r.endpoint = "http://127.0.0.1".into()), "registration.endpoint"),
            (Box::new(|r| r.endpoint = "http://127.0.0.1:5000/x".into()), "registration.endpoint"),
        ];
        for (mutate, field) in cases {
            let mut r = reg();
            mutate(&mut r);
            assert_eq!(r.validate().unwrap_err().field, field);
        }
    }

    #[test]
    fn registrations_and_targets_are_bounded() {
        type Mutate = Box<dyn Fn(&mut Registration)>;
        let cases: Vec<(Mutate, &str, &str)> = vec![
            (
                Box::new(|r| {
                    r.capabilities =
                        (0..=MAX_CAPABILITIES).map(|i| Capability { name: format!("c{i}"), tags: vec![] }).collect()
                }),
                "registration.capabilities",
                "65 capabilities; at most 64",
            ),
            (
                Box::new(|r| r.capabilities[0].tags = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect()),
                "registration.capabilities[0].tags",
                "33 tags; at most 32",
            ),
            (
                Box::new(|r| {
                    r.metadata = (0..=MAX_METADATA_ENTRIES).map(|i| (format!("k{i}"), String::new())).collect()
                }),
                "registration.metadata",
                "65 entries; at most 64",
            ),
            (
                Box::new(|r| r.metadata = [("k".to_string(), "v".repeat(MAX_METADATA_BYTES))].into()),
                "registration.metadata",
                "16385 bytes; at most 16384",
            ),
            (
                Box::new(|r| r.endpoint = format!("http://127.0.0.1:5000{}", "/x".repeat(600))),
                "registration.endpoint",
                "longer than 1024 bytes",
            ),
        ];
        for (mutate, field, why) in cases {
            let mut r = reg();
            mutate(&mut r);
            let err = r.validate().unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.reason.starts_with(why), "{}", err.reason);
        }
        let mut r = reg();
        r.capabilities[0].tags = (0..MAX_TAGS).map(|i| format!("t{i}")).collect();
        r.metadata = (0..MAX_METADATA_ENTRIES).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(r.validate(), Ok(()), "at the limits");
        let target = |n: usize| Target {
            kind: TargetKind::Capability("c".into()),
            tags: (0..n).map(|i| format!("t{i}")).collect(),
        };
        assert_eq!(target(MAX_TAGS).validate(), Ok(()));
        assert_eq!(target(MAX_TAGS + 1).validate().unwrap_err().field, "target.tags");
    }

    #[test]
    fn a_name_error_names_the_first_character_not_allowed() {
        assert!(validate_name("f", "bench.echo_v2-a:b").is_ok());
        let why = |name: &str| validate_name("f", name).unwrap_err().to_string();
        assert!(why("a b").contains("character ' ' not allowed"), "{}", why("a b"));
        assert!(why("ok/é").contains("character '/' not allowed"), "{}", why("ok/é"));
        assert!(why("naïve").contains("character 'ï' not allowed"), "{}", why("naïve"));
        assert!(why("日本").contains("character '日' not allowed"), "{}", why("日本"));
        assert!(why("").contains("must not be empty"));
    }

    #[test]
    fn tenant_names() {
        assert!(validate_tenant("t", "default").is_ok());
        assert!(validate_tenant("t", "team-7").is_ok());
        for bad in ["", "Default", "a/b", "-a", "a-", "..", "%2F", "ä"] {
            assert!(validate_tenant("t", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn endpoint_forms() {
        assert_eq!(endpoint_authority("http://127.0.0.1:80"), Ok("127.0.0.1:80"));
        assert_eq!(endpoint_authority("localhost:9"), Ok("localhost:9"));
        assert!(endpoint_authority("http://127.0.0.1:0").is_err());
        assert!(endpoint_authority("https://x:1").is_err());
        assert_eq!(endpoint_authority("http://x:1/path"), Ok("x:1"));
        assert_eq!(endpoint_path("http://x:1/path/more"), "/path/more");
        assert_eq!(endpoint_path("http://x:1/"), "/");
        assert_eq!(endpoint_path("x:1"), "/");
        let mut http = reg();
        http.transport = Transport::Http;
        http.endpoint = "http://127.0.0.1:8080/invoke".into();
        assert_eq!(http.validate(), Ok(()));
    }

    #[test]
    fn tags_are_all_of() {
        let c = Capability { name: "x".into(), tags: vec!["en".into(), "zh".into()] };
        assert!(c.has_tags(&[]));
        assert!(c.has_tags(&["zh".into()]));
        assert!(c.has_tags(&["en".into(), "zh".into()]));
        assert!(!c.has_tags(&["en".into(), "fr".into()]));
    }
}
