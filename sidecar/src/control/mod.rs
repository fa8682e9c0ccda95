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
//! revision. After a reconnection the sidecar's own loop holds removals for a grace period
//! ([`crate::grace`]), so records lost to lease expiry during a long outage stay routable
//! until their sidecars register them again.

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

use crate::grace::Held;

/// The largest message taken from control: a snapshot part (control sends a large tenant's
/// snapshot in parts of about 1 MiB; one instance larger than that travels alone), or a
/// delta of one revision.
pub const MAX_CONTROL_MESSAGE: usize = 16 * 1024 * 1024;

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
        let endpoints = channels
            .iter()
            .map(|(uri, c)| (uri.clone(), ControlClient::new(c.clone()).max_decoding_message_size(MAX_CONTROL_MESSAGE)))
            .collect();
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
    /// Removals held after a reconnection ([`crate::grace`]).
    pub held_removals: AtomicU64,
    /// Held removals applied because their instance did not register again in time.
    pub held_expired: AtomicU64,
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
    shutdown: watch::Receiver<bool>,
) {
    run_watch_holding(control, request, table, revision_tx, stats, observer, Duration::ZERO, shutdown).await
}

/// [`run_watch_observed`], holding the removals that arrive within `removal_grace` after
/// a reconnection (see [`crate::grace`]); zero applies every removal at once.
#[allow(clippy::too_many_arguments)]
pub async fn run_watch_holding(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    observer: Option<WatchObserver>,
    removal_grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut held = Some(Held::new(removal_grace));
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
                if let Some(h) = held.as_mut() {
                    h.connected(tokio::time::Instant::now());
                }
                tracing::info!(control = %uri, revision = table.load().revision, "watching routing state");
                let mut stream = resp.into_inner();
                let mut parts = SnapshotParts::default();
                loop {
                    let next_release = held.as_ref().and_then(Held::next_deadline);
                    let msg = tokio::select! {
                        _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                        m = stream.message() => m,
                        _ = sleep_until_some(next_release) => {
                            if let Some(h) = held.as_mut() {
                                release_held(&table, h, &stats, tokio::time::Instant::now());
                                revision_tx.send_replace(table.load().revision);
                            }
                            continue;
                        }
                    };
                    match msg {
                        Ok(Some(event)) => {
                            failures = 0;
                            // Take every event already received, and apply them in one
                            // table build, off the runtime's thread: a burst of changes
                            // (thousands of registrations) costs one rebuild, not one each.
                            // The parts of a snapshot are gathered first.
                            let mut events = Vec::new();
                            let mut ended = None;
                            let mut next = Some(event);
                            while let Some(e) = next.take() {
                                match parts.gather(e) {
                                    Ok(Some(whole)) => events.push(whole),
                                    Ok(None) => {}
                                    Err(why) => {
                                        ended = Some(Err(Status::internal(why)));
                                        break;
                                    }
                                }
                                if events.len() >= MAX_BATCH {
                                    break;
                                }
                                match futures_util::FutureExt::now_or_never(stream.message()) {
                                    Some(Ok(Some(e))) => next = Some(e),
                                    Some(other) => ended = Some(other),
                                    None => {}
                                }
                            }
                            if events.is_empty() && ended.is_none() {
                                continue;
                            }
                            let (t, st) = (table.clone(), stats.clone());
                            let mut h = held.take().unwrap_or_else(|| Held::new(removal_grace));
                            h.live();
                            let now = tokio::time::Instant::now();
                            let applied = match tokio::task::spawn_blocking(move || {
                                let applied = apply_batch_holding(&t, events, &st, &mut h, now);
                                (applied, h)
                            })
                            .await
                            {
                                Ok((a, h)) => {
                                    held = Some(h);
                                    a
                                }
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

/// The parts of a snapshot received so far (see `Snapshot.more`).
#[derive(Default)]
pub struct SnapshotParts {
    gathered: Option<proto::Snapshot>,
}

impl SnapshotParts {
    /// Takes one event: a whole event to apply, nothing while a snapshot's parts are still
    /// arriving, or why the stream is broken (a part of another revision, or a delta in the
    /// middle of a snapshot).
    pub fn gather(&mut self, event: proto::WatchEvent) -> Result<Option<proto::WatchEvent>, String> {
        let part = match event.event {
            Some(proto::watch_event::Event::Snapshot(part)) => part,
            other => {
                if self.gathered.is_some() {
                    return Err("control sent a delta in the middle of a snapshot".into());
                }
                return Ok(Some(proto::WatchEvent { event: other }));
            }
        };
        let whole = match self.gathered.take() {
            None => part,
            Some(mut whole) => {
                if whole.revision != part.revision || whole.resync != part.resync {
                    return Err(format!(
                        "a snapshot part at revision {} follows parts at revision {}",
                        part.revision, whole.revision
                    ));
                }
                whole.instances.extend(part.instances);
                whole.policies.extend(part.policies);
                whole.more = part.more;
                whole
            }
        };
        if whole.more {
            self.gathered = Some(whole);
            return Ok(None);
        }
        Ok(Some(proto::WatchEvent { event: Some(proto::watch_event::Event::Snapshot(whole)) }))
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
    apply_batch_holding(table, events, stats, &mut Held::new(Duration::ZERO), tokio::time::Instant::now())
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Removes the held instances whose grace ended by `now` (the table keeps its revision).
fn release_held(table: &TableHandle, held: &mut Held, stats: &WatchStats, now: tokio::time::Instant) {
    let ended = held.expired(now);
    if ended.is_empty() {
        return;
    }
    let current = table.load_full();
    let mut instances: HashMap<String, Arc<Instance>> =
        current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect();
    for id in &ended {
        if instances.remove(id).is_some() {
            stats.held_expired.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(instance = %id, "a removal held after the reconnection applies: the instance did not register again");
        }
    }
    table.store(RoutingTable::build(current.revision, instances, current.policies.clone(), Some(&current)));
}

/// [`apply_batch`], holding removals as `held` decides (see [`crate::grace`]).
pub fn apply_batch_holding(
    table: &TableHandle,
    events: Vec<proto::WatchEvent>,
    stats: &WatchStats,
    held: &mut Held,
    now: tokio::time::Instant,
) -> Vec<Applied> {
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
                let mut inst: HashMap<String, Arc<Instance>> = s
                    .instances
                    .into_iter()
                    .filter_map(|p| instance_from_proto(p).map_err(|e| invalid("instance", &e)).ok())
                    .map(|i| (i.record.instance_id.clone(), Arc::new(i)))
                    .collect();
                for id in inst.keys() {
                    held.upserted(id);
                }
                // Instances the snapshot no longer has may only have lost their lease
                // during an outage: held after a reconnection.
                let before: Vec<(String, Arc<Instance>)> = match &instances {
                    Some(m) => m.iter().map(|(id, i)| (id.clone(), i.clone())).collect(),
                    None => current.instances.iter().map(|(id, m)| (id.clone(), m.instance.clone())).collect(),
                };
                for (id, i) in before {
                    if !inst.contains_key(&id) && held.hold(&id, now) {
                        stats.held_removals.fetch_add(1, Ordering::Relaxed);
                        inst.insert(id, i);
                    }
                }
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
                    if inst.contains_key(id) && held.hold(id, now) {
                        stats.held_removals.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    inst.remove(id);
                }
                for p in d.upserted {
                    match instance_from_proto(p) {
                        Ok(i) => {
                            held.upserted(&i.record.instance_id);
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

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach::model::fixture;

    fn wire(id: &str) -> proto::Instance {
        proto::Instance::from(&fixture::instance(id).agent("a").capability("c", &[]).build())
    }

    fn part(revision: i64, ids: &[&str], more: bool) -> proto::WatchEvent {
        proto::WatchEvent {
            event: Some(proto::watch_event::Event::Snapshot(proto::Snapshot {
                revision,
                instances: ids.iter().map(|id| wire(id)).collect(),
                more,
                ..Default::default()
            })),
        }
    }

    fn ids(event: &proto::WatchEvent) -> Vec<String> {
        match &event.event {
            Some(proto::watch_event::Event::Snapshot(s)) => s.instances.iter().map(|i| i.instance_id.clone()).collect(),
            _ => panic!("not a snapshot"),
        }
    }

    #[test]
    fn snapshot_parts_are_gathered_into_one_snapshot() {
        let mut parts = SnapshotParts::default();
        // A snapshot in one part passes through.
        assert_eq!(ids(&parts.gather(part(3, &["a"], false)).unwrap().unwrap()), ["a"]);
        assert!(parts.gather(part(5, &["a", "b"], true)).unwrap().is_none());
        assert!(parts.gather(part(5, &["c"], true)).unwrap().is_none());
        let whole = parts.gather(part(5, &["d"], false)).unwrap().unwrap();
        assert_eq!(ids(&whole), ["a", "b", "c", "d"]);
        // A part of another revision, or a delta, in the middle of a snapshot breaks it.
        assert!(parts.gather(part(6, &["a"], true)).unwrap().is_none());
        assert!(parts.gather(part(7, &["b"], false)).unwrap_err().contains("revision 7"));
        assert!(parts.gather(part(8, &["a"], true)).unwrap().is_none());
        let delta = proto::WatchEvent { event: Some(proto::watch_event::Event::Delta(proto::Delta::default())) };
        assert!(parts.gather(delta).unwrap_err().contains("delta"));
    }

    #[test]
    fn removals_after_a_reconnection_are_held_until_the_instance_returns() {
        let table = TableHandle::default();
        let stats = WatchStats::default();
        let mut held = Held::new(Duration::from_secs(10));
        let now = tokio::time::Instant::now();
        held.connected(now);
        let first = part(10, &["a-1", "b-1"], false);
        apply_batch_holding(&table, vec![first], &stats, &mut held, now);
        held.live();
        // Reconnected: a resync snapshot without a-1, and a delta removing b-1.
        held.connected(now);
        let delta = |revision, removed: &[&str], upserted: &[&str]| proto::WatchEvent {
            event: Some(proto::watch_event::Event::Delta(proto::Delta {
                revision,
                prev_revision: revision - 1,
                removed_instance_ids: removed.iter().map(|s| s.to_string()).collect(),
                upserted: upserted.iter().map(|id| wire(id)).collect(),
                ..Default::default()
            })),
        };
        apply_batch_holding(&table, vec![part(20, &["b-1"], false), delta(21, &["b-1"], &[])], &stats, &mut held, now);
        assert_eq!(stats.held_removals.load(Ordering::Relaxed), 2);
        let mut now_ids: Vec<String> = table.load().instances.keys().cloned().collect();
        now_ids.sort();
        assert_eq!(now_ids, ["a-1", "b-1"], "both removals held");
        // a-1 registers again; b-1 does not and goes when its grace ends.
        apply_batch_holding(&table, vec![delta(22, &[], &["a-1"])], &stats, &mut held, now);
        release_held(&table, &mut held, &stats, now + Duration::from_secs(11));
        let left: Vec<String> = table.load().instances.keys().cloned().collect();
        assert_eq!(left, ["a-1"]);
        assert_eq!(table.load().revision, 22);
        assert_eq!(stats.held_expired.load(Ordering::Relaxed), 1);
    }
}
