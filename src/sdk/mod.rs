//! The Rust SDK: [`agent`] turns a few handler closures into a mesh agent; [`client`]
//! calls capabilities through the local sidecar; [`task`] submits durable tasks and lets
//! handlers report on them.

pub mod agent;
pub mod client;
mod killable;
pub mod session;
pub mod task;

/// The SDK's connection to its sidecar: a channel whose every request carries the
/// sidecar's local API token when `AGENT_REACH_API_TOKEN` is set (`--local-token-file` on
/// the sidecar).
pub type SidecarChannel = tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ApiToken>;

/// Adds the local API token (`ar-api-token`) to every request to the sidecar.
#[derive(Clone, Debug, Default)]
pub struct ApiToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl ApiToken {
    /// The token in `AGENT_REACH_API_TOKEN`, if set (and valid as metadata).
    pub fn from_env() -> ApiToken {
        ApiToken(std::env::var("AGENT_REACH_API_TOKEN").ok().and_then(|t| t.trim().parse().ok()))
    }
}

impl tonic::service::Interceptor for ApiToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert(crate::headers::API_TOKEN, token.clone());
        }
        Ok(request)
    }
}

/// A client of the sidecar's local API on `channel`, presenting the API token if any.
pub(crate) fn sidecar_client(
    channel: tonic::transport::Channel,
) -> crate::proto::sidecar_client::SidecarClient<SidecarChannel> {
    crate::proto::sidecar_client::SidecarClient::with_interceptor(channel, ApiToken::from_env())
}

/// Address of the local sidecar: `AGENT_REACH_SIDECAR` or [`crate::DEFAULT_SIDECAR_ADDR`].
pub(crate) fn default_sidecar_addr() -> String {
    std::env::var("AGENT_REACH_SIDECAR").unwrap_or_else(|_| crate::DEFAULT_SIDECAR_ADDR.to_string())
}

/// `http://` + address, unless it already has a scheme.
pub(crate) fn with_scheme(addr: &str) -> String {
    if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") }
}
