//! The sidecar's side of the control service: a client over one or more control endpoints
//! (moving to the next one when a replica fails), and the watch loop that keeps the routing
//! table in step with the store.
//!
//! The watch loop applies a snapshot by replacing the whole table and deltas strictly in
//! revision order: a delta whose revision does not move forward is rejected and counted,
//! and one that does not follow the table's revision (its `prev_revision` is newer than
//! the table) is refused, counted, and the stream resumed from the table's revision. While
//! control is unreachable it keeps the last table and reconnects with capped, jittered
//! backoff, to the next control endpoint each time, resuming from the last applied
//! revision.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use agent_reach::convert::{instance_from_proto, policy_from_proto, policy_kind_from_i32};
use agent_reach::model::Instance;
use agent_reach::policy::{Policy, PolicyKind};
use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach::proto::identity_client::IdentityClient;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use agent_reach_routing::{RoutingTable, TableHandle};

/// Clients of every configured control endpoint.
pub struct ControlClients {
    endpoints: Vec<(String, ControlClient<Channel>)>,
    /// The identity service on the same channels, in the same order.
    identity: Vec<IdentityClient<Channel>>,
    /// The channels themselves (TLS when the sidecar has an identity), for the other
    /// services of control the sidecar calls (sessions).
    channels: Vec<(String, Channel)>,
    current: AtomicUsize,
    timeout: Duration,
}

impl ControlClients {
    /// Lazily connecting clients; nothing is dialled until the first call.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<ControlClients, String> {
        ControlClients::with_tls(endpoints, timeout, None)
    }

    /// [`ControlClients::new`], over TLS with `tls`'s current configuration when given.
    pub fn with_tls(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<Arc<crate::identity::ControlTls>>,
    ) -> Result<ControlClients, String> {
        let channels = endpoints
            .iter()
            .map(|e| {
                let uri = if e.contains("://") { e.clone() } else { format!("http://{e}") };
                let ep = Endpoint::from_shared(uri.clone())
                    .map_err(|err| format!("--control: bad endpoint {e:?}: {err}"))?
                    .tcp_nodelay(true)
                    .connect_timeout(timeout)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5));
                let channel = match &tls {
                    Some(tls) => ep.connect_with_connector_lazy(crate::identity::TlsConnector::control(tls.clone())),
                    None => ep.connect_lazy(),
                };
                Ok((uri, channel))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if channels.is_empty() {
            return Err("--control: at least one endpoint is required".into());
        }
        let identity = channels.iter().map(|(_, c)| IdentityClient::new(c.clone())).collect();
        let endpoints = channels.iter().map(|(uri, c)| (uri.clone(), ControlClient::new(c.clone()))).collect();
        Ok(ControlClients { endpoints, identity, channels, current: AtomicUsize::new(0), timeout })
    }

    /// Every control endpoint with its (lazily connecting) channel, in order.
    pub(crate) fn channels(&self) -> Vec<(String, Channel)> {
        self.channels.clone()
    }

    /// Asks control's identity service for a certificate, trying each endpoint once while
    /// they answer UNAVAILABLE or time out.
    pub async fn issue_certificate(
        &self,
        request: proto::IssueCertificateRequest,
    ) -> Result<proto::IssueCertificateReply, Status> {
        let n = self.identity.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut last = Status::unavailable("no control endpoint");
        for i in 0..n {
            let mut client = self.identity[(start + i) % n].clone();
            match tokio::time::timeout(self.timeout, client.issue_certificate(request.clone())).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                Ok(Err(status)) if !failover(&status) => return Err(status),
                Ok(Err(status)) => last = status,
                Err(_) => last = Status::deadline_exceeded(format!("no answer within {:?}", self.timeout)),
            }
        }
        Err(last)
    }

    /// Calls control, trying each endpoint once (starting with the last one that worked)
    /// while they answer UNAVAILABLE or time out.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(ControlClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = self.current.load(Ordering::Relaxed);
        let n = self.endpoints.len();
        let mut last = Status::unavailable("no control endpoint");
        for i in 0..n {
            let idx = (start + i) % n;
            let (uri, client) = &self.endpoints[idx];
            let status = match tokio::time::timeout(self.timeout, f(client.clone())).await {
                Ok(Ok(resp)) => {
                    self.current.store(idx, Ordering::Relaxed);
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) if !failover(&status) => return Err(status),
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {:?}", self.timeout)),
            };
            tracing::debug!(control = %uri, "control call failed: {}", status.message());
            last = Status::new(status.code(), format!("{uri}: {}", status.message()));
        }
        Err(last)
    }

    /// The endpoint at `index` (modulo the number of endpoints).
    fn endpoint(&self, index: usize) -> (&str, ControlClient<Channel>) {
        let (uri, client) = &self.endpoints[index % self.endpoints.len()];
        (uri, client.clone())
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
}

/// Whether a control error means "try another replica".
fn failover(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled)
}

/// Counters of the watch loop.
#[derive(Debug, Default)]
pub struct WatchStats {
    pub connected: AtomicBool,
    /// Watch streams opened (the first connection and every reconnection).
    pub connections: AtomicU64,
    pub snapshots: AtomicU64,
    /// Snapshots flagged `resync` (the sidecar's revision was compacted away).
    pub resyncs: AtomicU64,
    pub deltas: AtomicU64,
    /// Deltas whose revision did not move forward, rejected.
    pub rejected: AtomicU64,
    /// Unix milliseconds when the table was last known to match control (an event applied
    /// or a watch established); 0 = never.
    pub confirmed_at_ms: AtomicU64,
    /// Deltas that did not follow the table's revision (changes were missed): the stream
    /// is dropped and resumed from the table's revision.
    pub gaps: AtomicU64,
    /// Instances or policies from control that failed conversion and were skipped.
    pub invalid_instances: AtomicU64,
}

impl WatchStats {
    /// Records that the table matches control now.
    pub fn confirm(&self) {
        self.confirmed_at_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// Whether the table may be out of date (no live watch), and for how long it has not
    /// been confirmed.
    pub fn staleness(&self) -> (bool, Duration) {
        let stale = !self.connected.load(Ordering::Relaxed);
        let at = self.confirmed_at_ms.load(Ordering::Relaxed);
        let age = if at == 0 { Duration::ZERO } else { Duration::from_millis(unix_ms().saturating_sub(at)) };
        (stale, if stale { age } else { Duration::ZERO })
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What one watch event did to the table (for observers such as tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The table was replaced by a snapshot.
    Snapshot { revision: i64, resync: bool },
    /// A delta moved the table from `from` to `revision` with `changes` upserts and
    /// removals (0 for a delta that only moves the revision on).
    Delta { from: i64, revision: i64, changes: usize },
    /// A delta was refused: `Backwards` (its revision does not move forward) or `Gap` (it
    /// does not follow the table's revision).
    Refused { revision: i64, table: i64, gap: bool },
}

/// Called after every watch event, with what it did.
pub type WatchObserver = Arc<dyn Fn(&Applied) + Send + Sync>;

/// Keeps `table` in step with control until `shutdown` turns true.
pub async fn run_watch(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    shutdown: watch::Receiver<bool>,
) {
    run_watch_observed(control, request, table, revision_tx, stats, None, shutdown).await
}

/// [`run_watch`], telling `observer` what every event did.
///
/// It watches one control endpoint at a time and moves to the next one whenever its stream
/// fails or ends, after a jittered backoff that grows with consecutive failures (capped at
/// 5 s). Each connection resumes from the table's revision.
pub async fn run_watch_observed(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    observer: Option<WatchObserver>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    let mut endpoint = 0usize;
    loop {
        let (uri, mut client) = control.endpoint(endpoint);
        let uri = uri.to_string();
        let mut req = request.clone();
        req.from_revision = table.load().revision;
        let outcome = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            r = client.watch(req) => r,
        };
        match outcome {
            Ok(resp) => {
                stats.connected.store(true, Ordering::Relaxed);
                stats.confirm();
                stats.connections.fetch_add(1, Ordering::Relaxed);
                tracing::info!(control = %uri, revision = table.load().revision, "watching routing state");
                let mut stream = resp.into_inner();
                loop {
                    let msg = tokio::select! {
                        _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                        m = stream.message() => m,
                    };
                    match msg {
                        Ok(Some(event)) => {
                            failures = 0;
                            // Take every event already received, and apply them in one
                            // table build, off the runtime's thread: a burst of changes
                            // (thousands of registrations) costs one rebuild, not one each.
                            let mut events = vec![event];
                            let mut ended = None;
                            while events.len() < MAX_BATCH {
                                match futures_util::FutureExt::now_or_never(stream.message()) {
                                    Some(Ok(Some(e))) => events.push(e),
                                    Some(other) => {
                                        ended = Some(other);
                                        break;
                                    }
                                    None => break,
                                }
                            }
                            let (t, st) = (table.clone(), stats.clone());
                            let applied = match tokio::task::spawn_blocking(move || apply_batch(&t, events, &st)).await
                            {
                                Ok(a) => a,
                                Err(e) => {
                                    tracing::error!("applying watch events failed: {e}");
                                    break;
                                }
                            };
                            stats.confirm();
                            if let Some(observer) = &observer {
                                applied.iter().for_each(|a| observer(a));
                            }
                            revision_tx.send_replace(table.load().revision);
                            if applied.iter().any(|a| matches!(a, Applied::Refused { gap: true, .. })) {
                                tracing::warn!(control = %uri, "missed changes; resuming from revision {}", table.load().revision);
                                break;
                            }
                            match ended {
                                None => {}
                                Some(Ok(None)) => {
                                    tracing::warn!(control = %uri, "watch stream ended");
                                    break;
                                }
                                Some(Err(status)) => {
                                    tracing::warn!(control = %uri, "watch stream failed: {}", status.message());
                                    break;
                                }
                                Some(Ok(Some(_))) => {}
                            }
                        }
                        Ok(None) => {
                            tracing::warn!(control = %uri, "watch stream ended");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(control = %uri, "watch stream failed: {}", status.message());
                            break;
                        }
                    }
                }
                stats.connected.store(false, Ordering::Relaxed);
            }
            Err(status) => tracing::warn!(control = %uri, "cannot watch: {}", status.message()),
        }
        // The next attempt goes to the next replica.
        endpoint = endpoint.wrapping_add(1);
        let wait = agent_reach_support::backoff::jittered(failures, Duration::from_millis(100), Duration::from_secs(5));
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Watch events applied in one table build at most.
const MAX_BATCH: usize = 4096;

/// Applies one watch event to the table: a snapshot replaces it whole; a delta applies
/// only on top of the revision it follows.
pub fn apply(table: &TableHandle, event: proto::WatchEvent, stats: &WatchStats) -> Option<Applied> {
    apply_batch(table, vec![event], stats).pop()
}

/// Applies watch events in order, building the table once at the end: each snapshot
/// replaces everything before it, each delta applies only on top of the revision it
/// follows. Returns what each event did.
pub fn apply_batch(table: &TableHandle, events: Vec<proto::WatchEvent>, stats: &WatchStats) -> Vec<Applied> {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        stats.invalid_instances.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("ignoring an invalid {what} from control: {e}");
    };
    let current = table.load_full();
    let mut revision = current.revision;
    let mut instances: Option<HashMap<String, Arc<Instance>>> = None;
    let mut policies: Option<HashMap<(PolicyKind, String), Arc<Policy>>> = None;
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        match event.event {
            Some(proto::watch_event::Event::Snapshot(s)) => {
                let inst: HashMap<String, Arc<Instance>> = s
                    .instances
                    .into_iter()
                    .filter_map(|p| instance_from_proto(p).map_err(|e| invalid("instance", &e)).ok())
                    .map(|i| (i.record.instance_id.clone(), Arc::new(i)))
                    .collect();
                let pol: HashMap<(PolicyKind, String), Arc<Policy>> = s
                    .policies
                    .into_iter()
                    .filter_map(|p| policy_from_proto(p).map_err(|e| invalid("policy", &e)).ok())
                    .map(|p| ((p.kind, p.name.clone()), Arc::new(p)))
                    .collect();
                tracing::info!(
                    revision = s.revision,
                    instances = inst.len(),
                    policies = pol.len(),
                    resync = s.resync,
                    "applied snapshot"
                );
                instances = Some(inst);
                policies = Some(pol);
                revision = s.revision;
                stats.snapshots.fetch_add(1, Ordering::Relaxed);
                if s.resync {
                    stats.resyncs.fetch_add(1, Ordering::Relaxed);
                }
                out.push(Applied::Snapshot { revision: s.revision, resync: s.resync });
            }
            Some(proto::watch_event::Event::Delta(d)) => {
                if d.revision <= revision {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        revision = d.revision,
                        table = revision,
                        "rejected a delta that does not move forward"
                    );
                    out.push(Applied::Refused { revision: d.revision, table: revision, gap: false });
                    continue;
                }
                if d.prev_revision > revision {
                    stats.gaps.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        revision = d.revision,
                        follows = d.prev_revision,
                        table = revision,
                        "refused a delta that does not follow the table"
                    );
                    out.push(Applied::Refused { revision: d.revision, table: revision, gap: true });
                    // Nothing after a gap may apply: the table resumes from `revision`.
                    break;
                }
                let changes = d.upserted.len()
                    + d.removed_instance_ids.len()
                    + d.upserted_policies.len()
                    + d.removed_policies.len();
                let inst = instances.get_or_insert_with(|| {
                    current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect()
                });
                for id in &d.removed_instance_ids {
                    inst.remove(id);
                }
                for p in d.upserted {
                    match instance_from_proto(p) {
                        Ok(i) => {
                            inst.insert(i.record.instance_id.clone(), Arc::new(i));
                        }
                        Err(e) => invalid("instance", &e),
                    }
                }
                let pol = policies.get_or_insert_with(|| current.policies.clone());
                for r in d.removed_policies {
                    match policy_kind_from_i32("kind", r.kind) {
                        Ok(kind) => {
                            pol.remove(&(kind, r.name));
                        }
                        Err(e) => invalid("policy reference", &e),
                    }
                }
                for p in d.upserted_policies {
                    match policy_from_proto(p) {
                        Ok(p) => {
                            pol.insert((p.kind, p.name.clone()), Arc::new(p));
                        }
                        Err(e) => invalid("policy", &e),
                    }
                }
                stats.deltas.fetch_add(1, Ordering::Relaxed);
                out.push(Applied::Delta { from: revision, revision: d.revision, changes });
                revision = d.revision;
            }
            None => {}
        }
    }
    if revision != current.revision || instances.is_some() || policies.is_some() {
        let instances = instances
            .unwrap_or_else(|| current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect());
        let policies = policies.unwrap_or_else(|| current.policies.clone());
        table.store(RoutingTable::build(revision, instances, policies, Some(&current)));
    }
    out
}
