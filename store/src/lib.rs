//! The store behind the control service: the subset of etcd that Agent-Reach uses.
//!
//! [`Store`] offers revisions, leases with expiry, prefix reads, compare-and-swap
//! transactions and prefix watches that resume from a revision. Two backends implement it
//! and pass one conformance suite ([`conformance`], feature `test-util`):
//! - [`EtcdStore`]: a real etcd cluster through `etcd-client` (production);
//! - [`EmbeddedStore`]: an in-process equivalent (dev default, no etcd needed).
//!
//! This crate knows nothing of agents, tenants or protobuf: keys are strings and values are
//! bytes. The control service owns the key layout and the value encoding.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;

mod embedded;
mod etcd;

#[cfg(feature = "test-util")]
pub mod conformance;
#[cfg(feature = "test-util")]
pub mod testing;

pub use embedded::{EmbeddedOptions, EmbeddedStore};
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls, EtcdUser};

/// A store revision: increases by one with every write that changes something.
pub type Revision = i64;
/// A lease id; keys attached to a lease are deleted when it expires or is revoked.
pub type LeaseId = i64;

/// One key with its value and revisions, as etcd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the write that created the key (since its last deletion).
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
    /// Number of writes since creation (1 after the first put).
    pub version: i64,
    /// Lease the key is attached to, 0 for none.
    pub lease: LeaseId,
}

/// The result of a prefix read: the keys, in key order, at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub kvs: Vec<KeyValue>,
    /// The store's revision when the read was served.
    pub revision: Revision,
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    pub id: LeaseId,
    pub ttl: Duration,
}

/// Kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a watch. For a delete, `kv.value` is empty and `kv.mod_revision`
/// is the revision of the deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
}

/// Events delivered together by a watch, in revision order (all events of a revision are
/// in the same batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    pub events: Vec<Event>,
}

/// A watch: batches of events in revision order, never with gaps. Ends with
/// `Err(StoreError::Compacted)` if the watcher fell behind compaction, or with
/// `Err(StoreError::Unavailable)` if the store went away.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchBatch, StoreError>> + Send>>;

/// A condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's mod revision equals this; 0 means the key does not exist.
    ModRevision(String, Revision),
    /// The key's value equals this (false when the key does not exist).
    Value(String, Bytes),
}

/// An operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put { key: String, value: Bytes, lease: Option<LeaseId> },
    Delete { key: String },
}

/// If every compare holds, apply `success`, otherwise `failure`; atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

/// The outcome of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether the compares held (and `success` was applied).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
}

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The lease does not exist (never granted, expired or revoked).
    #[error("lease {0:x} not found")]
    LeaseNotFound(LeaseId),
    /// The requested revision has been compacted away.
    #[error("revision {requested} is compacted (oldest kept revision is {compacted})")]
    Compacted { requested: Revision, compacted: Revision },
    /// The request itself is wrong (empty key, zero TTL, future revision...).
    #[error("invalid store request: {0}")]
    Invalid(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The subset of etcd that Agent-Reach uses. Both backends behave the same on every method
/// (checked by [`conformance`]).
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// "etcd" or "embedded", for logs and metrics.
    fn backend(&self) -> &'static str;

    /// Grants a lease that expires `ttl` from now unless kept alive.
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseGrant>;
    /// Renews a lease for its full TTL; `LeaseNotFound` if it has expired or never existed.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration>;
    /// Revokes a lease and deletes its keys; `LeaseNotFound` if it does not exist.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Writes a key (optionally on a lease) and returns the new revision.
    async fn put(&self, key: &str, value: Bytes, lease: Option<LeaseId>) -> Result<Revision>;
    /// Reads one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;
    /// Reads every key under `prefix`, in key order, at one revision.
    async fn get_prefix(&self, prefix: &str) -> Result<Range>;
    /// Deletes a key; returns the store revision after the call and whether the key existed.
    async fn delete(&self, key: &str) -> Result<(Revision, bool)>;
    /// Runs a compare-and-swap transaction atomically.
    async fn txn(&self, txn: Txn) -> Result<TxnResult>;

    /// Watches every key under `prefix`, delivering all events with revision
    /// `>= start_revision` (`start_revision` must be > 0). Fails with `Compacted` (at once or
    /// as the stream's first item) when `start_revision` is older than the oldest kept
    /// revision.
    async fn watch_prefix(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream>;
    /// Discards history before `revision`; watches from older revisions then fail with
    /// `Compacted`.
    async fn compact(&self, revision: Revision) -> Result<()>;
    /// The store's current revision.
    async fn current_revision(&self) -> Result<Revision>;
}
