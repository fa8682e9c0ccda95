//! The idempotency layer of the inbound stack: a call with an idempotency key is answered
//! as the key's first call left it, from this sidecar's [`Store`] first, then by the key's
//! claim with control ([`super::claims`]); only the call that holds the claim reaches the
//! agent. A call asking something else than the key's first call (another payload digest)
//! is refused with IDEMPOTENCY_KEY_REUSED, never run. Every answer of a keyed call names
//! the instance that ran the key's call in `ar-idempotency-owner`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::Service;

use super::claims::{self, Claims, Settled, name_owner};
use super::idempotency::{Claim, Completion, Outcome, Store, wait};
use crate::call::{Attempt, BoxFuture, InboundCall, Shape, boxed};
use crate::error::DeliveryError;
use crate::grpc::StoredResponse;
use crate::telemetry::Rejections;

/// Service: replays answers of calls whose idempotency key was already answered, and
/// makes in-flight duplicates wait for the first.
#[derive(Clone)]
pub(crate) struct Idempotent<S> {
    /// Shared: a clone of the layer is one reference count.
    state: Arc<State>,
    inner: S,
}

struct State {
    store: Arc<Store>,
    /// Claims with control (`None`: this sidecar's memory only).
    claims: Option<Arc<Claims>>,
    rejections: Arc<Rejections>,
    /// The largest answer read.
    limit: usize,
}

/// The layer of [`Idempotent`]: the store of keys seen, the claims with control, where
/// replays and refusals are counted, and the largest answer read.
pub(crate) fn layer<S>(
    store: Arc<Store>,
    claims: Option<Arc<Claims>>,
    rejections: Arc<Rejections>,
    limit: usize,
) -> impl tower::Layer<S, Service = Idempotent<S>> + Clone {
    let state = Arc::new(State { store, claims, rejections, limit });
    tower::layer::layer_fn(move |inner| Idempotent { state: state.clone(), inner })
}

impl<S> Service<InboundCall> for Idempotent<S>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible, Future = BoxFuture<Result<Attempt, Infallible>>>
        + Clone
        + Send
        + 'static,
{
    type Response = Attempt;
    type Error = Infallible;
    type Future = BoxFuture<Result<Attempt, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: InboundCall) -> Self::Future {
        let key = match (&call.idempotency_key, call.shape) {
            (Some(k), Shape::Unary) if !k.is_empty() => k.clone(),
            // No key: the inner layer's own future is the answer (it is ready, `poll_ready`
            // above).
            _ => return self.inner.call(call),
        };
        let digest = call.payload_digest;
        // The readied inner layer goes with the call (it runs only if no answer is stored);
        // a clone stays for the next call's `poll_ready`.
        let fresh = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, fresh);
        let state = self.state.clone();
        boxed!(async move {
            let State { store, claims, rejections, limit } = &*state;
            let replay = |outcome: Outcome| match outcome {
                Outcome::Answer(a) => {
                    Rejections::count(&rejections.idempotency_replays);
                    Some(Ok(Attempt::Answered(a.to_response(), None)))
                }
                Outcome::TooLarge => {
                    Rejections::count(&rejections.idempotency_refused);
                    Some(Ok(Attempt::Failed(DeliveryError::ReplyNotStored)))
                }
                Outcome::KeyReused => Some(Ok(reused(rejections, &key))),
                Outcome::Abandoned => None,
            };
            let mut call = Some(call);
            loop {
                let scope = call.as_ref().map(|c| (&*c.tenant, c.local.registration.agent.as_str()));
                match store.claim(scope.map_or("", |s| s.0), scope.map_or("", |s| s.1), &key, digest) {
                    Claim::Reused => return Ok(reused(rejections, &key)),
                    Claim::Done(outcome) => {
                        if let Some(r) = replay(outcome) {
                            return r;
                        }
                    }
                    Claim::Wait(rx) => {
                        if let Some(r) = replay(wait(rx).await) {
                            return r;
                        }
                    }
                    Claim::First(done) => {
                        let Some(call) = call.take() else { continue };
                        return match claims {
                            Some(claims) => run_claimed(claims, service, call, done, &key, *limit, rejections).await,
                            None => run_first(service, call, done, *limit).await,
                        };
                    }
                }
            }
        })
    }
}

/// Runs the first call of a key seen by this sidecar (no claim with control).
async fn run_first<S>(mut service: S, call: InboundCall, done: Completion, limit: usize) -> Result<Attempt, Infallible>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible> + Send,
    S::Future: Send,
{
    let owner = call.local.instance_id.clone();
    // Readied before this call was taken (`Idempotent::poll_ready`).
    match service.call(call).await {
        Ok(Attempt::Answered(resp, permit)) => {
            let stored = StoredResponse::collect(resp, limit).await;
            drop(permit);
            match stored {
                Ok(mut stored) => {
                    name_owner(&mut stored, &owner);
                    let resp = stored.to_response();
                    done.finish(stored);
                    Ok(Attempt::Answered(resp, None))
                }
                Err(e) => {
                    Ok(Attempt::Failed(DeliveryError::Unavailable(format!("reading the agent's answer failed: {e}"))))
                }
            }
        }
        other => other,
    }
}

/// Runs the first call of a key on this sidecar under a claim with control, or answers it
/// as the key's claim says (see [`super::claims`]).
async fn run_claimed<S>(
    claims: &Arc<Claims>,
    mut service: S,
    call: InboundCall,
    done: Completion,
    key: &str,
    limit: usize,
    rejections: &Rejections,
) -> Result<Attempt, Infallible>
where
    S: Service<InboundCall, Response = Attempt, Error = Infallible> + Send,
    S::Future: Send,
{
    let deadline = call.remaining.map(|r| Instant::now() + r);
    let (agent, instance) = (call.local.registration.agent.clone(), call.local.instance_id.clone());
    let (lease, digest) = (call.local.lease_id(), call.payload_digest);
    let held = match claims::claim_or_wait(claims, &agent, key, lease, &instance, digest, deadline).await {
        Ok(held) => held,
        Err(Settled::Replay(stored)) => {
            Rejections::count(&rejections.idempotency_replays);
            let resp = stored.to_response();
            done.finish(stored);
            return Ok(Attempt::Answered(resp, None));
        }
        Err(Settled::TooLarge) => {
            Rejections::count(&rejections.idempotency_refused);
            done.too_large();
            return Ok(Attempt::Failed(DeliveryError::ReplyNotStored));
        }
        Err(Settled::Abandoned) => {
            Rejections::count(&rejections.idempotency_refused);
            return Ok(Attempt::Failed(DeliveryError::ClaimAbandoned));
        }
        Err(Settled::KeyReused) => {
            done.reused();
            return Ok(reused(rejections, key));
        }
        Err(Settled::Deadline(why)) => return Ok(Attempt::NotDelivered(DeliveryError::DeadlineExceeded(why))),
        Err(Settled::Refused(status)) => return Ok(Attempt::NotDelivered(DeliveryError::Remote(status))),
    };
    // Readied before this call was taken (`Idempotent::poll_ready`).
    match service.call(call).await {
        Ok(Attempt::Answered(resp, permit)) => {
            let stored = StoredResponse::collect(resp, limit).await;
            drop(permit);
            match stored {
                Ok(mut stored) => {
                    name_owner(&mut stored, &instance);
                    held.answered(Some(&stored)).await;
                    let resp = stored.to_response();
                    done.finish(stored);
                    Ok(Attempt::Answered(resp, None))
                }
                Err(e) => {
                    // It may have run and its answer is lost: never run again.
                    held.answered(None).await;
                    Ok(Attempt::Failed(DeliveryError::Unavailable(format!("reading the agent's answer failed: {e}"))))
                }
            }
        }
        Ok(Attempt::Failed(e)) if matches!(e.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) => {
            // Cut off by its deadline after it may have run: like a cancelled call, never
            // run again within the window.
            held.answered(None).await;
            Ok(Attempt::Failed(e))
        }
        other => {
            // Never delivered, or its instance failed under it (an error status is settled
            // above): the key is freed and a retry runs.
            held.failed().await;
            other
        }
    }
}

/// IDEMPOTENCY_KEY_REUSED for a call of `key` asking something else than its first call.
fn reused(rejections: &Rejections, key: &str) -> Attempt {
    Rejections::count(&rejections.idempotency_refused);
    Attempt::Failed(DeliveryError::KeyReused { key_prefix: key_prefix(key) })
}

/// The first 16 characters of a key, as refusals name it (a key may be long, or secret).
pub(crate) fn key_prefix(key: &str) -> String {
    key.chars().take(16).collect()
}
