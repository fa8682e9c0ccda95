//! What the dashboard's JSON endpoints answer, built from a tenant feed's memory and the
//! sidecars' traffic reports: the tenant's whole state (with the call topology, last
//! heartbeats and open breakers), the tenant list, capability search with suggestions, and
//! recent traces.

use std::collections::{BTreeMap, BTreeSet};

use agent_reach::convert::policy_from_proto;
use agent_reach::model::{AgentSummary, HoldScope, InstanceStatus, Registration};
use agent_reach::policy::Policy;
use serde::Serialize;

use crate::alerts::{Alert, Alerts, Effective, Thresholds};
use crate::feed::Feed;
use crate::reports::{EdgeView, Reports, SidecarTraffic, TraceView};

/// One tenant as the page shows it.
#[derive(Debug, Serialize)]
pub struct State {
    pub tenant: String,
    /// The store revision the state is at.
    pub revision: i64,
    pub generated_at_ms: i64,
    /// Sorted by agent, then instance id.
    pub instances: Vec<InstanceStatus>,
    pub agents: Vec<AgentSummary>,
    /// Each with the revision it was written at.
    pub policies: Vec<PolicyView>,
    /// Newest first.
    pub alerts: Vec<Alert>,
    /// Caller → target edges over the last minute, merged from every sidecar's report.
    pub topology: Vec<EdgeView>,
    /// Last heartbeat (Unix ms) of each instance, from its sidecar's report.
    pub last_heartbeats: BTreeMap<String, i64>,
    /// Instance → the sidecars holding its breaker open.
    pub open_breakers: BTreeMap<String, Vec<String>>,
    /// The sidecars that reported, and when.
    pub sidecars: Vec<SidecarSeen>,
    /// The alert thresholds in force: the tenant's, each agent's, and each capability whose
    /// policy sets one.
    pub alert_thresholds: Vec<ThresholdRow>,
}

/// The alert thresholds in force for the tenant, an agent or a capability.
#[derive(Debug, Serialize)]
pub struct ThresholdRow {
    /// `tenant`, `agent` or `capability` (the kind of policy that would set them).
    pub kind: &'static str,
    /// The agent or capability (`default` for the tenant).
    pub name: String,
    /// Whether that policy exists (editing changes it rather than creating one).
    pub has_policy: bool,
    #[serde(flatten)]
    pub effective: Effective,
}

/// The threshold rows of a tenant: the tenant's defaults, every agent with instances or a
/// policy, every capability whose policy sets alert thresholds.
fn threshold_rows(alerts: &Alerts, policies: &[Policy], agents: &BTreeSet<&str>) -> Vec<ThresholdRow> {
    use agent_reach::policy::PolicyKind;
    let mut thresholds = Thresholds::default();
    for p in policies {
        match p.kind {
            PolicyKind::Tenant => thresholds.tenant = p.spec.alerts,
            PolicyKind::Agent => {
                thresholds.agents.insert(p.name.clone(), p.spec.alerts);
            }
            PolicyKind::Capability => {
                thresholds.capabilities.insert(p.name.clone(), p.spec.alerts);
            }
        }
    }
    let exists = |kind: PolicyKind, name: &str| policies.iter().any(|p| p.kind == kind && p.name == name);
    let config = alerts.config();
    let mut rows = vec![ThresholdRow {
        kind: "tenant",
        name: "default".into(),
        has_policy: exists(PolicyKind::Tenant, "default"),
        effective: thresholds.for_tenant(config),
    }];
    let mut agent_names: BTreeSet<&str> = agents.clone();
    agent_names.extend(policies.iter().filter(|p| p.kind == PolicyKind::Agent).map(|p| p.name.as_str()));
    for agent in agent_names {
        rows.push(ThresholdRow {
            kind: "agent",
            name: agent.to_string(),
            has_policy: exists(PolicyKind::Agent, agent),
            effective: thresholds.for_agent(agent, config),
        });
    }
    for p in policies.iter().filter(|p| p.kind == PolicyKind::Capability && !p.spec.alerts.is_empty()) {
        rows.push(ThresholdRow {
            kind: "capability",
            name: p.name.clone(),
            has_policy: true,
            effective: thresholds.for_capability(&p.name, config),
        });
    }
    rows
}

#[derive(Debug, Serialize)]
pub struct SidecarSeen {
    pub sidecar_id: String,
    pub received_at_ms: i64,
    pub window_ms: u32,
}

#[derive(Debug, Serialize)]
pub struct PolicyView {
    #[serde(flatten)]
    pub policy: Policy,
    pub revision: i64,
}

pub fn state(tenant: &str, feed: &Feed, alerts: &Alerts, reports: &Reports) -> State {
    let traffic = reports.tenant(tenant);
    let (revision, instances, policies) = feed.view();
    let mut by_agent: BTreeMap<&str, Vec<&InstanceStatus>> = BTreeMap::new();
    for status in &instances {
        by_agent.entry(status.record.registration.agent.as_str()).or_default().push(status);
    }
    let agent_names: BTreeSet<&str> = by_agent.keys().copied().collect();
    let agents = by_agent
        .into_iter()
        .map(|(agent, list)| {
            let hold = list.iter().flat_map(|s| s.holds.iter()).find(|h| h.scope == HoldScope::Agent).cloned();
            let mut summary = AgentSummary::of(agent, list);
            summary.hold = hold;
            summary
        })
        .collect();
    let policies: Vec<PolicyView> = policies
        .into_iter()
        .filter_map(|p| {
            let revision = p.revision;
            policy_from_proto(p).ok().map(|policy| PolicyView { policy, revision })
        })
        .collect();
    let domain: Vec<Policy> = policies.iter().map(|p| p.policy.clone()).collect();
    let alert_thresholds = threshold_rows(alerts, &domain, &agent_names);
    State {
        tenant: tenant.to_string(),
        revision,
        generated_at_ms: crate::registry::now_ms(),
        instances,
        agents,
        policies,
        alerts: alerts.recent(tenant),
        topology: crate::reports::topology(&traffic),
        last_heartbeats: crate::reports::last_heartbeats(&traffic),
        open_breakers: open_breakers(&traffic),
        sidecars: traffic
            .iter()
            .map(|r| SidecarSeen {
                sidecar_id: r.sidecar_id.clone(),
                received_at_ms: r.received_at_ms,
                window_ms: r.window_ms,
            })
            .collect(),
        alert_thresholds,
    }
}

fn open_breakers(traffic: &[std::sync::Arc<SidecarTraffic>]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for report in traffic {
        for id in &report.open_breakers {
            out.entry(id.clone()).or_default().push(report.sidecar_id.clone());
        }
    }
    out
}

/// Traces found for a trace id or session id.
#[derive(Debug, Serialize)]
pub struct Traces {
    pub query: String,
    pub traces: Vec<TraceView>,
}

/// Traces shown at most per search.
const MAX_TRACES: usize = 20;

pub fn traces(traffic: &[std::sync::Arc<SidecarTraffic>], query: &str) -> Traces {
    let query: String = query.trim().chars().take(MAX_QUERY).collect();
    Traces { traces: crate::reports::traces(traffic, &query, MAX_TRACES), query }
}

#[derive(Debug, Serialize)]
pub struct Tenants<'a> {
    pub tenants: &'a [String],
}

pub fn tenants(names: &[String]) -> Tenants<'_> {
    Tenants { tenants: names }
}

/// What a search for a capability or agent name found.
#[derive(Debug, PartialEq, Serialize)]
pub struct Search {
    pub query: String,
    /// Capability names containing the query (case-insensitive), sorted.
    pub capabilities: Vec<String>,
    /// Agent names containing the query, sorted.
    pub agents: Vec<String>,
    /// When nothing contains it: the closest names, as `AGENT_NOT_FOUND` suggests them.
    pub suggestions: Vec<String>,
}

/// Longest query searched.
const MAX_QUERY: usize = 253;

/// Searches the feed's registrations as it holds them (shared, not copied). A tenant's
/// names are read in full, so the dashboard calls this on a blocking thread.
pub fn search(feed: &Feed, query: &str) -> Search {
    let (_, entries, _) = feed.entries();
    search_in(entries.iter().map(|e| &e.stored.record.registration), query)
}

fn search_in<'a>(registrations: impl Iterator<Item = &'a Registration> + Clone, query: &str) -> Search {
    let query: String = query.trim().chars().take(MAX_QUERY).collect();
    let capabilities: BTreeSet<&str> =
        registrations.clone().flat_map(|r| r.capabilities.iter().map(|c| c.name.as_str())).collect();
    let agents: BTreeSet<&str> = registrations.map(|r| r.agent.as_str()).collect();
    let lower = query.to_lowercase();
    let containing = |names: &BTreeSet<&str>| {
        names.iter().filter(|n| n.to_lowercase().contains(&lower)).map(|n| n.to_string()).collect()
    };
    let (found_caps, found_agents): (Vec<String>, Vec<String>) = (containing(&capabilities), containing(&agents));
    let suggestions = if query.is_empty() || !found_caps.is_empty() || !found_agents.is_empty() {
        Vec::new()
    } else {
        agent_reach_routing::suggestions(capabilities.iter().chain(agents.iter()).copied(), &query)
    };
    Search { query, capabilities: found_caps, agents: found_agents, suggestions }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::fixture;

    use super::*;

    fn instance(agent: &str, caps: &[&str]) -> InstanceStatus {
        let builder = fixture::instance(&format!("{agent}-1")).tenant("t").agent(agent).sidecar("s", "127.0.0.1:1");
        caps.iter().fold(builder, |b, c| b.capability(c, &[])).status()
    }

    #[test]
    fn search_finds_names_containing_the_query_else_suggests_close_ones() {
        let all =
            [instance("translator", &["text.translate", "text.detect"]), instance("summarizer", &["text.summarize"])];
        let search_in = |all: &[InstanceStatus], q: &str| search_in(all.iter().map(|s| &s.record.registration), q);
        let found = search_in(&all, "TEXT.");
        assert_eq!(found.capabilities, ["text.detect", "text.summarize", "text.translate"]);
        assert!(found.agents.is_empty() && found.suggestions.is_empty());
        assert_eq!(search_in(&all, "summ").agents, ["summarizer"]);
        let typo = search_in(&all, "text.tranlsate");
        assert!(typo.capabilities.is_empty() && typo.agents.is_empty());
        assert_eq!(typo.suggestions, ["text.translate"]);
        assert_eq!(search_in(&all, "zzzzzz").suggestions, Vec::<String>::new());
    }
}
