//! Sidecars' traffic reports: stored by the replica a sidecar heartbeats to, read by every
//! replica, merged into the whole mesh's picture.
//!
//! A sidecar adds a report (its call edges over the last minute, the breakers it holds
//! open, its local instances' last heartbeats, its newest span summaries; see the sidecar's
//! `report` module) to at most one heartbeat per report interval. The replica that takes
//! the heartbeat writes it to `/agent-reach/v1/sidecar-reports/{tenant}/{sidecar_id}` on
//! the sidecar's own lease ([`store_report`]): the newest report per sidecar, gone with
//! the sidecar. The key is outside the tenant's routing prefix, so the sidecars' watch
//! streams are never woken by reports.
//!
//! Each replica follows that prefix ([`Reports`]: one prefix read, then a watch from its
//! revision, again after any error), so every replica holds every sidecar's newest report
//! whichever replica the sidecar talks to, and the dashboard and the alert rules of any
//! replica see the whole mesh. [`topology`] merges the edges: calls/s is the sum of each
//! sidecar's calls over its window, the error ratio Σerrors / Σcalls, the p99 read from
//! the summed latency histograms (the upper bound of the bucket holding the 99th
//! percentile).
//!
//! Domain types here ([`SidecarTraffic`] and its parts) know nothing of protobuf; the
//! conversion from the wire is [`traffic_from_proto`], in this module only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::validate_name;
use agent_reach::proto;
use agent_reach_store::{EventKind, KeyValue, LeaseId, Store};
use futures_util::StreamExt;
use prost::Message;
use serde::Serialize;
use tokio::sync::watch;

/// Root of the stored reports: `{REPORTS_ROOT}{tenant}/{sidecar_id}`.
pub const REPORTS_ROOT: &str = "/agent-reach/v1/sidecar-reports/";
/// Edges kept per report; more are dropped (a sidecar sends at most 257).
pub const MAX_EDGES: usize = 512;
/// Span summaries kept per report.
pub const MAX_SPANS: usize = 128;
/// Local instances kept per report.
pub const MAX_INSTANCES: usize = 4096;
/// Longest label (caller, target, agent, attribute value) kept; longer ones are cut.
const MAX_LABEL: usize = 256;

/// The key of one sidecar's report.
pub fn report_key(tenant: &str, sidecar_id: &str) -> String {
    format!("{REPORTS_ROOT}{tenant}/{sidecar_id}")
}

/// One edge of one sidecar's report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Edge {
    pub caller: String,
    pub target: String,
    pub agent: String,
    pub calls: u64,
    pub errors: u64,
    pub fallback_calls: u64,
    /// Calls per latency bucket (the report's bounds, then overflow).
    #[serde(skip)]
    pub latency: Vec<u64>,
}

/// A local instance's last heartbeat to its sidecar.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceBeat {
    pub instance_id: String,
    pub agent: String,
    /// Unix ms: when the report was received, less the age the sidecar gave.
    pub last_heartbeat_ms: i64,
}

/// A span summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpanView {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: String,
    pub sidecar_id: String,
    pub start_unix_us: u64,
    pub duration_us: u64,
    pub status: String,
    pub attributes: BTreeMap<String, String>,
}

/// One sidecar's newest report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SidecarTraffic {
    pub tenant: String,
    pub sidecar_id: String,
    pub received_at_ms: i64,
    pub window_ms: u32,
    pub edges: Vec<Edge>,
    pub open_breakers: Vec<String>,
    pub instances: Vec<InstanceBeat>,
    #[serde(skip)]
    pub spans: Vec<SpanView>,
    #[serde(skip)]
    pub bounds_ms: Vec<f64>,
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_LABEL {
        let mut end = MAX_LABEL;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A stored report, as the dashboard and the rules read it.
pub fn traffic_from_proto(tenant: &str, r: proto::SidecarReport) -> SidecarTraffic {
    let received = r.received_at_ms;
    SidecarTraffic {
        tenant: tenant.to_string(),
        sidecar_id: r.sidecar_id.clone(),
        received_at_ms: received,
        window_ms: r.window_ms,
        edges: r
            .edges
            .into_iter()
            .take(MAX_EDGES)
            .map(|e| Edge {
                caller: cut(e.caller),
                target: cut(e.target),
                agent: cut(e.agent),
                calls: e.calls,
                errors: e.errors.min(e.calls),
                fallback_calls: e.fallback_calls.min(e.calls),
                latency: e.latency_buckets,
            })
            .collect(),
        open_breakers: r.open_breakers.into_iter().take(MAX_INSTANCES).map(cut).collect(),
        instances: r
            .instances
            .into_iter()
            .take(MAX_INSTANCES)
            .map(|i| InstanceBeat {
                instance_id: cut(i.instance_id),
                agent: cut(i.agent),
                last_heartbeat_ms: received.saturating_sub(i64::try_from(i.last_heartbeat_age_ms).unwrap_or(i64::MAX)),
            })
            .collect(),
        spans: r
            .spans
            .into_iter()
            .take(MAX_SPANS)
            .map(|s| SpanView {
                trace_id: cut(s.trace_id),
                span_id: cut(s.span_id),
                parent_span_id: cut(s.parent_span_id),
                name: cut(s.name),
                kind: cut(s.kind),
                sidecar_id: r.sidecar_id.clone(),
                start_unix_us: s.start_unix_us,
                duration_us: s.duration_us,
                status: cut(s.status),
                attributes: s.attributes.into_iter().take(16).map(|(k, v)| (cut(k), cut(v))).collect(),
            })
            .collect(),
        bounds_ms: r.latency_bucket_bounds_ms,
    }
}

/// Stores `report` as `sidecar_id`'s newest, on `lease` (the sidecar's lease, which the
/// heartbeat carrying it has just renewed). Oversized parts are cut to the limits above.
pub async fn store_report(
    store: &dyn Store,
    tenant: &str,
    sidecar_id: &str,
    lease: LeaseId,
    mut report: proto::SidecarReport,
    now_ms: i64,
) -> Result<(), String> {
    validate_name("sidecar.sidecar_id", sidecar_id).map_err(|e| format!("{}: {}", e.field, e.reason))?;
    if lease == 0 {
        return Err("a report needs the sidecar's lease".into());
    }
    report.edges.truncate(MAX_EDGES);
    report.spans.truncate(MAX_SPANS);
    report.instances.truncate(MAX_INSTANCES);
    report.open_breakers.truncate(MAX_INSTANCES);
    report.sidecar_id = sidecar_id.to_string();
    report.received_at_ms = now_ms;
    let value = bytes::Bytes::from(report.encode_to_vec());
    store.put(&report_key(tenant, sidecar_id), value, Some(lease)).await.map(|_| ()).map_err(|e| e.to_string())
}

/// Every sidecar's newest report, as this replica follows them (see the module
/// documentation).
pub struct Reports {
    /// By key.
    all: Mutex<HashMap<String, Arc<SidecarTraffic>>>,
    /// Bumped on every change.
    changed: watch::Sender<u64>,
}

impl Reports {
    /// Starts following the reports in `store` until `shutdown`.
    pub fn start(store: Arc<dyn Store>, shutdown: watch::Receiver<bool>) -> Arc<Reports> {
        let reports = Arc::new(Reports::empty());
        tokio::spawn(reports.clone().follow(store, shutdown));
        reports
    }

    /// No reports, following nothing (tests).
    pub fn empty() -> Reports {
        Reports { all: Mutex::new(HashMap::new()), changed: watch::channel(0).0 }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SidecarTraffic>>> {
        // Poisoning only means a panic elsewhere; the map stays valid.
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reports of `tenant`'s sidecars, by sidecar id.
    pub fn tenant(&self, tenant: &str) -> Vec<Arc<SidecarTraffic>> {
        let mut out: Vec<Arc<SidecarTraffic>> = self.lock().values().filter(|r| r.tenant == tenant).cloned().collect();
        out.sort_by(|a, b| a.sidecar_id.cmp(&b.sidecar_id));
        out
    }

    /// A receiver woken on every change of any report.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Takes a report stored at `key` (tests and the follower).
    pub fn apply(&self, kv: &KeyValue) {
        let Some(rest) = kv.key.strip_prefix(REPORTS_ROOT) else { return };
        let Some((tenant, _)) = rest.split_once('/') else { return };
        match proto::SidecarReport::decode(kv.value.as_ref()) {
            Ok(report) => {
                self.lock().insert(kv.key.clone(), Arc::new(traffic_from_proto(tenant, report)));
            }
            Err(e) => tracing::warn!(key = %kv.key, "unreadable sidecar report: {e}"),
        }
    }

    fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    async fn follow(self: Arc<Self>, store: Arc<dyn Store>, mut shutdown: watch::Receiver<bool>) {
        let mut failures = 0;
        loop {
            if failures > 0 {
                let wait = agent_reach_support::backoff::jittered(
                    failures - 1,
                    Duration::from_millis(200),
                    Duration::from_secs(5),
                );
                tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            failures += 1;
            let range = match store.get_prefix(REPORTS_ROOT).await {
                Ok(range) => range,
                Err(e) => {
                    tracing::warn!("cannot read the sidecars' reports: {e}");
                    continue;
                }
            };
            {
                let mut all = self.lock();
                all.clear();
                drop(all);
                for kv in &range.kvs {
                    self.apply(kv);
                }
            }
            self.bump();
            let mut events = match store.watch_prefix(REPORTS_ROOT, range.revision + 1).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!("cannot watch the sidecars' reports: {e}");
                    continue;
                }
            };
            loop {
                let batch = tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    batch = events.next() => batch,
                };
                match batch {
                    Some(Ok(batch)) => {
                        for event in batch.events {
                            match event.kind {
                                EventKind::Put => self.apply(&event.kv),
                                EventKind::Delete => self.remove(&event.kv.key),
                            }
                        }
                        self.bump();
                    }
                    Some(Err(e)) => {
                        tracing::warn!("the sidecars' reports watch ended: {e}");
                        failures = 1;
                        break;
                    }
                    None => {
                        failures = 1;
                        break;
                    }
                }
            }
        }
    }
}

/// One edge of the merged topology.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeView {
    pub caller: String,
    pub target: String,
    pub agent: String,
    pub calls: u64,
    pub errors: u64,
    pub fallback_calls: u64,
    pub calls_per_s: f64,
    pub error_ratio: f64,
    /// None when no latency was reported.
    pub p99_ms: Option<f64>,
    /// Sidecars whose reports hold this edge.
    pub sidecars: Vec<String>,
}

/// Merges the edges of every report (see the module documentation), sorted by caller,
/// target and agent.
pub fn topology(reports: &[Arc<SidecarTraffic>]) -> Vec<EdgeView> {
    struct Sum {
        view: EdgeView,
        latency: Vec<u64>,
        bounds: Vec<f64>,
    }
    let mut merged: BTreeMap<(String, String, String), Sum> = BTreeMap::new();
    for report in reports {
        let window_s = f64::from(report.window_ms.max(1)) / 1000.0;
        for e in &report.edges {
            let key = (e.caller.clone(), e.target.clone(), e.agent.clone());
            let sum = merged.entry(key).or_insert_with(|| Sum {
                view: EdgeView {
                    caller: e.caller.clone(),
                    target: e.target.clone(),
                    agent: e.agent.clone(),
                    calls: 0,
                    errors: 0,
                    fallback_calls: 0,
                    calls_per_s: 0.0,
                    error_ratio: 0.0,
                    p99_ms: None,
                    sidecars: Vec::new(),
                },
                latency: Vec::new(),
                bounds: report.bounds_ms.clone(),
            });
            sum.view.calls += e.calls;
            sum.view.errors += e.errors;
            sum.view.fallback_calls += e.fallback_calls;
            sum.view.calls_per_s += e.calls as f64 / window_s;
            sum.view.sidecars.push(report.sidecar_id.clone());
            // Histograms with other bounds (another sidecar version) are not summed.
            if report.bounds_ms == sum.bounds && e.latency.len() == sum.bounds.len() + 1 {
                sum.latency.resize(e.latency.len(), 0);
                for (total, n) in sum.latency.iter_mut().zip(&e.latency) {
                    *total += n;
                }
            }
        }
    }
    merged
        .into_values()
        .map(|mut sum| {
            let v = &mut sum.view;
            v.error_ratio = if v.calls == 0 { 0.0 } else { v.errors as f64 / v.calls as f64 };
            v.p99_ms = quantile(&sum.latency, &sum.bounds, 0.99);
            sum.view
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` (the last bound for the overflow
/// bucket); None without calls.
fn quantile(counts: &[u64], bounds: &[f64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 || bounds.is_empty() {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bounds[i.min(bounds.len() - 1)]);
        }
    }
    bounds.last().copied()
}

/// The last heartbeat (Unix ms) of each instance any report names.
pub fn last_heartbeats(reports: &[Arc<SidecarTraffic>]) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for report in reports {
        for i in &report.instances {
            let at = out.entry(i.instance_id.clone()).or_insert(i.last_heartbeat_ms);
            *at = (*at).max(i.last_heartbeat_ms);
        }
    }
    out
}

/// A trace found in the reports' span summaries.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceView {
    pub trace_id: String,
    /// The session the trace's calls named, if any.
    pub session: String,
    pub start_unix_us: u64,
    /// From the first span's start to the last span's end.
    pub duration_us: u64,
    /// Oldest first.
    pub spans: Vec<TraceSpan>,
}

/// A span of a trace, with its depth (0 for spans whose parent is not among them).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSpan {
    pub depth: usize,
    #[serde(flatten)]
    pub span: SpanView,
}

/// Traces whose id is `query`, or whose calls named session `query`, newest first, at most
/// `limit`.
pub fn traces(reports: &[Arc<SidecarTraffic>], query: &str, limit: usize) -> Vec<TraceView> {
    let query = query.trim();
    if query.is_empty() {
        return Vec::new();
    }
    let mut by_trace: BTreeMap<&str, Vec<&SpanView>> = BTreeMap::new();
    for report in reports {
        for span in &report.spans {
            by_trace.entry(span.trace_id.as_str()).or_default().push(span);
        }
    }
    let mut out: Vec<TraceView> = by_trace
        .into_iter()
        .filter(|(id, spans)| {
            id.eq_ignore_ascii_case(query)
                || spans.iter().any(|s| s.attributes.get("agent_reach.session").is_some_and(|v| v == query))
        })
        .map(|(id, mut spans)| {
            spans.sort_by_key(|s| (s.start_unix_us, s.span_id.clone()));
            spans.dedup_by(|a, b| a.span_id == b.span_id);
            let start = spans.first().map_or(0, |s| s.start_unix_us);
            let end = spans.iter().map(|s| s.start_unix_us + s.duration_us).max().unwrap_or(start);
            let session =
                spans.iter().find_map(|s| s.attributes.get("agent_reach.session").cloned()).unwrap_or_default();
            let depth = |span: &SpanView| {
                let mut depth = 0;
                let mut parent = span.parent_span_id.clone();
                while depth < 32 {
                    match spans.iter().find(|s| s.span_id == parent) {
                        Some(p) => {
                            depth += 1;
                            parent = p.parent_span_id.clone();
                        }
                        None => break,
                    }
                }
                depth
            };
            TraceView {
                trace_id: id.to_string(),
                session,
                start_unix_us: start,
                duration_us: end - start,
                spans: spans.iter().map(|s| TraceSpan { depth: depth(s), span: (*s).clone() }).collect(),
            }
        })
        .collect();
    out.sort_by_key(|t| std::cmp::Reverse(t.start_unix_us));
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(caller: &str, agent: &str, calls: u64, errors: u64, latency: Vec<u64>) -> Edge {
        Edge {
            caller: caller.into(),
            target: format!("capability {agent}.work"),
            agent: agent.into(),
            calls,
            errors,
            fallback_calls: 0,
            latency,
        }
    }

    fn report(sidecar: &str, window_ms: u32, edges: Vec<Edge>) -> Arc<SidecarTraffic> {
        Arc::new(SidecarTraffic {
            tenant: "t".into(),
            sidecar_id: sidecar.into(),
            received_at_ms: 10_000,
            window_ms,
            edges,
            open_breakers: vec![],
            instances: vec![InstanceBeat {
                instance_id: format!("{sidecar}-i"),
                agent: "a".into(),
                last_heartbeat_ms: 9_000,
            }],
            spans: vec![],
            bounds_ms: vec![1.0, 2.0, 4.0],
        })
    }

    #[test]
    fn topology_sums_rates_errors_and_histograms_across_sidecars() {
        // Sidecar a: 60 calls over 60 s, 99 of the 100 merged calls at most 2 ms.
        let a = report("a", 60_000, vec![edge("planner", "worker", 60, 3, vec![10, 50, 0, 0])]);
        // Sidecar b: 40 calls over 20 s (just started), one slower than 4 ms.
        let b = report(
            "b",
            20_000,
            vec![edge("planner", "worker", 40, 1, vec![0, 39, 0, 1]), edge("x", "y", 5, 0, vec![])],
        );
        let merged = topology(&[a.clone(), b]);
        assert_eq!(merged.len(), 2);
        let e = &merged[0];
        assert_eq!((e.caller.as_str(), e.agent.as_str(), e.calls, e.errors), ("planner", "worker", 100, 4));
        assert!((e.calls_per_s - 3.0).abs() < 1e-9, "{}", e.calls_per_s);
        assert!((e.error_ratio - 0.04).abs() < 1e-9);
        assert_eq!(e.p99_ms, Some(2.0));
        assert_eq!(e.sidecars, ["a", "b"]);
        // The other edge has no histogram.
        assert_eq!(merged[1].p99_ms, None);
        // One call in the overflow bucket is the p99 of a hundred only when it is one of
        // the top 1 %: 2 of 100 are.
        let slow = report("c", 60_000, vec![edge("planner", "worker", 100, 0, vec![0, 98, 0, 2])]);
        assert_eq!(topology(&[slow])[0].p99_ms, Some(4.0));
        assert_eq!(last_heartbeats(&[a]).get("a-i"), Some(&9_000));
    }

    #[test]
    fn traces_are_found_by_id_or_session_with_depths() {
        let span = |trace: &str, id: &str, parent: &str, start: u64, session: Option<&str>| SpanView {
            trace_id: trace.into(),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: format!("span {id}"),
            kind: "server".into(),
            sidecar_id: "s".into(),
            start_unix_us: start,
            duration_us: 10,
            status: "ok".into(),
            attributes: session.map(|s| ("agent_reach.session".to_string(), s.to_string())).into_iter().collect(),
        };
        let mut a = (*report("a", 1, vec![])).clone();
        a.spans = vec![span("t1", "s1", "", 100, Some("sess")), span("t1", "s3", "s2", 120, None)];
        let mut b = (*report("b", 1, vec![])).clone();
        b.spans = vec![span("t1", "s2", "s1", 110, None), span("t2", "x", "", 500, None)];
        let all = [Arc::new(a), Arc::new(b)];
        let found = traces(&all, "sess", 10);
        assert_eq!(found.len(), 1);
        let t = &found[0];
        assert_eq!((t.trace_id.as_str(), t.session.as_str(), t.duration_us), ("t1", "sess", 30));
        let order: Vec<(usize, &str)> = t.spans.iter().map(|s| (s.depth, s.span.span_id.as_str())).collect();
        assert_eq!(order, [(0, "s1"), (1, "s2"), (2, "s3")]);
        assert_eq!(traces(&all, "T2", 10)[0].spans.len(), 1);
        assert!(traces(&all, "nothing", 10).is_empty());
        assert!(traces(&all, " ", 10).is_empty());
    }
}
