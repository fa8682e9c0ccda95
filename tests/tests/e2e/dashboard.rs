//! The dashboard in a real headless Chromium, against a real mesh on a real etcd: agents and
//! their states, live updates without reloading, capability search with suggestions,
//! instance details, policies and alerts; no console errors and no failed request. Writes
//! screenshots of the main views to `target/dashboard-screenshots/`.
//!
//! Also the alert webhook: signed, retried, counted, without a browser.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::model::HealthState;
use agent_reach::policy::{PolicySpec, Strategy};
use agent_reach::proto;
use agent_reach_control::alerts::{AlertConfig, WebhookConfig, signature};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::browser::Browser;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, capability_policy, echo_agent, init_logging, listener, put_policy,
    sidecar_config, start_sidecar, wait_for_instances, wait_for_state,
};
use serde_json::Value;

pub(crate) fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("dashboard-screenshots")
}

const ROWS: &str = "return [...document.querySelectorAll('tr[data-instance]')].map(r => \
     [r.dataset.instance, r.querySelector('.state-cell').textContent, r.querySelector('.hold').textContent]);";

fn rows(value: &Value) -> Vec<(String, String, String)> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let s = |i: usize| r[i].as_str().unwrap_or_default().to_string();
            (s(0), s(1), s(2))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_mesh_live_in_a_browser() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let dashboard = listener().await;
    let page = format!("http://{}", dashboard.local_addr().unwrap());
    let control = ControlHandle::spawn_with_dashboard(
        ts.store.clone(),
        ControlConfig { lease_ttl: Duration::from_secs(20), ..ControlConfig::default() },
        listener().await,
        dashboard,
    )
    .unwrap();
    // Agents heartbeat every second (UNKNOWN after 2 s of silence): on a loaded machine the
    // harness's 200 ms made a healthy agent briefly UNKNOWN, a real "below minimum healthy"
    // alert this test does not provoke.
    let mut sidecar_cfg = sidecar_config(&control.endpoint(), "host-a");
    sidecar_cfg.heartbeat_interval = Duration::from_secs(1);
    let sidecar = start_sidecar(sidecar_cfg).await;
    let t1 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["en", "zh"])]).await;
    let t2 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["zh"])]).await;
    let t3 = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["en"])]).await;
    let sum = echo_agent(sidecar.local_addr(), "summarizer", &[("text.summarize", &[])]).await;
    let ids = [t1.instance_id(), t2.instance_id(), t3.instance_id(), sum.instance_id()];
    wait_for_instances(&sidecar, &ids).await;
    let policy = capability_policy(
        "text.translate",
        PolicySpec { strategy: Some(Strategy::RoundRobin), ..PolicySpec::default() },
    );
    put_policy(&ts.store, &[&sidecar], policy).await;

    let browser = Browser::start().await;
    let b = &browser;
    b.client.goto(&format!("{page}/#/instances")).await.unwrap();
    let all_up = |v: &Value| {
        let r = rows(v);
        r.len() == 4 && r.iter().all(|(_, state, _)| state == "UP")
    };
    let seen = rows(&b.wait_until("four instances UP", Duration::from_secs(15), ROWS, all_up).await);
    let mut seen_ids: Vec<String> = seen.iter().map(|r| r.0.clone()).collect();
    seen_ids.sort();
    let mut want: Vec<String> = ids.to_vec();
    want.sort();
    assert_eq!(seen_ids, want);
    b.client.execute("window.__loaded_once = true; return 1;", vec![]).await.unwrap();
    let dir = screenshots();
    b.screenshot(&dir.join("instances.png")).await;
    b.client.goto(&format!("{page}/#/agents")).await.unwrap();
    let agents = b
        .wait_until(
            "two agents",
            Duration::from_secs(10),
            "return [...document.querySelectorAll('tr[data-agent]')].map(r => \
             [r.dataset.agent, r.querySelector('.instances').textContent]);",
            |v| v.as_array().is_some_and(|a| a.len() == 2),
        )
        .await;
    assert_eq!(agents, serde_json::json!([["summarizer", "1"], ["translator", "3"]]));
    b.screenshot(&dir.join("agents.png")).await;

    // An operator pauses an instance: the page turns it PAUSED, with the reason, by itself.
    b.client.goto(&format!("{page}/#/instances")).await.unwrap();
    b.client.execute("window.__loaded_once = true; return 1;", vec![]).await.unwrap();
    b.wait_until("instances shown", Duration::from_secs(10), ROWS, all_up).await;
    let mut admin = admin_client(&control.endpoint()).await;
    admin
        .set_instance_state(proto::SetInstanceStateRequest {
            tenant: "default".into(),
            instance_id: t1.instance_id(),
            state: proto::HealthState::Paused as i32,
            reason: "disk swap".into(),
        })
        .await
        .unwrap();
    let paused = b
        .wait_until("the paused instance", Duration::from_secs(10), ROWS, |v| {
            rows(v).iter().any(|(id, state, _)| *id == t1.instance_id() && state.starts_with("PAUSED"))
        })
        .await;
    let row = rows(&paused).into_iter().find(|r| r.0 == t1.instance_id()).unwrap();
    // The effective state, what the instance itself reports, and the operator's hold.
    assert_eq!(row.1, "PAUSED reports UP");
    assert_eq!(row.2, "PAUSED by operator (instance): disk swap");
    let still = b.client.execute("return window.__loaded_once === true;", vec![]).await.unwrap();
    assert_eq!(still, Value::Bool(true), "the page was not reloaded");

    // Capability search: a typo gets the close name suggested; taking it filters the table.
    let search = b.client.find(fantoccini::Locator::Css("#search")).await.unwrap();
    search.send_keys("text.tranlsate").await.unwrap();
    let suggested = b
        .wait_until(
            "a suggestion",
            Duration::from_secs(10),
            "return [...document.querySelectorAll('#suggestions button')].map(b => b.textContent);",
            |v| v.as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
    assert_eq!(suggested, serde_json::json!(["text.translate"]));
    b.client.find(fantoccini::Locator::Css("#suggestions button")).await.unwrap().click().await.unwrap();
    b.wait_until("three translator instances", Duration::from_secs(10), ROWS, |v| rows(v).len() == 3).await;

    // Instance details.
    b.client.goto(&format!("{page}/#/instance/{}", t1.instance_id())).await.unwrap();
    let details = b
        .wait_until(
            "instance details",
            Duration::from_secs(10),
            "const d = document.querySelector('#instance-details'); return d ? d.textContent : '';",
            |v| v.as_str().is_some_and(|s| s.contains("disk swap")),
        )
        .await;
    assert!(details.as_str().unwrap().contains("text.translate[en,zh]"), "{details}");
    b.screenshot(&dir.join("instance.png")).await;

    // Policies.
    b.client.goto(&format!("{page}/#/policies")).await.unwrap();
    b.wait_until(
        "the policy",
        Duration::from_secs(10),
        "return [...document.querySelectorAll('tr[data-policy]')].map(r => r.dataset.policy);",
        |v| *v == serde_json::json!(["capability/text.translate"]),
    )
    .await;

    // Two instances crash: the alert shows.
    b.client.goto(&format!("{page}/#/alerts")).await.unwrap();
    let (id2, id3) = (t2.instance_id(), t3.instance_id());
    t2.abort();
    t3.abort();
    wait_for_state(&sidecar, &id2, HealthState::Down).await;
    let alerts = b
        .wait_until(
            "the alert",
            Duration::from_secs(15),
            "return [...document.querySelectorAll('tr[data-alert]')].map(r => \
             [r.dataset.alert, r.querySelector('.message').textContent]);",
            |v| v.as_array().is_some_and(|a| a.iter().any(|r| r[0] == "instances_lost")),
        )
        .await;
    assert_eq!(alerts, serde_json::json!([["instances_lost", "2 instances of translator lost within 15s"]]));
    let badge = b.client.execute("return document.querySelector('#alert-count').textContent;", vec![]).await.unwrap();
    assert_eq!(badge, Value::String("(1)".into()));
    b.screenshot(&dir.join("alerts.png")).await;
    let _ = id3;

    // Nothing went wrong in the page.
    let errors: Vec<(String, String)> = b.console().await.into_iter().filter(|(level, _)| level != "INFO").collect();
    assert!(errors.is_empty(), "console: {errors:?}");
    let requests = b.requests().await;
    assert!(requests.len() >= 4, "{requests:?}");
    let failed: Vec<&(String, u64)> = requests.iter().filter(|(_, status)| *status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    browser.close().await;
}

/// Requests a receiver got: headers and body.
type Received = Arc<Mutex<Vec<(http::HeaderMap, Vec<u8>)>>>;

/// An in-test webhook receiver: answers 503 to the first `fail_first` POSTs, then 200;
/// keeps every request's headers and body.
async fn receiver(fail_first: usize) -> (String, Received) {
    use http_body_util::BodyExt;
    let tcp = listener().await;
    let url = format!("http://{}/hooks/agent-reach", tcp.local_addr().unwrap());
    let seen: Received = Arc::default();
    let kept = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = tcp.accept().await else { return };
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
                        let n = {
                            let mut kept = kept.lock().unwrap();
                            kept.push((parts.headers, body));
                            kept.len()
                        };
                        let status = if n <= fail_first { 503 } else { 200 };
                        let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .await;
            });
        }
    });
    (url, seen)
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_reach_the_webhook_signed_retried_and_counted() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let (url, received) = receiver(1).await;
    let secret = b"a-webhook-secret-of-32-bytes-ok!".to_vec();
    let config = ControlConfig {
        alerts: AlertConfig {
            webhook: Some(WebhookConfig {
                url: url.parse().unwrap(),
                secret: secret.clone(),
                attempts: 4,
                timeout: Duration::from_secs(2),
                backoff: Duration::from_millis(100),
            }),
            ..AlertConfig::default()
        },
        ..ControlConfig::default()
    };
    let admin = listener().await;
    let admin_addr = admin.local_addr().unwrap();
    let control = ControlHandle::spawn_with_admin(ts.store.clone(), config, listener().await, admin).unwrap();
    let sidecar = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let agents = [
        echo_agent(sidecar.local_addr(), "planner", &[("plan.make", &[])]).await,
        echo_agent(sidecar.local_addr(), "planner", &[("plan.make", &[])]).await,
        echo_agent(sidecar.local_addr(), "planner", &[("plan.make", &[])]).await,
    ];
    let ids: Vec<String> = agents.iter().map(|a| a.instance_id()).collect();
    wait_for_instances(&sidecar, &ids).await;
    // The rules follow the tenant from the moment its feed started (the sidecar's watch),
    // so they saw every instance register UP.
    let mut agents = agents.into_iter();
    let (a, b) = (agents.next().unwrap(), agents.next().unwrap());
    a.abort();
    b.abort();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while received.lock().unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "webhook got {} requests", received.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing else comes: one alert, delivered on the second attempt.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for (headers, body) in &requests {
        let alert: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(alert["rule"], "instances_lost");
        assert_eq!(alert["agent"], "planner");
        assert_eq!(alert["tenant"], "default");
        let mut lost: Vec<String> =
            alert["instances"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_string()).collect();
        lost.sort();
        let mut want = vec![ids[0].clone(), ids[1].clone()];
        want.sort();
        assert_eq!(lost, want);
        let timestamp: u64 = headers["x-agent-reach-timestamp"].to_str().unwrap().parse().unwrap();
        let sig = headers["x-agent-reach-signature"].to_str().unwrap();
        assert_eq!(sig, signature(&secret, timestamp, body));
        assert_ne!(sig, signature(b"another-secret-of-32-bytes-long!", timestamp, body));
        assert_eq!(headers["content-type"], "application/json");
    }
    // The claim that makes one replica deliver it is in the store.
    let claims = ts.store.get_prefix(agent_reach_control::alerts::CLAIMS_ROOT).await.unwrap();
    assert_eq!(claims.kvs.len(), 1);
    assert_eq!(
        claims.kvs[0].key,
        format!("{}default/instances_lost/planner", agent_reach_control::alerts::CLAIMS_ROOT)
    );

    let metrics = scrape(admin_addr).await;
    for line in [
        "agent_reach_control_alerts_fired_total{rule=\"instances_lost\"} 1",
        "agent_reach_control_alerts_fired_total{rule=\"below_min_healthy\"} 0",
        "agent_reach_control_alert_webhook_deliveries_total{outcome=\"delivered\"} 1",
        "agent_reach_control_alert_webhook_deliveries_total{outcome=\"failed\"} 0",
        "agent_reach_control_alert_webhook_attempts_total 2",
        "agent_reach_control_alerts_active 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

/// The metric names a PromQL expression reads (`agent_reach_…` identifiers).
fn metric_names(expr: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    expr.match_indices("agent_reach_")
        .filter(|(at, _)| !expr[..*at].ends_with(ident))
        .map(|(at, _)| expr[at..].chars().take_while(|c| ident(*c)).collect())
        .collect()
}

/// The sample names of a Prometheus text exposition.
fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_grafana_dashboard_is_in_a_real_scrape() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control_admin = listener().await;
    let control_admin_addr = control_admin.local_addr().unwrap();
    let control =
        ControlHandle::spawn_with_admin(ts.store.clone(), ControlConfig::default(), listener().await, control_admin)
            .unwrap();
    let sidecar_admin = listener().await;
    let sidecar_admin_addr = sidecar_admin.local_addr().unwrap();
    let sidecar = agent_reach_sidecar::Sidecar::start_with_admin(
        sidecar_config(&control.endpoint(), "host-a"),
        listener().await,
        listener().await,
        Some(sidecar_admin),
    )
    .await
    .unwrap();
    let worker = echo_agent(sidecar.local_addr(), "worker", &[("work", &[])]).await;
    wait_for_instances(&sidecar, &[worker.instance_id()]).await;
    let client = agent_reach::Client::connect(&sidecar.local_addr().to_string()).await.unwrap();
    for _ in 0..3 {
        client.invoke("work").text("x").send().await.unwrap();
    }
    client.invoke("no.such.work").text("x").send().await.unwrap_err();

    let mut scraped = sample_names(&scrape(sidecar_admin_addr).await);
    scraped.extend(sample_names(&scrape(control_admin_addr).await));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/agent-reach/dashboards/agent-reach.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{expr}");
            queried.extend(names);
        }
    }
    assert!(queried.len() >= 20, "{queried:?}");
    let missing: Vec<&String> = queried.iter().filter(|name| !scraped.contains(*name)).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics no scrape has: {missing:?}\nscraped: {scraped:?}");
}

/// One raw HTTP/1.1 request: status, head and as much body as comes within a second.
async fn raw(addr: std::net::SocketAddr, method: &str, path: &str, host: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    // Event streams never end: read what comes within the second.
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head[9..12].parse().unwrap(), head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_answers_loopback_hosts_reads_only_and_checks_tenants() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let dashboard = listener().await;
    let addr = dashboard.local_addr().unwrap();
    let host = addr.to_string();
    let control =
        ControlHandle::spawn_with_dashboard(ts.store.clone(), ControlConfig::default(), listener().await, dashboard)
            .unwrap();
    let sidecar = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let agent = echo_agent(sidecar.local_addr(), "translator", &[("text.translate", &["zh"])]).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;

    let (status, head, body) = raw(addr, "GET", "/", &host).await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{head}");
    assert!(head.contains("x-frame-options: deny"), "{head}");
    assert!(body.contains("/assets/app.js"));
    assert_eq!(raw(addr, "GET", "/assets/app.js", "localhost").await.0, 200);
    // A page elsewhere that rebinds its name to 127.0.0.1 is refused.
    let (status, _, body) = raw(addr, "GET", "/api/state", "dashboard.evil.example").await;
    assert_eq!(status, 403, "{body}");
    // Changes are JSON bodies only, and without operator tokens nothing changes at all.
    assert_eq!(raw(addr, "POST", "/api/state", &host).await.0, 415);
    let policy = serde_json::json!({ "kind": "capability", "name": "text.translate", "spec": {} });
    let (status, _, body) = crate::dashboard_auth::post_json(addr, "/api/policies", None, &policy).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--admin-token-file"), "{body}");
    let (status, _, body) = raw(addr, "GET", "/api/state?tenant=Bad%2Fname", &host).await;
    assert_eq!(status, 400);
    assert!(body.contains("tenant"), "{body}");
    assert_eq!(raw(addr, "GET", "/nope", &host).await.0, 404);

    let (status, _, body) = raw(addr, "GET", "/api/search?q=text.tranlsate", &host).await;
    assert_eq!(status, 200);
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(found["suggestions"], serde_json::json!(["text.translate"]));
    assert_eq!(found["capabilities"], serde_json::json!([]));

    let (status, _, body) = raw(addr, "GET", "/api/state", &host).await;
    assert_eq!(status, 200);
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["instances"][0]["instance_id"], Value::String(agent.instance_id()));
    assert_eq!(state["agents"][0]["agent"], "translator");

    // The event stream starts with the whole state, its revision as the event id.
    let (status, head, body) = raw(addr, "GET", "/api/events", &host).await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let event = body.split("\n\n").find(|e| e.contains("event: state")).expect("a state event");
    let revision = state["revision"].as_i64().unwrap();
    assert!(event.contains(&format!("id: {revision}\n")), "{event}");
    assert!(event.contains(&agent.instance_id()), "{event}");
}
