//! [`EtcdStore`]: the [`Store`] trait over a real etcd (v3 API) through `etcd-client`.
//!
//! This is the one place where etcd's types and errors meet the crate's: every call is
//! bounded by [`EtcdOptions::request_timeout`] (a dead etcd gives `Unavailable`, never a
//! hang), gRPC errors become [`StoreError`]s, prefix reads are paged at one revision (so a
//! large registry never exceeds the client's message size limit), and lease keep-alives of
//! all callers are multiplexed over one long-lived etcd keep-alive stream (reopened when it
//! breaks) instead of one stream per call. Each watch is its own etcd watch stream,
//! cancelled when the [`WatchStream`] is dropped.
//!
//! It does not retry failed calls (callers decide), does not resume broken watches (the
//! stream ends with `Unavailable`; the caller re-watches from its last revision), and does
//! not configure TLS or authentication.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client as etcd;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tonic::Code;

use crate::embedded::whole_seconds;
use crate::{
    Compare, Event, EventKind, KeyValue, LeaseGrant, LeaseId, Op, Range, Result, Revision, Store, StoreError, Txn,
    TxnResult, WatchBatch, WatchStream,
};

/// Keys per page of a prefix read.
const PAGE_SIZE: i64 = 1000;
/// Attempts of a paged prefix read whose revision is compacted between pages.
const RANGE_ATTEMPTS: usize = 3;
/// HTTP/2 ping interval on the etcd connection while streams are open, so that a watch on
/// a silently dead connection fails. etcd rejects pings more often than every 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);
/// The key read (count only) to learn the store's current revision, and watched to learn
/// the compacted revision.
const REVISION_KEY: &str = "/agent-reach/";

/// Largest watch response accepted (a revision's events come in one response).
const MAX_WATCH_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// The largest page of a prefix read taken from etcd. A page of [`PAGE_SIZE`] keys larger
/// than this (large values) is read again in halves, down to one key per page.
const MAX_RANGE_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Keep-alive requests queued for the keep-alive stream before callers wait.
const KEEP_ALIVE_QUEUE: usize = 4096;

/// Where etcd is and how long to wait for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the etcd members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Longest wait for a TCP connection to a member.
    pub connect_timeout: Duration,
    /// Longest wait for the answer to one request; then the call fails with `Unavailable`.
    pub request_timeout: Duration,
    /// TLS to etcd (endpoints must then be `https://`).
    pub tls: Option<EtcdTls>,
    /// User name and password for etcd's authentication (etcd RBAC); none: no user.
    pub user: Option<EtcdUser>,
}

/// An etcd user and its password (the password is never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser").field("name", &self.name).finish_non_exhaustive()
    }
}

/// TLS material for the connection to etcd, as PEM.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA certificate(s) to verify the etcd members with; none = the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key, for etcd's client-certificate authentication.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            tls: None,
            user: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// A [`Store`] on etcd. Cheap to clone; clones share the connection and the keep-alive
/// stream, which closes when the last clone is dropped.
#[derive(Clone)]
pub struct EtcdStore {
    kv: etcd::KvClient,
    watch: etcd::WatchClient,
    lease: etcd::LeaseClient,
    keep_alives: mpsc::Sender<KeepAliveRequest>,
    request_timeout: Duration,
    endpoints: Arc<[String]>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to etcd and checks that it answers, so that a wrong endpoint fails start
    /// with `Unavailable` rather than the first request.
    pub async fn connect(options: EtcdOptions) -> Result<Self> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Invalid("no etcd endpoints given".to_owned()));
        }
        let mut connect = etcd::ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_keep_alive(PING_INTERVAL, options.request_timeout)
            // A member cut off from its cluster fails requests and watches instead of
            // serving stale data or keeping a watch silently stuck.
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            if let Some(plain) = options.endpoints.iter().find(|e| !e.starts_with("https://")) {
                return Err(StoreError::Invalid(format!("TLS is configured but endpoint {plain} is not https://")));
            }
            let mut config = etcd::TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                config = config.ca_certificate(etcd::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd::Identity::from_pem(cert, key));
            }
            connect = connect.with_tls(config);
        }
        if let Some(user) = &options.user {
            // etcd's auth tokens expire (simple tokens after 5 min idle, JWTs at their TTL):
            // a request that finds its token expired gets a new one and is retried once.
            connect = connect.with_user(user.name.clone(), user.password.clone()).with_auto_token_refresh(true);
        }
        let client = etcd::Client::connect(&options.endpoints, Some(connect)).await.map_err(|error| match error {
            etcd::Error::InvalidUri(error) => StoreError::Invalid(format!("invalid etcd endpoint: {error}")),
            other => to_store_error(other, None),
        })?;
        let (keep_alives, requests) = mpsc::channel(KEEP_ALIVE_QUEUE);
        tokio::spawn(
            KeepAliveMux {
                client: client.lease_client(),
                requests,
                request_timeout: options.request_timeout,
                stream: None,
                waiting: HashMap::new(),
                waiting_count: 0,
                stall_deadline: None,
            }
            .run(),
        );
        let store = Self {
            kv: client.kv_client().max_decoding_message_size(MAX_RANGE_MESSAGE_BYTES),
            watch: client.watch_client().max_decoding_message_size(MAX_WATCH_MESSAGE_BYTES),
            lease: client.lease_client(),
            keep_alives,
            request_timeout: options.request_timeout,
            endpoints: options.endpoints.into(),
        };
        match store.current_revision().await {
            Ok(_) => Ok(store),
            Err(StoreError::Unavailable(why)) => {
                Err(StoreError::Unavailable(format!("cannot reach etcd at {}: {why}", store.endpoints.join(","))))
            }
            Err(other) => Err(other),
        }
    }

    /// Awaits one etcd call within the request timeout, converting its error (`lease`
    /// names the lease a "lease not found" error is about).
    async fn request<T>(
        &self,
        what: &str,
        lease: Option<LeaseId>,
        call: impl Future<Output = Result<T, etcd::Error>>,
    ) -> Result<T> {
        match timeout(self.request_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(to_store_error(error, lease)),
            Err(_) => {
                Err(StoreError::Unavailable(format!("etcd did not answer {what} within {:?}", self.request_timeout)))
            }
        }
    }

    /// How far etcd has compacted, learned from a watch from revision 1 (etcd's compaction
    /// error does not say); `None` if that cannot be found out.
    async fn compacted_revision(&self) -> Option<Revision> {
        let mut client = self.watch.clone();
        let options = etcd::WatchOptions::new().with_start_revision(1);
        let probe = async {
            // A key inside the mesh's key space: see REVISION_KEY.
            let mut stream = client.watch(REVISION_KEY, Some(options)).await.ok()?;
            loop {
                let response = stream.message().await.ok()??;
                if response.compact_revision() > 0 {
                    return Some(response.compact_revision());
                }
                if response.canceled() {
                    return None;
                }
            }
        };
        timeout(self.request_timeout, probe).await.ok().flatten()
    }

    async fn range_once(&self, prefix: &str) -> Result<Range> {
        let (mut from, end) = prefix_range(prefix);
        let mut kvs = Vec::new();
        let mut revision = 0;
        let mut page_size = PAGE_SIZE;
        loop {
            let mut options = etcd::GetOptions::new().with_range(end.clone()).with_limit(page_size);
            if revision > 0 {
                // Later pages are read at the first page's revision: one consistent view.
                options = options.with_revision(revision);
            }
            let mut kv = self.kv.clone();
            let mut response = match self.request("get_prefix", None, kv.get(from.clone(), Some(options))).await {
                Err(StoreError::Invalid(why)) if page_size > 1 && why.contains("message length too large") => {
                    page_size /= 2;
                    continue;
                }
                other => other?,
            };
            if revision == 0 {
                revision = header_revision(response.header())?;
            }
            let more = response.more();
            let page = response.take_kvs();
            match page.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => {
                    kvs.extend(page.into_iter().map(key_value));
                    return Ok(Range { kvs, revision });
                }
            }
            kvs.extend(page.into_iter().map(key_value));
        }
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseGrant> {
        let secs = whole_seconds(ttl)?.as_secs();
        let ttl = i64::try_from(secs).map_err(|_| StoreError::Invalid(format!("lease TTL {secs}s is too large")))?;
        let mut lease = self.lease.clone();
        let granted = self.request("grant_lease", None, lease.grant(ttl, None)).await?;
        Ok(LeaseGrant { id: granted.id(), ttl: seconds(granted.ttl()) })
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        let (reply, answer) = oneshot::channel();
        let exchange = async {
            self.keep_alives
                .send(KeepAliveRequest { lease, reply })
                .await
                .map_err(|_| StoreError::Unavailable("the keep-alive task has ended".to_owned()))?;
            answer
                .await
                .map_err(|_| StoreError::Unavailable("the keep-alive stream closed before answering".to_owned()))?
        };
        match timeout(self.request_timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "etcd did not answer keep_alive within {:?}",
                self.request_timeout
            ))),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut client = self.lease.clone();
        self.request("revoke_lease", Some(lease), client.revoke(lease)).await?;
        Ok(())
    }

    async fn put(&self, key: &str, value: Bytes, lease: Option<LeaseId>) -> Result<Revision> {
        let mut options = etcd::PutOptions::new();
        if let Some(lease) = lease {
            options = options.with_lease(lease);
        }
        let mut kv = self.kv.clone();
        let response = self.request("put", lease, kv.put(key, Vec::from(value), Some(options))).await?;
        header_revision(response.header())
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.kv.clone();
        let mut response = self.request("get", None, kv.get(key, None)).await?;
        Ok(response.take_kvs().into_iter().next().map(key_value))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Range> {
        let mut attempt = 1;
        loop {
            match self.range_once(prefix).await {
                Err(StoreError::Compacted { .. }) if attempt < RANGE_ATTEMPTS => attempt += 1,
                Err(StoreError::Compacted { .. }) => {
                    return Err(StoreError::Unavailable(format!(
                        "prefix read of {prefix:?} kept racing with compaction"
                    )));
                }
                other => return other,
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<(Revision, bool)> {
        let mut kv = self.kv.clone();
        let response = self.request("delete", None, kv.delete(key, None)).await?;
        Ok((header_revision(response.header())?, response.deleted() > 0))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        // etcd's "lease not found" does not say which lease; name the first one involved.
        let lease = txn.success.iter().chain(&txn.failure).find_map(|op| match op {
            Op::Put { lease, .. } => *lease,
            Op::Delete { .. } => None,
        });
        let compares: Vec<etcd::Compare> = txn
            .compares
            .into_iter()
            .map(|compare| match compare {
                Compare::ModRevision(key, revision) => {
                    etcd::Compare::mod_revision(key, etcd::CompareOp::Equal, revision)
                }
                Compare::Value(key, value) => etcd::Compare::value(key, etcd::CompareOp::Equal, Vec::from(value)),
            })
            .collect();
        let request = etcd::Txn::new().when(compares).and_then(txn_ops(txn.success)).or_else(txn_ops(txn.failure));
        let mut kv = self.kv.clone();
        let response = self.request("txn", lease, kv.txn(request)).await?;
        Ok(TxnResult { succeeded: response.succeeded(), revision: header_revision(response.header())? })
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream> {
        if start_revision <= 0 {
            // etcd would take 0 as "from now"; the trait wants an explicit revision.
            return Err(StoreError::Invalid(format!("watch start revision must be positive, got {start_revision}")));
        }
        let (key, end) = prefix_range(prefix);
        let options = etcd::WatchOptions::new().with_range(end).with_start_revision(start_revision);
        let mut client = self.watch.clone();
        let mut stream = self.request("watch_prefix", None, client.watch(key, Some(options))).await?;
        let mut watch = EtcdWatch { next: start_revision, done: false };
        // Waits for etcd to confirm the watch, so that a dead etcd fails the call here.
        let first = match self.request("watch_prefix", None, stream.message()).await? {
            Some(first) => watch.step(first),
            None => return Err(StoreError::Unavailable("etcd closed the new watch".to_owned())),
        };
        let pending = match first {
            Step::Skip => None,
            Step::Batch(batch) => Some(Ok(batch)),
            Step::End(error) => return Err(error),
        };
        let state = (stream, watch, pending);
        let stream = futures_util::stream::unfold(state, |(mut stream, mut watch, pending)| async move {
            if let Some(item) = pending {
                return Some((item, (stream, watch, None)));
            }
            let item = watch.next(&mut stream).await?;
            Some((item, (stream, watch, None)))
        });
        // Dropping the stream drops etcd-client's watch stream, which resets the gRPC
        // stream; etcd then cancels the watch.
        Ok(Box::pin(stream))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut kv = self.kv.clone();
        match self.request("compact", None, kv.compact(revision, None)).await {
            Ok(_) => Ok(()),
            Err(StoreError::Compacted { .. }) => {
                let compacted = self.compacted_revision().await.unwrap_or(revision);
                Err(StoreError::Compacted { requested: revision, compacted: compacted.max(revision) })
            }
            Err(other) => Err(other),
        }
    }

    async fn current_revision(&self) -> Result<Revision> {
        let mut kv = self.kv.clone();
        let options = etcd::GetOptions::new().with_count_only();
        // Any key's answer carries the store revision; this one is inside the mesh's key
        // space, so an etcd user whose role covers only `/agent-reach/` may read it.
        let response = self.request("current_revision", None, kv.get(REVISION_KEY, Some(options))).await?;
        header_revision(response.header())
    }
}

/// The state of one watch as its responses arrive.
struct EtcdWatch {
    /// The first revision not yet delivered (what a compaction error reports as requested).
    next: Revision,
    done: bool,
}

enum Step {
    Batch(WatchBatch),
    /// A response without events (creation, progress).
    Skip,
    End(StoreError),
}

impl EtcdWatch {
    async fn next(&mut self, stream: &mut etcd::WatchStream) -> Option<Result<WatchBatch>> {
        if self.done {
            return None;
        }
        loop {
            let step = match stream.message().await {
                Ok(Some(response)) => self.step(response),
                Ok(None) => Step::End(StoreError::Unavailable("etcd closed the watch".to_owned())),
                Err(error) => Step::End(StoreError::Unavailable(format!("etcd watch broke: {error}"))),
            };
            match step {
                Step::Skip => continue,
                Step::Batch(batch) => return Some(Ok(batch)),
                Step::End(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }

    /// One etcd response as one batch: etcd never splits a revision across responses
    /// (fragmenting is not requested), so neither does this.
    fn step(&mut self, response: etcd::WatchResponse) -> Step {
        if response.compact_revision() > 0 {
            return Step::End(StoreError::Compacted { requested: self.next, compacted: response.compact_revision() });
        }
        if response.canceled() {
            let reason = response.cancel_reason();
            return Step::End(StoreError::Unavailable(format!("etcd cancelled the watch: {reason}")));
        }
        let events: Vec<Event> = response.events().iter().filter_map(event).collect();
        match events.last() {
            Some(last) => {
                self.next = last.kv.mod_revision + 1;
                Step::Batch(WatchBatch { events })
            }
            None => Step::Skip,
        }
    }
}

fn event(event: &etcd::Event) -> Option<Event> {
    let kind = match event.event_type() {
        etcd::EventType::Put => EventKind::Put,
        etcd::EventType::Delete => EventKind::Delete,
    };
    let kv = event.kv()?;
    Some(Event {
        kind,
        kv: KeyValue {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        },
    })
}

fn key_value(kv: etcd::KeyValue) -> KeyValue {
    let (create_revision, mod_revision) = (kv.create_revision(), kv.mod_revision());
    let (version, lease) = (kv.version(), kv.lease());
    let (key, value) = kv.into_key_value();
    // Keys written through this crate are strings; a foreign non-UTF-8 key is shown lossily
    // rather than failing the whole read.
    let key = String::from_utf8(key).unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned());
    KeyValue { key, value: Bytes::from(value), create_revision, mod_revision, version, lease }
}

fn txn_ops(ops: Vec<Op>) -> Vec<etcd::TxnOp> {
    ops.into_iter()
        .map(|op| match op {
            Op::Put { key, value, lease } => {
                let options = lease.map(|lease| etcd::PutOptions::new().with_lease(lease));
                etcd::TxnOp::put(key, Vec::from(value), options)
            }
            Op::Delete { key } => etcd::TxnOp::delete(key, None),
        })
        .collect()
}

fn header_revision(header: Option<&etcd::ResponseHeader>) -> Result<Revision> {
    header
        .map(etcd::ResponseHeader::revision)
        .ok_or_else(|| StoreError::Unavailable("etcd answered without a response header".to_owned()))
}

fn seconds(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

/// The key range `[key, end)` of everything under `prefix`, as etcd expects it.
fn prefix_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        // "\0" to "\0" is etcd's spelling of "every key".
        return (vec![0], vec![0]);
    }
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.as_bytes().to_vec(), end);
        }
    }
    // The prefix is all 0xff bytes: everything from it on.
    (prefix.as_bytes().to_vec(), vec![0])
}

/// Converts an etcd error; `lease` names the lease a "lease not found" error is about.
/// A compaction error's revisions are filled in by the caller that can know them.
fn to_store_error(error: etcd::Error, lease: Option<LeaseId>) -> StoreError {
    match error {
        etcd::Error::GRpcStatus(status) => {
            let message = status.message();
            match status.code() {
                Code::NotFound if message.contains("lease not found") => StoreError::LeaseNotFound(lease.unwrap_or(0)),
                Code::OutOfRange if message.contains("compacted") => {
                    StoreError::Compacted { requested: 0, compacted: 0 }
                }
                Code::InvalidArgument | Code::OutOfRange => StoreError::Invalid(format!("etcd: {message}")),
                code => StoreError::Unavailable(format!("etcd: {message} ({code:?})")),
            }
        }
        etcd::Error::LeaseKeepAliveError(message) if message.contains("lease not found") => {
            StoreError::LeaseNotFound(lease.unwrap_or(0))
        }
        etcd::Error::InvalidArgs(message) => StoreError::Invalid(format!("etcd: {message}")),
        other => StoreError::Unavailable(format!("etcd: {other}")),
    }
}

/// One caller's keep-alive, waiting for its answer.
struct KeepAliveRequest {
    lease: LeaseId,
    reply: oneshot::Sender<Result<Duration>>,
}

/// The open keep-alive stream: requests go through `keeper` (whose lease id is set per
/// request), answers come on `responses`, each naming its lease.
struct KeepAliveStream {
    keeper: etcd::LeaseKeeper,
    responses: etcd::LeaseKeepAliveStream,
}

/// Multiplexes every caller's keep-alive over one etcd keep-alive stream. etcd answers
/// each request on that stream, in order, with the lease id and its TTL (0 when the lease
/// is gone), so answers are routed to callers by lease id, first come first served. The
/// stream is opened on demand; when it fails, ends, or leaves callers unanswered for a
/// request timeout, every waiting caller gets `Unavailable` and the next request reopens it.
struct KeepAliveMux {
    client: etcd::LeaseClient,
    requests: mpsc::Receiver<KeepAliveRequest>,
    request_timeout: Duration,
    stream: Option<KeepAliveStream>,
    waiting: HashMap<LeaseId, VecDeque<oneshot::Sender<Result<Duration>>>>,
    waiting_count: usize,
    /// While callers wait: when the stream counts as stuck if no answer has come.
    stall_deadline: Option<Instant>,
}

enum MuxInput {
    Request(KeepAliveRequest),
    Response(Result<Option<etcd::LeaseKeepAliveResponse>, etcd::Error>),
    Stalled,
}

impl KeepAliveMux {
    /// Runs until every `EtcdStore` clone (every request sender) is dropped.
    async fn run(mut self) {
        loop {
            let input = match &mut self.stream {
                None => match self.requests.recv().await {
                    Some(request) => MuxInput::Request(request),
                    None => return,
                },
                Some(stream) => {
                    let stall = self.stall_deadline;
                    tokio::select! {
                        request = self.requests.recv() => match request {
                            Some(request) => MuxInput::Request(request),
                            None => return,
                        },
                        response = stream.responses.message() => MuxInput::Response(response),
                        () = tokio::time::sleep_until(stall.unwrap_or_else(Instant::now)),
                            if stall.is_some() => MuxInput::Stalled,
                    }
                }
            };
            match input {
                MuxInput::Request(request) => self.request(request).await,
                MuxInput::Response(Ok(Some(response))) => self.answer(&response),
                MuxInput::Response(Ok(None)) => {
                    self.reset(StoreError::Unavailable("etcd closed the keep-alive stream".into()));
                }
                MuxInput::Response(Err(error)) => {
                    self.reset(StoreError::Unavailable(format!("the etcd keep-alive stream broke: {error}")))
                }
                MuxInput::Stalled => self.reset(StoreError::Unavailable(format!(
                    "etcd did not answer keep-alives within {:?}",
                    self.request_timeout
                ))),
            }
        }
    }

    async fn request(&mut self, request: KeepAliveRequest) {
        if request.reply.is_closed() {
            return; // The caller gave up (timed out) while queued.
        }
        if self.stream.is_none() {
            // etcd-client opens the stream with a first keep-alive of this lease and waits
            // for its answer, but does not return the TTL: the request is sent again below.
            let lease = request.lease;
            match timeout(self.request_timeout, self.client.keep_alive(lease)).await {
                Ok(Ok((keeper, responses))) => {
                    self.stream = Some(KeepAliveStream { keeper, responses });
                }
                Ok(Err(error)) => return self.refuse(request, to_store_error(error, Some(lease))),
                Err(_) => {
                    let why = format!("etcd did not open a keep-alive stream within {:?}", self.request_timeout);
                    return self.refuse(request, StoreError::Unavailable(why));
                }
            }
        }
        let Some(stream) = self.stream.as_mut() else { return };
        stream.keeper.id = request.lease;
        match timeout(self.request_timeout, stream.keeper.keep_alive()).await {
            Ok(Ok(())) => {
                self.waiting.entry(request.lease).or_default().push_back(request.reply);
                self.waiting_count += 1;
                if self.stall_deadline.is_none() {
                    self.stall_deadline = Some(Instant::now() + self.request_timeout);
                }
            }
            Ok(Err(error)) => {
                let error = StoreError::Unavailable(format!("the etcd keep-alive stream broke: {error}"));
                let _ = request.reply.send(Err(error.clone()));
                self.reset(error);
            }
            Err(_) => {
                let error = StoreError::Unavailable("the etcd keep-alive stream is stuck".into());
                let _ = request.reply.send(Err(error.clone()));
                self.reset(error);
            }
        }
    }

    /// Answers a request that could not be sent; if etcd is unavailable, also answers
    /// every request already queued, rather than trying to open a stream for each.
    fn refuse(&mut self, request: KeepAliveRequest, error: StoreError) {
        let _ = request.reply.send(Err(error.clone()));
        if matches!(error, StoreError::Unavailable(_)) {
            while let Ok(queued) = self.requests.try_recv() {
                let _ = queued.reply.send(Err(error.clone()));
            }
        }
    }

    fn answer(&mut self, response: &etcd::LeaseKeepAliveResponse) {
        let lease = response.id();
        if let Some(queue) = self.waiting.get_mut(&lease) {
            if let Some(reply) = queue.pop_front() {
                self.waiting_count -= 1;
                let answer = match response.ttl() {
                    ttl if ttl > 0 => Ok(seconds(ttl)),
                    _ => Err(StoreError::LeaseNotFound(lease)),
                };
                let _ = reply.send(answer);
            }
            if queue.is_empty() {
                self.waiting.remove(&lease);
            }
        }
        self.stall_deadline = (self.waiting_count > 0).then(|| Instant::now() + self.request_timeout);
    }

    /// Drops the stream and fails every waiting caller; the next request reopens it.
    fn reset(&mut self, error: StoreError) {
        if self.waiting_count > 0 {
            tracing::warn!(%error, waiting = self.waiting_count, "etcd keep-alive stream reset");
        }
        self.stream = None;
        for reply in self.waiting.drain().flat_map(|(_, queue)| queue) {
            let _ = reply.send(Err(error.clone()));
        }
        self.waiting_count = 0;
        self.stall_deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_follow_etcd() {
        assert_eq!(prefix_range("a/"), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(""), (vec![0], vec![0]));
        assert_eq!(prefix_range("a\u{7f}"), (b"a\x7f".to_vec(), b"a\x80".to_vec()));
    }

    #[test]
    fn grpc_errors_map_to_store_errors() {
        let status = |code, message: &str| etcd::Error::GRpcStatus(tonic::Status::new(code, message));
        assert_eq!(
            to_store_error(status(Code::NotFound, "etcdserver: requested lease not found"), Some(7)),
            StoreError::LeaseNotFound(7)
        );
        assert!(matches!(
            to_store_error(status(Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"), None),
            StoreError::Compacted { .. }
        ));
        assert!(matches!(
            to_store_error(status(Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"), None),
            StoreError::Invalid(_)
        ));
        assert!(matches!(
            to_store_error(status(Code::Unavailable, "etcdserver: request timed out"), None),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            to_store_error(status(Code::InvalidArgument, "etcdserver: key is not provided"), None),
            StoreError::Invalid(_)
        ));
    }
}
