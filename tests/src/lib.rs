//! Harness for the end-to-end tests: a real etcd process (or the embedded store), a control
//! service and sidecars on 127.0.0.1 port 0, and sample agents built with the SDK.
//!
//! Everything runs in the test process except etcd, which is a real `etcd` binary started
//! by `agent_reach_store::testing::EtcdServer`; when etcd cannot start the test fails.
//!
//! Secure by default (see [`secure`]): controls started here require mutual TLS and Admin
//! tokens, sidecars started against them buy certificates with join tokens minted here, and
//! the raw clients speak TLS. Tests about plaintext use the `*_plaintext` functions.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::Instance;
use agent_reach::policy::{Policy, PolicyKind, PolicySpec};
use agent_reach::proto;
use agent_reach::proto::admin_client::AdminClient;
use agent_reach::proto::control_client::ControlClient;
use agent_reach::{Agent, Reply, RunningAgent};
use agent_reach_control::{ControlConfig, ControlHandle, ControlReplica, keys, record};
use agent_reach_sidecar::control::{Applied, ControlClients, WatchObserver, run_watch_observed};
use agent_reach_sidecar::{RoutingTable, Sidecar, SidecarConfig, TableHandle, WatchStats};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EmbeddedStore, EtcdOptions, EtcdStore, Store};
use tokio::net::TcpListener;
use tonic::transport::Channel;

pub mod browser;
pub mod fault;
pub mod secure;

/// Which store the control service runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Etcd,
    Embedded,
}

/// A store for a test, with the etcd process behind it when there is one.
pub struct TestStore {
    pub store: Arc<dyn Store>,
    pub etcd: Option<EtcdServer>,
}

impl TestStore {
    /// Starts a real etcd (and connects to it) or creates an embedded store. Panics with
    /// etcd's own words when etcd cannot start.
    pub async fn start(backend: Backend) -> TestStore {
        match backend {
            Backend::Embedded => TestStore { store: Arc::new(EmbeddedStore::default()), etcd: None },
            Backend::Etcd => {
                let etcd = tokio::task::spawn_blocking(EtcdServer::start)
                    .await
                    .expect("etcd start task")
                    .unwrap_or_else(|e| panic!("etcd is required for this test and did not start: {e}"));
                let store = EtcdStore::connect(EtcdOptions {
                    user: None,
                    tls: None,
                    endpoints: vec![etcd.endpoint()],
                    connect_timeout: Duration::from_secs(5),
                    request_timeout: Duration::from_secs(5),
                })
                .await
                .unwrap_or_else(|e| panic!("cannot connect to the test etcd at {}: {e}", etcd.endpoint()));
                TestStore { store: Arc::new(store), etcd: Some(etcd) }
            }
        }
    }

    /// The keys written (put or deleted) after `revision`, in revision order, except the
    /// sidecars' traffic reports: a sidecar stores one with a heartbeat every report
    /// interval whatever the test does, so a test asserting that refused calls wrote
    /// nothing asserts that this is empty rather than that the store's revision stayed put.
    pub async fn writes_since(&self, revision: i64) -> Vec<String> {
        use futures_util::StreamExt;
        let head = self.store.current_revision().await.expect("store revision");
        let mut written = Vec::new();
        if head <= revision {
            return written;
        }
        let mut watch = self.store.watch_prefix("/", revision + 1).await.expect("watch the store's history");
        let mut seen = revision;
        while seen < head {
            let batch = tokio::time::timeout(Duration::from_secs(5), watch.next())
                .await
                .expect("the store's history up to its head within 5 s")
                .expect("the history watch ended early")
                .expect("the store's history");
            for event in batch.events {
                seen = seen.max(event.kv.mod_revision);
                if event.kv.mod_revision <= head
                    && !event.kv.key.starts_with(agent_reach_control::reports::REPORTS_ROOT)
                {
                    written.push(event.kv.key);
                }
            }
        }
        written
    }
}

/// 127.0.0.1 on a free port. The address may be one an earlier test's control had (tests
/// of one process share the identity records of [`secure`]): its record is dropped, since
/// that control is gone once its port is free, so a control spawned here without the
/// harness is not taken for it.
pub async fn listener() -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    secure::forget(listener.local_addr().expect("listener address"));
    listener
}

/// Control on `store` with `lease_ttl`, mutual TLS required and Admin tokens (see [`secure`]).
pub async fn start_control(store: Arc<dyn Store>, lease_ttl: Duration) -> ControlHandle {
    start_control_on(store, lease_ttl, listener().await)
}

/// Control on a given listener (e.g. rebound on a port sidecars already point at), with
/// the harness's identity.
pub fn start_control_on(store: Arc<dyn Store>, lease_ttl: Duration, listener: TcpListener) -> ControlHandle {
    start_control_with(store, ControlConfig { lease_ttl, ..ControlConfig::default() }, listener)
}

/// Control with `config` on `listener`, with the harness's identity where `config` sets
/// none ([`secure::secure_config`]).
pub fn start_control_with(store: Arc<dyn Store>, config: ControlConfig, listener: TcpListener) -> ControlHandle {
    let addr = listener.local_addr().expect("control listener address");
    secure::remember(addr, Some(store.clone()));
    ControlHandle::spawn(store, secure::secure_config(config), listener).expect("control listener address")
}

/// PLAINTEXT control (explicit opt-in): no TLS, the Admin API open.
pub async fn start_control_plaintext(store: Arc<dyn Store>, lease_ttl: Duration) -> ControlHandle {
    start_control_on_plaintext(store, lease_ttl, listener().await)
}

/// PLAINTEXT control on a given listener (explicit opt-in).
pub fn start_control_on_plaintext(store: Arc<dyn Store>, lease_ttl: Duration, listener: TcpListener) -> ControlHandle {
    let addr = listener.local_addr().expect("control listener address");
    secure::forget(addr);
    ControlHandle::spawn(store, ControlConfig { lease_ttl, ..ControlConfig::default() }, listener)
        .expect("control listener address")
}

/// Sidecar settings for tests: fast heartbeats, probes and control timeouts.
pub fn sidecar_config(control: &str, id: &str) -> SidecarConfig {
    let mut c = SidecarConfig::new(vec![control.to_string()]);
    c.sidecar_id = id.to_string();
    c.heartbeat_interval = Duration::from_millis(200);
    c.probe_interval = Duration::from_millis(200);
    c.dead_after = Duration::from_secs(3);
    c.control_timeout = Duration::from_secs(1);
    c
}

/// A sidecar on free ports; with a certificate bought with a join token minted here when
/// its control was started with identity by the harness ([`secure::sidecar_identity`]).
pub async fn start_sidecar(config: SidecarConfig) -> Sidecar {
    let config = secure::sidecar_identity(config).await;
    Sidecar::start(config, listener().await, listener().await).await.expect("sidecar start")
}

/// A sidecar on free ports with an admin port (`/metrics`, `/healthz`, `/readyz`,
/// `/traces/{id}`), with identity as [`start_sidecar`].
pub async fn start_sidecar_with_admin(config: SidecarConfig) -> Sidecar {
    let config = secure::sidecar_identity(config).await;
    Sidecar::start_with_admin(config, listener().await, listener().await, Some(listener().await))
        .await
        .expect("sidecar start")
}

/// An agent whose handlers answer "<agent>@<instance>:<payload>" for each capability,
/// registered through the sidecar at `sidecar`.
pub async fn echo_agent(sidecar: SocketAddr, agent: &str, capabilities: &[(&str, &[&str])]) -> RunningAgent {
    let mut builder = Agent::builder(agent).version("1.0.0").sidecar(sidecar.to_string());
    for (cap, tags) in capabilities {
        let name = agent.to_string();
        builder = builder.capability(*cap, tags.iter().copied()).handle(*cap, move |call| {
            let name = name.clone();
            async move { Ok(Reply::text(format!("{name}@{}:{}", call.instance_id(), call.text()?))) }
        });
    }
    builder.register_timeout(Duration::from_secs(10)).start().await.expect("agent start")
}

/// Waits until `sidecar`'s table has exactly the instance ids `ids` (in any order).
pub async fn wait_for_instances(sidecar: &Sidecar, ids: &[String]) {
    wait_for_instances_within(sidecar, ids, Duration::from_secs(15)).await
}

/// [`wait_for_instances`], for up to `within` (an instance left to its lease goes only when
/// the lease ends).
pub async fn wait_for_instances_within(sidecar: &Sidecar, ids: &[String], within: Duration) {
    let mut want: Vec<String> = ids.to_vec();
    want.sort();
    sidecar
        .wait_for_table(within, |t| {
            let mut have: Vec<&String> = t.instances.keys().collect();
            have.sort();
            have == want.iter().collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| {
            let mut have: Vec<String> = sidecar.table().instances.keys().cloned().collect();
            have.sort();
            panic!("{e}: want {want:?}, have {have:?}")
        });
}

/// Writes a policy straight into the store (as the Admin API stores it) and waits until
/// every sidecar in `sidecars` has it in its table.
pub async fn put_policy(store: &Arc<dyn Store>, sidecars: &[&Sidecar], policy: Policy) {
    policy.validate().unwrap_or_else(|e| panic!("invalid test policy: {e}"));
    let key = agent_reach_control::keys::policy_key(&policy.tenant, policy.kind, &policy.name);
    store.put(&key, agent_reach_control::registry::encode_policy(&policy), None).await.expect("put policy");
    wait_for_policy(sidecars, &policy).await;
}

/// Waits until every one of `sidecars` has exactly `policy` in its routing table.
pub async fn wait_for_policy(sidecars: &[&Sidecar], policy: &Policy) {
    for sc in sidecars {
        sc.wait_for_table(Duration::from_secs(10), |t| {
            t.policy(policy.kind, &policy.name).is_some_and(|p| **p == *policy)
        })
        .await
        .expect("policy reached the sidecar");
    }
}

/// A capability policy of the default tenant.
pub fn capability_policy(capability: &str, spec: PolicySpec) -> Policy {
    Policy {
        tenant: "default".into(),
        kind: PolicyKind::Capability,
        name: capability.into(),
        spec,
        description: String::new(),
    }
}

/// An agent in its own process (the `test-agent` binary), killable with SIGKILL.
pub struct AgentProcess {
    pub instance_id: String,
    child: std::process::Child,
}

impl AgentProcess {
    /// Starts `binary` (pass `env!("CARGO_BIN_EXE_test-agent")`) and waits for its READY line.
    pub fn start(binary: &str, sidecar: SocketAddr, name: &str, capabilities: &[&str], delay_ms: u64) -> AgentProcess {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(binary);
        cmd.args(["--sidecar", &sidecar.to_string(), "--name", name, "--delay-ms", &delay_ms.to_string()]);
        for c in capabilities {
            cmd.args(["--capability", c]);
        }
        let mut child =
            cmd.stdout(std::process::Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).expect("read READY line");
        let instance_id = line
            .strip_prefix("READY ")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("test-agent did not start: {line:?}"));
        AgentProcess { instance_id, child }
    }

    /// SIGKILL: no graceful shutdown, no deregistration.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Logs of the code under test, when `RUST_LOG` is set.
pub fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        agent_reach_support::process::init_logging("text");
    }
}

/// A control replica with its own runtime and etcd client on a free port (see
/// [`ControlReplica`]: killing it looks like a crash to its sidecars), with the harness's
/// identity where `config` sets none (every replica shares the harness CA).
pub fn start_replica(etcd: &str, config: ControlConfig) -> ControlReplica {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    secure::remember(listener.local_addr().expect("replica address"), None);
    ControlReplica::start(vec![etcd.to_string()], secure::secure_config(config), listener, 2, "ar-control")
        .expect("control replica")
}

/// A PLAINTEXT control replica (explicit opt-in): `config` as given.
pub fn start_replica_plaintext(etcd: &str, config: ControlConfig) -> ControlReplica {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    secure::forget(listener.local_addr().expect("replica address"));
    ControlReplica::start(vec![etcd.to_string()], config, listener, 2, "ar-control").expect("control replica")
}

/// A control replica on `addr` again (after [`ControlReplica::kill`]), retrying while the
/// port is still being released.
pub async fn restart_replica(etcd: &str, config: ControlConfig, addr: SocketAddr) -> ControlReplica {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => {
                // Secured again only if it was before (a plaintext replica stays plaintext).
                let config = if secure::is_secured(&addr.to_string()) { secure::secure_config(config) } else { config };
                return ControlReplica::start(vec![etcd.to_string()], config, listener, 2, "ar-control")
                    .expect("control replica");
            }
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    }
}

/// An Admin API client as the harness's cluster admin: the bootstrap token on every call,
/// over TLS when the harness started that control with identity.
pub type HarnessAdminClient = AdminClient<tonic::codegen::InterceptedService<Channel, secure::AdminToken>>;

/// An Admin API client of the control service at `endpoint` (see [`HarnessAdminClient`]).
pub async fn admin_client(endpoint: &str) -> HarnessAdminClient {
    AdminClient::with_interceptor(secure::anonymous_channel(endpoint), secure::AdminToken)
}

/// A Control API client (what sidecars use) of the control service at `endpoint`; over
/// mutual TLS as sidecar `e2e-client` of tenant `default` when the harness started that
/// control with identity (use [`control_client_as`] for other tenants).
pub async fn control_client(endpoint: &str) -> ControlClient<Channel> {
    control_client_as(endpoint, "default", "e2e-client").await
}

/// A Control API client presenting the certificate of sidecar `sidecar_id` of `tenant`
/// (plaintext when the control has no identity).
pub async fn control_client_as(endpoint: &str, tenant: &str, sidecar_id: &str) -> ControlClient<Channel> {
    ControlClient::new(secure::channel_as(endpoint, tenant, sidecar_id))
}

/// A sidecar's watch loop on its own (the sidecar's code, without the rest of a sidecar),
/// recording what every watch event did to its table.
pub struct WatchProbe {
    pub table: TableHandle,
    pub stats: Arc<WatchStats>,
    log: Arc<Mutex<Vec<Applied>>>,
    revision: tokio::sync::watch::Receiver<i64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl WatchProbe {
    /// Starts watching `tenant` through the control `endpoints` (in order of preference), as
    /// sidecar `probe` of `tenant` (with a harness certificate when the controls have identity).
    pub fn start(endpoints: &[String], tenant: &str) -> WatchProbe {
        let tls = endpoints.first().and_then(|e| secure::control_tls(e, tenant, "probe"));
        let control =
            Arc::new(ControlClients::with_tls(endpoints, Duration::from_secs(2), tls).expect("control endpoints"));
        let request = proto::WatchRequest {
            tenant: tenant.to_string(),
            sidecar: Some(proto::SidecarIdentity { sidecar_id: "probe".into(), mesh_address: "127.0.0.1:1".into() }),
            from_revision: 0,
        };
        let table = TableHandle::default();
        let stats = Arc::new(WatchStats::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (revision_tx, revision) = tokio::sync::watch::channel(0);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let record = log.clone();
        let observer: WatchObserver = Arc::new(move |applied: &Applied| {
            record.lock().unwrap_or_else(|e| e.into_inner()).push(applied.clone());
        });
        let task = tokio::spawn(run_watch_observed(
            control,
            request,
            table.clone(),
            revision_tx,
            stats.clone(),
            Some(observer),
            stopped,
        ));
        WatchProbe { table, stats, log, revision, stop, task }
    }

    /// Waits until the table satisfies `pred` (checked after every change).
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&RoutingTable) -> bool) -> Result<(), String> {
        let mut rx = self.revision.clone();
        let check = async {
            loop {
                if pred(&self.table.load()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, check).await.map_err(|_| {
            let t = self.table.load();
            format!("table did not converge within {timeout:?} (revision {}, {} instances)", t.revision, t.len())
        })
    }

    /// Everything applied so far, in order.
    pub fn log(&self) -> Vec<Applied> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// A tenant's routing state read straight from the store, as routing sees it: the
/// revision of the read, instances by id, and policies by (kind, name).
pub async fn store_view(
    store: &Arc<dyn Store>,
    tenant: &str,
) -> (i64, BTreeMap<String, Instance>, BTreeMap<(PolicyKind, String), Policy>) {
    let range = store.get_prefix(&keys::tenant_prefix(tenant)).await.expect("read the tenant's keys");
    let agents = keys::agents_prefix(tenant);
    let policies = keys::policies_prefix(tenant);
    let mut instances = BTreeMap::new();
    let mut out_policies = BTreeMap::new();
    for kv in &range.kvs {
        if let Some((agent, id)) = keys::parse_instance_key(&agents, &kv.key) {
            let stored = record::decode_instance(kv, tenant, agent, id).expect("a readable record");
            instances.insert(id.to_string(), stored.status(kv.mod_revision).instance());
        } else if let Some(key) = keys::parse_policy_key(&policies, &kv.key) {
            out_policies.insert(key, record::decode_policy(kv, tenant).expect("a readable policy"));
        }
    }
    (range.revision, instances, out_policies)
}

/// Whether `table` holds exactly `instances` and `policies` (records and revisions).
pub fn table_matches(
    table: &RoutingTable,
    instances: &BTreeMap<String, Instance>,
    policies: &BTreeMap<(PolicyKind, String), Policy>,
) -> bool {
    table.instances.len() == instances.len()
        && instances.iter().all(|(id, i)| table.instances.get(id).is_some_and(|t| *t.instance == *i))
        && table.policies.len() == policies.len()
        && policies.iter().all(|(k, p)| table.policies.get(k).is_some_and(|t| **t == *p))
}

/// A registration of `agent` with one capability and its tags, on the wire (built by
/// [`agent_reach::model::fixture`], the one builder of instance records for tests).
pub fn registration(agent: &str, version: &str, capability: &str, tags: &[&str]) -> proto::AgentRegistration {
    agent_reach::model::fixture::registration(agent)
        .version(version)
        .capability(capability, tags)
        .endpoint("http://127.0.0.1:9")
        .proto_registration()
}

/// What a [`ManualAgent`] answers to health probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeAnswer {
    Serving,
    NotServing,
    /// Never answers (a frozen process).
    Hang,
}

/// The agent's health service: `Check` answers the current [`ProbeAnswer`]; `Watch` sends
/// it, then every change (a `Hang` sends nothing until the answer changes again).
struct ProbeService(tokio::sync::watch::Receiver<ProbeAnswer>);

fn serving_status(answer: ProbeAnswer) -> Option<tonic_health::pb::HealthCheckResponse> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let status = match answer {
        ProbeAnswer::Serving => ServingStatus::Serving,
        ProbeAnswer::NotServing => ServingStatus::NotServing,
        ProbeAnswer::Hang => return None,
    };
    Some(tonic_health::pb::HealthCheckResponse { status: status as i32 })
}

type ProbeStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<tonic_health::pb::HealthCheckResponse, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for ProbeService {
    async fn check(
        &self,
        _request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
        let current = *self.0.borrow();
        match serving_status(current) {
            Some(answer) => Ok(tonic::Response::new(answer)),
            None => std::future::pending().await,
        }
    }

    type WatchStream = ProbeStream;

    async fn watch(
        &self,
        _request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        use futures_util::StreamExt;
        let updates = tokio_stream::wrappers::WatchStream::new(self.0.clone())
            .filter_map(|answer| std::future::ready(serving_status(answer).map(Ok)));
        Ok(tonic::Response::new(Box::pin(updates)))
    }
}

/// An agent driven by the test: it registers through the local API, heartbeats only when
/// told to, and answers health probes as told (see [`ProbeAnswer`]). It serves no calls.
pub struct ManualAgent {
    pub instance_id: String,
    pub endpoint: String,
    sidecar: agent_reach::proto::sidecar_client::SidecarClient<Channel>,
    answer: tokio::sync::watch::Sender<ProbeAnswer>,
    server: tokio::task::JoinHandle<()>,
    heartbeats: Option<tokio::task::JoinHandle<()>>,
}

impl ManualAgent {
    /// Registers `registration` (its endpoint replaced by the agent's own) through the
    /// sidecar at `sidecar`, with `instance_id` (empty: the sidecar assigns one).
    pub async fn register(
        sidecar: SocketAddr,
        mut registration: proto::AgentRegistration,
        instance_id: &str,
        state: proto::HealthState,
    ) -> Result<ManualAgent, tonic::Status> {
        let listener = listener().await;
        let endpoint = format!("http://{}", listener.local_addr().expect("agent address"));
        let (answer, probe_answers) = tokio::sync::watch::channel(ProbeAnswer::Serving);
        let service = tonic_health::pb::health_server::HealthServer::new(ProbeService(probe_answers));
        let server = tokio::spawn(async move {
            let incoming = tokio_stream_listener(listener);
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        registration.endpoint = endpoint.clone();
        let mut client = agent_reach::proto::sidecar_client::SidecarClient::connect(format!("http://{sidecar}"))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let reply = client
            .register(proto::RegisterRequest {
                registration: Some(registration),
                instance_id: instance_id.to_string(),
                state: state as i32,
            })
            .await;
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(status) => {
                server.abort();
                return Err(status);
            }
        };
        Ok(ManualAgent { instance_id: reply.instance_id, endpoint, sidecar: client, answer, server, heartbeats: None })
    }

    pub fn answer_probes(&self, answer: ProbeAnswer) {
        self.answer.send_replace(answer);
    }

    /// One heartbeat reporting `state`.
    pub async fn heartbeat(&mut self, state: proto::HealthState) -> Result<(), tonic::Status> {
        let request =
            proto::HeartbeatRequest { instance_id: self.instance_id.clone(), state: state as i32, load: None };
        self.sidecar.heartbeat(request).await.map(|_| ())
    }

    /// Heartbeats reporting `state` every `interval` until stopped.
    pub fn start_heartbeats(&mut self, state: proto::HealthState, interval: Duration) {
        self.stop_heartbeats();
        let mut sidecar = self.sidecar.clone();
        let instance_id = self.instance_id.clone();
        self.heartbeats = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            loop {
                ticker.tick().await;
                let request =
                    proto::HeartbeatRequest { instance_id: instance_id.clone(), state: state as i32, load: None };
                let _ = sidecar.heartbeat(request).await;
            }
        }));
    }

    pub fn stop_heartbeats(&mut self) {
        if let Some(task) = self.heartbeats.take() {
            task.abort();
        }
    }
}

impl Drop for ManualAgent {
    fn drop(&mut self) {
        self.stop_heartbeats();
        self.server.abort();
    }
}

fn tokio_stream_listener(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

/// The state of `instance_id` in `sidecar`'s table, if it is there.
pub fn state_in(sidecar: &Sidecar, instance_id: &str) -> Option<agent_reach::model::HealthState> {
    sidecar.table().instances.get(instance_id).map(|m| m.instance.record.state)
}

/// Waits until `instance_id` has `state` in `sidecar`'s table.
pub async fn wait_for_state(sidecar: &Sidecar, instance_id: &str, state: agent_reach::model::HealthState) {
    sidecar
        .wait_for_table(Duration::from_secs(15), |t| {
            t.instances.get(instance_id).is_some_and(|m| m.instance.record.state == state)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {instance_id} is {:?}, not {state}", state_in(sidecar, instance_id)));
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `timeout`.
pub async fn eventually(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not so within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tonic_health::pb::health_server::Health;

    #[tokio::test]
    async fn the_probe_watch_sends_the_answer_then_each_change_and_nothing_while_hanging() {
        use tonic_health::pb::health_check_response::ServingStatus;
        let (answer, answers) = tokio::sync::watch::channel(ProbeAnswer::Serving);
        let service = ProbeService(answers);
        let request = || tonic::Request::new(tonic_health::pb::HealthCheckRequest { service: String::new() });
        let mut updates = service.watch(request()).await.unwrap().into_inner();
        let status = |item: Option<Result<tonic_health::pb::HealthCheckResponse, tonic::Status>>| {
            item.expect("an update").expect("not an error").status
        };
        assert_eq!(status(updates.next().await), ServingStatus::Serving as i32);
        answer.send_replace(ProbeAnswer::NotServing);
        assert_eq!(status(updates.next().await), ServingStatus::NotServing as i32);
        answer.send_replace(ProbeAnswer::Hang);
        tokio::task::yield_now().await;
        assert!(futures_util::FutureExt::now_or_never(updates.next()).is_none(), "a hang sends nothing");
        answer.send_replace(ProbeAnswer::Serving);
        assert_eq!(status(updates.next().await), ServingStatus::Serving as i32);
        assert_eq!(service.check(request()).await.unwrap().into_inner().status, ServingStatus::Serving as i32);
    }
}
