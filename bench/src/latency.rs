//! `agent-reach-bench latency`: sequential unary calls (one at a time, so each number is one
//! call's full round trip) made (a) directly to an agent's `Agent/Handle` and (b) through
//! the mesh: client → sidecar A → sidecar B → agent, by capability. Control, both sidecars
//! and the agent run in this process on 127.0.0.1; the embedded store backs control. A
//! quick latency probe, not the throughput comparison against other proxies (that is
//! [`crate::orchestrate`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::proto::agent_client::AgentClient;
use agent_reach::{Agent, Client, Reply, proto};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::EmbeddedStore;
use bytes::Bytes;
use tokio::net::TcpListener;

/// Runs the probe on a runtime with `threads` workers and prints its table.
pub fn run(calls: usize, payload: usize, threads: usize) -> Result<(), String> {
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
    let m = crate::machine::Machine::current();
    format!("{}, {} cores, {}", crate::machine::utc_now(), m.cores, m.cpu_model)
}
