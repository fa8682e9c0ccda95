//! The result cache of read-only capabilities, in the caller's sidecar: a call identical to
//! a recent one (same target, tags, content type and payload) is answered from memory for
//! the policy's `cache_ttl_ms`. Only capabilities whose policy says `read_only: true` are
//! ever cached, only successful unary answers are kept, and the cache is bounded in entries
//! and bytes (the oldest entries go first).
//!
//! Entries are keyed by the whole key ([`CacheKey`]: target kind, name and every tag,
//! content type, the payload's bytes), compared in full on lookup: two different calls
//! can never share an answer, whatever their hashes. The key's bytes count towards the
//! cache's byte bound.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use std::task::{Context, Poll};

use http::{HeaderValue, Response};
use tower::Service;

use crate::call::{BoxFuture, OutboundCall, Shape, boxed};
use crate::error::SidecarError;
use crate::grpc::{Body, StoredResponse, header};
use crate::telemetry::Rejections;

/// What identifies a cacheable call, kept and compared whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    agent: bool,
    name: String,
    tags: Vec<String>,
    content_type: String,
    payload: bytes::Bytes,
}

impl CacheKey {
    pub(crate) fn new(target: &agent_reach::model::Target, content_type: &str, payload: &[u8]) -> CacheKey {
        CacheKey {
            agent: matches!(target.kind, agent_reach::model::TargetKind::Agent(_)),
            name: target.name().to_string(),
            tags: target.tags.clone(),
            content_type: content_type.to_string(),
            // A copy: the key must not hold on to the request's whole buffer.
            payload: bytes::Bytes::copy_from_slice(payload),
        }
    }

    /// Bytes held by the key.
    fn size(&self) -> usize {
        self.name.len()
            + self.tags.iter().map(String::len).sum::<usize>()
            + self.content_type.len()
            + self.payload.len()
    }
}

/// See the module documentation. `H` hashes keys (tests force collisions with it).
pub(crate) struct ResultCache<H = RandomState> {
    inner: Mutex<Inner<H>>,
    max_entries: usize,
    max_bytes: usize,
}

struct Inner<H> {
    entries: HashMap<Arc<CacheKey>, (Instant, Arc<StoredResponse>), H>,
    /// Keys, oldest first; each key at most once.
    order: VecDeque<Arc<CacheKey>>,
    bytes: usize,
}

impl ResultCache {
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> ResultCache {
        ResultCache::with_hasher(max_entries, max_bytes, RandomState::new())
    }
}

impl<H: BuildHasher> ResultCache<H> {
    pub(crate) fn with_hasher(max_entries: usize, max_bytes: usize, hasher: H) -> ResultCache<H> {
        let inner = Inner { entries: HashMap::with_hasher(hasher), order: VecDeque::new(), bytes: 0 };
        ResultCache { inner: Mutex::new(inner), max_entries, max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<H>> {
        // Poisoning only means a panic elsewhere; the map stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer for `key`, if fresh.
    pub(crate) fn get(&self, key: &CacheKey, now: Instant) -> Option<Arc<StoredResponse>> {
        let inner = self.lock();
        inner.entries.get(key).filter(|(expires, _)| *expires > now).map(|(_, r)| r.clone())
    }

    /// Keeps `answer` for `ttl`.
    pub(crate) fn put(&self, key: CacheKey, answer: StoredResponse, ttl: Duration, now: Instant) {
        let size = answer.size() + key.size();
        if size > self.max_bytes {
            return;
        }
        let key = Arc::new(key);
        let mut inner = self.lock();
        if let Some((old_key, (_, old))) = inner.entries.remove_entry(&key) {
            inner.bytes -= old.size() + old_key.size();
            inner.order.retain(|k| **k != *key);
        }
        inner.bytes += size;
        inner.entries.insert(key.clone(), (now + ttl, Arc::new(answer)));
        inner.order.push_back(key);
        while inner.entries.len() > self.max_entries || inner.bytes > self.max_bytes {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some((old_key, (_, old))) = inner.entries.remove_entry(&oldest) {
                inner.bytes -= old.size() + old_key.size();
            }
        }
    }

    /// Entries kept now, fresh or expired (read by /metrics at scrape time).
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Bytes the entries hold: their keys' and answers' (what `max_bytes` bounds).
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    #[cfg(test)]
    fn order_len(&self) -> usize {
        self.lock().order.len()
    }
}

/// Service: the result cache of read-only capabilities.
#[derive(Clone)]
pub(crate) struct Cached<S> {
    cache: Arc<ResultCache>,
    rejections: Arc<Rejections>,
    /// The largest answer stored.
    limit: usize,
    inner: S,
}

/// The layer of [`Cached`].
pub(crate) fn layer<S>(
    cache: Arc<ResultCache>,
    rejections: Arc<Rejections>,
    limit: usize,
) -> impl tower::Layer<S, Service = Cached<S>> + Clone {
    tower::layer::layer_fn(move |inner| Cached { cache: cache.clone(), rejections: rejections.clone(), limit, inner })
}

/// The cache key: target (with tags), content type and payload.
fn cache_key(call: &OutboundCall) -> CacheKey {
    CacheKey::new(&call.target, &call.head.content_type, &call.head.payload)
}

impl<S> Service<OutboundCall> for Cached<S>
where
    S: Service<
            OutboundCall,
            Response = Response<Body>,
            Error = SidecarError,
            Future = BoxFuture<Result<Response<Body>, SidecarError>>,
        >,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Response<Body>, SidecarError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        // The inner layer is ready (`poll_ready` above): called here, its answer's future
        // passed on as it is when the call is not cacheable.
        let ttl = match call.spec() {
            Some(s) if s.read_only && s.cache_ttl_ms > 0 && call.shape == Shape::Unary => {
                Duration::from_millis(u64::from(s.cache_ttl_ms))
            }
            _ => return self.inner.call(call),
        };
        let key = cache_key(&call);
        if let Some(hit) = self.cache.get(&key, Instant::now()) {
            let mut resp = hit.to_response();
            resp.headers_mut().insert(header::CACHE, HeaderValue::from_static("hit"));
            return Rejections::refuse(&self.rejections.cache_hits, Ok(resp));
        }
        let (cache, limit, answer) = (self.cache.clone(), self.limit, self.inner.call(call));
        boxed!(async move {
            let resp = answer.await?;
            let stored = StoredResponse::collect(resp, limit).await.map_err(SidecarError::Internal)?;
            if stored.status_code() == Some(tonic::Code::Ok) {
                cache.put(key, stored.clone(), ttl, Instant::now());
            }
            Ok(stored.to_response())
        })
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

    fn key(n: u32) -> CacheKey {
        CacheKey::new(&agent_reach::model::Target::capability("c"), "", n.to_string().as_bytes())
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_the_bounds_hold() {
        let cache = ResultCache::new(2, 100);
        let now = Instant::now();
        cache.put(key(1), answer(10), Duration::from_secs(1), now);
        assert!(cache.get(&key(1), now).is_some());
        assert!(cache.get(&key(1), now + Duration::from_secs(1)).is_none(), "expired");
        cache.put(key(2), answer(10), Duration::from_secs(5), now);
        cache.put(key(3), answer(10), Duration::from_secs(5), now);
        assert_eq!(cache.len(), 2, "at most two entries");
        assert!(cache.get(&key(1), now).is_none(), "the oldest went first");
        cache.put(key(4), answer(90), Duration::from_secs(5), now);
        assert_eq!(cache.len(), 1, "byte bound (answer and key)");
        cache.put(key(5), answer(99), Duration::from_secs(5), now);
        assert!(cache.get(&key(5), now).is_none(), "answer and key larger than the whole cache: not kept");
    }

    /// Every key hashes to the same value.
    #[derive(Clone, Default)]
    struct Colliding;
    impl BuildHasher for Colliding {
        type Hasher = Constant;
        fn build_hasher(&self) -> Constant {
            Constant
        }
    }
    struct Constant;
    impl std::hash::Hasher for Constant {
        fn finish(&self) -> u64 {
            42
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[tokio::test(start_paused = true)]
    async fn colliding_hashes_never_share_an_answer() {
        let cache = ResultCache::with_hasher(100, 1 << 20, Colliding);
        let now = Instant::now();
        let ttl = Duration::from_secs(5);
        let target = agent_reach::model::Target::capability("c");
        let tagged = agent_reach::model::Target { tags: vec!["zh".into()], ..target.clone() };
        let keys = [
            CacheKey::new(&target, "", b"a"),
            CacheKey::new(&target, "", b"b"),
            CacheKey::new(&target, "application/json", b"a"),
            CacheKey::new(&tagged, "", b"a"),
            CacheKey::new(&agent_reach::model::Target::agent("c"), "", b"a"),
        ];
        for (i, k) in keys.iter().enumerate() {
            cache.put(k.clone(), answer(i + 1), ttl, now);
        }
        assert_eq!(cache.len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(cache.get(k, now).unwrap().data.len(), i + 1, "{k:?}");
        }
        assert!(cache.get(&CacheKey::new(&target, "", b"c"), now).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_key_put_again_is_listed_once() {
        let cache = ResultCache::new(10, 1 << 20);
        let now = Instant::now();
        for _ in 0..1000 {
            cache.put(key(1), answer(1), Duration::from_secs(5), now);
        }
        assert_eq!((cache.len(), cache.order_len()), (1, 1));
    }

    #[test]
    fn targets_differing_past_what_errors_show_have_different_keys() {
        let tags = |last: &str| {
            let mut tags: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
            tags.push(last.into());
            agent_reach::model::Target { tags, ..agent_reach::model::Target::capability("c") }
        };
        assert_ne!(CacheKey::new(&tags("x"), "", b""), CacheKey::new(&tags("y"), "", b""));
    }
}
