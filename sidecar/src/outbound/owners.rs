//! Where the caller's sidecar sends the duplicates of a keyed call: the instance that owns
//! the claim of the key, as the target's sidecar names it in the answer's
//! `ar-idempotency-owner` header (the instance whose call of the key ran). The router picks
//! that instance ahead of the target's strategy while it can take the call
//! ([`agent_reach_routing::route::preferred`]); otherwise the strategy picks, as for any
//! call, and the target's sidecar there replays or refuses through the claim with control.
//! A preference only saves work (the owner's sidecar answers a duplicate from its memory,
//! without asking control): exactly-once holds without it.
//!
//! A bounded map: (target, key) hashed with a per-sidecar random key (so callers cannot
//! aim collisions at each other's keys) → owner, for the idempotency window, at most
//! `max` entries (the oldest go first), reported in `/metrics` as
//! `agent_reach_bounded_entries{map="idempotency_owners"}`. A brief `std::sync::Mutex`,
//! never held across an await.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The owners of keys sent through this sidecar (see the module documentation).
pub(crate) struct Owners {
    inner: Mutex<Inner>,
    hasher: std::collections::hash_map::RandomState,
    ttl: Duration,
    max: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, (Arc<str>, Instant)>,
    /// (expiry, entry) in the order learnt; an entry learnt again has a later one.
    order: VecDeque<(Instant, u64)>,
}

impl Owners {
    /// Owners kept for `ttl` (the idempotency window), at most `max` of them.
    pub(crate) fn new(ttl: Duration, max: usize) -> Arc<Owners> {
        Arc::new(Owners { inner: Mutex::default(), hasher: Default::default(), ttl, max: max.max(1) })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn id(&self, target: &str, key: &str) -> u64 {
        self.hasher.hash_one((target, key))
    }

    /// The owner of `key` of `target`, if known within the window.
    pub(crate) fn owner(&self, target: &str, key: &str) -> Option<Arc<str>> {
        let id = self.id(target, key);
        let inner = self.inner();
        inner.map.get(&id).filter(|(_, expires)| *expires > Instant::now()).map(|(owner, _)| owner.clone())
    }

    /// Records that `owner` owns `key` of `target`.
    pub(crate) fn learn(&self, target: &str, key: &str, owner: &str) {
        let id = self.id(target, key);
        let now = Instant::now();
        let expires = now + self.ttl;
        let mut inner = self.inner();
        match inner.map.get_mut(&id) {
            Some((known, _)) if &**known == owner => {}
            _ => {
                inner.map.insert(id, (owner.into(), expires));
                inner.order.push_back((expires, id));
            }
        }
        // Past the window, or the oldest beyond the cap. An entry is removed only by its
        // latest position in the order.
        let Inner { map, order } = &mut *inner;
        while let Some((at, id)) = order.front().copied() {
            if at > now && map.len() <= self.max {
                break;
            }
            order.pop_front();
            if map.get(&id).is_some_and(|(_, e)| *e == at) {
                map.remove(&id);
            }
        }
    }

    /// Owners kept now (read by /metrics at scrape time).
    pub(crate) fn len(&self) -> usize {
        self.inner().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn owners_are_kept_for_the_window_and_within_the_cap() {
        let owners = Owners::new(Duration::from_secs(600), 3);
        owners.learn("capability charge", "order-1", "i-1");
        assert_eq!(owners.owner("capability charge", "order-1").as_deref(), Some("i-1"));
        // Scoped by target: the same key to another target is unknown.
        assert_eq!(owners.owner("agent payments", "order-1"), None);
        // Learnt again with the same owner: one entry; a new owner replaces the old.
        owners.learn("capability charge", "order-1", "i-1");
        assert_eq!(owners.len(), 1);
        owners.learn("capability charge", "order-1", "i-2");
        assert_eq!((owners.len(), owners.owner("capability charge", "order-1").as_deref()), (1, Some("i-2")));
        // The cap: the oldest goes first.
        tokio::time::advance(Duration::from_secs(1)).await;
        for k in ["order-2", "order-3", "order-4"] {
            owners.learn("capability charge", k, "i-3");
        }
        assert_eq!(owners.len(), 3);
        assert_eq!(owners.owner("capability charge", "order-1"), None, "the oldest left at the cap");
        assert_eq!(owners.owner("capability charge", "order-4").as_deref(), Some("i-3"));
        // The window: unknown once it ends, and removed at the next learn.
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(owners.owner("capability charge", "order-4"), None);
        owners.learn("capability charge", "order-5", "i-1");
        assert_eq!(owners.len(), 1);
    }
}
