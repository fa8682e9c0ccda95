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
/// the sidecar). [`Client::raw`](crate::Client::raw) hands out a generated client on it,
/// for the local API methods the SDK does not wrap.
///
/// # Examples
///
/// ```no_run
/// use agent_reach::SidecarChannel;
/// use agent_reach::proto::{self, sidecar_client::SidecarClient};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let mesh = agent_reach::Client::connect_local().await?;
/// let mut sidecar: SidecarClient<SidecarChannel> = mesh.raw();
/// let page = sidecar.list_tasks(proto::ListTasksRequest::default()).await?.into_inner();
/// println!("{} tasks", page.tasks.len());
/// # Ok(())
/// # }
/// ```
pub type SidecarChannel = tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ApiToken>;

/// Adds the local API token (`ar-api-token`) to every request to the sidecar: the
/// interceptor of [`SidecarChannel`], for a channel of your own.
///
/// # Examples
///
/// ```no_run
/// use agent_reach::ApiToken;
/// use agent_reach::proto::sidecar_client::SidecarClient;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:7700").connect().await?;
/// // Presents $AGENT_REACH_API_TOKEN, if set, on every request.
/// let sidecar = SidecarClient::with_interceptor(channel, ApiToken::from_env());
/// # drop(sidecar);
/// # Ok(())
/// # }
/// ```
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
