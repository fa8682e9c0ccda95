//! Smoke test of the benchmark harness, so it cannot rot: a tiny `agent-reach-bench run
//! --smoke --embedded` (one repetition, a few hundred calls per path and load, a
//! 100-instance routing table) through every path — direct, mesh, nginx → nginx, Envoy →
//! Envoy — with both payloads, asserting that every path answered every call with
//! grpc-status 0. It needs nginx, h2load and Envoy (`scripts/install-bench-tools.sh`) and
//! fails, never skips, when one is missing. A second run does the same with `--tls` (one
//! payload). The real benchmark is not part of the tests.

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
    let table = report["table_rss"].as_array().unwrap();
    // The sidecar memory measurement (plaintext: it registers fake sidecars directly).
    assert_eq!(table.len(), 3, "idle, incremental and snapshot rows");
    for row in table {
        assert_eq!(row["converged"], Value::Bool(true), "routing table did not converge: {row}");
        assert!(row["rss_kib"].as_u64().unwrap() > 0, "{row}");
    }
}
