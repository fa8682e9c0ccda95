//! Helpers every Agent-Reach crate and binary uses the same way, kept out of the SDK's
//! public API: building the tokio runtime, logging and shutdown ([`process`]), retry
//! delays ([`backoff`]), durations on the command line ([`duration`]), the gRPC
//! `grpc-timeout` header ([`grpc_timeout`]) and HTTP/2 control-frame floods on server
//! connections ([`h2guard`]). Not a public API; it may change with any
//! release.

pub mod backoff;
pub mod duration;
pub mod grpc_timeout;
pub mod h2guard;
pub mod process;
