//! Removals held after a reconnection to control, so a long control outage loses no call.
//!
//! While control is unreachable nothing renews the sidecars' leases, so after the lease TTL
//! the store deletes every record. When control comes back, a caller's sidecar would learn
//! those removals (as deltas, or by their absence from a resync snapshot) before the
//! targets' sidecars have registered their instances again, and calls to agents that never
//! stopped answering would fail with AGENT_NOT_FOUND in between. So for `grace` after each
//! reconnection (after a watch stream that had worked was lost), a removal is held: the
//! instance stays routable, as last known, until its own sidecar registers it again (an
//! upsert of the same id ends the hold), or until `grace` has passed since the removal
//! arrived, when it is removed. A held instance that really is gone fails its calls, which
//! are retried on another instance and open its breaker, as for any instance that dies
//! between two table updates. A table loaded from the saved file is never held over: the
//! first snapshot from control replaces it whole. This module decides what is held; the
//! watch loop in [`crate::control`] applies it.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The removals held by one watch loop.
#[derive(Debug)]
pub struct Held {
    grace: Duration,
    /// A watch stream delivered an event in this process, so a later connection is a
    /// reconnection.
    was_live: bool,
    /// Removals arriving before this instant are held.
    holding_until: Option<Instant>,
    /// Held instance ids and when each hold ends.
    held: HashMap<String, Instant>,
}

impl Held {
    /// Holds removals for `grace` after every reconnection; zero never holds.
    pub fn new(grace: Duration) -> Held {
        Held { grace, was_live: false, holding_until: None, held: HashMap::new() }
    }

    /// A watch stream was opened at `now`.
    pub fn connected(&mut self, now: Instant) {
        if self.was_live && !self.grace.is_zero() {
            self.holding_until = Some(now + self.grace);
        }
    }

    /// A watch stream delivered an event.
    pub fn live(&mut self) {
        self.was_live = true;
    }

    /// Whether a removal arriving at `now` is held; if so, it is recorded.
    pub fn hold(&mut self, instance_id: &str, now: Instant) -> bool {
        if self.holding_until.is_none_or(|until| now >= until) {
            return false;
        }
        self.held.entry(instance_id.to_string()).or_insert(now + self.grace);
        true
    }

    /// The instance was registered (again): its hold, if any, ends.
    pub fn upserted(&mut self, instance_id: &str) {
        if !self.held.is_empty() {
            self.held.remove(instance_id);
        }
    }

    /// When the next hold ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.values().min().copied()
    }

    /// Removes and returns the holds that ended by `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<String> {
        let ended: Vec<String> = self.held.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
        for id in &ended {
            self.held.remove(id);
        }
        ended
    }

    /// How many removals are held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_are_held_only_after_a_reconnection_and_for_the_grace() {
        let grace = Duration::from_secs(10);
        let mut held = Held::new(grace);
        let t0 = Instant::now();
        // The first connection is not a reconnection.
        held.connected(t0);
        assert!(!held.hold("a", t0));
        held.live();
        // A reconnection holds removals that arrive within the grace.
        held.connected(t0 + Duration::from_secs(1));
        assert!(held.hold("a", t0 + Duration::from_secs(2)));
        assert!(held.hold("b", t0 + Duration::from_secs(3)));
        assert!(!held.hold("c", t0 + Duration::from_secs(11)), "the holding window is over");
        assert_eq!(held.len(), 2);
        assert_eq!(held.next_deadline(), Some(t0 + Duration::from_secs(12)));
        // "a" registers again: its hold ends; "b" expires after its grace.
        held.upserted("a");
        assert_eq!(held.expired(t0 + Duration::from_secs(12)), Vec::<String>::new());
        assert_eq!(held.expired(t0 + Duration::from_secs(13)), vec!["b".to_string()]);
        assert!(held.is_empty());
        assert_eq!(held.next_deadline(), None);
    }

    #[test]
    fn zero_grace_never_holds() {
        let mut held = Held::new(Duration::ZERO);
        let t0 = Instant::now();
        held.connected(t0);
        held.live();
        held.connected(t0);
        assert!(!held.hold("a", t0));
        assert!(held.is_empty());
    }
}
