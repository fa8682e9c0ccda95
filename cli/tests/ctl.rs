//! `agent-reach ctl` end to end: the built binary against a control service on the
//! embedded store, checking its tables, its JSON and its errors.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::model::fixture;
use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_store::EmbeddedStore;

/// Runs `agent-reach ctl --control <endpoint> <args>`.
async fn ctl(endpoint: &str, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agent-reach"));
    command.arg("ctl").arg("--control").arg(endpoint).args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run agent-reach")).await.expect("join")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn register(
    control: &mut ControlClient<tonic::transport::Channel>,
    id: &str,
    agent: &str,
    tags: &[&str],
    lease: i64,
) -> i64 {
    let reply = control
        .register(proto::ControlRegisterRequest {
            tenant: "default".into(),
            sidecar: Some(proto::SidecarIdentity { sidecar_id: "host-a".into(), mesh_address: "host-a:7701".into() }),
            instance_id: id.into(),
            registration: Some(
                fixture::registration(agent)
                    .version("2.0.1")
                    .capability("text.translate", tags)
                    .endpoint("http://127.0.0.1:9")
                    .proto_registration(),
            ),
            state: proto::HealthState::Up as i32,
            lease_id: lease,
        })
        .await
        .unwrap();
    reply.into_inner().lease_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_lists_pauses_explains_and_manages_policies_and_tenants() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = ControlHandle::spawn(Arc::new(EmbeddedStore::default()), ControlConfig::default(), listener).unwrap();
    let endpoint = control.endpoint();
    let mut client = ControlClient::connect(endpoint.clone()).await.unwrap();
    let lease = register(&mut client, "translator-zh", "translator", &["zh"], 0).await;
    register(&mut client, "translator-en", "translator", &["en"], lease).await;

    // Tables by default, JSON on request.
    let out = ctl(&endpoint, &["agents"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("AGENT       VERSIONS  INSTANCES  STATES  CAPABILITIES"), "{text}");
    assert!(text.contains("translator  2.0.1     2          UP:2    text.translate[en,zh]"), "{text}");
    let out = ctl(&endpoint, &["--output", "json", "instances", "--tag", "zh"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids: Vec<&str> = json.as_array().unwrap().iter().map(|i| i["instance_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["translator-zh"]);

    // Pause with a reason, see it, resume.
    let out = ctl(&endpoint, &["pause", "--reason", "disk swap", "instance", "translator-zh"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("paused 1 instance(s)"), "{}", stdout(&out));
    let out = ctl(&endpoint, &["-o", "json", "instance", "translator-zh"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["state"].as_str(), json["reported_state"].as_str()), (Some("PAUSED"), Some("UP")));
    assert_eq!(json["holds"][0]["reason"], "disk swap");
    let out = ctl(&endpoint, &["instances", "--state", "paused"]).await;
    assert!(stdout(&out).contains("PAUSED (held; reports UP)"), "{}", stdout(&out));

    // Explain names the skipped instances and why.
    let out = ctl(&endpoint, &["explain", "text.translate", "--tags", "zh"]).await;
    let text = stdout(&out);
    assert!(text.starts_with("capability text.translate [zh] — strategy "), "{text}");
    assert!(text.contains("no candidate"), "{text}");
    assert!(text.contains("translator-en  translator  MISSING_TAGS"), "{text}");
    assert!(text.contains("translator-zh  translator  STATE_PAUSED"), "{text}");
    let out = ctl(&endpoint, &["resume", "instance", "translator-zh"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ctl(&endpoint, &["-o", "json", "explain", "text.translate", "--tags", "zh"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["candidates"][0]["instance"]["instance_id"], "translator-zh");

    // Policies from a file of rules; a bad one names its field and exits 2.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"strategy": "round_robin", "default_timeout_ms": 1500}"#).unwrap();
    let out =
        ctl(&endpoint, &["policy", "put", "capability", "text.translate", "--file", good.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("stored capability policy text.translate at revision "), "{}", stdout(&out));
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"breaker": {"failure_rate": 2.0}}"#).unwrap();
    let out = ctl(&endpoint, &["policy", "put", "capability", "text.translate", "--file", bad.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("spec.breaker.failure_rate"), "{}", stderr(&out));
    let out = ctl(&endpoint, &["-o", "json", "policy", "get", "capability", "text.translate"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["spec"]["strategy"].as_str(), json["spec"]["default_timeout_ms"].as_u64()),
        (Some("round_robin"), Some(1500))
    );
    let out = ctl(&endpoint, &["policy", "list"]).await;
    assert!(stdout(&out).contains("capability  text.translate"), "{}", stdout(&out));
    let out = ctl(&endpoint, &["policy", "delete", "capability", "text.translate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ctl(&endpoint, &["policy", "get", "capability", "text.translate"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("POLICY_NOT_FOUND"), "{}", stderr(&out));

    // Tenants.
    let out = ctl(&endpoint, &["tenant", "put", "team-a", "--description", "the A team"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ctl(&endpoint, &["-o", "json", "tenant", "list"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json[0]["name"].as_str(), json[0]["description"].as_str()), (Some("team-a"), Some("the A team")));

    // Errors carry the reason and field; bad input exits 2.
    let out = ctl(&endpoint, &["--tenant", "Bad/Tenant", "agents"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("INVALID_ARGUMENT") && stderr(&out).contains("(field tenant)"), "{}", stderr(&out));
    let out = ctl(&endpoint, &["instance", "nope-1"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("INSTANCE_NOT_FOUND"), "{}", stderr(&out));
    // An unreachable endpoint first is skipped.
    let dead = "http://127.0.0.1:9";
    let out = ctl(&format!("{dead},{endpoint}"), &["agents"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    tokio::time::timeout(Duration::from_secs(10), control.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_session_show_prints_fields_writers_and_locks() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = ControlHandle::spawn(Arc::new(EmbeddedStore::default()), ControlConfig::default(), listener).unwrap();
    let endpoint = control.endpoint();
    let mut sessions = proto::sessions_client::SessionsClient::connect(endpoint.clone()).await.unwrap();
    let write = |name: &str, value: &[u8], policy: proto::WritePolicy| proto::SessionFieldWrite {
        name: name.into(),
        value: value.to_vec().into(),
        policy: policy as i32,
        ..Default::default()
    };
    let version = sessions
        .put_session(proto::PutSessionRequest {
            tenant: "default".into(),
            session_id: "order-42".into(),
            fields: vec![
                write("user_id", b"u-7", proto::WritePolicy::FirstWriter),
                write("blob", &[0xff, 0x00, 0x01], proto::WritePolicy::LastWriter),
            ],
            writer_agent: "intake".into(),
            writer_instance: "intake-1".into(),
            writer_verified: false,
        })
        .await
        .unwrap()
        .into_inner()
        .version;

    let out = ctl(&endpoint, &["session", "show", "order-42"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let expected = format!(
        "session order-42 (tenant default) at version {version}\n\
         FIELD    VERSION  WRITER           POLICY                 VALUE\n\
         blob     {version:<7}  intake/intake-1                         <3 bytes>\n\
         user_id  {version:<7}  intake/intake-1  locked (first writer)  u-7\n"
    );
    assert_eq!(text, expected);
    let out = ctl(&endpoint, &["--output", "json", "session", "show", "order-42"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["fields"][1]["value"], "u-7");
    assert_eq!(json["fields"][1]["locked"], true);
    assert_eq!(json["fields"][0]["value_bytes"], 3);

    let out = ctl(&endpoint, &["session", "show", "missing"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no session \"missing\""), "{}", stderr(&out));
    control.shutdown().await;
}

/// Under `--mtls required` and operator tokens, `ctl session show` goes through the Admin
/// API like every other `ctl` command: a viewer token reads, no token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_session_show_works_under_mtls_required_with_a_viewer_token() {
    use agent_reach_control::config::{BootstrapToken, SessionBackend};
    use agent_reach_control::identity::{IdentityConfig, Mtls};
    use agent_reach_session::{FieldWrite, KvSessions, Limits, SessionStore, WritePolicy, Writer};

    let td = agent_reach_identity::DEFAULT_TRUST_DOMAIN;
    let store: Arc<dyn agent_reach_store::Store> = Arc::new(EmbeddedStore::default());
    let sessions = Arc::new(KvSessions::new(store.clone(), Limits::default()));
    let boot = "bootstrap-admin-token-for-the-ctl-test";
    let config = ControlConfig {
        mtls: Mtls::Required,
        identity: Some(IdentityConfig {
            ca: Arc::new(agent_reach_identity::Ca::generate(td).expect("CA")),
            cert_ttl: Duration::from_secs(3600),
        }),
        admin_token: Some(BootstrapToken(boot.into())),
        session_store: Some(SessionBackend(sessions.clone())),
        ..ControlConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = ControlHandle::spawn(store, config, listener).unwrap();
    let endpoint = control.endpoint();
    let version = sessions
        .put(
            "default",
            "order-7",
            &Writer::new("intake", "intake-1"),
            vec![FieldWrite::new("user_id", "u-7", WritePolicy::FirstWriter)],
        )
        .await
        .unwrap()
        .version;

    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, control.ca().bundle_pem()).unwrap();
    let bundle = bundle.to_str().unwrap().to_string();
    let tls = agent_reach_identity::tls::bootstrap_client(control.ca().bundle_pem(), td).expect("client TLS");
    let channel = agent_reach_sidecar::identity::TlsConnector::fixed(Arc::new(tls)).channel(&endpoint).unwrap();
    let mut admin = proto::admin_client::AdminClient::new(channel);
    let mut create = tonic::Request::new(proto::CreateOperatorTokenRequest {
        role: proto::OperatorRole::Viewer as i32,
        description: "ctl test".into(),
        ..Default::default()
    });
    create.metadata_mut().insert("authorization", format!("Bearer {boot}").parse().unwrap());
    let viewer = admin.create_operator_token(create).await.expect("a viewer token").into_inner().secret;
    let viewer_file = dir.path().join("viewer");
    std::fs::write(&viewer_file, &viewer).unwrap();

    let out = ctl(
        &endpoint,
        &["--trust-bundle-file", &bundle, "--token-file", viewer_file.to_str().unwrap(), "session", "show", "order-7"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!("session order-7 (tenant default) at version {version}\n")),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("locked (first writer)  u-7"), "{}", stdout(&out));

    let out = ctl(&endpoint, &["--trust-bundle-file", &bundle, "session", "show", "order-7"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("UNAUTHENTICATED"), "{}", stderr(&out));
    control.shutdown().await;
}
