//! [`RedisServer`]: a real `redis-server` process for tests (feature `test-util`).
//!
//! It starts the binary named by `AGENT_REACH_REDIS_BIN` (else `redis-server` on `PATH`) on
//! a free 127.0.0.1 port with its working directory in a temporary directory, no
//! persistence and no config file, and waits until it answers `PING`. Dropping it kills and
//! reaps the process. When redis-server cannot start, the error says why, with the end of
//! its log: tests must fail, never skip, without Redis (`scripts/install-redis.sh`
//! installs Debian's package).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Environment variable naming the redis-server binary to run.
pub const REDIS_BIN_ENV: &str = "AGENT_REACH_REDIS_BIN";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const START_ATTEMPTS: usize = 3;

/// A running redis-server; see the module documentation.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts redis-server on a free port and waits until it answers (three tries).
    pub fn start() -> Result<RedisServer, String> {
        let binary = std::env::var_os(REDIS_BIN_ENV).map_or_else(|| PathBuf::from("redis-server"), PathBuf::from);
        let mut dir = tempfile::Builder::new()
            .prefix("agent-reach-redis-")
            .tempdir()
            .map_err(|e| format!("cannot create a temporary dir: {e}"))?;
        let mut errors = Vec::new();
        for _ in 0..START_ATTEMPTS {
            // The port is found by binding port 0 and closing it; another process may take
            // it first, and then the next try picks another.
            let port = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("cannot find a free port: {e}"))?
                .port();
            let log = dir.path().join("redis.log");
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    format!("cannot run {binary:?}: {e} (install Debian's redis-server, scripts/install-redis.sh, or set {REDIS_BIN_ENV})")
                })?;
            let mut server = RedisServer { port, dir, child: Some(child) };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(20).collect();
                    errors.push(format!("{e}; log: {}", tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
                    server.kill();
                    dir = std::mem::replace(&mut server.dir, tempfile::tempdir().map_err(|e| e.to_string())?);
                }
            }
        }
        Err(format!("could not start redis-server in {START_ATTEMPTS} attempts:\n{}", errors.join("\n")))
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("redis-server exited during start ({status})"));
            }
            if ping(self.port).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("redis-server did not answer PING on port {} within {READY_TIMEOUT:?}", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(port: u16) -> Result<(), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).map_err(|e| e.to_string())?;
    stream.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).map_err(|e| e.to_string())?;
    if &reply == b"+PONG\r\n" { Ok(()) } else { Err(format!("unexpected reply {reply:?}")) }
}
