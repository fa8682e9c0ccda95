//! Harness for the end-to-end tests: a real etcd process (or the embedded store), a control
//! service and sidecars on 127.0.0.1 port 0, and sample agents built with the SDK.
//!
//! Everything runs in the test process except etcd, which is a real `etcd` binary started
//! by `agent_reach_store::testing::EtcdServer`; when etcd cannot start the test fails.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::policy::{Policy, PolicyKind, PolicySpec};
use agent_reach::{Agent, Reply, RunningAgent};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EmbeddedStore, EtcdOptions, EtcdStore, Store};
use tokio::net::TcpListener;

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
}

/// 127.0.0.1 on a free port.
pub async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0")
}

/// Control on `store` with `lease_ttl`.
pub async fn start_control(store: Arc<dyn Store>, lease_ttl: Duration) -> ControlHandle {
    start_control_on(store, lease_ttl, listener().await)
}

/// Control on a given listener (e.g. rebound on a port sidecars already point at).
pub fn start_control_on(store: Arc<dyn Store>, lease_ttl: Duration, listener: TcpListener) -> ControlHandle {
    ControlHandle::spawn(store, ControlConfig { lease_ttl }, listener).expect("control listener address")
}

/// Sidecar settings for tests: fast heartbeats, probes and control timeouts.
pub fn sidecar_config(control: &str, id: &str) -> SidecarConfig {
    let mut c = SidecarConfig::new(vec![control.to_string()]);
    c.sidecar_id = id.to_string();
    c.heartbeat_interval = Duration::from_millis(200);
    c.probe_interval = Duration::from_millis(200);
    c.control_timeout = Duration::from_secs(1);
    c
}

/// A sidecar on free ports.
pub async fn start_sidecar(config: SidecarConfig) -> Sidecar {
    Sidecar::start(config, listener().await, listener().await).await.expect("sidecar start")
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
    let mut want: Vec<String> = ids.to_vec();
    want.sort();
    sidecar
        .wait_for_table(Duration::from_secs(15), |t| {
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
    for sc in sidecars {
        sc.wait_for_table(Duration::from_secs(10), |t| {
            t.policy(policy.kind, &policy.name).is_some_and(|p| **p == policy)
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
        agent_reach::process::init_logging("text");
    }
}
