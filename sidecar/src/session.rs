//! Session context on the local API (`GetSession`, `PutSession`, `DeleteSession`,
//! `WatchSession`) and the sidecar's cache of the sessions its own agents work on.
//!
//! Every request acts in the sidecar's tenant (a request naming another tenant is refused
//! with PERMISSION_DENIED). The writer of a write or delete is the instance its agent
//! credential proves (verified), else a registered instance the request names (not
//! verified); see [`session_writer`]. Control records it and decides with it which fields
//! it may write (the tenant policy's `session_writers`). Requests go to the control service's
//! `agentreach.v1.Sessions`, whose refusals (CONTEXT_FIELD_LOCKED, CONTEXT_CONFLICT, ...)
//! reach the agent unchanged.
//!
//! The cache: a session an agent here reads or writes, or that a call delivered here
//! carries ([`SessionCache::prewarm`]), is fetched once and then followed by a watch from
//! control, so later reads of it are answered from memory (`cached: true`) while the
//! watch is live and the cached version is at least the one asked for and at least the
//! version of this sidecar's own last write to it (read-your-writes). A watch that fails
//! drops its session from the cache (reads go to control again); a session not read for
//! [`IDLE`] is dropped with its watch; at most [`MAX_CACHED`] sessions are followed (to
//! follow another, the least recently read one is dropped).
//!
//! Metrics ([`SessionMetrics`], on the admin port's `/metrics`): cache reads by result,
//! prewarms, follow watches started and failed (a failed one is restarted by the session's
//! next read), writes and deletes by outcome (`ok` or the refusal's reason) and the number
//! of sessions followed.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_reach::proto;
use agent_reach::proto::sessions_client::SessionsClient;
use agent_reach::reason::{self, Reason};
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

use crate::control::{Failover, Rules};

use crate::session_writer::{self, SessionWriter};

mod absent;
mod metrics;
mod snapshot;

pub(crate) use metrics::SessionMetrics;

/// Sessions followed at once. Each is one watch stream on the sidecar's connection to
/// control, which serves at most 256 concurrent streams per connection by default
/// (`--max-concurrent-streams`) shared with the sidecar's routing watch, heartbeats, writes
/// and its agents' own session watches: a stream over the limit waits for a free one, so
/// following more sessions would stall everything else on that connection. To follow a new
/// session when full, the least recently read one is dropped (its reads go to control until
/// it is followed again).
pub const MAX_CACHED: usize = 128;
/// A session not read for this long stops being followed.
pub const IDLE: Duration = Duration::from_secs(300);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counters of the cache (exported as metrics and read by tests).
#[derive(Debug, Default)]
pub struct SessionStats {
    /// Reads answered from the cache.
    pub hits: AtomicU64,
    /// Reads that went to control.
    pub misses: AtomicU64,
    /// Sessions fetched because a call carrying them was delivered here.
    pub prewarms: AtomicU64,
    /// Prewarms not fetched: the session was found absent lately, or the caller's sidecar
    /// made its id for this call (it has no context yet).
    pub prewarms_skipped_absent: AtomicU64,
    /// Watches started to follow a cached session.
    pub watches_started: AtomicU64,
    /// Follow watches that failed or could not start (the session left the cache; its next
    /// read fetches it again and restarts the watch).
    pub watch_failures: AtomicU64,
    /// Calls delivered with their session ([`SessionCache::snapshot`]).
    pub snapshots: AtomicU64,
    /// Calls whose followed session was over the snapshot size limit (delivered without).
    pub snapshots_too_large: AtomicU64,
    /// Writes and deletes by outcome: "ok" or the refusal's reason.
    writes: Mutex<BTreeMap<&'static str, u64>>,
}

impl SessionStats {
    /// Writes and deletes that ended with `outcome` ("ok" or a reason such as
    /// `CONTEXT_FIELD_LOCKED`).
    pub fn writes(&self, outcome: &str) -> u64 {
        lock(&self.writes).get(outcome).copied().unwrap_or(0)
    }

    fn wrote<T>(&self, result: &Result<T, Status>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(status) => {
                reason::error_info(status).and_then(|i| Reason::parse(&i.reason)).map_or("OTHER", Reason::as_str)
            }
        };
        *lock(&self.writes).entry(outcome).or_default() += 1;
    }
}

/// A followed session.
struct Cached {
    version: u64,
    fields: BTreeMap<String, proto::SessionField>,
    /// The version of this sidecar's last write; the cache serves nothing older.
    written: u64,
    last_read: Instant,
    /// Ends the follow watch (the session was dropped to make room).
    stop: Arc<tokio::sync::Notify>,
}

/// The cache and the clients of control's Sessions service.
pub struct SessionCache {
    tenant: String,
    /// The sessions service of every control endpoint.
    control: Failover<SessionsClient<Channel>>,
    entries: Mutex<HashMap<String, Arc<Mutex<Cached>>>>,
    /// Sessions a prewarm found absent lately (not fetched again by prewarms for a while).
    absent: Mutex<absent::Absent>,
    stats: SessionStats,
    shutdown: watch::Receiver<bool>,
}

impl SessionCache {
    /// Clients of every control endpoint on `channels` (the control clients' own, so TLS
    /// with the sidecar's certificate when it has one); nothing is dialled until used.
    pub fn new(
        tenant: String,
        channels: Vec<(String, Channel)>,
        timeout: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> Result<SessionCache, String> {
        let endpoints = channels.into_iter().map(|(uri, c)| (uri, SessionsClient::new(c))).collect();
        let control = Failover::new(endpoints, timeout, Rules::Agent)?;
        Ok(SessionCache {
            tenant,
            control,
            entries: Mutex::new(HashMap::new()),
            absent: Mutex::new(absent::Absent::default()),
            stats: SessionStats::default(),
            shutdown,
        })
    }

    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Calls control, trying each endpoint once while they answer UNAVAILABLE or time out
    /// ([`Failover`]).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(SessionsClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.control.call(f).await
    }

    /// The tenant a request acts in: the sidecar's own.
    fn tenant(&self, requested: &str) -> Result<String, Status> {
        if !requested.is_empty() && requested != self.tenant {
            return Err(reason::status(
                Reason::PermissionDenied,
                format!("this sidecar serves tenant {:?}, not {requested:?}", self.tenant),
                &[("tenant", requested.to_string())],
            ));
        }
        Ok(self.tenant.clone())
    }

    fn entry(&self, session: &str) -> Option<Arc<Mutex<Cached>>> {
        lock(&self.entries).get(session).cloned()
    }

    /// `GetSession`: from the cache when it is fresh enough, else from control (and the
    /// session is followed from then on).
    pub async fn get(self: &Arc<Self>, r: proto::GetSessionRequest) -> Result<proto::GetSessionReply, Status> {
        self.tenant(&r.tenant)?;
        if r.session_id.is_empty() {
            return Err(reason::invalid_argument("session_id", "must not be empty"));
        }
        if let Some(entry) = self.entry(&r.session_id) {
            let mut cached = lock(&entry);
            if cached.version >= r.min_version.max(cached.written) {
                cached.last_read = Instant::now();
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(reply(&cached, &r.fields, true));
            }
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let fetched = self.fetch(&r.session_id).await?;
        Ok(match fetched {
            Some(entry) => reply(&lock(&entry), &r.fields, false),
            None => proto::GetSessionReply::default(),
        })
    }

    /// Reads the whole session from control and follows it; `None` when it does not exist.
    async fn fetch(self: &Arc<Self>, session: &str) -> Result<Option<Arc<Mutex<Cached>>>, Status> {
        let request = proto::GetSessionRequest {
            tenant: self.tenant.clone(),
            session_id: session.to_string(),
            ..Default::default()
        };
        let fetched = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.get_session(request).await }
            })
            .await?;
        if !fetched.found {
            return Ok(None);
        }
        let fields: BTreeMap<_, _> = fetched.fields.into_iter().map(|f| (f.name.clone(), f)).collect();
        let mut entries = lock(&self.entries);
        if let Some(entry) = entries.get(session) {
            let entry = entry.clone();
            drop(entries);
            let mut cached = lock(&entry);
            if fetched.version > cached.version {
                cached.version = fetched.version;
                cached.fields = fields;
            }
            drop(cached);
            return Ok(Some(entry));
        }
        let stop = Arc::new(tokio::sync::Notify::new());
        let entry = Arc::new(Mutex::new(Cached {
            version: fetched.version,
            fields,
            written: 0,
            last_read: Instant::now(),
            stop: stop.clone(),
        }));
        if entries.len() >= MAX_CACHED {
            let oldest = entries.iter().min_by_key(|(_, e)| lock(e).last_read).map(|(id, _)| id.clone());
            if let Some(evicted) = oldest.and_then(|id| entries.remove(&id)) {
                // A stored permit: the watch ends even if it has not started waiting yet.
                lock(&evicted).stop.notify_one();
            }
        }
        entries.insert(session.to_string(), entry.clone());
        tokio::spawn(self.clone().follow(session.to_string(), entry.clone(), stop, fetched.version));
        Ok(Some(entry))
    }

    /// Keeps a cached session fresh from control's watch until it ends, fails, goes idle,
    /// is dropped to make room (`stop`) or the sidecar stops; then drops it from the cache.
    async fn follow(
        self: Arc<Self>,
        session: String,
        entry: Arc<Mutex<Cached>>,
        stop: Arc<tokio::sync::Notify>,
        from: u64,
    ) {
        let request = proto::WatchSessionRequest {
            tenant: self.tenant.clone(),
            session_id: session.clone(),
            after_version: from,
        };
        let stream = self
            .call(|mut c| {
                let request = request.clone();
                async move { c.watch_session(request).await }
            })
            .await;
        let mut shutdown = self.shutdown.clone();
        let mut failed = stream.is_err();
        if let Ok(mut stream) = stream {
            self.stats.watches_started.fetch_add(1, Ordering::Relaxed);
            loop {
                let idle_at = lock(&entry).last_read + IDLE;
                let next = tokio::select! {
                    _ = shutdown.wait_for(|stop| *stop) => break,
                    _ = stop.notified() => break,
                    _ = tokio::time::sleep_until(idle_at) => {
                        if lock(&entry).last_read + IDLE <= Instant::now() { break }
                        continue;
                    }
                    next = stream.next() => next,
                };
                let Some(Ok(change)) = next else {
                    failed = true;
                    break;
                };
                if change.ended {
                    break;
                }
                let mut cached = lock(&entry);
                if change.version > cached.version {
                    cached.version = change.version;
                    for name in change.removed {
                        cached.fields.remove(&name);
                    }
                    for field in change.put {
                        cached.fields.insert(field.name.clone(), field);
                    }
                }
            }
        }
        if failed && !*self.shutdown.borrow() {
            self.stats.watch_failures.fetch_add(1, Ordering::Relaxed);
        }
        let mut entries = lock(&self.entries);
        if entries.get(&session).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
            entries.remove(&session);
        }
    }

    /// Fetches and follows `session` (when not followed yet) before a call carrying it is
    /// delivered. Returns whether it fetched. A session found absent is not fetched again
    /// by prewarms for [`absent::ABSENT_FOR`] (see [`absent`]).
    pub async fn prewarm(self: &Arc<Self>, session: &str) -> bool {
        if session.is_empty() || self.entry(session).is_some() {
            return false;
        }
        if lock(&self.absent).remembers(session, Instant::now()) {
            self.stats.prewarms_skipped_absent.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.stats.prewarms.fetch_add(1, Ordering::Relaxed);
        match self.fetch(session).await {
            Ok(Some(_)) => true,
            Ok(None) => {
                lock(&self.absent).found_absent(session, Instant::now());
                false
            }
            Err(_) => false,
        }
    }

    /// Sessions remembered as absent (at most [`absent::MAX_ABSENT`]).
    pub fn absent_sessions(&self) -> usize {
        lock(&self.absent).len()
    }

    /// A call carrying a new session (see [`agent_reach::headers::SESSION_NEW`]) delivered
    /// without a prewarm.
    pub fn skipped_new(&self) {
        self.stats.prewarms_skipped_absent.fetch_add(1, Ordering::Relaxed);
    }

    fn written(self: &Arc<Self>, session: &str, version: u64) {
        lock(&self.absent).forget(session);
        if let Some(entry) = self.entry(session) {
            let mut cached = lock(&entry);
            cached.written = cached.written.max(version);
        } else {
            // An agent here works on this session: follow it.
            let this = self.clone();
            let session = session.to_string();
            tokio::spawn(async move {
                let _ = this.fetch(&session).await;
            });
        }
    }

    /// `PutSession` as `writer`, an instance registered here (see [`session_writer`]).
    pub(crate) async fn put(
        self: &Arc<Self>,
        mut r: proto::PutSessionRequest,
        writer: SessionWriter,
    ) -> Result<proto::PutSessionReply, Status> {
        r.tenant = self.tenant(&r.tenant)?;
        if !r.writer_agent.is_empty() && r.writer_agent != writer.agent {
            return Err(reason::invalid_argument("writer_agent", "is not the agent of the writer instance"));
        }
        (r.writer_agent, r.writer_instance, r.writer_verified) = (writer.agent, writer.instance, writer.verified);
        let session = r.session_id.clone();
        let written = self
            .call(|mut c| {
                let r = r.clone();
                async move { c.put_session(r).await }
            })
            .await;
        self.stats.wrote(&written);
        let written = written?;
        self.written(&session, written.version);
        Ok(written)
    }

    /// `DeleteSession` by `writer`, an instance registered here (see [`session_writer`]).
    pub(crate) async fn delete(
        self: &Arc<Self>,
        mut r: proto::DeleteSessionRequest,
        writer: SessionWriter,
    ) -> Result<proto::DeleteSessionReply, Status> {
        r.tenant = self.tenant(&r.tenant)?;
        (r.writer_agent, r.writer_instance, r.writer_verified) = (writer.agent, writer.instance, writer.verified);
        let session = r.session_id.clone();
        let deleted = self
            .call(|mut c| {
                let r = r.clone();
                async move { c.delete_session(r).await }
            })
            .await;
        self.stats.wrote(&deleted);
        let deleted = deleted?;
        if r.fields.is_empty() {
            lock(&self.entries).remove(&session);
        } else if deleted.deleted {
            self.written(&session, deleted.version);
        }
        Ok(deleted)
    }

    /// `WatchSession`: control's stream, passed through. When this sidecar stops, the
    /// stream ends with UNAVAILABLE / `SHUTTING_DOWN` whose metadata `resume_after_version`
    /// is the version of the last change it carried (the request's `after_version` when
    /// none): watching again from there (on this sidecar once it is back, or another) misses
    /// and repeats nothing.
    pub async fn watch(&self, mut r: proto::WatchSessionRequest) -> Result<ChangeStream, Status> {
        r.tenant = self.tenant(&r.tenant)?;
        let stream = self
            .call(|mut c| {
                let r = r.clone();
                async move { c.watch_session(r).await }
            })
            .await?;
        let state = (stream, self.shutdown.clone(), r.after_version, false);
        let stream = futures_util::stream::unfold(state, |(mut stream, mut shutdown, last, done)| async move {
            if done {
                return None;
            }
            let next = tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => None,
                next = stream.next() => Some(next),
            };
            match next {
                None => {
                    let status = reason::status(
                        Reason::ShuttingDown,
                        format!("the sidecar is stopping: watch again after version {last}"),
                        &[("resume_after_version", last.to_string())],
                    );
                    Some((Err(status), (stream, shutdown, last, true)))
                }
                Some(Some(Ok(change))) => {
                    let last = last.max(change.version);
                    Some((Ok(change), (stream, shutdown, last, false)))
                }
                Some(Some(Err(status))) => Some((Err(status), (stream, shutdown, last, true))),
                Some(None) => None,
            }
        });
        Ok(Box::pin(stream))
    }
}

/// A session's changes as the local API streams them.
pub type ChangeStream = Pin<Box<dyn Stream<Item = Result<proto::SessionChange, Status>> + Send>>;

fn reply(cached: &Cached, fields: &[String], from_cache: bool) -> proto::GetSessionReply {
    let fields = if fields.is_empty() {
        cached.fields.values().cloned().collect()
    } else {
        fields.iter().filter_map(|name| cached.fields.get(name).cloned()).collect()
    };
    proto::GetSessionReply { found: true, version: cached.version, fields, cached: from_cache }
}

/// The local API's session methods: `/agentreach.v1.Sidecar/{Get,Put,Delete,Watch}Session`.
pub(crate) const PATH_GET: &str = "/agentreach.v1.Sidecar/GetSession";
pub(crate) const PATH_PUT: &str = "/agentreach.v1.Sidecar/PutSession";
pub(crate) const PATH_DELETE: &str = "/agentreach.v1.Sidecar/DeleteSession";
pub(crate) const PATH_WATCH: &str = "/agentreach.v1.Sidecar/WatchSession";

/// Serves one session method of the local API.
pub(crate) async fn local_api(
    sessions: Arc<SessionCache>,
    registry: Arc<crate::registry::Registry>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<crate::grpc::Body> {
    match req.uri().path() {
        PATH_GET => {
            unary(req, move |r: tonic::Request<proto::GetSessionRequest>| {
                let sessions = sessions.clone();
                async move { sessions.get(r.into_inner()).await }
            })
            .await
        }
        PATH_PUT => {
            unary(req, move |r: tonic::Request<proto::PutSessionRequest>| {
                let (sessions, registry) = (sessions.clone(), registry.clone());
                async move {
                    let (metadata, _, r) = r.into_parts();
                    let writer = session_writer::writer(&registry, &metadata.into_headers(), &r.writer_instance)?;
                    sessions.put(r, writer).await
                }
            })
            .await
        }
        PATH_DELETE => {
            unary(req, move |r: tonic::Request<proto::DeleteSessionRequest>| {
                let (sessions, registry) = (sessions.clone(), registry.clone());
                async move {
                    let (metadata, _, r) = r.into_parts();
                    let writer = session_writer::writer(&registry, &metadata.into_headers(), &r.writer_instance)?;
                    sessions.delete(r, writer).await
                }
            })
            .await
        }
        _ => {
            struct Svc(Arc<SessionCache>);
            impl tonic::server::ServerStreamingService<proto::WatchSessionRequest> for Svc {
                type Response = proto::SessionChange;
                type ResponseStream = ChangeStream;
                type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<ChangeStream>, Status>> + Send>>;
                fn call(&mut self, r: tonic::Request<proto::WatchSessionRequest>) -> Self::Future {
                    let sessions = self.0.clone();
                    Box::pin(async move { sessions.watch(r.into_inner()).await.map(tonic::Response::new) })
                }
            }
            // StrictCodec: a request that does not decode is INVALID_ARGUMENT with a reason.
            let mut grpc = tonic::server::Grpc::new(agent_reach::codec::StrictCodec::<
                proto::SessionChange,
                proto::WatchSessionRequest,
            >::default());
            grpc.server_streaming(Svc(sessions), req).await.map(crate::grpc::Body::Tonic)
        }
    }
}

/// A unary method whose failures are statuses (control's pass through unchanged).
async fn unary<Req, Resp, F, Fut>(
    req: http::Request<hyper::body::Incoming>,
    handler: F,
) -> http::Response<crate::grpc::Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(tonic::Request<Req>) -> Fut + Send,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    struct Svc<F>(F);
    impl<Req, Resp, F, Fut> tonic::server::UnaryService<Req> for Svc<F>
    where
        F: FnMut(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        type Response = Resp;
        type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Resp>, Status>> + Send>>;
        fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
            let fut = (self.0)(request);
            Box::pin(async move { fut.await.map(tonic::Response::new) })
        }
    }
    let mut grpc = tonic::server::Grpc::new(agent_reach::codec::StrictCodec::<Resp, Req>::default());
    grpc.unary(Svc(handler), req).await.map(crate::grpc::Body::Tonic)
}
