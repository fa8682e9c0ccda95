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
//! client's caller instance. Refusals come back as typed [`SessionError`]s (locked field
//! with its first writer, version conflict with the current version, limits); this module
//! does not retry.

use std::collections::HashMap;

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
    /// Answered from the local sidecar's cache.
    pub cached: bool,
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
        Session { sidecar, session_id, instance_id, credential }
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
        let fields = fields
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
        Ok(self.sidecar()?.put_session(self.as_writer(request)).await?.into_inner().version)
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
        Ok(self.sidecar()?.delete_session(self.as_writer(request)).await?.into_inner().deleted)
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
