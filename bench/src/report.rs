//! The results of a run: every measurement as taken, medians and ranges per path and
//! payload, the ratios the issue asks for (mesh/nginx, mesh/Envoy, mesh/direct), the targets
//! checked against them, and the markdown rendering of all of it. Pure data and
//! arithmetic: nothing here measures or starts anything.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::h2load::H2loadResult;
use crate::load::{LoadResult, Percentiles};
use crate::machine::Machine;
use crate::stream::StreamResult;
use crate::table_rss::TableRss;

/// Median and range of one quantity over repetitions.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(values: &[f64]) -> Option<Stat> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Stat { median, min: v[0], max: v[n - 1], n })
    }
}

/// CPU and memory of one process (or process group: an nginx master and its worker)
/// during one measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcUsage {
    pub role: String,
    pub pids: Vec<u32>,
    /// User + system CPU seconds during the measurement (all threads and processes).
    pub cpu_s: f64,
    pub cpu_ms_per_1k_calls: f64,
    /// Largest `VmHWM` among the group's processes during the measurement (peak reset
    /// before it).
    pub peak_rss_kib: u64,
}

/// Hardware counters (`perf stat`) of one process group during one fixed-rate run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoleCounters {
    pub role: String,
    pub pids: Vec<u32>,
    pub instructions: u64,
    pub cycles: u64,
    pub instructions_per_call: f64,
    pub cycles_per_call: f64,
}

/// One load run on one path.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measurement {
    pub rep: usize,
    pub payload: usize,
    pub path: String,
    /// "closed" (h2load) or "open" (fixed rate).
    pub load: String,
    pub rate: Option<u32>,
    /// Calls answered successfully (h2load: HTTP 2xx).
    pub calls: u64,
    pub errors: u64,
    pub wall_s: f64,
    /// Calls per second: h2load's figure, or the achieved fixed rate.
    pub throughput: f64,
    pub latency_ms: Option<Percentiles>,
    pub h2load: Option<H2loadResult>,
    pub open_loop: Option<LoadResult>,
    pub processes: Vec<ProcUsage>,
    /// Instructions and cycles of each proxy process (fixed-rate runs, where `perf stat`
    /// counts them; empty otherwise).
    #[serde(default)]
    pub counters: Vec<RoleCounters>,
    /// CPU cores used on average by processes outside the benchmark during the run.
    pub other_cores: f64,
    pub loadavg_1m: f64,
}

/// CPU and memory of one process group during one streaming run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamProcUsage {
    pub role: String,
    pub pids: Vec<u32>,
    pub cpu_s: f64,
    /// CPU milliseconds per MB (10^6 bytes) of chunk payload streamed, warm-up included.
    pub cpu_ms_per_mb: f64,
    pub peak_rss_kib: u64,
}

/// One streaming run on one path.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamMeasurement {
    pub rep: usize,
    pub path: String,
    pub wall_s: f64,
    pub result: StreamResult,
    pub processes: Vec<StreamProcUsage>,
    pub other_cores: f64,
    pub loadavg_1m: f64,
}

/// Medians of one path's streaming runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamSummary {
    pub path: String,
    pub mb_per_s: Option<Stat>,
    /// CPU ms per MB of each process of the path (proxies, then the agent).
    pub cpu_ms_per_mb: Vec<(String, Option<Stat>)>,
    pub streams: u64,
    pub errors: u64,
}

/// The streaming measurement of a run: server-streaming calls of 64 KiB chunks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Streaming {
    /// How the streams were driven.
    pub setup: String,
    pub measurements: Vec<StreamMeasurement>,
    pub summary: Vec<StreamSummary>,
    /// "stream MB/s mesh/nginx" and the like; `payload` is the chunk size.
    pub ratios: Vec<Ratio>,
}

/// One verification with the real gRPC client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verification {
    pub rep: usize,
    pub payload: usize,
    pub path: String,
    pub calls: usize,
    pub error: Option<String>,
}

/// How the run was set up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub smoke: bool,
    pub reps: usize,
    pub paths: Vec<String>,
    pub payloads: Vec<usize>,
    pub rates: Vec<u32>,
    pub closed_loop: String,
    pub open_loop: String,
    pub pinning: String,
    pub cpu_budget: String,
    /// What is encrypted (`run --tls`), or "none".
    #[serde(default)]
    pub tls: String,
    pub binaries: String,
    pub nginx: String,
    pub envoy: String,
    pub h2load: String,
    /// What `perf stat` counts here, or why it counts nothing.
    #[serde(default)]
    pub hardware_counters: String,
}

/// Median open-loop figures of one path at one rate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpenSummary {
    pub rate: u32,
    pub achieved: Option<Stat>,
    pub p50: Option<Stat>,
    pub p90: Option<Stat>,
    pub p99: Option<Stat>,
    pub p999: Option<Stat>,
    /// Over the direct path in the same repetition.
    pub added_p50: Option<Stat>,
    pub added_p99: Option<Stat>,
}

/// CPU per 1k calls of one process of a path under one load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoleCpu {
    pub role: String,
    /// "closed" or "open@<rate>".
    pub load: String,
    pub cpu_ms_per_1k_calls: Option<Stat>,
}

/// Instructions and cycles per call of one process of a path at one fixed rate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoleCounterStat {
    pub role: String,
    /// "open@<rate>".
    pub load: String,
    pub instructions_per_call: Option<Stat>,
    pub cycles_per_call: Option<Stat>,
}

/// Everything measured on one path with one payload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathSummary {
    pub payload: usize,
    pub path: String,
    pub throughput: Option<Stat>,
    pub open: Vec<OpenSummary>,
    pub cpu: Vec<RoleCpu>,
    /// Largest peak RSS of each process over all runs, KiB.
    pub peak_rss_kib: Vec<(String, u64)>,
    /// Hardware counters per call of each proxy at each fixed rate (empty where `perf
    /// stat` counts nothing).
    #[serde(default)]
    pub counters: Vec<RoleCounterStat>,
    pub calls: u64,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ratio {
    pub payload: usize,
    pub name: String,
    /// `null` when the denominator is not positive.
    pub value: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetCheck {
    pub payload: Option<usize>,
    pub target: String,
    pub value: f64,
    pub limit: f64,
    /// "≥" or "≤".
    pub relation: String,
    pub met: bool,
}

/// Machine load around and during the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MachineLoad {
    pub loadavg_start: [f64; 3],
    pub loadavg_end: [f64; 3],
    /// Cores used by processes outside the benchmark, mean and max over measurements.
    pub other_cores_mean: f64,
    pub other_cores_max: f64,
}

/// A whole run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub date: String,
    pub machine: Machine,
    pub revision: Option<String>,
    pub settings: Settings,
    pub load: MachineLoad,
    pub verifications: Vec<Verification>,
    pub measurements: Vec<Measurement>,
    pub summary: Vec<PathSummary>,
    pub ratios: Vec<Ratio>,
    pub targets: Vec<TargetCheck>,
    pub table_rss: Vec<TableRss>,
    /// The streaming measurement (absent with `--no-stream`).
    #[serde(default)]
    pub streaming: Option<Streaming>,
    /// Errors that make the run fail (any path answering errors).
    pub failures: Vec<String>,
    pub ok: bool,
}

/// The process roles of each path, in display order.
pub fn proxy_roles(path: &str) -> &'static [&'static str] {
    match path {
        "mesh" => &["sidecar A", "sidecar B"],
        "nginx" => &["nginx A", "nginx B"],
        "envoy" => &["envoy A", "envoy B"],
        _ => &[],
    }
}

/// Medians and ranges per (payload, path).
pub fn summarize(ms: &[Measurement], paths: &[String], payloads: &[usize], rates: &[u32]) -> Vec<PathSummary> {
    let mut out = Vec::new();
    for &payload in payloads {
        for path in paths {
            let mine: Vec<&Measurement> = ms.iter().filter(|m| m.payload == payload && &m.path == path).collect();
            let closed: Vec<&Measurement> = mine.iter().copied().filter(|m| m.load == "closed").collect();
            let throughput = Stat::of(&closed.iter().map(|m| m.throughput).collect::<Vec<_>>());
            let mut open = Vec::new();
            for &rate in rates {
                let runs: Vec<&Measurement> =
                    mine.iter().copied().filter(|m| m.load == "open" && m.rate == Some(rate)).collect();
                let pick = |f: fn(&Percentiles) -> f64| {
                    Stat::of(&runs.iter().filter_map(|m| m.latency_ms.as_ref().map(f)).collect::<Vec<_>>())
                };
                let added = |f: fn(&Percentiles) -> f64| {
                    let diffs: Vec<f64> = runs
                        .iter()
                        .filter_map(|m| {
                            let direct = ms.iter().find(|d| {
                                d.path == "direct"
                                    && d.payload == payload
                                    && d.rep == m.rep
                                    && d.load == "open"
                                    && d.rate == Some(rate)
                            })?;
                            Some(f(m.latency_ms.as_ref()?) - f(direct.latency_ms.as_ref()?))
                        })
                        .collect();
                    Stat::of(&diffs)
                };
                open.push(OpenSummary {
                    rate,
                    achieved: Stat::of(&runs.iter().map(|m| m.throughput).collect::<Vec<_>>()),
                    p50: pick(|p| p.p50),
                    p90: pick(|p| p.p90),
                    p99: pick(|p| p.p99),
                    p999: pick(|p| p.p999),
                    added_p50: if path == "direct" { None } else { added(|p| p.p50) },
                    added_p99: if path == "direct" { None } else { added(|p| p.p99) },
                });
            }
            let mut cpu = Vec::new();
            let mut peak_rss_kib = Vec::new();
            let roles: Vec<&str> = proxy_roles(path).iter().copied().chain(["agent"]).collect();
            for role in &roles {
                let loads = std::iter::once(("closed".to_string(), None))
                    .chain(rates.iter().map(|r| (format!("open@{r}"), Some(*r))));
                for (label, rate) in loads {
                    let values: Vec<f64> = mine
                        .iter()
                        .filter(|m| match rate {
                            None => m.load == "closed",
                            Some(r) => m.load == "open" && m.rate == Some(r),
                        })
                        .filter_map(|m| m.processes.iter().find(|p| p.role == *role).map(|p| p.cpu_ms_per_1k_calls))
                        .collect();
                    cpu.push(RoleCpu { role: role.to_string(), load: label, cpu_ms_per_1k_calls: Stat::of(&values) });
                }
                let peak = mine
                    .iter()
                    .flat_map(|m| m.processes.iter().filter(|p| p.role == *role).map(|p| p.peak_rss_kib))
                    .max()
                    .unwrap_or(0);
                peak_rss_kib.push((role.to_string(), peak));
            }
            let mut counters = Vec::new();
            for role in proxy_roles(path) {
                for &rate in rates {
                    let of = |f: fn(&RoleCounters) -> f64| {
                        let values: Vec<f64> = mine
                            .iter()
                            .filter(|m| m.load == "open" && m.rate == Some(rate))
                            .filter_map(|m| m.counters.iter().find(|c| c.role == *role).map(f))
                            .collect();
                        Stat::of(&values)
                    };
                    let (instructions_per_call, cycles_per_call) =
                        (of(|c| c.instructions_per_call), of(|c| c.cycles_per_call));
                    if instructions_per_call.is_some() || cycles_per_call.is_some() {
                        counters.push(RoleCounterStat {
                            role: role.to_string(),
                            load: format!("open@{rate}"),
                            instructions_per_call,
                            cycles_per_call,
                        });
                    }
                }
            }
            out.push(PathSummary {
                payload,
                path: path.clone(),
                throughput,
                open,
                cpu,
                peak_rss_kib,
                counters,
                calls: mine.iter().map(|m| m.calls).sum(),
                errors: mine.iter().map(|m| m.errors).sum(),
            });
        }
    }
    out
}

fn find<'a>(s: &'a [PathSummary], payload: usize, path: &str) -> Option<&'a PathSummary> {
    s.iter().find(|p| p.payload == payload && p.path == path)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => a / b,
        _ => f64::NAN,
    }
}

/// Median CPU ms per 1k calls of `role` under `load`.
fn cpu_of(s: &PathSummary, role: &str, load: &str) -> Option<f64> {
    s.cpu.iter().find(|c| c.role == role && c.load == load).and_then(|c| c.cpu_ms_per_1k_calls).map(|c| c.median)
}

/// The ratios of the issue and the targets checked on them. The latency targets use the
/// first (lowest) open-loop rate; the CPU target the highest.
pub fn ratios_and_targets(
    s: &[PathSummary],
    payloads: &[usize],
    rates: &[u32],
    table: &[TableRss],
) -> (Vec<Ratio>, Vec<TargetCheck>) {
    let mut ratios = Vec::new();
    let mut targets = Vec::new();
    let low = rates.first().copied();
    let high = rates.last().copied();
    for &payload in payloads {
        let get = |path: &str| find(s, payload, path);
        let thr = |path: &str| get(path).and_then(|p| p.throughput).map(|t| t.median);
        let added = |path: &str, rate: Option<u32>, p99: bool| {
            let o = get(path)?.open.iter().find(|o| Some(o.rate) == rate)?;
            (if p99 { o.added_p99 } else { o.added_p50 }).map(|a| a.median)
        };
        let mut push = |name: String, value: f64| ratios.push(Ratio { payload, name, value });
        push("throughput mesh/nginx".into(), ratio(thr("mesh"), thr("nginx")));
        push("throughput mesh/envoy".into(), ratio(thr("mesh"), thr("envoy")));
        push("throughput mesh/direct".into(), ratio(thr("mesh"), thr("direct")));
        for rate in rates {
            for (q, p99) in [("p50", false), ("p99", true)] {
                let r = Some(*rate);
                push(format!("added {q} @{rate}/s mesh/nginx"), ratio(added("mesh", r, p99), added("nginx", r, p99)));
                push(format!("added {q} @{rate}/s mesh/envoy"), ratio(added("mesh", r, p99), added("envoy", r, p99)));
            }
        }
        let cpu_pair = |path: &str, load: &str| -> Option<f64> {
            let p = get(path)?;
            let roles = proxy_roles(path);
            Some(cpu_of(p, roles[0], load)? + cpu_of(p, roles[1], load)?)
        };
        let loads: Vec<String> =
            std::iter::once("closed".to_string()).chain(rates.iter().map(|r| format!("open@{r}"))).collect();
        for load in &loads {
            push(
                format!("CPU per call sidecars/nginx ({load})"),
                ratio(cpu_pair("mesh", load), cpu_pair("nginx", load)),
            );
            push(
                format!("CPU per call sidecars/envoy ({load})"),
                ratio(cpu_pair("mesh", load), cpu_pair("envoy", load)),
            );
        }

        let per_call = |path: &str, role: &str, load: &str, cycles: bool| {
            let c = get(path)?.counters.iter().find(|c| c.role == role && c.load == load)?;
            (if cycles { c.cycles_per_call } else { c.instructions_per_call }).map(|s| s.median)
        };
        for rate in rates {
            let load = format!("open@{rate}");
            for (hop, sidecar, nginx) in [("A", "sidecar A", "nginx A"), ("B", "sidecar B", "nginx B")] {
                for (what, cycles) in [("instructions", false), ("cycles", true)] {
                    let (mesh, other) =
                        (per_call("mesh", sidecar, &load, cycles), per_call("nginx", nginx, &load, cycles));
                    if mesh.is_some() || other.is_some() {
                        push(format!("{what} per call sidecar {hop}/nginx {hop} @{rate}/s"), ratio(mesh, other));
                    }
                }
            }
        }

        let mut check = |target: String, value: f64, relation: &str, limit: f64| {
            let met = value.is_finite() && if relation == "≥" { value >= limit } else { value <= limit };
            targets.push(TargetCheck { payload: Some(payload), target, value, limit, relation: relation.into(), met });
        };
        check("throughput mesh/nginx".into(), ratio(thr("mesh"), thr("nginx")), "≥", 1.2);
        check("throughput mesh/envoy".into(), ratio(thr("mesh"), thr("envoy")), "≥", 2.0);
        if let Some(rate) = low {
            for (q, p99) in [("p50", false), ("p99", true)] {
                let r = Some(rate);
                let mesh = added("mesh", r, p99);
                check(format!("added {q} @{rate}/s mesh/nginx"), ratio(mesh, added("nginx", r, p99)), "≤", 1.0);
                check(format!("added {q} @{rate}/s mesh/envoy"), ratio(mesh, added("envoy", r, p99)), "≤", 0.5);
            }
        }
        if let Some(rate) = high {
            let load = format!("open@{rate}");
            for (hop, sidecar, nginx) in [("A", "sidecar A", "nginx A"), ("B", "sidecar B", "nginx B")] {
                let v = ratio(
                    get("mesh").and_then(|p| cpu_of(p, sidecar, &load)),
                    get("nginx").and_then(|p| cpu_of(p, nginx, &load)),
                );
                check(format!("CPU per call sidecar {hop}/nginx {hop} @{rate}/s"), v, "≤", 1.0);
            }
        }
    }
    if let Some(row) = table.iter().find(|t| t.instances == 1000 && t.mode == "incremental") {
        // 20 MB = 20,000,000 bytes.
        let mb = row.rss_kib as f64 * 1024.0 / 1e6;
        targets.push(TargetCheck {
            payload: None,
            target: "sidecar RSS with 1,000 instances (MB)".into(),
            value: mb,
            limit: 20.0,
            relation: "≤".into(),
            met: row.converged && mb <= 20.0,
        });
    }
    (ratios, targets)
}

/// Medians per path of the streaming runs.
pub fn summarize_streams(ms: &[StreamMeasurement], paths: &[String]) -> Vec<StreamSummary> {
    paths
        .iter()
        .map(|path| {
            let mine: Vec<&StreamMeasurement> = ms.iter().filter(|m| &m.path == path).collect();
            let cpu_ms_per_mb = proxy_roles(path)
                .iter()
                .chain(["agent"].iter())
                .map(|role| {
                    let values: Vec<f64> = mine
                        .iter()
                        .filter_map(|m| m.processes.iter().find(|p| p.role == *role).map(|p| p.cpu_ms_per_mb))
                        .collect();
                    (role.to_string(), Stat::of(&values))
                })
                .collect();
            StreamSummary {
                path: path.clone(),
                mb_per_s: Stat::of(&mine.iter().map(|m| m.result.mb_per_s).collect::<Vec<_>>()),
                cpu_ms_per_mb,
                streams: mine.iter().map(|m| m.result.ok).sum(),
                errors: mine.iter().map(|m| m.result.errors).sum(),
            }
        })
        .collect()
}

/// MB/s and CPU per MB of the mesh against the other paths; `chunk` is the chunk size
/// (the ratios' `payload`).
pub fn stream_ratios(s: &[StreamSummary], chunk: usize) -> Vec<Ratio> {
    let get = |path: &str| s.iter().find(|p| p.path == path);
    let mbps = |path: &str| get(path).and_then(|p| p.mb_per_s).map(|m| m.median);
    let cpu_pair = |path: &str| -> Option<f64> {
        let p = get(path)?;
        let of = |role: &str| p.cpu_ms_per_mb.iter().find(|(r, _)| r == role).and_then(|(_, c)| *c).map(|c| c.median);
        let roles = proxy_roles(path);
        Some(of(roles[0])? + of(roles[1])?)
    };
    let mut out = Vec::new();
    for other in ["nginx", "envoy", "direct"] {
        out.push(Ratio {
            payload: chunk,
            name: format!("stream MB/s mesh/{other}"),
            value: ratio(mbps("mesh"), mbps(other)),
        });
    }
    for other in ["nginx", "envoy"] {
        out.push(Ratio {
            payload: chunk,
            name: format!("stream CPU per MB sidecars/{other}"),
            value: ratio(cpu_pair("mesh"), cpu_pair(other)),
        });
    }
    out
}

/// The streaming target: MB/s through both sidecars ≥ nginx's `grpc_pass`.
pub fn stream_target(ratios: &[Ratio]) -> Option<TargetCheck> {
    let r = ratios.iter().find(|r| r.name == "stream MB/s mesh/nginx")?;
    Some(TargetCheck {
        payload: Some(r.payload),
        target: "stream MB/s mesh/nginx".into(),
        value: r.value,
        limit: 1.0,
        relation: "≥".into(),
        met: r.value.is_finite() && r.value >= 1.0,
    })
}

fn ms(s: Option<Stat>) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max),
        Some(s) => format!("{:.3}", s.median),
        None => "–".into(),
    }
}

fn cpu(s: Option<Stat>) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{:.1} ({:.1}–{:.1})", s.median, s.min, s.max),
        Some(s) => format!("{:.1}", s.median),
        None => "–".into(),
    }
}

fn rate(s: Option<Stat>) -> String {
    let k = |v: f64| if v >= 1000.0 { format!("{:.1}k", v / 1000.0) } else { format!("{v:.0}") };
    match s {
        Some(s) if s.n > 1 => format!("{} ({}–{})", k(s.median), k(s.min), k(s.max)),
        Some(s) => k(s.median),
        None => "–".into(),
    }
}

/// A per-call count: "12,345" (median), with the range when there are several.
fn count(s: Option<Stat>) -> String {
    let k = |v: f64| {
        let digits = format!("{:.0}", v.max(0.0));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    match s {
        Some(s) if s.n > 1 => format!("{} ({}–{})", k(s.median), k(s.min), k(s.max)),
        Some(s) => k(s.median),
        None => "–".into(),
    }
}

fn num(v: f64, digits: usize) -> String {
    if v.is_finite() { format!("{v:.digits$}") } else { "n/a".into() }
}

fn payload_name(p: usize) -> String {
    if p >= 1024 && p.is_multiple_of(1024) { format!("{} KiB", p / 1024) } else { format!("{p} B") }
}

fn path_label(path: &str) -> &'static str {
    match path {
        "direct" => "direct: client → agent",
        "mesh" => "mesh: client → sidecar A → sidecar B → agent",
        "nginx" => "nginx → nginx → agent",
        "envoy" => "Envoy → Envoy → agent",
        _ => "?",
    }
}

/// The report as markdown: setup, one table per payload, resources, ratios, targets,
/// routing-table memory.
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    let s = &r.settings;
    let _ = writeln!(o, "## Agent-Reach call path vs nginx and Envoy — {}\n", r.date);
    let _ = writeln!(o, "- Machine: {}", r.machine.describe());
    if let Some(rev) = &r.revision {
        let _ = writeln!(o, "- Source: commit {rev}; {}", s.binaries);
    } else {
        let _ = writeln!(o, "- Source: {}", s.binaries);
    }
    let _ = writeln!(o, "- Tools: nginx {}, Envoy {}, {}", s.nginx, s.envoy, s.h2load);
    let _ = writeln!(o, "- CPU budget: {}", s.cpu_budget);
    let _ = writeln!(o, "- TLS: {}", if s.tls.is_empty() { "none" } else { &s.tls });
    let _ = writeln!(o, "- Pinning: {}", s.pinning);
    let _ = writeln!(o, "- Closed loop: {}", s.closed_loop);
    let _ = writeln!(o, "- Open loop: {}", s.open_loop);
    if !s.hardware_counters.is_empty() {
        let _ = writeln!(o, "- Hardware counters: {}", s.hardware_counters);
    }
    let _ = writeln!(
        o,
        "- {} repetition(s), paths interleaved within each; cells show the median and (min–max) over repetitions.",
        s.reps
    );
    let l = &r.load;
    let _ = writeln!(
        o,
        "- Machine load: load average (1/5/15 min) {:.2}/{:.2}/{:.2} at start, {:.2}/{:.2}/{:.2} at end; processes \
         outside the benchmark used {:.2} cores on average during measurements (max {:.2}).",
        l.loadavg_start[0],
        l.loadavg_start[1],
        l.loadavg_start[2],
        l.loadavg_end[0],
        l.loadavg_end[1],
        l.loadavg_end[2],
        l.other_cores_mean,
        l.other_cores_max
    );
    let _ = writeln!(
        o,
        "- Result: {}\n",
        if r.ok { "every path answered grpc-status 0 to every call" } else { "FAILED (see failures)" }
    );

    for &payload in &s.payloads {
        let _ = writeln!(o, "### {} payload: throughput and latency (ms)\n", payload_name(payload));
        let mut header = "| path | calls/s (closed loop) |".to_string();
        let mut rule = "|---|---|".to_string();
        for rate in &s.rates {
            let _ = write!(header, " p50 @{rate}/s | p90 | p99 | p99.9 | added p50 | added p99 |");
            rule.push_str("---|---|---|---|---|---|");
        }
        let _ = writeln!(o, "{header}\n{rule}");
        for p in r.summary.iter().filter(|p| p.payload == payload) {
            let _ = write!(o, "| {} | {} |", path_label(&p.path), rate(p.throughput));
            for open in &p.open {
                let _ = write!(
                    o,
                    " {} | {} | {} | {} | {} | {} |",
                    ms(open.p50),
                    ms(open.p90.map(|s| Stat { n: 1, ..s })),
                    ms(open.p99),
                    ms(open.p999.map(|s| Stat { n: 1, ..s })),
                    ms(open.added_p50),
                    ms(open.added_p99)
                );
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(
            o,
            "\n### {} payload: CPU ms per 1,000 calls and peak RSS of each process\n",
            payload_name(payload)
        );
        let mut header = "| path | process | closed loop |".to_string();
        let mut rule = "|---|---|---|".to_string();
        for rate in &s.rates {
            let _ = write!(header, " @{rate}/s |");
            rule.push_str("---|");
        }
        let _ = writeln!(o, "{header} peak RSS MiB |\n{rule}---|");
        for p in r.summary.iter().filter(|p| p.payload == payload) {
            for (role, peak) in &p.peak_rss_kib {
                let _ = write!(o, "| {} | {role} |", p.path);
                for c in p.cpu.iter().filter(|c| &c.role == role) {
                    let _ = write!(o, " {} |", cpu(c.cpu_ms_per_1k_calls));
                }
                let _ = writeln!(o, " {:.1} |", *peak as f64 / 1024.0);
            }
        }
        let _ = writeln!(o);
        if r.summary.iter().any(|p| p.payload == payload && !p.counters.is_empty()) {
            let _ = writeln!(
                o,
                "### {} payload: instructions and cycles per call (perf stat) of each proxy\n",
                payload_name(payload)
            );
            let mut header = "| path | process |".to_string();
            let mut rule = "|---|---|".to_string();
            for rate in &s.rates {
                let _ = write!(header, " instructions @{rate}/s | cycles @{rate}/s |");
                rule.push_str("---|---|");
            }
            let _ = writeln!(o, "{header}\n{rule}");
            for p in r.summary.iter().filter(|p| p.payload == payload) {
                for role in proxy_roles(&p.path) {
                    let _ = write!(o, "| {} | {role} |", p.path);
                    for rate in &s.rates {
                        let c = p.counters.iter().find(|c| c.role == *role && c.load == format!("open@{rate}"));
                        let _ = write!(
                            o,
                            " {} | {} |",
                            count(c.and_then(|c| c.instructions_per_call)),
                            count(c.and_then(|c| c.cycles_per_call))
                        );
                    }
                    let _ = writeln!(o);
                }
            }
            let _ = writeln!(o);
        }
    }

    let _ = writeln!(o, "### Ratios (medians)\n");
    let mut header = "| ratio |".to_string();
    let mut rule = "|---|".to_string();
    for &p in &s.payloads {
        let _ = write!(header, " {} |", payload_name(p));
        rule.push_str("---|");
    }
    let _ = writeln!(o, "{header}\n{rule}");
    let mut names: Vec<&str> = Vec::new();
    for x in &r.ratios {
        if !names.contains(&x.name.as_str()) {
            names.push(&x.name);
        }
    }
    for name in names {
        let _ = write!(o, "| {name} |");
        for &p in &s.payloads {
            let v = r.ratios.iter().find(|x| x.payload == p && x.name == name).map_or(f64::NAN, |x| x.value);
            let _ = write!(o, " {} |", num(v, 2));
        }
        let _ = writeln!(o);
    }

    if let Some(st) = &r.streaming {
        let _ = writeln!(
            o,
            "\n### Streaming: {} chunks, MB/s of payload (10^6 bytes)\n",
            payload_name(crate::wire::STREAM_CHUNK)
        );
        let _ = writeln!(o, "{}\n", st.setup);
        let _ = writeln!(o, "| path | MB/s | streams (errors) | CPU ms per MB of each process |\n|---|---|---|---|");
        for p in &st.summary {
            let cpu_cells: Vec<String> = p
                .cpu_ms_per_mb
                .iter()
                .map(|(role, c)| format!("{role} {}", ms(c.map(|c| Stat { n: 1, ..c }))))
                .collect();
            let _ = writeln!(
                o,
                "| {} | {} | {} ({}) | {} |",
                path_label(&p.path),
                cpu(p.mb_per_s),
                p.streams,
                p.errors,
                cpu_cells.join("; ")
            );
        }
        let _ = writeln!(o);
        for x in &st.ratios {
            let _ = writeln!(o, "- {}: {}", x.name, num(x.value, 2));
        }
    }

    let _ = writeln!(o, "\n### Targets\n\n| target | payload | value | target | met |\n|---|---|---|---|---|");
    for t in &r.targets {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} {} | {} |",
            t.target,
            t.payload.map_or("–".into(), payload_name),
            num(t.value, 2),
            t.relation,
            num(t.limit, 2),
            if t.met { "yes" } else { "**no**" }
        );
    }

    if !r.table_rss.is_empty() {
        let _ = writeln!(
            o,
            "\n### Sidecar memory with a large routing table\n\n| instances | how the table was filled | converged | control accepted all, s | table converged, s | sidecar CPU s | RSS MiB | peak RSS MiB |\n|---|---|---|---|---|---|---|---|"
        );
        for t in &r.table_rss {
            let how = match t.mode.as_str() {
                "incremental" => "one delta per registration, sidecar running",
                "snapshot" => "one snapshot, sidecar started after",
                _ => "no instances",
            };
            let _ = writeln!(
                o,
                "| {} | {how} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} |",
                t.instances,
                if t.converged { "yes" } else { "**no**" },
                if t.mode == "incremental" { format!("{:.2}", t.fill_s) } else { "–".into() },
                t.converge_s,
                t.sidecar_cpu_s,
                t.rss_kib as f64 / 1024.0,
                t.peak_rss_kib as f64 / 1024.0
            );
        }
    }
    if !r.failures.is_empty() {
        let _ = writeln!(o, "\n### Failures\n");
        for f in &r.failures {
            let _ = writeln!(o, "- {}", f.replace('\n', " "));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranges() {
        assert_eq!(Stat::of(&[3.0, 1.0, 2.0]), Some(Stat { median: 2.0, min: 1.0, max: 3.0, n: 3 }));
        assert_eq!(Stat::of(&[4.0, 1.0]).unwrap().median, 2.5);
        assert_eq!(Stat::of(&[]), None);
        assert_eq!(Stat::of(&[f64::NAN]), None);
    }

    #[test]
    fn counts_read_with_thousands_separators() {
        assert_eq!(count(Some(Stat { median: 1_234_567.4, min: 1.0, max: 1e6, n: 3 })), "1,234,567 (1–1,000,000)");
        assert_eq!(count(Some(Stat { median: 999.0, min: 999.0, max: 999.0, n: 1 })), "999");
        assert_eq!(count(None), "–");
    }

    fn streamed(path: &str, rep: usize, mb_per_s: f64, cpu: &[(&str, f64)]) -> StreamMeasurement {
        StreamMeasurement {
            rep,
            path: path.into(),
            wall_s: 1.0,
            result: StreamResult { mb_per_s, ok: 10, ..Default::default() },
            processes: cpu
                .iter()
                .map(|(role, c)| StreamProcUsage {
                    role: role.to_string(),
                    pids: vec![1],
                    cpu_s: 0.0,
                    cpu_ms_per_mb: *c,
                    peak_rss_kib: 0,
                })
                .collect(),
            other_cores: 0.0,
            loadavg_1m: 0.0,
        }
    }

    #[test]
    fn streaming_ratios_and_target() {
        let ms = vec![
            streamed("mesh", 1, 300.0, &[("sidecar A", 1.0), ("sidecar B", 2.0)]),
            streamed("mesh", 2, 500.0, &[("sidecar A", 1.0), ("sidecar B", 2.0)]),
            streamed("nginx", 1, 500.0, &[("nginx A", 0.5), ("nginx B", 1.0)]),
            streamed("nginx", 2, 300.0, &[("nginx A", 0.5), ("nginx B", 1.0)]),
            streamed("direct", 1, 1600.0, &[]),
        ];
        let paths: Vec<String> = ["direct", "mesh", "nginx", "envoy"].iter().map(|p| p.to_string()).collect();
        let summary = summarize_streams(&ms, &paths);
        assert_eq!(summary[1].mb_per_s.unwrap().median, 400.0);
        assert_eq!(summary[1].streams, 20);
        let ratios = stream_ratios(&summary, 65536);
        let get = |name: &str| ratios.iter().find(|r| r.name == name).unwrap().value;
        assert_eq!(get("stream MB/s mesh/nginx"), 1.0);
        assert_eq!(get("stream MB/s mesh/direct"), 0.25);
        assert_eq!(get("stream CPU per MB sidecars/nginx"), 2.0);
        assert!(get("stream MB/s mesh/envoy").is_nan(), "no Envoy runs");
        let target = stream_target(&ratios).unwrap();
        assert!(target.met && target.payload == Some(65536) && target.relation == "≥");
    }

    #[test]
    fn ratios_need_a_positive_denominator() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), 1.5);
        assert!(ratio(Some(3.0), Some(0.0)).is_nan());
        assert!(ratio(None, Some(1.0)).is_nan());
    }
}
