//! Closed-loop throughput with nghttp2's `h2load`: a fixed number of connections, each with
//! a fixed number of concurrent streams, each stream sending the next call as soon as the
//! previous one ends. h2load counts HTTP statuses but not `grpc-status`, so callers verify
//! every path with a real gRPC client first ([`crate::verify`]). This module runs h2load
//! and parses its summary; it does not decide where h2load runs (see `cpus`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One h2load run.
#[derive(Clone, Debug)]
pub struct H2loadSpec {
    pub bin: PathBuf,
    pub url: String,
    /// The request body (a gRPC frame) in a file.
    pub body_file: PathBuf,
    pub connections: usize,
    /// Concurrent streams per connection.
    pub streams: usize,
    /// Timed run (`-D`), or a fixed number of requests (`-n`) when `None`.
    pub duration: Option<Duration>,
    pub warmup: Duration,
    pub requests: u64,
    /// CPU list for taskset.
    pub cpus: Option<String>,
}

/// h2load's summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct H2loadResult {
    pub elapsed_s: f64,
    pub req_per_s: f64,
    pub total: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub errored: u64,
    pub timeout: u64,
    pub status_2xx: u64,
}

impl H2loadResult {
    /// Failures h2load itself saw (HTTP-level; grpc-status is not visible to it).
    pub fn failures(&self) -> u64 {
        self.failed + self.errored + self.timeout + self.succeeded.saturating_sub(self.status_2xx)
    }
}

impl H2loadSpec {
    /// The command line (without taskset).
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "-t".to_string(),
            "1".into(),
            "-c".into(),
            self.connections.to_string(),
            "-m".into(),
            self.streams.to_string(),
        ];
        match self.duration {
            Some(d) => {
                a.extend(["-D".into(), format!("{}", d.as_secs().max(1))]);
                if !self.warmup.is_zero() {
                    a.extend(["--warm-up-time".into(), format!("{}", self.warmup.as_secs().max(1))]);
                }
            }
            None => a.extend(["-n".into(), self.requests.max(self.connections as u64).to_string()]),
        }
        a.extend([
            "-H".into(),
            "content-type: application/grpc".into(),
            "-H".into(),
            "te: trailers".into(),
            "-d".into(),
            self.body_file.display().to_string(),
            self.url.clone(),
        ]);
        a
    }
}

/// Runs h2load to the end and parses its summary.
pub async fn run(spec: &H2loadSpec) -> Result<(H2loadResult, u32), String> {
    let mut cmd = match &spec.cpus {
        Some(c) => {
            let mut cmd = tokio::process::Command::new("taskset");
            cmd.arg("-c").arg(c).arg(&spec.bin);
            cmd
        }
        None => tokio::process::Command::new(&spec.bin),
    };
    cmd.args(spec.args()).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start h2load: {e}"))?;
    let pid = child.id().unwrap_or(0);
    let out = child.wait_with_output().await.map_err(|e| format!("h2load: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("h2load failed ({}): {}{}", out.status, text, String::from_utf8_lossy(&out.stderr)));
    }
    parse(&text).map(|r| (r, pid)).ok_or_else(|| format!("cannot read h2load's summary:\n{text}"))
}

/// Parses the summary lines:
/// `finished in 10.00s, 20812.30 req/s, 1.23MB/s`,
/// `requests: 208123 total, 208187 started, 208123 done, 208123 succeeded, 0 failed, 0 errored, 0 timeout`,
/// `status codes: 208123 2xx, 0 3xx, 0 4xx, 0 5xx`.
pub fn parse(text: &str) -> Option<H2loadResult> {
    let mut r = H2loadResult::default();
    let finished = text.lines().find_map(|l| l.trim().strip_prefix("finished in "))?;
    let mut parts = finished.split(',').map(str::trim);
    r.elapsed_s = parse_seconds(parts.next()?)?;
    r.req_per_s = parts.next()?.strip_suffix(" req/s")?.trim().parse().ok()?;
    let requests = text.lines().find_map(|l| l.trim().strip_prefix("requests: "))?;
    for item in requests.split(',').map(str::trim) {
        let (n, what) = item.split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        match what {
            "total" => r.total = n,
            "succeeded" => r.succeeded = n,
            "failed" => r.failed = n,
            "errored" => r.errored = n,
            "timeout" => r.timeout = n,
            _ => {}
        }
    }
    let codes = text.lines().find_map(|l| l.trim().strip_prefix("status codes: "))?;
    r.status_2xx = codes.split(',').map(str::trim).find_map(|c| c.strip_suffix(" 2xx"))?.parse().ok()?;
    Some(r)
}

/// "10.00s", "512.3ms", "850us" → seconds.
fn parse_seconds(s: &str) -> Option<f64> {
    if let Some(v) = s.strip_suffix("ms") {
        return v.parse::<f64>().ok().map(|v| v / 1e3);
    }
    if let Some(v) = s.strip_suffix("us") {
        return v.parse::<f64>().ok().map(|v| v / 1e6);
    }
    s.strip_suffix('s')?.parse().ok()
}

/// `h2load --version`'s first line.
pub fn version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "starting benchmark...
spawning thread #0: 4 total client(s). 1000 total requests
Application protocol: h2c

finished in 48.21ms, 20741.43 req/s, 1.08MB/s
requests: 1000 total, 1000 started, 1000 done, 998 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 998 2xx, 0 3xx, 0 4xx, 2 5xx
traffic: 53.39KB (54672) total, 12.04KB (12328) headers (space savings 90.49%), 21.48KB (22000) data
";

    #[test]
    fn parses_the_summary() {
        let r = parse(SAMPLE).unwrap();
        assert!((r.elapsed_s - 0.04821).abs() < 1e-9);
        assert!((r.req_per_s - 20741.43).abs() < 1e-9);
        assert_eq!((r.total, r.succeeded, r.failed, r.status_2xx), (1000, 998, 2, 998));
        assert_eq!(r.failures(), 2);
        assert!(parse("garbage").is_none());
    }
}
