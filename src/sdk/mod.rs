//! The Rust SDK: [`agent`] turns a few handler closures into a mesh agent; [`client`]
//! calls capabilities through the local sidecar; [`task`] submits durable tasks and lets
//! handlers report on them.

pub mod agent;
pub mod client;
mod killable;
pub mod session;
pub mod task;

/// Address of the local sidecar: `AGENT_REACH_SIDECAR` or [`crate::DEFAULT_SIDECAR_ADDR`].
pub(crate) fn default_sidecar_addr() -> String {
    std::env::var("AGENT_REACH_SIDECAR").unwrap_or_else(|_| crate::DEFAULT_SIDECAR_ADDR.to_string())
}

/// `http://` + address, unless it already has a scheme.
pub(crate) fn with_scheme(addr: &str) -> String {
    if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") }
}
