//! Instructions per call of each sidecar, counted by valgrind's callgrind: a measure that
//! does not move with other work on the machine, the CPU's clock or the VM's neighbours
//! (CPU time does), for before/after comparisons of per-call work where hardware counters
//! (`perf stat -e instructions`) are not available.
//!
//! Starts control and the echo agent as `run` does, and both sidecars under
//! `valgrind --tool=callgrind`; sends warm-up calls through the mesh path, zeroes each
//! sidecar's counters (`callgrind_control --zero`), sends a fixed number of calls
//! (`concurrency` callers, each one call after another), dumps the counters
//! (`callgrind_control --dump`) and divides the instructions counted by the calls. Every
//! instruction each sidecar process ran in that window counts, on any of its threads (the
//! call path, timers, the control watch), as CPU time would; nothing else runs through
//! the sidecars meanwhile. Then an idle window as long as the calls' is counted the same
//! way, and the `_net` figures subtract it (valgrind slows the calls enough for the
//! sidecars' background work to show). Counts are of user space only: the kernel's share of a call
//! (socket reads and writes) is not included.
//!
//! The nginx → nginx → agent path of `run` is counted the same way, to attribute the
//! per-call gap hop by hop: nginx A and nginx B with the configuration `run` gives them
//! plus `master_process off` (one process serving, as its one worker does in `run`), each
//! under `valgrind --tool=callgrind --trace-children=no`, the same warm-up, zero, calls
//! (`Agent/Handle` through nginx A), dump and idle window; the `nginx_*` fields, and
//! `ratio_a_net` / `ratio_b_net` = sidecar / nginx per call, net of idle, per hop.
//!
//! With `--tls` the hop between the two proxies is TLS 1.3 with client certificates, set up
//! as `run --tls` does ([`crate::tls`]): control with `--mtls required` and a CA from files,
//! each sidecar buying its certificate with a join token and speaking mutual TLS to the
//! other; nginx A → nginx B with `grpc_pass grpcs://` and a client certificate, nginx B
//! requiring one. The caller's hop to A and B's hop to the agent stay plaintext.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::procs::{self, Binaries, Proc};
use crate::proxies;
use crate::tls::TlsFiles;
use crate::verify::{self, PathClient};
use crate::wire::Kind;

/// What one measurement counted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Instructions {
    pub calls: usize,
    pub concurrency: usize,
    pub payload: usize,
    /// Mutual TLS between sidecar A and B (and TLS with client certificates between nginx
    /// A and B), as `run --tls`.
    #[serde(default)]
    pub tls: bool,
    /// Which sidecar and control binaries ran, with the sidecar's `--version` (a standard
    /// or a profile-guided build).
    #[serde(default)]
    pub binaries: String,
    /// Instructions executed by sidecar A (the caller's) and B (the agent's) while the
    /// calls ran.
    pub sidecar_a: u64,
    pub sidecar_b: u64,
    pub sidecar_a_per_call: f64,
    pub sidecar_b_per_call: f64,
    /// Wall time of the measured calls (under valgrind: only to show they ran).
    pub seconds: f64,
    /// Instructions each sidecar ran in a window as long as the calls' with no calls
    /// (timers, heartbeats, the control watch), and the per-call counts less that
    /// background: under valgrind the calls take long enough for it to show.
    pub idle_a: u64,
    pub idle_b: u64,
    pub sidecar_a_per_call_net: f64,
    pub sidecar_b_per_call_net: f64,
    /// The nginx → nginx path counted the same way (absent with `--no-nginx`): nginx A
    /// (the caller's side) and nginx B (the agent's), the same number of calls.
    pub nginx_a: Option<u64>,
    pub nginx_b: Option<u64>,
    pub nginx_a_per_call: Option<f64>,
    pub nginx_b_per_call: Option<f64>,
    pub nginx_seconds: Option<f64>,
    pub nginx_idle_a: Option<u64>,
    pub nginx_idle_b: Option<u64>,
    pub nginx_a_per_call_net: Option<f64>,
    pub nginx_b_per_call_net: Option<f64>,
    /// Sidecar / nginx instructions per call on each hop, net of idle.
    pub ratio_a_net: Option<f64>,
    pub ratio_b_net: Option<f64>,
    /// nginx's version (`nginx -v`).
    pub nginx_version: Option<String>,
}

/// One hop pair counted over the same calls.
struct Window {
    a: u64,
    b: u64,
    idle_a: u64,
    idle_b: u64,
    seconds: f64,
}

impl Window {
    fn per_call(n: u64, calls: usize) -> f64 {
        n as f64 / calls as f64
    }
    fn net(total: u64, idle: u64, calls: usize) -> f64 {
        total.saturating_sub(idle) as f64 / calls as f64
    }
}

/// How to measure.
pub struct Spec {
    pub calls: usize,
    pub warmup: usize,
    pub concurrency: usize,
    pub payload: usize,
    pub embedded: bool,
    /// Count the nginx → nginx path too.
    pub nginx: bool,
    /// TLS between the two hops of each path, as `run --tls` (see the module doc).
    pub tls: bool,
    /// Where to leave callgrind's files and the logs (a temporary directory, removed
    /// afterwards, when `None`).
    pub keep: Option<PathBuf>,
}

/// One sidecar under callgrind.
struct Counted {
    proc: Proc,
    out: PathBuf,
}

impl Counted {
    /// Zeroes the counters, or dumps them and returns the instructions since the zero.
    fn control(&self, what: &str) -> Result<(), String> {
        let pid = self.proc.pid().to_string();
        let out = Command::new("callgrind_control")
            .arg(what)
            .arg(&pid)
            .output()
            .map_err(|e| format!("callgrind_control (from valgrind) is needed: {e}"))?;
        if !out.status.success() {
            return Err(format!("callgrind_control {what} {pid}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }

    /// Dumps the counters (the `n`-th dump) and returns the instructions of that dump.
    fn dump(&self, n: u32) -> Result<u64, String> {
        self.control("--dump")?;
        // callgrind names the n-th dump `<out>.<n>`.
        let file = PathBuf::from(format!("{}.{n}", self.out.display()));
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(n) = std::fs::read_to_string(&file).ok().as_deref().and_then(summary) {
                return Ok(n);
            }
            if Instant::now() > until {
                return Err(format!("no callgrind dump in {}", file.display()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The `summary:` (total instructions) of a callgrind output file.
pub fn summary(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("summary:")).and_then(|n| n.split_whitespace().next()?.parse().ok())
}

/// `valgrind --tool=callgrind` writing its counts to `out`, the program still to add.
fn callgrind(out: &Path) -> Command {
    let mut cmd = procs::command(Path::new("valgrind"), None);
    cmd.arg("--tool=callgrind").arg("--trace-children=no").arg(format!("--callgrind-out-file={}", out.display()));
    cmd
}

/// A sidecar command run under callgrind, writing its counts to `out`.
fn under_callgrind(binaries: &Binaries, out: &Path) -> Command {
    let mut cmd = callgrind(out);
    match binaries {
        Binaries::Release { sidecar, .. } => cmd.arg(sidecar),
        Binaries::Embedded { bench } => cmd.arg(bench).arg("sidecar"),
    };
    cmd
}

async fn start(mut cmd: Command, name: &str, dir: &Path, port: u16, timeout: Duration) -> Result<Proc, String> {
    cmd.env("RUST_LOG", "warn");
    let mut p = Proc::spawn(name, cmd, dir)?;
    procs::wait_port(([127, 0, 0, 1], port).into(), &mut p, timeout).await?;
    Ok(p)
}

/// Runs one measurement (see the module documentation).
pub async fn measure(spec: &Spec, dir: &Path) -> Result<Instructions, String> {
    let binaries = Binaries::locate(spec.embedded)?;
    // Valgrind runs a program some 50 times slower: generous start-up times.
    let slow = Duration::from_secs(180);
    let port = procs::free_port;
    let tls = if spec.tls { Some(TlsFiles::create(dir)?) } else { None };
    let control_port = port()?;
    let mut cmd = binaries.control(None);
    let mut control_args = procs::control_args(control_port, &[])?;
    if let Some(tls) = &tls {
        control_args = tls.control_args_of(control_args)?;
    }
    cmd.args(control_args);
    let _control = start(cmd, "control", dir, control_port, Duration::from_secs(20)).await?;

    let mut sidecars = Vec::new();
    for (name, id) in [("sidecar-a", "bench-sidecar-a"), ("sidecar-b", "bench-sidecar-b")] {
        let (local, mesh) = (port()?, port()?);
        let out = dir.join(format!("callgrind.{name}"));
        let mut cmd = under_callgrind(&binaries, &out);
        let mut sidecar_args = procs::sidecar_args(id, local, mesh, control_port)?;
        if let Some(tls) = &tls {
            sidecar_args = tls.sidecar_args_of(sidecar_args, control_port, id).await?;
            // The certificate is bought at start (a key made, a TLS handshake with control)
            // under valgrind: on a loaded machine that passed the default 3 s. Calls never
            // reach control, so the per-call counts do not depend on it.
            sidecar_args.extend(["--control-timeout".to_string(), "30s".to_string()]);
        }
        cmd.args(sidecar_args);
        let proc = start(cmd, name, dir, local, slow).await?;
        sidecars.push((Counted { proc, out }, local));
    }
    let agent_port = port()?;
    let mut cmd = binaries.bench(None);
    cmd.args(["agent", "--sidecar", &format!("127.0.0.1:{}", sidecars[1].1), "--listen"])
        .arg(format!("127.0.0.1:{agent_port}"));
    let _agent = start(cmd, "agent", dir, agent_port, Duration::from_secs(20)).await?;

    // nginx B → agent and nginx A → nginx B, single-process, under callgrind.
    let mut nginx = Vec::new();
    let mut nginx_version = None;
    if spec.nginx {
        let bin = proxies::find_tool("nginx", "AGENT_REACH_NGINX")
            .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
            .ok_or("nginx is needed for its path (scripts/install-bench-tools.sh, or AGENT_REACH_NGINX; --no-nginx skips it)")?;
        let version = proxies::nginx_version(&bin).ok_or("cannot read nginx's version (nginx -v)")?;
        nginx_version = Some(format!("{}.{}.{}", version.0, version.1, version.2));
        let (b_port, a_port) = (port()?, port()?);
        for (name, listen, upstream) in [("nginx-b", b_port, agent_port), ("nginx-a", a_port, b_port)] {
            let conf = dir.join(format!("{name}.conf"));
            let hop =
                proxies::Hop { listen, upstream, tls: tls.as_ref().map(|t| &t.proxy), serves_tls: name == "nginx-b" };
            std::fs::write(&conf, single_process(&proxies::nginx_conf(dir, name, &hop, version)))
                .map_err(|e| format!("{}: {e}", conf.display()))?;
            let out = dir.join(format!("callgrind.{name}"));
            let mut cmd = callgrind(&out);
            cmd.arg(&bin)
                .arg("-p")
                .arg(dir)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(dir.join(format!("{name}.startup.log")));
            let proc = start(cmd, name, dir, listen, slow).await?;
            nginx.push((Counted { proc, out }, listen));
        }
        // Listed A first, as the sidecars.
        nginx.reverse();
    }

    let a_port = sidecars[0].1;
    verify::wait_ready(Kind::Mesh, a_port, slow).await?;
    let counted: Vec<&Counted> = sidecars.iter().map(|(c, _)| c).collect();
    let mesh = window(spec, Kind::Mesh, a_port, &counted).await?;
    let nginx_window = match nginx.first() {
        Some((_, port)) => {
            verify::wait_ready(Kind::Agent, *port, slow).await?;
            let counted: Vec<&Counted> = nginx.iter().map(|(c, _)| c).collect();
            Some(window(spec, Kind::Agent, *port, &counted).await?)
        }
        None => None,
    };
    let n = spec.calls;
    let sidecar_a_per_call_net = Window::net(mesh.a, mesh.idle_a, n);
    let sidecar_b_per_call_net = Window::net(mesh.b, mesh.idle_b, n);
    let on = |f: fn(&Window) -> u64| nginx_window.as_ref().map(f);
    let net_a = nginx_window.as_ref().map(|w| Window::net(w.a, w.idle_a, n));
    let net_b = nginx_window.as_ref().map(|w| Window::net(w.b, w.idle_b, n));
    let ratio = |x: f64, y: Option<f64>| y.filter(|y| *y > 0.0).map(|y| x / y);
    Ok(Instructions {
        calls: n,
        concurrency: spec.concurrency,
        payload: spec.payload,
        tls: spec.tls,
        binaries: binaries.describe(),
        sidecar_a: mesh.a,
        sidecar_b: mesh.b,
        sidecar_a_per_call: Window::per_call(mesh.a, n),
        sidecar_b_per_call: Window::per_call(mesh.b, n),
        seconds: mesh.seconds,
        idle_a: mesh.idle_a,
        idle_b: mesh.idle_b,
        sidecar_a_per_call_net,
        sidecar_b_per_call_net,
        nginx_a: on(|w| w.a),
        nginx_b: on(|w| w.b),
        nginx_a_per_call: on(|w| w.a).map(|x| Window::per_call(x, n)),
        nginx_b_per_call: on(|w| w.b).map(|x| Window::per_call(x, n)),
        nginx_seconds: nginx_window.as_ref().map(|w| w.seconds),
        nginx_idle_a: on(|w| w.idle_a),
        nginx_idle_b: on(|w| w.idle_b),
        nginx_a_per_call_net: net_a,
        nginx_b_per_call_net: net_b,
        ratio_a_net: ratio(sidecar_a_per_call_net, net_a),
        ratio_b_net: ratio(sidecar_b_per_call_net, net_b),
        nginx_version,
    })
}

/// nginx's configuration of `run` as one process: no master, the one process serving
/// (under callgrind, with `--trace-children=no`, a worker forked off would go uncounted).
fn single_process(conf: &str) -> String {
    conf.replacen("daemon off;\n", "daemon off;\nmaster_process off;\n", 1)
}

/// Warm-up calls through the path at `port`, counters of `hops` (A, B) zeroed, the
/// counted calls, a dump; then an idle window as long, zeroed and dumped the same way.
async fn window(spec: &Spec, kind: Kind, port: u16, hops: &[&Counted]) -> Result<Window, String> {
    calls(kind, port, spec.warmup, spec.concurrency, spec.payload).await?;
    for h in hops {
        h.control("--zero")?;
    }
    let started = Instant::now();
    calls(kind, port, spec.calls, spec.concurrency, spec.payload).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (a, b) = (hops[0].dump(1)?, hops[1].dump(1)?);
    for h in hops {
        h.control("--zero")?;
    }
    tokio::time::sleep(started.elapsed()).await;
    let (idle_a, idle_b) = (hops[0].dump(2)?, hops[1].dump(2)?);
    Ok(Window { a, b, idle_a, idle_b, seconds })
}

/// `n` calls of `kind` from `concurrency` callers, each one after another; all must succeed.
async fn calls(kind: Kind, port: u16, n: usize, concurrency: usize, payload: usize) -> Result<(), String> {
    let concurrency = concurrency.clamp(1, n.max(1));
    let mut callers = tokio::task::JoinSet::new();
    for c in 0..concurrency {
        let share = n / concurrency + usize::from(c < n % concurrency);
        callers.spawn(async move {
            let client = PathClient::connect(kind, port).await?;
            for _ in 0..share {
                client.call(payload).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = callers.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// The `instructions` command: one measurement, printed as JSON.
pub fn run_blocking(spec: &Spec) -> Result<(), String> {
    let tmp;
    let dir = match &spec.keep {
        Some(keep) => {
            std::fs::create_dir_all(keep).map_err(|e| format!("{}: {e}", keep.display()))?;
            keep.as_path()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("agent-reach-callgrind-")
                .tempdir()
                .map_err(|e| format!("temp dir: {e}"))?;
            tmp.path()
        }
    };
    // A current-thread runtime: the processes are spawned from this (main) thread, which
    // lives as long as they do (see `procs::command`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let result = rt.block_on(measure(spec, dir))?;
    eprint!("{}", side_by_side(&result));
    println!("{}", serde_json::to_string(&result).map_err(|e| e.to_string())?);
    Ok(())
}

/// Instructions per call of each hop, sidecar beside nginx (on stderr; stdout is JSON).
pub fn side_by_side(r: &Instructions) -> String {
    let n = |v: f64| {
        let d = format!("{:.0}", v.max(0.0));
        let mut out = String::new();
        for (i, c) in d.chars().enumerate() {
            if i > 0 && (d.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    let opt = |v: Option<f64>| v.map_or("–".to_string(), n);
    let ratio = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2}"));
    let mut o = format!(
        "# instructions per call under callgrind ({} calls of {} B, {} caller(s){}), net of an idle window as long\n",
        r.calls,
        r.payload,
        r.concurrency,
        if r.tls { ", TLS between the hops" } else { "" }
    );
    if !r.binaries.is_empty() {
        o += &format!("# {}\n", r.binaries);
    }
    o += &format!("# {:<6} {:>12} {:>12} {:>14}\n", "hop", "sidecar", "nginx", "sidecar/nginx");
    for (hop, sidecar, nginx, q) in [
        ("A", r.sidecar_a_per_call_net, r.nginx_a_per_call_net, r.ratio_a_net),
        ("B", r.sidecar_b_per_call_net, r.nginx_b_per_call_net, r.ratio_b_net),
    ] {
        o += &format!("# {:<6} {:>12} {:>12} {:>14}\n", hop, n(sidecar), opt(nginx), ratio(q));
    }
    let both = |s: f64, x: Option<f64>, y: Option<f64>| x.zip(y).map(|(x, y)| (s, x + y));
    if let Some((s, x)) =
        both(r.sidecar_a_per_call_net + r.sidecar_b_per_call_net, r.nginx_a_per_call_net, r.nginx_b_per_call_net)
    {
        o += &format!("# {:<6} {:>12} {:>12} {:>14}\n", "A+B", n(s), n(x), ratio((x > 0.0).then(|| s / x)));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_total_of_a_dump() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\npid: 7\ncmd: x\npart: 1\n\ndesc: I1 cache:\nevents: Ir\nsummary: 1536647\n\ntotals: 1536647\n";
        assert_eq!(summary(dump), Some(1_536_647));
        assert_eq!(summary("events: Ir\n"), None);
    }

    #[test]
    fn nginx_runs_as_one_process() {
        let hop = proxies::Hop { listen: 1, upstream: 2, tls: None, serves_tls: false };
        let conf = single_process(&proxies::nginx_conf(Path::new("/d"), "nginx-a", &hop, (1, 22, 1)));
        assert_eq!(conf.matches("master_process off;").count(), 1, "{conf}");
        assert!(conf.contains("daemon off;\nmaster_process off;\n"), "{conf}");
    }

    #[test]
    fn the_table_sets_each_hop_beside_nginx() {
        let r = Instructions {
            calls: 2000,
            concurrency: 1,
            payload: 12,
            tls: false,
            binaries: "agent-reach-sidecar 0.1.0 (profile-guided build)".into(),
            sidecar_a: 0,
            sidecar_b: 0,
            sidecar_a_per_call: 0.0,
            sidecar_b_per_call: 0.0,
            seconds: 1.0,
            idle_a: 0,
            idle_b: 0,
            sidecar_a_per_call_net: 120_000.0,
            sidecar_b_per_call_net: 90_000.0,
            nginx_a: None,
            nginx_b: None,
            nginx_a_per_call: None,
            nginx_b_per_call: None,
            nginx_seconds: None,
            nginx_idle_a: None,
            nginx_idle_b: None,
            nginx_a_per_call_net: Some(40_000.0),
            nginx_b_per_call_net: Some(30_000.0),
            ratio_a_net: Some(3.0),
            ratio_b_net: Some(3.0),
            nginx_version: None,
        };
        let t = side_by_side(&r);
        assert!(t.contains("# A           120,000       40,000           3.00\n"), "{t}");
        assert!(t.contains("# A+B         210,000       70,000           3.00\n"), "{t}");
        assert!(t.contains("# agent-reach-sidecar 0.1.0 (profile-guided build)\n"), "{t}");
    }
}
