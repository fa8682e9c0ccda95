//! A2A `SendMessage` (blocking) through two sidecars against a plain `Invoke`, measured end
//! to end: a real etcd, control, a caller sidecar A and a target sidecar B with two agents
//! answering their text in upper case: a Rust SDK agent (`upper`) and a minimal A2A gRPC
//! server registered with transport A2A (`a2aupper`). Closed loop, one call at a time, the
//! four kinds interleaved:
//!
//! - `Invoke upper`: the plain mesh call;
//! - `A2A SendMessage upper`: an A2A message to the SDK agent (it becomes a mesh call);
//! - `Invoke a2aupper`: a mesh call the target's sidecar turns into a blocking `SendMessage`;
//! - `A2A SendMessage a2aupper`: the A2A request passed through unchanged;
//! - `Invoke upper, session`: the plain call with a session id (an A2A message to a plain
//!   agent carries its `context_id` as the session id, and the target's sidecar fetches the
//!   session's context before delivering it).
//!
//! Prints p50/p99 of each and the added latency of the A2A kinds over `Invoke upper`.
//!
//! `cargo run --release -p agent-reach-e2e --example a2a_bench -- [calls]` (default 2000).

use std::pin::Pin;
use std::time::{Duration, Instant};

use agent_reach::model::{Transport, fixture};
use agent_reach::{Agent, Client, Reply, proto};
use agent_reach_e2e::{Backend, TestStore, listener, sidecar_config, start_control, start_sidecar, wait_for_instances};
use agent_reach_sidecar::a2a::proto::a2a_service_client::A2aServiceClient;
use agent_reach_sidecar::a2a::proto::a2a_service_server::{A2aService, A2aServiceServer};
use agent_reach_sidecar::a2a::proto::{self as a2a, Part, Role, SendMessageRequest, part, send_message_response};
use futures_util::Stream;
use tonic::{Request, Response, Status};

/// A minimal A2A agent: every message's text, upper-cased, as the artifact of a completed task.
struct UpperA2a;

type Events = Pin<Box<dyn Stream<Item = Result<a2a::StreamResponse, Status>> + Send>>;

/// This agent completes every task within the call and keeps none: a task id it is asked
/// about is one it does not know (A2A's TaskNotFoundError).
fn no_such_task<T>(id: &str) -> Result<T, Status> {
    Err(Status::not_found(format!("task {id:?} not found: this agent completes each task in its call and keeps none")))
}

/// A2A's PushNotificationNotSupportedError: the agent's card offers no push notifications.
fn no_push<T>() -> Result<T, Status> {
    Err(Status::failed_precondition("push notifications are not supported by this agent (its card says so)"))
}

/// The completed task answering `message`: its text upper-cased as the artifact.
fn upper_task(message: a2a::Message) -> a2a::Task {
    let text = match message.parts.first().and_then(|p| p.content.as_ref()) {
        Some(part::Content::Text(t)) => t.to_uppercase(),
        _ => String::new(),
    };
    a2a::Task {
        id: format!("t-{:032x}", rand::random::<u128>()),
        context_id: message.context_id,
        status: Some(a2a::TaskStatus { state: a2a::TaskState::Completed as i32, ..Default::default() }),
        artifacts: vec![a2a::Artifact {
            artifact_id: "upper".into(),
            parts: vec![Part { content: Some(part::Content::Text(text)), ..Default::default() }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tonic::async_trait]
impl A2aService for UpperA2a {
    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<a2a::SendMessageResponse>, Status> {
        let task = upper_task(request.into_inner().message.unwrap_or_default());
        Ok(Response::new(a2a::SendMessageResponse { payload: Some(send_message_response::Payload::Task(task)) }))
    }

    type SendStreamingMessageStream = Events;

    async fn send_streaming_message(&self, request: Request<SendMessageRequest>) -> Result<Response<Events>, Status> {
        let task = upper_task(request.into_inner().message.unwrap_or_default());
        let event = a2a::StreamResponse { payload: Some(a2a::stream_response::Payload::Task(task)) };
        Ok(Response::new(Box::pin(futures_util::stream::iter([Ok(event)]))))
    }

    async fn get_task(&self, request: Request<a2a::GetTaskRequest>) -> Result<Response<a2a::Task>, Status> {
        no_such_task(&request.into_inner().id)
    }

    async fn list_tasks(&self, _: Request<a2a::ListTasksRequest>) -> Result<Response<a2a::ListTasksResponse>, Status> {
        Ok(Response::new(a2a::ListTasksResponse::default()))
    }

    async fn cancel_task(&self, request: Request<a2a::CancelTaskRequest>) -> Result<Response<a2a::Task>, Status> {
        no_such_task(&request.into_inner().id)
    }

    type SubscribeToTaskStream = Events;

    async fn subscribe_to_task(
        &self,
        request: Request<a2a::SubscribeToTaskRequest>,
    ) -> Result<Response<Events>, Status> {
        no_such_task(&request.into_inner().id)
    }

    async fn create_task_push_notification_config(
        &self,
        _: Request<a2a::TaskPushNotificationConfig>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        no_push()
    }

    async fn get_task_push_notification_config(
        &self,
        _: Request<a2a::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        no_push()
    }

    async fn list_task_push_notification_configs(
        &self,
        _: Request<a2a::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<a2a::ListTaskPushNotificationConfigsResponse>, Status> {
        no_push()
    }

    async fn get_extended_agent_card(
        &self,
        _: Request<a2a::GetExtendedAgentCardRequest>,
    ) -> Result<Response<a2a::AgentCard>, Status> {
        Ok(Response::new(a2a::AgentCard {
            name: "a2aupper".into(),
            description: "answers every message with its text upper-cased".into(),
            version: "1.0.0".into(),
            ..Default::default()
        }))
    }

    async fn delete_task_push_notification_config(
        &self,
        _: Request<a2a::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pbjson_types::Empty>, Status> {
        no_push()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn message(text: &str) -> SendMessageRequest {
    SendMessageRequest {
        tenant: String::new(),
        message: Some(a2a::Message {
            message_id: format!("m-{:032x}", rand::random::<u128>()),
            role: Role::User as i32,
            parts: vec![Part { content: Some(part::Content::Text(text.into())), ..Default::default() }],
            ..Default::default()
        }),
        configuration: None,
        metadata: None,
    }
}

fn completed_text(answer: a2a::SendMessageResponse) -> String {
    let Some(send_message_response::Payload::Task(task)) = answer.payload else { panic!("no task: {answer:?}") };
    assert_eq!(task.status.unwrap().state(), a2a::TaskState::Completed);
    match &task.artifacts[0].parts[0].content {
        Some(part::Content::Text(t)) => t.clone(),
        other => panic!("artifact {other:?}"),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let calls: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let store = TestStore::start(Backend::Etcd).await;
    let control = start_control(store.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "caller")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "target")).await;

    let agent = Agent::builder("upper")
        .sidecar(b.local_addr().to_string())
        .capability("text.upper", Vec::<String>::new())
        .handle("text.upper", |call| async move { Ok(Reply::text(call.text()?.to_uppercase())) })
        .start()
        .await
        .expect("agent");

    let a2a_listener = listener().await;
    let port = a2a_listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(A2aServiceServer::new(UpperA2a))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(a2a_listener)),
    );
    let on_b = Client::connect(&b.local_addr().to_string()).await.unwrap();
    let a2a_instance = on_b
        .raw()
        .register(proto::RegisterRequest {
            registration: Some(
                fixture::registration("a2aupper")
                    .version("1.0.0")
                    .capability("text.upper.a2a", &[])
                    .endpoint(&format!("http://127.0.0.1:{port}"))
                    .transport(Transport::A2a)
                    .proto_registration(),
            ),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .instance_id;
    let mut raw = on_b.raw();
    let id = a2a_instance.clone();
    tokio::spawn(async move {
        loop {
            let _ = raw.heartbeat(proto::HeartbeatRequest { instance_id: id.clone(), ..Default::default() }).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    wait_for_instances(&a, &[agent.instance_id(), a2a_instance]).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let mut a2a_client = A2aServiceClient::connect(format!("http://{}", a.local_addr())).await.unwrap();
    let names = [
        "Invoke upper",
        "A2A SendMessage upper",
        "Invoke a2aupper",
        "A2A SendMessage a2aupper",
        "Invoke upper, session",
    ];
    let mut times: [Vec<Duration>; 5] = Default::default();
    let warmup = calls / 10;
    for i in 0..warmup + calls {
        for (kind, samples) in times.iter_mut().enumerate() {
            let started = Instant::now();
            let text = match kind {
                0 => client.invoke_agent("upper").text("hello").send().await.unwrap().text().to_string(),
                2 => client.invoke_agent("a2aupper").text("hello").send().await.unwrap().text().to_string(),
                4 => client
                    .invoke_agent("upper")
                    .session("bench-ctx")
                    .text("hello")
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .to_string(),
                k => {
                    let mut req = message("hello");
                    req.tenant = if k == 1 { "upper" } else { "a2aupper" }.into();
                    completed_text(a2a_client.send_message(req).await.unwrap().into_inner())
                }
            };
            let took = started.elapsed();
            assert_eq!(text, "HELLO", "{}", names[kind]);
            if i >= warmup {
                samples.push(took);
            }
        }
    }
    println!("{calls} calls of each kind, sequential, interleaved (after {warmup} of each to warm up):");
    let mut p50 = [0.0; 5];
    let mut p99 = [0.0; 5];
    for (k, samples) in times.iter_mut().enumerate() {
        samples.sort();
        p50[k] = ms(percentile(samples, 0.5));
        p99[k] = ms(percentile(samples, 0.99));
        println!("  {:<26} p50 {:.3} ms  p99 {:.3} ms", names[k], p50[k], p99[k]);
    }
    for k in [1, 3, 4] {
        println!(
            "  added over Invoke upper by {:<26} p50 {:+.3} ms  p99 {:+.3} ms",
            names[k],
            p50[k] - p50[0],
            p99[k] - p99[0]
        );
    }
    println!(
        "  pass-through over the converted call (A2A SendMessage a2aupper - Invoke a2aupper): p50 {:+.3} ms  p99 {:+.3} ms",
        p50[3] - p50[2],
        p99[3] - p99[2]
    );
    println!(
        "  A2A SendMessage upper over Invoke upper, session: p50 {:+.3} ms  p99 {:+.3} ms",
        p50[1] - p50[4],
        p99[1] - p99[4]
    );
    agent.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
