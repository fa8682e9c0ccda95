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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::procs::{self, Binaries, Proc};
use crate::verify::{self, PathClient};
use crate::wire::Kind;

/// What one measurement counted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Instructions {
    pub calls: usize,
    pub concurrency: usize,
    pub payload: usize,
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
}

/// How to measure.
pub struct Spec {
    pub calls: usize,
    pub warmup: usize,
    pub concurrency: usize,
    pub payload: usize,
    pub embedded: bool,
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

/// A sidecar command run under callgrind, writing its counts to `out`.
fn under_callgrind(binaries: &Binaries, out: &Path) -> Command {
    let mut cmd = procs::command(Path::new("valgrind"), None);
    cmd.arg("--tool=callgrind").arg(format!("--callgrind-out-file={}", out.display()));
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
    let control_port = port()?;
    let mut cmd = binaries.control(None);
    cmd.args(procs::control_args(control_port, &[])?);
    let _control = start(cmd, "control", dir, control_port, Duration::from_secs(20)).await?;

    let mut sidecars = Vec::new();
    for (name, id) in [("sidecar-a", "bench-sidecar-a"), ("sidecar-b", "bench-sidecar-b")] {
        let (local, mesh) = (port()?, port()?);
        let out = dir.join(format!("callgrind.{name}"));
        let mut cmd = under_callgrind(&binaries, &out);
        cmd.args(procs::sidecar_args(id, local, mesh, control_port)?);
        let proc = start(cmd, name, dir, local, slow).await?;
        sidecars.push((Counted { proc, out }, local));
    }
    let agent_port = port()?;
    let mut cmd = binaries.bench(None);
    cmd.args(["agent", "--sidecar", &format!("127.0.0.1:{}", sidecars[1].1), "--listen"])
        .arg(format!("127.0.0.1:{agent_port}"));
    let _agent = start(cmd, "agent", dir, agent_port, Duration::from_secs(20)).await?;

    let a_port = sidecars[0].1;
    verify::wait_ready(Kind::Mesh, a_port, slow).await?;
    calls(a_port, spec.warmup, spec.concurrency, spec.payload).await?;
    for (s, _) in &sidecars {
        s.control("--zero")?;
    }
    let started = Instant::now();
    calls(a_port, spec.calls, spec.concurrency, spec.payload).await?;
    let seconds = started.elapsed().as_secs_f64();
    let a = sidecars[0].0.dump(1)?;
    let b = sidecars[1].0.dump(1)?;
    for (s, _) in &sidecars {
        s.control("--zero")?;
    }
    tokio::time::sleep(started.elapsed()).await;
    let idle_a = sidecars[0].0.dump(2)?;
    let idle_b = sidecars[1].0.dump(2)?;
    let net = |total: u64, idle: u64| total.saturating_sub(idle) as f64 / spec.calls as f64;
    Ok(Instructions {
        calls: spec.calls,
        concurrency: spec.concurrency,
        payload: spec.payload,
        sidecar_a: a,
        sidecar_b: b,
        sidecar_a_per_call: a as f64 / spec.calls as f64,
        sidecar_b_per_call: b as f64 / spec.calls as f64,
        seconds,
        idle_a,
        idle_b,
        sidecar_a_per_call_net: net(a, idle_a),
        sidecar_b_per_call_net: net(b, idle_b),
    })
}

/// `n` mesh calls from `concurrency` callers, each one after another; all must succeed.
async fn calls(port: u16, n: usize, concurrency: usize, payload: usize) -> Result<(), String> {
    let concurrency = concurrency.clamp(1, n.max(1));
    let mut callers = tokio::task::JoinSet::new();
    for c in 0..concurrency {
        let share = n / concurrency + usize::from(c < n % concurrency);
        callers.spawn(async move {
            let client = PathClient::connect(Kind::Mesh, port).await?;
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
    let tmp =
        tempfile::Builder::new().prefix("agent-reach-callgrind-").tempdir().map_err(|e| format!("temp dir: {e}"))?;
    // A current-thread runtime: the processes are spawned from this (main) thread, which
    // lives as long as they do (see `procs::command`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let result = rt.block_on(measure(spec, tmp.path()))?;
    println!("{}", serde_json::to_string(&result).map_err(|e| e.to_string())?);
    Ok(())
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
}
