//! A2A tasks are the mesh's durable tasks, end to end on a real etcd: the official a2a-sdk
//! (JSON-RPC binding, polling mode = `return_immediately`) submits through sidecar A to
//! agents behind sidecar B; sidecar A restarts and still answers the task's final state,
//! sidecar B reads it too (gRPC binding), an agent's question (input-required) is answered
//! over A2A. And the JSON-RPC port checks the local API token when one is configured.

use std::time::{Duration, Instant};

use agent_reach::{Agent, HandlerError, Reply};
use agent_reach_e2e::{Backend, TestStore, init_logging, sidecar_config, start_control, wait_for_instances};
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::{self as a2a, Message, Part, Role, SendMessageRequest, TaskState, part};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use super::a2a::{a2a_python, repo};

/// Runs one step of tests/python/a2a_sdk_tasks.py.
async fn sdk(base_url: &str, args: &[&str], token: Option<&str>) -> Value {
    let python = a2a_python().to_string();
    let script = repo().join("tests/python/a2a_sdk_tasks.py");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(script).arg(base_url).args(args);
    if let Some(t) = token {
        cmd.env("AR_API_TOKEN", t);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("run the a2a-sdk client");
    assert!(
        out.status.success(),
        "a2a-sdk {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// A sidecar with `config`, retried while its A2A port is still held by the one before.
async fn start_retrying(config: SidecarConfig) -> Sidecar {
    let config = agent_reach_e2e::secure::sidecar_identity(config).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Sidecar::start(config.clone(), agent_reach_e2e::listener().await, agent_reach_e2e::listener().await).await
        {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("sidecar start: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("sidecar start: {e}"),
        }
    }
}

async fn client(sidecar: &Sidecar) -> A2aServiceClient<Channel> {
    A2aServiceClient::connect(format!("http://{}", sidecar.local_addr())).await.unwrap()
}

fn state(task: &a2a::Task) -> TaskState {
    task.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::Unspecified)
}

/// Polls GetTask (gRPC binding) until the task is in `want`.
async fn wait_state(client: &mut A2aServiceClient<Channel>, agent: &str, id: &str, want: TaskState) -> a2a::Task {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = client
            .get_task(a2a::GetTaskRequest { tenant: agent.into(), id: id.into(), history_length: None })
            .await
            .map(|r| r.into_inner());
        match got {
            Ok(t) if state(&t) == want => return t,
            other if Instant::now() >= deadline => panic!("task {id} not {want:?} within 30s: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_tasks_are_durable_mesh_tasks_across_a_sidecar_restart() {
    tokio::task::spawn_blocking(a2a_python).await.unwrap();
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let mut config_a = sidecar_config(&control.endpoint(), "host-a");
    config_a.a2a_listen = Some("127.0.0.1:0".parse().unwrap());
    config_a.task_claim_ttl = Duration::from_secs(3);
    let a = start_retrying(config_a.clone()).await;
    let mut config_b = sidecar_config(&control.endpoint(), "host-b");
    config_b.task_claim_ttl = Duration::from_secs(3);
    let b = start_retrying(config_b).await;
    let upper = Agent::builder("upper")
        .sidecar(b.local_addr().to_string())
        .capability("text.upper", Vec::<String>::new())
        .handle("text.upper", |call| async move { Ok(Reply::text(call.text()?.to_uppercase())) })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent upper");
    let greeter = Agent::builder("greeter")
        .sidecar(b.local_addr().to_string())
        .capability("greet", Vec::<String>::new())
        .handle("greet", |call| async move {
            let task = call.task().ok_or_else(|| HandlerError::new(Code::InvalidArgument, "not a task"))?;
            let name = task.ask("what is your name?").await.map_err(|e| HandlerError::new(e.code(), e.to_string()))?;
            Ok(Reply::text(format!("{} {name}", call.text()?)))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent greeter");
    wait_for_instances(&a, &[upper.instance_id(), greeter.instance_id()]).await;

    // Submitted with the SDK's polling mode: the task at once; it completes on its own.
    let a2a_port = a.a2a_addr().unwrap();
    let upper_url = format!("http://{a2a_port}/agents/upper");
    let submitted = sdk(&upper_url, &["submit", "hello durable"], None).await;
    assert!(matches!(submitted["state"].as_str(), Some("TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING")), "{submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    wait_state(&mut client(&a).await, "upper", &id, TaskState::Completed).await;

    // Sidecar A restarts (same A2A port): the task is still there, final, with its answer.
    a.stop().await;
    config_a.a2a_listen = Some(a2a_port);
    let a = start_retrying(config_a).await;
    assert_eq!(a.a2a_addr(), Some(a2a_port));
    let got = sdk(&upper_url, &["get", &id], None).await;
    assert_eq!(
        got,
        serde_json::json!({"state": "TASK_STATE_COMPLETED", "artifact_text": "HELLO DURABLE", "status_text": "", "history": 1})
    );
    // Another sidecar answers it too (gRPC binding on B's local port), and lists it.
    let mut on_b = client(&b).await;
    let read = wait_state(&mut on_b, "upper", &id, TaskState::Completed).await;
    assert_eq!(read.history[0].parts[0].content, Some(part::Content::Text("hello durable".into())));
    assert_eq!(read.history[0].role(), Role::User);
    let listed = on_b
        .list_tasks(a2a::ListTasksRequest { tenant: "upper".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((listed.total_size, listed.tasks[0].id.as_str()), (1, id.as_str()));
    // Not another agent's task; not cancelable once finished.
    let other =
        on_b.get_task(a2a::GetTaskRequest { tenant: "greeter".into(), id: id.clone(), history_length: None }).await;
    assert_eq!(other.unwrap_err().get_details_error_info().unwrap().reason, "TASK_NOT_FOUND");
    let refused =
        on_b.cancel_task(a2a::CancelTaskRequest { tenant: "upper".into(), id: id.clone(), metadata: None }).await;
    assert_eq!(refused.unwrap_err().get_details_error_info().unwrap().reason, "TASK_NOT_CANCELABLE");

    // Input required: the agent asks, the A2A client answers into the same task.
    let greeter_url = format!("http://{a2a_port}/agents/greeter");
    let asked = sdk(&greeter_url, &["submit", "hello"], None).await;
    let gid = asked["id"].as_str().unwrap().to_string();
    let mut on_a = client(&a).await;
    wait_state(&mut on_a, "greeter", &gid, TaskState::InputRequired).await;
    let question = sdk(&greeter_url, &["get", &gid], None).await;
    assert_eq!(question["state"], "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(question["status_text"], "what is your name?");
    let answered = sdk(&greeter_url, &["answer", &gid, "bob"], None).await;
    assert!(matches!(answered["state"].as_str(), Some("TASK_STATE_WORKING" | "TASK_STATE_COMPLETED")), "{answered}");
    let done = wait_state(&mut on_a, "greeter", &gid, TaskState::Completed).await;
    let texts: Vec<(Role, String)> = done
        .history
        .iter()
        .map(|m| {
            let text = m.parts.iter().filter_map(|p| match &p.content {
                Some(part::Content::Text(t)) => Some(t.clone()),
                _ => None,
            });
            (m.role(), text.collect())
        })
        .collect();
    assert_eq!(
        texts,
        [
            (Role::User, "hello".to_string()),
            (Role::Agent, "what is your name?".to_string()),
            (Role::User, "bob".to_string())
        ]
    );
    assert_eq!(sdk(&greeter_url, &["get", &gid], None).await["artifact_text"], "hello bob");
    // A finished task takes no more answers.
    let late = Message {
        message_id: "late".into(),
        task_id: gid.clone(),
        role: Role::User as i32,
        parts: vec![Part { content: Some(part::Content::Text("again".into())), ..Default::default() }],
        ..Default::default()
    };
    let refused = on_a
        .send_message(SendMessageRequest { tenant: "greeter".into(), message: Some(late), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(refused.get_details_error_info().unwrap().reason, "UNSUPPORTED_OPERATION");

    upper.abort();
    greeter.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// Sends one HTTP/1.1 request; the status code and the body.
async fn http(addr: std::net::SocketAddr, request: &str) -> (u16, Value) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_jsonrpc_port_checks_the_local_token() {
    tokio::task::spawn_blocking(a2a_python).await.unwrap();
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let token = "a-local-token-of-this-host";
    let mut config = sidecar_config(&control.endpoint(), "host-t");
    config.a2a_listen = Some("127.0.0.1:0".parse().unwrap());
    config.local_token = Some(agent_reach_sidecar::local_access::ApiToken::new(token).unwrap());
    let s = start_retrying(config).await;
    // The agent sits behind another sidecar (the SDK reads its token from the process
    // environment, which the tests of this binary share).
    let b = start_retrying(sidecar_config(&control.endpoint(), "host-b")).await;
    let upper = Agent::builder("upper")
        .sidecar(b.local_addr().to_string())
        .capability("text.upper", Vec::<String>::new())
        .handle("text.upper", |call| async move { Ok(Reply::text(call.text()?.to_uppercase())) })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent upper");
    s.wait_for_table(Duration::from_secs(10), |t| t.by_agent.get("upper").is_some_and(|g| !g.members.is_empty()))
        .await
        .expect("the sidecar sees agent upper");
    let addr = s.a2a_addr().unwrap();
    let card = "GET /agents/upper/.well-known/agent-card.json HTTP/1.1\r\nhost: x\r\nconnection: close\r\n";
    let get_task = r#"{"jsonrpc":"2.0","id":7,"method":"GetTask","params":{"id":"no-such-task"}}"#;
    let post = |extra: &str| {
        format!(
            "POST /agents/upper HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{get_task}",
            get_task.len()
        )
    };
    for (request, why) in [
        (format!("{card}\r\n"), "card, no token"),
        (format!("{card}ar-api-token: a-local-token-but-wrong\r\n\r\n"), "card, wrong token"),
        (post(""), "JSON-RPC, no token"),
    ] {
        let (code, body) = http(addr, &request).await;
        assert_eq!(code, 401, "{why}: {body}");
        assert_eq!(body["error"]["data"][0]["reason"], "UNAUTHENTICATED", "{why}: {body}");
    }
    let (code, body) = http(addr, &format!("{card}ar-api-token: {token}\r\n\r\n")).await;
    assert_eq!((code, body["name"].as_str()), (200, Some("upper")), "{body}");
    let (code, body) = http(addr, &post(&format!("ar-api-token: {token}\r\n"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["error"]["data"][0]["reason"], "TASK_NOT_FOUND", "{body}");
    // The unmodified a2a-sdk with the token in its HTTP client's headers.
    let url = format!("http://{addr}/agents/upper");
    let out = sdk(&url, &["submit", "token"], Some(token)).await;
    let id = out["id"].as_str().unwrap().to_string();
    // The task is dispatched (in process, so the token does not stand in its way) and done.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = sdk(&url, &["get", &id], Some(token)).await;
        if got["state"] == "TASK_STATE_COMPLETED" {
            assert_eq!(got["artifact_text"], "TOKEN");
            break;
        }
        assert!(Instant::now() < deadline, "not completed within 30s: {got}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    upper.abort();
    s.stop().await;
    b.stop().await;
    control.shutdown().await;
}
