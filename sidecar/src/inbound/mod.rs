//! What the target's sidecar counts for each local instance: calls it has delivered and
//! not yet seen answered. The count becomes the load reported to callers in every reply's
//! `ar-load` trailer, so callers see load changes on the next call rather than the next
//! heartbeat.
//!
//! Lock-free on the call path (an `ArcSwap`ed map, updated only when an instance is first
//! seen). Admission control (priority shares, queues) is not built here yet.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Trailer (or trailers-only header) carrying the serving instance's load ratio.
pub const HEADER_LOAD: HeaderName = HeaderName::from_static("ar-load");

/// Counters of one local instance.
#[derive(Debug, Default)]
pub struct InboundInstance {
    in_flight: AtomicU32,
    max_concurrency: u32,
}

impl InboundInstance {
    /// Calls delivered and not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Load ratio excluding the call being answered: in flight / max concurrency (0 when
    /// the agent declared no limit).
    pub fn load_ratio_after_one(&self) -> f64 {
        if self.max_concurrency == 0 {
            return 0.0;
        }
        f64::from(self.in_flight().saturating_sub(1)) / f64::from(self.max_concurrency)
    }

    /// Counts a delivery until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InboundGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InboundGuard { instance: self.clone() }
    }

    /// Writes the load into `headers` as `ar-load`.
    pub fn annotate(&self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&format!("{:.3}", self.load_ratio_after_one())) {
            headers.insert(HEADER_LOAD, v);
        }
    }
}

/// A delivery in progress.
#[derive(Debug)]
pub struct InboundGuard {
    instance: Arc<InboundInstance>,
}

impl InboundGuard {
    pub fn instance(&self) -> &Arc<InboundInstance> {
        &self.instance
    }
}

impl Drop for InboundGuard {
    fn drop(&mut self) {
        self.instance.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counters of every local instance.
#[derive(Default)]
pub struct Inbound {
    instances: ArcSwap<HashMap<String, Arc<InboundInstance>>>,
}

impl Inbound {
    /// The counters of `instance_id`, created on first use.
    pub fn get(&self, instance_id: &str, max_concurrency: u32) -> Arc<InboundInstance> {
        if let Some(i) = self.instances.load().get(instance_id)
            && i.max_concurrency == max_concurrency
        {
            return i.clone();
        }
        let fresh = Arc::new(InboundInstance { in_flight: AtomicU32::new(0), max_concurrency });
        let mut out = fresh.clone();
        self.instances.rcu(|m| {
            let mut m = HashMap::clone(m);
            out = m.entry(instance_id.to_string()).or_insert_with(|| fresh.clone()).clone();
            m
        });
        out
    }

    /// Calls delivered to any local instance and not yet answered.
    pub fn total_in_flight(&self) -> u32 {
        self.instances.load().values().map(|i| i.in_flight()).sum()
    }

    /// Forgets instances that left.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.instances.rcu(|m| {
            m.iter().filter(|(id, _)| keep(id)).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>()
        });
    }
}

/// The load ratio in an `ar-load` value.
pub fn parse_load(headers: &HeaderMap) -> Option<f64> {
    headers.get(HEADER_LOAD)?.to_str().ok()?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_excludes_the_call_being_answered() {
        let inbound = Inbound::default();
        let i = inbound.get("a-1", 4);
        let g1 = i.begin();
        let _g2 = i.begin();
        assert_eq!(inbound.total_in_flight(), 2);
        let mut h = HeaderMap::new();
        i.annotate(&mut h);
        assert_eq!(h[HEADER_LOAD], "0.250");
        assert_eq!(parse_load(&h), Some(0.25));
        drop(g1);
        assert_eq!(i.in_flight(), 1);
        assert!(Arc::ptr_eq(&i, &inbound.get("a-1", 4)));
        inbound.retain(|_| false);
        assert_eq!(inbound.total_in_flight(), 0);
    }
}
