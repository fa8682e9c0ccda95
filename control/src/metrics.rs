//! The control service's admin port: `/metrics` from [`ControlStats`], `/healthz`, and
//! `/readyz` (the store answered recently).
//!
//! Readiness is checked by a background task every two seconds, so a probe never waits on
//! the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_store::Store;
use agent_reach_telemetry::AdminState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::stats::ControlStats;

#[derive(Debug)]
struct StatsCollector {
    stats: Arc<ControlStats>,
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.stats;
        let counters: [(&str, &str, &std::sync::atomic::AtomicU64); 17] = [
            (
                "anonymous_calls",
                "Control calls without a certificate let through (permissive mTLS)",
                &s.anonymous_calls,
            ),
            ("tls_handshakes", "TLS handshakes completed on the gRPC port", &s.tls.accepted),
            ("tls_handshakes_failed", "TLS handshakes refused or timed out on the gRPC port", &s.tls.failed),
            (
                "plaintext_connections",
                "Plaintext connections served by the gRPC port in permissive mutual TLS (--mtls permissive)",
                &s.tls.plaintext,
            ),
            ("registrations", "Registrations stored (new and re-registrations)", &s.registrations),
            ("heartbeats", "Instance heartbeats received from sidecars", &s.heartbeats),
            ("heartbeat_requests", "Heartbeat requests (batches) received", &s.heartbeat_requests),
            ("state_writes", "Record writes caused by a state change", &s.state_writes),
            ("load_writes", "Record writes caused by a meaningful load change", &s.load_writes),
            ("store_writes", "Requests that wrote to the store", &s.store_writes),
            ("store_reads", "Reads from the store", &s.store_reads),
            ("store_keep_alives", "Lease keep-alives sent to the store", &s.store_keep_alives),
            ("store_watches_opened", "Watches opened on the store", &s.store_watches_opened),
            ("snapshots_sent", "Snapshots sent to sidecars", &s.snapshots_sent),
            ("resyncs_sent", "Snapshots flagged resync (after compaction)", &s.resyncs_sent),
            ("deltas_sent", "Deltas sent to sidecars", &s.deltas_sent),
            ("catch_ups", "Sidecars caught up from the store's history", &s.catch_ups),
        ];
        for (name, help, value) in counters {
            let c = ConstCounter::new(value.load(Ordering::Relaxed));
            let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        let refusals = ConstCounter::new(0u64);
        let mut m = encoder.encode_descriptor(
            "limit_refusals",
            "Connections of the gRPC port refused or closed by a limit, requests refused by a limit, and Watches refused at --max-tenant-feeds, by limit",
            None,
            refusals.metric_type(),
        )?;
        for (limit, value) in s.conn.counts() {
            ConstCounter::new(value).encode(m.encode_family(&[("limit", limit)])?)?;
        }
        let feed_refusals = s.feed_refusals.load(Ordering::Relaxed);
        ConstCounter::new(feed_refusals).encode(m.encode_family(&[("limit", "max_tenant_feeds")])?)?;
        let a = &s.alerts;
        let fired = ConstCounter::new(0u64);
        let mut m = encoder.encode_descriptor("alerts_fired", "Alerts fired, by rule", None, fired.metric_type())?;
        for (rule, value) in [
            ("instances_lost", &a.instances_lost),
            ("below_min_healthy", &a.below_min_healthy),
            ("fallback_serving", &a.fallback_serving),
            ("breakers_open", &a.breakers_open),
        ] {
            ConstCounter::new(value.load(Ordering::Relaxed)).encode(m.encode_family(&[("rule", rule)])?)?;
        }
        let mut m2 = encoder.encode_descriptor(
            "alert_webhook_deliveries",
            "Alerts handed to the webhook, by outcome",
            None,
            fired.metric_type(),
        )?;
        for (outcome, value) in [
            ("delivered", &a.webhook_delivered),
            ("failed", &a.webhook_failed),
            ("dropped", &a.webhook_dropped),
            ("claimed_elsewhere", &a.webhook_claimed_elsewhere),
        ] {
            ConstCounter::new(value.load(Ordering::Relaxed)).encode(m2.encode_family(&[("outcome", outcome)])?)?;
        }
        let attempts = ConstCounter::new(a.webhook_attempts.load(Ordering::Relaxed));
        let m3 = encoder.encode_descriptor(
            "alert_webhook_attempts",
            "POSTs to the alert webhook, retries included",
            None,
            attempts.metric_type(),
        )?;
        attempts.encode(m3)?;
        for (name, help, value) in [
            ("alerts_active", "Alerts in force", &a.active),
            ("tenant_feeds", "Tenant feeds running (one store watch each)", &s.feeds),
            ("watch_streams", "Sidecar watch streams open", &s.watch_streams),
        ] {
            let g = ConstGauge::new(value.load(Ordering::Relaxed));
            let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
            g.encode(m)?;
        }
        s.sessions.encode(&mut encoder)?;
        Ok(())
    }
}

/// The admin endpoints of a control replica, with readiness kept fresh by a task that ends
/// on `shutdown`.
pub fn admin_state(store: Arc<dyn Store>, stats: Arc<ControlStats>, mut shutdown: watch::Receiver<bool>) -> AdminState {
    let mut registry = Registry::with_prefix("agent_reach_control");
    registry.register_collector(Box::new(StatsCollector { stats }));
    let ready = Arc::new(AtomicBool::new(false));
    let why = Arc::new(Mutex::new("store not checked yet".to_string()));
    let (r, w) = (ready.clone(), why.clone());
    tokio::spawn(async move {
        loop {
            let (ok, text) = match tokio::time::timeout(Duration::from_secs(2), store.current_revision()).await {
                Ok(Ok(rev)) => (true, format!("{} store at revision {rev}", store.backend())),
                Ok(Err(e)) => (false, format!("{} store: {e}", store.backend())),
                Err(_) => (false, format!("{} store did not answer within 2s", store.backend())),
            };
            r.store(ok, Ordering::Relaxed);
            *w.lock().unwrap_or_else(|e| e.into_inner()) = text;
            tokio::select! {
                _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    });
    AdminState {
        metrics: Box::new(move || {
            let mut out = String::new();
            if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
                out.clear();
            }
            out
        }),
        ready: Box::new(move || {
            let text = why.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if ready.load(Ordering::Relaxed) { Ok(text) } else { Err(text) }
        }),
        spans: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_limit() {
        let stats = Arc::new(ControlStats::default());
        stats.conn.connections.fetch_add(2, Ordering::Relaxed);
        stats.feed_refusals.fetch_add(3, Ordering::Relaxed);
        stats.conn.header_read_timeout.fetch_add(4, Ordering::Relaxed);
        stats.conn.idle_timeout.fetch_add(5, Ordering::Relaxed);
        stats.conn.send_stall_timeout.fetch_add(8, Ordering::Relaxed);
        stats.conn.header_list.fetch_add(6, Ordering::Relaxed);
        stats.conn.request_timeout.fetch_add(7, Ordering::Relaxed);
        let mut registry = Registry::with_prefix("agent_reach_control");
        registry.register_collector(Box::new(StatsCollector { stats }));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in [
            "agent_reach_control_limit_refusals_total{limit=\"max_connections\"} 2\n",
            "agent_reach_control_limit_refusals_total{limit=\"max_control_frames_per_second\"} 0\n",
            "agent_reach_control_limit_refusals_total{limit=\"max_tenant_feeds\"} 3\n",
            "agent_reach_control_limit_refusals_total{limit=\"header_read_timeout\"} 4\n",
            "agent_reach_control_limit_refusals_total{limit=\"idle_timeout\"} 5\n",
            "agent_reach_control_limit_refusals_total{limit=\"send_stall_timeout\"} 8\n",
            "agent_reach_control_limit_refusals_total{limit=\"max_header_list_bytes\"} 6\n",
            "agent_reach_control_limit_refusals_total{limit=\"request_timeout\"} 7\n",
        ] {
            assert!(out.contains(line), "{line:?} in\n{out}");
        }
    }
}
