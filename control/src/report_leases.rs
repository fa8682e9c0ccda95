//! Leases for the traffic reports of sidecars without local agents.
//!
//! A sidecar's report normally lives on the sidecar's own lease (see [`crate::reports`]),
//! which its agents' registrations obtained. A sidecar with no local agent has no lease,
//! yet calls made through it (by clients that are not agents) belong in the topology: it
//! sends its report alone, on a heartbeat with no instances and lease 0. The replica that
//! takes it keeps one lease per such sidecar, lasting three report intervals (at least
//! [`MIN_TTL`], at most [`MAX_TTL`]), renews it with every report and grants a new one
//! when it is gone; the report disappears three intervals after the sidecar stops sending.
//! A replica holds at most [`MAX_LEASES`] such leases; beyond that, reports of further
//! agentless sidecars are refused (logged), never queued.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use agent_reach_store::{LeaseId, Store, StoreError};
use tokio::time::Instant;

/// Shortest lease of an agentless sidecar's report.
pub const MIN_TTL: Duration = Duration::from_secs(10);
/// Longest lease of an agentless sidecar's report.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Agentless sidecars one replica keeps reports for, at most.
pub const MAX_LEASES: usize = 10_000;

/// The leases held, by (tenant, sidecar id): the lease, its TTL, and when it was last
/// renewed.
type Held = HashMap<(String, String), (LeaseId, Duration, Instant)>;

/// See the module documentation.
#[derive(Default)]
pub struct ReportLeases {
    held: Mutex<Held>,
}

/// The lease TTL for reports sent every `interval_ms` (0: unknown, the shortest).
pub fn ttl(interval_ms: u32) -> Duration {
    (Duration::from_millis(u64::from(interval_ms)) * 3).clamp(MIN_TTL, MAX_TTL)
}

impl ReportLeases {
    /// A live lease for the report of `sidecar_id` (renewed, or newly granted).
    pub async fn lease_for(
        &self,
        store: &dyn Store,
        tenant: &str,
        sidecar_id: &str,
        interval_ms: u32,
    ) -> Result<LeaseId, String> {
        let key = (tenant.to_string(), sidecar_id.to_string());
        let ttl = ttl(interval_ms);
        let known = self.lock().get(&key).map(|(lease, held_ttl, _)| (*lease, *held_ttl));
        if let Some((lease, held_ttl)) = known
            && held_ttl == ttl
        {
            match store.keep_alive(lease).await {
                Ok(_) => {
                    if let Some(entry) = self.lock().get_mut(&key) {
                        entry.2 = Instant::now();
                    }
                    return Ok(lease);
                }
                Err(StoreError::LeaseNotFound(_)) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        {
            let now = Instant::now();
            let mut held = self.lock();
            // Leases not renewed for longer than their TTL are gone.
            held.retain(|_, (_, ttl, renewed)| now.saturating_duration_since(*renewed) <= *ttl);
            if held.len() >= MAX_LEASES && !held.contains_key(&key) {
                return Err(format!("this replica keeps reports of {MAX_LEASES} sidecars without agents already"));
            }
        }
        let grant = store.grant_lease(ttl).await.map_err(|e| e.to_string())?;
        let previous = self.lock().insert(key, (grant.id, ttl, Instant::now()));
        // A lease of another TTL (the interval changed) is not needed any more.
        if let Some((old, _, _)) = previous
            && old != grant.id
        {
            let _ = store.revoke_lease(old).await;
        }
        Ok(grant.id)
    }

    /// How many agentless sidecars' leases this replica holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Poisoning only means a panic elsewhere; the map stays valid.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agent_reach_store::EmbeddedStore;

    use super::*;

    #[test]
    fn three_intervals_within_bounds() {
        assert_eq!(ttl(0), MIN_TTL);
        assert_eq!(ttl(10_000), Duration::from_secs(30));
        assert_eq!(ttl(u32::MAX), MAX_TTL);
    }

    #[tokio::test]
    async fn one_lease_per_sidecar_renewed_then_replaced_once_gone() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new(Default::default()));
        let leases = ReportLeases::default();
        let first = leases.lease_for(store.as_ref(), "t", "edge-1", 10_000).await.unwrap();
        assert_eq!(leases.lease_for(store.as_ref(), "t", "edge-1", 10_000).await.unwrap(), first);
        let other = leases.lease_for(store.as_ref(), "t", "edge-2", 10_000).await.unwrap();
        assert_ne!(other, first);
        assert_eq!(leases.len(), 2);
        store.revoke_lease(first).await.unwrap();
        let second = leases.lease_for(store.as_ref(), "t", "edge-1", 10_000).await.unwrap();
        assert_ne!(second, first);
        assert_eq!(leases.len(), 2);
        // Another interval: another TTL, the old lease revoked.
        let third = leases.lease_for(store.as_ref(), "t", "edge-1", 60_000).await.unwrap();
        assert_ne!(third, second);
        assert!(matches!(store.keep_alive(second).await, Err(StoreError::LeaseNotFound(_))));
    }
}
