//! The `agentreach.v1.Idempotency` gRPC service: claims of idempotency keys in the store,
//! so a keyed call runs once per (tenant, target agent, key) within its window whichever
//! instance and sidecar its duplicates reach.
//!
//! A key lives at `/agent-reach/v1/idempotency/{tenant}/{agent}/{sha256(key)}` (outside the
//! tenant's routing prefix, so no watch or snapshot carries it). `ClaimKey` creates it with
//! a transaction that succeeds only when the key does not exist (one store round trip for a
//! first call); otherwise it reads what is there (a second round trip). A running claim is
//! on the lease of the claiming instance's sidecar, so a sidecar that dies mid-call frees
//! the key when its lease expires (the call's agent died with it or was cut off; the
//! caller's retry may run it again). `SettleKey` replaces the claim, compared on the claim's
//! revision, with the answer (kept for the window), a too-large marker, an abandoned marker
//! (both kept for the window: the call may have run, so it is never run again), or deletes
//! it after a failure. Answered keys sit on one shared lease per window length and time
//! bucket ([`WindowLeases`]), not a lease per key; a key therefore lives between the window
//! and the window plus one bucket (a sixteenth of the window, at least a second).
//!
//! With mutual TLS the request's tenant must be the calling sidecar's, and the lease named
//! must be its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::{validate_name, validate_tenant};
use agent_reach::proto;
use agent_reach::proto::idempotency_server::Idempotency;
use agent_reach::reason::{self, Reason};
use agent_reach_store::{Compare, LeaseId, Op, Store, StoreError, Txn};
use base64::Engine;
use bytes::Bytes;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::error::ControlError;
use crate::identity::{Authorizer, authz, request_peer};
use crate::keys;

/// The window when a request names none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);
/// The longest window a request may name.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The largest reply kept in the store (encoded); a larger one is recorded as too large.
/// etcd refuses requests over 1.5 MiB by default, and the reply is base64 inside a record.
pub const MAX_STORED_REPLY_BYTES: usize = 768 * 1024;
/// Longest idempotency key (as the sidecar's own limit).
pub const MAX_KEY_LEN: usize = agent_reach::model::MAX_IDEMPOTENCY_KEY_LEN;

/// What a key holds in the store (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub state: RecordState,
    /// The instance that claimed the key.
    pub owner: String,
    /// With `Done`: the encoded `StoredReply`, base64.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reply: String,
    /// The first call's payload digest, hex ("" in records written before digests, or from
    /// a sidecar that sent none: any payload is then accepted).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
}

/// The hex form of a payload digest kept in a record.
fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a call with `digest` asks something else than the record's first call (both
/// known and different).
fn reused(record: &Record, digest: &str) -> bool {
    !digest.is_empty() && !record.digest.is_empty() && record.digest != digest
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    Running,
    Done,
    TooLarge,
    Abandoned,
}

/// One shared lease per window length, replaced every bucket.
#[derive(Default)]
pub struct WindowLeases {
    leases: Mutex<HashMap<u64, (LeaseId, Instant)>>,
}

/// The bucket of a window: how long one lease takes new keys.
pub fn bucket(window: Duration) -> Duration {
    (window / 16).max(Duration::from_secs(1))
}

impl WindowLeases {
    /// A lease that outlives `window` from now.
    async fn lease(&self, store: &Arc<dyn Store>, window: Duration) -> Result<LeaseId, StoreError> {
        let ms = window.as_millis() as u64;
        let bucket = bucket(window);
        if let Some((id, granted)) = self.leases.lock().unwrap_or_else(|e| e.into_inner()).get(&ms)
            && granted.elapsed() < bucket
        {
            return Ok(*id);
        }
        // Leases count whole seconds: round up, plus the bucket this lease takes keys for.
        let ttl = Duration::from_secs(window.as_secs() + 1) + bucket;
        let grant = store.grant_lease(ttl).await?;
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).insert(ms, (grant.id, Instant::now()));
        Ok(grant.id)
    }

    /// Forgets a lease the store no longer knows.
    fn forget(&self, lease: LeaseId) {
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, (id, _)| *id != lease);
    }
}

/// The store key of `key` of `agent` in `tenant`.
pub fn claim_key(tenant: &str, agent: &str, key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    format!("{}{tenant}/{agent}/{}", keys::IDEMPOTENCY_ROOT, hex(digest.as_ref()))
}

/// The Idempotency service.
pub struct IdempotencyService {
    store: Arc<dyn Store>,
    authz: Arc<Authorizer>,
    owners: authz::LeaseOwners,
    windows: WindowLeases,
}

fn window(ms: u64) -> Result<Duration, Status> {
    match ms {
        0 => Ok(DEFAULT_WINDOW),
        ms if Duration::from_millis(ms) > MAX_WINDOW => {
            Err(reason::invalid_argument("window_ms", &format!("at most {} ms", MAX_WINDOW.as_millis())))
        }
        ms => Ok(Duration::from_millis(ms).max(Duration::from_secs(1))),
    }
}

fn store_status(e: StoreError) -> Status {
    ControlError::Store(e).into()
}

impl IdempotencyService {
    pub fn new(store: Arc<dyn Store>, authz: Arc<Authorizer>) -> IdempotencyService {
        let owners = authz::LeaseOwners::new(store.clone());
        IdempotencyService { store, authz, owners, windows: WindowLeases::default() }
    }

    /// Checks the names and, with mutual TLS, the tenant and lease against the caller's
    /// certificate; returns the store key.
    async fn check<T>(
        &self,
        request: &Request<T>,
        tenant: &str,
        agent: &str,
        key: &str,
        lease: LeaseId,
    ) -> Result<String, Status> {
        validate_tenant("tenant", tenant).map_err(|f| reason::invalid_argument(&f.field, &f.reason))?;
        validate_name("agent", agent).map_err(|f| reason::invalid_argument(&f.field, &f.reason))?;
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(reason::invalid_argument("key", &format!("1 to {MAX_KEY_LEN} bytes")));
        }
        if let Some(owner) = self.authz.sidecar(request_peer(request), tenant, None)? {
            self.owners.check(lease, &owner).await?;
        }
        Ok(claim_key(tenant, agent, key))
    }

    /// Claims `key` for a call whose payload digest is `digest` (empty: not compared; see
    /// the module documentation).
    pub async fn claim(
        &self,
        key: &str,
        lease: LeaseId,
        window: Duration,
        owner: &str,
        digest: &[u8],
    ) -> Result<proto::ClaimKeyReply, Status> {
        let digest = hex(digest);
        let running = Record {
            state: RecordState::Running,
            owner: owner.to_string(),
            reply: String::new(),
            digest: digest.clone(),
        };
        let value = Bytes::from(serde_json::to_vec(&running).map_err(|e| Status::internal(e.to_string()))?);
        // A key deleted between the failed create and the read is tried once more.
        for _ in 0..3 {
            let lease = match lease {
                0 => self.windows.lease(&self.store, window).await.map_err(store_status)?,
                l => l,
            };
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.to_string(), 0)],
                success: vec![Op::Put { key: key.to_string(), value: value.clone(), lease: Some(lease) }],
                failure: vec![],
            };
            let result = self.store.txn(txn).await.map_err(store_status)?;
            if result.succeeded {
                return Ok(proto::ClaimKeyReply {
                    state: proto::ClaimState::Claimed as i32,
                    claim_revision: result.revision,
                    reply: None,
                    owner_instance: owner.to_string(),
                });
            }
            let Some(kv) = self.store.get(key).await.map_err(store_status)? else { continue };
            let record: Record = serde_json::from_slice(&kv.value)
                .map_err(|e| reason::status(Reason::Internal, format!("idempotency record {key}: {e}"), &[]))?;
            let (state, reply) = match record.state {
                // Whatever the first call's state, a call asking something else is refused.
                _ if reused(&record, &digest) => (proto::ClaimState::KeyReused, None),
                RecordState::Running => (proto::ClaimState::Running, None),
                RecordState::TooLarge => (proto::ClaimState::TooLarge, None),
                RecordState::Abandoned => (proto::ClaimState::Abandoned, None),
                RecordState::Done => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(record.reply.as_bytes())
                        .map_err(|e| reason::status(Reason::Internal, format!("idempotency record {key}: {e}"), &[]))?;
                    let reply = proto::StoredReply::decode(raw.as_slice())
                        .map_err(|e| reason::status(Reason::Internal, format!("idempotency record {key}: {e}"), &[]))?;
                    (proto::ClaimState::Done, Some(reply))
                }
            };
            return Ok(proto::ClaimKeyReply {
                state: state as i32,
                claim_revision: 0,
                reply,
                owner_instance: record.owner,
            });
        }
        Err(reason::status(Reason::Conflict, format!("idempotency key {key} keeps changing"), &[]))
    }

    /// Settles the claim at `revision` of `key`, run by `owner` for a call whose payload
    /// digest is `digest` (kept in the record), in one store transaction; false when it is
    /// no longer that claim.
    #[allow(clippy::too_many_arguments)]
    pub async fn settle(
        &self,
        key: &str,
        revision: i64,
        owner: &str,
        digest: &[u8],
        outcome: proto::SettleOutcome,
        reply: Option<proto::StoredReply>,
        window: Duration,
    ) -> Result<bool, Status> {
        let digest = hex(digest);
        let record = |state| Record { state, owner: owner.to_string(), reply: String::new(), digest: digest.clone() };
        let put = match outcome {
            proto::SettleOutcome::Failed => None,
            proto::SettleOutcome::Answered => {
                let reply = reply.ok_or_else(|| reason::invalid_argument("reply", "required with ANSWERED"))?;
                let encoded = reply.encode_to_vec();
                if encoded.len() > MAX_STORED_REPLY_BYTES {
                    Some(record(RecordState::TooLarge))
                } else {
                    Some(Record {
                        reply: base64::engine::general_purpose::STANDARD.encode(encoded),
                        ..record(RecordState::Done)
                    })
                }
            }
            proto::SettleOutcome::TooLarge => Some(record(RecordState::TooLarge)),
            proto::SettleOutcome::Abandoned => Some(record(RecordState::Abandoned)),
            proto::SettleOutcome::Unspecified => return Err(reason::invalid_argument("outcome", "required")),
        };
        let op = match put {
            None => Op::Delete { key: key.to_string() },
            Some(record) => {
                let value = Bytes::from(serde_json::to_vec(&record).map_err(|e| Status::internal(e.to_string()))?);
                let lease = self.windows.lease(&self.store, window).await.map_err(store_status)?;
                Op::Put { key: key.to_string(), value, lease: Some(lease) }
            }
        };
        let txn =
            Txn { compares: vec![Compare::ModRevision(key.to_string(), revision)], success: vec![op], failure: vec![] };
        match self.store.txn(txn).await {
            Ok(r) => Ok(r.succeeded),
            Err(StoreError::LeaseNotFound(l)) => {
                // The shared lease expired early (e.g. etcd restored without it): next time a new one.
                self.windows.forget(l);
                Err(store_status(StoreError::LeaseNotFound(l)))
            }
            Err(e) => Err(store_status(e)),
        }
    }
}

#[tonic::async_trait]
impl Idempotency for IdempotencyService {
    async fn claim_key(
        &self,
        request: Request<proto::ClaimKeyRequest>,
    ) -> Result<Response<proto::ClaimKeyReply>, Status> {
        let r = request.get_ref();
        let key = self.check(&request, &r.tenant, &r.agent, &r.key, r.lease_id).await?;
        let window = window(r.window_ms)?;
        Ok(Response::new(self.claim(&key, r.lease_id, window, &r.instance_id, &r.payload_digest).await?))
    }

    async fn settle_key(
        &self,
        request: Request<proto::SettleKeyRequest>,
    ) -> Result<Response<proto::SettleKeyReply>, Status> {
        let key = {
            let r = request.get_ref();
            self.check(&request, &r.tenant, &r.agent, &r.key, 0).await?
        };
        let r = request.into_inner();
        let window = window(r.window_ms)?;
        let outcome = proto::SettleOutcome::try_from(r.outcome).unwrap_or(proto::SettleOutcome::Unspecified);
        let settled =
            self.settle(&key, r.claim_revision, &r.instance_id, &r.payload_digest, outcome, r.reply, window).await?;
        Ok(Response::new(proto::SettleKeyReply { settled }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Mtls;
    use crate::stats::ControlStats;
    use agent_reach_store::{EmbeddedOptions, EmbeddedStore};

    fn service() -> IdempotencyService {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new(EmbeddedOptions::default()));
        IdempotencyService::new(store, Arc::new(Authorizer::new(Mtls::Off, Arc::new(ControlStats::default()))))
    }

    fn reply(text: &str) -> proto::StoredReply {
        proto::StoredReply {
            headers: vec![proto::ReplyHeader {
                name: "content-type".into(),
                value: Bytes::from_static(b"application/grpc"),
            }],
            data: Bytes::from(text.to_string()),
            trailers: vec![proto::ReplyHeader { name: "grpc-status".into(), value: Bytes::from_static(b"0") }],
        }
    }

    fn state(r: &proto::ClaimKeyReply) -> proto::ClaimState {
        proto::ClaimState::try_from(r.state).unwrap()
    }

    #[tokio::test]
    async fn one_claim_wins_and_its_answer_is_read_back() {
        let s = service();
        let w = Duration::from_secs(60);
        let key = claim_key("t", "agent", "order-1");
        let first = s.claim(&key, 0, w, "i-1", &[]).await.unwrap();
        assert_eq!(state(&first), proto::ClaimState::Claimed);
        let second = s.claim(&key, 0, w, "i-2", &[]).await.unwrap();
        assert_eq!((state(&second), second.owner_instance.as_str()), (proto::ClaimState::Running, "i-1"));
        // Settling with a stale revision changes nothing.
        assert!(
            !s.settle(&key, first.claim_revision + 100, "i-1", &[], proto::SettleOutcome::Failed, None, w)
                .await
                .unwrap()
        );
        assert!(
            s.settle(&key, first.claim_revision, "i-1", &[], proto::SettleOutcome::Answered, Some(reply("42")), w)
                .await
                .unwrap()
        );
        let third = s.claim(&key, 0, w, "i-2", &[]).await.unwrap();
        assert_eq!(state(&third), proto::ClaimState::Done);
        assert_eq!(third.reply, Some(reply("42")));
        assert_eq!(third.owner_instance, "i-1");
        // Another agent's key of the same name is its own.
        let other = s.claim(&claim_key("t", "other", "order-1"), 0, w, "i-3", &[]).await.unwrap();
        assert_eq!(state(&other), proto::ClaimState::Claimed);
    }

    #[tokio::test]
    async fn a_failure_frees_the_key_an_abandoned_or_large_call_does_not() {
        let s = service();
        let w = Duration::from_secs(60);
        let (failed, abandoned, large) = (claim_key("t", "a", "f"), claim_key("t", "a", "c"), claim_key("t", "a", "l"));
        let c = s.claim(&failed, 0, w, "i", &[]).await.unwrap();
        assert!(s.settle(&failed, c.claim_revision, "i-1", &[], proto::SettleOutcome::Failed, None, w).await.unwrap());
        assert_eq!(state(&s.claim(&failed, 0, w, "i", &[]).await.unwrap()), proto::ClaimState::Claimed);

        let c = s.claim(&abandoned, 0, w, "i", &[]).await.unwrap();
        assert!(
            s.settle(&abandoned, c.claim_revision, "i-1", &[], proto::SettleOutcome::Abandoned, None, w).await.unwrap()
        );
        assert_eq!(state(&s.claim(&abandoned, 0, w, "i", &[]).await.unwrap()), proto::ClaimState::Abandoned);

        let c = s.claim(&large, 0, w, "i", &[]).await.unwrap();
        let big = proto::StoredReply { data: Bytes::from(vec![7u8; MAX_STORED_REPLY_BYTES + 1]), ..reply("") };
        assert!(
            s.settle(&large, c.claim_revision, "i-1", &[], proto::SettleOutcome::Answered, Some(big), w).await.unwrap()
        );
        assert_eq!(state(&s.claim(&large, 0, w, "i", &[]).await.unwrap()), proto::ClaimState::TooLarge);
    }

    #[tokio::test]
    async fn a_running_claim_ends_with_its_lease_and_an_answer_with_its_window() {
        let s = service();
        let w = Duration::from_secs(2);
        let sidecar_lease = s.store.grant_lease(Duration::from_secs(1)).await.unwrap().id;
        let key = claim_key("t", "a", "k");
        assert_eq!(state(&s.claim(&key, sidecar_lease, w, "i", &[]).await.unwrap()), proto::ClaimState::Claimed);
        // The sidecar dies: its lease goes, and the key with it.
        s.store.revoke_lease(sidecar_lease).await.unwrap();
        let c = s.claim(&key, 0, w, "j", &[]).await.unwrap();
        assert_eq!(state(&c), proto::ClaimState::Claimed);
        assert!(
            s.settle(&key, c.claim_revision, "i-1", &[], proto::SettleOutcome::Answered, Some(reply("x")), w)
                .await
                .unwrap()
        );
        let kv = s.store.get(&key).await.unwrap().unwrap();
        assert_ne!(kv.lease, 0, "answered keys are on the window's lease");
        assert!(!key.starts_with(keys::ROOT), "claims stay out of the tenant's routing prefix");
    }

    #[tokio::test]
    async fn a_duplicate_asking_something_else_is_refused_in_every_state() {
        let s = service();
        let w = Duration::from_secs(60);
        let key = claim_key("t", "payments", "order-7");
        let (first, other) = ([1u8; 32], [2u8; 32]);
        let c = s.claim(&key, 0, w, "i-1", &first).await.unwrap();
        assert_eq!(state(&c), proto::ClaimState::Claimed);
        // Running: the same payload waits, another is refused, naming the owner.
        assert_eq!(state(&s.claim(&key, 0, w, "i-2", &first).await.unwrap()), proto::ClaimState::Running);
        let reused = s.claim(&key, 0, w, "i-2", &other).await.unwrap();
        assert_eq!((state(&reused), reused.owner_instance.as_str()), (proto::ClaimState::KeyReused, "i-1"));
        assert_eq!(reused.reply, None);
        // Answered: the digest is kept in the settled record.
        let answered = proto::SettleOutcome::Answered;
        assert!(s.settle(&key, c.claim_revision, "i-1", &first, answered, Some(reply("ok")), w).await.unwrap());
        let record: Record = serde_json::from_slice(&s.store.get(&key).await.unwrap().unwrap().value).unwrap();
        assert_eq!(record.digest, hex(&first));
        assert_eq!(state(&s.claim(&key, 0, w, "i-2", &first).await.unwrap()), proto::ClaimState::Done);
        assert_eq!(state(&s.claim(&key, 0, w, "i-2", &other).await.unwrap()), proto::ClaimState::KeyReused);
        // No digest on either side: not compared.
        assert_eq!(state(&s.claim(&key, 0, w, "i-2", &[]).await.unwrap()), proto::ClaimState::Done);
        // Abandoned and too large are refused as reused too when the payload differs.
        let cut = claim_key("t", "payments", "order-8");
        let c = s.claim(&cut, 0, w, "i-1", &first).await.unwrap();
        assert!(
            s.settle(&cut, c.claim_revision, "i-1", &first, proto::SettleOutcome::Abandoned, None, w).await.unwrap()
        );
        assert_eq!(state(&s.claim(&cut, 0, w, "i-2", &first).await.unwrap()), proto::ClaimState::Abandoned);
        assert_eq!(state(&s.claim(&cut, 0, w, "i-2", &other).await.unwrap()), proto::ClaimState::KeyReused);
    }

    #[tokio::test]
    async fn a_record_written_before_digests_accepts_any_payload() {
        let s = service();
        let key = claim_key("t", "payments", "order-9");
        // As an older control wrote it: no "digest" field.
        let old = serde_json::json!({"state": "abandoned", "owner": "i-0"}).to_string();
        s.store.put(&key, Bytes::from(old), None).await.unwrap();
        let c = s.claim(&key, 0, Duration::from_secs(60), "i-1", &[3u8; 32]).await.unwrap();
        assert_eq!((state(&c), c.owner_instance.as_str()), (proto::ClaimState::Abandoned, "i-0"));
    }
}
