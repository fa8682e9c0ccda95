//! The result cache of read-only capabilities, in the caller's sidecar: a call identical to
//! a recent one (same target, tags, content type and payload) is answered from memory for
//! the policy's `cache_ttl_ms`. Only capabilities whose policy says `read_only: true` are
//! ever cached, only successful unary answers are kept, and the cache is bounded in entries
//! and bytes (the oldest entries go first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::grpc::StoredResponse;

/// See the module documentation.
pub struct ResultCache {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u64, (Instant, Arc<StoredResponse>)>,
    order: VecDeque<u64>,
    bytes: usize,
}

impl ResultCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> ResultCache {
        ResultCache { inner: Mutex::new(Inner::default()), max_entries, max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Poisoning only means a panic elsewhere; the map stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer for `key`, if fresh.
    pub fn get(&self, key: u64, now: Instant) -> Option<Arc<StoredResponse>> {
        let inner = self.lock();
        inner.entries.get(&key).filter(|(expires, _)| *expires > now).map(|(_, r)| r.clone())
    }

    /// Keeps `answer` for `ttl`.
    pub fn put(&self, key: u64, answer: StoredResponse, ttl: Duration, now: Instant) {
        if answer.size() > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        if let Some((_, old)) = inner.entries.remove(&key) {
            inner.bytes -= old.size();
        }
        inner.bytes += answer.size();
        inner.entries.insert(key, (now + ttl, Arc::new(answer)));
        inner.order.push_back(key);
        while inner.entries.len() > self.max_entries || inner.bytes > self.max_bytes {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some((_, old)) = inner.entries.remove(&oldest) {
                inner.bytes -= old.size();
            }
        }
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderMap;

    use super::*;

    fn answer(n: usize) -> StoredResponse {
        StoredResponse { headers: HeaderMap::new(), data: Bytes::from(vec![b'x'; n]), trailers: None }
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_the_bounds_hold() {
        let cache = ResultCache::new(2, 100);
        let now = Instant::now();
        cache.put(1, answer(10), Duration::from_secs(1), now);
        assert!(cache.get(1, now).is_some());
        assert!(cache.get(1, now + Duration::from_secs(1)).is_none(), "expired");
        cache.put(2, answer(10), Duration::from_secs(5), now);
        cache.put(3, answer(10), Duration::from_secs(5), now);
        assert_eq!(cache.len(), 2, "at most two entries");
        assert!(cache.get(1, now).is_none(), "the oldest went first");
        cache.put(4, answer(95), Duration::from_secs(5), now);
        assert_eq!(cache.len(), 1, "byte bound");
        cache.put(5, answer(101), Duration::from_secs(5), now);
        assert!(cache.get(5, now).is_none(), "larger than the whole cache: not kept");
    }
}
