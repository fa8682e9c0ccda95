//! `agent-reach-bench run`: the side-by-side benchmark of issue #7, end to end.
//!
//! It starts, on 127.0.0.1: control (embedded store), sidecars A and B (one runtime thread
//! each), the echo agent (registered with sidecar B), nginx A → nginx B → agent
//! (`grpc_pass`, one worker each) and Envoy A → Envoy B → agent (`--concurrency 1` each).
//! With two or more CPUs, every proxy and sidecar is pinned to CPU 1 and everything else
//! (client, agent, control) to CPU 0, the same for every path. For each repetition,
//! payload and path (interleaved, so drift hits all paths alike) it verifies the path with
//! a real gRPC client, runs h2load closed loop, then the open-loop generator at each fixed
//! rate, reading CPU and peak RSS of every process before and after each run (and, where
//! `perf stat` counts them, instructions and cycles of every proxy process over each
//! fixed-rate run: [`crate::hwcounters`], detected once at start). After the payloads of
//! each repetition, every path carries server-streaming calls of 64 KiB chunks
//! ([`crate::stream`]; `--no-stream` skips them), with CPU per MB of every process. Then it
//! measures sidecar memory with large routing tables, and writes `latest.json` and
//! `latest.md` to the output directory. Any error answer on any path, or any stream that
//! does not end with grpc-status 0 and every byte, fails the run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::h2load::{self, H2loadSpec};
use crate::hwcounters::{self, Availability};
use crate::load::LoadResult;
use crate::machine::{self, Machine};
use crate::procs::{self, Binaries, Proc};
use crate::procstat;
use crate::proxies::{self, Tools};
use crate::report::{
    self, Measurement, ProcUsage, Report, RoleCounters, Settings, StreamMeasurement, StreamProcUsage, Streaming,
    Verification,
};
use crate::stream::StreamResult;
use crate::table_rss;
use crate::tls::TlsFiles;
use crate::verify;
use crate::wire::Kind;

/// The four paths, in the order they are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PathName {
    Direct,
    Mesh,
    Nginx,
    Envoy,
}

impl PathName {
    pub fn as_str(self) -> &'static str {
        match self {
            PathName::Direct => "direct",
            PathName::Mesh => "mesh",
            PathName::Nginx => "nginx",
            PathName::Envoy => "envoy",
        }
    }
    fn kind(self) -> Kind {
        if self == PathName::Mesh { Kind::Mesh } else { Kind::Agent }
    }
}

/// Where processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pin {
    /// With 2+ CPUs: proxies and sidecars on CPU 1, client, agent and control on CPU 0.
    Auto,
    /// No pinning: the scheduler places everything.
    None,
}

fn duration(s: &str) -> Result<Duration, String> {
    agent_reach_support::duration::parse(s)
}

/// Flags of `agent-reach-bench run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// A tiny run for the smoke test: 1 repetition, a few hundred calls per path and load,
    /// small rates, a 100-instance table. Overrides the sizes below.
    #[arg(long)]
    pub smoke: bool,
    /// Directory for latest.json and latest.md.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Closed-loop (h2load) duration per run.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub duration: Duration,
    /// Open-loop duration per rate and run.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub open_duration: Duration,
    /// Unmeasured load before each closed- and open-loop run.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub warmup: Duration,
    /// Open-loop rates, calls per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub rates: Vec<u32>,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "12,1024")]
    pub payloads: Vec<usize>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "direct,mesh,nginx,envoy")]
    pub paths: Vec<PathName>,
    /// HTTP/2 connections of the open-loop generator.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// h2load connections (-c).
    #[arg(long, default_value_t = 4)]
    pub h2load_connections: usize,
    /// h2load concurrent streams per connection (-m).
    #[arg(long, default_value_t = 16)]
    pub h2load_streams: usize,
    #[arg(long, value_enum, default_value = "auto")]
    pub pin: Pin,
    /// Runtime threads of the echo agent.
    #[arg(long, default_value_t = 1)]
    pub agent_threads: usize,
    /// Run sidecar and control from this binary instead of the release binaries beside it.
    #[arg(long)]
    pub embedded: bool,
    /// Routing-table sizes for the sidecar memory measurement (`--table-sizes` with no
    /// value skips it).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1000,10000")]
    pub table_sizes: Vec<usize>,
    /// Calls made with the real gRPC client to verify each path before it is loaded.
    #[arg(long, default_value_t = 20)]
    pub verify_calls: usize,
    /// Before each path's measurements, wait (up to --quiet-wait) until processes outside
    /// the benchmark use less than this many CPU cores (sampled over 2 s). 0: do not wait.
    #[arg(long, default_value_t = 0.0)]
    pub quiet_below: f64,
    /// Longest wait for a quiet machine per path; measuring then goes ahead (and the other
    /// load is recorded).
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub quiet_wait: Duration,
    /// Keep the temporary directory (configs and logs of every process).
    #[arg(long)]
    pub keep_tmp: bool,
    /// Skip the streaming measurement (server-streaming calls of 64 KiB chunks).
    #[arg(long)]
    pub no_stream: bool,
    /// Streaming: measured duration per path and repetition.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub stream_duration: Duration,
    /// Streaming: 64 KiB chunks per stream.
    #[arg(long, default_value_t = 64)]
    pub stream_chunks: u32,
    /// Streaming: streams in flight at once.
    #[arg(long, default_value_t = 4)]
    pub stream_concurrency: usize,
    /// Streaming: HTTP/2 connections the streams share.
    #[arg(long, default_value_t = 2)]
    pub stream_connections: usize,
    /// TLS 1.3 with client certificates between the two proxies of every path: the mesh
    /// with its secure defaults (mutual TLS, certificates from control), nginx with
    /// `grpc_pass grpcs://`, Envoy with TLS transport sockets (see `tls.rs`).
    #[arg(long)]
    pub tls: bool,
}

impl RunArgs {
    fn apply_smoke(&mut self) {
        if self.smoke {
            self.reps = 1;
            self.warmup = Duration::from_millis(200);
            self.open_duration = Duration::from_millis(600);
            // TLS: lower rates, so a loaded machine running debug builds keeps up (the smoke
            // run checks that every path answers, not how fast).
            self.rates = if self.tls { vec![100, 200] } else { vec![200, 500] };
            self.table_sizes = vec![100];
            self.verify_calls = 5;
            self.stream_duration = Duration::from_millis(400);
            self.stream_chunks = 8;
            self.stream_concurrency = 2;
        }
    }
}

/// CPU lists for the client side and the proxy side.
struct Pinning {
    client: Option<String>,
    proxies: Option<String>,
    description: String,
}

impl Pinning {
    fn new(pin: Pin) -> Pinning {
        let cores = machine::cores();
        if pin == Pin::Auto && cores >= 2 {
            Pinning {
                client: Some("0".into()),
                proxies: Some("1".into()),
                description: "taskset: every proxy and sidecar process on CPU 1 (both hops of a path share it); \
                              load generator, echo agent and control on CPU 0; the same for every path"
                    .into(),
            }
        } else {
            Pinning {
                client: None,
                proxies: None,
                description: format!("none ({cores} CPU(s) shared by every process)"),
            }
        }
    }
    fn client(&self) -> Option<&str> {
        self.client.as_deref()
    }
    fn proxies(&self) -> Option<&str> {
        self.proxies.as_deref()
    }
}

/// Every process of the run and the first-hop port of each path.
struct Topology {
    procs: Vec<(String, Proc)>,
    agent_port: u16,
    sidecar_a_port: u16,
    nginx_a_port: u16,
    envoy_a_port: u16,
}

impl Topology {
    async fn start(
        binaries: &Binaries,
        tools: &Tools,
        pin: &Pinning,
        dir: &Path,
        nginx_version: (u32, u32, u32),
        agent_threads: usize,
        tls: Option<&TlsFiles>,
    ) -> Result<Topology, String> {
        let mut procs: Vec<(String, Proc)> = Vec::new();
        let port = procs::free_port;
        let control_port = port()?;
        let mut cmd = binaries.control(pin.client());
        let mut control_args = procs::control_args(control_port, &[])?;
        if let Some(tls) = tls {
            control_args = tls.control_args_of(control_args)?;
        }
        cmd.args(control_args).env("RUST_LOG", "warn");
        start(&mut procs, "control", cmd, dir, control_port).await?;

        let mut sidecar_ports = Vec::new();
        for (role, id) in [("sidecar A", "bench-sidecar-a"), ("sidecar B", "bench-sidecar-b")] {
            let (local, mesh) = (port()?, port()?);
            let mut cmd = binaries.sidecar(pin.proxies());
            let mut sidecar_args = procs::sidecar_args(id, local, mesh, control_port)?;
            if let Some(tls) = tls {
                sidecar_args = tls.sidecar_args_of(sidecar_args, control_port, id).await?;
            }
            cmd.args(sidecar_args).env("RUST_LOG", "warn");
            start(&mut procs, role, cmd, dir, local).await?;
            sidecar_ports.push(local);
        }

        let agent_port = port()?;
        let mut cmd = binaries.bench(pin.client());
        cmd.args([
            "agent",
            "--sidecar",
            &format!("127.0.0.1:{}", sidecar_ports[1]),
            "--listen",
            &format!("127.0.0.1:{agent_port}"),
            "--threads",
            &agent_threads.to_string(),
        ])
        .env("RUST_LOG", "warn");
        start(&mut procs, "agent", cmd, dir, agent_port).await?;

        let (nginx_b, nginx_a) = (port()?, port()?);
        for (role, name, listen, upstream) in
            [("nginx B", "nginx-b", nginx_b, agent_port), ("nginx A", "nginx-a", nginx_a, nginx_b)]
        {
            let conf = dir.join(format!("{name}.conf"));
            let hop = proxies::Hop { listen, upstream, tls: tls.map(|t| &t.proxy), serves_tls: name == "nginx-b" };
            std::fs::write(&conf, proxies::nginx_conf(dir, name, &hop, nginx_version))
                .map_err(|e| format!("{}: {e}", conf.display()))?;
            let mut cmd = procs::command(&tools.nginx, pin.proxies());
            cmd.arg("-p").arg(dir).arg("-c").arg(&conf).arg("-e").arg(dir.join(format!("{name}.startup.log")));
            start(&mut procs, role, cmd, dir, listen).await?;
        }

        let (envoy_b, envoy_a) = (port()?, port()?);
        for (role, name, listen, upstream) in
            [("envoy B", "envoy-b", envoy_b, agent_port), ("envoy A", "envoy-a", envoy_a, envoy_b)]
        {
            let conf = dir.join(format!("{name}.yaml"));
            let hop = proxies::Hop { listen, upstream, tls: tls.map(|t| &t.proxy), serves_tls: name == "envoy-b" };
            std::fs::write(&conf, proxies::envoy_conf(name, &hop)).map_err(|e| format!("{}: {e}", conf.display()))?;
            let mut cmd = procs::command(&tools.envoy, pin.proxies());
            cmd.arg("-c").arg(&conf).args(["--concurrency", "1", "--disable-hot-restart", "--log-level", "error"]);
            start(&mut procs, role, cmd, dir, listen).await?;
        }
        Ok(Topology {
            procs,
            agent_port,
            sidecar_a_port: sidecar_ports[0],
            nginx_a_port: nginx_a,
            envoy_a_port: envoy_a,
        })
    }

    fn port(&self, path: PathName) -> u16 {
        match path {
            PathName::Direct => self.agent_port,
            PathName::Mesh => self.sidecar_a_port,
            PathName::Nginx => self.nginx_a_port,
            PathName::Envoy => self.envoy_a_port,
        }
    }

    fn pid(&self, role: &str) -> Option<u32> {
        self.procs.iter().find(|(r, _)| r == role).map(|(_, p)| p.pid())
    }

    /// The measured process groups of `path`: its proxies, and the agent.
    fn groups(&self, path: PathName, scan: &std::collections::HashMap<u32, procstat::Stat>) -> Vec<(String, Vec<u32>)> {
        report::proxy_roles(path.as_str())
            .iter()
            .chain(["agent"].iter())
            .filter_map(|role| {
                let pid = self.pid(role)?;
                // An nginx master's worker does the work; include every child.
                let mut pids = vec![pid];
                pids.extend(procstat::children(scan, pid));
                Some((role.to_string(), pids))
            })
            .collect()
    }

    fn check_alive(&mut self) -> Result<(), String> {
        for (_, p) in &mut self.procs {
            p.check_alive()?;
        }
        Ok(())
    }
}

async fn start(
    procs: &mut Vec<(String, Proc)>,
    role: &str,
    cmd: std::process::Command,
    dir: &Path,
    port: u16,
) -> Result<(), String> {
    let name = role.replace(' ', "-");
    let mut p = Proc::spawn(&name, cmd, dir)?;
    procs::wait_port(([127, 0, 0, 1], port).into(), &mut p, Duration::from_secs(20)).await?;
    procs.push((role.to_string(), p));
    Ok(())
}

/// CPU and peak RSS of process groups over one measurement, and the CPU used by everything
/// else on the machine.
struct Probe {
    groups: Vec<(String, Vec<u32>)>,
    before: std::collections::HashMap<u32, procstat::Stat>,
    started: Instant,
}

impl Probe {
    fn start(topo: &Topology, path: PathName) -> Probe {
        let before = procstat::all();
        let groups = topo.groups(path, &before);
        for (_, pids) in &groups {
            for pid in pids {
                let _ = procstat::reset_peak(*pid);
            }
        }
        Probe { groups, before, started: Instant::now() }
    }

    /// `perf stat` on each proxy group of the probe (not the agent), when counters exist.
    fn counters(
        &self,
        hw: &Availability,
        cpus: Option<&str>,
        dir: &Path,
        tag: &str,
    ) -> Vec<(String, Vec<u32>, hwcounters::Session)> {
        if !hw.available() {
            return Vec::new();
        }
        self.groups
            .iter()
            .filter(|(role, _)| role != "agent")
            .filter_map(|(role, pids)| {
                let out = dir.join(format!("perf-{tag}-{}.csv", role.replace(' ', "-")));
                match hwcounters::Session::start(pids, cpus, &out) {
                    Ok(s) => Some((role.clone(), pids.clone(), s)),
                    Err(e) => {
                        eprintln!("#   perf stat on {role}: {e}");
                        None
                    }
                }
            })
            .collect()
    }

    /// Usage per group for `calls` calls; and cores used by other processes.
    fn finish(self, calls: u64) -> (Vec<ProcUsage>, f64, f64) {
        let wall = self.started.elapsed().as_secs_f64();
        let after = procstat::all();
        let tps = procstat::ticks_per_second() as f64;
        let usage = self
            .groups
            .iter()
            .map(|(role, pids)| {
                let ticks: u64 = pids
                    .iter()
                    .map(|p| {
                        let a = after.get(p).map_or(0, |s| s.cpu_ticks);
                        a.saturating_sub(self.before.get(p).map_or(0, |s| s.cpu_ticks))
                    })
                    .sum();
                let cpu_s = ticks as f64 / tps;
                ProcUsage {
                    role: role.clone(),
                    pids: pids.clone(),
                    cpu_s,
                    cpu_ms_per_1k_calls: if calls > 0 { cpu_s * 1e3 / calls as f64 * 1e3 } else { f64::NAN },
                    peak_rss_kib: pids.iter().filter_map(|p| procstat::status_kib(*p, "VmHWM")).max().unwrap_or(0),
                }
            })
            .collect();
        let other = procstat::foreign_cpu_seconds(&self.before, &after, std::process::id()) / wall.max(1e-9);
        (usage, other, wall)
    }
}

/// Runs the benchmark; the report says whether every path answered without errors.
pub async fn run(mut args: RunArgs) -> Result<Report, String> {
    args.apply_smoke();
    let tools = Tools::find()?;
    let binaries = Binaries::locate(args.embedded)?;
    let pin = Pinning::new(args.pin);
    let nginx_version = proxies::nginx_version(&tools.nginx).ok_or("cannot read nginx's version (nginx -v)")?;
    let tmp = tempfile::Builder::new().prefix("agent-reach-bench-").tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let dir = tmp.path().to_path_buf();
    if args.keep_tmp {
        eprintln!("# processes' configs and logs: {}", dir.display());
    }
    let date = machine::utc_now();
    let loadavg_start = machine::loadavg();
    let machine = Machine::current();
    eprintln!("# agent-reach-bench run — {date}, {}", machine.describe());
    eprintln!("# load average at start: {:.2} {:.2} {:.2}", loadavg_start[0], loadavg_start[1], loadavg_start[2]);
    let hw = hwcounters::detect();
    eprintln!("# hardware counters: {}", hw.describe());

    let settings = Settings {
        smoke: args.smoke,
        reps: args.reps,
        paths: args.paths.iter().map(|p| p.as_str().to_string()).collect(),
        payloads: args.payloads.clone(),
        rates: args.rates.clone(),
        closed_loop: if args.smoke {
            format!(
                "h2load -t 1 -c {} -m {}, {} calls per run",
                args.h2load_connections,
                args.h2load_streams,
                smoke_requests(&args)
            )
        } else {
            format!(
                "h2load -t 1 -c {} -m {} ({} streams in flight), {} s per run after a {} s unmeasured warm-up run",
                args.h2load_connections,
                args.h2load_streams,
                args.h2load_connections * args.h2load_streams,
                args.duration.as_secs(),
                args.warmup.as_secs_f64()
            )
        },
        open_loop: format!(
            "agent-reach-bench load: fixed rates {} calls/s over {} HTTP/2 connections, {:.1} s measured after {:.1} s \
             warm-up, latency from each call's scheduled send time (HdrHistogram)",
            args.rates.iter().map(u32::to_string).collect::<Vec<_>>().join(" and "),
            args.connections,
            args.open_duration.as_secs_f64(),
            args.warmup.as_secs_f64()
        ),
        pinning: pin.description.clone(),
        tls: if args.tls {
            "TLS 1.3 with client certificates between the two proxies of every path (mesh: mutual TLS with \
             certificates from control, its secure default; nginx: grpc_pass grpcs://; Envoy: TLS transport \
             sockets); client → first proxy and last proxy → agent plaintext"
                .into()
        } else {
            "none (plaintext on every hop)".into()
        },
        cpu_budget: "each sidecar one runtime thread (--worker-threads 1); each nginx worker_processes 1; each \
                     Envoy --concurrency 1; echo agent "
            .to_string()
            + &format!("{} runtime thread(s)", args.agent_threads),
        binaries: binaries.describe(),
        nginx: format!("{}.{}.{}", nginx_version.0, nginx_version.1, nginx_version.2),
        envoy: proxies::envoy_version(&tools.envoy),
        h2load: h2load::version(&tools.h2load),
        hardware_counters: hw.describe(),
    };

    let tls = if args.tls { Some(TlsFiles::create(&dir)?) } else { None };
    let mut topo =
        Topology::start(&binaries, &tools, &pin, &dir, nginx_version, args.agent_threads, tls.as_ref()).await?;
    for &path in &args.paths {
        verify::wait_ready(path.kind(), topo.port(path), Duration::from_secs(30))
            .await
            .map_err(|e| format!("{} path never answered: {e}", path.as_str()))?;
    }
    let mut bodies = std::collections::HashMap::new();
    for &payload in &args.payloads {
        for kind in [Kind::Agent, Kind::Mesh] {
            let file = dir.join(format!("body-{kind:?}-{payload}.bin"));
            std::fs::write(&file, crate::wire::request_body(kind, payload))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            bodies.insert((kind, payload), file);
        }
    }

    let mut measurements: Vec<Measurement> = Vec::new();
    let mut verifications = Vec::new();
    let mut failures = Vec::new();
    let mut stream_measurements: Vec<StreamMeasurement> = Vec::new();
    for rep in 1..=args.reps {
        for &payload in &args.payloads {
            for &path in &args.paths {
                topo.check_alive()?;
                let port = topo.port(path);
                let name = path.as_str();
                eprintln!(
                    "# rep {rep}/{} · {payload} B · {name} (load average {:.2})",
                    args.reps,
                    machine::loadavg()[0]
                );
                let checked = verify::verify(path.kind(), port, payload, args.verify_calls).await;
                verifications.push(Verification {
                    rep,
                    payload,
                    path: name.into(),
                    calls: args.verify_calls,
                    error: checked.as_ref().err().cloned(),
                });
                if let Err(e) = checked {
                    return Err(format!("{name} path, {payload} B: {e}"));
                }
                let body_file = bodies.get(&(path.kind(), payload)).cloned().ok_or("no request body file")?;
                wait_quiet(args.quiet_below, args.quiet_wait).await;
                let m = closed_loop(&args, &tools, &pin, &topo, path, payload, rep, port, body_file).await?;
                if m.errors > 0 {
                    failures
                        .push(format!("{name}, {payload} B, rep {rep}, closed loop: {} HTTP-level failures", m.errors));
                }
                eprintln!("#   closed loop {:.0} calls/s", m.throughput);
                measurements.push(m);
                for &rate in &args.rates {
                    wait_quiet(args.quiet_below, args.quiet_wait).await;
                    let m = open_loop(&args, &binaries, &pin, &topo, path, payload, rep, port, rate, &hw, &dir).await?;
                    if let Some(o) = &m.open_loop
                        && o.errors > 0
                    {
                        failures.push(format!(
                            "{name}, {payload} B, rep {rep}, {rate}/s: {} errors of {} calls, e.g. {:?}",
                            o.errors, o.sent, o.error_samples
                        ));
                    }
                    if let Some(l) = &m.latency_ms {
                        eprintln!(
                            "#   {rate}/s: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms ({} errors)",
                            l.p50, l.p99, l.p999, m.errors
                        );
                    }
                    measurements.push(m);
                }
            }
        }
        if !args.no_stream {
            for &path in &args.paths {
                topo.check_alive()?;
                let name = path.as_str();
                eprintln!("# rep {rep}/{} · streaming 64 KiB chunks · {name}", args.reps);
                wait_quiet(args.quiet_below, args.quiet_wait).await;
                let m = streaming(&args, &binaries, &pin, &topo, path, rep).await?;
                let r = &m.result;
                if r.errors > 0 || r.measured_streams == 0 {
                    failures.push(format!(
                        "{name}, streaming, rep {rep}: {} failed streams of {}, {} measured, e.g. {:?}",
                        r.errors,
                        r.errors + r.ok,
                        r.measured_streams,
                        r.error_samples
                    ));
                }
                eprintln!(
                    "#   {:.1} MB/s ({} streams of {} chunks, {} errors)",
                    r.mb_per_s, r.measured_streams, r.chunks_per_stream, r.errors
                );
                stream_measurements.push(m);
            }
        }
    }
    let loadavg_end = machine::loadavg();
    drop(topo);

    let table_rss = if args.table_sizes.is_empty() {
        Vec::new()
    } else {
        eprintln!("# sidecar memory with {:?} instances in the routing table", args.table_sizes);
        let setup = table_rss::Setup {
            binaries: &binaries,
            dir: &dir,
            sidecar_cpus: pin.proxies(),
            control_cpus: pin.client(),
            converge_timeout: if args.smoke { Duration::from_secs(30) } else { Duration::from_secs(180) },
        };
        table_rss::measure(&setup, &args.table_sizes).await?
    };

    let paths: Vec<String> = settings.paths.clone();
    let summary = report::summarize(&measurements, &paths, &args.payloads, &args.rates);
    let (ratios, mut targets) = report::ratios_and_targets(&summary, &args.payloads, &args.rates, &table_rss);
    let streaming = (!args.no_stream).then(|| {
        let summary = report::summarize_streams(&stream_measurements, &paths);
        let ratios = report::stream_ratios(&summary, crate::wire::STREAM_CHUNK);
        targets.extend(report::stream_target(&ratios));
        Streaming {
            setup: format!(
                "agent-reach-bench stream: {} server-streaming calls in flight over {} HTTP/2 connections, each \
                 asking the echo agent for {} chunks of 64 KiB (Agent/HandleStream; mesh: Sidecar/InvokeStream), \
                 {:.1} s measured after {:.1} s warm-up; every stream checked for grpc-status 0 and every chunk",
                args.stream_concurrency,
                args.stream_connections,
                args.stream_chunks,
                args.stream_duration.as_secs_f64(),
                args.warmup.as_secs_f64()
            ),
            measurements: stream_measurements,
            summary,
            ratios,
        }
    });
    let others: Vec<f64> = measurements
        .iter()
        .map(|m| m.other_cores)
        .chain(streaming.iter().flat_map(|s| s.measurements.iter().map(|m| m.other_cores)))
        .collect();
    let load = report::MachineLoad {
        loadavg_start,
        loadavg_end,
        other_cores_mean: others.iter().sum::<f64>() / others.len().max(1) as f64,
        other_cores_max: others.iter().copied().fold(0.0, f64::max),
    };
    let report = Report {
        date,
        machine,
        revision: machine::git_revision(),
        settings,
        load,
        verifications,
        measurements,
        summary,
        ratios,
        targets,
        table_rss,
        streaming,
        ok: failures.is_empty(),
        failures,
    };
    write(&args.out, &report)?;
    if args.keep_tmp {
        let kept = tmp.keep();
        eprintln!("# kept {}", kept.display());
    }
    Ok(report)
}

/// Waits until processes outside the benchmark use less than `cores` CPU cores over a 2 s
/// sample, or `max_wait` passes.
async fn wait_quiet(cores: f64, max_wait: Duration) {
    if cores <= 0.0 {
        return;
    }
    let until = Instant::now() + max_wait;
    loop {
        let before = procstat::all();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let other = procstat::foreign_cpu_seconds(&before, &procstat::all(), std::process::id()) / 2.0;
        if other < cores {
            return;
        }
        if Instant::now() > until {
            eprintln!("#   machine still busy ({other:.2} cores used by other processes); measuring anyway");
            return;
        }
        eprintln!("#   waiting for a quiet machine: other processes use {other:.2} cores");
        tokio::time::sleep(Duration::from_secs(8)).await;
    }
}

fn smoke_requests(args: &RunArgs) -> u64 {
    (args.h2load_connections * args.h2load_streams * 8).max(200) as u64
}

#[allow(clippy::too_many_arguments)]
async fn closed_loop(
    args: &RunArgs,
    tools: &Tools,
    pin: &Pinning,
    topo: &Topology,
    path: PathName,
    payload: usize,
    rep: usize,
    port: u16,
    body_file: PathBuf,
) -> Result<Measurement, String> {
    let mut spec = H2loadSpec {
        bin: tools.h2load.clone(),
        url: format!("http://127.0.0.1:{port}{}", path.kind().path()),
        body_file,
        connections: args.h2load_connections,
        streams: args.h2load_streams,
        duration: None,
        warmup: Duration::ZERO,
        requests: smoke_requests(args),
        cpus: pin.client.clone(),
    };
    if !args.smoke {
        if !args.warmup.is_zero() {
            spec.duration = Some(args.warmup.max(Duration::from_secs(1)));
            h2load::run(&spec).await.map_err(|e| format!("{} warm-up: {e}", path.as_str()))?;
        }
        spec.duration = Some(args.duration);
    }
    let probe = Probe::start(topo, path);
    let (result, _) = h2load::run(&spec).await.map_err(|e| format!("{}: {e}", path.as_str()))?;
    let (processes, other_cores, wall_s) = probe.finish(result.status_2xx);
    Ok(Measurement {
        rep,
        payload,
        path: path.as_str().into(),
        load: "closed".into(),
        rate: None,
        calls: result.status_2xx,
        errors: result.failures(),
        wall_s,
        throughput: result.req_per_s,
        latency_ms: None,
        h2load: Some(result),
        open_loop: None,
        processes,
        counters: Vec::new(),
        other_cores,
        loadavg_1m: machine::loadavg()[0],
    })
}

#[allow(clippy::too_many_arguments)]
async fn open_loop(
    args: &RunArgs,
    binaries: &Binaries,
    pin: &Pinning,
    topo: &Topology,
    path: PathName,
    payload: usize,
    rep: usize,
    port: u16,
    rate: u32,
    hw: &Availability,
    dir: &Path,
) -> Result<Measurement, String> {
    let mut cmd = tokio::process::Command::from(binaries.bench(pin.client()));
    cmd.args([
        "load",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--kind",
        if path.kind() == Kind::Mesh { "mesh" } else { "agent" },
        "--payload",
        &payload.to_string(),
        "--rate",
        &rate.to_string(),
        "--duration",
        &format!("{}ms", args.open_duration.as_millis()),
        "--warmup",
        &format!("{}ms", args.warmup.as_millis()),
        "--connections",
        &args.connections.to_string(),
    ])
    .stdin(std::process::Stdio::null())
    .kill_on_drop(true);
    let probe = Probe::start(topo, path);
    let perf = probe.counters(hw, pin.client(), dir, &format!("{rep}-{payload}-{}-{rate}", path.as_str()));
    let out = cmd.output().await.map_err(|e| format!("load generator: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "load generator on the {} path failed ({}): {}",
            path.as_str(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let result: LoadResult = serde_json::from_slice(&out.stdout).map_err(|e| format!("load generator output: {e}"))?;
    let (processes, other_cores, wall_s) = probe.finish(result.ok);
    let calls = result.ok.max(1) as f64;
    let mut counters = Vec::new();
    for (role, pids, session) in perf {
        match session.finish() {
            Ok(c) => counters.push(RoleCounters {
                role,
                pids,
                instructions: c.instructions,
                cycles: c.cycles,
                instructions_per_call: c.instructions as f64 / calls,
                cycles_per_call: c.cycles as f64 / calls,
            }),
            Err(e) => eprintln!("#   perf stat on {role}: no counts ({e})"),
        }
    }
    Ok(Measurement {
        rep,
        payload,
        path: path.as_str().into(),
        load: "open".into(),
        rate: Some(rate),
        calls: result.ok,
        errors: result.errors,
        wall_s,
        throughput: result.achieved_rate,
        latency_ms: Some(result.latency_ms.clone()),
        h2load: None,
        open_loop: Some(result),
        processes,
        counters,
        other_cores,
        loadavg_1m: machine::loadavg()[0],
    })
}

/// One streaming run on `path`: the streaming client in its own process (on the client
/// CPUs, like the open-loop generator), CPU of every process of the path around it.
async fn streaming(
    args: &RunArgs,
    binaries: &Binaries,
    pin: &Pinning,
    topo: &Topology,
    path: PathName,
    rep: usize,
) -> Result<StreamMeasurement, String> {
    let mut cmd = tokio::process::Command::from(binaries.bench(pin.client()));
    cmd.args([
        "stream",
        "--addr",
        &format!("127.0.0.1:{}", topo.port(path)),
        "--kind",
        if path.kind() == Kind::Mesh { "mesh" } else { "agent" },
        "--chunks",
        &args.stream_chunks.to_string(),
        "--concurrency",
        &args.stream_concurrency.to_string(),
        "--connections",
        &args.stream_connections.to_string(),
        "--duration",
        &format!("{}ms", args.stream_duration.as_millis()),
        "--warmup",
        &format!("{}ms", args.warmup.as_millis()),
    ])
    .stdin(std::process::Stdio::null())
    .kill_on_drop(true);
    let probe = Probe::start(topo, path);
    let out = cmd.output().await.map_err(|e| format!("streaming client: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "streaming client on the {} path failed ({}): {}",
            path.as_str(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let result: StreamResult =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("streaming client output: {e}"))?;
    let (usage, other_cores, wall_s) = probe.finish(0);
    let mb = result.payload_bytes as f64 / 1e6;
    let processes = usage
        .into_iter()
        .map(|u| StreamProcUsage {
            cpu_ms_per_mb: if mb > 0.0 { u.cpu_s * 1e3 / mb } else { f64::NAN },
            role: u.role,
            pids: u.pids,
            cpu_s: u.cpu_s,
            peak_rss_kib: u.peak_rss_kib,
        })
        .collect();
    Ok(StreamMeasurement {
        rep,
        path: path.as_str().into(),
        wall_s,
        result,
        processes,
        other_cores,
        loadavg_1m: machine::loadavg()[0],
    })
}

/// Writes `latest.json` and `latest.md` into `out`.
pub fn write(out: &Path, report: &Report) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(out.join("latest.json"), json + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::write(out.join("latest.md"), report::markdown(report)).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(())
}

/// `agent-reach-bench up`: starts every path as `run` does and keeps them up until ctrl-c,
/// printing each path's first hop and the process ids (for profiling with perf).
pub fn up_blocking(args: RunArgs) -> Result<(), String> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async {
        let tools = Tools::find()?;
        let binaries = Binaries::locate(args.embedded)?;
        let pin = Pinning::new(args.pin);
        let nginx_version = proxies::nginx_version(&tools.nginx).ok_or("cannot read nginx's version (nginx -v)")?;
        let tmp =
            tempfile::Builder::new().prefix("agent-reach-bench-").tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let tls = if args.tls { Some(TlsFiles::create(tmp.path())?) } else { None };
        let mut topo =
            Topology::start(&binaries, &tools, &pin, tmp.path(), nginx_version, args.agent_threads, tls.as_ref())
                .await?;
        for &path in &args.paths {
            verify::wait_ready(path.kind(), topo.port(path), Duration::from_secs(30)).await?;
        }
        println!("# pinning: {}", pin.description);
        println!("# configs and logs: {}", tmp.path().display());
        for (role, p) in &topo.procs {
            println!("pid {:>7}  {role}", p.pid());
        }
        for &path in &args.paths {
            println!("path {:<6} http://127.0.0.1:{}{}", path.as_str(), topo.port(path), path.kind().path());
        }
        println!("# up; ctrl-c stops everything");
        loop {
            tokio::select! {
                _ = agent_reach_support::process::shutdown_signal() => return Ok(()),
                _ = tokio::time::sleep(Duration::from_secs(1)) => topo.check_alive()?,
            }
        }
    })
}

/// Runs the benchmark on the calling (main) thread; ctrl-c stops it and its processes.
pub fn run_blocking(args: RunArgs) -> Result<Report, String> {
    // A current-thread runtime: every child process is spawned from this thread, which
    // lives as long as the run (children get SIGTERM when their spawning thread exits).
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
    let out = args.out.clone();
    let report = runtime.block_on(async {
        tokio::select! {
            r = run(args) => r,
            _ = agent_reach_support::process::shutdown_signal() => Err("interrupted".to_string()),
        }
    })?;
    eprintln!("# wrote {} and {}", out.join("latest.json").display(), out.join("latest.md").display());
    Ok(report)
}

#[cfg(test)]
mod args_tests {
    use super::RunArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn table_sizes_default_list_and_none() {
        let sizes = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).unwrap().run.table_sizes
        };
        assert_eq!(sizes(&[]), [1000, 10000]);
        assert_eq!(sizes(&["--table-sizes", "50,700"]), [50, 700]);
        assert!(sizes(&["--table-sizes"]).is_empty(), "no value: the measurement is skipped");
        assert!(sizes(&["--table-sizes", "--tls"]).is_empty());
    }
}
