//! A2A on the sidecar, end to end on a real etcd: an A2A client talks to caller sidecar A,
//! the agent (a Rust SDK agent) sits behind sidecar B. The gRPC binding is driven with the
//! generated `lf.a2a.v1` client; both bindings are then driven by the official Python
//! `a2a-sdk` (installed by scripts/install-a2a-sdk.sh), unmodified.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_reach::policy::{Policy, PolicyKind, PolicySpec, RateLimit};
use agent_reach::{Agent, Reply, RunningAgent};
use agent_reach_control::ControlHandle;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, eventually, init_logging, sidecar_config, start_control, start_sidecar,
    wait_for_policy,
};
use agent_reach_sidecar::Sidecar;
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::{
    self as a2a, Message, Part, Role, SendMessageConfiguration, SendMessageRequest, TaskState, part,
    send_message_response, stream_response,
};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// What the agent saw of its last call.
#[derive(Default)]
struct Seen {
    session_id: String,
    traceparent: Option<String>,
}

struct A2aMesh {
    _store: TestStore,
    control: ControlHandle,
    a: Sidecar,
    b: Sidecar,
    agent: RunningAgent,
    seen: Arc<Mutex<Seen>>,
}

/// Etcd, control, sidecar A (with the JSON-RPC port) and B, and agent `upper` on B with
/// one capability, answering its text in upper case.
async fn start() -> A2aMesh {
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.a2a_listen = Some("127.0.0.1:0".parse().unwrap());
    let a = start_sidecar(config).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let agent = Agent::builder("upper")
        .version("1.2.0")
        .sidecar(b.local_addr().to_string())
        .capability("text.upper", ["en", "fast"])
        .handle("text.upper", move |call| {
            let s = s.clone();
            async move {
                *s.lock().unwrap() = Seen {
                    session_id: call.session_id().to_string(),
                    traceparent: call.traceparent().map(str::to_string),
                };
                Ok(Reply::text(call.text()?.to_uppercase()))
            }
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent start");
    a.wait_for_table(Duration::from_secs(10), |t| t.by_agent.get("upper").is_some_and(|g| !g.members.is_empty()))
        .await
        .expect("sidecar A sees agent upper");
    A2aMesh { _store: store, control, a, b, agent, seen }
}

impl A2aMesh {
    async fn client(&self) -> A2aServiceClient<Channel> {
        A2aServiceClient::connect(format!("http://{}", self.a.local_addr())).await.unwrap()
    }

    async fn stop(self, more: Vec<RunningAgent>) {
        self.agent.abort();
        for a in more {
            a.abort();
        }
        self.a.stop().await;
        self.b.stop().await;
        self.control.shutdown().await;
    }
}

fn text_message(text: &str, context_id: &str) -> Message {
    Message {
        message_id: format!("m-{text}"),
        context_id: context_id.into(),
        role: Role::User as i32,
        parts: vec![Part { content: Some(part::Content::Text(text.into())), ..Default::default() }],
        ..Default::default()
    }
}

fn send(agent: &str, text: &str) -> SendMessageRequest {
    SendMessageRequest { tenant: agent.into(), message: Some(text_message(text, "")), ..Default::default() }
}

fn artifact_text(task: &a2a::Task) -> Option<String> {
    task.artifacts.first()?.parts.first().and_then(|p| match &p.content {
        Some(part::Content::Text(t)) => Some(t.clone()),
        _ => None,
    })
}

fn state(task: &a2a::Task) -> TaskState {
    task.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::Unspecified)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_grpc_messages_become_mesh_calls_through_two_sidecars() {
    let mesh = start().await;
    let mut client = mesh.client().await;

    // The agent card, by GetExtendedAgentCard: skills from the capability and its tags,
    // the sidecar's two interfaces, the tenant field naming the agent.
    let card = client
        .get_extended_agent_card(a2a::GetExtendedAgentCardRequest { tenant: "upper".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((card.name.as_str(), card.version.as_str()), ("upper", "1.2.0"));
    assert_eq!(card.skills.len(), 1);
    assert_eq!(card.skills[0].id, "text.upper");
    assert_eq!(card.skills[0].tags, ["en", "fast"]);
    let interfaces: Vec<(String, String, String)> = card
        .supported_interfaces
        .iter()
        .map(|i| (i.protocol_binding.clone(), i.url.clone(), i.tenant.clone()))
        .collect();
    let jsonrpc = format!("http://{}/agents/upper", mesh.a.a2a_addr().unwrap());
    assert_eq!(
        interfaces,
        [
            ("JSONRPC".to_string(), jsonrpc, "upper".to_string()),
            ("GRPC".to_string(), mesh.a.local_addr().to_string(), "upper".to_string())
        ]
    );
    assert_eq!(card.capabilities.as_ref().and_then(|c| c.streaming), Some(true));

    // Blocking: the reply is the artifact of a completed task; the context id is the mesh
    // session id, and the trace context reaches the agent.
    let mut request = tonic::Request::new(SendMessageRequest {
        tenant: "upper".into(),
        message: Some(text_message("hello", "ctx-1")),
        ..Default::default()
    });
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    request.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    let answer = client.send_message(request).await.unwrap().into_inner();
    let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("not a task: {answer:?}") };
    assert_eq!(state(&task), TaskState::Completed);
    assert_eq!(artifact_text(&task).as_deref(), Some("HELLO"));
    assert_eq!(task.context_id, "ctx-1");
    assert_eq!(task.history.len(), 1);
    {
        let seen = mesh.seen.lock().unwrap();
        assert_eq!(seen.session_id, "ctx-1");
        let got = seen.traceparent.as_deref().expect("the agent got a traceparent");
        assert_eq!(&got[3..35], "4bf92f3577b34da6a3ce929d0e0e4736", "same trace id: {got}");
    }

    // Streaming: the task, working, the artifact, completed; nothing more.
    let mut stream = client.send_streaming_message(send("upper", "stream me")).await.unwrap().into_inner();
    let mut kinds = Vec::new();
    let mut streamed_id = String::new();
    while let Some(event) = stream.message().await.unwrap() {
        match event.payload.unwrap() {
            stream_response::Payload::Task(t) => {
                streamed_id = t.id.clone();
                kinds.push(format!("task:{}", state(&t).as_str_name()));
            }
            stream_response::Payload::StatusUpdate(u) => {
                assert_eq!(u.task_id, streamed_id);
                kinds.push(format!("status:{}", u.status.unwrap().state().as_str_name()));
            }
            stream_response::Payload::ArtifactUpdate(u) => {
                let part = &u.artifact.unwrap().parts[0];
                kinds.push(format!("artifact:{:?}", part.content));
            }
            stream_response::Payload::Message(m) => kinds.push(format!("message:{m:?}")),
        }
    }
    assert_eq!(
        kinds,
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_WORKING",
            &format!("artifact:{:?}", Some(part::Content::Text("STREAM ME".into()))),
            "status:TASK_STATE_COMPLETED"
        ]
    );

    // The tasks are kept: GetTask, ListTasks; a finished task cannot be canceled.
    let got = client
        .get_task(a2a::GetTaskRequest { tenant: "upper".into(), id: streamed_id.clone(), history_length: Some(0) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((state(&got), got.history.len()), (TaskState::Completed, 0));
    assert_eq!(artifact_text(&got).as_deref(), Some("STREAM ME"));
    let listed = client
        .list_tasks(a2a::ListTasksRequest { tenant: "upper".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_size, 2);
    assert_eq!(listed.tasks[0].id, streamed_id, "newest first");
    let refused =
        client.cancel_task(a2a::CancelTaskRequest { tenant: "upper".into(), id: streamed_id, metadata: None }).await;
    let status = refused.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let info = status.get_details_error_info().unwrap();
    assert_eq!((info.reason.as_str(), info.domain.as_str()), ("TASK_NOT_CANCELABLE", "a2a-protocol.org"));

    // An unknown agent: the mesh's reason, with a suggestion.
    let status = client.send_message(send("uper", "x")).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "AGENT_NOT_FOUND");
    assert!(status.message().contains("upper"), "{}", status.message());
    mesh.stop(vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_traffic_is_governed_like_any_call() {
    let mesh = start().await;
    let mut client = mesh.client().await;
    // A rate limit on the agent: 2 calls, then RATE_LIMITED, as for Invoke.
    let policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "upper".into(),
        spec: PolicySpec { rate_limit: Some(RateLimit { per_second: 0.01, burst: 2 }), ..Default::default() },
        description: String::new(),
    };
    let mut admin = admin_client(&mesh.control.endpoint()).await;
    admin
        .put_policy(agent_reach::proto::PutPolicyRequest {
            policy: Some(agent_reach::convert::policy_to_proto(&policy, 0)),
        })
        .await
        .unwrap();
    wait_for_policy(&[&mesh.a, &mesh.b], &policy).await;
    for i in 0..2 {
        let answer = client.send_message(send("upper", &format!("call {i}"))).await.unwrap().into_inner();
        let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("{answer:?}") };
        assert_eq!(state(&task), TaskState::Completed);
    }
    let status = client.send_message(send("upper", "one too many")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.get_details_error_info().unwrap().reason, "RATE_LIMITED");
    // Streaming: the task fails with the reason in its status update.
    let mut stream = client.send_streaming_message(send("upper", "streamed")).await.unwrap().into_inner();
    let mut last = None;
    while let Some(event) = stream.message().await.unwrap() {
        last = event.payload;
    }
    let Some(stream_response::Payload::StatusUpdate(update)) = last else { panic!("last event: {last:?}") };
    assert_eq!(update.status.as_ref().unwrap().state(), TaskState::Failed);
    let reason = update.metadata.as_ref().and_then(|m| m.fields.get("reason")).cloned();
    assert_eq!(reason.and_then(|v| v.kind), Some(pbjson_types::value::Kind::StringValue("RATE_LIMITED".into())));
    mesh.stop(vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_cancel_reaches_the_running_agent() {
    let mesh = start().await;
    let started = Arc::new(AtomicU32::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    struct Guard(Arc<AtomicBool>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (s, d) = (started.clone(), dropped.clone());
    let slow = Agent::builder("slow")
        .sidecar(mesh.b.local_addr().to_string())
        .handle("work.slow", move |_call| {
            let (s, d) = (s.clone(), d.clone());
            async move {
                let _guard = Guard(d);
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Reply::text("too late"))
            }
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("agent start");
    mesh.a
        .wait_for_table(Duration::from_secs(10), |t| t.by_agent.get("slow").is_some_and(|g| !g.members.is_empty()))
        .await
        .unwrap();
    let mut client = mesh.client().await;
    let mut request = send("slow", "work");
    request.configuration = Some(SendMessageConfiguration { return_immediately: true, ..Default::default() });
    let answer = client.send_message(request).await.unwrap().into_inner();
    let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("{answer:?}") };
    assert!(matches!(state(&task), TaskState::Submitted | TaskState::Working), "{task:?}");
    let mut updates = client
        .subscribe_to_task(a2a::SubscribeToTaskRequest { tenant: "slow".into(), id: task.id.clone() })
        .await
        .unwrap()
        .into_inner();
    eventually(Duration::from_secs(10), "the agent starts the work", || started.load(Ordering::SeqCst) == 1).await;
    let canceled = client
        .cancel_task(a2a::CancelTaskRequest { tenant: "slow".into(), id: task.id.clone(), metadata: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&canceled), TaskState::Canceled);
    eventually(Duration::from_secs(10), "the agent's handler is canceled", || dropped.load(Ordering::SeqCst)).await;
    let mut last = None;
    while let Some(event) = updates.message().await.unwrap() {
        last = event.payload;
    }
    let Some(stream_response::Payload::StatusUpdate(update)) = last else { panic!("last event: {last:?}") };
    assert_eq!(update.status.unwrap().state(), TaskState::Canceled);
    let got = client
        .get_task(a2a::GetTaskRequest { tenant: "slow".into(), id: task.id, history_length: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&got), TaskState::Canceled);
    assert_eq!(started.load(Ordering::SeqCst), 1, "executed once");
    mesh.stop(vec![slow]).await;
}

/// The Python with a2a-sdk printed by scripts/install-a2a-sdk.sh (run once per process).
pub(super) fn a2a_python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let script = repo().join("scripts/install-a2a-sdk.sh");
        let out = std::process::Command::new(&script).output().expect("run scripts/install-a2a-sdk.sh");
        assert!(out.status.success(), "scripts/install-a2a-sdk.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

pub(super) fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs tests/python/a2a_sdk_client.py against `base_url` with `binding`.
async fn python_client(base_url: String, binding: &'static str) -> serde_json::Value {
    let python = a2a_python().to_string();
    let script = repo().join("tests/python/a2a_sdk_client.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python).arg(script).arg(&base_url).arg(binding).output()
    })
    .await
    .unwrap()
    .expect("run the a2a-sdk client");
    assert!(
        out.status.success(),
        "the a2a-sdk client ({binding}) failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_official_a2a_sdk_talks_to_a_mesh_agent_over_both_bindings() {
    // Installed before the mesh starts, so a first install's time is not spent on timers.
    tokio::task::spawn_blocking(a2a_python).await.unwrap();
    let mesh = start().await;
    let base_url = format!("http://{}/agents/upper", mesh.a.a2a_addr().unwrap());
    for (binding, listed) in [("JSONRPC", 2), ("GRPC", 4)] {
        let out = python_client(base_url.clone(), binding).await;
        assert_eq!(out["card"]["name"], "upper", "{out}");
        assert_eq!(out["card"]["skills"][0]["id"], "text.upper");
        assert_eq!(
            out["stream"],
            serde_json::json!([
                {"kind": "task", "state": "TASK_STATE_SUBMITTED"},
                {"kind": "status", "state": "TASK_STATE_WORKING"},
                {"kind": "artifact", "text": "HELLO MESH"},
                {"kind": "status", "state": "TASK_STATE_COMPLETED"},
            ]),
            "{binding}: {out}"
        );
        assert_eq!(
            out["get_task"],
            serde_json::json!({"state": "TASK_STATE_COMPLETED", "context_id": "ctx-a2a-1", "artifact_text": "HELLO MESH", "history": 1}),
            "{binding}"
        );
        assert_eq!(
            out["blocking"],
            serde_json::json!([{"state": "TASK_STATE_COMPLETED", "text": "SECOND"}]),
            "{binding}"
        );
        assert_eq!(out["list_total"], listed, "{binding}: tasks on sidecar A so far");
        assert_eq!(out["cancel_done"], "TaskNotCancelableError", "{binding}");
        assert_eq!(out["extended_name"], "upper", "{binding}");
        // The last message carried no context id: the sidecar made one (a UUID) as the session id.
        assert_eq!(mesh.seen.lock().unwrap().session_id.len(), 36, "{binding}");
    }
    mesh.stop(vec![]).await;
}
