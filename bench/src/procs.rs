//! The processes a benchmark run starts: spawned with their output in a log file, pinned to
//! CPUs with `taskset` when asked, stopped with SIGTERM (then SIGKILL) when dropped, and
//! told to stop (SIGTERM) by the kernel if the benchmark itself dies. This module does not
//! know what the processes are; see [`crate::orchestrate`].

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// A command running `bin`, pinned to the CPU list `cpus` (taskset syntax, e.g. "1") when
/// given. Children get SIGTERM when the thread that spawned them exits, so spawn long-lived
/// processes from the main thread only (the orchestrator runs a current-thread runtime).
pub fn command(bin: &Path, cpus: Option<&str>) -> Command {
    let mut cmd = match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(c).arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    // SAFETY: the closure runs in the child between fork and exec and calls only prctl
    // (async-signal-safe); it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(Signal::TERM)).map_err(std::io::Error::from)
        });
    }
    cmd
}

/// A started process.
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdin closed and stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Result<Proc, String> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc { name: name.to_string(), child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails (with the end of its log) if the process has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited ({status}); its log ends:\n{}", self.name, self.log_tail(20))),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// The last `lines` lines of the process's output.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, up to 5 s to exit, then SIGKILL for it and any children it left.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let scan = crate::procstat::all();
        let children = crate::procstat::children(&scan, self.pid());
        if let Some(pid) = Pid::from_raw(self.pid() as i32) {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for c in children {
            if let Some(pid) = Pid::from_raw(c as i32) {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `addr` accepts TCP connections, failing early if `proc` exits.
pub async fn wait_port(addr: SocketAddr, proc: &mut Proc, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        proc.check_alive()?;
        if Instant::now() > until {
            return Err(format!(
                "{} does not accept connections on {addr} after {timeout:?}; its log ends:\n{}",
                proc.name,
                proc.log_tail(20)
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it again soon).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Which executables run the sidecars, control, the agent and the load generator.
#[derive(Clone, Debug)]
pub enum Binaries {
    /// The real `agent-reach-sidecar` and `agent-reach-control` found next to this binary
    /// (`cargo build --release` puts them there).
    Release { sidecar: PathBuf, control: PathBuf, bench: PathBuf },
    /// Sidecar and control run by this binary's `sidecar` / `control` subcommands.
    Embedded { bench: PathBuf },
}

impl Binaries {
    /// The release binaries beside this executable, or the embedded ones when `embedded`.
    pub fn locate(embedded: bool) -> Result<Binaries, String> {
        let bench = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        if embedded {
            return Ok(Binaries::Embedded { bench });
        }
        let dir = bench.parent().ok_or("this executable has no directory")?;
        let (sidecar, control) = (dir.join("agent-reach-sidecar"), dir.join("agent-reach-control"));
        if !sidecar.is_file() || !control.is_file() {
            return Err(format!(
                "agent-reach-sidecar and agent-reach-control are not next to {} (build them with \
                 `cargo build --release -p agent-reach-sidecar -p agent-reach-control -p agent-reach-bench`, \
                 or pass --embedded)",
                bench.display()
            ));
        }
        Ok(Binaries::Release { sidecar, control, bench })
    }

    pub fn sidecar(&self, cpus: Option<&str>) -> Command {
        match self {
            Binaries::Release { sidecar, .. } => command(sidecar, cpus),
            Binaries::Embedded { bench } => {
                let mut c = command(bench, cpus);
                c.arg("sidecar");
                c
            }
        }
    }

    pub fn control(&self, cpus: Option<&str>) -> Command {
        match self {
            Binaries::Release { control, .. } => command(control, cpus),
            Binaries::Embedded { bench } => {
                let mut c = command(bench, cpus);
                c.arg("control");
                c
            }
        }
    }

    /// This benchmark binary (for `agent` and `load`).
    pub fn bench(&self, cpus: Option<&str>) -> Command {
        match self {
            Binaries::Release { bench, .. } | Binaries::Embedded { bench } => command(bench, cpus),
        }
    }

    pub fn describe(&self) -> String {
        let build = if cfg!(debug_assertions) { "debug" } else { "release" };
        match self {
            Binaries::Release { sidecar, .. } => {
                // The sidecar names how it was optimized (a standard or a profile-guided
                // build, see scripts/build-pgo.sh).
                let version = std::process::Command::new(sidecar)
                    .arg("--version")
                    .output()
                    .ok()
                    .and_then(|o| String::from_utf8(o.stdout).ok())
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| "agent-reach-sidecar (its --version failed)".into());
                format!("agent-reach-sidecar and agent-reach-control binaries ({build} build; {version})")
            }
            Binaries::Embedded { .. } => {
                format!("sidecar and control embedded in agent-reach-bench ({build} build)")
            }
        }
    }
}

/// The sidecar flags of the benchmark: one runtime thread, explicit addresses (the admin
/// port on a free port of its own, so several sidecars fit on one host), and plaintext
/// toward control and on the mesh port by the explicit opt-out `--insecure-plaintext-control`:
/// the benchmark compares the mesh with nginx and Envoy proxying plaintext gRPC, so every
/// path runs without TLS (no TLS comparison mode is built yet).
pub fn sidecar_args(id: &str, local: u16, mesh: u16, control: u16) -> Result<Vec<String>, String> {
    let admin = free_port()?;
    Ok([
        "--insecure-plaintext-control",
        "--listen",
        &format!("127.0.0.1:{local}"),
        "--mesh-listen",
        &format!("127.0.0.1:{mesh}"),
        "--advertise",
        &format!("127.0.0.1:{mesh}"),
        "--control",
        &format!("http://127.0.0.1:{control}"),
        "--sidecar-id",
        id,
        "--worker-threads",
        "1",
        "--admin-listen",
        &format!("127.0.0.1:{admin}"),
        // Two sidecars share the host: the A2A JSON-RPC port (default 127.0.0.1:7703) is not
        // measured here, so it is off rather than contended.
        "--a2a-listen",
        "off",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect())
}

/// The control flags of the benchmark: one runtime thread, the gRPC port, the admin port
/// on a free port of its own, and `extra` flags. Plaintext, with the Admin API open, by the
/// explicit opt-outs `--mtls off --insecure-open-admin-api` (see [`sidecar_args`]; the
/// table-size benchmark also registers fake sidecars straight through the Control API).
pub fn control_args(port: u16, extra: &[&str]) -> Result<Vec<String>, String> {
    let admin = free_port()?;
    let mut args: Vec<String> = vec![
        "--mtls".into(),
        "off".into(),
        "--insecure-open-admin-api".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--worker-threads".into(),
        "1".into(),
        "--admin-listen".into(),
        format!("127.0.0.1:{admin}"),
        // Several control processes run at once; none needs the dashboard (its fixed
        // default port would collide).
        "--dashboard-listen".into(),
        "off".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Ok(args)
}
