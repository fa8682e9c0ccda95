//! Session context: state that the agents working on one conversation share, per (tenant,
//! session id), without re-sending it on every hop.
//!
//! A session is a map of named fields; each field has a value (bytes + content type), the
//! version of the write that set it, its writer (agent + instance) and the time it was
//! written. Writes name a [`WritePolicy`] per field (`first_writer`, `last_writer`,
//! `compare_and_set`); a write of several fields is atomic (all or nothing). Every write
//! refreshes the session's TTL; [`Limits`] bound field and session sizes, the number of
//! fields and the live sessions of a tenant. [`SessionStore::watch`] streams the changes of
//! a session after a version and can be resumed from the last version seen.
//!
//! One trait, [`SessionStore`], two backends passing one conformance suite
//! ([`conformance`], feature `test-util`):
//! - [`KvSessions`]: on the mesh's own [`agent_reach_store::Store`] (etcd in production, the
//!   embedded store in development), so it adds no dependency;
//! - [`RedisSessions`]: on Redis, for high write rates (policies checked atomically by a Lua
//!   script).
//!
//! This crate knows nothing of protobuf or gRPC: the control service and the sidecar convert
//! at their edges. It does not authenticate writers; callers pass the writer they verified.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::Stream;

mod kv;
mod redis_backend;

#[cfg(feature = "test-util")]
pub mod conformance;
#[cfg(feature = "test-util")]
pub mod testing;

pub use kv::KvSessions;
pub use redis_backend::RedisSessions;

/// The version of a session write: increases with every write of the session; a field's
/// version is the version of the write that last set it. 0 means "absent".
pub type Version = u64;

/// Who wrote a field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Writer {
    pub agent: String,
    pub instance: String,
}

impl Writer {
    pub fn new(agent: impl Into<String>, instance: impl Into<String>) -> Writer {
        Writer { agent: agent.into(), instance: instance.into() }
    }
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.agent, self.instance)
    }
}

/// One field of a session as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub value: Bytes,
    pub content_type: String,
    pub version: Version,
    pub writer: Writer,
    /// Milliseconds since the Unix epoch when the field was written.
    pub written_at_ms: u64,
    /// Written with `first_writer`: no later write or field delete may change it.
    pub locked: bool,
}

impl Field {
    /// The bytes the field counts against the session's size limit.
    pub fn size(name: &str, value: &[u8], content_type: &str) -> usize {
        name.len() + value.len() + content_type.len()
    }
}

/// A session's fields at one version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    /// The version of the session's last write.
    pub version: Version,
    pub fields: BTreeMap<String, Field>,
}

impl Session {
    /// The bytes the session counts against its size limit.
    pub fn size(&self) -> usize {
        self.fields.iter().map(|(name, f)| Field::size(name, &f.value, &f.content_type)).sum()
    }
}

/// How a write of one field treats the field's current value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePolicy {
    /// Write only if the field does not exist; the value then stands for good (later
    /// writes and field deletes fail with [`SessionError::FieldLocked`]).
    FirstWriter,
    /// Write whatever the current value (unless a first writer locked the field).
    LastWriter,
    /// Write only if the field's version is still `expected` (0: the field must not exist),
    /// else [`SessionError::Conflict`] with the current version.
    CompareAndSet { expected: Version },
}

impl WritePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            WritePolicy::FirstWriter => "first_writer",
            WritePolicy::LastWriter => "last_writer",
            WritePolicy::CompareAndSet { .. } => "compare_and_set",
        }
    }
}

/// One field of a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldWrite {
    pub name: String,
    pub value: Bytes,
    pub content_type: String,
    pub policy: WritePolicy,
}

impl FieldWrite {
    pub fn new(name: impl Into<String>, value: impl Into<Bytes>, policy: WritePolicy) -> FieldWrite {
        FieldWrite { name: name.into(), value: value.into(), content_type: String::new(), policy }
    }

    pub fn content_type(mut self, content_type: impl Into<String>) -> FieldWrite {
        self.content_type = content_type.into();
        self
    }
}

/// The result of a successful write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The version of this write (now the version of every field it wrote).
    pub version: Version,
}

/// What one write did to a session, as a watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Fields written (all at `version`).
    Put { version: Version, fields: BTreeMap<String, Field> },
    /// Fields deleted by a field delete.
    Removed { version: Version, fields: Vec<String> },
    /// The session was deleted or expired; the watch ends after this.
    Ended { version: Version },
}

impl Change {
    pub fn version(&self) -> Version {
        match self {
            Change::Put { version, .. } | Change::Removed { version, .. } | Change::Ended { version } => *version,
        }
    }
}

/// The changes of one session after a version, in version order, each once.
pub type ChangeStream = Pin<Box<dyn Stream<Item = Result<Change, SessionError>> + Send>>;

/// Bounds on what the store keeps; every one has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A session not written for this long is deleted (24 h).
    pub ttl: Duration,
    /// Largest field: name + value + content type (64 KiB).
    pub max_field_bytes: usize,
    /// Largest session: the sum over its fields (1 MiB).
    pub max_session_bytes: usize,
    /// Most fields in one session (256).
    pub max_fields: usize,
    /// Most live sessions of one tenant (10,000).
    pub max_sessions_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            ttl: Duration::from_secs(24 * 3600),
            max_field_bytes: 64 * 1024,
            max_session_bytes: 1024 * 1024,
            max_fields: 256,
            max_sessions_per_tenant: 10_000,
        }
    }
}

/// Longest tenant, session or field name.
pub const MAX_NAME_LEN: usize = 128;

/// Why a session call failed. A failed write stored nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("field {field:?} is locked: its first writer {writer} set it at version {version}")]
    FieldLocked { field: String, writer: Writer, version: Version },
    #[error("field {field:?} is at version {current}, not the expected {expected}")]
    Conflict { field: String, expected: Version, current: Version },
    #[error("field {field:?} has {size} bytes, more than the limit of {limit}")]
    FieldTooLarge { field: String, size: usize, limit: usize },
    #[error("the session would have {size} bytes, more than the limit of {limit}")]
    SessionTooLarge { size: usize, limit: usize },
    #[error("the session would have {count} fields, more than the limit of {limit}")]
    TooManyFields { count: usize, limit: usize },
    #[error("the tenant already has {limit} live sessions, its limit")]
    TooManySessions { limit: usize },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("changes after version {after} are no longer kept; read the session again")]
    Compacted { after: Version },
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    #[error("stored session data is unreadable: {0}")]
    Corrupt(String),
}

pub type Result<T, E = SessionError> = std::result::Result<T, E>;

/// Shared session state, per tenant and session id. Both backends behave the same on every
/// method (checked by [`conformance`]).
#[async_trait::async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// "etcd", "embedded" or "redis", for logs and metrics.
    fn backend(&self) -> &'static str;
    /// The limits this store enforces.
    fn limits(&self) -> &Limits;

    /// The session's fields, or `None` when it does not exist (never written, deleted or
    /// expired).
    async fn get(&self, tenant: &str, session: &str) -> Result<Option<Session>>;
    /// Writes every field of `writes` or none: each field's policy must hold and the
    /// limits must allow the result. Creates the session when needed and refreshes its TTL.
    async fn put(&self, tenant: &str, session: &str, writer: &Writer, writes: Vec<FieldWrite>) -> Result<Written>;
    /// Deletes the named fields (none of which may be locked), or the whole session when
    /// `fields` is empty. Returns the version of the delete, or `None` when there was
    /// nothing to delete.
    async fn delete(&self, tenant: &str, session: &str, fields: &[String]) -> Result<Option<Version>>;
    /// The changes of the session with a version above `after`, in order, each once; then
    /// live changes. Ends after [`Change::Ended`]; fails with `Compacted` when changes after
    /// `after` are no longer kept.
    async fn watch(&self, tenant: &str, session: &str, after: Version) -> Result<ChangeStream>;
    /// How many sessions of the tenant are live now (what its cap counts), for metrics.
    async fn live_sessions(&self, tenant: &str) -> Result<u64>;
}

/// Checks a tenant, session or field name: 1 to [`MAX_NAME_LEN`] characters of
/// `[A-Za-z0-9._@-]`.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    let invalid = |reason: &str| Err(SessionError::Invalid { field: what.to_string(), reason: reason.to_string() });
    if name.is_empty() {
        return invalid("must not be empty");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid(&format!("longer than {MAX_NAME_LEN} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@')) {
        return invalid("may contain only letters, digits and . _ - @");
    }
    Ok(())
}

/// The checks of a write that need no stored state: names, duplicates, field sizes.
pub fn check_write(limits: &Limits, tenant: &str, session: &str, writes: &[FieldWrite]) -> Result<()> {
    check_name("tenant", tenant)?;
    check_name("session", session)?;
    if writes.is_empty() {
        return Err(SessionError::Invalid {
            field: "fields".into(),
            reason: "a write needs at least one field".into(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for write in writes {
        check_name("field", &write.name)?;
        if !seen.insert(write.name.as_str()) {
            return Err(SessionError::Invalid {
                field: "fields".into(),
                reason: format!("field {:?} is written twice", write.name),
            });
        }
        if write.content_type.len() > MAX_NAME_LEN {
            return Err(SessionError::Invalid {
                field: "content_type".into(),
                reason: format!("longer than {MAX_NAME_LEN} characters"),
            });
        }
        let size = Field::size(&write.name, &write.value, &write.content_type);
        if size > limits.max_field_bytes {
            return Err(SessionError::FieldTooLarge { field: write.name.clone(), size, limit: limits.max_field_bytes });
        }
    }
    Ok(())
}

/// Applies `writes` to `current` (the session as stored, `None` when absent): checks every
/// policy and limit and returns the session's new size and field count. The backends that
/// read before writing share this one decision.
pub fn evaluate(limits: &Limits, current: Option<&Session>, writes: &[FieldWrite]) -> Result<(usize, usize)> {
    evaluate_by(limits, current, |name, f| Field::size(name, &f.value, &f.content_type), writes)
}

/// [`evaluate`] with each stored field's size given by `size_of` (for a backend that knows
/// the sizes of fields whose values it does not hold).
pub fn evaluate_by(
    limits: &Limits,
    current: Option<&Session>,
    size_of: impl Fn(&str, &Field) -> usize,
    writes: &[FieldWrite],
) -> Result<(usize, usize)> {
    let empty = Session::default();
    let current = current.unwrap_or(&empty);
    let mut size: usize = current.fields.iter().map(|(name, f)| size_of(name, f)).sum();
    let mut count = current.fields.len();
    for write in writes {
        match current.fields.get(&write.name) {
            Some(field) => {
                if field.locked || write.policy == WritePolicy::FirstWriter {
                    return Err(SessionError::FieldLocked {
                        field: write.name.clone(),
                        writer: field.writer.clone(),
                        version: field.version,
                    });
                }
                if let WritePolicy::CompareAndSet { expected } = write.policy
                    && expected != field.version
                {
                    return Err(SessionError::Conflict { field: write.name.clone(), expected, current: field.version });
                }
                size = size.saturating_sub(size_of(&write.name, field));
            }
            None => {
                if let WritePolicy::CompareAndSet { expected } = write.policy
                    && expected != 0
                {
                    return Err(SessionError::Conflict { field: write.name.clone(), expected, current: 0 });
                }
                count += 1;
            }
        }
        size += Field::size(&write.name, &write.value, &write.content_type);
    }
    if count > limits.max_fields {
        return Err(SessionError::TooManyFields { count, limit: limits.max_fields });
    }
    if size > limits.max_session_bytes {
        return Err(SessionError::SessionTooLarge { size, limit: limits.max_session_bytes });
    }
    Ok((size, count))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(version: Version, locked: bool) -> Field {
        Field {
            value: Bytes::from_static(b"v"),
            content_type: String::new(),
            version,
            writer: Writer::new("a", "a-1"),
            written_at_ms: 0,
            locked,
        }
    }

    #[test]
    fn policies_decide_on_the_current_field() {
        let limits = Limits::default();
        let mut session = Session { version: 7, fields: BTreeMap::new() };
        session.fields.insert("open".into(), field(5, false));
        session.fields.insert("locked".into(), field(7, true));
        let write = |name: &str, policy| vec![FieldWrite::new(name, "x", policy)];

        assert!(evaluate(&limits, Some(&session), &write("open", WritePolicy::LastWriter)).is_ok());
        assert!(matches!(
            evaluate(&limits, Some(&session), &write("locked", WritePolicy::LastWriter)),
            Err(SessionError::FieldLocked { version: 7, .. })
        ));
        assert!(matches!(
            evaluate(&limits, Some(&session), &write("open", WritePolicy::FirstWriter)),
            Err(SessionError::FieldLocked { version: 5, .. })
        ));
        assert_eq!(
            evaluate(&limits, Some(&session), &write("open", WritePolicy::CompareAndSet { expected: 4 })),
            Err(SessionError::Conflict { field: "open".into(), expected: 4, current: 5 })
        );
        assert_eq!(
            evaluate(&limits, Some(&session), &write("new", WritePolicy::CompareAndSet { expected: 1 })),
            Err(SessionError::Conflict { field: "new".into(), expected: 1, current: 0 })
        );
        assert_eq!(
            evaluate(&limits, Some(&session), &write("new", WritePolicy::CompareAndSet { expected: 0 })),
            Ok((16, 3))
        );
    }

    #[test]
    fn names_and_sizes_are_checked_before_anything_is_read() {
        let limits = Limits { max_field_bytes: 10, ..Limits::default() };
        let ok = FieldWrite::new("a", "1234", WritePolicy::LastWriter);
        assert!(check_write(&limits, "t", "s", std::slice::from_ref(&ok)).is_ok());
        assert!(matches!(
            check_write(&limits, "t", "s/x", std::slice::from_ref(&ok)),
            Err(SessionError::Invalid { .. })
        ));
        assert!(matches!(check_write(&limits, "t", "s", &[ok.clone(), ok.clone()]), Err(SessionError::Invalid { .. })));
        let big = FieldWrite::new("a", "12345678901", WritePolicy::LastWriter);
        assert_eq!(
            check_write(&limits, "t", "s", &[big]),
            Err(SessionError::FieldTooLarge { field: "a".into(), size: 12, limit: 10 })
        );
    }
}
