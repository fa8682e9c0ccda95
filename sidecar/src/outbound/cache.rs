//! The result cache of read-only capabilities, in the caller's sidecar: a call identical to
//! a recent one (same target, tags, content type and payload) is answered from memory for
//! the policy's `cache_ttl_ms`. Only capabilities whose policy says `read_only: true` are
//! ever cached, only successful unary answers are kept, and the cache is bounded in entries
//! and bytes (the oldest entries go first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use std::task::{Context, Poll};

use http::{HeaderValue, Response};
use tower::{Service, ServiceExt};

use crate::call::{OutboundCall, Shape};
use crate::error::SidecarError;
use crate::grpc::{Body, StoredResponse, header};
use crate::telemetry::Rejections;

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// See the module documentation.
pub(crate) struct ResultCache {
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
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> ResultCache {
        ResultCache { inner: Mutex::new(Inner::default()), max_entries, max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Poisoning only means a panic elsewhere; the map stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer for `key`, if fresh.
    pub(crate) fn get(&self, key: u64, now: Instant) -> Option<Arc<StoredResponse>> {
        let inner = self.lock();
        inner.entries.get(&key).filter(|(expires, _)| *expires > now).map(|(_, r)| r.clone())
    }

    /// Keeps `answer` for `ttl`.
    pub(crate) fn put(&self, key: u64, answer: StoredResponse, ttl: Duration, now: Instant) {
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

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
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
fn cache_key(call: &OutboundCall) -> u64 {
    let mut bytes = Vec::with_capacity(call.head.payload.len() + 64);
    bytes.extend_from_slice(call.target.to_string().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(call.head.content_type.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&call.head.payload);
    agent_reach_routing::ring::hash64(&bytes)
}

impl<S> Service<OutboundCall> for Cached<S>
where
    S: Service<OutboundCall, Response = Response<Body>, Error = SidecarError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Response<Body>, SidecarError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let ttl = match call.spec() {
            Some(s) if s.read_only && s.cache_ttl_ms > 0 && call.shape == Shape::Unary => {
                Duration::from_millis(u64::from(s.cache_ttl_ms))
            }
            _ => return Box::pin(self.inner.clone().oneshot(call)),
        };
        let key = cache_key(&call);
        if let Some(hit) = self.cache.get(key, Instant::now()) {
            Rejections::count(&self.rejections.cache_hits);
            let mut resp = hit.to_response();
            resp.headers_mut().insert(header::CACHE, HeaderValue::from_static("hit"));
            return Box::pin(std::future::ready(Ok(resp)));
        }
        let (cache, limit, service) = (self.cache.clone(), self.limit, self.inner.clone());
        Box::pin(async move {
            let resp = service.oneshot(call).await?;
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
