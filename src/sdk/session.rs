//! Session context from the SDK: read and write the fields the agents of one session share,
//! through the local sidecar (which answers reads of sessions it follows from its cache).
//!
//! In a handler, `call.session()` addresses the call's session as the serving instance:
//! ```no_run
//! # async fn h(call: agent_reach::Call) -> Result<(), agent_reach::SessionError> {
//! let order = call.session().get("order_id").await?;            // Option<SessionField>
//! call.session().put_first("user_id", "u-42").await?;             // first writer wins
//! # Ok(()) }
//! ```
//! Outside a handler, [`Client::session`](crate::Client::session) does the same for the
//! client's caller instance.
//!
//! In a handler, reads are answered in-process when the sidecar delivered the session with
//! the call (`HandleRequest.session`: it does when it follows the session and the session
//! is at most `--session-snapshot-max-bytes`, 64 KiB by default): no RPC, a few
//! microseconds. Consistency: such a read sees **the session as of delivery plus this
//! handler's own successful writes and deletes**, not other agents' writes made since
//! (read with [`Session::read_at_least`] a version newer than the delivered one, or outside
//! the handler, to get those). A read the snapshot cannot answer goes to the sidecar as
//! before: `read_at_least` a newer version, `read` after the handler's own writes, or any
//! read once a compare-and-set conflict or a locked field showed the snapshot is behind
//! (the snapshot is then dropped, so a retry loop reads fresh values). Refusals come back as typed [`SessionError`]s (locked field
//! with its first writer, version conflict with the current version, limits); this module
//! does not retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tonic::{Code, Status};

use crate::proto;
use crate::proto::sidecar_client::SidecarClient;
use crate::reason::{self, Reason};

/// One field of a session as read.
pub type SessionField = proto::SessionField;

/// Why a session call failed.
///
/// Each refusal the mesh gives a reason for is a variant with the reason's details; match
/// on them to decide what to do (read again after a [`Conflict`](SessionError::Conflict),
/// accept a [`FieldLocked`](SessionError::FieldLocked) value, ...).
///
/// # Examples
///
/// ```no_run
/// use agent_reach::{Session, SessionError};
///
/// # async fn example(session: Session) -> Result<(), SessionError> {
/// match session.put_first("user_id", "u-42").await {
///     Ok(version) => println!("user_id set at version {version}"),
///     Err(SessionError::FieldLocked { writer_agent, .. }) => println!("{writer_agent} set it first"),
///     Err(e) => return Err(e),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The field was set by a first writer and cannot change.
    #[error("field {field:?} is locked by its first writer {writer_agent}/{writer_instance} (version {version})")]
    FieldLocked { field: String, writer_agent: String, writer_instance: String, version: u64 },
    /// A compare-and-set write expected another version; read again and retry.
    #[error("field {field:?} is at version {current_version}, not the expected one")]
    Conflict { field: String, current_version: u64 },
    /// A field, the session or its number of fields is over a limit (`limit_name`).
    #[error("session context too large: {limit_name} is {limit}, the write needs {size}")]
    TooLarge { limit_name: String, size: u64, limit: u64 },
    /// The write named another policy than the one an agent or capability policy declares
    /// for the field, and that policy allows no override.
    #[error(
        "field {field:?} is declared {declared_policy} by policy {policy_kind}/{policy_name}; a write may not ask for {requested_policy}"
    )]
    PolicyOverride {
        field: String,
        declared_policy: String,
        requested_policy: String,
        policy_kind: String,
        policy_name: String,
    },
    /// The tenant policy's `session_writers` rule `rule` covers `field` and does not allow
    /// this writer (or the writer is not verified: write with the agent's credential, e.g.
    /// through `call.session()` or `RunningAgent::client`). Nothing was written.
    #[error(
        "{writer_agent}/{writer_instance} (verified: {verified}) may not write field {field:?} (session_writers rule {rule:?})"
    )]
    WriterNotAllowed { field: String, rule: String, writer_agent: String, writer_instance: String, verified: bool },
    /// The write named another instance than the one its agent credential proves.
    #[error("writer_instance {writer_instance:?} is not the credential's instance {credential_instance:?}")]
    WriterMismatch { writer_instance: String, credential_instance: String },
    /// The tenant has as many live sessions as it may.
    #[error("the tenant's limit of {limit} live sessions is reached")]
    TooManySessions { limit: u64 },
    /// Not a call in a session, or no instance to write as.
    #[error("{0}")]
    NoSession(&'static str),
    /// Any other failure (store unavailable, invalid argument...), with its status.
    #[error("session call failed: {0}")]
    Status(Status),
}

impl From<Status> for SessionError {
    fn from(status: Status) -> SessionError {
        let Some(info) = reason::error_info(&status) else { return SessionError::Status(status) };
        let text = |key: &str| info.metadata.get(key).cloned().unwrap_or_default();
        let number = |key: &str| info.metadata.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        match Reason::parse(&info.reason) {
            Some(Reason::ContextFieldLocked) => SessionError::FieldLocked {
                field: text("field"),
                writer_agent: text("writer_agent"),
                writer_instance: text("writer_instance"),
                version: number("version"),
            },
            Some(Reason::ContextConflict) => {
                SessionError::Conflict { field: text("field"), current_version: number("current_version") }
            }
            Some(Reason::ContextTooLarge) => {
                SessionError::TooLarge { limit_name: text("limit_name"), size: number("size"), limit: number("limit") }
            }
            Some(Reason::ContextTooManySessions) => SessionError::TooManySessions { limit: number("limit") },
            Some(Reason::ContextPolicyOverride) => SessionError::PolicyOverride {
                field: text("field"),
                declared_policy: text("declared_policy"),
                requested_policy: text("requested_policy"),
                policy_kind: text("policy_kind"),
                policy_name: text("policy_name"),
            },
            Some(Reason::ContextWriterNotAllowed) => SessionError::WriterNotAllowed {
                field: text("field"),
                rule: text("rule"),
                writer_agent: text("writer_agent"),
                writer_instance: text("writer_instance"),
                verified: text("verified") == "true",
            },
            Some(Reason::ContextWriterMismatch) => SessionError::WriterMismatch {
                writer_instance: text("writer_instance"),
                credential_instance: text("credential_instance"),
            },
            _ => SessionError::Status(status),
        }
    }
}

impl SessionError {
    /// The gRPC code of the failure.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = agent_reach::SessionError::Conflict { field: "count".into(), current_version: 7 };
    /// assert_eq!(e.code(), tonic::Code::Aborted);
    /// ```
    pub fn code(&self) -> Code {
        match self {
            SessionError::FieldLocked { .. } | SessionError::PolicyOverride { .. } => Code::FailedPrecondition,
            SessionError::Conflict { .. } => Code::Aborted,
            SessionError::TooLarge { .. } | SessionError::TooManySessions { .. } => Code::ResourceExhausted,
            SessionError::WriterNotAllowed { .. } | SessionError::WriterMismatch { .. } => Code::PermissionDenied,
            SessionError::NoSession(_) => Code::FailedPrecondition,
            SessionError::Status(s) => s.code(),
        }
    }
}

/// A session as read: its version and fields by name.
#[derive(Clone, Debug, Default)]
pub struct SessionSnapshot {
    /// False when the session does not exist.
    pub found: bool,
    pub version: u64,
    pub fields: HashMap<String, SessionField>,
    /// Answered from the local sidecar's cache (or from the session delivered with the call).
    pub cached: bool,
    /// Answered in-process from the session delivered with the call (no RPC).
    pub delivered: bool,
}

/// The session a sidecar delivered with a call, shared by the call's [`Session`] handles:
/// the session as of delivery, plus the handler's own successful writes.
#[derive(Debug)]
pub(crate) struct Delivered {
    state: Mutex<Option<Local>>,
    /// Reads answered from it.
    hits: AtomicU64,
    /// The serving agent, writer of the handler's own writes.
    agent: String,
}

#[derive(Debug)]
struct Local {
    found: bool,
    /// The session version the snapshot is whole at.
    version: u64,
    fields: HashMap<String, SessionField>,
    /// The handler wrote or deleted since delivery: fields are right, the session as a
    /// whole (other writers' fields since) may not be.
    own_writes: bool,
}

impl Delivered {
    /// The delivered `session` of a call in `session_id`, if it is that session's.
    pub(crate) fn new(
        session_id: &str,
        session: Option<proto::DeliveredSession>,
        agent: &str,
    ) -> Option<Arc<Delivered>> {
        let s = session.filter(|s| !session_id.is_empty() && s.session_id == session_id)?;
        let local = Local {
            found: true,
            version: s.version,
            fields: s.fields.into_iter().map(|f| (f.name.clone(), f)).collect(),
            own_writes: false,
        };
        Some(Arc::new(Delivered { state: Mutex::new(Some(local)), hits: AtomicU64::new(0), agent: agent.to_string() }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Option<Local>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn hit<T>(&self, answer: Option<T>) -> Option<T> {
        if answer.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// One field (`Some(None)`: known absent), or `None` when it cannot answer.
    fn get(&self, name: &str) -> Option<Option<SessionField>> {
        let answer = self.state().as_ref().map(|l| l.fields.get(name).cloned());
        self.hit(answer)
    }

    /// The whole session at least at `version`, or `None` when it cannot answer.
    fn read(&self, version: u64) -> Option<SessionSnapshot> {
        let answer = self.state().as_ref().filter(|l| !l.own_writes && version <= l.version).map(|l| SessionSnapshot {
            found: l.found,
            version: l.version,
            fields: l.fields.clone(),
            cached: true,
            delivered: true,
        });
        self.hit(answer)
    }

    /// The handler's write of `fields` at `version` succeeded.
    fn wrote(&self, fields: &[proto::SessionFieldWrite], writer_instance: &str, version: u64) {
        let mut state = self.state();
        let Some(local) = state.as_mut() else { return };
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        for w in fields {
            let field = SessionField {
                name: w.name.clone(),
                value: w.value.clone(),
                content_type: w.content_type.clone(),
                version,
                writer_agent: self.agent.clone(),
                writer_instance: writer_instance.to_string(),
                written_at_ms: now,
                locked: w.policy == proto::WritePolicy::FirstWriter as i32,
            };
            local.fields.insert(w.name.clone(), field);
        }
        (local.found, local.own_writes) = (true, true);
    }

    /// The handler's delete of `fields` (all when empty) succeeded.
    fn deleted(&self, fields: &[String]) {
        let mut state = self.state();
        let Some(local) = state.as_mut() else { return };
        if fields.is_empty() {
            local.fields.clear();
            local.found = false;
        } else {
            for name in fields {
                local.fields.remove(name);
            }
        }
        local.own_writes = true;
    }

    /// A refusal showed the snapshot is behind the store: reads go to the sidecar.
    fn refused(&self, e: &SessionError) {
        if matches!(e, SessionError::Conflict { .. } | SessionError::FieldLocked { .. }) {
            *self.state() = None;
        }
    }
}

/// A session of the caller's tenant, addressed as one instance (the writer of its puts).
/// Writes and deletes present the agent credential when there is one, so the writer is
/// verified (fields the tenant policy's `session_writers` rules cover need that).
///
/// A handler gets the call's session from [`Call::session`](crate::Call::session); a
/// client addresses one by id with [`Client::session`](crate::Client::session).
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let mesh = agent_reach::Client::connect_local().await?;
/// let session = mesh.session("s-42");
/// session.set("language", "zh").await?;
/// let snapshot = session.read().await?;
/// println!("session {} at version {}: {} fields", session.id(), snapshot.version, snapshot.fields.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Session {
    /// `None` for a call built by hand (no sidecar to ask).
    sidecar: Option<SidecarClient<super::SidecarChannel>>,
    session_id: String,
    instance_id: String,
    credential: Option<String>,
    /// The session delivered with the call (handlers only).
    delivered: Option<Arc<Delivered>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.session_id)
            .field("instance_id", &self.instance_id)
            .field("credential", &self.credential.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// How a [`Session::put`] treats a field's current value.
///
/// # Examples
///
/// ```no_run
/// use agent_reach::{Policy, Session};
///
/// # async fn example(session: Session) -> Result<(), agent_reach::SessionError> {
/// // Both fields or neither: the order id only once, the status whatever it was.
/// session.put([("order_id", "o-7", Policy::FirstWriter), ("status", "paid", Policy::LastWriter)]).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The policy the tenant's agent or capability policies declare for the field (the
    /// writer's), `LastWriter` when none does.
    Declared,
    /// Only if the field does not exist; then it stands for good.
    FirstWriter,
    /// Whatever the current value.
    LastWriter,
    /// Only if the field is still at this version (0: does not exist).
    CompareAndSet(u64),
}

impl Session {
    pub(crate) fn new(
        sidecar: Option<SidecarClient<super::SidecarChannel>>,
        session_id: String,
        instance_id: String,
        credential: Option<String>,
    ) -> Session {
        Session { sidecar, session_id, instance_id, credential, delivered: None }
    }

    /// Reads answered first from the session delivered with the call.
    pub(crate) fn with_delivered(mut self, delivered: Option<Arc<Delivered>>) -> Session {
        self.delivered = delivered;
        self
    }

    /// The version of the session the sidecar delivered with the call, while reads are
    /// answered from it; `None` when none was delivered (no session, not followed by the
    /// sidecar, over its size limit) or after a refusal showed it is behind.
    ///
    /// # Examples
    ///
    /// ```
    /// let call = agent_reach::Call::new("c", "built by hand");
    /// assert_eq!((call.session().delivered_version(), call.session().delivered_reads()), (None, 0));
    /// ```
    pub fn delivered_version(&self) -> Option<u64> {
        self.delivered.as_ref().and_then(|d| d.state().as_ref().map(|l| l.version))
    }

    /// How many reads of the call's session (through any of its handles) were answered
    /// in-process from the delivered session.
    pub fn delivered_reads(&self) -> u64 {
        self.delivered.as_ref().map_or(0, |d| d.hits.load(Ordering::Relaxed))
    }

    /// A write request, presenting the agent credential if there is one.
    fn as_writer<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(v) = self.credential.as_ref().and_then(|c| c.parse().ok()) {
            request.metadata_mut().insert(crate::headers::AGENT_CREDENTIAL, v);
        }
        request
    }

    pub fn id(&self) -> &str {
        &self.session_id
    }

    /// The sidecar to ask, once the session is known to be addressable.
    fn sidecar(&self) -> Result<SidecarClient<super::SidecarChannel>, SessionError> {
        if self.session_id.is_empty() {
            return Err(SessionError::NoSession("this call carries no session id"));
        }
        self.sidecar.clone().ok_or(SessionError::NoSession("a call built by hand has no sidecar"))
    }

    /// Reads the whole session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// let snapshot = session.read().await?;
    /// if snapshot.found {
    ///     for (name, field) in &snapshot.fields {
    ///         println!("{name} = {:?} (by {})", field.value, field.writer_agent);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read(&self) -> Result<SessionSnapshot, SessionError> {
        self.read_at_least(0).await
    }

    /// Reads the whole session, at least at `version` (e.g. a version a write returned on
    /// another host).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// let version = session.set("step", "2").await?;
    /// // Elsewhere, a reader that must see that write:
    /// let snapshot = session.read_at_least(version).await?;
    /// assert!(snapshot.version >= version);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_at_least(&self, version: u64) -> Result<SessionSnapshot, SessionError> {
        if let Some(snapshot) = self.delivered.as_ref().and_then(|d| d.read(version)) {
            return Ok(snapshot);
        }
        let request = proto::GetSessionRequest {
            session_id: self.session_id.clone(),
            min_version: version,
            ..Default::default()
        };
        let reply = self.sidecar()?.get_session(request).await?.into_inner();
        Ok(SessionSnapshot {
            found: reply.found,
            version: reply.version,
            cached: reply.cached,
            delivered: false,
            fields: reply.fields.into_iter().map(|f| (f.name.clone(), f)).collect(),
        })
    }

    /// One field, or `None` when the session or the field does not exist.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// if let Some(field) = session.get("order_id").await? {
    ///     println!("order {:?}, version {}", field.value, field.version);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get(&self, name: &str) -> Result<Option<SessionField>, SessionError> {
        if let Some(answer) = self.delivered.as_ref().and_then(|d| d.get(name)) {
            return Ok(answer);
        }
        let request = proto::GetSessionRequest {
            session_id: self.session_id.clone(),
            fields: vec![name.to_string()],
            ..Default::default()
        };
        let reply = self.sidecar()?.get_session(request).await?.into_inner();
        Ok(reply.fields.into_iter().find(|f| f.name == name))
    }

    /// Writes fields atomically (all or none), each with its policy; returns the version
    /// of the write.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// use agent_reach::{Policy, SessionError};
    ///
    /// // A counter by compare-and-set: read, then write only if no one wrote in between.
    /// loop {
    ///     let field = session.get("count").await?;
    ///     let (count, version) = field.map_or((0, 0), |f| (String::from_utf8_lossy(&f.value).parse().unwrap_or(0), f.version));
    ///     match session.put([("count", (count + 1u64).to_string(), Policy::CompareAndSet(version))]).await {
    ///         Ok(_) => break,
    ///         Err(SessionError::Conflict { .. }) => continue,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put<I, N, V>(&self, fields: I) -> Result<u64, SessionError>
    where
        I: IntoIterator<Item = (N, V, Policy)>,
        N: Into<String>,
        V: Into<Bytes>,
    {
        if self.instance_id.is_empty() && self.credential.is_none() {
            return Err(SessionError::NoSession("writes need an instance to write as (use RunningAgent::client)"));
        }
        let fields: Vec<_> = fields
            .into_iter()
            .map(|(name, value, policy)| {
                let (policy, expected_version) = match policy {
                    Policy::Declared => (proto::WritePolicy::Unspecified, 0),
                    Policy::FirstWriter => (proto::WritePolicy::FirstWriter, 0),
                    Policy::LastWriter => (proto::WritePolicy::LastWriter, 0),
                    Policy::CompareAndSet(v) => (proto::WritePolicy::CompareAndSet, v),
                };
                proto::SessionFieldWrite {
                    name: name.into(),
                    value: value.into(),
                    policy: policy as i32,
                    expected_version,
                    ..Default::default()
                }
            })
            .collect();
        let request = proto::PutSessionRequest {
            session_id: self.session_id.clone(),
            fields,
            writer_instance: self.instance_id.clone(),
            ..Default::default()
        };
        let sidecar = self.sidecar()?;
        let Some(delivered) = &self.delivered else {
            return Ok(sidecar.clone().put_session(self.as_writer(request)).await?.into_inner().version);
        };
        let fields = request.fields.clone();
        match sidecar.clone().put_session(self.as_writer(request)).await {
            Ok(reply) => {
                let version = reply.into_inner().version;
                delivered.wrote(&fields, &self.instance_id, version);
                Ok(version)
            }
            Err(status) => {
                let e = SessionError::from(status);
                delivered.refused(&e);
                Err(e)
            }
        }
    }

    /// Sets one field with its declared policy ([`Policy::Declared`]): last writer wins
    /// unless a policy declares otherwise for the field.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// let version = session.set("language", "zh").await?;
    /// println!("written at version {version}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set(&self, name: &str, value: impl Into<Bytes>) -> Result<u64, SessionError> {
        self.put([(name, value.into(), Policy::Declared)]).await
    }

    /// Sets one field only if no one has: the first value stands.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// session.put_first("user_id", "u-42").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put_first(&self, name: &str, value: impl Into<Bytes>) -> Result<u64, SessionError> {
        self.put([(name, value.into(), Policy::FirstWriter)]).await
    }

    /// Deletes fields, or the whole session when `fields` is empty. Returns whether
    /// anything was deleted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// let removed = session.delete(&["draft"]).await?; // one field
    /// session.delete(&[]).await?; // the whole session
    /// # let _ = removed;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete(&self, fields: &[&str]) -> Result<bool, SessionError> {
        let request = proto::DeleteSessionRequest {
            session_id: self.session_id.clone(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            writer_instance: self.instance_id.clone(),
            ..Default::default()
        };
        let fields = request.fields.clone();
        match self.sidecar()?.delete_session(self.as_writer(request)).await {
            Ok(reply) => {
                if let Some(d) = &self.delivered {
                    d.deleted(&fields);
                }
                Ok(reply.into_inner().deleted)
            }
            Err(status) => {
                let e = SessionError::from(status);
                if let Some(d) = &self.delivered {
                    d.refused(&e);
                }
                Err(e)
            }
        }
    }

    /// The session's changes after `version`, then live ones. The stream fails when the
    /// sidecar goes away (see [`Session::follow`] for a stream that resumes by itself).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// let mut changes = session.watch(0).await?;
    /// while let Some(change) = changes.message().await.map_err(agent_reach::SessionError::from)? {
    ///     println!("version {}: {} fields written", change.version, change.put.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn watch(&self, version: u64) -> Result<tonic::Streaming<proto::SessionChange>, SessionError> {
        let request = proto::WatchSessionRequest {
            session_id: self.session_id.clone(),
            after_version: version,
            ..Default::default()
        };
        Ok(self.sidecar()?.watch_session(request).await?.into_inner())
    }

    /// The session's changes after `version`, then live ones, surviving a restart of the
    /// sidecar (or of control): when the watch breaks, it is opened again after the last
    /// version received, so every change comes exactly once and in order. Reconnection is
    /// retried (100 ms doubling to 2 s) for up to `max_outage`; the stream then yields the
    /// last error and ends. It also ends after the change that ends the session, and on any
    /// refusal that a retry cannot fix (e.g. `CONTEXT_HISTORY_COMPACTED`: read the session
    /// again and follow from its version).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(session: agent_reach::Session) -> Result<(), agent_reach::SessionError> {
    /// use futures_util::StreamExt;
    /// use std::time::Duration;
    ///
    /// let from = session.read().await?.version;
    /// let mut changes = std::pin::pin!(session.follow(from, Duration::from_secs(60)));
    /// while let Some(change) = changes.next().await {
    ///     let change = change?;
    ///     println!("version {}{}", change.version, if change.ended { " (ended)" } else { "" });
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn follow(
        &self,
        version: u64,
        max_outage: std::time::Duration,
    ) -> impl futures_util::Stream<Item = Result<proto::SessionChange, SessionError>> + Send + 'static {
        struct Follow {
            session: Session,
            last: u64,
            stream: Option<tonic::Streaming<proto::SessionChange>>,
            max_outage: std::time::Duration,
            done: bool,
        }
        /// Failures a new watch may get past: the sidecar (or control) went away.
        fn transient(status: &Status) -> bool {
            matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal)
                && !matches!(
                    reason::error_info(status).and_then(|i| Reason::parse(&i.reason)),
                    Some(Reason::ContextHistoryCompacted)
                )
        }
        let state = Follow { session: self.clone(), last: version, stream: None, max_outage, done: false };
        futures_util::stream::unfold(state, |mut f| async move {
            if f.done {
                return None;
            }
            let mut failing_since: Option<tokio::time::Instant> = None;
            let mut backoff = std::time::Duration::from_millis(100);
            loop {
                if f.stream.is_none() {
                    match f.session.watch(f.last).await {
                        Ok(stream) => f.stream = Some(stream),
                        Err(SessionError::Status(status)) if transient(&status) => {
                            let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                            if since.elapsed() >= f.max_outage {
                                f.done = true;
                                return Some((Err(SessionError::Status(status)), f));
                            }
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
                            continue;
                        }
                        Err(e) => {
                            f.done = true;
                            return Some((Err(e), f));
                        }
                    }
                }
                let next = match f.stream.as_mut() {
                    Some(stream) => stream.message().await,
                    None => continue,
                };
                match next {
                    Ok(Some(change)) if change.version <= f.last => continue,
                    Ok(Some(change)) => {
                        f.last = change.version;
                        f.done = change.ended;
                        return Some((Ok(change), f));
                    }
                    // The stream ended or broke without ending the session: watch again
                    // (after a pause, so a stream that keeps ending costs no busy loop).
                    Ok(None) => f.stream = None,
                    Err(status) if transient(&status) => {
                        f.stream = None;
                        let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                        if since.elapsed() >= f.max_outage {
                            f.done = true;
                            return Some((Err(SessionError::Status(status)), f));
                        }
                    }
                    Err(status) => {
                        f.done = true;
                        return Some((Err(SessionError::from(status)), f));
                    }
                }
                failing_since.get_or_insert_with(tokio::time::Instant::now);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, value: &str, version: u64) -> SessionField {
        SessionField {
            name: name.into(),
            value: Bytes::from(value.to_string()),
            version,
            writer_agent: "intake".into(),
            ..Default::default()
        }
    }

    /// A handler's session with `fields` delivered at `version` (no sidecar: a read that
    /// falls back fails with NoSession, which tells it went to the sidecar).
    fn delivered(version: u64, fields: Vec<SessionField>) -> Session {
        let session = proto::DeliveredSession { session_id: "s-1".into(), version, fields };
        Session::new(None, "s-1".into(), "refund-1".into(), None).with_delivered(Delivered::new(
            "s-1",
            Some(session),
            "refund",
        ))
    }

    fn went_to_sidecar<T: std::fmt::Debug>(r: Result<T, SessionError>) -> bool {
        matches!(r, Err(SessionError::NoSession("a call built by hand has no sidecar")))
    }

    #[tokio::test]
    async fn reads_are_answered_from_the_delivered_session() {
        let s = delivered(7, vec![field("order_id", "o-7", 3), field("user_id", "u-1", 7)]);
        let order = s.get("order_id").await.unwrap().unwrap();
        assert_eq!((order.value.as_ref(), order.version, order.writer_agent.as_str()), (&b"o-7"[..], 3, "intake"));
        // The snapshot is whole: a field not in it did not exist at delivery.
        assert_eq!(s.get("missing").await.unwrap(), None);
        let whole = s.read().await.unwrap();
        assert_eq!((whole.found, whole.version, whole.fields.len(), whole.delivered), (true, 7, 2, true));
        assert_eq!(s.read_at_least(7).await.unwrap().version, 7);
        assert_eq!((s.delivered_reads(), s.delivered_version()), (4, Some(7)));
        // Another handle of the same call shares it.
        assert_eq!(s.clone().delivered_reads(), 4);
    }

    #[tokio::test]
    async fn a_newer_version_or_no_snapshot_goes_to_the_sidecar() {
        let s = delivered(7, vec![field("order_id", "o-7", 3)]);
        assert!(went_to_sidecar(s.read_at_least(8).await));
        assert_eq!(s.delivered_reads(), 0);
        // Delivered for another session: ignored.
        let other = proto::DeliveredSession { session_id: "s-2".into(), version: 1, fields: vec![] };
        assert!(Delivered::new("s-1", Some(other), "a").is_none());
        let plain = Session::new(None, "s-1".into(), "i".into(), None);
        assert!(went_to_sidecar(plain.get("order_id").await));
        assert_eq!((plain.delivered_version(), plain.delivered_reads()), (None, 0));
    }

    #[tokio::test]
    async fn own_writes_and_deletes_update_the_snapshot_and_refusals_drop_it() {
        let s = delivered(7, vec![field("order_id", "o-7", 3), field("draft", "x", 5)]);
        let d = s.delivered.clone().unwrap();
        let writes = [proto::SessionFieldWrite {
            name: "status".into(),
            value: Bytes::from_static(b"paid"),
            policy: proto::WritePolicy::FirstWriter as i32,
            ..Default::default()
        }];
        d.wrote(&writes, "refund-1", 12);
        let status = s.get("status").await.unwrap().unwrap();
        assert_eq!(
            (status.value.as_ref(), status.version, status.writer_agent.as_str(), status.writer_instance.as_str()),
            (&b"paid"[..], 12, "refund", "refund-1")
        );
        assert!(status.locked);
        assert!(status.written_at_ms > 0);
        // Others may have written between 7 and 12: the whole session comes from the sidecar.
        assert!(went_to_sidecar(s.read().await));
        d.deleted(&["draft".to_string()]);
        assert_eq!(s.get("draft").await.unwrap(), None);
        assert_eq!(s.get("order_id").await.unwrap().unwrap().version, 3);
        // A refusal that is not about the snapshot keeps it.
        d.refused(&SessionError::TooLarge { limit_name: "field".into(), size: 9, limit: 8 });
        assert_eq!(s.delivered_version(), Some(7));
        // A conflict shows it is behind: reads go to the sidecar from now on.
        d.refused(&SessionError::Conflict { field: "order_id".into(), current_version: 9 });
        assert_eq!(s.delivered_version(), None);
        assert!(went_to_sidecar(s.get("order_id").await));
        assert_eq!(s.delivered_reads(), 3);
        // Deleting the whole session: known absent.
        let s = delivered(7, vec![field("order_id", "o-7", 3)]);
        s.delivered.as_ref().unwrap().deleted(&[]);
        assert_eq!(s.get("order_id").await.unwrap(), None);
    }

    #[test]
    fn policy_refusals_become_typed_errors() {
        let status = reason::status(
            Reason::ContextFieldLocked,
            "locked",
            &[
                ("field", "user_id".into()),
                ("writer_agent", "intake".into()),
                ("writer_instance", "intake-1".into()),
                ("version", "12".into()),
            ],
        );
        match SessionError::from(status) {
            SessionError::FieldLocked { field, writer_agent, writer_instance, version } => {
                assert_eq!(
                    (field.as_str(), writer_agent.as_str(), writer_instance.as_str(), version),
                    ("user_id", "intake", "intake-1", 12)
                );
            }
            other => panic!("{other:?}"),
        }
        let status = reason::status(
            Reason::ContextConflict,
            "conflict",
            &[("field", "n".into()), ("current_version", "9".into())],
        );
        assert!(matches!(SessionError::from(status), SessionError::Conflict { current_version: 9, .. }));
        let other = SessionError::from(Status::unavailable("down"));
        assert_eq!(other.code(), Code::Unavailable);
        let status = reason::status(
            Reason::ContextWriterNotAllowed,
            "not allowed",
            &[
                ("field", "refund.amount".into()),
                ("rule", "refund.*".into()),
                ("writer_agent", "support".into()),
                ("writer_instance", "support-1".into()),
                ("verified", "false".into()),
            ],
        );
        let denied = SessionError::from(status);
        assert_eq!(denied.code(), Code::PermissionDenied);
        match denied {
            SessionError::WriterNotAllowed { field, rule, writer_agent, verified, .. } => {
                assert_eq!(
                    (field.as_str(), rule.as_str(), writer_agent.as_str(), verified),
                    ("refund.amount", "refund.*", "support", false)
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
