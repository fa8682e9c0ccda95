//! The session metrics of a sidecar (`/metrics` on the admin port), read at each scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{SessionCache, lock};

/// The session metrics of a sidecar, read at each scrape.
pub(crate) struct SessionMetrics(pub Arc<SessionCache>);

impl std::fmt::Debug for SessionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMetrics").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for SessionMetrics {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let s = &self.0.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counter_type = ConstCounter::new(0u64).metric_type();
        let mut reads = encoder.encode_descriptor(
            "session_cache_reads",
            "Session reads by agents here: answered from the cache (hit) or by control (miss)",
            None,
            counter_type,
        )?;
        for (result, n) in [("hit", load(&s.hits)), ("miss", load(&s.misses))] {
            ConstCounter::new(n).encode(reads.encode_family(&[("result", result)])?)?;
        }
        let prewarms = ConstCounter::new(load(&s.prewarms));
        prewarms.encode(encoder.encode_descriptor(
            "session_prewarms",
            "Sessions fetched before delivering a call that carried them",
            None,
            counter_type,
        )?)?;
        let skipped = ConstCounter::new(load(&s.prewarms_skipped_absent));
        skipped.encode(encoder.encode_descriptor(
            "session_prewarms_skipped",
            "Calls carrying a session delivered without fetching it first: found absent in the last 5 s, or new (its id made by the caller's sidecar for this call)",
            None,
            counter_type,
        )?)?;
        let mut snapshots = encoder.encode_descriptor(
            "session_snapshots",
            "Calls delivered to agents here with their session attached, and calls whose session was over --session-snapshot-max-bytes (delivered without)",
            None,
            counter_type,
        )?;
        for (result, n) in [("attached", load(&s.snapshots)), ("too_large", load(&s.snapshots_too_large))] {
            ConstCounter::new(n).encode(snapshots.encode_family(&[("result", result)])?)?;
        }
        let mut watches = encoder.encode_descriptor(
            "session_watches",
            "Watches following cached sessions: started, and failed (restarted by the session's next read)",
            None,
            counter_type,
        )?;
        for (event, n) in [("started", load(&s.watches_started)), ("failed", load(&s.watch_failures))] {
            ConstCounter::new(n).encode(watches.encode_family(&[("event", event)])?)?;
        }
        let mut writes = encoder.encode_descriptor(
            "session_writes",
            "Session writes and deletes by agents here, by outcome (ok or the refusal's reason)",
            None,
            counter_type,
        )?;
        for (outcome, n) in lock(&s.writes).iter() {
            ConstCounter::new(*n).encode(writes.encode_family(&[("outcome", *outcome)])?)?;
        }
        let followed = ConstGauge::new(lock(&self.0.entries).len() as i64);
        let m = encoder.encode_descriptor(
            "session_cache_sessions",
            "Sessions followed by the cache",
            None,
            followed.metric_type(),
        )?;
        followed.encode(m)
    }
}
