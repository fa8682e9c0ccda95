//! A2A (Agent2Agent protocol v1.0, `lf.a2a.v1`) on the sidecar: every mesh agent is an A2A
//! agent to any A2A client on this host. The gRPC binding (`lf.a2a.v1.A2AService`) is
//! served on the local API port ([`grpc`]) and the JSON-RPC binding with SSE streaming on a
//! local HTTP port ([`jsonrpc`]). The A2A `tenant` field names the mesh agent within the
//! sidecar's tenant; each agent of the routing table has an agent card ([`card`]).
//!
//! A message becomes a mesh call (`Invoke` through the outbound stack, so rate limits,
//! priorities, breakers, retries and trace context apply as to any call): its single part is
//! the payload (text, bytes or JSON; a message of several parts travels as its A2A JSON),
//! the A2A `context_id` is the mesh session id, and the reply becomes the artifact of the
//! task, which completes, or fails with the mesh's reason. A blocking or streaming send's
//! task is kept in memory on this sidecar ([`tasks`]); a message sent with
//! `return_immediately` is a durable mesh task ([`durable`]), readable from any sidecar of
//! the tenant and across restarts. `GetTask`, `ListTasks`, `CancelTask` and
//! `SubscribeToTask` answer both kinds.
//!
//! An agent that is itself an A2A server (registered with transport A2A) gets every request
//! unchanged instead ([`forward`]): its own tasks, their ids prefixed with the owning
//! instance ([`owned`]), each request naming a task routed to that instance.

pub(crate) mod card;
mod durable;
mod error;
mod forward;
pub(crate) use crate::a2a_wire::{part_of, parts_of_payload, payload_of};
pub(crate) mod grpc;
pub(crate) mod jsonrpc;
mod owned;
mod tasks;

pub use crate::a2a_wire::proto;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_reach::proto as mesh;
use agent_reach_routing::TableHandle;
use bytes::Bytes;
use futures_util::Stream;
use http::HeaderMap;
use prost::Message as _;
use tonic::Status;

pub(crate) use error::A2aError;
use proto::{
    Artifact, Message, Part, Role, SendMessageRequest, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent, part, stream_response,
};
use tasks::{Tasks, is_terminal, state_of};

use crate::call::Shape;
use crate::grpc::header;
use crate::outbound::invoke::{InvokeEntry, read_reply};

pub use crate::a2a_wire::A2A_MESSAGE_CONTENT_TYPE;
/// Request metadata key that sets the mesh priority of the call ("high", "normal", "low").
pub const PRIORITY_METADATA_KEY: &str = "agentreach.priority";

/// What the A2A endpoints share.
pub(crate) struct A2a {
    tenant: String,
    table: TableHandle,
    invoke: InvokeEntry,
    tasks: Tasks,
    /// The mesh's durable tasks.
    durable: Arc<crate::tasks::Tasks>,
    /// Largest answer read back from the mesh (the payload limit plus the envelope).
    reply_limit: usize,
    /// The interfaces an agent card lists: the local gRPC address, the JSON-RPC base URL.
    grpc_address: String,
    jsonrpc_url: Option<String>,
}

/// A message checked and turned into a mesh call.
struct Prepared {
    agent: String,
    task: Task,
    invoke: mesh::InvokeRequest,
    /// The message came without a `context_id`: this sidecar made it, so the session is new.
    new_context: bool,
}

impl A2a {
    /// `SendMessage`: the call's answer as a completed task, or (with `return_immediately`)
    /// the durable task at once. A call the mesh refuses or that fails answers the mesh's
    /// error. A message naming a task answers that task.
    pub(crate) async fn send(
        self: &Arc<Self>,
        req: SendMessageRequest,
        headers: HeaderMap,
    ) -> Result<proto::SendMessageResponse, A2aError> {
        let immediately = req.configuration.as_ref().is_some_and(|c| c.return_immediately);
        let history_length = req.configuration.as_ref().and_then(|c| c.history_length);
        if self.passes_through(&req.tenant) {
            return self.pass_send(req, headers).await;
        }
        let respond = |task| proto::SendMessageResponse {
            payload: Some(proto::send_message_response::Payload::Task(trim_history(task, history_length))),
        };
        if let Some(message) = req.message.as_ref().filter(|m| !m.task_id.is_empty()) {
            return Ok(respond(self.continue_task(&req.tenant, message.clone(), immediately).await?));
        }
        let prepared = self.prepare(req)?;
        if immediately {
            return Ok(respond(self.submit_durable(prepared).await?));
        }
        let id = prepared.task.id.clone();
        let (_, _, call) = self.start(prepared, headers)?;
        // Until the call ends; a cancel ends it too (the task then says canceled).
        if let Ok(Some(failure)) = call.await {
            return Err(A2aError::Mesh(failure));
        }
        Ok(respond(self.tasks.get(&id, "")?))
    }

    /// `SendStreamingMessage`: the task, then its status and artifact updates until it ends.
    /// A message answering a durable task follows that task.
    pub(crate) async fn send_streaming(
        self: &Arc<Self>,
        req: SendMessageRequest,
        headers: HeaderMap,
    ) -> Result<std::pin::Pin<Box<dyn Stream<Item = StreamResponse> + Send>>, A2aError> {
        if self.passes_through(&req.tenant) {
            return self.pass_send_streaming(req, headers).await;
        }
        if let Some(message) = req.message.as_ref().filter(|m| !m.task_id.is_empty()) {
            let answered = self.answer_named(&req.tenant, message).await?;
            return self.follow_durable(answered).await;
        }
        let prepared = self.prepare(req)?;
        let (task, events, _) = self.start(prepared, headers)?;
        Ok(Box::pin(follow(task, events)))
    }

    /// `ListTasks` (this sidecar's direct calls and the durable tasks): newest first,
    /// `page_size` (default 50, at most 100) per page; the page token is the offset of the page.
    /// `ListTasks` of an A2A agent's is its instances' ([`forward`]).
    pub(crate) async fn list_tasks(
        &self,
        req: proto::ListTasksRequest,
        headers: HeaderMap,
    ) -> Result<proto::ListTasksResponse, A2aError> {
        if self.passes_through(&req.tenant) {
            return self.pass_list(req, headers).await;
        }
        let page_size = match req.page_size {
            None => 50,
            Some(n) if (1..=100).contains(&n) => n as usize,
            Some(n) => return Err(A2aError::InvalidParams(format!("page_size {n} is not within 1..=100"))),
        };
        let offset = match req.page_token.as_str() {
            "" => 0,
            t => t.parse::<usize>().map_err(|_| A2aError::InvalidParams(format!("page_token {t:?} is not valid")))?,
        };
        let state = match req.status() {
            TaskState::Unspecified => None,
            s => Some(s),
        };
        let after = req.status_timestamp_after.map(|t| (t.seconds, t.nanos));
        let mut all = self.tasks.list(&req.tenant, &req.context_id, state);
        all.extend(self.list_durable(&req.tenant, &req.context_id, state).await?);
        all.sort_by_key(|t| std::cmp::Reverse(t.0));
        let all: Vec<Task> = all
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| match (after, t.status.as_ref().and_then(|s| s.timestamp.as_ref())) {
                (Some(after), Some(ts)) => (ts.seconds, ts.nanos) >= after,
                (Some(_), None) => false,
                (None, _) => true,
            })
            .collect();
        let total = all.len();
        let include_artifacts = req.include_artifacts.unwrap_or(false);
        let tasks: Vec<Task> = all
            .into_iter()
            .skip(offset)
            .take(page_size)
            .map(|mut t| {
                if !include_artifacts {
                    t.artifacts.clear();
                }
                trim_history(t, req.history_length)
            })
            .collect();
        let next = offset + tasks.len();
        Ok(proto::ListTasksResponse {
            next_page_token: if next < total { next.to_string() } else { String::new() },
            page_size: page_size as i32,
            total_size: total as i32,
            tasks,
        })
    }

    /// Cancels a direct call's task (the agent's handler sees the call canceled).
    fn cancel_direct(&self, req: &proto::CancelTaskRequest) -> Result<Task, A2aError> {
        let call = self.tasks.take_call(&req.id, &req.tenant)?;
        if let Some(call) = call {
            call.abort();
        }
        let task = self.tasks.get(&req.id, &req.tenant)?;
        let event = status_event(&task, TaskState::Canceled, Some(agent_text(&task, "canceled by the client")), None);
        self.tasks.apply(&req.id, event);
        self.tasks.get(&req.id, &req.tenant)
    }

    /// Follows a direct call's task: the task, then its updates until it ends.
    fn subscribe_direct(
        &self,
        req: &proto::SubscribeToTaskRequest,
    ) -> Result<impl Stream<Item = StreamResponse> + Send + 'static, A2aError> {
        let (task, events) = self.tasks.subscribe(&req.id, &req.tenant)?;
        let state = state_of(&task);
        if is_terminal(state) {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {:?} is already {}; get it with GetTask",
                req.id,
                state.as_str_name()
            )));
        }
        Ok(follow(task, events))
    }

    /// Checks a message and makes its mesh call and its task.
    fn prepare(&self, req: SendMessageRequest) -> Result<Prepared, A2aError> {
        let agent = req.tenant.clone();
        if agent.is_empty() {
            return Err(A2aError::InvalidParams(
                "tenant must name the mesh agent (see the interfaces of the agent's card)".into(),
            ));
        }
        let Some(mut message) = req.message else {
            return Err(A2aError::InvalidParams("message is required".into()));
        };
        if message.message_id.is_empty() {
            return Err(A2aError::InvalidParams("message.message_id is required".into()));
        }
        let new_context = message.context_id.is_empty();
        if new_context {
            message.context_id = new_id();
        }
        let (payload, content_type) = payload_of(&message)?;
        let priority = priority_of(req.metadata.as_ref())?;
        let id = new_id();
        let metadata = HashMap::from([
            ("a2a-task-id".to_string(), id.clone()),
            ("a2a-message-id".to_string(), message.message_id.clone()),
        ]);
        let invoke = mesh::InvokeRequest {
            target: Some(mesh::Target { kind: Some(mesh::target::Kind::Agent(agent.clone())), tags: vec![] }),
            payload,
            content_type,
            session_id: message.context_id.clone(),
            priority: priority as i32,
            metadata,
            ..Default::default()
        };
        let task = Task {
            id,
            context_id: message.context_id.clone(),
            status: Some(TaskStatus { state: TaskState::Submitted as i32, message: None, timestamp: Some(now()) }),
            artifacts: vec![],
            history: vec![message],
            metadata: None,
        };
        Ok(Prepared { agent, task, invoke, new_context })
    }

    /// Stores the task and starts its call; the task as stored and a receiver of its events.
    fn start(
        self: &Arc<Self>,
        p: Prepared,
        mut headers: HeaderMap,
    ) -> Result<(Task, tokio::sync::broadcast::Receiver<StreamResponse>, Call), A2aError> {
        if p.new_context {
            // The target's sidecar need not fetch a session nobody wrote yet.
            headers.insert(header::SESSION_NEW, http::HeaderValue::from_static("1"));
        }
        let id = p.task.id.clone();
        self.tasks.insert(&p.agent, p.task.clone())?;
        let (task, events) = self.tasks.subscribe(&id, &p.agent)?;
        let this = self.clone();
        let call = tokio::spawn(async move { this.run(p.task, p.invoke, headers).await });
        self.tasks.set_call(&id, call.abort_handle());
        Ok((task, events, call))
    }

    /// The task's call: working, then the reply as its artifact and completed, or failed
    /// with the mesh's reason (returned too).
    async fn run(&self, task: Task, invoke: mesh::InvokeRequest, headers: HeaderMap) -> Option<Status> {
        self.tasks.apply(&task.id, status_event(&task, TaskState::Working, None, None));
        let resp = self.invoke.call(Bytes::from(invoke.encode_to_vec()), headers, Shape::Unary).await;
        match read_reply(resp, self.reply_limit).await {
            Ok(reply) => {
                let artifact = Artifact {
                    artifact_id: format!("{}-reply", task.id),
                    name: "reply".into(),
                    description: format!("the answer of agent {} (instance {})", reply.agent, reply.instance_id),
                    parts: vec![part_of(reply.payload, &reply.content_type)],
                    metadata: None,
                    extensions: vec![],
                };
                let update = StreamResponse {
                    payload: Some(stream_response::Payload::ArtifactUpdate(TaskArtifactUpdateEvent {
                        task_id: task.id.clone(),
                        context_id: task.context_id.clone(),
                        artifact: Some(artifact),
                        append: false,
                        last_chunk: true,
                        metadata: None,
                    })),
                };
                self.tasks.apply(&task.id, update);
                self.tasks.apply(&task.id, status_event(&task, TaskState::Completed, None, None));
                None
            }
            Err(status) => {
                let text = match agent_reach::reason::error_info(&status) {
                    Some(info) => format!("{}: {}", info.reason, status.message()),
                    None => format!("{:?}: {}", status.code(), status.message()),
                };
                let message = agent_text(&task, &text);
                self.tasks.apply(&task.id, status_event(&task, TaskState::Failed, Some(message), Some(&status)));
                Some(status)
            }
        }
    }

    /// The mesh tenant the sidecar serves.
    pub(crate) fn tenant(&self) -> &str {
        &self.tenant
    }
}

/// The mesh priority a request's metadata asks for ([`PRIORITY_METADATA_KEY`]).
fn priority_of(metadata: Option<&pbjson_types::Struct>) -> Result<mesh::Priority, A2aError> {
    let asked = metadata.and_then(|m| m.fields.get(PRIORITY_METADATA_KEY)).and_then(|v| match &v.kind {
        Some(pbjson_types::value::Kind::StringValue(s)) => Some(s.to_ascii_lowercase()),
        _ => None,
    });
    match asked.as_deref() {
        None | Some("normal") => Ok(mesh::Priority::Normal),
        Some("high") => Ok(mesh::Priority::High),
        Some("low") => Ok(mesh::Priority::Low),
        Some(other) => Err(A2aError::InvalidParams(format!(
            "metadata {PRIORITY_METADATA_KEY} {other:?} is not high, normal or low"
        ))),
    }
}

/// The task first, then its events until one ends it.
fn follow(
    task: Task,
    events: tokio::sync::broadcast::Receiver<StreamResponse>,
) -> impl Stream<Item = StreamResponse> + Send + 'static {
    let first = StreamResponse { payload: Some(stream_response::Payload::Task(task)) };
    let rest = futures_util::stream::unfold((events, false), |(mut events, done)| async move {
        if done {
            return None;
        }
        loop {
            match events.recv().await {
                Ok(e) => {
                    let end = ends(&e);
                    return Some((e, (events, end)));
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    futures_util::StreamExt::chain(futures_util::stream::once(async move { first }), rest)
}

/// Whether the event ends its task.
fn ends(e: &StreamResponse) -> bool {
    match &e.payload {
        Some(stream_response::Payload::StatusUpdate(u)) => u.status.as_ref().is_some_and(|s| is_terminal(s.state())),
        Some(stream_response::Payload::Task(t)) => is_terminal(state_of(t)),
        _ => false,
    }
}

/// A status update of `task`; a failure carries the mesh's reason in its metadata.
fn status_event(task: &Task, state: TaskState, message: Option<Message>, failure: Option<&Status>) -> StreamResponse {
    let metadata = failure.map(|status| {
        let mut fields = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: String| {
            fields.insert(k.to_string(), pbjson_types::Value { kind: Some(pbjson_types::value::Kind::StringValue(v)) });
        };
        put("grpcCode", format!("{:?}", status.code()));
        put("message", status.message().to_string());
        if let Some(info) = agent_reach::reason::error_info(status) {
            put("reason", info.reason);
            put("domain", info.domain);
        }
        pbjson_types::Struct { fields: fields.into_iter().collect() }
    });
    StreamResponse {
        payload: Some(stream_response::Payload::StatusUpdate(TaskStatusUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            status: Some(TaskStatus { state: state as i32, message, timestamp: Some(now()) }),
            metadata,
        })),
    }
}

/// An agent message of one text part about `task`.
fn agent_text(task: &Task, text: &str) -> Message {
    Message {
        message_id: new_id(),
        context_id: task.context_id.clone(),
        task_id: task.id.clone(),
        role: Role::Agent as i32,
        parts: vec![Part { content: Some(part::Content::Text(text.to_string())), ..Default::default() }],
        ..Default::default()
    }
}

/// Keeps the last `history_length` messages of the task's history.
fn trim_history(mut task: Task, history_length: Option<i32>) -> Task {
    if let Some(n) = history_length {
        let keep = n.max(0) as usize;
        let len = task.history.len();
        if len > keep {
            task.history.drain(..len - keep);
        }
    }
    task
}

/// A random id in the form of a UUID (version 4).
fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("{}-{}-4{}-{:x}{}-{}", h(0..4), h(4..6), &h(6..8)[1..], 8 | (b[8] & 0x3), &h(8..10)[1..], h(10..16))
}

fn now() -> pbjson_types::Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    pbjson_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// A task's call: its failure, if it failed.
type Call = tokio::task::JoinHandle<Option<Status>>;

/// Starts the A2A endpoints of a sidecar: binds the JSON-RPC port (when configured) and
/// spawns its server on `tasks`; returns the gRPC service for the local API port and the
/// JSON-RPC port's address.
pub(crate) async fn start(
    config: &crate::config::SidecarConfig,
    table: TableHandle,
    invoke: InvokeEntry,
    durable: Arc<crate::tasks::Tasks>,
    local_addr: std::net::SocketAddr,
    shutdown: tokio::sync::watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<(grpc::Server, Option<std::net::SocketAddr>)> {
    let listener = match config.a2a_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    let jsonrpc_addr = listener.as_ref().map(tokio::net::TcpListener::local_addr).transpose()?;
    let loopback = |a: std::net::SocketAddr| {
        if a.ip().is_unspecified() { std::net::SocketAddr::from(([127, 0, 0, 1], a.port())) } else { a }
    };
    let limit = config.max_payload_bytes + crate::grpc::ENVELOPE_ALLOWANCE;
    let a2a = Arc::new(A2a {
        tenant: config.tenant.clone(),
        table,
        invoke,
        tasks: Tasks::new(config.a2a_max_tasks),
        durable,
        reply_limit: limit,
        grpc_address: loopback(local_addr).to_string(),
        jsonrpc_url: jsonrpc_addr.map(|a| format!("http://{}", loopback(a))),
    });
    if let Some(listener) = listener {
        // JSON and base64 make a payload up to 4/3 larger, plus the envelope.
        let body_limit = config.max_payload_bytes / 3 * 4 + crate::grpc::ENVELOPE_ALLOWANCE;
        tasks.spawn(jsonrpc::serve(listener, a2a.clone(), body_limit, config.local_token.clone(), shutdown));
    }
    Ok((grpc::server(a2a), jsonrpc_addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(parts: Vec<Part>) -> Message {
        Message { message_id: "m1".into(), role: Role::User as i32, parts, ..Default::default() }
    }

    fn text(t: &str) -> Part {
        Part { content: Some(part::Content::Text(t.into())), ..Default::default() }
    }

    #[test]
    fn a_single_part_is_the_payload_and_several_travel_as_a2a_json() {
        let (p, ct) = payload_of(&message(vec![text("hello")])).unwrap();
        assert_eq!((&p[..], ct.as_str()), (&b"hello"[..], "text/plain"));
        let raw = Part {
            content: Some(part::Content::Raw(vec![1, 2])),
            media_type: "image/png".into(),
            ..Default::default()
        };
        let (p, ct) = payload_of(&message(vec![raw])).unwrap();
        assert_eq!((&p[..], ct.as_str()), (&[1u8, 2][..], "image/png"));
        let (p, ct) = payload_of(&message(vec![text("a"), text("b")])).unwrap();
        assert_eq!(ct, A2A_MESSAGE_CONTENT_TYPE);
        let json: serde_json::Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(json["messageId"], "m1");
        assert_eq!(json["parts"][1]["text"], "b");
        assert!(matches!(payload_of(&message(vec![])), Err(crate::a2a_wire::WireError::InvalidParams(_))));
    }

    #[test]
    fn a_reply_becomes_a_text_data_or_raw_part_by_content_type() {
        assert_eq!(part_of(Bytes::from("hi"), "text/plain").content, Some(part::Content::Text("hi".into())));
        match part_of(Bytes::from(r#"{"a":1}"#), "application/json").content {
            Some(part::Content::Data(v)) => assert_eq!(serde_json::to_value(&v).unwrap()["a"], 1.0),
            other => panic!("not data: {other:?}"),
        }
        assert_eq!(
            part_of(Bytes::from_static(&[0xff, 0]), "application/octet-stream").content,
            Some(part::Content::Raw(vec![0xff, 0]))
        );
    }

    #[test]
    fn ids_look_like_uuids_v4() {
        let id = new_id();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_id());
    }
}
