//! Limits of the control service's gRPC port (Control, Admin, Identity, Sessions, health,
//! reflection): HTTP/2 streams per connection, requests handled at once per connection,
//! the request header list, the time a request may take to be answered, and the
//! protections of hyper/h2 against streams reset by the client (rapid reset,
//! CVE-2023-44487) or for its protocol errors, which tonic's builder would otherwise switch
//! off. Applied to the server builder in one place, [`GrpcLimits::apply`], the header list
//! and request timeout through [`crate::refusals`] (refused with `LIMIT_EXCEEDED`,
//! counted). The connection cap, the control-frame budget and the header-read, idle and
//! send-stall timeouts apply to the connections before tonic gets them ([`crate::conn`]).
//!
//! Not here: TLS handshakes (their own timeout in `agent_reach_identity::net`), and the
//! HTTP/1.1 admin and dashboard ports (`agent_reach_telemetry::http1`).

use std::sync::Arc;
use std::time::Duration;

use crate::limit_stats::ConnStats;
use crate::refusals::RefusalLayer;

/// Limits of the gRPC port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// HTTP/2 streams open at once on one connection (`--max-concurrent-streams`).
    pub max_concurrent_streams: u32,
    /// Requests handled at once per connection; more wait (`--max-concurrent-requests`).
    pub max_concurrent_requests: usize,
    /// Largest request header list, in bytes (`--max-header-list-bytes`); a larger one is
    /// refused on its stream with `LIMIT_EXCEEDED` (past eight times it, h2 answers HTTP
    /// 431).
    pub max_header_list_bytes: u32,
    /// Time a request may take until its answer starts (`--request-timeout`); a stream
    /// (Watch, WatchSession) counts until its first message. Past it: `LIMIT_EXCEEDED`.
    pub request_timeout: Duration,
    /// Time a new connection has to send its first complete request headers
    /// (`--header-read-timeout`).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (`--idle-timeout`).
    pub idle_timeout: Duration,
    /// A connection with an open stream (or itself) at a flow-control send window <= 0 for
    /// this long is closed (`--send-stall-timeout`).
    pub send_stall_timeout: Duration,
    /// Connections open at once on the gRPC port (`--max-connections`).
    pub max_connections: usize,
    /// PING, SETTINGS, PRIORITY and empty DATA frames one connection may send within a
    /// second; one more closes it (`--max-control-frames-per-second`).
    pub max_control_frames_per_second: u32,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_concurrent_streams: 256,
            max_concurrent_requests: 256,
            max_header_list_bytes: 16 * 1024,
            request_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            send_stall_timeout: Duration::from_secs(30),
            max_connections: 8192,
            max_control_frames_per_second: 1000,
        }
    }
}

impl GrpcLimits {
    /// Checks that every limit is usable; the error names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_concurrent_streams == 0 {
            return Err("--max-concurrent-streams must be greater than 0".into());
        }
        if self.max_concurrent_requests == 0 {
            return Err("--max-concurrent-requests must be greater than 0".into());
        }
        if self.max_header_list_bytes < 1024 {
            return Err("--max-header-list-bytes must be at least 1024".into());
        }
        for (flag, d) in [
            ("--request-timeout", self.request_timeout),
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--send-stall-timeout", self.send_stall_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{flag} must be greater than 0"));
            }
        }
        if self.max_connections == 0 || self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err("--max-connections must be greater than 0".into());
        }
        if self.max_control_frames_per_second == 0 {
            return Err("--max-control-frames-per-second must be greater than 0".into());
        }
        Ok(())
    }

    /// The server builder with these limits; `stats` counts the refusals.
    pub fn apply(
        &self,
        builder: tonic::transport::Server,
        stats: Arc<ConnStats>,
    ) -> tonic::transport::Server<tower::layer::util::Stack<RefusalLayer, tower::layer::util::Identity>> {
        builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .concurrency_limit_per_connection(self.max_concurrent_requests)
            // Eight times the limit, so that a list up to that reaches the refusal layer
            // and is refused with a reason; past it h2 answers HTTP 431.
            .http2_max_header_list_size(self.max_header_list_bytes.saturating_mul(8))
            // tonic passes `None` to hyper unless told, which disables the GOAWAY after
            // 1024 streams reset for the client's protocol errors; these are hyper's and
            // h2's own defaults.
            .http2_max_local_error_reset_streams(Some(1024))
            .http2_max_pending_accept_reset_streams(Some(20))
            // Dead peers: a PING unanswered within 10 s closes the connection.
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .layer(RefusalLayer::new(self.max_header_list_bytes, self.request_timeout, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_validated_by_flag() {
        assert_eq!(GrpcLimits::default().validate(), Ok(()));
        let bad = GrpcLimits { max_concurrent_requests: 0, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-concurrent-requests"));
        let bad = GrpcLimits { request_timeout: Duration::ZERO, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--request-timeout"));
        let bad = GrpcLimits { header_read_timeout: Duration::ZERO, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--header-read-timeout"));
        let bad = GrpcLimits { idle_timeout: Duration::ZERO, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--idle-timeout"));
        let bad = GrpcLimits { send_stall_timeout: Duration::ZERO, ..GrpcLimits::default() };
        assert_eq!(bad.validate().unwrap_err(), "--send-stall-timeout must be greater than 0");
        let bad = GrpcLimits { max_connections: 0, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-connections"));
        let bad = GrpcLimits { max_control_frames_per_second: 0, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-control-frames-per-second"));
    }
}
