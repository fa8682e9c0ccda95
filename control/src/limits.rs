//! Limits of the control service's gRPC port (Control, Admin, Identity, Sessions, health,
//! reflection): HTTP/2 streams per connection, requests handled at once per connection,
//! the request header list, the time a request may take to be answered, and the
//! protections of hyper/h2 against streams reset by the client (rapid reset,
//! CVE-2023-44487) or for its protocol errors, which tonic's builder would otherwise switch
//! off. Applied to the server builder in one place, [`GrpcLimits::apply`]. The connection
//! cap and the control-frame budget apply to the connections before tonic gets them
//! ([`crate::conn`]).
//!
//! Not here: TLS handshakes (their own timeout in `agent_reach_identity::net`), and the
//! HTTP/1.1 admin and dashboard ports (`agent_reach_telemetry::http1`).

use std::time::Duration;

/// Limits of the gRPC port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// HTTP/2 streams open at once on one connection (`--max-concurrent-streams`).
    pub max_concurrent_streams: u32,
    /// Requests handled at once per connection; more wait (`--max-concurrent-requests`).
    pub max_concurrent_requests: usize,
    /// Largest request header list, in bytes (`--max-header-list-bytes`); h2 answers a
    /// larger one with HTTP 431 on its stream.
    pub max_header_list_bytes: u32,
    /// Time a request may take until its answer starts (`--request-timeout`); a stream
    /// (Watch, WatchSession) counts until its first message. Past it: CANCELLED.
    pub request_timeout: Duration,
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
        if self.request_timeout.is_zero() {
            return Err("--request-timeout must be greater than 0".into());
        }
        if self.max_connections == 0 || self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err("--max-connections must be greater than 0".into());
        }
        if self.max_control_frames_per_second == 0 {
            return Err("--max-control-frames-per-second must be greater than 0".into());
        }
        Ok(())
    }

    /// The server builder with these limits.
    pub fn apply(&self, builder: tonic::transport::Server) -> tonic::transport::Server {
        builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .concurrency_limit_per_connection(self.max_concurrent_requests)
            .http2_max_header_list_size(self.max_header_list_bytes)
            .timeout(self.request_timeout)
            // tonic passes `None` to hyper unless told, which disables the GOAWAY after
            // 1024 streams reset for the client's protocol errors; these are hyper's and
            // h2's own defaults.
            .http2_max_local_error_reset_streams(Some(1024))
            .http2_max_pending_accept_reset_streams(Some(20))
            // Dead peers: a PING unanswered within 10 s closes the connection.
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
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
        let bad = GrpcLimits { max_connections: 0, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-connections"));
        let bad = GrpcLimits { max_control_frames_per_second: 0, ..GrpcLimits::default() };
        assert!(bad.validate().unwrap_err().contains("--max-control-frames-per-second"));
    }
}
