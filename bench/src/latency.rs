//! `agent-reach-bench latency`: sequential unary calls (one at a time, so each number is one
//! call's full round trip) made (a) directly to an agent's `Agent/Handle` and (b) through
//! the mesh: client → sidecar A → sidecar B → agent, by capability, and (c) the same mesh
//! path through a second pair of sidecars that samples every call and exports its spans over
//! OTLP/gRPC to a receiver in this process (tracing on vs off), and (d) A2A `SendMessage`
//! (blocking, gRPC binding) to the same agent through the same two sidecars. Control, the sidecars, the
//! agents and the receiver run in this process on 127.0.0.1; the embedded store backs
//! control. A quick latency probe, not the throughput comparison against other proxies
//! (that is [`crate::orchestrate`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_reach::proto::agent_client::AgentClient;
use agent_reach::{Agent, Client, Reply, proto};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::a2a::proto::{self as a2a, a2a_service_client::A2aServiceClient};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::EmbeddedStore;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use tokio::net::TcpListener;

/// An OTLP/gRPC trace receiver that counts the spans it is sent.
#[derive(Clone, Default)]
struct SpanSink {
    spans: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for SpanSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .map(|ss| ss.spans.len())
            .sum();
        self.spans.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// Runs the probe on a runtime with `threads` workers and prints its table.
pub fn run(calls: usize, payload: usize, threads: usize) -> Result<(), String> {
    let runtime = agent_reach_support::process::runtime(threads).map_err(|e| e.to_string())?;
    runtime.block_on(latency(calls, payload, threads))
}

async fn bind() -> Result<TcpListener, String> {
    TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())
}

/// Control, two sidecars (`trace`: sample every call, export to `otlp`) and an echo agent
/// behind the second one; returns once the first sidecar can route to the agent.
async fn mesh(
    prefix: &str,
    otlp: Option<String>,
) -> Result<(ControlHandle, Vec<Sidecar>, agent_reach::RunningAgent), String> {
    let control = ControlHandle::spawn(Arc::new(EmbeddedStore::default()), ControlConfig::default(), bind().await?)
        .map_err(|e| e.to_string())?;
    let mut sidecars = Vec::new();
    for side in ["a", "b"] {
        let mut config = SidecarConfig::new(vec![control.endpoint()]);
        config.sidecar_id = format!("{prefix}-{side}");
        config.trace_sample_ratio = if otlp.is_some() { 1.0 } else { 0.0 };
        config.otlp_endpoint = otlp.clone();
        sidecars.push(Sidecar::start(config, bind().await?, bind().await?).await.map_err(|e| e.to_string())?);
    }
    let agent = Agent::builder("echo")
        .sidecar(sidecars[1].local_addr().to_string())
        .handle("echo", |call| async move { Ok(Reply::bytes(call.payload().clone())) })
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let id = agent.instance_id();
    sidecars[0].wait_for_table(Duration::from_secs(10), |t| t.instances.contains_key(&id)).await?;
    Ok((control, sidecars, agent))
}

async fn latency(calls: usize, payload: usize, threads: usize) -> Result<(), String> {
    let sink = SpanSink::default();
    let otlp = bind().await?;
    let otlp_addr = otlp.local_addr().map_err(|e| e.to_string())?;
    let receiver = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(otlp)),
    );
    let (control, sidecars, agent) = mesh("bench", None).await?;
    let (traced_control, traced_sidecars, traced_agent) = mesh("traced", Some(format!("http://{otlp_addr}"))).await?;
    let a = &sidecars[0];

    let body = Bytes::from(vec![b'x'; payload]);
    let direct = AgentClient::connect(agent.endpoint().to_string()).await.map_err(|e| e.to_string())?;
    let direct_call = |mut client: AgentClient<tonic::transport::Channel>, body: Bytes| async move {
        let request = proto::HandleRequest { payload: body, capability: "echo".into(), ..Default::default() };
        client.handle(request).await.map(|_| ()).map_err(|e| e.to_string())
    };
    let mesh = Client::connect(&a.local_addr().to_string()).await.map_err(|e| e.to_string())?;
    let traced = Client::connect(&traced_sidecars[0].local_addr().to_string()).await.map_err(|e| e.to_string())?;
    let mesh_call = |mesh: Client, body: Bytes| async move {
        mesh.invoke("echo").payload(body).send().await.map(|_| ()).map_err(|e| e.to_string())
    };
    let a2a_client =
        A2aServiceClient::connect(format!("http://{}", a.local_addr())).await.map_err(|e| e.to_string())?;
    let a2a_call = |mut client: A2aServiceClient<tonic::transport::Channel>, body: Bytes| async move {
        let message = a2a::Message {
            message_id: "bench".into(),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Raw(body.to_vec())),
                media_type: "application/octet-stream".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let request = a2a::SendMessageRequest { tenant: "echo".into(), message: Some(message), ..Default::default() };
        client.send_message(request).await.map(|_| ()).map_err(|e| e.to_string())
    };

    // Warm up connections and code paths.
    for _ in 0..500 {
        direct_call(direct.clone(), body.clone()).await?;
        mesh_call(mesh.clone(), body.clone()).await?;
        mesh_call(traced.clone(), body.clone()).await?;
        a2a_call(a2a_client.clone(), body.clone()).await?;
    }
    let mut d = Vec::with_capacity(calls);
    let mut m = Vec::with_capacity(calls);
    let mut tr = Vec::with_capacity(calls);
    let mut aa = Vec::with_capacity(calls);
    // Interleave the two paths so drift on a shared machine hits both alike.
    for _ in 0..calls {
        let t = Instant::now();
        direct_call(direct.clone(), body.clone()).await?;
        d.push(t.elapsed());
        let t = Instant::now();
        mesh_call(mesh.clone(), body.clone()).await?;
        m.push(t.elapsed());
        let t = Instant::now();
        mesh_call(traced.clone(), body.clone()).await?;
        tr.push(t.elapsed());
        let t = Instant::now();
        a2a_call(a2a_client.clone(), body.clone()).await?;
        aa.push(t.elapsed());
    }
    // Each traced call makes three spans (A's server and client spans, B's server span);
    // give the batch exporters up to 5 s to deliver them all.
    let expected = 3 * (calls as u64 + 500);
    let waited = Instant::now();
    while sink.spans.load(Ordering::Relaxed) < expected && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("# agent-reach-bench latency — {}", machine());
    println!(
        "# {calls} sequential unary calls per path, {payload}-byte payload, {threads} runtime thread(s), one process"
    );
    println!("{:<44} {:>9} {:>9} {:>9} {:>9}", "path", "p50 ms", "p90 ms", "p99 ms", "max ms");
    let rd = report("direct: client -> agent", &mut d);
    let rm = report("mesh: client -> A -> B -> agent", &mut m);
    let rt = report("mesh, every call traced and exported (OTLP)", &mut tr);
    let ra = report("A2A SendMessage (gRPC): client -> A -> B -> agent", &mut aa);
    println!(
        "added by the mesh (two sidecar hops): p50 +{:.3} ms, p99 +{:.3} ms",
        (rm.0 - rd.0) * 1e3,
        (rm.1 - rd.1) * 1e3
    );
    println!(
        "added by tracing every call: p50 +{:.3} ms, p99 +{:.3} ms; spans received by the OTLP receiver: {} of {expected}",
        (rt.0 - rm.0) * 1e3,
        (rt.1 - rm.1) * 1e3,
        sink.spans.load(Ordering::Relaxed)
    );
    println!(
        "added by A2A over a plain Invoke (same two sidecars): p50 +{:.3} ms, p99 +{:.3} ms",
        (ra.0 - rm.0) * 1e3,
        (ra.1 - rm.1) * 1e3
    );
    for (agent, sidecars, control) in [(agent, sidecars, control), (traced_agent, traced_sidecars, traced_control)] {
        agent.shutdown().await;
        for s in sidecars {
            s.shutdown().await;
        }
        control.shutdown().await;
    }
    receiver.abort();
    Ok(())
}

/// Prints one row; returns (p50, p99) in seconds.
fn report(name: &str, samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let q = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)].as_secs_f64();
    let (p50, p90, p99) = (q(0.50), q(0.90), q(0.99));
    let max = samples.last().map_or(0.0, Duration::as_secs_f64);
    println!("{name:<44} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", p50 * 1e3, p90 * 1e3, p99 * 1e3, max * 1e3);
    (p50, p99)
}

/// Date, CPU model and core count, for the record.
fn machine() -> String {
    let m = crate::machine::Machine::current();
    format!("{}, {} cores, {}", crate::machine::utc_now(), m.cores, m.cpu_model)
}
