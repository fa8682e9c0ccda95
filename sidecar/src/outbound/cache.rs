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

use http::HeaderValue;
use tower::Service;

use crate::call::{BoxFuture, OutboundCall, Shape, boxed};
use crate::error::SidecarError;
use crate::grpc::{StoredResponse, header};
use crate::telemetry::{Rejections, Routed};

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
    S: Service<OutboundCall, Response = Routed, Error = SidecarError, Future = BoxFuture<Result<Routed, SidecarError>>>,
{
    type Response = Routed;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Routed, SidecarError>>;

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
            return Rejections::refuse(&self.rejections.cache_hits, Ok(Routed::unrouted(resp)));
        }
        let (cache, limit, answer) = (self.cache.clone(), self.limit, self.inner.call(call));
        boxed!(async move {
            let Routed { resp, outcome } = answer.await?;
            let stored = StoredResponse::collect(resp, limit).await.map_err(SidecarError::Internal)?;
            if stored.status_code() == Some(tonic::Code::Ok) {
                cache.put(key, stored.clone(), ttl, Instant::now());
            }
            // How the router routed it goes on with the rebuilt answer.
            Ok(Routed { resp: stored.to_response(), outcome })
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

    /// A miss carries how the router routed it through the rebuilt answer (the call's
    /// metrics name the serving instance); a hit was routed nowhere.
    #[tokio::test(start_paused = true)]
    async fn a_miss_keeps_the_routers_outcome_and_a_hit_has_none() {
        use std::sync::atomic::{AtomicU32, Ordering};

        use agent_reach::policy::{Policy, PolicyKind, PolicySpec};
        use agent_reach_routing::RoutingTable;

        use crate::telemetry::CallOutcome;

        let served = Arc::new(agent_reach::model::fixture::instance("i-1").build());
        let routed = Arc::new(AtomicU32::new(0));
        let inner = {
            let (served, routed) = (served.clone(), routed.clone());
            tower::service_fn(move |_call: OutboundCall| {
                routed.fetch_add(1, Ordering::SeqCst);
                let outcome = CallOutcome {
                    outcome: "OK".into(),
                    served: served.clone(),
                    attempts: 1,
                    strategy: "random",
                    fallback: false,
                };
                let resp = crate::grpc::status_response(tonic::Status::ok(""));
                let answer: BoxFuture<Result<Routed, SidecarError>> =
                    Box::pin(std::future::ready(Ok(Routed { resp, outcome: Some(outcome) })));
                answer
            })
        };
        let rejections = Arc::new(Rejections::default());
        let mut cached = Cached { cache: Arc::new(ResultCache::new(10, 1 << 20)), rejections, limit: 1 << 20, inner };
        let policy = Policy {
            tenant: "acme".into(),
            kind: PolicyKind::Capability,
            name: "c".into(),
            spec: PolicySpec { read_only: true, cache_ttl_ms: 60_000, ..Default::default() },
            description: String::new(),
        };
        let table = Arc::new(RoutingTable::build(
            1,
            Default::default(),
            agent_reach_routing::table::Policies::from_iter([(
                (PolicyKind::Capability, "c".to_string()),
                Arc::new(policy),
            )]),
            None,
        ));
        let call = || {
            let mut call = crate::call::test_call();
            call.table = table.clone();
            call
        };
        let miss = cached.call(call()).await.unwrap_or_else(|e| panic!("{e}"));
        let outcome = miss.outcome.expect("the miss keeps the router's outcome");
        assert_eq!((outcome.instance(), outcome.attempts), ("i-1", 1));
        assert!(!miss.resp.headers().contains_key(header::CACHE));
        let hit = cached.call(call()).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(hit.outcome.is_none(), "a hit was routed nowhere");
        assert_eq!(hit.resp.headers()[header::CACHE], "hit");
        assert_eq!(routed.load(Ordering::SeqCst), 1, "the hit never reached the router");
        assert_eq!(cached.rejections.cache_hits.load(Ordering::Relaxed), 1);
    }
}
