//! `agent-reach-bench`: measurements of the call path, printed with the date and machine.
//!
//! `latency`: sequential unary calls (one at a time, so each number is one call's full
//! round trip) made (a) directly to an agent's `Agent/Handle` and (b) through the mesh:
//! client → sidecar A → sidecar B → agent, by capability. Control, both sidecars and the
//! agent run in this process on 127.0.0.1; the embedded store backs control. This is a
//! quick latency probe, not the throughput comparison against other proxies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::proto::agent_client::AgentClient;
use agent_reach::{Agent, Client, Reply, proto};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::EmbeddedStore;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(name = "agent-reach-bench", about = "Measurements of the Agent-Reach call path")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sequential call latency: direct to the agent vs through two sidecars.
    Latency {
        /// Calls per path (after warm-up).
        #[arg(long, default_value_t = 5000)]
        calls: usize,
        /// Payload size in bytes.
        #[arg(long, default_value_t = 12)]
        payload: usize,
        /// Runtime worker threads for everything in the process.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
}

fn main() -> Result<(), String> {
    let Cli { command: Command::Latency { calls, payload, threads } } = Cli::parse();
    let runtime = agent_reach::process::runtime(threads).map_err(|e| e.to_string())?;
    runtime.block_on(latency(calls, payload, threads))
}

async fn bind() -> Result<TcpListener, String> {
    TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())
}

async fn latency(calls: usize, payload: usize, threads: usize) -> Result<(), String> {
    let control = ControlHandle::spawn(Arc::new(EmbeddedStore::default()), ControlConfig::default(), bind().await?)
        .map_err(|e| e.to_string())?;
    let mut sidecars = Vec::new();
    for id in ["bench-a", "bench-b"] {
        let mut config = SidecarConfig::new(vec![control.endpoint()]);
        config.sidecar_id = id.into();
        sidecars.push(Sidecar::start(config, bind().await?, bind().await?).await.map_err(|e| e.to_string())?);
    }
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let agent = Agent::builder("echo")
        .sidecar(b.local_addr().to_string())
        .handle("echo", |call| async move { Ok(Reply::bytes(call.payload().clone())) })
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let id = agent.instance_id();
    a.wait_for_table(Duration::from_secs(10), |t| t.instances.contains_key(&id)).await?;

    let body = Bytes::from(vec![b'x'; payload]);
    let direct = AgentClient::connect(agent.endpoint().to_string()).await.map_err(|e| e.to_string())?;
    let direct_call = |mut client: AgentClient<tonic::transport::Channel>, body: Bytes| async move {
        let request = proto::HandleRequest { payload: body, capability: "echo".into(), ..Default::default() };
        client.handle(request).await.map(|_| ()).map_err(|e| e.to_string())
    };
    let mesh = Client::connect(&a.local_addr().to_string()).await.map_err(|e| e.to_string())?;
    let mesh_call = |mesh: Client, body: Bytes| async move {
        mesh.invoke("echo").payload(body).send().await.map(|_| ()).map_err(|e| e.to_string())
    };

    // Warm up connections and code paths.
    for _ in 0..500 {
        direct_call(direct.clone(), body.clone()).await?;
        mesh_call(mesh.clone(), body.clone()).await?;
    }
    let mut d = Vec::with_capacity(calls);
    let mut m = Vec::with_capacity(calls);
    // Interleave the two paths so drift on a shared machine hits both alike.
    for _ in 0..calls {
        let t = Instant::now();
        direct_call(direct.clone(), body.clone()).await?;
        d.push(t.elapsed());
        let t = Instant::now();
        mesh_call(mesh.clone(), body.clone()).await?;
        m.push(t.elapsed());
    }

    println!("# agent-reach-bench latency — {}", machine());
    println!(
        "# {calls} sequential unary calls per path, {payload}-byte payload, {threads} runtime thread(s), one process"
    );
    println!("{:<34} {:>9} {:>9} {:>9} {:>9}", "path", "p50 ms", "p90 ms", "p99 ms", "max ms");
    let rd = report("direct: client -> agent", &mut d);
    let rm = report("mesh: client -> A -> B -> agent", &mut m);
    println!(
        "added by the mesh (two sidecar hops): p50 +{:.3} ms, p99 +{:.3} ms",
        (rm.0 - rd.0) * 1e3,
        (rm.1 - rd.1) * 1e3
    );
    agent.shutdown().await;
    for s in sidecars {
        s.shutdown().await;
    }
    control.shutdown().await;
    Ok(())
}

/// Prints one row; returns (p50, p99) in seconds.
fn report(name: &str, samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let q = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)].as_secs_f64();
    let (p50, p90, p99) = (q(0.50), q(0.90), q(0.99));
    let max = samples.last().map_or(0.0, Duration::as_secs_f64);
    println!("{name:<34} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", p50 * 1e3, p90 * 1e3, p99 * 1e3, max * 1e3);
    (p50, p99)
}

/// Date, CPU model and core count, for the record.
fn machine() -> String {
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%dT%H:%M:%SZ")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{date}, {cores} cores, {cpu}")
}
