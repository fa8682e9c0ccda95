//! The dashboard's whole-mesh picture with two control replicas on one etcd: two sidecars,
//! each connected to a different replica, report their traffic with their heartbeats; the
//! page of either replica shows every edge (calls, errors, fallbacks, reporting sidecar),
//! the instances' last heartbeats, a traced call's hops on both sidecars (with its link to
//! the tracing backend where `--dashboard-trace-url` is set), and the two alerts that need
//! the sidecars' reports (served by its fallback, breakers open), in a real headless
//! Chromium.

use std::time::Duration;

use agent_reach::policy::{Fallback, PolicySpec};
use agent_reach::{Agent, HandlerError, Reply, RunningAgent};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::browser::Browser;
use agent_reach_e2e::{
    Backend, TestStore, capability_policy, echo_agent, init_logging, listener, put_policy, sidecar_config,
    start_sidecar, wait_for_instances,
};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use serde_json::{Value, json};

fn reporting(control: &ControlHandle, id: &str) -> SidecarConfig {
    let mut config = sidecar_config(&control.endpoint(), id);
    config.report_interval = Duration::from_millis(200);
    config
}

async fn failing_agent(sidecar: &Sidecar, capability: &str) -> RunningAgent {
    Agent::builder("flaky")
        .sidecar(sidecar.local_addr().to_string())
        .handle(capability, |call| async move {
            Err::<Reply, _>(HandlerError::unavailable(format!("{} is failing", call.instance_id())))
        })
        .start()
        .await
        .unwrap()
}

/// GET `path` from a dashboard: the JSON body.
pub(crate) async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap()
}

/// (caller>agent, target, calls, errors, fallback calls, reporting sidecars) per edge.
fn edges(state: &Value) -> Vec<(String, String, u64, u64, u64, String)> {
    state["topology"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            let sidecars: Vec<&str> = e["sidecars"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
            (
                format!("{}>{}", s("caller"), s("agent")),
                s("target"),
                e["calls"].as_u64().unwrap(),
                e["errors"].as_u64().unwrap(),
                e["fallback_calls"].as_u64().unwrap(),
                sidecars.join(","),
            )
        })
        .collect()
}

fn expected_edges() -> Vec<(String, String, u64, u64, u64, String)> {
    [
        ("auditor>(none)", "(unknown)", 3, 3, 0, "host-b"),
        ("auditor>backup", "capability text.summarize", 5, 0, 5, "host-b"),
        ("auditor>worker", "capability work", 10, 0, 0, "host-b"),
        ("planner>auditor", "capability audit.check", 1, 0, 0, "host-a"),
        ("planner>flaky", "capability flaky.work", 5, 5, 0, "host-a"),
        ("planner>worker", "capability work", 20, 0, 0, "host-a"),
    ]
    .into_iter()
    .map(|(e, t, c, x, f, s)| (e.to_string(), t.to_string(), c, x, f, s.to_string()))
    .collect()
}

/// Where replica one's traces view links each trace (`--dashboard-trace-url`).
const TRACE_URL: &str = "http://tracing.example:16686/trace/{trace_id}?from=agent-reach";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_shows_every_sidecars_edges_heartbeats_traces_and_alerts() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let config = ControlConfig { lease_ttl: Duration::from_secs(20), ..ControlConfig::default() };
    let (page_one, page_two) = (listener().await, listener().await);
    let (addr_one, addr_two) = (page_one.local_addr().unwrap(), page_two.local_addr().unwrap());
    // Replica one links traces to a tracing backend (--dashboard-trace-url), two does not.
    let linked = ControlConfig { dashboard_trace_url: Some(TRACE_URL.into()), ..config.clone() };
    let one = ControlHandle::spawn_with_dashboard(ts.store.clone(), linked, listener().await, page_one).unwrap();
    let two = ControlHandle::spawn_with_dashboard(ts.store.clone(), config, listener().await, page_two).unwrap();
    let a = start_sidecar(reporting(&one, "host-a")).await;
    let b = start_sidecar(reporting(&two, "host-b")).await;
    let planner = echo_agent(a.local_addr(), "planner", &[("plan.make", &[])]).await;
    let w1 = echo_agent(a.local_addr(), "worker", &[("work", &[])]).await;
    let auditor = echo_agent(b.local_addr(), "auditor", &[("audit.check", &[])]).await;
    let w2 = echo_agent(b.local_addr(), "worker", &[("work", &[])]).await;
    let backup = echo_agent(b.local_addr(), "backup", &[("text.summarize.cheap", &[])]).await;
    let flaky = failing_agent(&b, "flaky.work").await;
    let ids: Vec<String> = [&planner, &w1, &auditor, &w2, &backup, &flaky].iter().map(|a| a.instance_id()).collect();
    wait_for_instances(&a, &ids).await;
    wait_for_instances(&b, &ids).await;
    let fallback =
        PolicySpec { fallback: Some(Fallback::Capability("text.summarize.cheap".into())), ..Default::default() };
    put_policy(&ts.store, &[&a, &b], capability_policy("text.summarize", fallback)).await;

    // Traffic through host-a (replica one) and host-b (replica two).
    // Callers are the agents themselves: edges name the caller their sidecar verified.
    let from_a = planner.client();
    let from_b = auditor.client();
    for _ in 0..20 {
        from_a.invoke("work").text("x").send().await.unwrap();
    }
    for _ in 0..10 {
        from_b.invoke("work").text("x").send().await.unwrap();
    }
    for _ in 0..3 {
        from_b.invoke("no.such.work").text("x").send().await.unwrap_err();
    }
    for _ in 0..5 {
        let reply = from_b.invoke("text.summarize").text("x").send().await.unwrap();
        assert_eq!(reply.fallback_from(), Some("capability text.summarize"));
    }
    for _ in 0..5 {
        from_a.invoke("flaky.work").text("x").send().await.unwrap_err();
    }
    let traced = from_a.invoke("audit.check").session("sess-topology").force_trace().text("x").send().await.unwrap();
    let trace_id = traced.trace_id().expect("a forced trace names its id").to_string();

    // Both replicas' pages hold every sidecar's edges, exactly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for addr in [addr_one, addr_two] {
        loop {
            let state = get_json(addr, "/api/state?tenant=default").await;
            if edges(&state) == expected_edges() {
                let beats = state["last_heartbeats"].as_object().unwrap();
                let mut seen: Vec<&String> = beats.keys().collect();
                seen.sort();
                let mut want: Vec<&String> = ids.iter().collect();
                want.sort();
                assert_eq!(seen, want, "every instance's last heartbeat is reported");
                let now = state["generated_at_ms"].as_i64().unwrap();
                for (id, at) in beats {
                    let age = now - at.as_i64().unwrap();
                    assert!((0..5_000).contains(&age), "{id}: last heartbeat {age} ms ago");
                }
                assert_eq!(state["open_breakers"], json!({ flaky.instance_id(): ["host-a"] }));
                let p99 = state["topology"][5]["p99_ms"].as_f64().expect("a latency histogram");
                assert!(p99 > 0.0 && p99 < 5_000.0, "{p99}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "edges at {addr}: {:?}", edges(&state));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let browser = Browser::start().await;
    let b_ = &browser;
    let page = format!("http://{addr_one}");
    let dir = crate::dashboard::screenshots();
    b_.client.goto(&format!("{page}/#/topology")).await.unwrap();
    let shown = b_
        .wait_until(
            "six edges",
            Duration::from_secs(15),
            "return [...document.querySelectorAll('tr[data-edge]')].map(r => [r.dataset.edge, \
             r.querySelector('.calls').textContent, r.querySelector('.errors').textContent, \
             r.querySelector('.sidecars').textContent]);",
            |v| v.as_array().is_some_and(|a| a.len() == 6),
        )
        .await;
    assert_eq!(
        shown,
        json!([
            ["auditor>(none)", "3", "100.0%", "host-b"],
            ["auditor>backup", "5", "0.0%", "host-b"],
            ["auditor>worker", "10", "0.0%", "host-b"],
            ["planner>auditor", "1", "0.0%", "host-a"],
            ["planner>flaky", "5", "100.0%", "host-a"],
            ["planner>worker", "20", "0.0%", "host-a"],
        ])
    );
    b_.screenshot(&dir.join("topology.png")).await;

    // The instances' last heartbeats, from the reports.
    b_.client.goto(&format!("{page}/#/instances")).await.unwrap();
    let beats = b_
        .wait_until(
            "six last heartbeats",
            Duration::from_secs(10),
            "return [...document.querySelectorAll('tr[data-instance] .heartbeat')].map(c => c.textContent);",
            |v| v.as_array().is_some_and(|a| a.len() == 6),
        )
        .await;
    for beat in beats.as_array().unwrap() {
        let text = beat.as_str().unwrap();
        assert!(text.ends_with("s ago"), "{beats}");
    }

    // The traced call's hops on both sidecars, found by its session.
    b_.client.goto(&format!("{page}/#/traces")).await.unwrap();
    let query = b_.client.wait().for_element(fantoccini::Locator::Css("#trace-query")).await.unwrap();
    query.send_keys("sess-topology").await.unwrap();
    b_.client.find(fantoccini::Locator::Css("#trace-form button")).await.unwrap().click().await.unwrap();
    let trace = b_
        .wait_until(
            "the traced call",
            Duration::from_secs(10),
            "return [...document.querySelectorAll('section.trace')].map(t => [t.dataset.trace, \
             [...t.querySelectorAll('tr[data-span]')].map(r => [r.querySelector('.span-name').textContent, \
             r.children[1].textContent])]);",
            |v| v.as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
    assert_eq!(trace[0][0], Value::String(trace_id.clone()), "{trace}");
    let spans = trace[0][1].as_array().unwrap();
    assert!(spans.len() >= 3, "{trace}");
    assert_eq!(spans[0], json!(["invoke capability audit.check", "host-a"]), "{trace}");
    let sidecars: std::collections::BTreeSet<&str> = spans.iter().map(|s| s[1].as_str().unwrap()).collect();
    assert_eq!(sidecars, ["host-a", "host-b"].into_iter().collect(), "{trace}");
    // Each trace links to it in the tracing backend, in a new tab without an opener.
    let link = b_
        .client
        .execute(
            "const a = document.querySelector('section.trace a.trace-backend'); \
             return a ? [a.getAttribute('href'), a.getAttribute('rel'), a.getAttribute('target')] : null;",
            vec![],
        )
        .await
        .unwrap();
    let href = format!("http://tracing.example:16686/trace/{trace_id}?from=agent-reach");
    assert_eq!(link, json!([href, "noopener noreferrer", "_blank"]), "{trace}");
    assert_eq!(get_json(addr_one, "/api/session").await["trace_url"], TRACE_URL);
    assert_eq!(get_json(addr_two, "/api/session").await["trace_url"], Value::Null);
    b_.screenshot(&dir.join("traces.png")).await;
    // The same trace by its id, through the JSON endpoint.
    let by_id = get_json(addr_two, &format!("/api/traces?tenant=default&q={trace_id}")).await;
    assert_eq!(by_id["traces"][0]["session"], "sess-topology");

    // The alerts that need the sidecars' reports.
    b_.client.goto(&format!("{page}/#/alerts")).await.unwrap();
    let alerts = b_
        .wait_until(
            "the fallback and breaker alerts",
            Duration::from_secs(15),
            // Only these two rules read the reports (on a loaded machine an agent's
            // heartbeat may come late enough for "below minimum healthy" to fire too).
            "return [...document.querySelectorAll('tr[data-alert]')].map(r => \
             [r.dataset.alert, r.querySelector('.message').textContent])\
             .filter(a => a[0] === 'breakers_open' || a[0] === 'fallback_serving').sort();",
            |v| v.as_array().is_some_and(|a| a.len() >= 2),
        )
        .await;
    assert_eq!(
        alerts,
        json!([
            ["breakers_open", "1 of 1 instances of flaky have an open circuit breaker in a caller's sidecar"],
            ["fallback_serving", "capability text.summarize: 5 of 5 calls in the last minute served by its fallback"],
        ])
    );
    b_.screenshot(&dir.join("alerts-reports.png")).await;

    let errors: Vec<(String, String)> = b_.console().await.into_iter().filter(|(level, _)| level != "INFO").collect();
    assert!(errors.is_empty(), "console: {errors:?}");
    let failed: Vec<(String, u64)> = b_.requests().await.into_iter().filter(|(_, status)| *status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    browser.close().await;
}
