//! Transport A2A, end to end on a real etcd: an agent written with the official a2a-sdk's
//! server (gRPC binding, tests/python/a2a_sdk_agent.py) registers with sidecar B as
//! transport A2A; mesh calls (Invoke, InvokeStream) and A2A messages through sidecar A
//! reach it as A2A `SendMessage`s, and its answers come back as replies.

use std::io::BufRead;
use std::time::Duration;

use agent_reach::Client;
use agent_reach::model::{HealthState, fixture};
use agent_reach::proto;
use agent_reach_e2e::{
    Backend, TestStore, init_logging, sidecar_config, start_control, start_sidecar, wait_for_instances,
};
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::{
    self as a2a, Part, Role, SendMessageRequest, TaskState, part, send_message_response,
};
use futures_util::StreamExt;
use tonic::Code;

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
    let python = a2a_python().to_string();
    let script = repo().join("tests/python/a2a_sdk_agent.py");
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(python)
            .arg(script)
            .arg(name)
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
