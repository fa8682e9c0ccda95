//! Observability end to end: spans of a three-agent chain exported over OTLP to a real
//! OTLP/gRPC receiver, metrics scraped from the admin port (traffic, and the sizes of the
//! maps that grow with input), health and readiness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::policy::{PolicySpec, RateLimit, Strategy};
use agent_reach::{Agent, Client, HandlerError, Reply};
use agent_reach_e2e::{
    Backend, TestStore, capability_policy, echo_agent, init_logging, listener, put_policy, secure, sidecar_config,
    start_control, wait_for_instances,
};
use agent_reach_sidecar::Sidecar;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// An OTLP/gRPC trace receiver that keeps what it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.instance.id")
                .and_then(|kv| kv.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| match &v.value {
        Some(Value::StringValue(s)) => Some(s.clone()),
        Some(Value::IntValue(i)) => Some(i.to_string()),
        Some(Value::BoolValue(b)) => Some(b.to_string()),
        _ => None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_three_agents_is_one_trace_with_the_retry_as_its_own_span() {
    init_logging();
    let receiver = Receiver::default();
    let otlp = listener().await;
    let otlp_addr = otlp.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(otlp)),
    );
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let sidecar = |id: &str| {
        let mut c = sidecar_config(&control.endpoint(), id);
        c.otlp_endpoint = Some(format!("http://{otlp_addr}"));
        c.trace_sample_ratio = 0.0;
        c
    };
    let a = Sidecar::start(secure::sidecar_identity(sidecar("sc-a")).await, listener().await, listener().await)
        .await
        .unwrap();
    let b = Sidecar::start(secure::sidecar_identity(sidecar("sc-b")).await, listener().await, listener().await)
        .await
        .unwrap();
    let c = Sidecar::start(secure::sidecar_identity(sidecar("sc-c")).await, listener().await, listener().await)
        .await
        .unwrap();

    // Agent B calls on as itself (its own client presents its credential): set once started.
    let mesh_b: Arc<std::sync::OnceLock<Client>> = Arc::default();
    let own_client = mesh_b.clone();
    let agent_b = Agent::builder("agent-b")
        .version("2.1")
        .sidecar(b.local_addr().to_string())
        .handle("step.b", move |call| {
            let mesh = own_client.get().cloned();
            async move {
                let mesh = mesh.ok_or_else(|| HandlerError::unavailable("not started yet"))?;
                let reply = mesh.invoke("step.c").within(&call).payload(call.payload().clone()).send().await?;
                Ok(Reply::text(format!("b({})", reply.text())))
            }
        })
        .start()
        .await
        .unwrap();
    let _ = mesh_b.set(agent_b.client());
    let c1 = echo_agent(c.local_addr(), "agent-c", &[("step.c", &[])]).await;
    let c2 = echo_agent(c.local_addr(), "agent-c", &[("step.c", &[])]).await;
    let ids = [agent_b.instance_id(), c1.instance_id(), c2.instance_id()];
    for sc in [&a, &b, &c] {
        wait_for_instances(sc, &ids).await;
    }
    put_policy(
        &ts.store,
        &[&a, &b, &c],
        capability_policy("step.c", PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() }),
    )
    .await;
    // Round-robin starts with the smallest instance id: kill that one, so the first attempt
    // to step.c is not delivered and is retried on the other.
    let (dead, alive) = if c1.instance_id() < c2.instance_id() { (c1, c2) } else { (c2, c1) };
    let (dead_id, alive_id) = (dead.instance_id(), alive.instance_id());
    dead.abort();

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let reply = client.invoke("step.b").text("hi").force_trace().send().await.unwrap();
    assert_eq!(reply.text(), format!("b(agent-c@{alive_id}:hi)"));

    for sc in [&a, &b, &c] {
        sc.tracing().flush();
    }
    let spans = {
        let t0 = std::time::Instant::now();
        loop {
            let spans = receiver.spans.lock().unwrap().clone();
            if spans.len() >= 7 || t0.elapsed() > Duration::from_secs(10) {
                break spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let names: Vec<String> = spans.iter().map(|(_, s)| s.name.clone()).collect();
    let trace_ids: std::collections::BTreeSet<String> = spans.iter().map(|(_, s)| hex(&s.trace_id)).collect();
    assert_eq!(trace_ids.len(), 1, "one trace id across every hop: {names:?}");
    let by_id: HashMap<String, &Span> = spans.iter().map(|(_, s)| (hex(&s.span_id), s)).collect();
    let find = |name: &str, pred: &dyn Fn(&Span) -> bool| -> &Span {
        spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| s.name == name && pred(s))
            .unwrap_or_else(|| panic!("no span {name:?} in {names:?}"))
    };
    let parent = |s: &Span| by_id.get(&hex(&s.parent_span_id)).copied();

    let invoke_b = find("invoke capability step.b", &|_| true);
    assert!(invoke_b.parent_span_id.is_empty(), "the entry hop starts the trace");
    assert_eq!(attr(invoke_b, "agent_reach.outcome").as_deref(), Some("OK"));
    assert_eq!(attr(invoke_b, "agent_reach.tenant").as_deref(), Some("default"));
    let attempt_b = find("attempt capability step.b", &|_| true);
    assert_eq!(parent(attempt_b).map(|p| p.name.as_str()), Some("invoke capability step.b"));
    assert_eq!(attr(attempt_b, "agent_reach.instance"), Some(agent_b.instance_id()));
    assert_eq!(attr(attempt_b, "agent_reach.agent_version").as_deref(), Some("2.1"));
    assert_eq!(attr(attempt_b, "agent_reach.attempt").as_deref(), Some("1"));
    assert_eq!(attr(attempt_b, "agent_reach.priority").as_deref(), Some("NORMAL"));
    let deliver_b = find("deliver agent-b", &|_| true);
    assert_eq!(parent(deliver_b).map(|p| p.span_id.clone()), Some(attempt_b.span_id.clone()));
    // Agent B's own call continues the trace from the span its sidecar handed it.
    let invoke_c = find("invoke capability step.c", &|_| true);
    assert_eq!(parent(invoke_c).map(|p| p.span_id.clone()), Some(deliver_b.span_id.clone()));
    assert_eq!(attr(invoke_c, "agent_reach.caller").as_deref(), Some("agent-b"));
    let first = find("attempt capability step.c", &|s| attr(s, "agent_reach.attempt").as_deref() == Some("1"));
    let retry = find("attempt capability step.c", &|s| attr(s, "agent_reach.attempt").as_deref() == Some("2"));
    assert_eq!(attr(first, "agent_reach.instance"), Some(dead_id.clone()));
    assert!(
        attr(first, "agent_reach.outcome").unwrap().starts_with("NOT_DELIVERED"),
        "{:?}",
        attr(first, "agent_reach.outcome")
    );
    assert_eq!(attr(retry, "agent_reach.instance"), Some(alive_id.clone()));
    assert_eq!(attr(retry, "agent_reach.outcome").as_deref(), Some("ANSWERED"));
    for attempt in [first, retry] {
        assert_eq!(parent(attempt).map(|p| p.span_id.clone()), Some(invoke_c.span_id.clone()));
    }
    let deliver_c = find("deliver agent-c", &|s| attr(s, "agent_reach.instance") == Some(alive_id.clone()));
    assert_eq!(parent(deliver_c).map(|p| p.span_id.clone()), Some(retry.span_id.clone()));

    // OpenTelemetry semantic conventions, besides the agent_reach.* attributes.
    let conventions = |s: &Span| -> Vec<Option<String>> {
        ["rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code", "gen_ai.operation.name"]
            .iter()
            .map(|k| attr(s, k))
            .collect()
    };
    let some = |v: &[&str]| v.iter().map(|s| Some(s.to_string())).collect::<Vec<_>>();
    assert_eq!(conventions(invoke_b), some(&["grpc", "agentreach.v1.Sidecar", "Invoke", "0", "invoke_agent"]));
    assert_eq!(conventions(attempt_b), some(&["grpc", "agentreach.v1.Mesh", "Deliver", "0", "invoke_agent"]));
    assert_eq!(conventions(deliver_b), some(&["grpc", "agentreach.v1.Mesh", "Deliver", "0", "invoke_agent"]));
    for span in [invoke_b, attempt_b, deliver_b] {
        assert_eq!(attr(span, "gen_ai.agent.name").as_deref(), Some("agent-b"), "{}", span.name);
        assert_eq!(attr(span, "gen_ai.agent.id"), Some(agent_b.instance_id()), "{}", span.name);
    }
    // A client span names the sidecar it called.
    assert_eq!(attr(attempt_b, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(attr(attempt_b, "server.port"), Some(b.mesh_addr().port().to_string()));
    // The attempt that never reached the dead instance failed UNAVAILABLE (14); its retry
    // and the call as a whole succeeded.
    assert_eq!(attr(first, "rpc.grpc.status_code").as_deref(), Some("14"));
    assert_eq!(attr(first, "gen_ai.agent.id"), Some(dead_id.clone()));
    assert_eq!(attr(retry, "rpc.grpc.status_code").as_deref(), Some("0"));
    assert_eq!(attr(invoke_c, "gen_ai.agent.id"), Some(alive_id.clone()));

    agent_b.abort();
    alive.abort();
    for sc in [a, b, c] {
        sc.stop().await;
    }
    control.shutdown().await;
    server.abort();
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let status = out[9..12].parse().unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    // The admin server answers small bodies with a content length (no chunking).
    assert!(head.to_ascii_lowercase().contains("content-length"), "{head}");
    (status, body.to_string())
}

/// The value of the gauge `name{map=...}` on the sidecar's /metrics at `admin`.
async fn bounded(admin: std::net::SocketAddr, name: &str, map: &str) -> f64 {
    let (status, text) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid");
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && s.labels.get("map") == Some(map))
        .unwrap_or_else(|| panic!("no {name}{{map=\"{map}\"}} in\n{text}"));
    match sample.value {
        prometheus_parse::Value::Gauge(v) => v,
        ref other => panic!("{name}{{map=\"{map}\"}} is not a gauge: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_size_of_every_bounded_map() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let admin = listener().await;
    let admin_addr = admin.local_addr().unwrap();
    let sc = Sidecar::start_with_admin(
        secure::sidecar_identity(sidecar_config(&control.endpoint(), "bounded")).await,
        listener().await,
        listener().await,
        Some(admin),
    )
    .await
    .unwrap();
    let entries = |map: &'static str| bounded(admin_addr, "agent_reach_bounded_entries", map);
    let bytes = |map: &'static str| bounded(admin_addr, "agent_reach_bounded_bytes", map);
    let target = echo_agent(sc.local_addr(), "store", &[("echo", &[]), ("lookup", &[])]).await;
    let callers = [
        echo_agent(sc.local_addr(), "caller-0", &[("noop", &[])]).await,
        echo_agent(sc.local_addr(), "caller-1", &[("noop", &[])]).await,
        echo_agent(sc.local_addr(), "caller-2", &[("noop", &[])]).await,
    ];
    let mut ids = vec![target.instance_id()];
    ids.extend(callers.iter().map(|c| c.instance_id()));
    wait_for_instances(&sc, &ids).await;
    let limit = PolicySpec { rate_limit: Some(RateLimit { per_second: 100.0, burst: 100 }), ..Default::default() };
    put_policy(&ts.store, &[&sc], capability_policy("echo", limit)).await;
    let cached = PolicySpec { read_only: true, cache_ttl_ms: 60_000, ..Default::default() };
    put_policy(&ts.store, &[&sc], capability_policy("lookup", cached)).await;
    for map in ["rate_buckets", "admission_gates", "pool_slots", "result_cache", "idempotency"] {
        assert_eq!(entries(map).await, 0.0, "{map} before any call");
    }
    for map in ["result_cache", "idempotency"] {
        assert_eq!(bytes(map).await, 0.0, "{map} before any call");
    }

    // One bucket per verified caller of the rate-limited target; a second call from the
    // same caller reuses its bucket.
    for caller in &callers {
        caller.client().invoke("echo").text("x").send().await.unwrap();
    }
    callers[0].client().invoke("echo").text("x").send().await.unwrap();
    assert_eq!(entries("rate_buckets").await, 3.0);
    // One local instance received calls: one admission gate, one pooled connection to it.
    assert_eq!(entries("admission_gates").await, 1.0);
    assert_eq!(entries("pool_slots").await, 1.0);

    // One cache entry per distinct payload, whatever the repeats; payloads and answers of
    // the same length take the same bytes, so twice the keys hold twice the bytes.
    let client = callers[0].client();
    for key in ["k0", "k1", "k0", "k1", "k0"] {
        client.invoke("lookup").text(key).send().await.unwrap();
    }
    assert_eq!(entries("result_cache").await, 2.0);
    let two = bytes("result_cache").await;
    assert!(two > 0.0);
    for key in ["k2", "k3", "k2"] {
        client.invoke("lookup").text(key).send().await.unwrap();
    }
    assert_eq!(entries("result_cache").await, 4.0);
    assert_eq!(bytes("result_cache").await, 2.0 * two);
    assert_eq!(target.handled(), 4 + 4, "four echo calls and four distinct lookups reached the agent");

    // One idempotency key per distinct key; duplicates are replayed, not stored again (to a
    // capability that is not cached, so every call reaches the target's inbound stack).
    for key in ["key-0", "key-1", "key-0"] {
        client.invoke("echo").idempotency_key(key).text("same").send().await.unwrap();
    }
    assert_eq!(entries("idempotency").await, 2.0);
    let two = bytes("idempotency").await;
    assert!(two > 0.0);
    for key in ["key-2", "key-3", "key-3"] {
        client.invoke("echo").idempotency_key(key).text("same").send().await.unwrap();
    }
    assert_eq!(entries("idempotency").await, 4.0);
    assert_eq!(bytes("idempotency").await, 2.0 * two);
    assert_eq!(target.handled(), 8 + 4, "the duplicate keys were replayed");
    assert_eq!(entries("rate_buckets").await, 3.0, "lookup has no rate limit; caller-0 keeps its bucket");

    target.abort();
    for c in callers {
        c.abort();
    }
    sc.stop().await;
    control.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_known_traffic_exactly_and_parse_as_prometheus_text() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let (admin_a, admin_b) = (listener().await, listener().await);
    let (admin_a_addr, admin_b_addr) = (admin_a.local_addr().unwrap(), admin_b.local_addr().unwrap());
    let a = Sidecar::start_with_admin(
        secure::sidecar_identity(sidecar_config(&control.endpoint(), "sc-a")).await,
        listener().await,
        listener().await,
        Some(admin_a),
    )
    .await
    .unwrap();
    let b = Sidecar::start_with_admin(
        secure::sidecar_identity(sidecar_config(&control.endpoint(), "sc-b")).await,
        listener().await,
        listener().await,
        Some(admin_b),
    )
    .await
    .unwrap();
    let planner = echo_agent(a.local_addr(), "planner", &[("plan", &[])]).await;
    let worker = Agent::builder("worker")
        .sidecar(b.local_addr().to_string())
        .handle("work", |call| async move {
            if call.text()? == "bad" {
                return Err(HandlerError::invalid_argument("bad input"));
            }
            Ok(Reply::text("done"))
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[planner.instance_id(), worker.instance_id()]).await;
    let client = planner.client();
    for _ in 0..5 {
        client.invoke("work").text("ok").send().await.unwrap();
    }
    for _ in 0..2 {
        client.invoke("no.such.capability").text("x").send().await.unwrap_err();
    }
    client.invoke("work").text("bad").send().await.unwrap_err();

    let (status, text) = http_get(admin_a_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text");
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape.samples.iter().find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))).map(
            |s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            },
        )
    };
    let worker_id = worker.instance_id();
    assert_eq!(
        value(
            "agent_reach_calls_total",
            &[("caller", "planner"), ("target", "capability work"), ("instance", &worker_id), ("outcome", "OK")]
        ),
        Some(5.0)
    );
    assert_eq!(
        value(
            "agent_reach_calls_total",
            &[("caller", "planner"), ("target", "(unknown)"), ("instance", "(none)"), ("outcome", "AGENT_NOT_FOUND")]
        ),
        Some(2.0),
        "unknown targets share one label value"
    );
    assert_eq!(
        value(
            "agent_reach_calls_total",
            &[("caller", "planner"), ("target", "capability work"), ("outcome", "CODE_INVALIDARGUMENT")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value("agent_reach_call_duration_seconds_count", &[("target", "capability work"), ("outcome", "OK")]),
        Some(5.0)
    );
    assert_eq!(value("agent_reach_hop_duration_seconds_count", &[("hop", "outbound")]), Some(6.0));
    assert_eq!(value("agent_reach_table_instances", &[]), Some(2.0));
    assert_eq!(value("agent_reach_watch_connected", &[]), Some(1.0));
    assert_eq!(value("agent_reach_rejections_total", &[("mechanism", "rate_limit")]), Some(0.0));

    let (_, text_b) = http_get(admin_b_addr, "/metrics").await;
    let scrape_b = prometheus_parse::Scrape::parse(text_b.lines().map(|l| Ok(l.to_string()))).expect("valid");
    let count = |name: &str, label: Option<(&str, &str)>| {
        scrape_b.samples.iter().find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v))).map(
            |s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            },
        )
    };
    assert_eq!(count("agent_reach_hop_duration_seconds_count", Some(("hop", "inbound"))), Some(6.0));
    assert_eq!(count("agent_reach_queue_duration_seconds_count", None), Some(6.0), "every delivery passed admission");

    assert_eq!(http_get(admin_a_addr, "/healthz").await, (200, "ok\n".into()));
    let (status, body) = http_get(admin_a_addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready: watching control"), "{body}");
    control.shutdown().await;
    a.wait_for_table(Duration::from_secs(5), |_| !a.watch_stats().connected.load(std::sync::atomic::Ordering::Relaxed))
        .await
        .unwrap();
    let (status, body) = http_get(admin_a_addr, "/readyz").await;
    assert_eq!(status, 200, "a fresh table keeps the sidecar ready without control: {body}");
    assert!(body.starts_with("ready: control unreachable; routing from a table"), "{body}");

    // A sidecar that never reached control has no table: not ready, and says why.
    let lonely_admin = listener().await;
    let lonely_addr = lonely_admin.local_addr().unwrap();
    let lonely = Sidecar::start_with_admin(
        sidecar_config("http://127.0.0.1:9", "sc-lonely"),
        listener().await,
        listener().await,
        Some(lonely_admin),
    )
    .await
    .unwrap();
    let (status, body) = http_get(lonely_addr, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: no routing table yet (control not reached, nothing saved)\n")
    );
    planner.abort();
    worker.abort();
    for sc in [a, b, lonely] {
        sc.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_service_counts_registrations_and_writes_and_reports_readiness() {
    init_logging();
    let mut ts = TestStore::start(Backend::Etcd).await;
    let admin = listener().await;
    let admin_addr = admin.local_addr().unwrap();
    let control = agent_reach_control::ControlHandle::spawn_with_admin(
        ts.store.clone(),
        agent_reach_control::ControlConfig { lease_ttl: Duration::from_secs(15), ..Default::default() },
        listener().await,
        admin,
    )
    .unwrap();
    let a = agent_reach_e2e::start_sidecar(sidecar_config(&control.endpoint(), "sc-a")).await;
    let b = agent_reach_e2e::start_sidecar(sidecar_config(&control.endpoint(), "sc-b")).await;
    let agents = vec![
        echo_agent(a.local_addr(), "one", &[("x", &[])]).await,
        echo_agent(b.local_addr(), "two", &[("y", &[])]).await,
        echo_agent(b.local_addr(), "three", &[("z", &[])]).await,
    ];
    let ids: Vec<String> = agents.iter().map(|x| x.instance_id()).collect();
    wait_for_instances(&a, &ids).await;
    // Let a few renewal rounds pass (heartbeats every 200 ms in these sidecars).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (status, text) = http_get(admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text");
    let value = |name: &str| {
        scrape.samples.iter().find(|s| s.metric == name).map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
    };
    assert_eq!(value("agent_reach_control_registrations_total"), Some(3.0));
    assert_eq!(value("agent_reach_control_watch_streams"), Some(2.0), "two sidecars watch");
    assert_eq!(value("agent_reach_control_tenant_feeds"), Some(1.0), "one store watch for the tenant");
    assert_eq!(value("agent_reach_control_snapshots_sent_total"), Some(2.0), "one snapshot per sidecar");
    let writes = value("agent_reach_control_store_writes_total").unwrap();
    assert!(writes >= 3.0, "at least the three registrations were written: {writes}");
    // Steady heartbeats with unchanged state and load do not become store writes.
    let writes_then = writes;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, text) = http_get(admin_addr, "/metrics").await;
    let later = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let later_value = |name: &str| {
        later.samples.iter().find(|s| s.metric == name).map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
    };
    assert_eq!(
        later_value("agent_reach_control_store_writes_total"),
        Some(writes_then),
        "no writes for steady heartbeats"
    );

    assert_eq!(http_get(admin_addr, "/healthz").await, (200, "ok\n".into()));
    let (status, body) = http_get(admin_addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready: etcd store at revision"), "{body}");
    ts.etcd.as_mut().unwrap().kill();
    let t0 = std::time::Instant::now();
    loop {
        let (status, body) = http_get(admin_addr, "/readyz").await;
        if status == 503 {
            assert!(body.starts_with("not ready: etcd store"), "{body}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "still ready 10 s after etcd died: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for agent in agents {
        agent.abort();
    }
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
