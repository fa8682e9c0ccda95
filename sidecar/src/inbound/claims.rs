//! Claims of idempotency keys with the control service (`agentreach.v1.Idempotency`), so a
//! keyed call runs once per (tenant, target agent, key) within the window across every
//! instance and sidecar of the tenant, not just within this sidecar.
//!
//! The idempotency layer asks here after its local check found no answer and no call of
//! the key in flight on this sidecar (so duplicates on one sidecar cost one claim between
//! them). [`run`]: the claim comes back
//! - CLAIMED: the call is delivered, and its outcome settled with control before the answer
//!   goes back: a reply with status OK is stored (up to the reply bound; above it the key is
//!   marked too large and its duplicates are refused with `IDEMPOTENT_REPLY_NOT_STORED`); an
//!   error status from the agent, a call never delivered, or an instance that failed under
//!   the call (its connection lost) frees the key, so a retry runs (as error answers always
//!   did; durable tasks rely on it to run a dead instance's work again); a call cut off by
//!   its deadline, cancelled by its caller (dropped mid-way) or whose answer could not be
//!   read marks the key abandoned: it may have run, so duplicates are refused, never run;
//! - DONE: the stored reply answers (and is kept locally for later duplicates);
//! - RUNNING: another instance's call holds it; this call polls (25 ms doubling to 250 ms)
//!   until it is settled or the call's deadline passes (DEADLINE_EXCEEDED, not delivered);
//! - TOO_LARGE / ABANDONED: refused with `IDEMPOTENT_REPLY_NOT_STORED`;
//! - KEY_REUSED: the key's first call asked something else (the claim carries the call's
//!   payload digest, kept in the record): refused with `IDEMPOTENCY_KEY_REUSED`, in any
//!   state of the first call. A record without a digest (written before digests) accepts
//!   any payload.
//!
//! Control unreachable (or its store): the call is refused as not delivered with
//! `CONTROL_UNAVAILABLE` (fail closed): running it without a claim could run it twice; the
//! caller's sidecar may retry it on another instance, whose sidecar may reach control.
//! Calls without a key never ask control.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent_reach::proto;
use agent_reach::proto::idempotency_client::IdempotencyClient;
use agent_reach::reason::{self, Reason};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::call::PayloadDigest;
use crate::control::{Failover, Rules};
use crate::grpc::{StoredResponse, header};

/// The first and the longest pause between two reads of a running claim.
const POLL_FIRST: Duration = Duration::from_millis(25);
const POLL_MAX: Duration = Duration::from_millis(250);
/// A settle that failed is tried again this often, for this long.
const SETTLE_RETRY: Duration = Duration::from_millis(500);
const SETTLE_RETRIES_FOR: Duration = Duration::from_secs(120);

/// Counters of the claims (read by tests).
#[derive(Debug, Default)]
pub struct ClaimStats {
    /// Claims won (calls delivered under a claim).
    pub claimed: AtomicU64,
    /// Duplicates answered from a reply stored with control.
    pub replayed: AtomicU64,
    /// Reads of a claim another call held.
    pub polls: AtomicU64,
    /// Keyed calls refused because control could not be asked.
    pub unavailable: AtomicU64,
}

/// What control said about a key.
#[derive(Debug)]
pub(crate) enum Remote {
    /// This call holds the claim at this revision.
    Claimed(i64),
    /// Another call holds it (the owning instance).
    Running(String),
    Done(StoredResponse),
    TooLarge,
    Abandoned,
    /// The key's first call asked something else.
    KeyReused,
}

/// The clients of control's Idempotency service.
pub struct Claims {
    tenant: String,
    control: Failover<IdempotencyClient<Channel>>,
    window_ms: u64,
    /// The largest reply stored; above it the key is marked too large.
    max_reply_bytes: usize,
    stats: ClaimStats,
}

impl Claims {
    /// Clients of every control endpoint on `channels` (nothing dialled until used).
    pub(crate) fn new(
        tenant: String,
        channels: Vec<(String, Channel)>,
        timeout: Duration,
        window: Duration,
        max_reply_bytes: usize,
    ) -> Result<Arc<Claims>, String> {
        let endpoints = channels.into_iter().map(|(uri, c)| (uri, IdempotencyClient::new(c))).collect();
        Ok(Arc::new(Claims {
            tenant,
            control: Failover::new(endpoints, timeout, Rules::Agent)?,
            window_ms: window.as_millis() as u64,
            max_reply_bytes,
            stats: ClaimStats::default(),
        }))
    }

    pub fn stats(&self) -> &ClaimStats {
        &self.stats
    }

    /// Calls control ([`Failover`]); no replica reachable (or none with its store) is
    /// CONTROL_UNAVAILABLE, naming the idempotency mechanism.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(IdempotencyClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.control.call(f).await.map_err(|status| {
            let unreachable = status.code() == Code::Unavailable
                && reason::error_info(&status).is_none_or(|i| i.reason == Reason::ControlUnavailable.as_str());
            if !unreachable {
                return status;
            }
            reason::status(
                Reason::ControlUnavailable,
                format!(
                    "cannot claim the idempotency key with control ({}); the call is not run without a claim",
                    status.message()
                ),
                &[("mechanism", "idempotency".into())],
            )
        })
    }

    /// Claims `key` of `agent` for `instance` (its record on `lease`), for a call asking
    /// `digest`.
    pub(crate) async fn claim(
        &self,
        agent: &str,
        key: &str,
        lease: i64,
        instance: &str,
        digest: Option<PayloadDigest>,
    ) -> Result<Remote, Status> {
        let request = proto::ClaimKeyRequest {
            tenant: self.tenant.clone(),
            agent: agent.to_string(),
            key: key.to_string(),
            lease_id: lease,
            window_ms: self.window_ms,
            instance_id: instance.to_string(),
            payload_digest: digest_bytes(digest),
        };
        let reply = self.call(|mut c| {
            let r = request.clone();
            async move { c.claim_key(r).await }
        });
        let reply = reply.await?;
        Ok(match proto::ClaimState::try_from(reply.state).unwrap_or(proto::ClaimState::Unspecified) {
            proto::ClaimState::Claimed => Remote::Claimed(reply.claim_revision),
            proto::ClaimState::Running => Remote::Running(reply.owner_instance),
            proto::ClaimState::Done => {
                let mut stored = from_proto(reply.reply.unwrap_or_default());
                // A reply stored before answers named their owner: the claim's.
                if !stored.headers.contains_key(header::IDEMPOTENCY_OWNER) {
                    name_owner(&mut stored, &reply.owner_instance);
                }
                Remote::Done(stored)
            }
            proto::ClaimState::TooLarge => Remote::TooLarge,
            proto::ClaimState::Abandoned => Remote::Abandoned,
            proto::ClaimState::KeyReused => Remote::KeyReused,
            proto::ClaimState::Unspecified => {
                return Err(reason::status(Reason::Internal, "control answered a claim without a state", &[]));
            }
        })
    }

    /// Settles the claim `id`.
    async fn settle(
        &self,
        id: &ClaimId,
        outcome: proto::SettleOutcome,
        reply: Option<proto::StoredReply>,
    ) -> Result<bool, Status> {
        let request = proto::SettleKeyRequest {
            tenant: self.tenant.clone(),
            agent: id.agent.clone(),
            key: id.key.clone(),
            claim_revision: id.revision,
            outcome: outcome as i32,
            reply,
            window_ms: self.window_ms,
            instance_id: id.instance.clone(),
            payload_digest: digest_bytes(id.digest),
        };
        let reply = self.call(|mut c| {
            let r = request.clone();
            async move { c.settle_key(r).await }
        });
        Ok(reply.await?.settled)
    }
}

/// Which claim: the key of an agent, the instance running its call, and the claim's
/// revision.
#[derive(Clone)]
struct ClaimId {
    agent: String,
    key: String,
    instance: String,
    revision: i64,
    digest: Option<PayloadDigest>,
}

/// A digest as `ClaimKeyRequest` carries it (empty: none).
fn digest_bytes(digest: Option<PayloadDigest>) -> bytes::Bytes {
    digest.map(|d| bytes::Bytes::copy_from_slice(&d)).unwrap_or_default()
}

/// A held claim: settled explicitly, or marked abandoned when dropped (the call was
/// cancelled after it may have reached its agent).
pub(crate) struct Held {
    claims: Arc<Claims>,
    id: ClaimId,
    armed: bool,
}

impl Held {
    fn new(claims: Arc<Claims>, id: ClaimId) -> Held {
        claims.stats.claimed.fetch_add(1, Ordering::Relaxed);
        Held { claims, id, armed: true }
    }

    /// Settles with the outcome of the answer read (`None`: the answer could not be read).
    pub(crate) async fn answered(self, stored: Option<&StoredResponse>) {
        let (outcome, reply) = match stored {
            None => (proto::SettleOutcome::Abandoned, None),
            Some(s) if s.status_code() != Some(Code::Ok) => (proto::SettleOutcome::Failed, None),
            Some(s) if s.size() > self.claims.max_reply_bytes => (proto::SettleOutcome::TooLarge, None),
            Some(s) => (proto::SettleOutcome::Answered, Some(to_proto(s))),
        };
        self.settle(outcome, reply).await
    }

    /// Frees the key: the call failed or was never delivered.
    pub(crate) async fn failed(self) {
        self.settle(proto::SettleOutcome::Failed, None).await
    }

    async fn settle(mut self, outcome: proto::SettleOutcome, reply: Option<proto::StoredReply>) {
        let r = self.claims.settle(&self.id, outcome, reply.clone()).await;
        // Disarmed once control has it; if the caller goes away meanwhile, the drop marks
        // the claim abandoned (a no-op when this settle landed first).
        self.armed = false;
        if let Err(status) = r {
            // Control or its store is away: the claim stays RUNNING (duplicates wait) until
            // a later try lands, or this sidecar's lease ends.
            tracing::warn!(key = %self.id.key, agent = %self.id.agent, "settling an idempotency claim failed: {status}");
            tokio::spawn(keep_settling(self.claims.clone(), self.id.clone(), outcome, reply));
        }
    }
}

/// Settles a claim, trying again every [`SETTLE_RETRY`] while control does not take it.
async fn keep_settling(
    claims: Arc<Claims>,
    id: ClaimId,
    outcome: proto::SettleOutcome,
    reply: Option<proto::StoredReply>,
) {
    let (key, agent) = (&id.key, &id.agent);
    let give_up = Instant::now() + SETTLE_RETRIES_FOR;
    while Instant::now() < give_up {
        match claims.settle(&id, outcome, reply.clone()).await {
            Ok(_) => return,
            Err(status) if matches!(status.code(), Code::Unavailable | Code::NotFound | Code::DeadlineExceeded) => {
                tracing::debug!(%key, %agent, "settling an idempotency claim: {status}")
            }
            Err(status) => {
                tracing::warn!(%key, %agent, "control refused to settle an idempotency claim: {status}");
                return;
            }
        }
        tokio::time::sleep(SETTLE_RETRY).await;
    }
    tracing::warn!(%key, %agent, "gave up settling an idempotency claim; it ends with this sidecar's lease");
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(keep_settling(self.claims.clone(), self.id.clone(), proto::SettleOutcome::Abandoned, None));
        }
    }
}

/// How [`claim_or_wait`] ended when this call does not run.
pub(crate) enum Settled {
    Replay(StoredResponse),
    TooLarge,
    Abandoned,
    /// The key's first call asked something else.
    KeyReused,
    /// The deadline passed while another call held the claim.
    Deadline(String),
    /// Control could not be asked, or refused.
    Refused(Status),
}

/// Claims `key`, waiting while another call holds it: `Ok` with the held claim when this
/// call is to run, else how the key was settled.
pub(crate) async fn claim_or_wait(
    claims: &Arc<Claims>,
    agent: &str,
    key: &str,
    lease: i64,
    instance: &str,
    digest: Option<PayloadDigest>,
    deadline: Option<Instant>,
) -> Result<Held, Settled> {
    let mut pause = POLL_FIRST;
    loop {
        match claims.claim(agent, key, lease, instance, digest).await {
            Ok(Remote::Claimed(revision)) => {
                let id = ClaimId { agent: agent.into(), key: key.into(), instance: instance.into(), revision, digest };
                return Ok(Held::new(claims.clone(), id));
            }
            Ok(Remote::Done(stored)) => {
                claims.stats.replayed.fetch_add(1, Ordering::Relaxed);
                return Err(Settled::Replay(stored));
            }
            Ok(Remote::TooLarge) => return Err(Settled::TooLarge),
            Ok(Remote::Abandoned) => return Err(Settled::Abandoned),
            Ok(Remote::KeyReused) => return Err(Settled::KeyReused),
            Ok(Remote::Running(owner)) => {
                claims.stats.polls.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                if deadline.is_some_and(|d| now + pause >= d) {
                    return Err(Settled::Deadline(format!(
                        "a call with this idempotency key is still running on {owner}; the deadline passed while \
                         waiting for its answer"
                    )));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(POLL_MAX);
            }
            Err(status) => {
                if reason::error_info(&status).is_some_and(|i| i.reason == Reason::ControlUnavailable.as_str()) {
                    claims.stats.unavailable.fetch_add(1, Ordering::Relaxed);
                }
                return Err(Settled::Refused(status));
            }
        }
    }
}

fn headers_to_proto(h: &HeaderMap) -> Vec<proto::ReplyHeader> {
    h.iter()
        .map(|(name, value)| proto::ReplyHeader {
            name: name.as_str().to_string(),
            value: bytes::Bytes::copy_from_slice(value.as_bytes()),
        })
        .collect()
}

fn headers_from_proto(h: Vec<proto::ReplyHeader>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for header in h {
        // Written by a sidecar from a valid map; anything else is skipped.
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(header.name.as_bytes()), HeaderValue::from_bytes(&header.value))
        {
            map.append(name, value);
        }
    }
    map
}

/// Names `owner`, the instance that ran the key's call, in the answer (kept with it, so
/// replays anywhere name it too).
pub(crate) fn name_owner(stored: &mut StoredResponse, owner: &str) {
    if let Ok(v) = HeaderValue::from_str(owner) {
        stored.headers.insert(header::IDEMPOTENCY_OWNER, v);
    }
}

/// The stored form of an answer.
pub(crate) fn to_proto(s: &StoredResponse) -> proto::StoredReply {
    proto::StoredReply {
        headers: headers_to_proto(&s.headers),
        data: s.data.clone(),
        trailers: s.trailers.as_ref().map(headers_to_proto).unwrap_or_default(),
    }
}

/// An answer from its stored form.
pub(crate) fn from_proto(r: proto::StoredReply) -> StoredResponse {
    let trailers = if r.trailers.is_empty() { None } else { Some(headers_from_proto(r.trailers)) };
    StoredResponse { headers: headers_from_proto(r.headers), data: r.data, trailers }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_survives_its_stored_form() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.append("ar-instance", HeaderValue::from_static("a-1"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let s =
            StoredResponse { headers, data: bytes::Bytes::from_static(b"\0\0\0\0\x02hi"), trailers: Some(trailers) };
        let back = from_proto(to_proto(&s));
        assert_eq!(back.headers, s.headers);
        assert_eq!(back.data, s.data);
        assert_eq!(back.trailers, s.trailers);
        assert_eq!(back.status_code(), Some(Code::Ok));
    }
}
