//! Prewarms that would fetch nothing are not made: a call carrying a session that does not
//! exist is delivered after one fetch (which finds it absent) and the next ones within 5 s
//! without a fetch; an A2A message without a `context_id` (its context id made by the
//! caller's sidecar, so no context exists) without any. A session written meanwhile is
//! still read right by the agent (from control: a cache miss). Real etcd.

use std::sync::atomic::Ordering;

use agent_reach::{Agent, Client, HandlerError, Reply};
use agent_reach_e2e::{sidecar_config, start_sidecar, wait_for_instances};
use agent_reach_sidecar::Sidecar;
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::{self as a2a, Part, Role, SendMessageRequest, part, send_message_response};

use crate::sessions::{Mesh, Sessions};

/// (prewarms, prewarms skipped) of `sidecar`.
fn prewarms(sidecar: &Sidecar) -> (u64, u64) {
    let s = sidecar.session_stats();
    (s.prewarms.load(Ordering::Relaxed), s.prewarms_skipped_absent.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_that_do_not_exist_are_not_fetched_before_every_call() {
    let mut mesh = Mesh::start(Sessions::Etcd, 1).await;
    mesh.sidecars.push(start_sidecar(sidecar_config(&mesh.control.endpoint(), "target")).await);
    let (caller, target) = (&mesh.sidecars[0], &mesh.sidecars[1]);
    // Answers the call's session's `note` field ("-" when there is none).
    let reader = Agent::builder("reader")
        .sidecar(target.local_addr().to_string())
        .capability("read.note", Vec::<String>::new())
        .handle("read.note", |call| async move {
            let note = call.session().get("note").await.map_err(|e| HandlerError::new(e.code(), e.to_string()))?;
            Ok(Reply::text(note.map_or("-".into(), |f| String::from_utf8_lossy(&f.value).into_owned())))
        })
        .start()
        .await
        .expect("reader agent");
    let writer = agent_reach_e2e::echo_agent(caller.local_addr(), "writer", &[("write.it", &[])]).await;
    wait_for_instances(caller, &[reader.instance_id(), writer.instance_id()]).await;
    let client = Client::connect(&caller.local_addr().to_string()).await.unwrap();

    // Three calls with a session nobody wrote: one fetch (absent), then none.
    let start = prewarms(target);
    for _ in 0..3 {
        let reply = client.invoke("read.note").session("sticky-only").text("x").send().await.expect("call");
        assert_eq!(reply.text(), "-");
        assert!(reply.metadata().get(agent_reach::headers::SESSION_PREWARMED).is_none());
    }
    assert_eq!(prewarms(target), (start.0 + 1, start.1 + 2), "one fetch, two skipped");

    // Written through another sidecar within the 5 s: not prewarmed, but read right.
    writer.client().session("sticky-only").put([("note", "now there", agent_reach::Policy::LastWriter)]).await.unwrap();
    let reply = client.invoke("read.note").session("sticky-only").text("x").send().await.expect("call");
    assert_eq!(reply.text(), "now there");
    assert_eq!(prewarms(target), (start.0 + 1, start.1 + 3));

    // An A2A message without a context_id: a new session, not fetched at all.
    let mut a2a_client = A2aServiceClient::connect(format!("http://{}", caller.local_addr())).await.unwrap();
    let message = a2a::Message {
        message_id: "m-1".into(),
        role: Role::User as i32,
        parts: vec![Part { content: Some(part::Content::Text("hello".into())), ..Default::default() }],
        ..Default::default()
    };
    let answer = a2a_client
        .send_message(SendMessageRequest { tenant: "reader".into(), message: Some(message), ..Default::default() })
        .await
        .expect("A2A message")
        .into_inner();
    let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("{answer:?}") };
    assert!(!task.context_id.is_empty());
    assert_eq!(task.artifacts[0].parts[0].content, Some(part::Content::Text("-".into())));
    assert_eq!(prewarms(target), (start.0 + 1, start.1 + 4), "the new context was not fetched");

    mesh.stop(vec![reader, writer]).await;
}
