//! Sidecar memory with a large routing table: fills a fresh control service with N fake
//! registrations (tenant `default`, 10 instances per agent, two capabilities each, behind
//! N/20 fake sidecars whose addresses are never contacted) through the `Control` API, waits
//! until a sidecar's table holds all of them (its `Route` answer reports a table revision
//! at or past the last registration's), lets it settle, and reads its `VmRSS` and `VmHWM`.
//!
//! Two sidecars per size: one running while the registrations arrive one by one
//! (`incremental`: a delta per registration), and one started afterwards (`snapshot`: the
//! whole table in one watch message, as a sidecar joining a large fleet sees it).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach::proto::sidecar_client::SidecarClient;
use serde::{Deserialize, Serialize};

use crate::procs::{self, Binaries, Proc};
use crate::procstat;

/// The capability every fake instance offers (queried to watch the table converge).
const COMMON_CAPABILITY: &str = "fleet.common";
/// Registrations in flight at once while filling control.
const FILL_CONCURRENCY: usize = 32;
/// Time the sidecar is left alone after its table converged, before RSS is read.
const SETTLE: Duration = Duration::from_secs(2);

/// Memory of one sidecar holding `instances` instances.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableRss {
    pub instances: usize,
    /// "idle" (no instances), "incremental" or "snapshot".
    pub mode: String,
    pub converged: bool,
    /// From the first registration (incremental) or the sidecar's start (snapshot) until
    /// the table held every instance.
    pub converge_s: f64,
    /// Time control took to accept every registration (incremental rows).
    pub fill_s: f64,
    /// CPU seconds the sidecar used from its start until it was read.
    pub sidecar_cpu_s: f64,
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    /// Why it did not converge, with the end of the sidecar's log.
    pub note: String,
}

/// Where and how to run the processes.
pub struct Setup<'a> {
    pub binaries: &'a Binaries,
    pub dir: &'a std::path::Path,
    /// CPU list of the sidecar (the proxies' CPU) and of control (the client side).
    pub sidecar_cpus: Option<&'a str>,
    pub control_cpus: Option<&'a str>,
    pub converge_timeout: Duration,
}

/// `measure` on its own (the `table-rss` command): release binaries (or this binary with
/// `embedded`), no pinning, processes' files in a temporary directory; prints JSON rows.
pub fn run_blocking(sizes: &[usize], embedded: bool) -> Result<(), String> {
    let binaries = Binaries::locate(embedded)?;
    let tmp = tempfile::Builder::new().prefix("agent-reach-rss-").tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let setup = Setup {
        binaries: &binaries,
        dir: tmp.path(),
        sidecar_cpus: None,
        control_cpus: None,
        converge_timeout: Duration::from_secs(180),
    };
    let rows = agent_reach_support::process::runtime(2)
        .map_err(|e| format!("runtime: {e}"))?
        .block_on(measure(&setup, sizes))?;
    for row in rows {
        println!("{}", serde_json::to_string(&row).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// Measures an idle sidecar, then each size in `sizes`.
pub async fn measure(setup: &Setup<'_>, sizes: &[usize]) -> Result<Vec<TableRss>, String> {
    let mut out = Vec::new();
    let (_control, control_port) = start_control(setup, "rss-control-idle").await?;
    let (mut sidecar, port) = start_sidecar(setup, "rss-sidecar-idle", control_port).await?;
    tokio::time::sleep(SETTLE).await;
    out.push(read(&mut sidecar, 0, "idle", true, Duration::ZERO, Duration::ZERO, String::new())?);
    let _ = port;
    drop(sidecar);
    for &n in sizes {
        out.extend(measure_size(setup, n).await?);
    }
    Ok(out)
}

async fn measure_size(setup: &Setup<'_>, n: usize) -> Result<Vec<TableRss>, String> {
    let (_control, control_port) = start_control(setup, &format!("rss-control-{n}")).await?;
    let (mut incremental, inc_port) =
        start_sidecar(setup, &format!("rss-sidecar-{n}-incremental"), control_port).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let revision = fill(control_port, n).await?;
    let filled = started.elapsed();
    let mut rows = Vec::new();
    let converged = wait_revision(inc_port, revision, setup.converge_timeout).await;
    let took = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let note = if converged { String::new() } else { incremental.log_tail(5) };
    rows.push(read(&mut incremental, n, "incremental", converged, took, filled, note)?);
    drop(incremental);

    let started = Instant::now();
    let (mut joined, join_port) = start_sidecar(setup, &format!("rss-sidecar-{n}-snapshot"), control_port).await?;
    let converged = wait_revision(join_port, revision, setup.converge_timeout).await;
    let took = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let note = if converged { String::new() } else { joined.log_tail(5) };
    rows.push(read(&mut joined, n, "snapshot", converged, took, Duration::ZERO, note)?);
    Ok(rows)
}

fn read(
    sidecar: &mut Proc,
    instances: usize,
    mode: &str,
    converged: bool,
    took: Duration,
    filled: Duration,
    note: String,
) -> Result<TableRss, String> {
    sidecar.check_alive()?;
    let pid = sidecar.pid();
    let cpu = procstat::stat(pid).map_or(0, |s| s.cpu_ticks) as f64 / procstat::ticks_per_second() as f64;
    Ok(TableRss {
        instances,
        mode: mode.into(),
        converged,
        converge_s: took.as_secs_f64(),
        fill_s: filled.as_secs_f64(),
        sidecar_cpu_s: cpu,
        rss_kib: procstat::status_kib(pid, "VmRSS").unwrap_or(0),
        peak_rss_kib: procstat::status_kib(pid, "VmHWM").unwrap_or(0),
        note,
    })
}

async fn start_control(setup: &Setup<'_>, name: &str) -> Result<(Proc, u16), String> {
    let port = procs::free_port()?;
    let mut cmd = setup.binaries.control(setup.control_cpus);
    // Long leases: the fake instances never heartbeat.
    cmd.args(crate::procs::control_args(port, &["--lease-ttl", "3600s"])?);
    cmd.env("RUST_LOG", "warn");
    let mut p = Proc::spawn(name, cmd, setup.dir)?;
    procs::wait_port(([127, 0, 0, 1], port).into(), &mut p, Duration::from_secs(15)).await?;
    Ok((p, port))
}

async fn start_sidecar(setup: &Setup<'_>, name: &str, control_port: u16) -> Result<(Proc, u16), String> {
    let (local, mesh) = (procs::free_port()?, procs::free_port()?);
    let mut cmd = setup.binaries.sidecar(setup.sidecar_cpus);
    cmd.args(crate::procs::sidecar_args(name, local, mesh, control_port)?);
    cmd.env("RUST_LOG", "warn");
    let mut p = Proc::spawn(name, cmd, setup.dir)?;
    procs::wait_port(([127, 0, 0, 1], local).into(), &mut p, Duration::from_secs(15)).await?;
    Ok((p, local))
}

/// A realistic registration for fake instance `i`.
fn registration(i: usize) -> (String, proto::AgentRegistration) {
    let agent = format!("fleet-agent-{:05}", i / 10);
    let registration = proto::AgentRegistration {
        agent: agent.clone(),
        version: "1.4.2".into(),
        capabilities: vec![
            proto::Capability {
                name: format!("fleet.task-{:03}", (i / 10) % 200),
                tags: vec!["en".into(), "gpu-a10".into()],
            },
            proto::Capability { name: COMMON_CAPABILITY.into(), tags: Vec::new() },
        ],
        endpoint: format!("http://127.0.0.1:{}", 10_000 + i % 50_000),
        transport: proto::Transport::Grpc as i32,
        max_concurrency: 8,
        metadata: HashMap::from([("zone".to_string(), "zone-a".to_string())]),
    };
    (agent, registration)
}

/// Registers `n` fake instances; returns the highest store revision written.
pub async fn fill(control_port: u16, n: usize) -> Result<i64, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{control_port}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("control: {e}"))?;
    let next = Arc::new(AtomicUsize::new(0));
    let revision = Arc::new(AtomicI64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..FILL_CONCURRENCY.min(n.max(1)) {
        let (next, revision, mut client) = (next.clone(), revision.clone(), ControlClient::new(channel.clone()));
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), String>(());
                }
                let (agent, registration) = registration(i);
                let request = proto::ControlRegisterRequest {
                    tenant: "default".into(),
                    sidecar: Some(proto::SidecarIdentity {
                        sidecar_id: format!("fleet-sidecar-{:04}", i / 20),
                        mesh_address: format!("127.0.0.1:{}", 20_000 + i / 20),
                    }),
                    instance_id: agent_reach::model::new_instance_id(&agent),
                    registration: Some(registration),
                    state: proto::HealthState::Up as i32,
                    // 0: a lease of its own.
                    lease_id: 0,
                };
                let reply =
                    client.register(request).await.map_err(|s| format!("fake registration {i}: {}", s.message()))?;
                revision.fetch_max(reply.into_inner().revision, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    Ok(revision.load(Ordering::Relaxed))
}

/// Whether the sidecar's table reaches `revision` within `timeout`.
async fn wait_revision(sidecar_port: u16, revision: i64, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{sidecar_port}")) else {
        return false;
    };
    let channel = endpoint.connect_lazy();
    let mut client = SidecarClient::new(channel);
    while Instant::now() < until {
        let request = proto::RouteRequest {
            target: Some(proto::Target {
                kind: Some(proto::target::Kind::Capability(COMMON_CAPABILITY.into())),
                tags: Vec::new(),
            }),
            max_candidates: 1,
            ..Default::default()
        };
        if let Ok(reply) = client.route(request).await
            && reply.get_ref().table_revision >= revision
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
