//! An agent without gRPC: it registers with transport HTTP and answers JSON POSTs.

use std::convert::Infallible;
use std::time::Duration;

use agent_reach::Client;
use agent_reach::model::{Transport, fixture};
use agent_reach::proto;
use agent_reach_e2e::{
    Backend, TestStore, init_logging, sidecar_config, start_control, start_sidecar, wait_for_instances,
};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tonic::Code;

/// A plain HTTP/1.1 agent: POST /invoke answers JSON (NDJSON when asked to stream),
/// GET /healthz answers 200.
async fn serve_http_agent(listener: tokio::net::TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else { return };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                let path = req.uri().path().to_string();
                let deadline = req.headers().get("x-agent-reach-deadline-ms").is_some();
                let header =
                    |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("-").to_string();
                let verified_header = format!(
                    "{}/{}@{}",
                    header("x-agent-reach-caller-agent"),
                    header("x-agent-reach-caller-instance"),
                    header("x-agent-reach-caller-tenant")
                );
                let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                let resp = match path.as_str() {
                    "/healthz" => Response::new(Full::new(Bytes::from_static(b"ok"))),
                    "/invoke" => {
                        let call: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let text = call["text"].as_str().unwrap_or_default().to_string();
                        if text == "fail" {
                            let mut r = Response::new(Full::new(Bytes::from_static(br#"{"error":"no such order"}"#)));
                            *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                            r
                        } else if text == "leak" {
                            // Not an agent's error: a page whose content must not reach callers.
                            let page = Bytes::from_static(b"<html>internal page: token=s3cr3t</html>");
                            let mut r = Response::new(Full::new(page));
                            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                            r
                        } else if call["stream"].as_bool() == Some(true) {
                            let lines: String = (1..=3).map(|i| format!("{{\"text\":\"{text}-{i}\"}}\n")).collect();
                            Response::new(Full::new(Bytes::from(lines)))
                        } else {
                            let verified = &call["verified_caller"];
                            let verified_json = format!(
                                "{}/{}@{}",
                                verified["agent"].as_str().unwrap_or("-"),
                                verified["instance_id"].as_str().unwrap_or("-"),
                                verified["tenant"].as_str().unwrap_or("-")
                            );
                            let answer = serde_json::json!({
                                "text": format!("{} via {} for {} (deadline header: {deadline})",
                                    text.to_uppercase(), call["capability"].as_str().unwrap_or_default(),
                                    call["caller"]["agent"].as_str().unwrap_or("?")),
                                "metadata": {
                                    "attempt": call["attempt"].to_string(),
                                    "verified": format!("json {verified_json}, headers {verified_header}"),
                                },
                            });
                            Response::new(Full::new(Bytes::from(answer.to_string())))
                        }
                    }
                    _ => {
                        let mut r = Response::new(Full::new(Bytes::new()));
                        *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                        r
                    }
                };
                Ok::<_, Infallible>(resp)
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_agents_join_the_mesh() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/invoke", http.local_addr().unwrap());
    tokio::spawn(serve_http_agent(http));

    let sidecar_b = Client::connect(&b.local_addr().to_string()).await.unwrap();
    let reply = sidecar_b
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(
                fixture::registration("orders")
                    .version("0.1")
                    .capability("orders.lookup", &[])
                    .endpoint(&endpoint)
                    .transport(Transport::Http)
                    .proto_registration(),
            ),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let instance = reply.instance_id.clone();
    // The agent heartbeats (here the test does it for the plain HTTP server).
    let mut raw = sidecar_b.raw();
    let hb_instance = instance.clone();
    let heartbeats = tokio::spawn(async move {
        loop {
            let _ =
                raw.heartbeat(proto::HeartbeatRequest { instance_id: hb_instance.clone(), ..Default::default() }).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    wait_for_instances(&a, std::slice::from_ref(&instance)).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap().with_caller("planner", "planner-1");
    let reply = client.invoke("orders.lookup").text("order 42").send().await.unwrap();
    assert_eq!(reply.text(), "ORDER 42 via orders.lookup for planner (deadline header: true)");
    assert_eq!(reply.instance(), instance);
    assert_eq!(reply.metadata()["attempt"], "1");
    // The caller named itself planner: that is not who the mesh verified, and headers the
    // client wrote never reach the agent.
    assert_eq!(reply.metadata()["verified"], "json -/-@-, headers -/-@-");
    let mut forged = tonic::Request::new(proto::InvokeRequest {
        target: Some(agent_reach::model::Target::capability("orders.lookup").into()),
        payload: "x".into(),
        ..Default::default()
    });
    for (name, value) in [
        ("x-agent-reach-caller-agent", "planner"),
        ("x-agent-reach-caller-instance", "planner-1"),
        ("x-agent-reach-caller-tenant", "team-x"),
    ] {
        forged.metadata_mut().insert(name, value.parse().unwrap());
    }
    let reply = client.raw().invoke(forged).await.unwrap().into_inner();
    assert_eq!(reply.metadata["verified"], "json -/-@-, headers -/-@-", "forged caller headers are not forwarded");
    // A registered agent's call: its sidecar verified it and vouched for it over mTLS.
    let planner = agent_reach_e2e::echo_agent(a.local_addr(), "planner", &[("plan", &[])]).await;
    let reply = planner.client().invoke("orders.lookup").text("x").send().await.unwrap();
    // The tenant is the calling sidecar's, from its certificate.
    let who = format!("planner/{}@default", planner.instance_id());
    assert_eq!(reply.metadata()["verified"], format!("json {who}, headers {who}"));
    // A sidecar of the tenant that writes another tenant into the message's own `tenant`
    // field (the JSON's "tenant") is refused before the agent is called; a true one is not.
    let now = std::time::SystemTime::now();
    let liar = crate::identity::made_configs(
        control.ca(),
        &agent_reach_identity::WorkloadId::new(agent_reach_identity::DEFAULT_TRUST_DOMAIN, "default", "liar").uri(),
        now,
        now + Duration::from_secs(3600),
        control.ca().bundle_pem(),
    );
    let deliver = |tenant_field: &str| {
        let channel = agent_reach_sidecar::identity::TlsConnector::fixed(liar.client())
            .channel(&format!("http://{}", b.mesh_addr()))
            .unwrap();
        let mut request = tonic::Request::new(proto::HandleRequest {
            capability: "orders.lookup".into(),
            instance_id: instance.clone(),
            payload: "x".into(),
            tenant: tenant_field.into(),
            ..Default::default()
        });
        request.metadata_mut().insert("ar-tenant", "default".parse().unwrap());
        request.metadata_mut().insert("ar-instance", instance.parse().unwrap());
        async move { proto::mesh_client::MeshClient::new(channel).deliver(request).await }
    };
    let status = deliver("team-x").await.expect_err("a tenant field naming another tenant");
    let info = agent_reach::reason::error_info(&status).unwrap();
    assert_eq!(
        (status.code(), info.reason.as_str(), info.metadata["field"].as_str(), info.metadata["claimed"].as_str()),
        (Code::PermissionDenied, "TENANT_MISMATCH", "tenant", "team-x")
    );
    let reply = deliver("default").await.expect("a true tenant field").into_inner();
    assert!(String::from_utf8_lossy(&reply.payload).starts_with("X via orders.lookup"), "{reply:?}");

    let chunks: Vec<String> = client
        .invoke("orders.lookup")
        .text("s")
        .send_stream()
        .await
        .unwrap()
        .map(|c| String::from_utf8(c.unwrap().payload.to_vec()).unwrap())
        .collect()
        .await;
    assert_eq!(chunks, ["s-1", "s-2", "s-3"]);

    let err = client.invoke("orders.lookup").text("fail").send().await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("no such order"), "{err}");
    // A body that is not {"error": …} JSON is never passed on (server-side request forgery).
    let err = client.invoke("orders.lookup").text("leak").send().await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(!err.message().contains("s3cr3t") && err.message().contains("not shown"), "{err}");

    // Its health is probed over HTTP: it stays UP across several probe rounds.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let table = a.table();
    assert_eq!(table.instances[&instance].instance.record.state, agent_reach::model::HealthState::Up);
    heartbeats.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// An HTTP agent's endpoint must be loopback unless the sidecar's allow-list names its
/// host: the sidecar would otherwise reach any machine on a local client's say-so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_endpoints_are_loopback_unless_allowed() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let mut allowing = sidecar_config(&control.endpoint(), "host-b");
    allowing.http_agent_allowed_hosts = vec!["10.20.30.40".into()];
    let b = start_sidecar(allowing).await;
    let register = |endpoint: &str| proto::RegisterRequest {
        registration: Some(proto::AgentRegistration {
            agent: "orders".into(),
            capabilities: vec![proto::Capability { name: "orders.lookup".into(), tags: vec![] }],
            endpoint: endpoint.into(),
            transport: proto::Transport::Http as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut on_a = Client::connect(&a.local_addr().to_string()).await.unwrap().raw();
    for (endpoint, host) in [
        ("http://10.20.30.40:8080/invoke", "10.20.30.40"),
        ("http://169.254.169.254:80/latest", "169.254.169.254"),
        ("http://example.com:80/", "example.com"),
        ("http://[fe80::1]:80/", "fe80::1"),
    ] {
        let err = on_a.register(register(endpoint)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{endpoint}: {err:?}");
        let info = agent_reach::reason::error_info(&err).unwrap();
        assert_eq!(info.reason, "INVALID_ARGUMENT");
        assert_eq!(info.metadata["field"], "registration.endpoint");
        assert_eq!(
            err.message(),
            format!(
                "invalid registration.endpoint: host {host:?} is not loopback; an HTTP agent must listen on this host unless --http-agent-allowed-hosts lists it"
            )
        );
    }
    assert_eq!(a.local_instances(), 0, "nothing refused was registered");
    // Loopback is always allowed.
    for endpoint in ["http://127.0.0.1:9/invoke", "http://localhost:9/invoke", "http://[::1]:9/invoke"] {
        let reply = on_a.register(register(endpoint)).await.unwrap().into_inner();
        on_a.deregister(proto::DeregisterRequest { instance_id: reply.instance_id }).await.unwrap();
    }
    // The allow-list admits the hosts it names, and only those.
    let mut on_b = Client::connect(&b.local_addr().to_string()).await.unwrap().raw();
    let reply = on_b.register(register("http://10.20.30.40:8080/invoke")).await.unwrap().into_inner();
    assert!(!reply.instance_id.is_empty());
    let err = on_b.register(register("http://10.20.30.41:8080/invoke")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}
