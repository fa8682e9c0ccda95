//! The session a call carries, delivered with the call (`HandleRequest.session`) so the
//! agent's SDK answers its reads in-process: the cached session, whole, when this sidecar
//! follows it, it is fresh (not behind this sidecar's own last write to it) and its
//! encoded size is at most the limit (`--session-snapshot-max-bytes`).

use std::sync::atomic::Ordering;

use agent_reach::proto;
use prost::Message;
use tokio::time::Instant;

use super::{SessionCache, lock};

impl SessionCache {
    /// The whole cached `session` for a call delivered here, or `None` (not followed, not
    /// fresh, over `max_bytes`, or `max_bytes` is 0). Counts as a read of the session (it
    /// stays followed while calls carrying it arrive).
    pub(crate) fn snapshot(&self, session: &str, max_bytes: usize) -> Option<proto::DeliveredSession> {
        if max_bytes == 0 || session.is_empty() {
            return None;
        }
        let entry = self.entry(session)?;
        let mut cached = lock(&entry);
        if cached.version < cached.written {
            return None;
        }
        let size: usize = cached.fields.values().map(|f| f.encoded_len() + 4).sum();
        if size > max_bytes {
            self.stats.snapshots_too_large.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        cached.last_read = Instant::now();
        self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        Some(proto::DeliveredSession {
            session_id: session.to_string(),
            version: cached.version,
            fields: cached.fields.values().cloned().collect(),
        })
    }
}
