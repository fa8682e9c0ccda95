//! Helpers every Agent-Reach crate and binary uses the same way, kept out of the SDK's
//! public API: building the tokio runtime, logging and shutdown ([`process`]), retry
//! delays ([`backoff`]), durations on the command line ([`duration`]) and the gRPC
//! `grpc-timeout` header ([`grpc_timeout`]). Not a public API; it may change with any
//! release.

pub mod backoff;
pub mod duration;
pub mod grpc_timeout;
pub mod process;
