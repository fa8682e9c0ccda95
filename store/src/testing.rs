//! [`EtcdServer`]: a real etcd process for tests (feature `test-util`).
//!
//! It starts the etcd binary named by `AGENT_REACH_ETCD_BIN` (else `etcd` on `PATH`) as a
//! single-member cluster on free 127.0.0.1 ports, with its data in a temporary directory
//! (under `/dev/shm` when it exists, for speed), waits until etcd answers its health check,
//! and can kill it (SIGKILL, keeping the data) and restart it on the same ports and data.
//! Dropping it kills and reaps the process. When etcd cannot start, the error says why,
//! with the end of etcd's log: tests must fail, never skip, without etcd.
//!
//! It blocks the calling thread while etcd starts (about a second); it does not tune etcd
//! beyond quiet logging, and it cannot clean up after a test process that is itself killed
//! with SIGKILL (the etcd child then outlives it).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Environment variable naming the etcd binary to run.
pub const ETCD_BIN_ENV: &str = "AGENT_REACH_ETCD_BIN";
/// How long etcd gets to start answering.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts to start etcd (each on new free ports when starting, on the same ports when
/// restarting).
const START_ATTEMPTS: usize = 3;
/// Lines of etcd's log quoted in errors.
const LOG_TAIL_LINES: usize = 30;

/// A running (or killed) etcd process; see the module documentation.
#[derive(Debug)]
pub struct EtcdServer {
    binary: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// Holds `data/` (etcd's data dir) and `etcd.log` (its stdout and stderr).
    dir: TempDir,
    child: Option<Child>,
}

impl EtcdServer {
    /// Starts etcd on free ports and waits until it answers (at most about 20 s per try,
    /// three tries).
    pub fn start() -> Result<Self, String> {
        let binary = std::env::var_os(ETCD_BIN_ENV).map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
        let dir = temp_dir()?;
        let mut server = Self { binary, client_port: 0, peer_port: 0, dir, child: None };
        let mut errors = Vec::new();
        for _ in 0..START_ATTEMPTS {
            // Ports are found by binding port 0 and closing the socket, so another process
            // can take one before etcd binds it: then etcd fails and the next try picks
            // new ports. A failed try may leave a half-initialised data dir behind.
            (server.client_port, server.peer_port) = free_ports()?;
            let data = server.data_dir();
            if data.exists() {
                std::fs::remove_dir_all(&data).map_err(|error| format!("cannot clear {}: {error}", data.display()))?;
            }
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(error) => errors.push(error),
            }
        }
        Err(format!(
            "could not start etcd ({}) in {START_ATTEMPTS} attempts:\n{}",
            server.binary.display(),
            errors.join("\n")
        ))
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd with SIGKILL and reaps it; the data dir and ports are kept for
    /// [`restart`](Self::restart). Does nothing if etcd is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only if the process has already exited, which is what we want anyway.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data dir (killing it first if it runs) and
    /// waits until it answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let mut errors = Vec::new();
        for attempt in 0..START_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            match self.spawn_and_wait() {
                Ok(()) => return Ok(()),
                Err(error) => errors.push(error),
            }
        }
        Err(format!("could not restart etcd on {}:\n{}", self.endpoint(), errors.join("\n")))
    }

    /// etcd's Prometheus metrics (text format), e.g. to count its watchers.
    pub fn metrics(&self) -> Result<String, String> {
        http_get(self.client_port, "/metrics")
    }

    /// The value of one unlabelled metric, e.g. `etcd_debugging_mvcc_watcher_total`.
    pub fn metric(&self, name: &str) -> Result<f64, String> {
        let metrics = self.metrics()?;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| format!("etcd reports no metric {name}"))
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Spawns etcd on the current ports and waits until it is healthy; on failure the
    /// process is killed and the error quotes its log.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let log = self.log_path();
        let mut log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|error| format!("cannot open {}: {error}", log.display()))?;
        // Separates the runs in the log, so the tail shows this one.
        let _ = writeln!(log_file, "--- agent-reach test: starting etcd on {} ---", self.endpoint());
        let log_err = log_file.try_clone().map_err(|error| format!("cannot share {}: {error}", log.display()))?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name=default")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .arg("--initial-cluster-state=new")
            .arg("--logger=zap")
            .arg("--log-level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(|error| {
                format!("cannot run etcd binary {:?}: {error} (install etcd or set {ETCD_BIN_ENV})", self.binary)
            })?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(error) => {
                self.kill();
                Err(format!("{error}\n--- end of etcd's log ---\n{}", log_tail(&log)))
            }
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("etcd exited during start ({status})"));
            }
            let last = match http_get(self.client_port, "/health") {
                Ok(body) if body.contains("\"health\":\"true\"") => return Ok(()),
                Ok(body) => format!("unhealthy: {}", body.trim()),
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd did not become healthy on {} within {READY_TIMEOUT:?} ({last})",
                    self.endpoint()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn temp_dir() -> Result<TempDir, String> {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("agent-reach-etcd-");
    let dir = if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() };
    dir.or_else(|_| builder.tempdir()).map_err(|error| format!("cannot create a temporary dir: {error}"))
}

/// Two distinct free ports on 127.0.0.1 (both held while choosing, so they differ).
fn free_ports() -> Result<(u16, u16), String> {
    let bind = || {
        TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(|error| format!("cannot bind a free port: {error}"))
    };
    let (client, peer) = (bind()?, bind()?);
    let port =
        |listener: &TcpListener| listener.local_addr().map(|addr| addr.port()).map_err(|error| error.to_string());
    Ok((port(&client)?, port(&peer)?))
}

/// A minimal HTTP/1.0 GET on 127.0.0.1, returning the body of a 200 answer.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|error| format!("GET {path}: {error}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(2))))
        .and_then(|()| write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"))
        .map_err(|error| format!("GET {path}: {error}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|error| format!("GET {path}: {error}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or("no status line");
        return Err(format!("GET {path}: {status}"));
    }
    Ok(body.to_owned())
}

fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Err(error) = File::open(path).and_then(|mut file| file.read_to_string(&mut text)) {
        return format!("(cannot read {}: {error})", path.display());
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}
