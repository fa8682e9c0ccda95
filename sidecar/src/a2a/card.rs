//! Agent cards: each agent of the routing table, as an A2A client sees it. Skills are the
//! agent's capabilities (with their tags) across its instances; the interfaces are this
//! sidecar's A2A endpoints, with the A2A `tenant` naming the agent within the mesh tenant.

use std::collections::{BTreeMap, BTreeSet};

use super::A2a;
use super::error::A2aError;
use super::proto::{AgentCapabilities, AgentCard, AgentInterface, AgentSkill};

/// The A2A protocol version the endpoints speak.
pub(crate) const PROTOCOL_VERSION: &str = "1.0";
/// The media types the endpoints turn into payloads and back.
const MODES: [&str; 3] = ["text/plain", "application/json", "application/octet-stream"];

impl A2a {
    /// The card of `agent`, from the routing table.
    pub(crate) fn card(&self, agent: &str) -> Result<AgentCard, A2aError> {
        if agent.is_empty() {
            return Err(A2aError::InvalidParams("tenant must name the mesh agent whose card is wanted".into()));
        }
        let table = self.table.load();
        let Some(group) = table.by_agent.get(agent).filter(|g| !g.members.is_empty()) else {
            let suggestions = agent_reach_routing::route::suggestions(table.by_agent.keys().map(String::as_str), agent);
            return Err(A2aError::Mesh(agent_reach::reason::agent_not_found(
                format!("no agent {agent:?} in tenant {:?}", self.tenant()),
                format!("agent {agent}"),
                &suggestions,
            )));
        };
        let mut skills: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut versions = BTreeSet::new();
        let mut description = None;
        for m in &group.members {
            let r = &m.instance.record.registration;
            versions.insert(r.version.as_str());
            description = description.or_else(|| r.metadata.get("description").map(String::as_str));
            for c in &r.capabilities {
                skills.entry(c.name.as_str()).or_default().extend(c.tags.iter().map(String::as_str));
            }
        }
        let mut interfaces = Vec::new();
        if let Some(url) = &self.jsonrpc_url {
            interfaces.push(AgentInterface {
                url: format!("{url}/agents/{agent}"),
                protocol_binding: "JSONRPC".into(),
                tenant: agent.to_string(),
                protocol_version: PROTOCOL_VERSION.into(),
            });
        }
        interfaces.push(AgentInterface {
            url: self.grpc_address.clone(),
            protocol_binding: "GRPC".into(),
            tenant: agent.to_string(),
            protocol_version: PROTOCOL_VERSION.into(),
        });
        let modes: Vec<String> = MODES.iter().map(|m| m.to_string()).collect();
        Ok(AgentCard {
            name: agent.to_string(),
            description: description.map_or_else(
                || format!("Agent {agent} of the Agent-Reach mesh tenant {}", self.tenant()),
                str::to_string,
            ),
            supported_interfaces: interfaces,
            provider: None,
            // The newest version any instance runs (versions sort as text).
            version: versions.last().map_or_else(String::new, |v| v.to_string()),
            documentation_url: None,
            capabilities: Some(AgentCapabilities {
                streaming: Some(true),
                push_notifications: Some(false),
                extensions: vec![],
                extended_agent_card: Some(true),
            }),
            security_schemes: Default::default(),
            security_requirements: vec![],
            default_input_modes: modes.clone(),
            default_output_modes: modes,
            skills: skills
                .into_iter()
                .map(|(name, tags)| AgentSkill {
                    id: name.to_string(),
                    name: name.to_string(),
                    description: format!("mesh capability {name}"),
                    tags: tags.into_iter().map(str::to_string).collect(),
                    ..Default::default()
                })
                .collect(),
            signatures: vec![],
            icon_url: None,
        })
    }
}
