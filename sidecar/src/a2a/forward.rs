//! A2A requests to an agent that is itself an A2A server (all its instances registered with
//! transport A2A), carried through the mesh unchanged: each request is a mesh call to the
//! agent (so rate limits, priorities, breakers, authorization and tracing apply as to any
//! call) whose payload is the request in protobuf, content type `application/a2a+proto`,
//! with the method in the call's metadata (`a2a-method`); the target's sidecar hands it to
//! the agent's A2A gRPC server and answers the agent's answer (`inbound::a2a_forward`).
//!
//! The agent's tasks stay its own: their ids are the agent's, prefixed with the owning
//! instance ([`super::owned`]), and a request naming a task goes to that instance only.
//! When the owner is gone (no longer registered, or unreachable), `GetTask`, `CancelTask`,
//! a message to the task and `SubscribeToTask` answer the task FAILED, its status message
//! saying `INSTANCE_LOST` and which instance; a stream whose owner dies ends with such a
//! status update. (A task state, not an error: a polling client sees the task end.)
//!
//! `ListTasks` pages through the instances one after another (by instance id), each
//! instance's tasks newest first; `total_size` counts the tasks of every instance.

use std::collections::BTreeMap;
use std::pin::Pin;

use agent_reach::model::Transport;
use agent_reach::proto as mesh;
use bytes::Bytes;
use futures_util::Stream;
use http::HeaderMap;
use prost::Message as _;
use tonic::{Code, Status};

use super::error::A2A_DOMAIN;
use super::owned::{self, own_event, own_message, own_task, unown, unown_message};
use super::proto::{
    CancelTaskRequest, GetTaskRequest, ListTasksRequest, ListTasksResponse, Message, Part, Role, SendMessageRequest,
    SendMessageResponse, StreamResponse, SubscribeToTaskRequest, Task, TaskState, TaskStatus, TaskStatusUpdateEvent,
    part, send_message_response, stream_response,
};
use super::{A2a, A2aError, ends, new_id, now};
use crate::a2a_wire::{A2A_METHOD_KEY, A2A_PROTO_CONTENT_TYPE};
use crate::call::Shape;
use crate::grpc::{self, MessageReader, Read};
use crate::outbound::invoke::read_reply;

type Events = Pin<Box<dyn Stream<Item = StreamResponse> + Send>>;

/// The reason a task whose owner is gone fails with.
pub(crate) const INSTANCE_LOST: &str = "INSTANCE_LOST";

/// Where one request goes.
struct Route<'a> {
    agent: &'a str,
    /// The instance that owns the task the request names.
    pin: Option<String>,
    session: String,
    priority: mesh::Priority,
}

/// The owner of a task is gone: which instance, and why the mesh says so.
struct Lost {
    instance: String,
    why: String,
}

impl A2a {
    /// Whether `agent` is an A2A server: it has instances, all registered with transport A2A.
    pub(super) fn passes_through(&self, agent: &str) -> bool {
        let table = self.table.load();
        table.by_agent.get(agent).is_some_and(|g| {
            !g.members.is_empty()
                && g.members.iter().all(|m| m.instance.record.registration.transport == Transport::A2a)
        })
    }

    /// The instances of `agent`, by id.
    fn instances_of(&self, agent: &str) -> Vec<String> {
        let table = self.table.load();
        table.by_agent.get(agent).map(|g| g.members.iter().map(|m| m.id().to_string()).collect()).unwrap_or_default()
    }

    /// `SendMessage` to the agent; a message naming a task goes to the task's owner.
    pub(super) async fn pass_send(
        &self,
        mut req: SendMessageRequest,
        headers: HeaderMap,
    ) -> Result<SendMessageResponse, A2aError> {
        let agent = std::mem::take(&mut req.tenant);
        let shown = req.message.as_ref().map(|m| m.task_id.clone()).unwrap_or_default();
        let route = self.route_of_message(&agent, &mut req)?;
        match self.unary::<SendMessageResponse>(&route, "SendMessage", req.encode_to_vec(), headers).await? {
            Ok((mut answer, instance)) => {
                match &mut answer.payload {
                    Some(send_message_response::Payload::Task(t)) => own_task(&instance, t),
                    Some(send_message_response::Payload::Message(m)) => own_message(&instance, m),
                    None => {}
                }
                Ok(answer)
            }
            Err(lost) => Ok(SendMessageResponse {
                payload: Some(send_message_response::Payload::Task(lost_task(&shown, &lost))),
            }),
        }
    }

    /// `SendStreamingMessage` to the agent: its events, task ids owned.
    pub(super) async fn pass_send_streaming(
        &self,
        mut req: SendMessageRequest,
        headers: HeaderMap,
    ) -> Result<Events, A2aError> {
        let agent = std::mem::take(&mut req.tenant);
        let shown = req.message.as_ref().map(|m| m.task_id.clone()).unwrap_or_default();
        let route = self.route_of_message(&agent, &mut req)?;
        self.stream(&route, "SendStreamingMessage", req.encode_to_vec(), headers, shown).await
    }

    /// `GetTask` at the task's owner.
    pub(super) async fn pass_get(&self, mut req: GetTaskRequest, headers: HeaderMap) -> Result<Task, A2aError> {
        let (agent, shown) = (std::mem::take(&mut req.tenant), req.id.clone());
        let route =
            Route { agent: &agent, pin: unown(&mut req.id), session: String::new(), priority: Default::default() };
        match self.unary::<Task>(&route, "GetTask", req.encode_to_vec(), headers).await? {
            Ok((mut task, instance)) => {
                own_task(&instance, &mut task);
                Ok(task)
            }
            Err(lost) => Ok(lost_task(&shown, &lost)),
        }
    }

    /// `CancelTask` at the task's owner.
    pub(super) async fn pass_cancel(&self, mut req: CancelTaskRequest, headers: HeaderMap) -> Result<Task, A2aError> {
        let (agent, shown) = (std::mem::take(&mut req.tenant), req.id.clone());
        let route =
            Route { agent: &agent, pin: unown(&mut req.id), session: String::new(), priority: Default::default() };
        match self.unary::<Task>(&route, "CancelTask", req.encode_to_vec(), headers).await? {
            Ok((mut task, instance)) => {
                own_task(&instance, &mut task);
                Ok(task)
            }
            Err(lost) => Ok(lost_task(&shown, &lost)),
        }
    }

    /// `SubscribeToTask` at the task's owner.
    pub(super) async fn pass_subscribe(
        &self,
        mut req: SubscribeToTaskRequest,
        headers: HeaderMap,
    ) -> Result<Events, A2aError> {
        let (agent, shown) = (std::mem::take(&mut req.tenant), req.id.clone());
        let route =
            Route { agent: &agent, pin: unown(&mut req.id), session: String::new(), priority: Default::default() };
        self.stream(&route, "SubscribeToTask", req.encode_to_vec(), headers, shown).await
    }

    /// `ListTasks`: one instance's page at a time (the page token names the instance).
    pub(super) async fn pass_list(
        &self,
        mut req: ListTasksRequest,
        headers: HeaderMap,
    ) -> Result<ListTasksResponse, A2aError> {
        let agent = std::mem::take(&mut req.tenant);
        let instances = self.instances_of(&agent);
        let (from, token) = match owned::split(&req.page_token) {
            (Some(i), t) => (i.to_string(), t.to_string()),
            (None, "") => (String::new(), String::new()),
            (None, t) => return Err(A2aError::InvalidParams(format!("page_token {t:?} is not one this sidecar gave"))),
        };
        // The instance of the token, or (gone) the next one by id.
        let Some(at) = instances.iter().position(|i| *i >= from) else {
            return Ok(ListTasksResponse::default());
        };
        let token = if instances[at] == from { token } else { String::new() };
        let asks: Vec<(Route<'_>, Vec<u8>)> = instances
            .iter()
            .enumerate()
            .map(|(k, instance)| {
                let mut asked = req.clone();
                if k == at {
                    asked.page_token = token.clone();
                } else {
                    // Only its total.
                    asked.page_token = String::new();
                    asked.page_size = Some(1);
                }
                let route = Route {
                    agent: &agent,
                    pin: Some(instance.clone()),
                    session: String::new(),
                    priority: Default::default(),
                };
                (route, asked.encode_to_vec())
            })
            .collect();
        let pages = asks
            .iter()
            .map(|(route, body)| self.unary::<ListTasksResponse>(route, "ListTasks", body.clone(), headers.clone()));
        let mut total = 0;
        let mut answer = ListTasksResponse::default();
        for (k, page) in futures_util::future::join_all(pages).await.into_iter().enumerate() {
            let (page, instance) = match page? {
                Ok(p) => p,
                Err(lost) => return Err(A2aError::Mesh(Status::unavailable(lost.why))),
            };
            total += page.total_size;
            if k == at {
                answer = page;
                for t in &mut answer.tasks {
                    own_task(&instance, t);
                }
                answer.next_page_token = match (answer.next_page_token.is_empty(), instances.get(k + 1)) {
                    (false, _) => owned::join(&instance, &answer.next_page_token),
                    (true, Some(next)) => owned::join(next, ""),
                    (true, None) => String::new(),
                };
            }
        }
        answer.total_size = total;
        Ok(answer)
    }

    /// The route of a message: to the owner of the task it names, if it names one.
    fn route_of_message<'a>(&self, agent: &'a str, req: &mut SendMessageRequest) -> Result<Route<'a>, A2aError> {
        let priority = super::priority_of(req.metadata.as_ref())?;
        let (pin, session) = match req.message.as_mut() {
            Some(m) => (unown_message(m), m.context_id.clone()),
            None => (None, String::new()),
        };
        Ok(Route { agent, pin, session, priority })
    }

    /// The mesh call carrying one A2A request.
    fn call_of(route: &Route<'_>, method: &str, body: Vec<u8>) -> Bytes {
        let invoke = mesh::InvokeRequest {
            target: Some(mesh::Target { kind: Some(mesh::target::Kind::Agent(route.agent.to_string())), tags: vec![] }),
            payload: Bytes::from(body),
            content_type: A2A_PROTO_CONTENT_TYPE.into(),
            session_id: route.session.clone(),
            priority: route.priority as i32,
            metadata: [(A2A_METHOD_KEY.to_string(), method.to_string())].into(),
            ..Default::default()
        };
        Bytes::from(invoke.encode_to_vec())
    }

    /// Whether the route's owner is gone before the call is made.
    fn gone(&self, route: &Route<'_>) -> Option<Lost> {
        let pin = route.pin.as_ref()?;
        (!self.instances_of(route.agent).contains(pin)).then(|| Lost {
            instance: pin.clone(),
            why: format!("instance {pin} is not registered any more (it deregistered, or its lease expired)"),
        })
    }

    /// One unary request: the agent's answer and the instance that answered, or the owner lost.
    async fn unary<A: prost::Message + Default>(
        &self,
        route: &Route<'_>,
        method: &str,
        body: Vec<u8>,
        headers: HeaderMap,
    ) -> Result<Result<(A, String), Lost>, A2aError> {
        if let Some(lost) = self.gone(route) {
            return Ok(Err(lost));
        }
        let call = Self::call_of(route, method, body);
        let resp = self.invoke.call_pinned(call, headers, Shape::Unary, route.pin.as_deref()).await;
        let reply = match read_reply(resp, self.reply_limit).await {
            Ok(r) => r,
            Err(status) => return lost_or_error(route, status).map(Err),
        };
        if reply.content_type != A2A_PROTO_CONTENT_TYPE {
            return Err(A2aError::Internal(format!(
                "instance {} answered {method} with content type {:?}, not {A2A_PROTO_CONTENT_TYPE}",
                reply.instance_id, reply.content_type
            )));
        }
        let answer = A::decode(reply.payload)
            .map_err(|e| A2aError::Internal(format!("the A2A agent's {method} answer does not decode: {e}")))?;
        Ok(Ok((answer, reply.instance_id)))
    }

    /// One streaming request: the agent's events, task ids owned; a stream whose owner is
    /// lost ends with the task FAILED. `shown` is the task id the client named ("" if none).
    async fn stream(
        &self,
        route: &Route<'_>,
        method: &str,
        body: Vec<u8>,
        headers: HeaderMap,
        shown: String,
    ) -> Result<Events, A2aError> {
        let lost_now = |lost: Lost| -> Events {
            let event = StreamResponse { payload: Some(stream_response::Payload::Task(lost_task(&shown, &lost))) };
            Box::pin(futures_util::stream::once(async move { event }))
        };
        if let Some(lost) = self.gone(route) {
            return Ok(lost_now(lost));
        }
        let call = Self::call_of(route, method, body);
        let resp = self.invoke.call_pinned(call, headers, Shape::Stream, route.pin.as_deref()).await;
        if let Some(status) = Status::from_header_map(resp.headers()).filter(|s| s.code() != Code::Ok) {
            return lost_or_error(route, status).map(lost_now);
        }
        let instance =
            resp.headers().get(grpc::header::INSTANCE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let follow = Follow {
            reader: MessageReader::new(resp.into_body(), self.reply_limit),
            instance,
            task_id: shown,
            context_id: String::new(),
            done: false,
        };
        Ok(Box::pin(futures_util::stream::unfold(follow, Follow::next)))
    }
}

/// A streamed answer being read.
struct Follow {
    reader: MessageReader,
    instance: String,
    /// The task the events are about, as the client sees its id ("" until known).
    task_id: String,
    context_id: String,
    /// The task ended, or the stream did.
    done: bool,
}

impl Follow {
    async fn next(mut self) -> Option<(StreamResponse, Follow)> {
        if self.done {
            return None;
        }
        let why = match self.reader.next().await {
            Ok(Read::Message(m)) => match decode_event(m) {
                Ok(mut event) => {
                    own_event(&self.instance, &mut event);
                    self.learn(&event);
                    self.done = ends(&event);
                    return Some((event, self));
                }
                Err(why) => {
                    // Not a lost owner: the answer is garbled, and the task's state unknown.
                    tracing::warn!(instance = %self.instance, "A2A stream cut: {why}");
                    return None;
                }
            },
            Ok(Read::End(trailers)) => match trailers.as_ref().and_then(Status::from_header_map) {
                Some(s) if s.code() != Code::Ok && lost(&s) => s.message().to_string(),
                Some(s) if s.code() != Code::Ok => {
                    tracing::debug!(instance = %self.instance, "A2A stream ended: {:?} {}", s.code(), s.message());
                    return None;
                }
                _ => return None,
            },
            Err(why) => format!("the stream from instance {} broke: {why}", self.instance),
        };
        // The owner is gone before the task ended: the task failed.
        self.done = true;
        if self.task_id.is_empty() {
            tracing::debug!(instance = %self.instance, "A2A stream lost before a task: {why}");
            return None;
        }
        let lost = Lost { instance: self.instance.clone(), why };
        let status = lost_status(&self.task_id, &self.context_id, &lost);
        let event = StreamResponse {
            payload: Some(stream_response::Payload::StatusUpdate(TaskStatusUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                status: Some(status),
                metadata: lost_metadata(&lost),
            })),
        };
        Some((event, self))
    }

    /// Remembers the task the events are about.
    fn learn(&mut self, event: &StreamResponse) {
        let (id, context) = match &event.payload {
            Some(stream_response::Payload::Task(t)) => (&t.id, &t.context_id),
            Some(stream_response::Payload::StatusUpdate(u)) => (&u.task_id, &u.context_id),
            Some(stream_response::Payload::ArtifactUpdate(u)) => (&u.task_id, &u.context_id),
            _ => return,
        };
        if !id.is_empty() {
            self.task_id = id.clone();
        }
        if !context.is_empty() {
            self.context_id = context.clone();
        }
    }
}

fn decode_event(message: Bytes) -> Result<StreamResponse, String> {
    let chunk = mesh::Chunk::decode(message).map_err(|e| format!("a chunk that does not decode: {e}"))?;
    StreamResponse::decode(chunk.payload).map_err(|e| format!("an A2A event that does not decode: {e}"))
}

/// Whether a failed call says the owner is gone (the mesh could not reach it), rather than
/// an answer of the agent's.
fn lost(status: &Status) -> bool {
    status.code() == Code::Unavailable
        && agent_reach::reason::error_info(status).is_none_or(|info| info.domain != A2A_DOMAIN)
}

/// A pinned request that failed because its owner is gone is the owner lost; any other
/// failure is the request's error.
fn lost_or_error(route: &Route<'_>, status: Status) -> Result<Lost, A2aError> {
    match &route.pin {
        Some(pin) if lost(&status) => Ok(Lost { instance: pin.clone(), why: status.message().to_string() }),
        _ => Err(A2aError::from_status(status)),
    }
}

fn lost_status(task_id: &str, context_id: &str, lost: &Lost) -> TaskStatus {
    let text = format!("{INSTANCE_LOST}: instance {} owning task {task_id} is gone: {}", lost.instance, lost.why);
    let message = Message {
        message_id: new_id(),
        context_id: context_id.to_string(),
        task_id: task_id.to_string(),
        role: Role::Agent as i32,
        parts: vec![Part { content: Some(part::Content::Text(text)), ..Default::default() }],
        ..Default::default()
    };
    TaskStatus { state: TaskState::Failed as i32, message: Some(message), timestamp: Some(now()) }
}

fn lost_metadata(lost: &Lost) -> Option<pbjson_types::Struct> {
    let text = |s: &str| pbjson_types::Value { kind: Some(pbjson_types::value::Kind::StringValue(s.to_string())) };
    let fields = BTreeMap::from([
        ("reason".to_string(), text(INSTANCE_LOST)),
        ("instance".to_string(), text(&lost.instance)),
        ("detail".to_string(), text(&lost.why)),
    ]);
    Some(pbjson_types::Struct { fields: fields.into_iter().collect() })
}

/// The task `id` (as the client names it), FAILED because its owner is gone.
fn lost_task(id: &str, lost: &Lost) -> Task {
    Task {
        id: id.to_string(),
        context_id: String::new(),
        status: Some(lost_status(id, "", lost)),
        artifacts: vec![],
        history: vec![],
        metadata: lost_metadata(lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_mesh_failing_to_reach_the_owner_loses_it() {
        let route = Route { agent: "a", pin: Some("a-1".into()), session: String::new(), priority: Default::default() };
        let unreachable = agent_reach::reason::status(
            agent_reach::reason::Reason::NoHealthyInstance,
            "instance a-1, which the call must reach, was tried",
            &[],
        );
        let lost = lost_or_error(&route, unreachable).unwrap();
        assert_eq!(
            (lost.instance.as_str(), lost.why.as_str()),
            ("a-1", "instance a-1, which the call must reach, was tried")
        );
        // The agent's own answer is its error, passed on.
        let not_found = A2aError::TaskNotFound("t".into()).into_status();
        assert!(matches!(lost_or_error(&route, not_found), Err(A2aError::Agent(_))));
        let limited = agent_reach::reason::status(agent_reach::reason::Reason::RateLimited, "slow down", &[]);
        assert!(matches!(lost_or_error(&route, limited), Err(A2aError::Mesh(_))));
        let unpinned = Route { pin: None, ..route };
        assert!(lost_or_error(&unpinned, Status::unavailable("down")).is_err());
    }

    /// The events a stream of `events` (the agent's) ending with `status` reads as.
    async fn followed(events: Vec<StreamResponse>, status: Status) -> Vec<StreamResponse> {
        let (tx, body) = crate::grpc::ChannelBody::new(events.len() + 1);
        for e in events {
            let chunk = mesh::Chunk { payload: Bytes::from(e.encode_to_vec()), ..Default::default() };
            for f in crate::grpc::frames_data(crate::grpc::Frames::message(Bytes::from(chunk.encode_to_vec()), &[])) {
                tx.try_send(Ok(http_body::Frame::data(f))).unwrap();
            }
        }
        let mut trailers = HeaderMap::new();
        status.add_header(&mut trailers).unwrap();
        tx.try_send(Ok(http_body::Frame::trailers(trailers))).unwrap();
        drop(tx);
        let follow = Follow {
            reader: MessageReader::new(crate::grpc::Body::Channel(body), 1 << 20),
            instance: "i".into(),
            task_id: String::new(),
            context_id: String::new(),
            done: false,
        };
        futures_util::StreamExt::collect(futures_util::stream::unfold(follow, Follow::next)).await
    }

    fn working() -> StreamResponse {
        let task = Task {
            id: "t".into(),
            context_id: "c".into(),
            status: Some(TaskStatus { state: TaskState::Working as i32, ..Default::default() }),
            ..Default::default()
        };
        StreamResponse { payload: Some(stream_response::Payload::Task(task)) }
    }

    #[tokio::test]
    async fn a_stream_whose_owner_is_lost_ends_with_the_task_failed() {
        let events = followed(vec![working()], Status::unavailable("the A2A agent i: the stream broke")).await;
        assert_eq!(events.len(), 2, "{events:?}");
        let Some(stream_response::Payload::Task(t)) = &events[0].payload else { panic!("{events:?}") };
        assert_eq!(t.id, "i~t", "owned");
        let Some(stream_response::Payload::StatusUpdate(u)) = &events[1].payload else { panic!("{events:?}") };
        assert_eq!((u.task_id.as_str(), u.context_id.as_str()), ("i~t", "c"));
        let status = u.status.as_ref().unwrap();
        assert_eq!(status.state(), TaskState::Failed);
        assert_eq!(
            status.message.as_ref().unwrap().parts[0].content,
            Some(part::Content::Text(
                "INSTANCE_LOST: instance i owning task i~t is gone: the A2A agent i: the stream broke".into()
            ))
        );
        // The call's deadline, or the agent's own error, is no lost owner: the stream just ends.
        for status in [Status::deadline_exceeded("deadline"), A2aError::TaskNotFound("t".into()).into_status()] {
            assert_eq!(followed(vec![working()], status).await.len(), 1);
        }
    }

    #[test]
    fn a_lost_task_fails_naming_its_owner() {
        let task = lost_task("a-1~t", &Lost { instance: "a-1".into(), why: "gone".into() });
        let status = task.status.unwrap();
        assert_eq!(status.state(), TaskState::Failed);
        let text = &status.message.unwrap().parts[0].content;
        assert_eq!(
            text,
            &Some(part::Content::Text("INSTANCE_LOST: instance a-1 owning task a-1~t is gone: gone".into()))
        );
        let reason = task.metadata.unwrap().fields.get("reason").cloned().and_then(|v| v.kind);
        assert_eq!(reason, Some(pbjson_types::value::Kind::StringValue("INSTANCE_LOST".into())));
    }
}
