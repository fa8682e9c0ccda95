//! The dashboard's API at scale (a benchmark, not a test): one tenant with 10,000 instances
//! on 1,000 sidecars, each sidecar with a stored traffic report (8 edges, its 10 instances'
//! last heartbeats, 16 span summaries), served by one control replica with its dashboard on
//! a real etcd. Measures what a page load costs: the size and time of `/api/state`, of the
//! first server-sent event (what the page renders from), of a capability search and a
//! trace search, and the control threads' CPU time per state answer.
//!
//! The records and reports are written straight into etcd (as control and the sidecars
//! would store them), so the numbers are the dashboard's alone. Control runs on its own
//! runtime (2 threads named `ar-control`, its own etcd client); the client side is this
//! program's main thread, over plain HTTP/1.1 like a browser. Run with
//! `cargo run -p agent-reach-control --example dashboard_scale` (it starts its own etcd;
//! `AGENT_REACH_ETCD_BIN` names the binary); add `--release` for optimised numbers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::model::fixture;
use agent_reach::proto;
use agent_reach_control::record::{StoredInstance, encode};
use agent_reach_control::reports::report_key;
use agent_reach_control::{ControlConfig, ControlHandle, keys};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EtcdOptions, EtcdStore, Store};
use clap::Parser;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TENANT: &str = "default";

#[derive(Parser, Debug)]
#[command(about = "Scale benchmark of the Agent-Reach dashboard's API")]
struct Args {
    /// Instances in the tenant.
    #[arg(long, default_value_t = 10_000)]
    instances: usize,
    /// Sidecars they are spread over (each with a traffic report).
    #[arg(long, default_value_t = 1_000)]
    sidecars: usize,
    /// Edges per sidecar report.
    #[arg(long, default_value_t = 8)]
    edges: usize,
    /// Span summaries per sidecar report.
    #[arg(long, default_value_t = 16)]
    spans: usize,
    /// Page loads measured (each: one `/api/state` and one first event).
    #[arg(long, default_value_t = 10)]
    loads: usize,
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    eprintln!("starting etcd...");
    let etcd = EtcdServer::start()?;
    let control_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ar-control")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    client_rt.block_on(fill(&args, &etcd))?;
    // Control: its own runtime and etcd client, like a separate process.
    let dashboard = control_rt.block_on(async {
        let store: Arc<dyn Store> = Arc::new(etcd_client(&etcd).await?);
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let page = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = page.local_addr().map_err(|e| e.to_string())?;
        let handle = ControlHandle::spawn_with_dashboard(store, ControlConfig::default(), api, page)
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((addr, handle))
    })?;
    let (addr, _handle) = dashboard;
    let report = client_rt.block_on(measure(&args, addr))?;
    println!("{report}");
    Ok(())
}

async fn etcd_client(etcd: &EtcdServer) -> Result<EtcdStore, String> {
    EtcdStore::connect(EtcdOptions {
        user: None,
        endpoints: vec![etcd.endpoint()],
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
        tls: None,
    })
    .await
    .map_err(|e| e.to_string())
}

/// The instance `n` of sidecar `s`: agent `agent-{n % 1000}` offering `cap-{n % 100}`.
fn stored(n: usize, s: usize) -> (String, StoredInstance) {
    let (agent, capability) = (format!("agent-{}", n % 1000), format!("cap-{}", n % 100));
    let id = format!("{agent}-{n}");
    let record = fixture::instance(&id)
        .tenant(TENANT)
        .agent(&agent)
        .version("1.4.2")
        .capability(&capability, &["en", "gpu"])
        .endpoint("http://127.0.0.1:50051")
        .max_concurrency(16)
        .sidecar(&format!("sidecar-{s}"), &format!("10.0.{}.{}:7701", s / 250, s % 250))
        .record();
    (
        keys::instance_key(TENANT, &agent, &id),
        StoredInstance { record, instance_hold: None, agent_hold: None, generation: 1 },
    )
}

/// Sidecar `s`'s report: `edges` edges, its instances' heartbeats, `spans` span summaries.
fn report(args: &Args, s: usize, instances: &[usize], now_ms: i64) -> proto::SidecarReport {
    let buckets = 20;
    let edges = (0..args.edges)
        .map(|e| {
            let mut latency = vec![0u64; buckets];
            latency[(s + e) % buckets] = 40;
            latency[(s + e + 1) % buckets] = 2;
            proto::EdgeReport {
                caller: format!("agent-{}", (s + e) % 1000),
                target: format!("capability cap-{}", (s * 7 + e) % 100),
                agent: format!("agent-{}", (s * 7 + e) % 1000),
                calls: 42,
                errors: (e % 3) as u64,
                fallback_calls: 0,
                latency_buckets: latency,
            }
        })
        .collect();
    let spans = (0..args.spans)
        .map(|i| proto::SpanSummary {
            trace_id: format!("{s:016x}{i:016x}"),
            span_id: format!("{i:016x}"),
            parent_span_id: String::new(),
            name: "invoke capability cap-1".into(),
            kind: "server".into(),
            start_unix_us: (now_ms as u64) * 1000,
            duration_us: 1500,
            status: "ok".into(),
            attributes: [("agent_reach.session".to_string(), format!("session-{s}-{i}"))].into(),
        })
        .collect();
    proto::SidecarReport {
        window_ms: 60_000,
        edges,
        open_breakers: vec![],
        instances: instances
            .iter()
            .map(|n| proto::LocalInstanceReport {
                instance_id: format!("agent-{}-{n}", n % 1000),
                agent: format!("agent-{}", n % 1000),
                last_heartbeat_age_ms: 150,
            })
            .collect(),
        spans,
        received_at_ms: now_ms,
        sidecar_id: format!("sidecar-{s}"),
        latency_bucket_bounds_ms: (0..buckets - 1).map(|i| 0.1 * f64::from(1u32 << i)).collect(),
        interval_ms: 10_000,
    }
}

/// Writes every instance record and sidecar report, one lease per sidecar.
async fn fill(args: &Args, etcd: &EtcdServer) -> Result<(), String> {
    let store = etcd_client(etcd).await?;
    eprintln!("writing {} instances and {} reports...", args.instances, args.sidecars);
    let t0 = Instant::now();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = args.sidecars.div_ceil(50);
    for first in (0..args.sidecars).step_by(per_task) {
        let store = store.clone();
        let sidecars = args.sidecars;
        let total = args.instances;
        let parts: Vec<(usize, proto::SidecarReport)> = (first..(first + per_task).min(sidecars))
            .map(|s| {
                let mine: Vec<usize> = (s..total).step_by(sidecars).collect();
                (s, report(args, s, &mine, now_ms))
            })
            .collect();
        tasks.spawn(async move {
            for (s, report) in parts {
                let lease = store.grant_lease(Duration::from_secs(3600)).await?.id;
                for n in (s..total).step_by(sidecars) {
                    let (key, record) = stored(n, s);
                    store.put(&key, encode(&record), Some(lease)).await?;
                }
                let value = bytes::Bytes::from(report.encode_to_vec());
                store.put(&report_key(TENANT, &format!("sidecar-{s}")), value, Some(lease)).await?;
            }
            Ok::<_, agent_reach_store::StoreError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    }
    eprintln!("written in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// GET `path`: status, body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, Vec<u8>), String> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP head")?;
    let status = std::str::from_utf8(&out[9..12]).ok().and_then(|s| s.parse().ok()).ok_or("no status")?;
    Ok((status, out[split + 4..].to_vec()))
}

/// Opens `/api/events` and reads until the first whole event: (time to it, its bytes).
async fn first_event(addr: SocketAddr) -> Result<(Duration, usize), String> {
    let t0 = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!("GET /api/events?tenant={TENANT} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let (mut start, mut scanned): (Option<usize>, usize) = (None, 0);
    loop {
        let n = tcp.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the event stream ended before its first event".into());
        }
        seen.extend_from_slice(&buf[..n]);
        // Only the bytes not scanned yet (and the last few, for a marker cut by a read).
        let from = scanned.saturating_sub(6);
        scanned = seen.len();
        if start.is_none() {
            start = seen[from..].windows(6).position(|w| w == b"event:").map(|p| from + p);
        }
        if let Some(at) = start {
            let from = from.max(at);
            if let Some(p) = seen[from..].windows(2).position(|w| w == b"\n\n") {
                // Chunked framing adds a few bytes; the event's own size is what matters.
                return Ok((t0.elapsed(), from + p - at));
            }
        }
    }
}

/// CPU seconds used so far by this process's threads named `name`.
fn thread_cpu(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let mut ticks = 0u64;
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        ticks += field(14) + field(15);
    }
    ticks as f64 / 100.0
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((p / 100.0) * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)]
}

async fn measure(args: &Args, addr: SocketAddr) -> Result<String, String> {
    // Control's feed and report follower load everything first.
    eprintln!("waiting for the dashboard to hold every instance and report...");
    let t0 = Instant::now();
    loop {
        let (status, body) = get(addr, &format!("/api/state?tenant={TENANT}")).await?;
        if status == 200 {
            let state: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            let instances = state["instances"].as_array().map_or(0, Vec::len);
            let sidecars = state["sidecars"].as_array().map_or(0, Vec::len);
            if instances == args.instances && sidecars == args.sidecars {
                break;
            }
        }
        if t0.elapsed() > Duration::from_secs(300) {
            return Err("the dashboard did not load every instance and report in 5 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let loaded = t0.elapsed();

    let mut page_bytes = 0;
    for asset in ["/", "/assets/app.js", "/assets/style.css"] {
        page_bytes += get(addr, asset).await?.1.len();
    }
    let mut state_ms = Vec::new();
    let mut event_ms = Vec::new();
    let (mut state_bytes, mut event_bytes, mut topology_edges) = (0, 0, 0);
    let cpu0 = thread_cpu("ar-control");
    for _ in 0..args.loads {
        let t = Instant::now();
        let (status, body) = get(addr, &format!("/api/state?tenant={TENANT}")).await?;
        state_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if status != 200 {
            return Err(format!("/api/state answered {status}"));
        }
        state_bytes = body.len();
        let state: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        topology_edges = state["topology"].as_array().map_or(0, Vec::len);
    }
    let state_cpu = (thread_cpu("ar-control") - cpu0) / args.loads as f64;
    for _ in 0..args.loads {
        let (took, bytes) = first_event(addr).await?;
        event_ms.push(took.as_secs_f64() * 1000.0);
        event_bytes = bytes;
    }
    let time = |path: String| async move {
        let t = Instant::now();
        let (status, body) = get(addr, &path).await?;
        Ok::<_, String>((t.elapsed().as_secs_f64() * 1000.0, status, body.len()))
    };
    let search = time(format!("/api/search?tenant={TENANT}&q=cap-7")).await?;
    let typo = time(format!("/api/search?tenant={TENANT}&q=cpa-77")).await?;
    let trace = time(format!("/api/traces?tenant={TENANT}&q={:016x}{:016x}", 17, 3)).await?;
    let session = time(format!("/api/traces?tenant={TENANT}&q=session-17-3")).await?;
    for s in [&mut state_ms, &mut event_ms] {
        s.sort_by(f64::total_cmp);
    }
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let mut out = String::new();
    out.push_str(&format!(
        "Dashboard API at scale: {} instances on {} sidecars, {} edges and {} spans per report\n\
         (dev or release profile as built; control on 2 threads of this machine's shared cores)\n\n",
        args.instances, args.sidecars, args.edges, args.spans
    ));
    out.push_str(&format!("time until the dashboard held everything: {:.1} s\n", loaded.as_secs_f64()));
    out.push_str(&format!("page assets (html + js + css): {page_bytes} bytes\n"));
    out.push_str(&format!(
        "/api/state: {:.2} MiB, {} topology edges; p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms over {} loads; \
         control CPU {:.0} ms per answer\n",
        mib(state_bytes),
        topology_edges,
        percentile(&state_ms, 50.0),
        percentile(&state_ms, 95.0),
        percentile(&state_ms, 100.0),
        args.loads,
        state_cpu * 1000.0
    ));
    out.push_str(&format!(
        "first server-sent event (what the page renders): {:.2} MiB; p50 {:.0} ms, p95 {:.0} ms to arrive\n",
        mib(event_bytes),
        percentile(&event_ms, 50.0),
        percentile(&event_ms, 95.0)
    ));
    for (what, (ms, status, bytes)) in [
        ("search cap-7", search),
        ("search cpa-77 (suggestions)", typo),
        ("trace by id", trace),
        ("trace by session", session),
    ] {
        out.push_str(&format!("{what}: {status}, {bytes} bytes in {ms:.1} ms\n"));
    }
    out.push_str(&format!("process RSS (control + etcd clients + this client): {:.0} MiB\n", rss_mib()));
    Ok(out)
}
