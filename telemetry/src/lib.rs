//! Observability shared by the control service and the sidecar:
//!
//! - [`admin`]: the admin HTTP port — `/metrics` (Prometheus text), `/healthz` (the process
//!   is alive), `/readyz` (it can do its job), `/traces/{trace-id}` (recent spans of a trace
//!   from the in-memory buffer);
//! - [`semconv`]: the OpenTelemetry RPC and GenAI-agent attributes spans carry besides
//!   `agent_reach.*`;
//! - [`trace`]: spans per hop with W3C trace context, exported over OTLP/gRPC and kept in a
//!   small buffer of recent spans for setups without a tracing backend.
//!
//! What to measure and which spans to open is decided by the control and sidecar crates;
//! this crate only serves and exports.

pub mod admin;
pub mod http1;
pub mod semconv;
pub mod trace;

pub use admin::{AdminState, serve_admin};
pub use trace::{RecentSpans, SpanRecord, TraceConfig, Tracing};
