//! `agent-reach trace <trace-id>` end to end: the built binary reads the span buffers of
//! two running sidecars (control on a real etcd) and prints the hops of a traced call.

use std::process::Output;
use std::time::Duration;

use agent_reach::Client;
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, sidecar_config, start_control, start_sidecar_with_admin,
    wait_for_instances,
};

/// Runs `agent-reach <args>`.
async fn agent_reach(args: Vec<String>) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agent-reach"));
    command.args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run agent-reach")).await.expect("join")
}

/// A line of the tree with its timings (`+<start> ms <duration> ms`) shown as `T`.
fn without_timings(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let masked: Vec<&str> = words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let timing = words.get(i + 1) == Some(&"ms") && w.trim_start_matches('+').parse::<f64>().is_ok();
            match (timing, w.starts_with('+')) {
                (true, true) => "+T",
                (true, false) => "T",
                (false, _) => w,
            }
        })
        .collect();
    masked.join(" ").trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_prints_the_hops_of_a_traced_call_from_both_sidecars() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar_with_admin(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    let id = agent.instance_id();
    wait_for_instances(&a, std::slice::from_ref(&id)).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let reply = client.invoke("echo").text("hi").force_trace().send().await.unwrap();
    assert_eq!(reply.text(), format!("echo@{id}:hi"));
    let trace_id = reply.trace_id().expect("a forced trace names its id").to_string();
    let admins: Vec<String> = [&a, &b].iter().map(|s| s.admin_addr().expect("admin port").to_string()).collect();
    let args: Vec<String> = [
        "trace".to_string(),
        trace_id.clone(),
        "--admin".into(),
        admins[0].clone(),
        "--admin".into(),
        admins[1].clone(),
    ]
    .into();

    // A span is in its sidecar's buffer once it ends, which may be just after the reply.
    let mut out = agent_reach(args.clone()).await;
    for _ in 0..50 {
        if String::from_utf8_lossy(&out.stdout).starts_with(&format!("trace {trace_id}: 3 span(s)")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        out = agent_reach(args.clone()).await;
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = stdout.lines().map(without_timings).collect();
    // The caller's sidecar's call and attempt spans, the target's sidecar's delivery span
    // under the attempt, each with the instance and outcome.
    assert_eq!(
        lines,
        [
            format!("trace {trace_id}: 3 span(s)"),
            format!("invoke capability echo [host-a] +T ms T ms  instance={id} outcome=OK"),
            format!("  attempt capability echo [host-a] +T ms T ms  instance={id} attempt=1 outcome=ANSWERED"),
            format!("    deliver echo [host-b] +T ms T ms  instance={id} outcome=OK"),
        ],
        "{stdout}"
    );

    // JSON lists the same spans, all of one trace.
    let mut json_args = args.clone();
    json_args.extend(["--output".to_string(), "json".to_string()]);
    let out = agent_reach(json_args).await;
    assert!(out.status.success());
    let spans: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let spans = spans.as_array().expect("an array");
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(spans.iter().all(|s| s["trace_id"] == trace_id.as_str()), "one trace: {spans:?}");
    for name in ["invoke capability echo", "attempt capability echo", "deliver echo"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }

    // A trace no sidecar holds, and a malformed id, fail with a message.
    let out = agent_reach(vec!["trace".into(), "0".repeat(32), "--admin".into(), admins[0].clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("agent-reach: no span of trace {} in the recent buffers of {}\n", "0".repeat(32), admins[0])
    );
    let out = agent_reach(vec!["trace".into(), "xyz".into(), "--admin".into(), admins[0].clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "agent-reach: \"xyz\" is not a trace id (32 hex digits, as in traceparent)\n"
    );

    agent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}
