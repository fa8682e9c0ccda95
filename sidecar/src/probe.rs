//! Health probes of local agents: `grpc.health.v1` Check for gRPC agents, and an HTTP GET
//! of the agent's health path (registration metadata `health_path`, default `/healthz`;
//! any 2xx is healthy) for HTTP/JSON agents. Decides nothing about state; the registry
//! counts failures.

use std::time::Duration;

use agent_reach::model::Transport;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::registry::LocalInstance;

/// Whether the agent answered its probe in time.
pub async fn healthy(inst: &LocalInstance, timeout: Duration) -> bool {
    match inst.registration.transport {
        Transport::Grpc => {
            let mut health = inst.health.clone();
            let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
            matches!(
                tokio::time::timeout(timeout, health.check(request)).await,
                Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
            )
        }
        Transport::Http => {
            let path = inst.registration.metadata.get("health_path").map(String::as_str).unwrap_or("/healthz");
            let url = format!(
                "http://{}{}",
                inst.authority,
                if path.starts_with('/') { path.to_string() } else { format!("/{path}") }
            );
            matches!(tokio::time::timeout(timeout, crate::http_agent::get(&url)).await, Ok(Ok(status)) if status.is_success())
        }
    }
}
