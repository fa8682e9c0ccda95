//! Smoke test of the benchmark harness, so it cannot rot: a tiny `agent-reach-bench run
//! --smoke --embedded` (one repetition, a few hundred calls per path and load, a
//! 100-instance routing table) through every path — direct, mesh, nginx → nginx, Envoy →
//! Envoy — with both payloads, asserting that every path answered every call with
//! grpc-status 0, and that every path streamed 64 KiB chunks with every stream complete.
//! It needs nginx, h2load and Envoy (`scripts/install-bench-tools.sh`) and fails, never
//! skips, when one is missing. A second run does the same with `--tls` (one payload). The
//! real benchmark is not part of the tests.

use std::process::Command;

use serde_json::Value;

/// One benchmark at a time: both runs pin their proxies to the same CPU.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `agent-reach-bench run --smoke --embedded` with `extra` flags; the report.
fn smoke_run(extra: &[&str]) -> Value {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_agent-reach-bench"))
        .args(["run", "--smoke", "--embedded"])
        .args(extra)
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("agent-reach-bench runs");
    assert!(status.success(), "agent-reach-bench run --smoke {extra:?} failed ({status}); see its output above");

    let text = std::fs::read_to_string(out.path().join("latest.json")).expect("latest.json written");
    let report: Value = serde_json::from_str(&text).expect("latest.json is JSON");
    assert!(out.path().join("latest.md").is_file(), "latest.md written");
    assert_eq!(report["ok"], Value::Bool(true), "failures: {}", report["failures"]);
    report
}

#[test]
fn every_path_answers_grpc_status_0() {
    let report = smoke_run(&[]);
    check_paths(&report, &[12, 1024]);
    assert!(report["settings"]["tls"].as_str().unwrap().starts_with("none"), "{}", report["settings"]["tls"]);
}

/// `--tls`: the mesh with mutual TLS (certificates from control), nginx with grpcs:// and
/// Envoy with TLS transport sockets between their two hops, every call answered.
#[test]
fn every_path_answers_over_tls() {
    let report = smoke_run(&["--tls", "--payloads", "12"]);
    check_paths(&report, &[12]);
    assert!(report["settings"]["tls"].as_str().unwrap().starts_with("TLS 1.3"), "{}", report["settings"]["tls"]);
}

fn check_paths(report: &Value, payloads: &[u64]) {
    for v in report["verifications"].as_array().unwrap() {
        assert!(v["error"].is_null(), "verification failed: {v}");
    }
    let measurements = report["measurements"].as_array().unwrap();
    for path in ["direct", "mesh", "nginx", "envoy"] {
        for &payload in payloads {
            let runs: Vec<&Value> =
                measurements.iter().filter(|m| m["path"] == path && m["payload"] == payload).collect();
            let closed = runs.iter().filter(|m| m["load"] == "closed").count();
            let open = runs.iter().filter(|m| m["load"] == "open").count();
            assert!(closed == 1 && open == 2, "{path} {payload} B: {closed} closed-loop and {open} open-loop runs");
            for m in runs {
                let what = format!("{path} {payload} B {} {}", m["load"], m["rate"]);
                assert_eq!(m["errors"].as_u64(), Some(0), "{what}: errors");
                assert!(m["calls"].as_u64().unwrap() > 0, "{what}: no successful calls");
                if m["load"] == "open" {
                    let o = &m["open_loop"];
                    assert_eq!(o["errors"].as_u64(), Some(0), "{what}: {}", o["error_samples"]);
                    assert_eq!(o["ok"], o["sent"], "{what}: every call answered with grpc-status 0");
                }
            }
        }
    }
    check_streaming(report);
    check_counters(report);
    let table = report["table_rss"].as_array().unwrap();
    // The sidecar memory measurement (plaintext: it registers fake sidecars directly).
    assert_eq!(table.len(), 3, "idle, incremental and snapshot rows");
    for row in table {
        assert_eq!(row["converged"], Value::Bool(true), "routing table did not converge: {row}");
        assert!(row["rss_kib"].as_u64().unwrap() > 0, "{row}");
    }
}

/// Every path streamed: no failed stream, and exactly the chunks asked for in bytes.
fn check_streaming(report: &Value) {
    let streaming = &report["streaming"];
    let runs = streaming["measurements"].as_array().expect("a streaming measurement");
    for path in ["direct", "mesh", "nginx", "envoy"] {
        let mine: Vec<&Value> = runs.iter().filter(|m| m["path"] == path).collect();
        assert_eq!(mine.len(), 1, "{path}: one streaming run");
        let r = &mine[0]["result"];
        assert_eq!(r["errors"].as_u64(), Some(0), "{path}: {}", r["error_samples"]);
        let (streams, chunks) = (r["measured_streams"].as_u64().unwrap(), r["chunks_per_stream"].as_u64().unwrap());
        assert!(streams > 0, "{path}: no stream measured");
        assert_eq!(r["measured_bytes"].as_u64(), Some(streams * chunks * 65536), "{path}: bytes");
        assert_eq!(r["payload_bytes"].as_u64(), Some(r["ok"].as_u64().unwrap() * chunks * 65536), "{path}");
        assert!(r["mb_per_s"].as_f64().unwrap() > 0.0, "{path}");
        for p in mine[0]["processes"].as_array().unwrap() {
            assert!(p["cpu_ms_per_mb"].as_f64().is_some_and(|c| c >= 0.0), "{path}: {p}");
        }
    }
    let ratios = streaming["ratios"].as_array().unwrap();
    assert!(ratios.iter().any(|r| r["name"] == "stream MB/s mesh/nginx" && r["value"].as_f64().unwrap() > 0.0));
    let targets = report["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t["target"] == "stream MB/s mesh/nginx" && t["payload"] == 65536));
}

/// Hardware counters: recorded for each proxy of each fixed-rate run where perf counts
/// them; where it does not, the report says why.
fn check_counters(report: &Value) {
    let line = report["settings"]["hardware_counters"].as_str().unwrap();
    let open: Vec<&Value> = report["measurements"].as_array().unwrap().iter().filter(|m| m["load"] == "open").collect();
    if line.starts_with("not available on this machine (perf stat: ") {
        assert!(line.contains("agent-reach-bench instructions"), "{line}");
        assert!(open.iter().all(|m| m["counters"].as_array().unwrap().is_empty()));
    } else {
        assert!(line.starts_with("perf stat"), "{line}");
        for m in open.iter().filter(|m| m["path"] != "direct") {
            let counters = m["counters"].as_array().unwrap();
            assert_eq!(counters.len(), 2, "both proxies of {} counted: {counters:?}", m["path"]);
            for c in counters {
                assert!(c["instructions_per_call"].as_f64().unwrap() > 0.0, "{c}");
            }
        }
    }
}
