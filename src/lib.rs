//! Agent-Reach: the gRPC API of the mesh and the Rust SDK for agents.
//!
//! - [`proto`]: the generated `agentreach.v1` messages, clients and servers.
//! - [`model`]: domain types shared by control and sidecar (no protobuf, no etcd).
//! - [`convert`]: the one place where domain types and protobuf messages meet.
//! - [`reason`]: machine-readable error reasons and the `tonic::Status` they become.
//! - [`headers`]: every `ar-*` header and metadata key of the mesh's wire contract.
//! - [`reflection`]: gRPC server reflection over the whole API, for control and sidecars.
//! - [`Agent`] and [`Client`]: the SDK. An agent declares its capabilities and handlers and
//!   serves; a client invokes capabilities through the local sidecar.
//!
//! This crate does not route or store anything; the sidecar and control crates do.

pub mod convert;
pub mod headers;
pub mod model;
pub mod policy;
pub mod reason;
pub mod reflection;
mod sdk;

pub use model::Priority;
pub use sdk::agent::{Agent, AgentBuilder, AgentError, Call, HandlerError, Reply, RunningAgent};
pub use sdk::client::{ChunkStream, Client, InvokeBuilder, InvokeError, InvokeReply};

/// Generated protobuf messages and gRPC clients/servers of `agentreach.v1`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agentreach.v1");
}

/// Default address of the sidecar's local API.
pub const DEFAULT_SIDECAR_ADDR: &str = "127.0.0.1:7700";
