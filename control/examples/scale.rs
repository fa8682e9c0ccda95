//! The control service at scale, measured against raw etcd in the same run (a benchmark,
//! not a test):
//!
//! 1. raw etcd: lease grant + put of 10,000 records, 100 at a time (the reference for
//!    registration throughput);
//! 2. control: 100 simulated sidecars register 10,000 agents (100 each, concurrently);
//! 3. control: the sidecars heartbeat 2,000 instances per second (each sidecar reports its
//!    100 instances every 5 s, loads drifting as a random walk); counts etcd writes and
//!    keep-alives per heartbeat at steady load, after the first round;
//! 4. snapshot fan-out: 100 and then 1,000 sidecars, their connections to control opened
//!    beforehand, start watching the 10,000-agent tenant at once; timed from that start
//!    until the last of them has read its snapshot's last part. Each simulated sidecar
//!    walks the parts' fields (revision, flags, one count per instance) rather than
//!    decoding 10,000 instances, so the figure is control's delivery, not the bench's own
//!    decoding on the same cores; each must have every instance the store holds at a
//!    revision no older than the tenant's newest change, and one decodes its snapshot fully
//!    afterwards and checks the instance ids;
//! 5. propagation: with those watchers, the time from a put in etcd until every sidecar
//!    has applied it; and the same with 100 and 1,000 clients watching etcd directly.
//!
//! Control runs on its own runtime (2 threads named `ar-control`) with its own etcd
//! client, like a separate process; its CPU time is read from /proc per thread. Run with
//! `cargo run --release -p agent-reach-control --example scale` (it starts its own etcd;
//! `AGENT_REACH_ETCD_BIN` names the binary). Everything shares this machine's cores.

use std::time::{Duration, Instant};

use agent_reach::model::{Registration, fixture};
use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach_control::record::{StoredInstance, encode};
use agent_reach_control::routes::WATCH_PATH;
use agent_reach_control::{ControlConfig, ControlReplica, ControlStats, keys};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EtcdOptions, EtcdStore, Store};
use bytes::{Buf, Bytes};
use clap::Parser;
use futures_util::StreamExt;
use prost::Message;
use rand::Rng;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser, Debug)]
#[command(about = "Scale benchmark of the Agent-Reach control service against raw etcd")]
struct Args {
    /// Agents (instances) to register.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Simulated sidecars (the registration and heartbeat concurrency).
    #[arg(long, default_value_t = 100)]
    sidecars: usize,
    /// Instance heartbeats per second at steady load.
    #[arg(long, default_value_t = 2000.0)]
    heartbeat_rate: f64,
    /// How long heartbeats are driven (the first round is a warm-up).
    #[arg(long, default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    heartbeat_for: Duration,
    /// Watcher counts to measure propagation with.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    watchers: Vec<usize>,
    /// Puts per propagation measurement (enough for a p99 that is not one outlier).
    #[arg(long, default_value_t = 500)]
    puts: usize,
    /// Pause between those puts.
    #[arg(long, default_value = "20ms", value_parser = agent_reach_support::duration::parse)]
    put_every: Duration,
}

const TENANT: &str = "default";
const RAW_PREFIX: &str = "/bench-raw/";

fn main() -> Result<(), String> {
    let args = Args::parse();
    eprintln!("starting etcd...");
    let etcd = EtcdServer::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let report = runtime.block_on(run(&args, &etcd))?;
    println!("{report}");
    Ok(())
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
        // Fields after the ")" that closes the command name: state is field 3; utime and
        // stime are fields 14 and 15.
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        ticks += field(14) + field(15);
    }
    // USER_HZ is 100 on Linux.
    ticks as f64 / 100.0
}

/// Write calls and bytes written so far by this process's threads named `name` (the
/// kernel's `syscw` and `wchar` per thread).
fn thread_writes(name: &str) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return (0, 0) };
    let (mut calls, mut bytes) = (0, 0);
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        for line in std::fs::read_to_string(path.join("io")).unwrap_or_default().lines() {
            let value = |prefix: &str| line.strip_prefix(prefix).and_then(|v| v.trim().parse::<u64>().ok());
            calls += value("syscw:").unwrap_or(0);
            bytes += value("wchar:").unwrap_or(0);
        }
    }
    (calls, bytes)
}

fn stored(instance_id: &str, agent: &str, capability: &str, sidecar: usize) -> StoredInstance {
    StoredInstance {
        record: instance(instance_id, agent, capability)
            .sidecar(&format!("sidecar-{sidecar}"), &format!("10.0.{}.{}:7701", sidecar / 250, sidecar % 250))
            .record(),
        instance_hold: None,
        agent_hold: None,
        generation: 1,
    }
}

/// An instance of `agent` offering `capability`, as the scale test registers them.
fn instance(instance_id: &str, agent: &str, capability: &str) -> fixture::InstanceBuilder {
    fixture::instance(instance_id)
        .tenant(TENANT)
        .agent(agent)
        .version("1.4.2")
        .capability(capability, &["en", "gpu"])
        .endpoint("http://127.0.0.1:50051")
        .max_concurrency(16)
}

fn registration(agent: &str, capability: &str) -> Registration {
    instance("", agent, capability).registration()
}

fn agent_of(n: usize) -> (String, String) {
    (format!("agent-{}", n % 1000), format!("cap-{}", n % 100))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn etcd_client(etcd: &EtcdServer) -> Result<EtcdStore, String> {
    EtcdStore::connect(EtcdOptions {
        user: None,
        endpoints: vec![etcd.endpoint()],
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        tls: None,
    })
    .await
    .map_err(|e| e.to_string())
}

async fn control_channel(endpoint: &str) -> Result<Channel, String> {
    Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| e.to_string())
}

async fn run(args: &Args, etcd: &EtcdServer) -> Result<String, String> {
    let mut report = String::new();
    let per_sidecar = args.agents.div_ceil(args.sidecars);
    let store = etcd_client(etcd).await?;

    // 1. Raw etcd: lease grant + put, at the sidecars' concurrency.
    eprintln!("raw etcd: {} lease grants + puts, {} at a time...", args.agents, args.sidecars);
    let value = encode(&stored("agent-0-0", "agent-0", "cap-0", 0));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..args.sidecars {
        let (store, value) = (store.clone(), value.clone());
        tasks.spawn(async move {
            for j in 0..per_sidecar {
                let lease = store.grant_lease(Duration::from_secs(3600)).await?;
                store.put(&format!("{RAW_PREFIX}{s}/{j}"), value.clone(), Some(lease.id)).await?;
            }
            Ok::<_, agent_reach_store::StoreError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    }
    let raw_registrations = (per_sidecar * args.sidecars) as f64 / t0.elapsed().as_secs_f64();

    // 2. Control: the sidecars register their agents.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let control = ControlReplica::start(vec![etcd.endpoint()], ControlConfig::default(), listener, 2, "ar-control")
        .map_err(|e| e.to_string())?;
    let endpoint = control.endpoint();
    let stats = control.stats().clone();
    let mut sidecars = Vec::new();
    for _ in 0..args.sidecars {
        sidecars.push(ControlClient::new(control_channel(&endpoint).await?));
    }
    eprintln!("control: {} sidecars register {} agents...", args.sidecars, per_sidecar * args.sidecars);
    let cpu0 = thread_cpu("ar-control");
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (s, client) in sidecars.iter().enumerate() {
        let mut client = client.clone();
        tasks.spawn(async move {
            let mut lease = 0;
            for j in 0..per_sidecar {
                let (agent, capability) = agent_of(s * per_sidecar + j);
                let reply = client
                    .register(proto::ControlRegisterRequest {
                        tenant: TENANT.into(),
                        sidecar: Some(proto::SidecarIdentity {
                            sidecar_id: format!("sidecar-{s}"),
                            mesh_address: format!("10.0.{}.{}:7701", s / 250, s % 250),
                        }),
                        instance_id: format!("{agent}-{s}-{j}"),
                        registration: Some(registration(&agent, &capability).into()),
                        state: proto::HealthState::Up as i32,
                        lease_id: lease,
                    })
                    .await?;
                lease = reply.into_inner().lease_id;
            }
            Ok::<_, tonic::Status>((s, lease))
        });
    }
    let mut leases = vec![0; args.sidecars];
    while let Some(done) = tasks.join_next().await {
        let (s, lease) = done.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        leases[s] = lease;
    }
    let registration_secs = t0.elapsed().as_secs_f64();
    let registration_cpu = thread_cpu("ar-control") - cpu0;
    let registrations = (per_sidecar * args.sidecars) as f64 / registration_secs;

    // 3. Heartbeats: every sidecar reports its instances once per period, staggered.
    let period = Duration::from_secs_f64(args.sidecars as f64 * per_sidecar as f64 / args.heartbeat_rate);
    eprintln!(
        "heartbeats: {} per second ({} sidecars x {} instances every {:?}) for {:?}...",
        args.heartbeat_rate, args.sidecars, per_sidecar, period, args.heartbeat_for
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut beats = tokio::task::JoinSet::new();
    for (s, client) in sidecars.iter().enumerate() {
        let mut client = client.clone();
        let lease = leases[s];
        let mut stop = stop_rx.clone();
        let offset = period.mul_f64(s as f64 / args.sidecars as f64);
        beats.spawn(async move {
            let mut loads: Vec<f64> = (0..per_sidecar).map(|_| rand::rng().random_range(0.0..0.6)).collect();
            tokio::time::sleep(offset).await;
            let mut ticker = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = ticker.tick() => {}
                }
                let instances = (0..per_sidecar)
                    .map(|j| {
                        // A random walk: the load drifts a little every period.
                        let l = &mut loads[j];
                        *l = (*l + rand::rng().random_range(-0.03..0.03)).clamp(0.0, 1.0);
                        let (agent, _) = agent_of(s * per_sidecar + j);
                        proto::InstanceHeartbeat {
                            instance_id: format!("{agent}-{s}-{j}"),
                            agent,
                            lease_id: 0,
                            state: proto::HealthState::Up as i32,
                            load: Some(proto::Load {
                                in_flight: (*l * 16.0) as u32,
                                queue_length: 0,
                                load_ratio: *l,
                                avg_latency_ms: 40,
                            }),
                        }
                    })
                    .collect();
                let request = proto::ControlHeartbeatRequest {
                    report: None,
                    tenant: TENANT.into(),
                    sidecar: None,
                    instances,
                    lease_id: lease,
                };
                if let Err(e) = client.heartbeat(request).await {
                    eprintln!("heartbeat of sidecar {s} failed: {}", e.message());
                }
            }
        });
    }
    // The first round writes every instance's initial load; steady state starts after it.
    tokio::time::sleep(period + Duration::from_secs(1)).await;
    let counters = |s: &ControlStats| {
        (
            ControlStats::get(&s.heartbeats),
            ControlStats::get(&s.store_writes),
            ControlStats::get(&s.store_keep_alives),
            ControlStats::get(&s.load_writes),
            ControlStats::get(&s.state_writes),
            ControlStats::get(&s.load_writes_deferred),
        )
    };
    let before = counters(&stats);
    let cpu0 = thread_cpu("ar-control");
    let t0 = Instant::now();
    tokio::time::sleep(args.heartbeat_for.saturating_sub(period + Duration::from_secs(1))).await;
    let steady_secs = t0.elapsed().as_secs_f64();
    let heartbeat_cpu = thread_cpu("ar-control") - cpu0;
    let after = counters(&stats);
    let _ = stop_tx.send(true);
    while beats.join_next().await.is_some() {}
    let heartbeats = (after.0 - before.0) as f64;
    let writes = (after.1 - before.1) as f64;
    let keep_alives = (after.2 - before.2) as f64;
    let (load_writes, state_writes, deferred) = (after.3 - before.3, after.4 - before.4, after.5 - before.5);

    // Leases stay alive with empty reports while propagation is measured in quiet.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    for (s, client) in sidecars.iter().enumerate() {
        let (mut client, lease, mut stop) = (client.clone(), leases[s], stop_rx.clone());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = ticker.tick() => {}
                }
                let request = proto::ControlHeartbeatRequest {
                    report: None,
                    tenant: TENANT.into(),
                    sidecar: None,
                    instances: vec![],
                    lease_id: lease,
                };
                let _ = client.heartbeat(request).await;
            }
        });
    }

    // 4. and 5. Snapshot fan-out and propagation, through control and straight from etcd.
    let mut propagation = Vec::new();
    for &n in &args.watchers {
        eprintln!("propagation through control to {n} watching sidecars...");
        let cpu0 = thread_cpu("ar-control");
        let (ours, delivery) = through_control(&endpoint, &store, &stats, n, args).await?;
        let cpu = thread_cpu("ar-control") - cpu0;
        eprintln!("propagation straight from etcd to {n} watchers...");
        let raw = straight_from_etcd(etcd, &store, n, args).await?;
        propagation.push((n, ours, raw, delivery, cpu));
    }
    let _ = stop_tx.send(true);

    // The report.
    use std::fmt::Write as _;
    let ok = |pass: bool| if pass { "meets target" } else { "MISSES target" };
    let _ = writeln!(
        report,
        "\nAgent-Reach control service at scale ({} agents, {} sidecars)\n",
        per_sidecar * args.sidecars,
        args.sidecars
    );
    let ratio = registrations / raw_registrations;
    let _ = writeln!(report, "registration throughput");
    let _ =
        writeln!(report, "  raw etcd lease grant + put ({} at a time)   {raw_registrations:>9.0} /s", args.sidecars);
    let _ = writeln!(report, "  control Register ({} sidecars)             {registrations:>9.0} /s", args.sidecars);
    let _ = writeln!(report, "  ratio {ratio:.2} (target >= 0.5: {})", ok(ratio >= 0.5));
    let _ = writeln!(
        report,
        "  control CPU {registration_cpu:.2} s for {:.2} s ({:.0}% of one core; {:.0} us per registration)",
        registration_secs,
        100.0 * registration_cpu / registration_secs,
        1e6 * registration_cpu / (per_sidecar * args.sidecars) as f64
    );
    let per_beat = writes / heartbeats;
    let _ = writeln!(report, "\nheartbeats at steady load ({steady_secs:.1} s after a warm-up round)");
    let _ = writeln!(report, "  instance heartbeats           {heartbeats:>9.0} ({:.0} /s)", heartbeats / steady_secs);
    let _ = writeln!(
        report,
        "  etcd writes                   {writes:>9.0} ({load_writes} load, {state_writes} state; {deferred} load changes deferred)"
    );
    let _ =
        writeln!(report, "  etcd writes per heartbeat     {per_beat:>9.4} (target <= 0.1: {})", ok(per_beat <= 0.1));
    let _ = writeln!(
        report,
        "  lease keep-alives             {keep_alives:>9.0} ({:.4} per heartbeat)",
        keep_alives / heartbeats
    );
    let _ = writeln!(
        report,
        "  control CPU {heartbeat_cpu:.2} s for {steady_secs:.1} s ({:.1}% of one core; {:.1} us per heartbeat)",
        100.0 * heartbeat_cpu / steady_secs,
        1e6 * heartbeat_cpu / heartbeats
    );
    let _ = writeln!(report, "\nput -> applied in every watcher ({} puts, one every {:?})", args.puts, args.put_every);
    let _ = writeln!(report, "  watchers  path                     p50 ms   p99 ms   max ms");
    for (n, ours, raw, d, cpu) in &propagation {
        let row =
            |label: &str, l: &Latency| format!("  {n:>8}  {label:<22} {:>7.2}  {:>7.2}  {:>7.2}", l.p50, l.p99, l.max);
        let _ = writeln!(report, "{}", row("through control", ours));
        let _ = writeln!(report, "{}", row("raw etcd watchers", raw));
        let r = ours.p99 / raw.p99;
        let _ = writeln!(report, "            p99 ratio {r:.2} (target <= 1.5: {})", ok(r <= 1.5));
        let _ = writeln!(
            report,
            "            snapshot of {} instances ({} parts, {:.2} MB) read in full by all {n} watchers {:.2} s after their \
             watches started (target <= 2 s: {}); CPU meanwhile: control {:.2} s, simulated sidecars {:.2} s; \
             control wrote {:.0} MB in {} write calls; opening the {n} connections beforehand took {:.1} s; \
             control CPU {cpu:.1} s during the whole step",
            d.instances,
            d.parts,
            d.bytes as f64 / 1e6,
            d.secs,
            ok(d.secs <= 2.0),
            d.control_cpu,
            d.sidecars_cpu,
            d.control_writes.1 as f64 / 1e6,
            d.control_writes.0,
            d.connect_secs
        );
    }
    let etcd_cpu = etcd.metric("process_cpu_seconds_total").unwrap_or(f64::NAN);
    let _ = writeln!(report, "\netcd process CPU over the whole run: {etcd_cpu:.1} s");
    drop(control);
    Ok(report)
}

struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

/// For each put (by revision), the latest time any watcher applied it, minus the put's
/// start; in milliseconds, sorted.
fn latencies(starts: &[(i64, Instant)], seen: &[Vec<(i64, Instant)>]) -> Result<Latency, String> {
    let mut out = Vec::with_capacity(starts.len());
    for (revision, start) in starts {
        let mut latest = *start;
        for watcher in seen {
            let at = watcher
                .iter()
                .find(|(r, _)| r == revision)
                .map(|(_, at)| *at)
                .ok_or_else(|| format!("a watcher never applied revision {revision}"))?;
            latest = latest.max(at);
        }
        out.push(latest.duration_since(*start).as_secs_f64() * 1000.0);
    }
    out.sort_by(f64::total_cmp);
    Ok(Latency {
        p50: percentile(&out, 50.0),
        p99: percentile(&out, 99.0),
        max: out.last().copied().unwrap_or(f64::NAN),
    })
}

/// What a simulated sidecar reads of one `WatchEvent`.
enum Received {
    /// A snapshot part, walked field by field in the receive buffer, not decoded: its
    /// revision and flags, how many instances and policies it holds, its size, and its
    /// bytes when the reader keeps them (watcher 0, for a full decode after the clock).
    Part { revision: i64, resync: bool, more: bool, instances: usize, policies: usize, len: usize, kept: Option<Bytes> },
    /// A delta, decoded.
    Delta(proto::Delta),
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    prost::encoding::decode_varint(buf).map_err(|e| e.to_string())
}

/// Reads one encoded `WatchEvent` (see [`Received`]).
fn read_event(whole: &[u8]) -> Result<Received, String> {
    let mut buf = whole;
    let key = varint(&mut buf)?;
    let len = varint(&mut buf)? as usize;
    if len != buf.len() {
        return Err(format!("a WatchEvent of {} bytes holds a field of {len}", whole.len()));
    }
    match key {
        // WatchEvent.snapshot
        0x0a => {}
        // WatchEvent.delta
        0x12 => return proto::Delta::decode(buf).map(Received::Delta).map_err(|e| e.to_string()),
        other => return Err(format!("unexpected WatchEvent field key {other}")),
    }
    let (mut revision, mut resync, mut more, mut instances, mut policies) = (0, false, false, 0, 0);
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        match (key >> 3, key & 7) {
            (field, 0) => {
                let value = varint(&mut buf)?;
                match field {
                    1 => revision = value as i64,
                    3 => resync = value != 0,
                    5 => more = value != 0,
                    _ => {}
                }
            }
            (field, 2) => {
                let len = varint(&mut buf)? as usize;
                if len > buf.len() {
                    return Err(format!("snapshot field {field} runs past the end of its part"));
                }
                buf.advance(len);
                match field {
                    2 => instances += 1,
                    4 => policies += 1,
                    _ => {}
                }
            }
            (field, wire) => return Err(format!("snapshot field {field} has wire type {wire}")),
        }
    }
    Ok(Received::Part { revision, resync, more, instances, policies, len: whole.len(), kept: None })
}

/// The simulated sidecars' codec for `Watch`: requests encoded by prost, events read by
/// [`read_event`] where they were received (tonic's buffer is reused for the next one);
/// `keep` copies each snapshot part out as well.
#[derive(Clone, Copy, Default)]
struct WatchCodec {
    keep: bool,
}

struct RequestEncoder;

impl Encoder for RequestEncoder {
    type Item = proto::WatchRequest;
    type Error = tonic::Status;

    fn encode(&mut self, item: proto::WatchRequest, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        item.encode(dst).map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

struct EventReader {
    keep: bool,
}

impl Decoder for EventReader {
    type Item = Received;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Received>, tonic::Status> {
        let len = src.remaining();
        if src.chunk().len() != len {
            return Err(tonic::Status::internal("a message not in one piece"));
        }
        let mut event = read_event(src.chunk()).map_err(tonic::Status::internal)?;
        if let Received::Part { kept, .. } = &mut event
            && self.keep
        {
            *kept = Some(Bytes::copy_from_slice(src.chunk()));
        }
        src.advance(len);
        Ok(Some(event))
    }
}

impl Codec for WatchCodec {
    type Encode = proto::WatchRequest;
    type Decode = Received;
    type Encoder = RequestEncoder;
    type Decoder = EventReader;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> EventReader {
        EventReader { keep: self.keep }
    }
}

/// Sidecar `i`'s watch of the tenant from scratch, on a connection opened beforehand.
async fn watch(channel: Channel, i: usize) -> Result<tonic::Streaming<Received>, String> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(256 << 20);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let request = proto::WatchRequest {
        tenant: TENANT.into(),
        sidecar: Some(proto::SidecarIdentity { sidecar_id: format!("watcher-{i}"), mesh_address: "w:1".into() }),
        from_revision: 0,
    };
    let path = http::uri::PathAndQuery::from_static(WATCH_PATH);
    let codec = WatchCodec { keep: i == 0 };
    let response = grpc.server_streaming(tonic::Request::new(request), path, codec).await;
    response.map(|r| r.into_inner()).map_err(|e| e.to_string())
}

/// One sidecar's snapshot as it arrived.
struct Arrived {
    revision: i64,
    instances: usize,
    policies: usize,
    parts: usize,
    bytes: usize,
    /// When its last part (`more` = false) was read.
    at: Instant,
    /// Its parts' bytes, when asked to keep them (for a full decode after the clock).
    kept: Vec<Bytes>,
}

/// Reads a fresh watch's snapshot up to its last part: every part at the same revision,
/// none flagged resync, nothing else in between.
async fn receive_snapshot(stream: &mut tonic::Streaming<Received>) -> Result<Arrived, String> {
    let mut got =
        Arrived { revision: 0, instances: 0, policies: 0, parts: 0, bytes: 0, at: Instant::now(), kept: vec![] };
    loop {
        let event = stream.message().await.map_err(|e| e.to_string())?.ok_or("the stream ended inside the snapshot")?;
        let Received::Part { revision, resync, more, instances, policies, len, kept } = event else {
            return Err("a delta before the snapshot's last part".into());
        };
        if resync {
            return Err("a resync snapshot on a watch from revision 0".into());
        }
        if got.parts > 0 && revision != got.revision {
            return Err(format!("snapshot parts at revisions {} and {revision}", got.revision));
        }
        got.revision = revision;
        got.parts += 1;
        got.instances += instances;
        got.policies += policies;
        got.bytes += len;
        got.kept.extend(kept);
        if !more {
            got.at = Instant::now();
            return Ok(got);
        }
    }
}

/// How the snapshots reached the watchers (see [`through_control`]).
struct Delivery {
    /// From the moment the watchers were let go until the last one had read its
    /// snapshot's last part.
    secs: f64,
    /// Opening the watchers' connections beforehand (not in `secs`).
    connect_secs: f64,
    instances: usize,
    parts: usize,
    bytes: usize,
    /// CPU seconds during `secs`: control's threads, and the bench's (the simulated
    /// sidecars reading the snapshots, on the same 2 cores).
    control_cpu: f64,
    sidecars_cpu: f64,
    /// Write calls control's threads made during `secs`, and the bytes they wrote.
    control_writes: (u64, u64),
}

/// `n` sidecars watching the tenant through control. Their connections are opened first,
/// then all `n` watches start at once and the clock runs until every watcher has read the
/// last part of its snapshot. A watcher walks each part's fields (revision, flags, one
/// count per instance; see [`read_event`]) instead of decoding the instances; each must
/// have every instance the store holds for the tenant, at a revision no older than the
/// tenant's newest change, and watcher 0 decodes its parts fully afterwards and
/// checks the instance ids. Then each applies every delta in order and notes when it
/// applied each revision. Returns the latencies and the snapshot delivery.
async fn through_control(
    endpoint: &str,
    store: &EtcdStore,
    stats: &ControlStats,
    n: usize,
    args: &Args,
) -> Result<(Latency, Delivery), String> {
    let prefix = keys::agents_prefix(TENANT);
    let range = store.get_prefix(&prefix).await.map_err(|e| e.to_string())?;
    let mut expected: Vec<String> = range
        .kvs
        .iter()
        .filter_map(|kv| keys::parse_instance_key(&prefix, &kv.key).map(|(_, id)| id.to_string()))
        .collect();
    expected.sort();
    // The tenant's newest change: control's snapshot is at least that recent (the store's
    // own revision also counts other prefixes' writes, which control does not watch).
    let newest = range.kvs.iter().map(|kv| kv.mod_revision).max().unwrap_or(0);
    let t_connect = Instant::now();
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(control_channel(endpoint).await?);
    }
    let connect_secs = t_connect.elapsed().as_secs_f64();
    let (start_tx, start_rx) = tokio::sync::watch::channel(false);
    let (done_tx, done_rx) = tokio::sync::watch::channel(0i64);
    let (arrived_tx, mut arrived_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watchers = tokio::task::JoinSet::new();
    for (i, channel) in channels.into_iter().enumerate() {
        let (mut start, mut done, arrived_tx) = (start_rx.clone(), done_rx.clone(), arrived_tx.clone());
        watchers.spawn(async move {
            start.wait_for(|go| *go).await.map_err(|e| e.to_string())?;
            let mut stream = watch(channel, i).await?;
            let arrived = receive_snapshot(&mut stream).await?;
            let mut revision = arrived.revision;
            let _ = arrived_tx.send(arrived);
            let mut seen = Vec::new();
            loop {
                let event = tokio::select! {
                    e = stream.message() => e.map_err(|e| e.to_string())?.ok_or("stream ended")?,
                    _ = done.wait_for(|last| *last > 0 && revision >= *last) => return Ok(seen),
                };
                let at = Instant::now();
                let Received::Delta(d) = event else { return Err("a snapshot part after the snapshot".into()) };
                if d.prev_revision > revision || d.revision <= revision {
                    return Err(format!("delta {} does not follow {revision}", d.revision));
                }
                revision = d.revision;
                seen.push((revision, at));
                if done.borrow().gt(&0) && revision >= *done.borrow() {
                    return Ok(seen);
                }
            }
        });
    }
    drop(arrived_tx);
    let snapshots_before = ControlStats::get(&stats.snapshots_sent);
    let (control0, sidecars0, writes0) = (thread_cpu("ar-control"), thread_cpu("bench"), thread_writes("ar-control"));
    let t0 = Instant::now();
    let _ = start_tx.send(true);
    let mut arrived = Vec::with_capacity(n);
    let deadline = tokio::time::sleep(Duration::from_secs(600));
    tokio::pin!(deadline);
    while arrived.len() < n {
        tokio::select! {
            got = arrived_rx.recv() => arrived.push(got.ok_or("a watcher stopped before its snapshot arrived")?),
            Some(ended) = watchers.join_next() => {
                ended.map_err(|e| e.to_string())??;
                return Err("a watcher ended before the measurement did".into());
            }
            _ = &mut deadline => return Err("the watchers' snapshots did not all arrive within 10 minutes".into()),
        }
    }
    let last = arrived.iter().map(|a| a.at).max().unwrap_or(t0);
    let secs = last.duration_since(t0).as_secs_f64();
    let (control_cpu, sidecars_cpu) = (thread_cpu("ar-control") - control0, thread_cpu("bench") - sidecars0);
    let writes = thread_writes("ar-control");
    let control_writes = (writes.0 - writes0.0, writes.1 - writes0.1);
    // Every watcher has the whole snapshot, and control sent exactly one to each.
    let now = store.current_revision().await.map_err(|e| e.to_string())?;
    for (k, a) in arrived.iter().enumerate() {
        if a.instances != expected.len() || a.revision < newest || a.revision > now {
            return Err(format!(
                "snapshot {k}: {} instances at revision {}; expected {} at a revision in {}..={now}",
                a.instances,
                a.revision,
                expected.len(),
                newest
            ));
        }
    }
    let sent = ControlStats::get(&stats.snapshots_sent) - snapshots_before;
    if sent != n as u64 {
        return Err(format!("control sent {sent} snapshots to {n} watchers"));
    }
    let first = arrived.iter().find(|a| !a.kept.is_empty()).ok_or("watcher 0 kept no parts")?;
    let (mut ids, mut policies) = (Vec::with_capacity(first.instances), 0);
    for part in &first.kept {
        let event = proto::WatchEvent::decode(part.clone()).map_err(|e| e.to_string())?;
        let Some(proto::watch_event::Event::Snapshot(s)) = event.event else {
            return Err("not a snapshot part".into());
        };
        ids.extend(s.instances.into_iter().map(|i| i.instance_id));
        policies += s.policies.len();
    }
    ids.sort();
    if ids != expected {
        return Err(format!(
            "watcher 0's snapshot holds {} ids, not the {} the store holds",
            ids.len(),
            expected.len()
        ));
    }
    if let Some(a) = arrived.iter().find(|a| a.policies != policies) {
        return Err(format!("a snapshot with {} policies, watcher 0's has {policies}", a.policies));
    }
    let delivery = Delivery {
        secs,
        connect_secs,
        instances: first.instances,
        parts: first.parts,
        bytes: first.bytes,
        control_cpu,
        sidecars_cpu,
        control_writes,
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut starts = Vec::with_capacity(args.puts);
    for k in 0..args.puts {
        let id = format!("probe-{}", k % 10);
        let value = encode(&stored(&id, "bench-probe", "probe", 0));
        let start = Instant::now();
        let revision =
            store.put(&keys::instance_key(TENANT, "bench-probe", &id), value, None).await.map_err(|e| e.to_string())?;
        starts.push((revision, start));
        tokio::time::sleep(args.put_every).await;
    }
    let _ = done_tx.send(starts.last().map_or(1, |(r, _)| *r));
    let mut seen = Vec::with_capacity(n);
    while let Some(result) = watchers.join_next().await {
        seen.push(result.map_err(|e| e.to_string())??);
    }
    Ok((latencies(&starts, &seen)?, delivery))
}

/// `n` clients watching a prefix straight from etcd, each on its own connection.
async fn straight_from_etcd(etcd: &EtcdServer, store: &EtcdStore, n: usize, args: &Args) -> Result<Latency, String> {
    let prefix = format!("/bench-watch-{n}/");
    let from = store.current_revision().await.map_err(|e| e.to_string())? + 1;
    let (done_tx, done_rx) = tokio::sync::watch::channel(0i64);
    let mut watchers = tokio::task::JoinSet::new();
    for _ in 0..n {
        let client = etcd_client(etcd).await?;
        let mut watch = client.watch_prefix(&prefix, from).await.map_err(|e| e.to_string())?;
        let mut done = done_rx.clone();
        watchers.spawn(async move {
            let _client = client;
            let mut seen = Vec::new();
            let mut revision = 0;
            loop {
                let batch = tokio::select! {
                    b = watch.next() => b.ok_or("watch ended")?.map_err(|e| e.to_string())?,
                    _ = done.wait_for(|last| *last > 0 && revision >= *last) => return Ok::<_, String>(seen),
                };
                let at = Instant::now();
                for event in batch.events {
                    revision = event.kv.mod_revision;
                    seen.push((revision, at));
                }
                if done.borrow().gt(&0) && revision >= *done.borrow() {
                    return Ok(seen);
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let value = encode(&stored("probe-0", "bench-probe", "probe", 0));
    let mut starts = Vec::with_capacity(args.puts);
    for k in 0..args.puts {
        let start = Instant::now();
        let revision =
            store.put(&format!("{prefix}{}", k % 10), value.clone(), None).await.map_err(|e| e.to_string())?;
        starts.push((revision, start));
        tokio::time::sleep(args.put_every).await;
    }
    let _ = done_tx.send(starts.last().map_or(1, |(r, _)| *r));
    let mut seen = Vec::with_capacity(n);
    while let Some(result) = watchers.join_next().await {
        seen.push(result.map_err(|e| e.to_string())??);
    }
    latencies(&starts, &seen)
}
