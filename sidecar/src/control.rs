//! The sidecar's side of the control service: a client over one or more control endpoints
//! (moving to the next one when a replica fails), and the watch loop that keeps the routing
//! table in step with the store.
//!
//! The watch loop applies a snapshot by replacing the whole table and deltas strictly in
//! revision order (a delta whose revision does not move forward is rejected and counted).
//! While control is unreachable it keeps the last table and reconnects with capped,
//! jittered backoff, resuming from the last applied revision.

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
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use agent_reach_routing::{Change, RoutingTable, TableHandle};

/// Clients of every configured control endpoint.
pub struct ControlClients {
    endpoints: Vec<(String, ControlClient<Channel>)>,
    current: AtomicUsize,
    timeout: Duration,
}

impl ControlClients {
    /// Lazily connecting clients; nothing is dialled until the first call.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<ControlClients, String> {
        let endpoints = endpoints
            .iter()
            .map(|e| {
                let uri = if e.contains("://") { e.clone() } else { format!("http://{e}") };
                let ep = Endpoint::from_shared(uri.clone())
                    .map_err(|err| format!("--control: bad endpoint {e:?}: {err}"))?
                    .tcp_nodelay(true)
                    .connect_timeout(timeout)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5));
                Ok((uri, ControlClient::new(ep.connect_lazy())))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if endpoints.is_empty() {
            return Err("--control: at least one endpoint is required".into());
        }
        Ok(ControlClients { endpoints, current: AtomicUsize::new(0), timeout })
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

    /// The client the watch loop should use after `failures` consecutive failures.
    fn for_watch(&self, failures: u32) -> (&str, ControlClient<Channel>) {
        let idx = (self.current.load(Ordering::Relaxed) + failures as usize) % self.endpoints.len();
        let (uri, client) = &self.endpoints[idx];
        (uri, client.clone())
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
    pub snapshots: AtomicU64,
    pub resyncs: AtomicU64,
    pub deltas: AtomicU64,
    pub rejected: AtomicU64,
    /// Unix milliseconds when the table was last known to match control (an event applied
    /// or a watch established); 0 = never.
    pub confirmed_at_ms: AtomicU64,
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

/// Keeps `table` in step with control until `shutdown` turns true.
pub async fn run_watch(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    loop {
        let (uri, mut client) = control.for_watch(failures);
        let uri = uri.to_string();
        let mut req = request.clone();
        req.from_revision = table.load().revision;
        let outcome = tokio::select! {
            _ = agent_reach::process::stopped(&mut shutdown) => return,
            r = client.watch(req) => r,
        };
        match outcome {
            Ok(resp) => {
                stats.connected.store(true, Ordering::Relaxed);
                stats.confirm();
                tracing::info!(control = %uri, "watching routing state");
                let mut stream = resp.into_inner();
                loop {
                    let msg = tokio::select! {
                        _ = agent_reach::process::stopped(&mut shutdown) => return,
                        m = stream.message() => m,
                    };
                    match msg {
                        Ok(Some(event)) => {
                            failures = 0;
                            apply(&table, event, &stats);
                            stats.confirm();
                            revision_tx.send_replace(table.load().revision);
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
        let wait = agent_reach::backoff::jittered(failures, Duration::from_millis(100), Duration::from_secs(5));
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = agent_reach::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Applies one watch event to the table.
pub fn apply(table: &TableHandle, event: proto::WatchEvent, stats: &WatchStats) {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        stats.invalid_instances.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("ignoring an invalid {what} from control: {e}");
    };
    let instances = |list: Vec<proto::Instance>| -> Vec<Instance> {
        list.into_iter().filter_map(|p| instance_from_proto(p).map_err(|e| invalid("instance", &e)).ok()).collect()
    };
    let policies = |list: Vec<proto::Policy>| -> Vec<Policy> {
        list.into_iter().filter_map(|p| policy_from_proto(p).map_err(|e| invalid("policy", &e)).ok()).collect()
    };
    match event.event {
        Some(proto::watch_event::Event::Snapshot(s)) => {
            let instances: HashMap<String, Arc<Instance>> =
                instances(s.instances).into_iter().map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect();
            let policies: HashMap<(PolicyKind, String), Arc<Policy>> =
                policies(s.policies).into_iter().map(|p| ((p.kind, p.name.clone()), Arc::new(p))).collect();
            tracing::info!(
                revision = s.revision,
                instances = instances.len(),
                policies = policies.len(),
                resync = s.resync,
                "applied snapshot"
            );
            let previous = table.load_full();
            table.store(RoutingTable::build(s.revision, instances, policies, Some(&previous)));
            stats.snapshots.fetch_add(1, Ordering::Relaxed);
            if s.resync {
                stats.resyncs.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(proto::watch_event::Event::Delta(d)) => {
            let current = table.load_full();
            if d.revision <= current.revision {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    revision = d.revision,
                    table = current.revision,
                    "rejected a delta that does not move forward"
                );
                return;
            }
            let removed_policies = d
                .removed_policies
                .into_iter()
                .filter_map(|r| match policy_kind_from_i32("kind", r.kind) {
                    Ok(kind) => Some((kind, r.name)),
                    Err(e) => {
                        invalid("policy reference", &e);
                        None
                    }
                })
                .collect();
            table.store(current.apply(Change {
                revision: d.revision,
                upserted: instances(d.upserted),
                removed: d.removed_instance_ids,
                upserted_policies: policies(d.upserted_policies),
                removed_policies,
            }));
            stats.deltas.fetch_add(1, Ordering::Relaxed);
        }
        None => {}
    }
}
