//! `agent-reach up` (the dev mesh in one process) end to end: the built binary prints the
//! dashboard's URL, that URL serves the page, the printed admin token logs in and reads the
//! live state, and SIGINT stops the mesh cleanly. Then the operator's path of the README in
//! a real headless Chromium: log in to the dashboard `up` printed, pause an instance with
//! the `agent-reach ctl` command `up` printed (the built binary), and see it turn PAUSED
//! without a reload.
//!
//! Every address is bound to port 0, so the tests clash neither with each other nor with a
//! dev mesh on the default ports, and each one's dev token and trust bundle go to a
//! temporary directory of its own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Kills the child if the test fails before stopping it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One HTTP/1.1 request to `addr`: status, head (lower-cased) and body.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String, String) {
    let mut tcp = TcpStream::connect(addr).expect("connect to the dashboard");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).expect("the dashboard's answer");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head: {out:?}"));
    (head[9..12].parse().unwrap(), head.to_ascii_lowercase(), body.to_string())
}

/// A running `agent-reach up` and its banner.
struct Up {
    process: Running,
    /// The banner, up to its last line.
    banner: Vec<String>,
    /// Standard output after the banner.
    rest: mpsc::Receiver<String>,
    /// Standard error, whole, once the process exits.
    logs: std::thread::JoinHandle<String>,
    tmp: tempfile::TempDir,
}

impl Up {
    /// Starts `agent-reach up` on free ports and reads its banner (within a minute).
    fn start() -> Up {
        let tmp = tempfile::tempdir().unwrap();
        let any = "127.0.0.1:0";
        let child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
            .args(["up", "--control-listen", any, "--listen", any, "--mesh-listen", any, "--admin-listen", any])
            .args(["--a2a-listen", any, "--dashboard-listen", any])
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run agent-reach up");
        let mut process = Running(child);
        let (tx, rest) = mpsc::channel::<String>();
        let stdout = process.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        // The logs, kept for failure messages (and read so that a full pipe never stalls `up`).
        let mut stderr = process.0.stderr.take().unwrap();
        let logs = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut banner = Vec::new();
        while !banner.last().is_some_and(|l: &String| l.starts_with("Point agents at it with AGENT_REACH_SIDECAR=")) {
            match rest.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => banner.push(line),
                Err(e) => {
                    drop(process);
                    panic!("no banner from agent-reach up ({e}): {banner:#?}\n{}", logs.join().unwrap());
                }
            }
        }
        assert_eq!(banner[0], "Agent-Reach dev mesh is up (embedded store: state lives in this process only).");
        Up { process, banner, rest, logs, tmp }
    }

    /// The dashboard's address, from the banner's URL.
    fn dashboard(&self) -> SocketAddr {
        let dashboard = value_of(&self.banner, "  dashboard http://");
        let (addr, rest) = dashboard.split_once('/').unwrap_or_else(|| panic!("{dashboard:?}"));
        assert_eq!(rest, "   (log in with the admin token below)");
        let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr:?}: {e}"));
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
        addr
    }

    /// The bootstrap admin token, from the file the banner names.
    fn token(&self) -> String {
        let file = value_of(&self.banner, "  admin     bootstrap admin token written to ");
        assert!(file.starts_with(self.tmp.path().to_str().unwrap()), "{file}");
        std::fs::read_to_string(file).unwrap().trim().to_string()
    }

    /// The sidecar's local API address (agents register there).
    fn sidecar(&self) -> SocketAddr {
        let line = value_of(&self.banner, "  sidecar   ");
        line.split_whitespace().next().unwrap().parse().unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// The arguments of the `agent-reach ctl` command the banner prints, up to its
    /// subcommand (`ctl`, control endpoint, trust bundle and token file).
    fn ctl_args(&self) -> Vec<String> {
        let line = self
            .banner
            .iter()
            .find_map(|l| l.trim_start().strip_prefix("agent-reach "))
            .unwrap_or_else(|| panic!("no ctl command: {:#?}", self.banner));
        let mut args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let last = args.pop();
        assert_eq!((args[0].as_str(), last.as_deref()), ("ctl", Some("agents")), "{line}");
        args
    }

    /// Sends SIGINT (Ctrl-C) to `up` by its process id; `up` must exit 0 within 30 s after
    /// printing only "stopping".
    fn interrupt(self) {
        let Up { mut process, rest, logs, .. } = self;
        let pid = process.0.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().expect("run kill");
        assert!(sent.success(), "kill -INT {pid}: {sent}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = process.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "agent-reach up still running 30 s after SIGINT");
            std::thread::sleep(Duration::from_millis(50));
        };
        let after: Vec<String> = rest.iter().collect();
        let logs = logs.join().unwrap();
        assert!(status.success(), "exit {status}\n{logs}");
        assert_eq!(after, ["stopping"], "{logs}");
    }
}

/// The rest of the line starting with `prefix`.
fn value_of<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}: {lines:#?}"))
}

#[test]
fn up_prints_the_dashboard_url_which_serves_the_page_and_stops_on_sigint() {
    let up = Up::start();
    let addr = up.dashboard();
    let token = up.token();

    // The URL answers with the page; its data waits for a login.
    let (status, head, body) = http(addr, "GET", "/", "", "");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(body.contains("/assets/app.js"), "{body}");
    let (status, _, body) = http(addr, "GET", "/api/session", "", "");
    assert_eq!((status, body.as_str()), (200, r#"{"authenticated":false,"login":true}"#));
    assert_eq!(http(addr, "GET", "/api/state?tenant=default", "", "").0, 401);

    // The printed admin token logs in and reads the mesh's live state.
    let login = serde_json::json!({ "token": token }).to_string();
    let (status, head, body) = http(addr, "POST", "/api/login", "content-type: application/json\r\n", &login);
    assert_eq!(status, 200, "{body}");
    let session: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((session["role"].as_str(), session["may_edit"].as_bool()), (Some("admin"), Some(true)), "{body}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie: {head}"))
        .to_string();
    // (The head was lower-cased; the cookie's value is the token, which is lower-case hex.)
    assert_eq!(cookie, format!("agent_reach_session={token}"));
    let (status, _, body) = http(addr, "GET", "/api/state?tenant=default", &format!("cookie: {cookie}\r\n"), "");
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["tenant"], "default");
    assert_eq!(state["instances"], serde_json::json!([]), "no agent has registered");

    up.interrupt();
}

const ROWS: &str = "return [...document.querySelectorAll('tr[data-instance]')].map(r => \
     [r.dataset.instance, r.querySelector('.state-cell').textContent, r.querySelector('.hold').textContent]);";

/// Runs the built `agent-reach` with `args`: exit status and standard output.
async fn agent_reach(args: Vec<String>) -> (std::process::ExitStatus, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-reach"));
    command.args(args);
    let out = tokio::task::spawn_blocking(move || command.output().expect("run agent-reach")).await.unwrap();
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctl_pause_shows_on_the_dashboard_up_printed_without_a_reload() {
    let up = tokio::task::spawn_blocking(Up::start).await.unwrap();
    let page = format!("http://{}", up.dashboard());
    let agent = agent_reach_e2e::echo_agent(up.sidecar(), "translator", &[("text.translate", &["zh"])]).await;
    let id = agent.instance_id();

    // Log in with the token `up` wrote, as a person would.
    let browser = agent_reach_e2e::browser::Browser::start().await;
    let b = &browser;
    b.client.goto(&format!("{page}/#/instances")).await.unwrap();
    b.wait_until("the login form", Duration::from_secs(10), "return !!document.querySelector('#login-token');", |v| {
        *v == serde_json::Value::Bool(true)
    })
    .await;
    b.client
        .execute(
            "document.querySelector('#login-token').value = arguments[0]; \
             document.querySelector('#login button').click(); return 1;",
            vec![serde_json::Value::String(up.token())],
        )
        .await
        .unwrap();
    let up_row = |v: &serde_json::Value| v.as_array().is_some_and(|r| r.len() == 1 && r[0][1] == "UP");
    let shown = b.wait_until("the instance UP", Duration::from_secs(15), ROWS, up_row).await;
    assert_eq!(shown, serde_json::json!([[id, "UP", ""]]));
    b.client.execute("window.__loaded_once = true; return 1;", vec![]).await.unwrap();

    // `agent-reach ctl ... pause` with the endpoint, trust bundle and token file `up` printed.
    let mut args = up.ctl_args();
    args.extend(["pause", "--reason", "disk swap", "instance", &id].map(String::from));
    let (status, stdout, stderr) = agent_reach(args).await;
    assert!(status.success(), "ctl pause: {status}\n{stdout}\n{stderr}");
    assert!(stdout.starts_with("paused 1 instance(s)"), "{stdout}");
    let paused = b
        .wait_until("the paused instance", Duration::from_secs(10), ROWS, |v| {
            v.as_array().is_some_and(|r| r.len() == 1 && r[0][1].as_str().is_some_and(|s| s.starts_with("PAUSED")))
        })
        .await;
    assert_eq!(paused, serde_json::json!([[id, "PAUSED reports UP", "PAUSED by operator (instance): disk swap"]]));
    let still = b.client.execute("return window.__loaded_once === true;", vec![]).await.unwrap();
    assert_eq!(still, serde_json::Value::Bool(true), "the page was not reloaded");

    // And `ctl resume` lifts the hold, again live.
    let mut args = up.ctl_args();
    args.extend(["resume", "instance", &id].map(String::from));
    let (status, stdout, stderr) = agent_reach(args).await;
    assert!(status.success(), "ctl resume: {status}\n{stdout}\n{stderr}");
    let resumed = b.wait_until("the resumed instance", Duration::from_secs(10), ROWS, up_row).await;
    assert_eq!(resumed, serde_json::json!([[id, "UP", ""]]));

    // Nothing went wrong in the page.
    let errors: Vec<(String, String)> = b.console().await.into_iter().filter(|(level, _)| level != "INFO").collect();
    assert!(errors.is_empty(), "console: {errors:?}");
    let failed: Vec<(String, u64)> = b.requests().await.into_iter().filter(|(_, status)| *status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    browser.close().await;
    drop(agent);
    tokio::task::spawn_blocking(move || up.interrupt()).await.unwrap();
}
