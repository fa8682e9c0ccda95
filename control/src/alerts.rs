//! Alert rules over each tenant's routing state, evaluated by every control replica from
//! its own tenant feeds ([`crate::feed`]), with no store reads of their own.
//!
//! Rules (defaults in [`AlertConfig`]):
//! - **instances lost together**: two or more instances of one agent lost within 15 s. An
//!   instance is lost when its state turns DOWN, or when its record disappears (lease
//!   expired, or removed) without having been PAUSED or DOWN first — a graceful shutdown
//!   pauses first, a crash does not. Resolved once 15 s pass without another loss.
//! - **below minimum healthy**: an agent with fewer instances UP, DEGRADED or STARTING than
//!   the minimum (1 by default; instances held by an operator count as healthy, the hold is
//!   deliberate). An agent whose last instance was lost stays watched until one returns.
//!
//! - **served by its fallback**: calls of one target (a capability or an agent) served by
//!   its policy's fallback, at least 5 of them in the last minute, summed over every
//!   sidecar's traffic report ([`crate::reports`]). Resolved once the last minute has none.
//! - **breakers open**: more than half of an agent's instances have a circuit breaker open
//!   (or half-open) in at least one caller's sidecar, as the sidecars' reports say.
//!   Resolved once half or fewer do.
//!
//! Each threshold may be set per agent, per capability (the fallback rule) or per tenant by
//! policy (`spec.alerts`, [`agent_reach::policy_alerts`]): an agent's policy overrides the
//! tenant policy, which overrides control's flags ([`Thresholds`]). The rules read the
//! policies from the same tenant feed as the instances, so a changed threshold applies at
//! the next evaluation on every replica.
//!
//! The last two rules read what callers' sidecars report, which every replica follows, so
//! they hold across replicas like the first two; they lag by up to a report interval.
//!
//! Alerts are kept in memory (the newest [`AlertConfig::history`]), counted in `/metrics`,
//! shown on the dashboard and, when a webhook is configured, POSTed to it as JSON, signed
//! with HMAC-SHA256 and retried with jittered exponential back-off. Every replica evaluates
//! the same rules on the same state; before POSTing, a replica claims the alert in the
//! store (a create-only key on a short lease), so one replica delivers each alert.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::model::{HealthState, InstanceStatus};
use agent_reach::policy::PolicyKind;
use agent_reach::policy_alerts::AlertThresholds;
use agent_reach::proto;
use agent_reach_store::{Compare, Op, Store, Txn};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::feed::{Entry, Feeds};
use crate::reports::{Reports, SidecarTraffic};
use crate::stats::ControlStats;

/// How long a replica's claim on delivering an alert lasts: other replicas that fire the
/// same rule for the same agent within it leave the delivery to the claimant.
const CLAIM_TTL: Duration = Duration::from_secs(60);
/// Alerts waiting for the webhook, at most.
const WEBHOOK_QUEUE: usize = 256;
/// The rules also re-evaluate this often without a state change (windows run out).
const TICK: Duration = Duration::from_secs(1);
/// At most one evaluation per tenant this often: changes in between are evaluated together
/// (a large tenant whose loads change often costs at most this many passes).
const MIN_EVALUATION_GAP: Duration = Duration::from_millis(250);

/// Root of the delivery claims: `/agent-reach/v1/alert-claims/{tenant}/{rule}/{agent}`.
pub const CLAIMS_ROOT: &str = "/agent-reach/v1/alert-claims/";

/// Where alerts are POSTed.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// An `http://` URL.
    pub url: http::Uri,
    /// The HMAC-SHA256 key that signs each body.
    pub secret: Vec<u8>,
    /// Attempts per alert (the first POST included).
    pub attempts: u32,
    /// Timeout of one attempt.
    pub timeout: Duration,
    /// First retry delay; doubled per retry (jittered), at most 30 s.
    pub backoff: Duration,
}

/// The alert rules' settings.
#[derive(Clone, Debug)]
pub struct AlertConfig {
    /// Losses of one agent's instances counted together within this window.
    pub lost_window: Duration,
    /// Losses within the window that fire the alert.
    pub lost_count: usize,
    /// Fewer healthy instances than this fires "below minimum healthy"; 0 disables it.
    pub min_healthy: u32,
    /// Calls of one target served by its fallback within the reports' last minute that
    /// fire "served by its fallback"; 0 disables it.
    pub fallback_calls: u64,
    /// "Breakers open" fires when more than this percentage of an agent's instances have an
    /// open breaker (policy only; 50 by default).
    pub breakers_open_percent: u32,
    /// Alerts kept in memory for the dashboard.
    pub history: usize,
    pub webhook: Option<WebhookConfig>,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            lost_window: Duration::from_secs(15),
            lost_count: 2,
            min_healthy: 1,
            fallback_calls: 5,
            breakers_open_percent: 50,
            history: 200,
            webhook: None,
        }
    }
}

/// Which rule fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    InstancesLost,
    BelowMinHealthy,
    FallbackServing,
    BreakersOpen,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::InstancesLost => "instances_lost",
            Rule::BelowMinHealthy => "below_min_healthy",
            Rule::FallbackServing => "fallback_serving",
            Rule::BreakersOpen => "breakers_open",
        }
    }
}

/// One alert, as the dashboard shows it and the webhook receives it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alert {
    /// `{tenant}/{rule}/{agent}/{fired_at_ms}`.
    pub id: String,
    pub tenant: String,
    pub rule: Rule,
    /// The agent concerned; for "served by its fallback", the target ("capability x").
    pub agent: String,
    pub message: String,
    /// The instances concerned (lost ones, or the unhealthy ones).
    pub instances: Vec<String>,
    /// The tenant's store revision when the rule fired.
    pub revision: i64,
    pub fired_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_at_ms: Option<i64>,
}

/// What evaluating the rules found.
#[derive(Debug, PartialEq)]
pub enum Finding {
    Fired(Alert),
    Resolved { rule: Rule, agent: String },
}

/// The thresholds set by a tenant's policies (`spec.alerts`): the tenant policy's, and each
/// agent's and capability's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Thresholds {
    pub tenant: AlertThresholds,
    pub agents: HashMap<String, AlertThresholds>,
    pub capabilities: HashMap<String, AlertThresholds>,
}

/// Where a threshold in force comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Control's flag (or built-in default).
    Default,
    /// The tenant policy.
    Tenant,
    /// The agent's or capability's own policy.
    Own,
}

/// One threshold in force and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Setting {
    pub value: u32,
    pub source: Source,
}

/// The thresholds in force for one agent (or, for `fallback_calls` only, one capability).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Effective {
    pub min_healthy: Setting,
    pub lost_count: Setting,
    pub lost_window_ms: Setting,
    pub fallback_calls: Setting,
    pub breakers_open_percent: Setting,
}

impl Thresholds {
    /// The thresholds of a tenant's policies as its feed holds them.
    pub fn from_proto(policies: &[proto::Policy]) -> Thresholds {
        let mut out = Thresholds::default();
        for p in policies {
            let Some(alerts) = p.spec.as_ref().and_then(|s| s.alerts.as_ref()) else { continue };
            let alerts = agent_reach::convert::alert_thresholds_from_proto(alerts);
            match agent_reach::convert::policy_kind_from_i32("kind", p.kind).ok() {
                Some(PolicyKind::Tenant) => out.tenant = alerts,
                Some(PolicyKind::Agent) => {
                    out.agents.insert(p.name.clone(), alerts);
                }
                Some(PolicyKind::Capability) => {
                    out.capabilities.insert(p.name.clone(), alerts);
                }
                None => {}
            }
        }
        out
    }

    /// The thresholds in force with `own` over the tenant policy's over `config`.
    fn resolve(&self, own: Option<&AlertThresholds>, config: &AlertConfig) -> Effective {
        let pick = |own: Option<u32>, tenant: Option<u32>, default: u32| match (own, tenant) {
            (Some(value), _) => Setting { value, source: Source::Own },
            (None, Some(value)) => Setting { value, source: Source::Tenant },
            (None, None) => Setting { value: default, source: Source::Default },
        };
        let own = own.copied().unwrap_or_default();
        let t = &self.tenant;
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Effective {
            min_healthy: pick(own.min_healthy, t.min_healthy, config.min_healthy),
            lost_count: pick(own.lost_count, t.lost_count, clamp(config.lost_count as u64)),
            lost_window_ms: pick(own.lost_window_ms, t.lost_window_ms, clamp(config.lost_window.as_millis() as u64)),
            fallback_calls: pick(own.fallback_calls, t.fallback_calls, clamp(config.fallback_calls)),
            breakers_open_percent: pick(
                own.breakers_open_percent,
                t.breakers_open_percent,
                config.breakers_open_percent,
            ),
        }
    }

    /// The thresholds in force for `agent`.
    pub fn for_agent(&self, agent: &str, config: &AlertConfig) -> Effective {
        self.resolve(self.agents.get(agent), config)
    }

    /// The thresholds in force for the tenant as a whole (what agents without a policy get).
    pub fn for_tenant(&self, config: &AlertConfig) -> Effective {
        self.resolve(None, config)
    }

    /// The thresholds in force for `capability` (only `fallback_calls` is about capabilities).
    pub fn for_capability(&self, capability: &str, config: &AlertConfig) -> Effective {
        self.resolve(self.capabilities.get(capability), config)
    }

    /// The fallback threshold of a call target as traffic reports name it
    /// (`capability x`, `agent x`, maybe followed by ` [tags]`).
    fn fallback_calls(&self, target: &str, config: &AlertConfig) -> u64 {
        let name = |rest: &str| rest.split([' ', '[']).next().unwrap_or_default().to_string();
        let effective = if let Some(rest) = target.strip_prefix("capability ") {
            self.for_capability(&name(rest), config)
        } else if let Some(rest) = target.strip_prefix("agent ") {
            self.for_agent(&name(rest), config)
        } else {
            self.for_tenant(config)
        };
        u64::from(effective.fallback_calls.value)
    }
}

/// What the rules remember of one instance.
#[derive(Clone, Debug)]
struct Seen {
    agent: String,
    state: HealthState,
}

/// The rules of one tenant: state kept between evaluations. Pure (no I/O), so the unit
/// tests drive it with their own clock.
pub struct Rules {
    tenant: String,
    config: AlertConfig,
    /// None until the first evaluation (which only records what exists).
    seen: Option<HashMap<String, Seen>>,
    /// Recent losses per agent: (when, instance id).
    losses: HashMap<String, VecDeque<(Instant, String)>>,
    /// Agents whose last instance was lost (still watched by the minimum rule).
    orphaned: BTreeSet<String>,
    /// Alerts in force, by (rule, agent).
    active: BTreeMap<(Rule, String), ()>,
    /// The thresholds the tenant's policies set.
    thresholds: Thresholds,
}

/// What the rules read of an instance. The feed's entries give it without a copy of their
/// records (a pass over 10,000 instances copied every one of them before).
pub trait Watched {
    fn id(&self) -> &str;
    fn agent(&self) -> &str;
    /// The state routing uses (a hold's, else the reported one).
    fn state(&self) -> HealthState;
    /// Whether an operator's hold is on it (or on its agent).
    fn held(&self) -> bool;
}

impl Watched for InstanceStatus {
    fn id(&self) -> &str {
        &self.record.instance_id
    }
    fn agent(&self) -> &str {
        &self.record.registration.agent
    }
    fn state(&self) -> HealthState {
        self.record.state
    }
    fn held(&self) -> bool {
        !self.holds.is_empty()
    }
}

impl Watched for Arc<Entry> {
    fn id(&self) -> &str {
        &self.stored.record.instance_id
    }
    fn agent(&self) -> &str {
        &self.stored.record.registration.agent
    }
    fn state(&self) -> HealthState {
        self.stored.effective_state()
    }
    fn held(&self) -> bool {
        self.stored.instance_hold.is_some() || self.stored.agent_hold.is_some()
    }
}

fn healthy(status: &(impl Watched + ?Sized)) -> bool {
    status.held() || matches!(status.state(), HealthState::Up | HealthState::Degraded | HealthState::Starting)
}

impl Rules {
    pub fn new(tenant: &str, config: AlertConfig) -> Rules {
        Rules {
            tenant: tenant.to_string(),
            config,
            seen: None,
            losses: HashMap::new(),
            orphaned: BTreeSet::new(),
            active: BTreeMap::new(),
            thresholds: Thresholds::default(),
        }
    }

    /// Sets the thresholds of the tenant's policies, for the next evaluations.
    pub fn set_thresholds(&mut self, thresholds: Thresholds) {
        self.thresholds = thresholds;
    }

    /// Evaluates the rules on the tenant's instances at `revision` (`now` drives the
    /// windows, `now_ms` is wall-clock time for the alerts).
    pub fn evaluate<I: Watched>(
        &mut self,
        now: Instant,
        now_ms: i64,
        revision: i64,
        instances: &[I],
        traffic: &[Arc<SidecarTraffic>],
    ) -> Vec<Finding> {
        let current: HashMap<String, Seen> = instances
            .iter()
            .map(|s| (s.id().to_string(), Seen { agent: s.agent().to_string(), state: s.state() }))
            .collect();
        let mut lost_now: Vec<(String, String)> = Vec::new();
        if let Some(before) = &self.seen {
            for (id, now_seen) in &current {
                let was_down = before.get(id).is_some_and(|b| b.state == HealthState::Down);
                if now_seen.state == HealthState::Down && !was_down {
                    lost_now.push((now_seen.agent.clone(), id.clone()));
                }
            }
            for (id, old) in before {
                if !current.contains_key(id) && !matches!(old.state, HealthState::Paused | HealthState::Down) {
                    lost_now.push((old.agent.clone(), id.clone()));
                }
            }
        }
        let agents_now: BTreeSet<&str> = current.values().map(|s| s.agent.as_str()).collect();
        for (agent, id) in &lost_now {
            self.losses.entry(agent.clone()).or_default().push_back((now, id.clone()));
            if !agents_now.contains(agent.as_str()) {
                self.orphaned.insert(agent.clone());
            }
        }
        self.orphaned.retain(|a| !agents_now.contains(a.as_str()));
        self.seen = Some(current);

        let mut findings = Vec::new();
        // Instances lost together.
        let mut agents: Vec<String> = self.losses.keys().cloned().collect();
        agents.sort();
        for agent in agents {
            let effective = self.thresholds.for_agent(&agent, &self.config);
            let window = Duration::from_millis(u64::from(effective.lost_window_ms.value));
            let Some(list) = self.losses.get_mut(&agent) else { continue };
            while list.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > window) {
                list.pop_front();
            }
            let key = (Rule::InstancesLost, agent.clone());
            let active = self.active.contains_key(&key);
            if list.len() >= (effective.lost_count.value as usize).max(1) && !active {
                let mut ids: Vec<String> = list.iter().map(|(_, id)| id.clone()).collect();
                ids.dedup();
                let message = format!("{} instances of {agent} lost within {}s", ids.len(), window.as_secs());
                findings.push(Finding::Fired(self.alert(Rule::InstancesLost, &agent, message, ids, revision, now_ms)));
                self.active.insert(key, ());
            } else if list.is_empty() {
                self.losses.remove(&agent);
                if active {
                    self.active.remove(&key);
                    findings.push(Finding::Resolved { rule: Rule::InstancesLost, agent });
                }
            }
        }
        // Below the minimum of healthy instances (0 disables it for an agent).
        {
            let mut by_agent: BTreeMap<&str, Vec<&I>> = BTreeMap::new();
            for s in instances {
                by_agent.entry(s.agent()).or_default().push(s);
            }
            for orphan in &self.orphaned {
                by_agent.entry(orphan.as_str()).or_default();
            }
            for (agent, list) in &by_agent {
                let min_healthy = self.thresholds.for_agent(agent, &self.config).min_healthy.value;
                let healthy_count = list.iter().filter(|s| healthy(**s)).count() as u32;
                let key = (Rule::BelowMinHealthy, agent.to_string());
                let active = self.active.contains_key(&key);
                if healthy_count < min_healthy && !active {
                    let unhealthy: Vec<String> =
                        list.iter().filter(|s| !healthy(**s)).map(|s| s.id().to_string()).collect();
                    let message = format!(
                        "{agent} has {healthy_count} healthy instance(s), fewer than the minimum {min_healthy}"
                    );
                    findings.push(Finding::Fired(self.alert(
                        Rule::BelowMinHealthy,
                        agent,
                        message,
                        unhealthy,
                        revision,
                        now_ms,
                    )));
                    self.active.insert(key, ());
                } else if healthy_count >= min_healthy && active {
                    self.active.remove(&key);
                    findings.push(Finding::Resolved { rule: Rule::BelowMinHealthy, agent: agent.to_string() });
                }
            }
            // Agents gone for good (gracefully) resolve their alert.
            let gone: Vec<(Rule, String)> = self
                .active
                .keys()
                .filter(|(rule, agent)| *rule == Rule::BelowMinHealthy && !by_agent.contains_key(agent.as_str()))
                .cloned()
                .collect();
            for key in gone {
                self.active.remove(&key);
                findings.push(Finding::Resolved { rule: key.0, agent: key.1 });
            }
        }
        self.fallback_serving(revision, now_ms, traffic, &mut findings);
        self.breakers_open(revision, now_ms, instances, traffic, &mut findings);
        findings
    }

    /// "Served by its fallback" (see the module documentation).
    fn fallback_serving(
        &mut self,
        revision: i64,
        now_ms: i64,
        traffic: &[Arc<SidecarTraffic>],
        findings: &mut Vec<Finding>,
    ) {
        // By target: (calls, served by the fallback, the agents that served them).
        let mut by_target: BTreeMap<&str, (u64, u64, BTreeSet<&str>)> = BTreeMap::new();
        for report in traffic {
            for e in &report.edges {
                let sum = by_target.entry(e.target.as_str()).or_default();
                sum.0 += e.calls;
                sum.1 += e.fallback_calls;
                if e.fallback_calls > 0 {
                    sum.2.insert(e.agent.as_str());
                }
            }
        }
        for (target, (calls, fallback, agents)) in &by_target {
            let key = (Rule::FallbackServing, target.to_string());
            let active = self.active.contains_key(&key);
            let threshold = self.thresholds.fallback_calls(target, &self.config);
            if threshold > 0 && *fallback >= threshold && !active {
                let message =
                    format!("{target}: {fallback} of {calls} calls in the last minute served by its fallback");
                let served_by = agents.iter().map(|a| a.to_string()).collect();
                findings.push(Finding::Fired(self.alert(
                    Rule::FallbackServing,
                    target,
                    message,
                    served_by,
                    revision,
                    now_ms,
                )));
                self.active.insert(key, ());
            } else if (*fallback == 0 || threshold == 0) && active {
                self.active.remove(&key);
                findings.push(Finding::Resolved { rule: Rule::FallbackServing, agent: target.to_string() });
            }
        }
        let gone: Vec<(Rule, String)> = self
            .active
            .keys()
            .filter(|(rule, target)| *rule == Rule::FallbackServing && !by_target.contains_key(target.as_str()))
            .cloned()
            .collect();
        for key in gone {
            self.active.remove(&key);
            findings.push(Finding::Resolved { rule: key.0, agent: key.1 });
        }
    }

    /// "Breakers open" (see the module documentation).
    fn breakers_open<I: Watched>(
        &mut self,
        revision: i64,
        now_ms: i64,
        instances: &[I],
        traffic: &[Arc<SidecarTraffic>],
        findings: &mut Vec<Finding>,
    ) {
        let open: BTreeSet<&str> = traffic.iter().flat_map(|r| r.open_breakers.iter().map(String::as_str)).collect();
        let mut by_agent: BTreeMap<&str, (usize, Vec<String>)> = BTreeMap::new();
        for s in instances {
            let entry = by_agent.entry(s.agent()).or_default();
            entry.0 += 1;
            if open.contains(s.id()) {
                entry.1.push(s.id().to_string());
            }
        }
        for (agent, (total, open_ids)) in &by_agent {
            let key = (Rule::BreakersOpen, agent.to_string());
            let active = self.active.contains_key(&key);
            let percent = self.thresholds.for_agent(agent, &self.config).breakers_open_percent.value as usize;
            let tripped = open_ids.len() * 100 > *total * percent;
            if tripped && !active {
                let message = format!(
                    "{} of {total} instances of {agent} have an open circuit breaker in a caller's sidecar",
                    open_ids.len()
                );
                findings.push(Finding::Fired(self.alert(
                    Rule::BreakersOpen,
                    agent,
                    message,
                    open_ids.clone(),
                    revision,
                    now_ms,
                )));
                self.active.insert(key, ());
            } else if !tripped && active {
                self.active.remove(&key);
                findings.push(Finding::Resolved { rule: Rule::BreakersOpen, agent: agent.to_string() });
            }
        }
        let gone: Vec<(Rule, String)> = self
            .active
            .keys()
            .filter(|(rule, agent)| *rule == Rule::BreakersOpen && !by_agent.contains_key(agent.as_str()))
            .cloned()
            .collect();
        for key in gone {
            self.active.remove(&key);
            findings.push(Finding::Resolved { rule: key.0, agent: key.1 });
        }
    }

    fn alert(&self, rule: Rule, agent: &str, message: String, instances: Vec<String>, revision: i64, at: i64) -> Alert {
        Alert {
            id: format!("{}/{}/{agent}/{at}", self.tenant, rule.as_str()),
            tenant: self.tenant.clone(),
            rule,
            agent: agent.to_string(),
            message,
            instances,
            revision,
            fired_at_ms: at,
            resolved_at_ms: None,
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the list stays valid.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The alerts of one control replica: the rules of every tenant it has a feed for.
pub struct Alerts {
    config: AlertConfig,
    stats: Arc<ControlStats>,
    /// Newest last, at most `config.history`.
    recent: Mutex<VecDeque<Alert>>,
    /// Bumped on every fired or resolved alert.
    changed: watch::Sender<u64>,
    webhook: Option<mpsc::Sender<Alert>>,
    /// The sidecars' traffic reports (the fallback and breaker rules read them).
    reports: Arc<Reports>,
}

impl Alerts {
    /// Starts following every tenant `feeds` starts a feed for (and the webhook sender,
    /// when one is configured), until `shutdown`.
    pub fn start(
        config: AlertConfig,
        feeds: Arc<Feeds>,
        reports: Arc<Reports>,
        store: Arc<dyn Store>,
        stats: Arc<ControlStats>,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Alerts> {
        let (webhook, queue) = match &config.webhook {
            Some(hook) => {
                let (tx, rx) = mpsc::channel(WEBHOOK_QUEUE);
                (Some(tx), Some((hook.clone(), rx)))
            }
            None => (None, None),
        };
        let alerts = Arc::new(Alerts {
            config,
            stats: stats.clone(),
            recent: Mutex::new(VecDeque::new()),
            changed: watch::channel(0).0,
            webhook,
            reports,
        });
        if let Some((hook, rx)) = queue {
            tokio::spawn(deliver(hook, rx, store, stats, shutdown.clone()));
        }
        tokio::spawn(alerts.clone().follow_tenants(feeds, shutdown));
        alerts
    }

    /// The rules' settings from control's flags (policies override them per agent).
    pub fn config(&self) -> &AlertConfig {
        &self.config
    }

    /// Recent alerts of `tenant`, newest first.
    pub fn recent(&self, tenant: &str) -> Vec<Alert> {
        lock(&self.recent).iter().rev().filter(|a| a.tenant == tenant).cloned().collect()
    }

    /// A receiver woken on every fired or resolved alert.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn record(&self, tenant: &str, findings: Vec<Finding>) {
        if findings.is_empty() {
            return;
        }
        let counters = &self.stats.alerts;
        let mut recent = lock(&self.recent);
        for finding in findings {
            match finding {
                Finding::Fired(alert) => {
                    tracing::warn!(tenant, rule = alert.rule.as_str(), agent = %alert.agent, "alert: {}", alert.message);
                    let counter = match alert.rule {
                        Rule::InstancesLost => &counters.instances_lost,
                        Rule::BelowMinHealthy => &counters.below_min_healthy,
                        Rule::FallbackServing => &counters.fallback_serving,
                        Rule::BreakersOpen => &counters.breakers_open,
                    };
                    ControlStats::inc(counter);
                    counters.active.fetch_add(1, Ordering::Relaxed);
                    if let Some(queue) = &self.webhook
                        && queue.try_send(alert.clone()).is_err()
                    {
                        ControlStats::inc(&counters.webhook_dropped);
                    }
                    recent.push_back(alert);
                    while recent.len() > self.config.history.max(1) {
                        recent.pop_front();
                    }
                }
                Finding::Resolved { rule, agent } => {
                    tracing::info!(tenant, rule = rule.as_str(), agent = %agent, "alert resolved");
                    counters.active.fetch_sub(1, Ordering::Relaxed);
                    let at = now_ms();
                    if let Some(alert) = recent.iter_mut().rev().find(|a| {
                        a.tenant == tenant && a.rule == rule && a.agent == agent && a.resolved_at_ms.is_none()
                    }) {
                        alert.resolved_at_ms = Some(at);
                    }
                }
            }
        }
        drop(recent);
        self.changed.send_modify(|n| *n += 1);
    }

    async fn follow_tenants(self: Arc<Self>, feeds: Arc<Feeds>, mut shutdown: watch::Receiver<bool>) {
        let mut started = feeds.subscribe_started();
        let mut following: BTreeSet<String> = BTreeSet::new();
        loop {
            for tenant in feeds.tenants() {
                if following.insert(tenant.clone()) {
                    tokio::spawn(self.clone().follow(tenant, feeds.clone(), shutdown.clone()));
                }
            }
            tokio::select! {
                _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                changed = started.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Evaluates one tenant's rules on every change of its feed and every [`TICK`].
    async fn follow(self: Arc<Self>, tenant: String, feeds: Arc<Feeds>, mut shutdown: watch::Receiver<bool>) {
        let mut rules = Rules::new(&tenant, self.config.clone());
        let mut failures = 0;
        loop {
            let feed = match feeds.get(&tenant).await {
                Ok(feed) => feed,
                Err(e) => {
                    tracing::warn!(%tenant, "alert rules cannot read the tenant's state: {e}");
                    let wait = agent_reach_support::backoff::jittered(
                        failures,
                        Duration::from_millis(200),
                        Duration::from_secs(5),
                    );
                    failures += 1;
                    tokio::select! {
                        _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            failures = 0;
            let mut head = feed.subscribe();
            let mut reported = self.reports.subscribe();
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                reported.borrow_and_update();
                let traffic = self.reports.tenant(&tenant);
                // A pass over a large tenant takes milliseconds of CPU (10,000 small
                // records: 2-3 ms in a release build): on a blocking thread, so the
                // runtime's workers go on applying the feed and streaming deltas to
                // sidecars meanwhile. On a worker it held changes' propagation up behind
                // it by up to ~30 ms (the scale example's p99 at 100 watchers).
                let view = feed.clone();
                let evaluated = tokio::task::spawn_blocking(move || {
                    let (revision, instances, policies) = view.entries();
                    rules.set_thresholds(Thresholds::from_proto(&policies));
                    let findings = rules.evaluate(Instant::now(), now_ms(), revision, &instances, &traffic);
                    (rules, findings)
                })
                .await;
                let findings = match evaluated {
                    Ok((back, findings)) => {
                        rules = back;
                        findings
                    }
                    // The pass panicked: its state went with it; start the tenant's rules anew.
                    Err(e) => {
                        tracing::error!(%tenant, "alert rules failed: {e}");
                        rules = Rules::new(&tenant, self.config.clone());
                        Vec::new()
                    }
                };
                self.record(&tenant, findings);
                tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(MIN_EVALUATION_GAP) => {}
                }
                tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    changed = head.changed() => if changed.is_err() { break },
                    _ = reported.changed() => {}
                    _ = tick.tick() => {}
                }
            }
        }
    }
}

/// The signature header's value for `body` sent at `timestamp` (Unix seconds):
/// `sha256=` and the hex HMAC-SHA256 of `"{timestamp}.{body}"` under `secret`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let mut out = String::from("sha256=");
    for b in tag.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Claims the delivery of `alert` for this replica; true when no other replica has.
async fn claim(store: &dyn Store, alert: &Alert) -> bool {
    let key = format!("{CLAIMS_ROOT}{}/{}/{}", alert.tenant, alert.rule.as_str(), alert.agent);
    let lease = match store.grant_lease(CLAIM_TTL).await {
        Ok(grant) => grant.id,
        Err(e) => {
            // Better twice than never: without the store, deliver anyway.
            tracing::warn!("cannot claim the alert's delivery ({e}); delivering it anyway");
            return true;
        }
    };
    let value = Bytes::from(alert.id.clone());
    let txn = Txn {
        compares: vec![Compare::ModRevision(key.clone(), 0)],
        success: vec![Op::Put { key, value, lease: Some(lease) }],
        failure: vec![],
    };
    match store.txn(txn).await {
        Ok(result) => {
            if !result.succeeded {
                let _ = store.revoke_lease(lease).await;
            }
            result.succeeded
        }
        Err(e) => {
            tracing::warn!("cannot claim the alert's delivery ({e}); delivering it anyway");
            true
        }
    }
}

/// POSTs each queued alert to the webhook (see the module documentation).
async fn deliver(
    hook: WebhookConfig,
    mut queue: mpsc::Receiver<Alert>,
    store: Arc<dyn Store>,
    stats: Arc<ControlStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let counters = &stats.alerts;
    loop {
        let alert = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            alert = queue.recv() => match alert { Some(a) => a, None => return },
        };
        if !claim(store.as_ref(), &alert).await {
            ControlStats::inc(&counters.webhook_claimed_elsewhere);
            continue;
        }
        let body = match serde_json::to_vec(&alert) {
            Ok(body) => Bytes::from(body),
            Err(_) => continue,
        };
        let mut delivered = false;
        for attempt in 0..hook.attempts.max(1) {
            if attempt > 0 {
                let wait = agent_reach_support::backoff::jittered(attempt - 1, hook.backoff, Duration::from_secs(30));
                tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            ControlStats::inc(&counters.webhook_attempts);
            let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let request = http::Request::post(hook.url.clone())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header("x-agent-reach-timestamp", timestamp.to_string())
                .header("x-agent-reach-signature", signature(&hook.secret, timestamp, &body))
                .header("x-agent-reach-alert-id", alert.id.as_str())
                .body(Full::new(body.clone()));
            let Ok(request) = request else { break };
            match tokio::time::timeout(hook.timeout, client.request(request)).await {
                Ok(Ok(response)) if response.status().is_success() => {
                    delivered = true;
                    break;
                }
                Ok(Ok(response)) => {
                    let status = response.status();
                    tracing::warn!(alert = %alert.id, %status, attempt, "alert webhook refused the alert");
                    // Other client errors will not get better by retrying.
                    if status.is_client_error()
                        && status != http::StatusCode::REQUEST_TIMEOUT
                        && status != http::StatusCode::TOO_MANY_REQUESTS
                    {
                        break;
                    }
                }
                Ok(Err(e)) => tracing::warn!(alert = %alert.id, attempt, "alert webhook: {e}"),
                Err(_) => {
                    tracing::warn!(alert = %alert.id, attempt, "alert webhook did not answer in {:?}", hook.timeout)
                }
            }
        }
        ControlStats::inc(if delivered { &counters.webhook_delivered } else { &counters.webhook_failed });
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::{StateHold, fixture};

    use super::*;

    fn instance(agent: &str, id: &str, state: HealthState) -> InstanceStatus {
        fixture::instance(id).tenant("t").agent(agent).sidecar("s", "127.0.0.1:1").state(state).status()
    }

    fn fired(findings: &[Finding]) -> Vec<(Rule, String, Vec<String>)> {
        findings
            .iter()
            .filter_map(|f| match f {
                Finding::Fired(a) => Some((a.rule, a.agent.clone(), a.instances.clone())),
                Finding::Resolved { .. } => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn two_losses_within_the_window_fire_once_then_resolve() {
        let mut rules = Rules::new("t", AlertConfig::default());
        let up = |id: &str| instance("tr", id, HealthState::Up);
        let t0 = Instant::now();
        assert!(rules.evaluate(t0, 0, 1, &[up("a"), up("b"), up("c")], &[]).is_empty());
        // One instance lost: nothing yet.
        let one_down = [instance("tr", "a", HealthState::Down), up("b"), up("c")];
        assert!(rules.evaluate(t0 + Duration::from_secs(1), 0, 2, &one_down, &[]).is_empty());
        // A second one (removed without pausing) 10 s later: fired, once.
        let two_lost = [instance("tr", "a", HealthState::Down), up("c")];
        let findings = rules.evaluate(t0 + Duration::from_secs(11), 0, 3, &two_lost, &[]);
        assert_eq!(fired(&findings), [(Rule::InstancesLost, "tr".to_string(), vec!["a".to_string(), "b".to_string()])]);
        assert!(rules.evaluate(t0 + Duration::from_secs(12), 0, 3, &two_lost, &[]).is_empty());
        // 15 s after the last loss: resolved.
        let findings = rules.evaluate(t0 + Duration::from_secs(27), 0, 3, &two_lost, &[]);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::InstancesLost, agent: "tr".into() }]);
    }

    #[tokio::test(start_paused = true)]
    async fn losses_further_apart_than_the_window_and_graceful_exits_do_not_fire() {
        let config = AlertConfig { min_healthy: 0, ..AlertConfig::default() };
        let mut rules = Rules::new("t", config.clone());
        let t0 = Instant::now();
        let up = |id: &str| instance("tr", id, HealthState::Up);
        let down = |id: &str| instance("tr", id, HealthState::Down);
        rules.evaluate(t0, 0, 1, &[up("a"), up("b"), up("c")], &[]);
        rules.evaluate(t0, 0, 2, &[down("a"), up("b"), up("c")], &[]);
        // 16 s later the second loss: the first one is out of the window.
        let later = rules.evaluate(t0 + Duration::from_secs(16), 0, 3, &[down("a"), down("b"), up("c")], &[]);
        assert!(fired(&later).is_empty(), "{later:?}");
        // Two instances pausing, then leaving together: a graceful exit, not a loss.
        let mut rules = Rules::new("t", config);
        rules.evaluate(t0, 0, 1, &[up("a"), up("b")], &[]);
        rules.evaluate(
            t0,
            0,
            2,
            &[instance("tr", "a", HealthState::Paused), instance("tr", "b", HealthState::Paused)],
            &[],
        );
        let gone = rules.evaluate::<InstanceStatus>(t0, 0, 3, &[], &[]);
        assert!(gone.is_empty(), "{gone:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn below_minimum_counts_holds_as_healthy_and_watches_lost_agents() {
        let mut rules = Rules::new("t", AlertConfig { min_healthy: 2, lost_count: 99, ..AlertConfig::default() });
        let t0 = Instant::now();
        let mut held = instance("tr", "b", HealthState::Paused);
        held.holds.push(StateHold {
            state: HealthState::Paused,
            reason: "disk swap".into(),
            scope: agent_reach::model::HoldScope::Instance,
            set_at_ms: 0,
        });
        assert!(rules.evaluate(t0, 0, 1, &[instance("tr", "a", HealthState::Up), held.clone()], &[]).is_empty());
        let findings = rules.evaluate(t0, 0, 2, &[instance("tr", "a", HealthState::Unknown), held.clone()], &[]);
        assert_eq!(fired(&findings), [(Rule::BelowMinHealthy, "tr".to_string(), vec!["a".to_string()])]);
        let findings = rules.evaluate(t0, 0, 3, &[instance("tr", "a", HealthState::Up), held], &[]);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::BelowMinHealthy, agent: "tr".into() }]);
        // Every instance lost: the agent stays watched and below its minimum.
        let findings = rules.evaluate::<InstanceStatus>(t0, 0, 4, &[], &[]);
        assert_eq!(fired(&findings), [(Rule::BelowMinHealthy, "tr".to_string(), vec![])]);
    }

    fn traffic(sidecar: &str, edges: Vec<(&str, &str, u64, u64)>, open: &[&str]) -> Arc<SidecarTraffic> {
        Arc::new(SidecarTraffic {
            tenant: "t".into(),
            sidecar_id: sidecar.into(),
            received_at_ms: 0,
            window_ms: 60_000,
            edges: edges
                .into_iter()
                .map(|(target, agent, calls, fallback_calls)| crate::reports::Edge {
                    caller: "planner".into(),
                    target: target.into(),
                    agent: agent.into(),
                    calls,
                    errors: 0,
                    fallback_calls,
                    latency: vec![],
                })
                .collect(),
            open_breakers: open.iter().map(|s| s.to_string()).collect(),
            instances: vec![],
            spans: vec![],
            bounds_ms: vec![],
        })
    }

    #[tokio::test(start_paused = true)]
    async fn fallback_serving_sums_every_sidecars_report() {
        let config = AlertConfig { min_healthy: 0, ..AlertConfig::default() };
        let mut rules = Rules::new("t", config);
        let t0 = Instant::now();
        let target = "capability text.translate";
        // 2 + 2 calls served by the fallback: below the default 5.
        let some =
            [traffic("a", vec![(target, "backup", 2, 2)], &[]), traffic("b", vec![(target, "backup", 2, 2)], &[])];
        assert!(rules.evaluate::<InstanceStatus>(t0, 0, 1, &[], &some).is_empty());
        // Sidecar b's next report has 3 more: 5 in all, fired once, naming the serving agent.
        let more = [some[0].clone(), traffic("b", vec![(target, "backup", 9, 3), (target, "translator", 4, 0)], &[])];
        let findings = rules.evaluate::<InstanceStatus>(t0, 0, 2, &[], &more);
        assert_eq!(fired(&findings), [(Rule::FallbackServing, target.to_string(), vec!["backup".to_string()])]);
        let Finding::Fired(alert) = &findings[0] else { unreachable!() };
        assert_eq!(alert.message, "capability text.translate: 5 of 15 calls in the last minute served by its fallback");
        assert!(rules.evaluate::<InstanceStatus>(t0, 0, 3, &[], &more).is_empty());
        // The last minute without fallback calls: resolved.
        let calm = [traffic("a", vec![(target, "translator", 7, 0)], &[])];
        let findings = rules.evaluate::<InstanceStatus>(t0, 0, 4, &[], &calm);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::FallbackServing, agent: target.into() }]);
    }

    #[tokio::test(start_paused = true)]
    async fn breakers_open_on_more_than_half_of_an_agents_instances() {
        let config = AlertConfig { min_healthy: 0, ..AlertConfig::default() };
        let mut rules = Rules::new("t", config);
        let t0 = Instant::now();
        let up = |id: &str| instance("tr", id, HealthState::Up);
        let all = [up("a"), up("b"), up("c"), up("d")];
        // Two of four (one seen by each of two sidecars): half is not more than half.
        let half = [traffic("s1", vec![], &["a"]), traffic("s2", vec![], &["b", "other-agent-x"])];
        assert!(rules.evaluate(t0, 0, 1, &all, &half).is_empty());
        let three = [traffic("s1", vec![], &["a", "c"]), traffic("s2", vec![], &["b", "c"])];
        let findings = rules.evaluate(t0, 0, 2, &all, &three);
        assert_eq!(
            fired(&findings),
            [(Rule::BreakersOpen, "tr".to_string(), vec!["a".to_string(), "b".to_string(), "c".to_string()])]
        );
        assert!(rules.evaluate(t0, 0, 3, &all, &three).is_empty());
        let findings = rules.evaluate(t0, 0, 4, &all, &half);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::BreakersOpen, agent: "tr".into() }]);
    }

    #[tokio::test(start_paused = true)]
    async fn policies_set_thresholds_per_agent_over_the_tenants_over_the_flags() {
        let mut rules = Rules::new("t", AlertConfig::default());
        let t0 = Instant::now();
        let up = |agent: &str, id: &str| instance(agent, id, HealthState::Up);
        let all = [up("tr", "a"), up("tr", "b"), up("sum", "c"), up("sum", "d")];
        assert!(rules.evaluate(t0, 0, 1, &all, &[]).is_empty());
        // The translator's policy wants 3 healthy instances: only it fires, with its minimum.
        let mut thresholds = Thresholds::default();
        thresholds.agents.insert("tr".into(), AlertThresholds { min_healthy: Some(3), ..Default::default() });
        rules.set_thresholds(thresholds.clone());
        let findings = rules.evaluate(t0, 0, 2, &all, &[]);
        assert_eq!(fired(&findings), [(Rule::BelowMinHealthy, "tr".to_string(), vec![])]);
        let Finding::Fired(alert) = &findings[0] else { unreachable!() };
        assert_eq!(alert.message, "tr has 2 healthy instance(s), fewer than the minimum 3");
        // The tenant policy raises everyone's minimum to 3; the translator's own 0 disables it.
        thresholds.tenant.min_healthy = Some(3);
        thresholds.agents.insert("tr".into(), AlertThresholds { min_healthy: Some(0), ..Default::default() });
        rules.set_thresholds(thresholds.clone());
        let findings = rules.evaluate(t0, 0, 3, &all, &[]);
        assert_eq!(fired(&findings), [(Rule::BelowMinHealthy, "sum".to_string(), vec![])]);
        assert!(findings.contains(&Finding::Resolved { rule: Rule::BelowMinHealthy, agent: "tr".into() }));
        // Losses: the summarizer counts one loss as an alert within its 60 s window.
        thresholds.agents.insert(
            "sum".into(),
            AlertThresholds {
                min_healthy: Some(0),
                lost_count: Some(1),
                lost_window_ms: Some(60_000),
                ..Default::default()
            },
        );
        rules.set_thresholds(thresholds.clone());
        let findings = rules.evaluate(t0, 0, 4, &all, &[]);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::BelowMinHealthy, agent: "sum".into() }]);
        let one_lost = [
            up("tr", "a"),
            instance("tr", "b", HealthState::Down),
            instance("sum", "c", HealthState::Down),
            up("sum", "d"),
        ];
        let findings = rules.evaluate(t0 + Duration::from_secs(1), 0, 5, &one_lost, &[]);
        assert_eq!(fired(&findings), [(Rule::InstancesLost, "sum".to_string(), vec!["c".to_string()])]);
        let Finding::Fired(alert) = &findings[0] else { unreachable!() };
        assert_eq!(alert.message, "1 instances of sum lost within 60s");
        // Still in force 30 s later (the flag's 15 s window would have let it go).
        assert!(rules.evaluate(t0 + Duration::from_secs(31), 0, 5, &one_lost, &[]).is_empty());
        let findings = rules.evaluate(t0 + Duration::from_secs(62), 0, 5, &one_lost, &[]);
        assert_eq!(findings, [Finding::Resolved { rule: Rule::InstancesLost, agent: "sum".into() }]);
        // Where each threshold in force comes from.
        let config = AlertConfig::default();
        let tr = thresholds.for_agent("tr", &config);
        assert_eq!(tr.min_healthy, Setting { value: 0, source: Source::Own });
        assert_eq!(tr.lost_count, Setting { value: 2, source: Source::Default });
        assert_eq!(thresholds.for_agent("other", &config).min_healthy, Setting { value: 3, source: Source::Tenant });
    }

    #[tokio::test(start_paused = true)]
    async fn fallback_and_breaker_thresholds_come_from_the_targets_policy() {
        let mut rules = Rules::new("t", AlertConfig { min_healthy: 0, ..AlertConfig::default() });
        let mut thresholds = Thresholds::default();
        thresholds
            .capabilities
            .insert("quiet".into(), AlertThresholds { fallback_calls: Some(0), ..Default::default() });
        thresholds
            .capabilities
            .insert("touchy".into(), AlertThresholds { fallback_calls: Some(1), ..Default::default() });
        thresholds
            .agents
            .insert("tr".into(), AlertThresholds { breakers_open_percent: Some(20), ..Default::default() });
        rules.set_thresholds(thresholds);
        let t0 = Instant::now();
        // 9 fallback calls of "quiet" (disabled), 1 of "touchy [eu]" (threshold 1).
        let reports = [traffic(
            "a",
            vec![("capability quiet", "backup", 9, 9), ("capability touchy [eu]", "backup", 3, 1)],
            &["a"],
        )];
        let up = |id: &str| instance("tr", id, HealthState::Up);
        let instances = [up("a"), up("b"), up("c"), up("d")];
        let findings = rules.evaluate(t0, 0, 1, &instances, &reports);
        // One of four open is 25 %, more than the translator's 20 %.
        assert_eq!(
            fired(&findings),
            [
                (Rule::FallbackServing, "capability touchy [eu]".to_string(), vec!["backup".to_string()]),
                (Rule::BreakersOpen, "tr".to_string(), vec!["a".to_string()]),
            ]
        );
    }

    #[test]
    fn signature_is_hmac_sha256_of_timestamp_and_body() {
        // RFC 4231 test case 2 ("Jefe"), with the message split as "{timestamp}.{body}".
        let sig = signature(b"Jefe", 0, b"");
        assert_eq!(sig.len(), "sha256=".len() + 64);
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        assert!(ring::hmac::verify(&key, b"17.{}", &hex(&signature(b"Jefe", 17, b"{}")["sha256=".len()..])).is_ok());
        assert_ne!(signature(b"Jefe", 17, b"{}"), signature(b"Jefe", 18, b"{}"));
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The rules read a feed entry as they read the operators' view of it: the hold's
    /// state wins over the reported one, and either hold counts as held.
    #[tokio::test(start_paused = true)]
    async fn a_feed_entry_reads_as_its_status() {
        let hold = |state| StateHold {
            state,
            reason: "swap".into(),
            scope: agent_reach::model::HoldScope::Instance,
            set_at_ms: 0,
        };
        let stored = |id: &str, reported, instance_hold, agent_hold| crate::record::StoredInstance {
            record: fixture::instance(id).tenant("t").agent("tr").sidecar("s", "127.0.0.1:1").state(reported).record(),
            instance_hold,
            agent_hold,
            generation: 1,
        };
        let entries: Vec<Arc<Entry>> = [
            stored("a", HealthState::Up, None, None),
            stored("b", HealthState::Down, Some(hold(HealthState::Paused)), None),
            stored("c", HealthState::Degraded, None, Some(hold(HealthState::Paused))),
            stored("d", HealthState::Unknown, None, None),
        ]
        .into_iter()
        .map(|stored| Arc::new(Entry { stored, mod_revision: 7, lease: 0, wire: proto::Instance::default() }))
        .collect();
        let statuses: Vec<InstanceStatus> = entries.iter().map(|e| e.stored.status(e.mod_revision)).collect();
        let read = |w: &dyn Watched| (w.id().to_string(), w.agent().to_string(), w.state(), w.held(), healthy(w));
        for (entry, status) in entries.iter().zip(&statuses) {
            assert_eq!(read(entry), read(status));
        }
        let states: Vec<_> = entries.iter().map(|e| (e.state(), e.held(), healthy(e))).collect();
        assert_eq!(
            states,
            [
                (HealthState::Up, false, true),
                (HealthState::Paused, true, true),
                (HealthState::Paused, true, true),
                (HealthState::Unknown, false, false),
            ]
        );
        // The same findings from either.
        let config = AlertConfig { min_healthy: 4, ..AlertConfig::default() };
        let (mut by_entry, mut by_status) = (Rules::new("t", config.clone()), Rules::new("t", config));
        let t0 = Instant::now();
        let findings = by_entry.evaluate(t0, 0, 7, &entries, &[]);
        assert_eq!(findings, by_status.evaluate(t0, 0, 7, &statuses, &[]));
        assert_eq!(fired(&findings), [(Rule::BelowMinHealthy, "tr".to_string(), vec!["d".to_string()])]);
    }
}
