//! Bad input gets a clear error with a reason, and nothing is forwarded.

use std::time::Duration;

use agent_reach::proto;
use agent_reach::reason::error_info;
use agent_reach::{Agent, Client, Reply};
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, listener, registration, sidecar_config, start_control,
    start_control_on_plaintext, start_sidecar, wait_for_instances,
};
use tonic::Code;

fn assert_invalid(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let info = error_info(status).expect("error info");
    assert_eq!(info.reason, "INVALID_ARGUMENT");
    assert_eq!(info.metadata["field"], field, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_name_the_field() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let agent = echo_agent(a.local_addr(), "summarizer", &[("text.summarize", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let mut raw = client.raw();

    let request = |agent: &str, capability: &str| proto::RegisterRequest {
        registration: Some(registration(agent, "", capability, &[])),
        ..Default::default()
    };
    let err = raw.register(request("", "text.summarize")).await.unwrap_err();
    assert_invalid(&err, "registration.agent");
    let err = raw.register(request("summarizer", "")).await.unwrap_err();
    assert_invalid(&err, "registration.capabilities[0].name");
    let err = raw.register(proto::RegisterRequest { registration: None, ..Default::default() }).await.unwrap_err();
    assert_invalid(&err, "registration");

    let err = client.invoke("").text("x").send().await.unwrap_err();
    assert_invalid(err.status(), "target.capability");
    let err = client.invoke_agent("").text("x").send().await.unwrap_err();
    assert_invalid(err.status(), "target.agent");
    let err = raw.invoke(proto::InvokeRequest::default()).await.unwrap_err();
    assert_invalid(&err, "target");

    let err = raw
        .heartbeat(proto::HeartbeatRequest { instance_id: "nobody-1".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(error_info(&err).unwrap().reason, "INSTANCE_NOT_FOUND");

    // Unknown capability: NOT_FOUND with the closest names as suggestions.
    let err = client.invoke("text.summarise").text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"));
    assert_eq!(err.suggestions(), ["text.summarize"]);
    assert!(err.message().contains("did you mean text.summarize"), "{err}");

    assert_eq!(agent.handled(), 0, "no bad request may reach the agent");
    agent.shutdown().await;
    a.shutdown().await;
    control.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_payloads_are_refused_before_forwarding() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let mut small = sidecar_config(&control.endpoint(), "host-small");
    small.max_payload_bytes = 1024;
    let s = start_sidecar(small).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "sink", &[("sink", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    wait_for_instances(&s, &[agent.instance_id()]).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    // The default limit is 4 MiB: one byte over is refused, by payload size...
    let err = client.invoke("sink").payload(vec![b'x'; 4 * 1024 * 1024 + 1]).send().await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.reason(), Some("PAYLOAD_TOO_LARGE"));
    assert_eq!(err.detail("limit"), Some("4194304"));
    // ...and far over, by the length prefix, before the body is read.
    let err = client.invoke("sink").payload(vec![b'x'; 6 * 1024 * 1024]).send().await.unwrap_err();
    assert_eq!(err.reason(), Some("PAYLOAD_TOO_LARGE"));
    // The limit is configurable.
    let small_client = Client::connect(&s.local_addr().to_string()).await.unwrap();
    let err = small_client.invoke("sink").payload(vec![b'x'; 1025]).send().await.unwrap_err();
    assert_eq!(err.reason(), Some("PAYLOAD_TOO_LARGE"));
    assert_eq!(err.detail("limit"), Some("1024"));
    assert_eq!(agent.handled(), 0, "nothing oversized was forwarded");

    // At the limit the call goes through.
    let reply = small_client.invoke("sink").payload(vec![b'y'; 1024]).send().await.unwrap();
    assert!(reply.text().ends_with(&"y".repeat(1024)));
    assert_eq!(agent.handled(), 1);

    agent.shutdown().await;
    for sc in [a, s, b] {
        sc.shutdown().await;
    }
    control.shutdown().await;
}

/// A sidecar starts without control, refuses registrations with CONTROL_UNAVAILABLE, and
/// recovers when control comes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_down_at_sidecar_start() {
    init_logging();
    let reserved = listener().await;
    let control_addr = reserved.local_addr().unwrap();
    drop(reserved);
    let a = start_sidecar(sidecar_config(&format!("http://{control_addr}"), "host-a")).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let err = client
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(registration("echo", "", "echo", &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(error_info(&err).unwrap().reason, "CONTROL_UNAVAILABLE");
    assert_eq!(a.local_instances(), 0);

    // An SDK agent keeps retrying; it registers once control is up.
    let sidecar = a.local_addr().to_string();
    let starting = tokio::spawn(async move {
        Agent::builder("echo")
            .sidecar(sidecar)
            .handle("echo", |call| async move { Ok(Reply::bytes(call.payload().clone())) })
            .start()
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!starting.is_finished(), "the agent cannot have registered while control is down");

    let ts = TestStore::start(Backend::Embedded).await;
    let bound = tokio::net::TcpListener::bind(control_addr).await.expect("rebind the control port");
    // Explicit plaintext: the sidecar started while control was down for the first time,
    // so it has no certificate (one with identity needs control, or a certificate saved by
    // an earlier run, see `offline_start.rs`).
    let control = start_control_on_plaintext(ts.store.clone(), Duration::from_secs(15), bound);
    let agent =
        tokio::time::timeout(Duration::from_secs(15), starting).await.expect("registered in time").unwrap().unwrap();
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let reply = client.invoke("echo").payload("ping").send().await.unwrap();
    assert_eq!(reply.payload().as_ref(), b"ping");
    assert_eq!(reply.instance(), agent.instance_id());

    agent.shutdown().await;
    a.shutdown().await;
    control.shutdown().await;
}

/// What an error quotes of the input is a short prefix: the whole status, message and
/// details (ErrorInfo, RetryInfo, BadRequest), fits in 1 KiB.
fn assert_short(status: &tonic::Status, what: &str) {
    assert!(status.message().len() <= 1024, "{what}: message of {} bytes", status.message().len());
    assert!(status.details().len() <= 1024, "{what}: details of {} bytes", status.details().len());
    assert!(error_info(status).is_some(), "{what}: no reason in {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_quote_a_short_prefix_of_hostile_input() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let agent = echo_agent(a.local_addr(), "summarizer", &[("text.summarize", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();

    // A target with 1,000 tags: refused (32 at most), naming the field.
    let tags: Vec<String> = (0..1000).map(|i| format!("tag-number-{i:04}")).collect();
    let err = client.invoke("text.summarize").tags(tags.clone()).text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert_eq!(err.reason(), Some("INVALID_ARGUMENT"));
    assert_short(err.status(), "1,000 tags");
    assert!(err.message().contains("1000 tags; at most 32 are allowed"), "{err}");
    // 30 tags are allowed: no instance has them; the message names a few.
    let err = client.invoke("text.summarize").tags(tags[..30].to_vec()).text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert_eq!(err.reason(), Some("NO_HEALTHY_INSTANCE"));
    assert_short(err.status(), "30 tags");
    assert!(err.message().contains("tag-number-0000,"), "{err}");
    assert!(err.message().contains("… 22 more]"), "{err}");
    assert!(!err.message().contains("tag-number-0029"), "{err}");
    // The same through Route.
    let err = client
        .raw()
        .route(proto::RouteRequest {
            target: Some(proto::Target { kind: Some(proto::target::Kind::Capability("nope".into())), tags }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_short(&err, "1,000 tags, Route");

    // A 10 MB payload.
    let err = client.invoke("text.summarize").payload(vec![b'x'; 10 * 1000 * 1000]).send().await.unwrap_err();
    assert_eq!(err.reason(), Some("PAYLOAD_TOO_LARGE"));
    assert_short(err.status(), "10 MB payload");

    // A 64 KiB name and tenant: refused with a short quote.
    let long = "n".repeat(64 * 1024);
    let err = client.invoke(long.clone()).text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short(err.status(), "64 KiB capability name");
    let mut admin = agent_reach_e2e::admin_client(&control.endpoint()).await;
    let err =
        admin.list_agents(proto::ListAgentsRequest { tenant: long.clone(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short(&err, "64 KiB tenant");
    let err = client
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(proto::AgentRegistration {
                agent: "x".into(),
                capabilities: vec![proto::Capability { name: "c".into(), tags: vec![] }],
                endpoint: format!("http://{long}"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short(&err, "64 KiB endpoint");

    // The connection is still fine.
    let reply = client.invoke("text.summarize").text("ok").send().await.unwrap();
    assert!(reply.text().ends_with("ok"));
    agent.shutdown().await;
    a.shutdown().await;
    control.shutdown().await;
}
