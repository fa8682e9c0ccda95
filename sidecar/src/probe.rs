//! Health probes of local agents: `grpc.health.v1` Check for gRPC agents (for A2A agents,
//! any gRPC answer, as an A2A server need not serve the health service), and an HTTP GET
//! of the agent's health path (registration metadata `health_path`, default `/healthz`;
//! any 2xx is healthy) for HTTP/JSON agents. Decides nothing about state; the registry
//! counts failures.

use std::time::Duration;

use agent_reach::model::Transport;
use tonic_health::pb::health_check_response::ServingStatus;

use agent_reach::model::Registration;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

/// How long a probe may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the agent answered its probe in time.
pub(crate) async fn healthy(
    registration: &Registration,
    authority: &str,
    health: &HealthClient<Channel>,
    timeout: Duration,
) -> bool {
    match registration.transport {
        Transport::Grpc => {
            let mut health = health.clone();
            let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
            matches!(
                tokio::time::timeout(timeout, health.check(request)).await,
                Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
            )
        }
        Transport::A2a => {
            let mut health = health.clone();
            let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
            match tokio::time::timeout(timeout, health.check(request)).await {
                Ok(Ok(r)) => r.get_ref().status == ServingStatus::Serving as i32,
                // The server answered in gRPC (an a2a-sdk server: UNIMPLEMENTED).
                Ok(Err(s)) => matches!(s.code(), tonic::Code::Unimplemented | tonic::Code::NotFound),
                Err(_) => false,
            }
        }
        Transport::Http => {
            let path = registration.metadata.get("health_path").map(String::as_str).unwrap_or("/healthz");
            let url = format!(
                "http://{}{}",
                authority,
                if path.starts_with('/') { path.to_string() } else { format!("/{path}") }
            );
            matches!(tokio::time::timeout(timeout, crate::http_client::get(&url)).await, Ok(Ok(status)) if status.is_success())
        }
    }
}
