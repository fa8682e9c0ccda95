//! Counters of the session context calls one control replica serves (writes, deletes,
//! refusals by reason, live sessions per tenant), exported on `/metrics` through
//! [`crate::stats::ControlStats`]. Kept apart from the Sessions service so the stats
//! module, which every part of control reports into, imports nothing above it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_reach::reason::{self, Reason};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::Notify;
use tonic::Status;

/// Most tenants whose live sessions are counted and exported.
pub const MAX_COUNTED_TENANTS: usize = 1_000;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Session counters of one control replica (exported on `/metrics`).
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Writes (puts) applied.
    pub writes: AtomicU64,
    /// Deletes applied.
    pub deletes: AtomicU64,
    /// Session calls refused, by reason (`ErrorInfo.reason`).
    pub(crate) refusals: Mutex<BTreeMap<&'static str, u64>>,
    /// Live sessions per tenant, as last counted.
    pub(crate) live: Mutex<BTreeMap<String, u64>>,
    /// Tenants that used sessions through this replica (bounded).
    pub(crate) tenants: Mutex<BTreeSet<String>>,
    /// Wakes the counting task when a tenant is seen for the first time.
    pub(crate) new_tenant: Notify,
}

impl SessionCounters {
    /// Refusals of `reason` so far.
    pub fn refusals(&self, reason: Reason) -> u64 {
        lock(&self.refusals).get(reason.as_str()).copied().unwrap_or(0)
    }

    /// The tenant's live sessions as last counted.
    pub fn live(&self, tenant: &str) -> Option<u64> {
        lock(&self.live).get(tenant).copied()
    }

    pub(crate) fn refused(&self, status: &Status) {
        let why = reason::error_info(status).and_then(|i| Reason::parse(&i.reason)).map_or("OTHER", Reason::as_str);
        *lock(&self.refusals).entry(why).or_default() += 1;
    }

    pub(crate) fn saw(&self, tenant: &str) {
        let mut tenants = lock(&self.tenants);
        if tenants.len() < MAX_COUNTED_TENANTS && !tenants.contains(tenant) {
            tenants.insert(tenant.to_string());
            self.new_tenant.notify_one();
        }
    }

    /// The Prometheus families (names under the registry's `agent_reach_control` prefix).
    pub fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in [
            ("session_writes", "Session context writes applied", &self.writes),
            ("session_deletes", "Session context deletes applied", &self.deletes),
        ] {
            let c = ConstCounter::new(value.load(Ordering::Relaxed));
            let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        let mut m = encoder.encode_descriptor(
            "session_refusals",
            "Session context calls refused, by reason",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (why, n) in lock(&self.refusals).iter() {
            ConstCounter::new(*n).encode(m.encode_family(&[("reason", *why)])?)?;
        }
        let mut m = encoder.encode_descriptor(
            "sessions_live",
            "Live session contexts per tenant, as last counted",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (tenant, n) in lock(&self.live).iter() {
            ConstGauge::new(*n as i64).encode(m.encode_family(&[("tenant", tenant.as_str())])?)?;
        }
        Ok(())
    }
}
