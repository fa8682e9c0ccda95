//! Token buckets in the caller's sidecar: one per caller agent → target (rate and burst
//! from the target's policy) and one for the tenant (from the tenant policy). A call that
//! finds its bucket empty is refused at once with RATE_LIMITED and how long to wait,
//! without touching the target.
//!
//! The tenant's rate is shared out among the tenant's sidecars (its rate divided by the
//! number of sidecars in the routing table), since each sidecar only sees its own calls.
//! Buckets live in a map behind a brief `std::sync::Mutex`, never held across an await.
//! The map holds at most [`MAX_PAIR_BUCKETS`]: when a new pair would pass it, buckets that
//! have refilled completely (no different from new ones) are dropped first, then, if the map
//! is still full, an arbitrary one (its pair starts again with a full burst).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use std::sync::Arc;
use std::task::{Context, Poll};

use agent_reach::policy::RateLimit;
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use crate::call::BoxFuture;
use crate::call::{OutboundCall, policy_name, target_text};
use crate::error::SidecarError;
use crate::telemetry::{Rejections, Routed};

/// A token bucket: `burst` tokens, refilled at `per_second`.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(limit: RateLimit, now: Instant) -> TokenBucket {
        TokenBucket { limit, tokens: f64::from(limit.burst), last: now }
    }

    /// Whether the bucket has refilled to its burst by `now` (then it is no different from
    /// a new one and may be dropped).
    fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * self.limit.per_second >= f64::from(self.limit.burst)
    }

    /// Takes a token, or says how long until one is available.
    pub(crate) fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        // A rate that is not a positive finite number refills nothing (control refuses such
        // policies; this keeps the arithmetic total for any value that reaches it).
        let rate =
            if self.limit.per_second.is_finite() && self.limit.per_second > 0.0 { self.limit.per_second } else { 0.0 };
        let refilled = self.tokens + elapsed * rate;
        self.tokens = if refilled.is_nan() { 0.0 } else { refilled.min(f64::from(self.limit.burst)) };
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(retry_after(1.0 - self.tokens, rate))
        }
    }
}

/// Longest wait a refusal advertises, whatever the rate.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// How long until `missing` tokens are refilled at `rate` per second, capped at
/// [`MAX_RETRY_AFTER`]; never panics (a zero, tiny or non-finite rate gives the cap).
pub(crate) fn retry_after(missing: f64, rate: f64) -> Duration {
    Duration::try_from_secs_f64(missing / rate).map_or(MAX_RETRY_AFTER, |d| d.min(MAX_RETRY_AFTER))
}

/// Which bucket refused a call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Limited {
    /// "caller→target" or "tenant".
    pub bucket: String,
    /// The policy that set the limit, e.g. "capability/text.summarize".
    pub policy: String,
    pub retry_after: Duration,
}

/// Most caller → target buckets kept.
pub(crate) const MAX_PAIR_BUCKETS: usize = 10_000;

/// Every bucket of one sidecar.
#[derive(Default)]
pub(crate) struct RateLimits {
    pairs: Mutex<HashMap<(String, String), TokenBucket>>,
    tenant: Mutex<Option<TokenBucket>>,
}

impl RateLimits {
    /// Checks the tenant bucket (`tenant` = the tenant policy's limit and the number of
    /// sidecars sharing it) and the caller → target bucket.
    pub(crate) fn check(
        &self,
        now: Instant,
        tenant: Option<(RateLimit, u32)>,
        pair: Option<(RateLimit, &str, &str, &str)>,
    ) -> Result<(), Limited> {
        if let Some((limit, sidecars)) = tenant {
            let share = RateLimit {
                per_second: limit.per_second / f64::from(sidecars.max(1)),
                burst: limit.burst.div_ceil(sidecars.max(1)).max(1),
            };
            let mut bucket = self.tenant.lock().unwrap_or_else(|e| e.into_inner());
            let b = match bucket.as_mut() {
                Some(b) if b.limit == share => b,
                _ => bucket.insert(TokenBucket::new(share, now)),
            };
            b.try_take(now).map_err(|retry_after| Limited {
                bucket: "tenant".into(),
                policy: "tenant/default".into(),
                retry_after,
            })?;
        }
        if let Some((limit, caller, target, policy)) = pair {
            let mut pairs = self.pairs.lock().unwrap_or_else(|e| e.into_inner());
            let key = (caller.to_string(), target.to_string());
            if pairs.len() >= MAX_PAIR_BUCKETS && !pairs.contains_key(&key) {
                pairs.retain(|_, b| !b.is_full(now));
                if pairs.len() >= MAX_PAIR_BUCKETS
                    && let Some(k) = pairs.keys().next().cloned()
                {
                    pairs.remove(&k);
                }
            }
            let b = pairs.entry(key).or_insert_with(|| TokenBucket::new(limit, now));
            if b.limit != limit {
                *b = TokenBucket::new(limit, now);
            }
            b.try_take(now).map_err(|retry_after| Limited {
                bucket: format!("{}→{target}", if caller.is_empty() { "(anonymous)" } else { caller }),
                policy: policy.to_string(),
                retry_after,
            })?;
        }
        Ok(())
    }

    /// Caller → target buckets kept now (read by /metrics at scrape time).
    pub(crate) fn pair_buckets(&self) -> usize {
        self.pairs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Service: token buckets.
#[derive(Clone)]
pub(crate) struct RateLimited<S> {
    limits: Arc<RateLimits>,
    rejections: Arc<Rejections>,
    inner: S,
}

/// The layer of [`RateLimited`].
pub(crate) fn layer<S>(
    limits: Arc<RateLimits>,
    rejections: Arc<Rejections>,
) -> impl tower::Layer<S, Service = RateLimited<S>> + Clone {
    tower::layer::layer_fn(move |inner| RateLimited { limits: limits.clone(), rejections: rejections.clone(), inner })
}

impl<S> Service<OutboundCall> for RateLimited<S>
where
    S: Service<OutboundCall, Response = Routed, Error = SidecarError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Routed;
    type Error = SidecarError;
    type Future = BoxFuture<Result<Routed, SidecarError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SidecarError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: OutboundCall) -> Self::Future {
        let tenant = call
            .table
            .tenant_policy()
            .and_then(|p| p.spec.rate_limit)
            .map(|limit| (limit, u32::try_from(call.table.sidecar_count().max(1)).unwrap_or(u32::MAX)));
        // The target's bucket and policy are named only when it has a limit (most have none).
        let named = call
            .spec()
            .and_then(|s| s.rate_limit)
            .map(|limit| (limit, target_text(&call.target), policy_name(&call.target)));
        let pair = named
            .as_ref()
            .map(|(limit, target, policy)| (*limit, call.caller_agent(), target.as_str(), policy.as_str()));
        if (tenant.is_some() || pair.is_some())
            && let Err(limited) = self.limits.check(Instant::now(), tenant, pair)
        {
            let refused = SidecarError::RateLimited {
                bucket: limited.bucket,
                policy: limited.policy,
                retry_after: limited.retry_after,
            };
            return Rejections::refuse(&self.rejections.rate_limited, Err(refused));
        }
        Box::pin(self.inner.clone().oneshot(call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pair_buckets_stay_bounded_and_keep_the_ones_in_use() {
        let limits = RateLimits::default();
        let pairs = || limits.pairs.lock().unwrap().len();
        let slow = RateLimit { per_second: 0.01, burst: 1 };
        let fast = RateLimit { per_second: 1.0, burst: 1 };
        let start = Instant::now();
        for i in 0..MAX_PAIR_BUCKETS {
            limits.check(start, None, Some((fast, &format!("caller-{i}"), "t", "p"))).unwrap();
        }
        assert_eq!(pairs(), MAX_PAIR_BUCKETS);
        // Full, with no bucket refilled yet: one is dropped for the newcomer "hot", which
        // spends its token and refills only after 100 s.
        limits.check(start + Duration::from_millis(500), None, Some((slow, "hot", "t", "p"))).unwrap();
        assert_eq!(pairs(), MAX_PAIR_BUCKETS);
        // Two seconds on, every fast bucket has refilled and goes; the empty one stays.
        limits.check(start + Duration::from_secs(2), None, Some((fast, "newcomer", "t", "p"))).unwrap();
        assert!(pairs() <= 3, "{} buckets kept", pairs());
        let refused = limits.check(start + Duration::from_secs(2), None, Some((slow, "hot", "t", "p")));
        assert!(refused.is_err(), "the bucket in use was kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_100_per_second_burst_20_bucket_offered_1000_per_second() {
        let limits = RateLimits::default();
        let limit = RateLimit { per_second: 100.0, burst: 20 };
        let (mut accepted, mut rejected, mut other) = (0, 0, 0);
        let start = Instant::now();
        for i in 0..10_000u32 {
            let now = start + Duration::from_millis(u64::from(i));
            match limits.check(now, None, Some((limit, "planner", "capability x", "capability/x"))) {
                Ok(()) => accepted += 1,
                Err(l) => {
                    rejected += 1;
                    assert!(l.retry_after > Duration::ZERO && l.retry_after <= Duration::from_millis(10));
                    assert_eq!(l.policy, "capability/x");
                }
            }
            // A second caller at 1 call/s is never refused.
            if i % 1000 == 0 {
                limits.check(now, None, Some((limit, "auditor", "capability x", "capability/x"))).unwrap();
                other += 1;
            }
        }
        let expected = 1000 + 20;
        assert!((accepted as f64 - expected as f64).abs() <= expected as f64 * 0.01, "accepted {accepted}");
        assert_eq!(accepted + rejected, 10_000);
        assert_eq!(other, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tenant_rate_is_shared_among_its_sidecars() {
        let limits = RateLimits::default();
        let limit = RateLimit { per_second: 40.0, burst: 8 };
        let now = Instant::now();
        // Four sidecars: this one gets 10/s and a burst of 2.
        let ok = (0..10).filter(|_| limits.check(now, Some((limit, 4)), None).is_ok()).count();
        assert_eq!(ok, 2);
        let err = limits.check(now, Some((limit, 4)), None).unwrap_err();
        assert_eq!(err.bucket, "tenant");
        assert_eq!(err.retry_after, Duration::from_millis(100));
    }

    #[test]
    fn a_rate_of_1e_minus_30_does_not_panic() {
        let now = Instant::now();
        let mut b = TokenBucket::new(RateLimit { per_second: 1e-30, burst: 1 }, now);
        assert_eq!(b.try_take(now), Ok(()));
        assert_eq!(b.try_take(now), Err(MAX_RETRY_AFTER));
    }

    #[test]
    fn retry_after_is_total() {
        assert_eq!(retry_after(1.0, 0.0), MAX_RETRY_AFTER);
        assert_eq!(retry_after(1.0, f64::NAN), MAX_RETRY_AFTER);
        assert_eq!(retry_after(1.0, -1.0), MAX_RETRY_AFTER);
        assert_eq!(retry_after(1.0, 1e-300), MAX_RETRY_AFTER);
        assert_eq!(retry_after(1.0, 4.0), Duration::from_millis(250));
    }

    proptest::proptest! {
        /// Whatever limit reaches the sidecar (validated or not), taking tokens never
        /// panics and never advertises a wait past the cap.
        #[test]
        fn any_limit_never_panics(
            per_second in proptest::prelude::any::<f64>(),
            burst in proptest::prelude::any::<u32>(),
            sidecars in proptest::prelude::any::<u32>(),
            steps in proptest::collection::vec(0u64..10_000_000_000, 1..20),
        ) {
            let limits = RateLimits::default();
            let limit = RateLimit { per_second, burst };
            let start = Instant::now();
            let mut at = Duration::ZERO;
            for step in steps {
                at += Duration::from_nanos(step);
                if let Err(l) = limits.check(start + at, Some((limit, sidecars)), Some((limit, "a", "b", "p"))) {
                    proptest::prop_assert!(l.retry_after <= MAX_RETRY_AFTER);
                }
            }
        }
    }
}
