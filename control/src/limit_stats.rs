//! The counts of what the limits of the control service's gRPC port refused or closed
//! (the connection gate of [`crate::conn`], the request layer of [`crate::refusals`]), for
//! `/metrics`: `agent_reach_control_limit_refusals_total{limit}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Connections refused or closed by a limit of the gRPC port.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections closed at accept because `--max-connections` were open.
    pub connections: AtomicU64,
    /// Connections closed for a control-frame flood.
    pub control_frames: Arc<AtomicU64>,
    /// Connections closed for sending no complete request headers in time.
    pub header_read_timeout: Arc<AtomicU64>,
    /// Connections closed for having no request in flight for the idle timeout.
    pub idle_timeout: Arc<AtomicU64>,
    /// Connections closed for a flow-control window stalled at <= 0 for the send-stall
    /// timeout.
    pub send_stall_timeout: Arc<AtomicU64>,
    /// Requests refused for their header list.
    pub header_list: AtomicU64,
    /// Requests refused for not being answered within the request timeout.
    pub request_timeout: AtomicU64,
}

impl ConnStats {
    /// `(limit label, count)` for each limit.
    pub fn counts(&self) -> [(&'static str, u64); 7] {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("max_connections", load(&self.connections)),
            ("max_control_frames_per_second", load(&self.control_frames)),
            ("header_read_timeout", load(&self.header_read_timeout)),
            ("idle_timeout", load(&self.idle_timeout)),
            ("send_stall_timeout", load(&self.send_stall_timeout)),
            ("max_header_list_bytes", load(&self.header_list)),
            ("request_timeout", load(&self.request_timeout)),
        ]
    }

    /// The count of `limit` (a label of [`ConnStats::counts`]).
    pub fn count(&self, limit: &str) -> u64 {
        self.counts().into_iter().find(|(l, _)| *l == limit).map_or(0, |(_, n)| n)
    }
}
