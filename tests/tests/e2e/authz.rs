//! Who may call whom, end to end: agent credentials from `Register`, the caller's sidecar
//! vouching for its agent over mutual TLS, authorization policies set through Admin and
//! enforced at the target's sidecar, and rate-limit buckets keyed by the verified caller
//! (a name the caller writes itself buys nothing). Real etcd, certificates made in the test.

use std::time::Duration;

use agent_reach::policy::{Authorization, Policy, PolicyKind, PolicySpec, RateLimit};
use agent_reach::proto;
use agent_reach::proto::admin_client::AdminClient;
use agent_reach::{Agent, Client, InvokeError, Reply};
use agent_reach_e2e::*;
use agent_reach_sidecar::Sidecar;
use tonic::Code;

use crate::identity::{anonymous_channel, create_token, identity_settings, mtls_control};

/// An agent answering its verified caller and the caller it was told, as
/// "verified=<agent or ->;said=<agent or ->".
async fn whoami_agent(sidecar: &Sidecar, agent: &str, capability: &str) -> agent_reach::RunningAgent {
    Agent::builder(agent)
        .sidecar(sidecar.local_addr().to_string())
        .handle(capability, |call| async move {
            let verified = call.verified_caller().map_or("-".to_string(), |c| c.agent.clone());
            let said = call.caller().map_or("-".to_string(), |c| c.agent.clone());
            Ok(Reply::text(format!("verified={verified};said={said}")))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent start")
}

fn refusal(result: Result<agent_reach::InvokeReply, InvokeError>, what: &str) -> InvokeError {
    match result {
        Ok(r) => panic!("{what}: expected a refusal, got {:?}", r.text()),
        Err(e) => e,
    }
}

fn assert_not_authorized(e: &InvokeError, policy: &str, what: &str) {
    assert_eq!((e.code(), e.reason()), (Code::PermissionDenied, Some("NOT_AUTHORIZED")), "{what}: {e}");
    assert_eq!(e.detail("policy"), Some(policy), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_policy_lets_planner_call_and_refuses_intruder() {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = mtls_control(&store, agent_reach_identity::DEFAULT_CERT_TTL).await;
    let mut admin = AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "team-a", 0, false).await;
    let start = |id: &'static str| {
        let mut config = sidecar_config(&control.endpoint(), id);
        config.tenant = "team-a".into();
        config.identity = Some(identity_settings(&control, &token));
        start_sidecar(config)
    };
    let (a, b) = (start("authz-a").await, start("authz-b").await);
    // The worker is on sidecar B (calls cross the mesh); the archivist is on A, next to
    // the callers (calls go through A's inbound stack without a network hop).
    let worker = whoami_agent(&b, "worker", "work").await;
    let archivist = whoami_agent(&a, "archivist", "archive").await;
    let planner = echo_agent(a.local_addr(), "planner", &[("plan", &[])]).await;
    let intruder = echo_agent(a.local_addr(), "intruder", &[("intrude", &[])]).await;
    let ids = [worker.instance_id(), archivist.instance_id(), planner.instance_id(), intruder.instance_id()];
    wait_for_instances(&a, &ids).await;
    wait_for_instances(&b, &ids).await;

    // Without a policy every caller of the tenant may call; the agent learns who called.
    let reply = intruder.client().invoke("work").text("x").send().await.expect("no policy yet");
    assert_eq!(reply.text(), "verified=intruder;said=intruder");
    let anonymous = Client::lazy(&a.local_addr().to_string()).unwrap();
    let reply = anonymous.with_caller("planner", "p-1").invoke("work").text("x").send().await.expect("anonymous");
    assert_eq!(reply.text(), "verified=-;said=planner", "a name the caller writes is not vouched for");
    assert_eq!(worker.handled(), 2);

    // Policies through Admin: capability `work` and agent `archivist` allow only planner.
    let only_planner =
        Authorization { allowed_agents: vec!["planner".into()], allow_anonymous: false, ..Default::default() };
    for (kind, name) in [(PolicyKind::Capability, "work"), (PolicyKind::Agent, "archivist")] {
        let policy = Policy {
            tenant: "team-a".into(),
            kind,
            name: name.into(),
            spec: PolicySpec { authorization: Some(only_planner.clone()), ..Default::default() },
            description: "only the planner".into(),
        };
        admin
            .put_policy(proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(&policy, 0)) })
            .await
            .expect("put policy");
        wait_for_policy(&[&a, &b], &policy).await;
    }

    let reply = planner.client().invoke("work").text("x").send().await.expect("planner calls work");
    assert_eq!(reply.text(), "verified=planner;said=planner");
    planner.client().invoke("archive").text("x").send().await.expect("planner calls archive");
    assert_eq!((worker.handled(), archivist.handled()), (3, 1));

    let before = store.store.current_revision().await.unwrap();
    let bogus = anonymous.with_credential(format!("arac.{}.not-the-secret", planner.instance_id()));
    let cases: Vec<(&str, Client, &str, &str)> = vec![
        ("intruder → work (remote)", intruder.client(), "work", "capability/work"),
        ("intruder → archive (local)", intruder.client(), "archive", "agent/archivist"),
        ("intruder naming itself planner", intruder.client().with_caller("planner", "p-1"), "work", "capability/work"),
        ("anonymous naming itself planner", anonymous.with_caller("planner", "p-1"), "work", "capability/work"),
        ("anonymous → archive", anonymous.clone(), "archive", "agent/archivist"),
    ];
    for (what, client, capability, policy) in cases {
        let e = refusal(client.invoke(capability).text("x").send().await, what);
        assert_not_authorized(&e, policy, what);
        assert_eq!(e.detail("target"), Some(format!("capability {capability}").as_str()), "{what}");
    }
    // A credential that is not one the sidecar issued is refused, not made anonymous.
    let e = refusal(bogus.invoke("plan").text("x").send().await, "bogus credential");
    assert_eq!((e.code(), e.reason()), (Code::Unauthenticated, Some("AGENT_CREDENTIAL_INVALID")), "{e}");
    // A caller header written by the client never reaches the target's sidecar.
    let mut raw = proto::sidecar_client::SidecarClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", a.local_addr())).unwrap().connect_lazy(),
    );
    let mut request = tonic::Request::new(proto::InvokeRequest {
        target: Some(agent_reach::model::Target::capability("work").into()),
        payload: "x".into(),
        ..Default::default()
    });
    request.metadata_mut().insert("ar-caller-agent", "planner".parse().unwrap());
    request.metadata_mut().insert("ar-caller-instance", planner.instance_id().parse().unwrap());
    let status = raw.invoke(request).await.expect_err("forged ar-caller-agent");
    assert_eq!(crate::identity::reason(&status), "NOT_AUTHORIZED");
    assert_eq!((worker.handled(), archivist.handled()), (3, 1), "no refused call reached an agent");
    assert_eq!(store.writes_since(before).await, Vec::<String>::new(), "refusals wrote nothing");

    // A deregistered agent's credential dies with its registration.
    let planner_client = planner.client();
    planner.shutdown().await;
    let e = refusal(planner_client.invoke("plan").text("x").send().await, "credential of a gone instance");
    assert_eq!(e.reason(), Some("AGENT_CREDENTIAL_INVALID"), "{e}");

    // Allowing anonymous calls lets them in again.
    let open = Policy {
        tenant: "team-a".into(),
        kind: PolicyKind::Capability,
        name: "work".into(),
        spec: PolicySpec {
            authorization: Some(Authorization { allowed_agents: vec![], allow_anonymous: true, ..Default::default() }),
            ..Default::default()
        },
        description: String::new(),
    };
    admin
        .put_policy(proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(&open, 0)) })
        .await
        .expect("put policy");
    wait_for_policy(&[&a, &b], &open).await;
    anonymous.invoke("work").text("x").send().await.expect("anonymous allowed");
    intruder.client().invoke("work").text("x").send().await.expect("any verified agent allowed");
    assert_eq!(worker.handled(), 5);
    for agent in [worker, archivist, intruder] {
        agent.abort();
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_caller_names_buy_no_new_burst() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let sidecar = start_sidecar(sidecar_config(&control.endpoint(), "rl")).await;
    let target = echo_agent(sidecar.local_addr(), "echo", &[("echo", &[])]).await;
    let planner = echo_agent(sidecar.local_addr(), "planner", &[("plan", &[])]).await;
    wait_for_instances(&sidecar, &[target.instance_id(), planner.instance_id()]).await;
    // Burst 3, refilled once every 1000 s: only the burst passes in this test.
    let limit = PolicySpec { rate_limit: Some(RateLimit { per_second: 0.001, burst: 3 }), ..Default::default() };
    put_policy(&ts.store, &[&sidecar], capability_policy("echo", limit)).await;

    let anonymous = Client::lazy(&sidecar.local_addr().to_string()).unwrap();
    let mut passed = 0;
    for i in 0..10 {
        let as_someone = anonymous.with_caller(&format!("caller-{i}"), &format!("caller-{i}-1"));
        match as_someone.invoke("echo").text("x").send().await {
            Ok(_) => passed += 1,
            Err(e) => {
                assert_eq!(e.reason(), Some("RATE_LIMITED"), "{e}");
                assert_eq!(e.detail("bucket"), Some("(anonymous)→capability echo"));
            }
        }
    }
    assert_eq!(passed, 3, "ten self-written names share the anonymous bucket");
    // A verified agent has a bucket of its own, which renaming does not refill either.
    let mut passed = 0;
    for i in 0..10 {
        match planner.client().with_caller(&format!("alias-{i}"), "").invoke("echo").text("x").send().await {
            Ok(_) => passed += 1,
            Err(e) => assert_eq!(e.detail("bucket"), Some("planner→capability echo"), "{e}"),
        }
    }
    assert_eq!(passed, 3);
    assert_eq!(target.handled(), 6);
    target.abort();
    planner.abort();
    sidecar.stop().await;
    control.shutdown().await;
}

/// Dials the Unix socket at a fixed path, whatever the URI.
#[derive(Clone)]
struct UdsConnector(std::path::PathBuf);

impl tonic::codegen::Service<http::Uri> for UdsConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_api_takes_a_token_and_serves_a_unix_socket_with_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sidecar.sock");
    let token = "a-local-token-of-the-test";
    let mut config = sidecar_config(&control.endpoint(), "local");
    config.local_uds = Some((socket.clone(), 0o600));
    config.local_token = Some(agent_reach_sidecar::local_access::ApiToken::new(token).unwrap());
    let sidecar = start_sidecar(config).await;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);

    let route = |with: Option<&str>| {
        let mut request = tonic::Request::new(proto::RouteRequest {
            target: Some(agent_reach::model::Target::capability("nothing.here").into()),
            ..Default::default()
        });
        if let Some(t) = with {
            request.metadata_mut().insert("ar-api-token", t.parse().unwrap());
        }
        request
    };
    let tcp =
        tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.local_addr())).unwrap().connect_lazy();
    let uds = tonic::transport::Endpoint::from_static("http://sidecar.local")
        .connect_with_connector(UdsConnector(socket.clone()))
        .await
        .expect("connect to the local socket");
    for (what, channel) in [("tcp", tcp.clone()), ("unix socket", uds)] {
        let mut client = proto::sidecar_client::SidecarClient::new(channel.clone());
        for wrong in [None, Some("not-the-token-at-all")] {
            let status = client.route(route(wrong)).await.expect_err("no or a wrong token");
            assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
            assert_eq!(crate::identity::reason(&status), "UNAUTHENTICATED", "{what}");
        }
        // With the token the request reaches the API (and fails for its own reason).
        let status = client.route(route(Some(token))).await.expect_err("nothing offers it");
        assert_eq!(crate::identity::reason(&status), "AGENT_NOT_FOUND", "{what}: {status:?}");
        // Health checks need no token (probes).
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect(what);
    }
    // An agent registering without the token is refused, so it never joins.
    let agent = Agent::builder("no-token")
        .sidecar(sidecar.local_addr().to_string())
        .handle("x", |_call| async move { Ok(Reply::text("x")) })
        .register_timeout(Duration::from_secs(1))
        .start()
        .await;
    assert!(agent.is_err(), "registering without the token must fail");
    assert_eq!(sidecar.local_instances(), 0);
    sidecar.stop().await;
    assert!(!socket.exists(), "the socket file is removed at shutdown");
    control.shutdown().await;
}
