//! Agent-Reach: the gRPC API of the mesh and the Rust SDK for agents.
//!
//! - [`proto`]: the generated `agentreach.v1` messages, clients and servers.
//! - [`model`]: domain types shared by control and sidecar (no protobuf, no etcd).
//! - [`convert`]: the one place where domain types and protobuf messages meet.
//! - [`reason`]: machine-readable error reasons and the `tonic::Status` they become.
//! - [`headers`]: every `ar-*` header and metadata key of the mesh's wire contract.
//! - [`reflection`]: gRPC server reflection over the whole API, for control and sidecars.
//! - [`strict`]: malformed requests to the health and reflection services answered with
//!   INVALID_ARGUMENT, like every other RPC.
//! - [`Agent`] and [`Client`]: the SDK. An agent declares its capabilities and handlers and
//!   serves; a client invokes capabilities through the local sidecar.
//!
//! This crate does not route or store anything; the sidecar and control crates do.
//!
//! # The SDK
//!
//! | type | what it is |
//! |---|---|
//! | [`Agent`], [`AgentBuilder`] | declare an agent's name, version, capabilities (with tags) and handlers; [`serve`](AgentBuilder::serve) or [`start`](AgentBuilder::start) it |
//! | [`RunningAgent`] | a started agent: its instance id, a [`Client`] that calls as it, graceful [`shutdown`](RunningAgent::shutdown) |
//! | [`Call`], [`Reply`], [`HandlerError`] | what a handler receives, answers, or fails with |
//! | [`Client`], [`InvokeBuilder`] | call a capability or an agent through the local sidecar |
//! | [`InvokeReply`], [`ChunkStream`] | an answer, with the serving instance, attempts, route and trace id; a streamed answer |
//! | [`InvokeError`], [`AgentError`] | why a call failed (gRPC code, the mesh's reason and details); why an agent did not start |
//!
//! An agent registers with the sidecar on its host (`AGENT_REACH_SIDECAR`, default
//! [`DEFAULT_SIDECAR_ADDR`]), heartbeats its load, and answers calls the sidecar delivers:
//!
//! ```no_run
//! use agent_reach::{Agent, Reply};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), agent_reach::AgentError> {
//!     Agent::builder("summarizer")
//!         .version("1.2.0")
//!         .capability("text.summarize", ["en", "zh"])
//!         .handle("text.summarize", |call| async move {
//!             let text = call.text()?;
//!             Ok(Reply::text(text.split_whitespace().take(20).collect::<Vec<_>>().join(" ")))
//!         })
//!         .serve() // until ctrl-c or SIGTERM, then PAUSED, drain, deregister
//!         .await
//! }
//! ```
//!
//! A caller names a capability (with required tags) or an agent; the sidecar picks the
//! instance, retries where that is safe, and says in the reply what it did:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), agent_reach::InvokeError> {
//!     let mesh = agent_reach::Client::connect_local().await?;
//!     match mesh.invoke("text.summarize").tags(["zh"]).timeout(Duration::from_secs(3)).text("…").send().await {
//!         Ok(reply) => println!("{} (served by {}, {})", reply.text(), reply.instance(), reply.route()),
//!         Err(e) if e.reason() == Some("AGENT_NOT_FOUND") => println!("did you mean {:?}?", e.suggestions()),
//!         Err(e) => return Err(e),
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Handlers are plain async functions of a [`Call`], so they can be tested without a mesh:
//!
//! ```
//! use agent_reach::{Call, HandlerError, Reply};
//!
//! async fn shout(call: Call) -> Result<Reply, HandlerError> {
//!     Ok(Reply::text(call.text()?.to_uppercase()))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let reply = shout(Call::new("text.shout", "hi")).await.unwrap();
//! assert_eq!(reply.payload().as_ref(), b"HI");
//! # }
//! ```

pub mod codec;
pub mod convert;
pub mod headers;
pub mod model;
pub mod policy;
pub mod policy_alerts;
pub mod reason;
pub mod reflection;
mod sdk;
pub mod strict;

pub use model::Priority;
pub use sdk::agent::{Agent, AgentBuilder, AgentError, Call, HandlerError, Reply, RunningAgent};
pub use sdk::client::{ChunkStream, Client, InvokeBuilder, InvokeError, InvokeReply};
pub use sdk::session::{Policy, Session, SessionError, SessionField, SessionSnapshot};
pub use sdk::task::{SubmitBuilder, Submitted, TaskContext, TaskHandle, TaskUpdates};
pub use sdk::{ApiToken, SidecarChannel};

/// Generated protobuf messages and gRPC clients/servers of `agentreach.v1`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agentreach.v1");
}

/// Default address of the sidecar's local API, used by [`Client::connect_local`] and
/// [`AgentBuilder`] when `AGENT_REACH_SIDECAR` is not set.
pub const DEFAULT_SIDECAR_ADDR: &str = "127.0.0.1:7700";
