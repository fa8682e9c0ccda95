//! The sidecar's report to control: what its callers' calls did lately, for the operators'
//! dashboard and alerts.
//!
//! [`Traffic`] keeps, per edge (caller → target, by serving agent), the calls, errors,
//! calls served by a fallback and a latency histogram in [`SLOTS`] time slots of
//! [`SLOT`] each, so a report covers the last minute with O(1) work per call and memory
//! bounded by [`MAX_EDGES`]. The outbound telemetry layer records into it; the registry
//! adds a report ([`Traffic::report`]) to at most one heartbeat per report interval, with
//! the breakers this sidecar holds open, its local instances' last heartbeats and its
//! newest span summaries. Control stores the newest report per sidecar on the sidecar's
//! lease; every control replica merges all of them (see the control's `reports` module).
//! Nothing here talks to control.

use std::sync::Mutex;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_routing::table::FastMap;
use agent_reach_routing::{BreakerState, TableHandle, clock};
use tokio::time::Instant;

/// Width of one time slot.
pub const SLOT: Duration = Duration::from_secs(10);
/// Slots a report covers: the last minute.
pub const SLOTS: usize = 6;
/// Edges kept at most; calls on further edges count under caller and target "(other)".
pub const MAX_EDGES: usize = 256;
/// Span summaries sent per report, the newest.
pub const MAX_SPANS: usize = 64;
/// Latency bucket bounds: 0.1 ms doubling to ~26 s, as the latency metrics.
const BUCKETS: usize = 19;

fn bounds_ms() -> Vec<f64> {
    (0..BUCKETS).map(|i| 0.1 * f64::from(1u32 << i)).collect()
}

fn bucket_of(elapsed: Duration) -> usize {
    let us = elapsed.as_micros();
    (0..BUCKETS).find(|i| us <= 100u128 << i).unwrap_or(BUCKETS)
}

/// The edge a call counts on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EdgeKey {
    pub caller: String,
    pub target: String,
    pub agent: String,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    /// Which slot number (since start) the counts belong to.
    number: u64,
    calls: u64,
    errors: u64,
    fallback_calls: u64,
    latency: [u64; BUCKETS + 1],
}

/// One call's outcome, as the edge windows count it.
pub(crate) struct CallSeen {
    pub ok: bool,
    pub fallback: bool,
    pub elapsed: Duration,
}

/// See the module documentation.
pub struct Traffic {
    started: Instant,
    edges: Mutex<FastMap<EdgeKey, [Slot; SLOTS]>>,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic::new()
    }
}

impl Traffic {
    pub fn new() -> Traffic {
        Traffic { started: Instant::now(), edges: Mutex::new(FastMap::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<EdgeKey, [Slot; SLOTS]>> {
        // Poisoning only means a panic elsewhere; the counts stay usable.
        self.edges.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot_number(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.started).as_millis() / SLOT.as_millis()) as u64
    }

    /// Counts one call on `key` at `now`.
    pub(crate) fn record(&self, now: Instant, mut key: EdgeKey, call: CallSeen) {
        let number = self.slot_number(now);
        let mut edges = self.lock();
        // Only a full map needs the extra lookup.
        if edges.len() >= MAX_EDGES && !edges.contains_key(&key) {
            // Drop edges with nothing in the window before folding new ones together.
            edges.retain(|_, slots| slots.iter().any(|s| s.calls > 0 && s.number + SLOTS as u64 > number));
            if edges.len() >= MAX_EDGES {
                key = EdgeKey { caller: "(other)".into(), target: "(other)".into(), agent: "(other)".into() };
            }
        }
        let slots = edges.entry(key).or_default();
        let slot = &mut slots[(number % SLOTS as u64) as usize];
        if slot.number != number {
            *slot = Slot { number, ..Slot::default() };
        }
        slot.calls += 1;
        slot.errors += u64::from(!call.ok);
        slot.fallback_calls += u64::from(call.fallback);
        slot.latency[bucket_of(call.elapsed)] += 1;
    }

    /// The edges' sums over the window at `now`, and the window's length (shorter than a
    /// minute just after start).
    pub(crate) fn edges(&self, now: Instant) -> (Vec<proto::EdgeReport>, Duration) {
        let number = self.slot_number(now);
        let window = now.saturating_duration_since(self.started).min(SLOT * SLOTS as u32);
        let mut out = Vec::new();
        let mut edges = self.lock();
        edges.retain(|key, slots| {
            let mut edge = proto::EdgeReport {
                caller: key.caller.clone(),
                target: key.target.clone(),
                agent: key.agent.clone(),
                latency_buckets: vec![0; BUCKETS + 1],
                ..Default::default()
            };
            for slot in slots.iter().filter(|s| s.calls > 0 && s.number + SLOTS as u64 > number) {
                edge.calls += slot.calls;
                edge.errors += slot.errors;
                edge.fallback_calls += slot.fallback_calls;
                for (sum, n) in edge.latency_buckets.iter_mut().zip(slot.latency) {
                    *sum += n;
                }
            }
            let live = edge.calls > 0;
            if live {
                out.push(edge);
            }
            live
        });
        out.sort_by(|a, b| (&a.caller, &a.target, &a.agent).cmp(&(&b.caller, &b.target, &b.agent)));
        (out, window)
    }

    /// The report sent to control: the edges, the breakers open in `table`, the local
    /// instances' heartbeat ages and the newest span summaries.
    pub(crate) fn report(
        &self,
        sidecar_id: &str,
        table: &TableHandle,
        instances: Vec<proto::LocalInstanceReport>,
        spans: &agent_reach_telemetry::RecentSpans,
    ) -> proto::SidecarReport {
        let (edges, window) = self.edges(Instant::now());
        let table = table.load();
        let now = clock();
        let mut open_breakers: Vec<String> = table
            .instances
            .iter()
            .filter(|(_, m)| m.stats.breaker.state(now) != BreakerState::Closed)
            .map(|(id, _)| id.clone())
            .collect();
        open_breakers.sort();
        proto::SidecarReport {
            window_ms: u32::try_from(window.as_millis()).unwrap_or(u32::MAX),
            edges,
            open_breakers,
            instances,
            spans: spans.newest(MAX_SPANS).into_iter().map(summary).collect(),
            received_at_ms: 0,
            sidecar_id: sidecar_id.to_string(),
            latency_bucket_bounds_ms: bounds_ms(),
            interval_ms: 0,
        }
    }
}

/// The attributes a span summary keeps.
const SPAN_ATTRIBUTES: [&str; 8] = [
    "agent_reach.caller",
    "agent_reach.target",
    "agent_reach.instance",
    "agent_reach.agent",
    "agent_reach.outcome",
    "agent_reach.session",
    "agent_reach.attempt",
    "server.address",
];

fn summary(span: agent_reach_telemetry::SpanRecord) -> proto::SpanSummary {
    proto::SpanSummary {
        attributes: span.attributes.into_iter().filter(|(k, _)| SPAN_ATTRIBUTES.contains(&k.as_str())).collect(),
        trace_id: span.trace_id,
        span_id: span.span_id,
        parent_span_id: span.parent_span_id,
        name: span.name,
        kind: span.kind,
        start_unix_us: span.start_unix_us,
        duration_us: span.duration_us,
        status: span.status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(caller: &str, agent: &str) -> EdgeKey {
        EdgeKey { caller: caller.into(), target: "capability work".into(), agent: agent.into() }
    }

    fn seen(ok: bool, ms: u64) -> CallSeen {
        CallSeen { ok, fallback: false, elapsed: Duration::from_millis(ms) }
    }

    #[tokio::test(start_paused = true)]
    async fn edges_sum_the_last_minute_and_forget_older_slots() {
        let traffic = Traffic::new();
        let t0 = Instant::now();
        traffic.record(t0, key("a", "w"), seen(true, 1));
        traffic.record(t0 + Duration::from_secs(15), key("a", "w"), seen(false, 3));
        traffic.record(t0 + Duration::from_secs(15), key("b", "w"), CallSeen { fallback: true, ..seen(true, 200) });
        let (edges, window) = traffic.edges(t0 + Duration::from_secs(20));
        assert_eq!(window, Duration::from_secs(20));
        assert_eq!(edges.len(), 2);
        let a = &edges[0];
        assert_eq!((a.caller.as_str(), a.calls, a.errors, a.fallback_calls), ("a", 2, 1, 0));
        // 1 ms ≤ 1.6 ms (bucket 4), 3 ms ≤ 3.2 ms (bucket 5).
        assert_eq!(a.latency_buckets[4], 1);
        assert_eq!(a.latency_buckets[5], 1);
        assert_eq!(a.latency_buckets.iter().sum::<u64>(), 2);
        assert_eq!((edges[1].calls, edges[1].fallback_calls), (1, 1));
        // 65 s on: the first call's slot (0) is out of the window, the others (slot 1) not.
        let (edges, window) = traffic.edges(t0 + Duration::from_secs(65));
        assert_eq!(window, Duration::from_secs(60));
        assert_eq!(edges.iter().map(|e| e.calls).collect::<Vec<_>>(), [1, 1]);
        // 75 s on: everything is out, and the edges are forgotten.
        let (edges, _) = traffic.edges(t0 + Duration::from_secs(75));
        assert!(edges.is_empty());
        assert!(traffic.lock().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn edges_beyond_the_limit_fold_into_other() {
        let traffic = Traffic::new();
        let t0 = Instant::now();
        for i in 0..MAX_EDGES + 3 {
            traffic.record(t0, key(&format!("c{i}"), "w"), seen(true, 1));
        }
        let (edges, _) = traffic.edges(t0);
        assert_eq!(edges.len(), MAX_EDGES + 1);
        let other = edges.iter().find(|e| e.caller == "(other)").unwrap();
        assert_eq!(other.calls, 3);
    }

    #[test]
    fn buckets_match_their_bounds() {
        let bounds = bounds_ms();
        assert_eq!(bounds.len(), BUCKETS);
        assert_eq!(bucket_of(Duration::from_micros(100)), 0);
        assert_eq!(bucket_of(Duration::from_micros(101)), 1);
        assert_eq!(bucket_of(Duration::from_secs(100)), BUCKETS);
        for (i, b) in bounds.iter().enumerate() {
            assert_eq!(bucket_of(Duration::from_micros(100 << i)), i, "{b}");
            assert_eq!(bucket_of(Duration::from_micros((100 << i) + 1)), i + 1, "{b}");
        }
    }
}
