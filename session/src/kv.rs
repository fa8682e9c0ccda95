//! [`KvSessions`]: sessions on the mesh's own key-value store (etcd, or the embedded store
//! in development).
//!
//! Key layout (readable with `etcdctl get --prefix /agent-reach/v1/sessions/`):
//! - `/agent-reach/v1/sessions/{tenant}/{session}/meta` → the session's lease and when a
//!   write last renewed it (JSON);
//! - `/agent-reach/v1/sessions/{tenant}/{session}/f/{field}` → one field: a JSON header line
//!   (writer, time, content type, lock) then the value's bytes;
//! - `/agent-reach/v1/session-index/{tenant}/{session}` → a marker counted for the tenant's
//!   cap on live sessions.
//!
//! Sessions live outside `/agent-reach/v1/tenants/{tenant}/`, which each control replica
//! loads and watches whole for routing state: session writes must not flow through the
//! routing feeds. Every key of a session sits on one lease whose TTL is the session's; a
//! write renews the lease when a tenth of the TTL has passed since the last renewal, so a
//! session lives between 0.9 and 1 TTL after its last write. Versions are store revisions:
//! a field's version is its key's mod revision, the session's that of its `meta` key.
//!
//! Every write decides with [`crate::evaluate`] on the session's state, then commits in one
//! transaction that holds only if `meta` is unchanged, re-reading on a race: writes of one
//! session are serialised, which is what makes the size limit and the multi-field policies
//! exact. The state a write decides on comes from a bounded cache of what this process last
//! read or wrote of the session (field sizes, versions, writers and locks; no values) when
//! it has it, else from a read of the session: the transaction's compare on `meta`'s
//! revision proves the cached state current, so a write costs one transaction when this
//! process wrote the session last, and a read more otherwise (another writer, a refusal
//! decided on the cache is checked against a fresh read before it is returned). The tenant's session cap is checked when a session is created; two sessions
//! created at the same moment may both pass it (it may be exceeded by the number of
//! concurrent creators).

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_reach_store::{Compare, EventKind, KeyValue, LeaseId, Op, Revision, Store, StoreError, Txn};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::{
    Change, ChangeStream, Field, FieldWrite, Limits, Result, Session, SessionError, SessionStore, Version, WritePolicy,
    Writer, Written, check_name, check_write, evaluate, evaluate_by, now_ms,
};

/// Root of every session's keys.
pub const ROOT: &str = "/agent-reach/v1/sessions/";
/// Root of the per-tenant session index.
pub const INDEX_ROOT: &str = "/agent-reach/v1/session-index/";
/// Attempts of a write that keeps losing races with other writes of the same session.
const MAX_ATTEMPTS: usize = 200;

fn session_prefix(tenant: &str, session: &str) -> String {
    format!("{ROOT}{tenant}/{session}/")
}

fn index_key(tenant: &str, session: &str) -> String {
    format!("{INDEX_ROOT}{tenant}/{session}")
}

#[derive(Serialize, Deserialize)]
struct Meta {
    lease: LeaseId,
    refreshed_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct Header {
    #[serde(rename = "a")]
    agent: String,
    #[serde(rename = "i")]
    instance: String,
    #[serde(rename = "t")]
    written_at_ms: u64,
    #[serde(rename = "ct", default, skip_serializing_if = "String::is_empty")]
    content_type: String,
    #[serde(rename = "l", default, skip_serializing_if = "std::ops::Not::not")]
    locked: bool,
}

fn encode_field(writer: &Writer, now: u64, write: &FieldWrite) -> Bytes {
    let header = Header {
        agent: writer.agent.clone(),
        instance: writer.instance.clone(),
        written_at_ms: now,
        content_type: write.content_type.clone(),
        locked: write.policy == WritePolicy::FirstWriter,
    };
    // Serialising a struct of strings, numbers and bools cannot fail.
    let header = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = BytesMut::with_capacity(header.len() + 1 + write.value.len());
    out.put_slice(&header);
    out.put_u8(b'\n');
    out.put_slice(&write.value);
    out.freeze()
}

fn decode_field(kv: &KeyValue) -> Result<Field> {
    let split = kv.value.iter().position(|&b| b == b'\n').ok_or_else(|| corrupt(&kv.key, "no header line"))?;
    let header: Header = serde_json::from_slice(&kv.value[..split]).map_err(|e| corrupt(&kv.key, &e.to_string()))?;
    Ok(Field {
        value: kv.value.slice(split + 1..),
        content_type: header.content_type,
        version: kv.mod_revision as Version,
        writer: Writer { agent: header.agent, instance: header.instance },
        written_at_ms: header.written_at_ms,
        locked: header.locked,
    })
}

fn corrupt(key: &str, why: &str) -> SessionError {
    SessionError::Corrupt(format!("{key}: {why}"))
}

fn store_error(e: StoreError) -> SessionError {
    match e {
        StoreError::Unavailable(why) => SessionError::Unavailable(why),
        other => SessionError::Unavailable(other.to_string()),
    }
}

/// A session as read: its meta record with the meta key's revision, and its fields.
struct Stored {
    meta: Meta,
    meta_revision: Revision,
    session: Session,
}

/// What a write needs to know of a session: its state at `meta_revision`, without values
/// (fields keep empty values; `sizes` has what each counts against the size limit).
#[derive(Clone)]
struct Known {
    lease: LeaseId,
    refreshed_ms: u64,
    meta_revision: Revision,
    /// The session's fields with empty values, and their sizes apart.
    session: Session,
    sizes: BTreeMap<String, usize>,
}

impl Known {
    fn of(stored: &Stored) -> Known {
        let sizes = stored
            .session
            .fields
            .iter()
            .map(|(name, f)| (name.clone(), Field::size(name, &f.value, &f.content_type)))
            .collect();
        let mut session = stored.session.clone();
        for field in session.fields.values_mut() {
            field.value = Bytes::new();
        }
        Known {
            lease: stored.meta.lease,
            refreshed_ms: stored.meta.refreshed_ms,
            meta_revision: stored.meta_revision,
            session,
            sizes,
        }
    }

    /// The state after `writes` committed at `revision`.
    fn after(&self, writer: &Writer, writes: &[FieldWrite], revision: Revision, refreshed_ms: u64) -> Known {
        let mut next = self.clone();
        next.meta_revision = revision;
        next.refreshed_ms = refreshed_ms;
        next.session.version = revision as Version;
        for w in writes {
            next.sizes.insert(w.name.clone(), Field::size(&w.name, &w.value, &w.content_type));
            next.session.fields.insert(
                w.name.clone(),
                Field {
                    value: Bytes::new(),
                    content_type: w.content_type.clone(),
                    version: revision as Version,
                    writer: writer.clone(),
                    written_at_ms: refreshed_ms,
                    locked: w.policy == WritePolicy::FirstWriter,
                },
            );
        }
        next
    }
}

/// Sessions whose state [`KvSessions`] keeps for its next write.
const KNOWN_SESSIONS: usize = 4096;

/// Sessions on a [`Store`]; see the module documentation.
#[derive(Clone)]
pub struct KvSessions {
    store: Arc<dyn Store>,
    limits: Limits,
    known: Arc<std::sync::Mutex<std::collections::HashMap<(String, String), Known>>>,
}

impl KvSessions {
    pub fn new(store: Arc<dyn Store>, limits: Limits) -> KvSessions {
        KvSessions { store, limits, known: Arc::default() }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), Known>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, tenant: &str, session: &str, known: Option<Known>) {
        let mut cache = self.known();
        let key = (tenant.to_string(), session.to_string());
        match known {
            Some(known) => {
                if cache.len() >= KNOWN_SESSIONS && !cache.contains_key(&key) {
                    // Forget an arbitrary one: a forgotten session costs its next write a read.
                    if let Some(victim) = cache.keys().next().cloned() {
                        cache.remove(&victim);
                    }
                }
                cache.insert(key, known);
            }
            None => {
                cache.remove(&key);
            }
        }
    }

    /// A write decided on the cached state: `Some` when it committed, `None` when the state
    /// must be read (not cached, stale, or a refusal that a fresh read must confirm).
    async fn put_known(&self, tenant: &str, session: &str, writer: &Writer, writes: &[FieldWrite]) -> Option<Written> {
        let known = self.known().get(&(tenant.to_string(), session.to_string())).cloned()?;
        let size_of = |name: &str, _: &Field| known.sizes.get(name).copied().unwrap_or(0);
        evaluate_by(&self.limits, Some(&known.session), size_of, writes).ok()?;
        let stored = Stored {
            meta: Meta { lease: known.lease, refreshed_ms: known.refreshed_ms },
            meta_revision: known.meta_revision,
            session: Session::default(),
        };
        match self.update(tenant, &stored, writer, writes, session).await {
            Ok(Some((written, refreshed_ms))) => {
                let next = known.after(writer, writes, written.version as Revision, refreshed_ms);
                self.remember(tenant, session, Some(next));
                Some(written)
            }
            _ => {
                self.remember(tenant, session, None);
                None
            }
        }
    }

    async fn read(&self, tenant: &str, session: &str) -> Result<Option<Stored>> {
        let prefix = session_prefix(tenant, session);
        let range = self.store.get_prefix(&prefix).await.map_err(store_error)?;
        let mut meta = None;
        let mut fields = BTreeMap::new();
        for kv in &range.kvs {
            let rest = &kv.key[prefix.len()..];
            if rest == "meta" {
                let record: Meta = serde_json::from_slice(&kv.value).map_err(|e| corrupt(&kv.key, &e.to_string()))?;
                meta = Some((record, kv.mod_revision));
            } else if let Some(name) = rest.strip_prefix("f/") {
                fields.insert(name.to_string(), decode_field(kv)?);
            }
        }
        // Fields without meta are a session being deleted by its lease's expiry: absent.
        let stored = meta.map(|(meta, meta_revision)| Stored {
            meta,
            meta_revision,
            session: Session { version: meta_revision as Version, fields },
        });
        self.remember(tenant, session, stored.as_ref().map(Known::of));
        Ok(stored)
    }

    fn meta_op(&self, prefix: &str, lease: LeaseId, refreshed_ms: u64) -> Op {
        // Serialising a struct of numbers cannot fail.
        let value = serde_json::to_vec(&Meta { lease, refreshed_ms }).unwrap_or_default();
        Op::Put { key: format!("{prefix}meta"), value: value.into(), lease: Some(lease) }
    }

    async fn create(
        &self,
        tenant: &str,
        session: &str,
        writer: &Writer,
        writes: &[FieldWrite],
    ) -> Result<Option<Written>> {
        let live = self.store.get_prefix(&format!("{INDEX_ROOT}{tenant}/")).await.map_err(store_error)?;
        if live.kvs.len() >= self.limits.max_sessions_per_tenant {
            return Err(SessionError::TooManySessions { limit: self.limits.max_sessions_per_tenant });
        }
        let lease = self.store.grant_lease(self.limits.ttl).await.map_err(store_error)?.id;
        let prefix = session_prefix(tenant, session);
        let now = now_ms();
        let mut success = vec![
            self.meta_op(&prefix, lease, now),
            Op::Put { key: index_key(tenant, session), value: Bytes::from_static(b"1"), lease: Some(lease) },
        ];
        success.extend(writes.iter().map(|w| Op::Put {
            key: format!("{prefix}f/{}", w.name),
            value: encode_field(writer, now, w),
            lease: Some(lease),
        }));
        let txn = Txn { compares: vec![Compare::ModRevision(format!("{prefix}meta"), 0)], success, failure: vec![] };
        let result = self.store.txn(txn).await;
        match result {
            Ok(r) if r.succeeded => {
                let empty = Known {
                    lease,
                    refreshed_ms: now,
                    meta_revision: 0,
                    session: Session::default(),
                    sizes: BTreeMap::new(),
                };
                self.remember(tenant, session, Some(empty.after(writer, writes, r.revision, now)));
                Ok(Some(Written { version: r.revision as Version }))
            }
            other => {
                // Another writer created the session first (or the store failed): our
                // lease holds nothing.
                let _ = self.store.revoke_lease(lease).await;
                other.map(|_| None).map_err(store_error)
            }
        }
    }

    async fn update(
        &self,
        tenant: &str,
        stored: &Stored,
        writer: &Writer,
        writes: &[FieldWrite],
        session: &str,
    ) -> Result<Option<(Written, u64)>> {
        let prefix = session_prefix(tenant, session);
        let now = now_ms();
        let lease = stored.meta.lease;
        let mut refreshed_ms = stored.meta.refreshed_ms;
        if now.saturating_sub(refreshed_ms) >= (self.limits.ttl.as_millis() / 10) as u64 {
            match self.store.keep_alive(lease).await {
                Ok(_) => refreshed_ms = now,
                // Expired meanwhile: its keys are gone; read again.
                Err(StoreError::LeaseNotFound(_)) => return Ok(None),
                Err(e) => return Err(store_error(e)),
            }
        }
        let mut success = vec![self.meta_op(&prefix, lease, refreshed_ms)];
        success.extend(writes.iter().map(|w| Op::Put {
            key: format!("{prefix}f/{}", w.name),
            value: encode_field(writer, now, w),
            lease: Some(lease),
        }));
        let txn = Txn {
            compares: vec![Compare::ModRevision(format!("{prefix}meta"), stored.meta_revision)],
            success,
            failure: vec![],
        };
        match self.store.txn(txn).await {
            Ok(r) if r.succeeded => Ok(Some((Written { version: r.revision as Version }, refreshed_ms))),
            Ok(_) | Err(StoreError::LeaseNotFound(_)) => Ok(None),
            Err(e) => Err(store_error(e)),
        }
    }
}

#[async_trait::async_trait]
impl SessionStore for KvSessions {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn get(&self, tenant: &str, session: &str) -> Result<Option<Session>> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        Ok(self.read(tenant, session).await?.map(|stored| stored.session))
    }

    async fn put(&self, tenant: &str, session: &str, writer: &Writer, writes: Vec<FieldWrite>) -> Result<Written> {
        check_write(&self.limits, tenant, session, &writes)?;
        if let Some(written) = self.put_known(tenant, session, writer, &writes).await {
            return Ok(written);
        }
        for _ in 0..MAX_ATTEMPTS {
            let stored = self.read(tenant, session).await?;
            evaluate(&self.limits, stored.as_ref().map(|s| &s.session), &writes)?;
            let written = match &stored {
                None => self.create(tenant, session, writer, &writes).await?,
                Some(stored) => {
                    let updated = self.update(tenant, stored, writer, &writes, session).await?;
                    if let Some((written, refreshed_ms)) = updated {
                        let next = Known::of(stored).after(writer, &writes, written.version as Revision, refreshed_ms);
                        self.remember(tenant, session, Some(next));
                    }
                    updated.map(|(written, _)| written)
                }
            };
            if let Some(written) = written {
                return Ok(written);
            }
        }
        Err(SessionError::Unavailable(format!(
            "session {session:?} kept changing during {MAX_ATTEMPTS} attempts of this write"
        )))
    }

    async fn delete(&self, tenant: &str, session: &str, fields: &[String]) -> Result<Option<Version>> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        for field in fields {
            check_name("field", field)?;
        }
        let prefix = session_prefix(tenant, session);
        for _ in 0..MAX_ATTEMPTS {
            let Some(stored) = self.read(tenant, session).await? else { return Ok(None) };
            let mut ops = Vec::new();
            if fields.is_empty() {
                ops.push(Op::Delete { key: format!("{prefix}meta") });
                ops.push(Op::Delete { key: index_key(tenant, session) });
                ops.extend(stored.session.fields.keys().map(|name| Op::Delete { key: format!("{prefix}f/{name}") }));
            } else {
                for name in fields {
                    let Some(field) = stored.session.fields.get(name) else { continue };
                    if field.locked {
                        return Err(SessionError::FieldLocked {
                            field: name.clone(),
                            writer: field.writer.clone(),
                            version: field.version,
                        });
                    }
                    ops.push(Op::Delete { key: format!("{prefix}f/{name}") });
                }
                if ops.is_empty() {
                    return Ok(None);
                }
                ops.push(self.meta_op(&prefix, stored.meta.lease, stored.meta.refreshed_ms));
            }
            let txn = Txn {
                compares: vec![Compare::ModRevision(format!("{prefix}meta"), stored.meta_revision)],
                success: ops,
                failure: vec![],
            };
            match self.store.txn(txn).await {
                Ok(r) if r.succeeded => {
                    self.remember(tenant, session, None);
                    if fields.is_empty() {
                        // The lease now holds no key; dropping it is tidiness, not correctness.
                        let _ = self.store.revoke_lease(stored.meta.lease).await;
                    }
                    return Ok(Some(r.revision as Version));
                }
                Ok(_) | Err(StoreError::LeaseNotFound(_)) => continue,
                Err(e) => return Err(store_error(e)),
            }
        }
        Err(SessionError::Unavailable(format!("session {session:?} kept changing during {MAX_ATTEMPTS} attempts")))
    }

    async fn watch(&self, tenant: &str, session: &str, after: Version) -> Result<ChangeStream> {
        check_name("tenant", tenant)?;
        check_name("session", session)?;
        let prefix = session_prefix(tenant, session);
        let start = after as Revision + 1;
        let compacted = |_| SessionError::Compacted { after };
        let watch = match self.store.watch_prefix(&prefix, start).await {
            Ok(watch) => watch,
            Err(StoreError::Compacted { .. }) => return Err(compacted(())),
            Err(e) => return Err(store_error(e)),
        };
        let stream = futures_util::stream::unfold(
            (watch, prefix, std::collections::VecDeque::<Change>::new(), false),
            move |(mut watch, prefix, mut pending, mut ended)| async move {
                loop {
                    if let Some(change) = pending.pop_front() {
                        if matches!(change, Change::Ended { .. }) {
                            ended = true;
                            pending.clear();
                        }
                        return Some((Ok(change), (watch, prefix, pending, ended)));
                    }
                    if ended {
                        return None;
                    }
                    match watch.next().await {
                        None => {
                            return Some((
                                Err(SessionError::Unavailable("the store ended the watch".into())),
                                (watch, prefix, pending, true),
                            ));
                        }
                        Some(Err(StoreError::Compacted { .. })) => {
                            return Some((Err(SessionError::Compacted { after }), (watch, prefix, pending, true)));
                        }
                        Some(Err(e)) => return Some((Err(store_error(e)), (watch, prefix, pending, true))),
                        Some(Ok(batch)) => match changes_of(&prefix, batch.events) {
                            Ok(changes) => pending.extend(changes),
                            Err(e) => return Some((Err(e), (watch, prefix, pending, true))),
                        },
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }

    async fn live_sessions(&self, tenant: &str) -> Result<u64> {
        check_name("tenant", tenant)?;
        let live = self.store.get_prefix(&format!("{INDEX_ROOT}{tenant}/")).await.map_err(store_error)?;
        Ok(live.kvs.len() as u64)
    }
}

/// The session changes of a batch of store events: one per revision.
fn changes_of(prefix: &str, events: Vec<agent_reach_store::Event>) -> Result<Vec<Change>> {
    let mut changes = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let revision = events[i].kv.mod_revision;
        let mut put = BTreeMap::new();
        let mut removed = Vec::new();
        let mut ended = false;
        while i < events.len() && events[i].kv.mod_revision == revision {
            let event = &events[i];
            let rest = &event.kv.key[prefix.len()..];
            match (event.kind, rest) {
                (EventKind::Delete, "meta") => ended = true,
                (EventKind::Put, name) if name.starts_with("f/") => {
                    put.insert(name[2..].to_string(), decode_field(&event.kv)?);
                }
                (EventKind::Delete, name) if name.starts_with("f/") => removed.push(name[2..].to_string()),
                _ => {}
            }
            i += 1;
        }
        let version = revision as Version;
        if ended {
            changes.push(Change::Ended { version });
        } else if !put.is_empty() {
            changes.push(Change::Put { version, fields: put });
        } else if !removed.is_empty() {
            changes.push(Change::Removed { version, fields: removed });
        }
    }
    Ok(changes)
}
