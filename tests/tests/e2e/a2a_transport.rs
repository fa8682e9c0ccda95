//! Transport A2A, end to end on a real etcd: an agent written with the official a2a-sdk's
//! server (gRPC binding, tests/python/a2a_sdk_agent.py) registers with sidecar B as
//! transport A2A; mesh calls (Invoke, InvokeStream) reach it as A2A `SendMessage`s, and its
//! answers come back as replies. A2A requests through sidecar A (the official a2a-sdk
//! client over both bindings, tests/python/a2a_sdk_transport.py) pass through to it
//! unchanged: its own task ids (prefixed with the owning instance), routed to the owner
//! among two instances, and the owner's death reported as its tasks failing.

use std::io::BufRead;
use std::time::Duration;

use agent_reach::Client;
use agent_reach::model::{HealthState, fixture};
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, RateLimit};
use agent_reach::proto;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, init_logging, sidecar_config, start_control, start_sidecar, wait_for_instances,
    wait_for_policy,
};
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::{
    self as a2a, Part, Role, SendMessageRequest, TaskState, part, send_message_response,
};
use futures_util::StreamExt;
use tonic::Code;
use tonic_types::StatusExt;

use super::a2a::{a2a_python, repo};

/// The a2a-sdk agent's process, killed when dropped.
struct PyAgent(std::process::Child);

impl Drop for PyAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts tests/python/a2a_sdk_agent.py; the process and its port.
async fn py_agent(name: &str) -> (PyAgent, u16) {
    py_agent_labelled(name, name).await
}

/// Starts tests/python/a2a_sdk_agent.py answering as `label`; the process and its port.
async fn py_agent_labelled(name: &str, label: &str) -> (PyAgent, u16) {
    let python = a2a_python().to_string();
    let script = repo().join("tests/python/a2a_sdk_agent.py");
    let (name, label) = (name.to_string(), label.to_string());
    tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(python)
            .arg(script)
            .arg(name)
            .arg(label)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the a2a-sdk agent");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the a2a-sdk agent printed {line:?}, not its port"));
        (PyAgent(child), port)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_a2a_sdk_server_is_a_mesh_agent_with_transport_a2a() {
    tokio::task::spawn_blocking(a2a_python).await.unwrap();
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let (_agent, port) = py_agent("pyupper").await;

    let on_b = Client::connect(&b.local_addr().to_string()).await.unwrap();
    let instance = on_b
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(
                fixture::registration("pyupper")
                    .version("1.0.0")
                    .capability("text.upper", &[])
                    .endpoint(&format!("http://127.0.0.1:{port}"))
                    .transport(agent_reach::model::Transport::A2a)
                    .proto_registration(),
            ),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .instance_id;
    // The agent does not speak the mesh's API: the test heartbeats for it.
    let mut raw = on_b.raw();
    let hb = instance.clone();
    let heartbeats = tokio::spawn(async move {
        loop {
            let _ = raw.heartbeat(proto::HeartbeatRequest { instance_id: hb.clone(), ..Default::default() }).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    wait_for_instances(&a, std::slice::from_ref(&instance)).await;

    // A mesh call: an A2A SendMessage at the agent; its task's artifact is the reply.
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let reply = client.invoke("text.upper").text("hello a2a").send().await.unwrap();
    assert_eq!(reply.text(), "HELLO A2A");
    assert_eq!(reply.instance(), instance);
    assert_eq!(reply.metadata()["a2a-task-id"].len(), 36, "the agent's task id (a UUID)");
    // A stream call: the reply as its one chunk.
    let chunks: Vec<String> = client
        .invoke("text.upper")
        .text("streamed")
        .send_stream()
        .await
        .unwrap()
        .map(|c| String::from_utf8(c.unwrap().payload.to_vec()).unwrap())
        .collect()
        .await;
    assert_eq!(chunks, ["STREAMED"]);
    // The agent's failed task is the call's error, with its text.
    let err = client.invoke("text.upper").text("fail").send().await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    assert!(err.message().contains("TASK_STATE_FAILED: asked to fail"), "{err}");

    // An A2A client on sidecar A reaches it through the mesh as well.
    let mut a2a_client = A2aServiceClient::connect(format!("http://{}", a.local_addr())).await.unwrap();
    let message = a2a::Message {
        message_id: "m-1".into(),
        role: Role::User as i32,
        parts: vec![Part { content: Some(part::Content::Text("hello again".into())), ..Default::default() }],
        ..Default::default()
    };
    let answer = a2a_client
        .send_message(SendMessageRequest { tenant: "pyupper".into(), message: Some(message), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("{answer:?}") };
    assert_eq!(task.status.as_ref().unwrap().state(), TaskState::Completed);
    assert_eq!(task.artifacts[0].parts[0].content, Some(part::Content::Text("HELLO AGAIN".into())));

    // Probed over gRPC (the a2a-sdk server answers UNIMPLEMENTED for health): stays UP.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(a.table().instances[&instance].instance.record.state, HealthState::Up);
    heartbeats.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// Registers the a2a-sdk agent on `port` with `sidecar` as an instance of `agent` with
/// transport A2A; its instance id and the task heartbeating for it (the agent does not
/// speak the mesh's API).
async fn register_a2a(
    sidecar: &agent_reach_sidecar::Sidecar,
    agent: &str,
    port: u16,
) -> (String, tokio::task::JoinHandle<()>) {
    let client = Client::connect(&sidecar.local_addr().to_string()).await.unwrap();
    let instance = client
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(
                fixture::registration(agent)
                    .version("1.0.0")
                    .capability("text.slow", &[])
                    .endpoint(&format!("http://127.0.0.1:{port}"))
                    .transport(agent_reach::model::Transport::A2a)
                    .proto_registration(),
            ),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .instance_id;
    let mut raw = client.raw();
    let id = instance.clone();
    let heartbeats = tokio::spawn(async move {
        loop {
            let _ = raw.heartbeat(proto::HeartbeatRequest { instance_id: id.clone(), ..Default::default() }).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (instance, heartbeats)
}

/// Runs tests/python/a2a_sdk_transport.py against `base_url` over `binding`.
async fn sdk_client(base_url: &str, binding: &str, args: &[&str]) -> serde_json::Value {
    let python = a2a_python().to_string();
    let script = repo().join("tests/python/a2a_sdk_transport.py");
    let mut command = std::process::Command::new(python);
    command.arg(script).arg(base_url).arg(binding).args(args);
    let out = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("run the a2a-sdk client");
    assert!(
        out.status.success(),
        "the a2a-sdk client ({binding} {args:?}) failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// The instance a task id (as the mesh shows it) names, checking the agent's own id is a UUID.
fn owner_of(id: &serde_json::Value) -> String {
    let id = id.as_str().unwrap_or_else(|| panic!("task id {id}"));
    let (instance, task) = id.split_once('~').unwrap_or_else(|| panic!("task id {id:?} names no instance"));
    assert_eq!(task.len(), 36, "the agent's own task id (a UUID) in {id:?}");
    instance.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_requests_pass_through_to_the_instance_owning_the_task() {
    tokio::task::spawn_blocking(a2a_python).await.unwrap();
    init_logging();
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.a2a_listen = Some("127.0.0.1:0".parse().unwrap());
    let a = start_sidecar(config).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let c = start_sidecar(sidecar_config(&control.endpoint(), "host-c")).await;
    // Two instances of one agent, on two sidecars, each answering with its label.
    let (agent_one, port_one) = py_agent_labelled("pyslow", "one").await;
    let (agent_two, port_two) = py_agent_labelled("pyslow", "two").await;
    let (one, beats_one) = register_a2a(&b, "pyslow", port_one).await;
    let (two, beats_two) = register_a2a(&c, "pyslow", port_two).await;
    wait_for_instances(&a, &[one.clone(), two.clone()]).await;
    let label = |instance: &str| if instance == one { "one" } else { "two" };
    let first = std::cmp::min(one.clone(), two.clone());
    let base_url = format!("http://{}/agents/pyslow", a.a2a_addr().unwrap());

    // Over each binding: stream, send non-blocking, get, subscribe and cancel, list, block.
    let mut tasks: Vec<String> = Vec::new();
    for binding in ["JSONRPC", "GRPC"] {
        let out = sdk_client(&base_url, binding, &["scenario"]).await;
        let stream = out["stream"].as_array().unwrap();
        let streamed = stream[0]["id"].clone();
        let owner = owner_of(&streamed);
        let kinds: Vec<(&str, &str)> =
            stream.iter().map(|e| (e["kind"].as_str().unwrap(), e["state"].as_str().unwrap_or(""))).collect();
        assert_eq!(
            kinds,
            [
                ("task", "TASK_STATE_SUBMITTED"),
                ("status", "TASK_STATE_WORKING"),
                ("artifact", ""),
                ("status", "TASK_STATE_COMPLETED")
            ],
            "{binding}: {out}"
        );
        assert!(stream.iter().all(|e| e["id"] == streamed), "{binding}: one task, its id owned: {out}");
        assert_eq!(stream[2]["text"], "HELLO STREAM");

        let slow = out["submitted"]["id"].clone();
        let slow_owner = owner_of(&slow);
        let at_once = out["submitted"]["state"].as_str().unwrap();
        assert!(matches!(at_once, "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING"), "{binding}: at once: {out}");
        assert_eq!(out["get_slow"]["state"], "TASK_STATE_WORKING", "{binding}: {out}");
        assert_eq!(
            out["get_slow"]["status_text"],
            format!("working at {}", label(&slow_owner)),
            "{binding}: the owner answered"
        );
        let subscribed = out["subscribed"].as_array().unwrap();
        assert_eq!(
            (subscribed[0]["kind"].as_str(), subscribed[0]["state"].as_str()),
            (Some("task"), Some("TASK_STATE_WORKING")),
            "{binding}: {out}"
        );
        let last = subscribed.last().unwrap();
        assert_eq!(
            (last["kind"].as_str(), last["state"].as_str()),
            (Some("status"), Some("TASK_STATE_CANCELED")),
            "{binding}: {out}"
        );
        assert!(subscribed.iter().all(|e| e["id"] == slow), "{binding}: {out}");
        assert_eq!(out["cancel"]["state"], "TASK_STATE_CANCELED", "{binding}: {out}");
        assert_eq!(out["get_canceled"]["state"], "TASK_STATE_CANCELED", "{binding}: {out}");

        assert_eq!(out["get_streamed"]["id"], streamed);
        assert_eq!(out["get_streamed"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(out["get_streamed"]["artifact_text"], "HELLO STREAM");
        assert_eq!(out["get_streamed"]["served_by"], label(&owner), "{binding}: the owner answered");

        tasks.push(streamed.as_str().unwrap().to_string());
        tasks.push(slow.as_str().unwrap().to_string());
        // ListTasks: every instance's tasks counted, the first page is the first instance's.
        assert_eq!(out["list"]["total"], tasks.len(), "{binding}: {out}");
        let mut of_first: Vec<&String> = tasks.iter().filter(|t| t.starts_with(&format!("{first}~"))).collect();
        of_first.sort();
        assert_eq!(out["list"]["ids"], serde_json::json!(of_first), "{binding}: {out}");
        assert_eq!(out["blocking"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(out["blocking"]["artifact_text"], "SECOND");
        tasks.push(out["blocking"]["id"].as_str().unwrap().to_string());
    }

    // Slow tasks on both instances; each GetTask lands on the task's owner, over both bindings.
    let mut slow: std::collections::BTreeMap<String, String> = Default::default();
    for _ in 0..5 {
        let out = sdk_client(&base_url, "JSONRPC", &["submit", "slow", "4"]).await;
        for id in out["ids"].as_array().unwrap() {
            slow.entry(owner_of(id)).or_insert_with(|| id.as_str().unwrap().to_string());
        }
        if slow.len() == 2 {
            break;
        }
    }
    assert_eq!(slow.keys().cloned().collect::<Vec<_>>(), {
        let mut both = vec![one.clone(), two.clone()];
        both.sort();
        both
    });
    for (owner, id) in &slow {
        for binding in ["JSONRPC", "GRPC"] {
            let got = sdk_client(&base_url, binding, &["get", id]).await;
            assert_eq!(got["state"], "TASK_STATE_WORKING", "{binding}: {got}");
            assert_eq!(got["status_text"], format!("working at {}", label(owner)), "{binding}: {got}");
        }
    }

    // Subscribed to a task of instance two when it dies: the stream ends with the task failed.
    let doomed = slow[&two].clone();
    let mut a2a_client = A2aServiceClient::connect(format!("http://{}", a.local_addr())).await.unwrap();
    let mut events = a2a_client
        .subscribe_to_task(a2a::SubscribeToTaskRequest { tenant: "pyslow".into(), id: doomed.clone() })
        .await
        .unwrap()
        .into_inner();
    let first_event = events.next().await.unwrap().unwrap();
    let Some(a2a::stream_response::Payload::Task(task)) = first_event.payload else { panic!("{first_event:?}") };
    assert_eq!((task.id.as_str(), task.status.unwrap().state()), (doomed.as_str(), TaskState::Working));
    beats_two.abort();
    drop(agent_two);
    let last =
        tokio::time::timeout(Duration::from_secs(20), events.next()).await.expect("the stream ends").unwrap().unwrap();
    let Some(a2a::stream_response::Payload::StatusUpdate(update)) = last.payload else { panic!("{last:?}") };
    let status = update.status.unwrap();
    assert_eq!((update.task_id.as_str(), status.state()), (doomed.as_str(), TaskState::Failed));
    let Some(part::Content::Text(why)) = &status.message.as_ref().unwrap().parts[0].content else {
        panic!("{status:?}")
    };
    assert!(why.starts_with(&format!("INSTANCE_LOST: instance {two} owning task {doomed} is gone: ")), "{why}");
    assert!(events.next().await.is_none(), "the stream ended");

    // GetTask of its task: failed, with the reason, over both bindings; instance one's task still works.
    for binding in ["JSONRPC", "GRPC"] {
        let got = sdk_client(&base_url, binding, &["get", &doomed]).await;
        assert_eq!(got["state"], "TASK_STATE_FAILED", "{binding}: {got}");
        assert_eq!(got["reason"], "INSTANCE_LOST", "{binding}: {got}");
        let text = got["status_text"].as_str().unwrap();
        assert!(
            text.starts_with(&format!("INSTANCE_LOST: instance {two} owning task {doomed} is gone: ")),
            "{binding}: {text}"
        );
        let alive = sdk_client(&base_url, binding, &["get", &slow[&one]]).await;
        assert_eq!(alive["state"], "TASK_STATE_WORKING", "{binding}: {alive}");
    }
    // Deregistered, the same, saying so.
    let on_c = Client::connect(&c.local_addr().to_string()).await.unwrap();
    // (Sidecar C may have dropped the dead instance already: its probes failed.)
    if let Err(e) = on_c.raw().deregister(proto::DeregisterRequest { instance_id: two.clone() }).await {
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
    }
    a.wait_for_table(Duration::from_secs(10), |t| !t.instances.contains_key(&two))
        .await
        .expect("instance two leaves A's table");
    let got = sdk_client(&base_url, "GRPC", &["get", &doomed]).await;
    assert_eq!(got["state"], "TASK_STATE_FAILED", "{got}");
    assert_eq!(
        got["status_text"],
        format!(
            "INSTANCE_LOST: instance {two} owning task {doomed} is gone: instance {two} is not registered any more (it deregistered, or its lease expired)"
        )
    );

    // Governance as for any call: a rate limit on the agent refuses the third GetTask.
    let policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "pyslow".into(),
        spec: PolicySpec { rate_limit: Some(RateLimit { per_second: 0.01, burst: 2 }), ..Default::default() },
        description: String::new(),
    };
    let mut admin = admin_client(&control.endpoint()).await;
    admin
        .put_policy(proto::PutPolicyRequest { policy: Some(agent_reach::convert::policy_to_proto(&policy, 0)) })
        .await
        .unwrap();
    wait_for_policy(&[&a], &policy).await;
    let get = a2a::GetTaskRequest { tenant: "pyslow".into(), id: slow[&one].clone(), history_length: None };
    for _ in 0..2 {
        let task = a2a_client.get_task(get.clone()).await.unwrap().into_inner();
        assert_eq!(task.status.unwrap().state(), TaskState::Working);
    }
    let refused = a2a_client.get_task(get).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.get_details_error_info().unwrap().reason, "RATE_LIMITED");

    beats_one.abort();
    drop(agent_one);
    a.stop().await;
    b.stop().await;
    c.stop().await;
    control.shutdown().await;
}
