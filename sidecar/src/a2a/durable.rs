//! A2A tasks that are the mesh's durable tasks ([`crate::tasks`], kept by control in etcd).
//! A message sent with `return_immediately` is submitted as a durable task (the A2A task id
//! is the mesh task id, the target is the agent named by the A2A `tenant`), so it survives a
//! restart of this sidecar and any sidecar of the tenant answers `GetTask`, `ListTasks`,
//! `CancelTask` and `SubscribeToTask` for it. A message naming a task that waits for input
//! is that task's answer. Blocking and streaming sends stay direct calls whose tasks are
//! kept in this sidecar's memory ([`super::tasks`]); the methods here look there first.
//!
//! Mapping: the states and roles have the same numbers; the task's messages are the A2A
//! history; a part whose content type is [`A2A_MESSAGE_CONTENT_TYPE`] holds the A2A message
//! of several parts it was made from and turns back into those parts; a failure's reason and
//! detail are in the status message and in the metadata (`reason`, `detail`).

use std::collections::BTreeMap;

use agent_reach::proto as mesh;
use agent_reach::reason::{self, Reason};
use futures_util::{Stream, StreamExt};
use tonic::Status;

use super::proto::{
    Artifact, Message, Part, Role, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus,
    TaskStatusUpdateEvent, part, stream_response,
};
use super::tasks::{is_terminal, state_of};
use super::{A2a, A2aError, Prepared, parts_of_payload, payload_of, trim_history};

/// At most this many durable tasks are read for one `ListTasks` (10 pages of control's
/// largest page).
const LIST_READ_LIMIT: usize = 10_000;
const LIST_PAGE: u32 = 1000;

impl A2a {
    /// Submits the prepared message as a durable mesh task; the task as stored.
    pub(super) async fn submit_durable(&self, p: Prepared) -> Result<Task, A2aError> {
        let Prepared { task, invoke, .. } = p;
        let message = task.history.into_iter().next().unwrap_or_default();
        let input = mesh::TaskPart { data: invoke.payload, content_type: invoke.content_type, ..Default::default() };
        let request = mesh::SubmitTaskRequest {
            target: invoke.target,
            message: Some(mesh::TaskMessage {
                message_id: message.message_id,
                role: mesh::TaskRole::User as i32,
                parts: vec![input],
                ..Default::default()
            }),
            session_id: invoke.session_id,
            priority: invoke.priority,
            metadata: invoke.metadata,
            task_id: task.id,
            context_id: task.context_id,
            ..Default::default()
        };
        // Anonymous submitter: an agent credential on the A2A request is not carried into the
        // task yet (the direct path verifies it in `InvokeEntry::call`).
        let reply = self.durable.submit(request, None).await.map_err(from_mesh)?;
        Ok(to_a2a(&reply.task.unwrap_or_default()))
    }

    /// A durable task of `agent` (any agent's when empty).
    async fn durable_task(&self, id: &str, agent: &str) -> Result<mesh::Task, A2aError> {
        let task = self.durable.get(id).await.map_err(from_mesh)?;
        if agent.is_empty() || agent_of(&task) == Some(agent) {
            Ok(task)
        } else {
            Err(A2aError::TaskNotFound(id.to_string()))
        }
    }

    /// `GetTask`: this sidecar's direct call, or the durable task.
    /// An A2A agent's task is the agent's, at its owner ([`super::forward`]).
    pub(crate) async fn get_task(
        &self,
        req: super::proto::GetTaskRequest,
        headers: http::HeaderMap,
    ) -> Result<Task, A2aError> {
        if self.passes_through(&req.tenant) {
            return self.pass_get(req, headers).await;
        }
        let task = match self.tasks.get(&req.id, &req.tenant) {
            Ok(t) => t,
            Err(A2aError::TaskNotFound(_)) => to_a2a(&self.durable_task(&req.id, &req.tenant).await?),
            Err(e) => return Err(e),
        };
        Ok(trim_history(task, req.history_length))
    }

    /// `CancelTask`: a direct call is aborted; a durable task ends CANCELED and its
    /// dispatcher cancels the agent's call.
    pub(crate) async fn cancel_task(
        &self,
        req: super::proto::CancelTaskRequest,
        headers: http::HeaderMap,
    ) -> Result<Task, A2aError> {
        if self.passes_through(&req.tenant) {
            return self.pass_cancel(req, headers).await;
        }
        match self.cancel_direct(&req) {
            Err(A2aError::TaskNotFound(_)) => {}
            other => return other,
        }
        self.durable_task(&req.id, &req.tenant).await?;
        let canceled = self
            .durable
            .cancel(mesh::CancelTaskRequest { task_id: req.id.clone(), reason: "canceled by the A2A client".into() })
            .await;
        match canceled {
            Ok(task) => Ok(to_a2a(&task)),
            Err(s) if has_reason(&s, Reason::TaskFinished) => {
                Err(A2aError::TaskNotCancelable(format!("task {:?} has already ended", req.id)))
            }
            Err(s) => Err(from_mesh(s)),
        }
    }

    /// `SubscribeToTask`: the task, then its updates until it ends.
    pub(crate) async fn subscribe(
        &self,
        req: super::proto::SubscribeToTaskRequest,
        headers: http::HeaderMap,
    ) -> Result<std::pin::Pin<Box<dyn Stream<Item = StreamResponse> + Send>>, A2aError> {
        if self.passes_through(&req.tenant) {
            return self.pass_subscribe(req, headers).await;
        }
        match self.subscribe_direct(&req) {
            Err(A2aError::TaskNotFound(_)) => {}
            Ok(events) => return Ok(Box::pin(events)),
            Err(e) => return Err(e),
        }
        let task = self.durable_task(&req.id, &req.tenant).await?;
        let state = state_of(&to_a2a(&task));
        if is_terminal(state) {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {:?} is already {}; get it with GetTask",
                req.id,
                state.as_str_name()
            )));
        }
        self.follow_durable(task).await
    }

    /// The task as an event, then its later versions as status and artifact updates.
    pub(super) async fn follow_durable(
        &self,
        task: mesh::Task,
    ) -> Result<std::pin::Pin<Box<dyn Stream<Item = StreamResponse> + Send>>, A2aError> {
        let events = self
            .durable
            .subscribe(mesh::SubscribeTaskRequest { task_id: task.id.clone(), after_version: task.version })
            .await
            .map_err(from_mesh)?;
        let first = StreamResponse { payload: Some(stream_response::Payload::Task(to_a2a(&task))) };
        let rest = futures_util::stream::unfold((events, task, false), |(mut events, prev, done)| async move {
            if done {
                return None;
            }
            loop {
                match events.next().await {
                    Some(Ok(event)) => {
                        let Some(next) = event.task else { continue };
                        let updates = changes(&prev, &next);
                        let end = event.r#final || is_terminal(state_of(&to_a2a(&next)));
                        if updates.is_empty() && !end {
                            continue;
                        }
                        return Some((futures_util::stream::iter(updates), (events, next, end)));
                    }
                    _ => return None,
                }
            }
        });
        Ok(Box::pin(futures_util::stream::once(async move { first }).chain(rest.flatten())))
    }

    /// A message naming a task: the answer of the durable task of `agent` that waits for
    /// input; that task, answered.
    pub(super) async fn answer_named(&self, agent: &str, message: &Message) -> Result<mesh::Task, A2aError> {
        if let Ok(task) = self.tasks.get(&message.task_id, agent) {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {:?} is {}: it is a blocking call's task, which takes no further messages",
                task.id,
                state_of(&task).as_str_name()
            )));
        }
        let task = self.durable_task(&message.task_id, agent).await?;
        self.answer_durable(&task, message).await
    }

    /// [`A2a::answer_named`]; unless `immediately`, waits until the task ends or asks
    /// again, and answers the task then.
    pub(super) async fn continue_task(
        &self,
        agent: &str,
        message: Message,
        immediately: bool,
    ) -> Result<Task, A2aError> {
        let answered = self.answer_named(agent, &message).await?;
        if immediately {
            return Ok(to_a2a(&answered));
        }
        let mut events = self.follow_durable(answered.clone()).await?;
        let mut last = to_a2a(&answered);
        while let Some(event) = events.next().await {
            if let Some(stream_response::Payload::StatusUpdate(u)) = &event.payload {
                let state = u.status.as_ref().map(|s| s.state()).unwrap_or_default();
                if is_terminal(state) || matches!(state, TaskState::InputRequired | TaskState::AuthRequired) {
                    let now = self.durable.get(&answered.id).await.map_err(from_mesh)?;
                    return Ok(to_a2a(&now));
                }
            }
            if let Some(stream_response::Payload::Task(t)) = event.payload {
                last = t;
            }
        }
        Ok(last)
    }

    /// Gives `message` to `task` as the answer it waits for.
    async fn answer_durable(&self, task: &mesh::Task, message: &Message) -> Result<mesh::Task, A2aError> {
        let (data, content_type) = payload_of(message)?;
        let answer = mesh::TaskMessage {
            message_id: message.message_id.clone(),
            role: mesh::TaskRole::User as i32,
            parts: vec![mesh::TaskPart { data, content_type, ..Default::default() }],
            ..Default::default()
        };
        self.durable.answer(mesh::AnswerTaskRequest { task_id: task.id.clone(), message: Some(answer) }).await.map_err(
            |s| {
                if has_reason(&s, Reason::TaskBadTransition) {
                    let state = state_of(&to_a2a(task));
                    A2aError::UnsupportedOperation(format!(
                        "task {:?} is {}, not waiting for input: send a new message instead",
                        task.id,
                        state.as_str_name()
                    ))
                } else {
                    from_mesh(s)
                }
            },
        )
    }

    /// The durable tasks of `agent` (all agents' when empty) matching the filter, with their
    /// creation times, newest first.
    pub(super) async fn list_durable(
        &self,
        agent: &str,
        context_id: &str,
        state: Option<TaskState>,
    ) -> Result<Vec<(u64, Task)>, A2aError> {
        let mut out = Vec::new();
        let mut token = String::new();
        let mut read = 0;
        loop {
            let page = self
                .durable
                .list(mesh::ListTasksRequest {
                    states: state.map(|s| s as i32).into_iter().collect(),
                    context_id: context_id.to_string(),
                    page_size: LIST_PAGE,
                    page_token: token,
                    ..Default::default()
                })
                .await
                .map_err(from_mesh)?;
            read += page.tasks.len();
            for t in &page.tasks {
                if agent.is_empty() || agent_of(t) == Some(agent) {
                    out.push((t.created_at_ms, to_a2a(t)));
                }
            }
            if page.next_page_token.is_empty() || read >= LIST_READ_LIMIT {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }
}

/// The agent a durable task was sent to (by name).
fn agent_of(task: &mesh::Task) -> Option<&str> {
    match task.target.as_ref()?.kind.as_ref()? {
        mesh::target::Kind::Agent(a) => Some(a.as_str()),
        _ => None,
    }
}

fn has_reason(s: &Status, r: Reason) -> bool {
    reason::error_info(s).is_some_and(|i| i.reason == r.as_str())
}

/// A mesh error as an A2A error: an unknown task is A2A's TASK_NOT_FOUND.
fn from_mesh(s: Status) -> A2aError {
    if has_reason(&s, Reason::TaskNotFound) {
        let id = reason::error_info(&s).and_then(|i| i.metadata.get("task_id").cloned()).unwrap_or_default();
        return A2aError::TaskNotFound(id);
    }
    A2aError::Mesh(s)
}

fn timestamp(ms: u64) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

fn strings(map: &std::collections::HashMap<String, String>) -> Option<pbjson_types::Struct> {
    if map.is_empty() {
        return None;
    }
    let fields: BTreeMap<String, pbjson_types::Value> = map
        .iter()
        .map(|(k, v)| {
            (k.clone(), pbjson_types::Value { kind: Some(pbjson_types::value::Kind::StringValue(v.clone())) })
        })
        .collect();
    Some(pbjson_types::Struct { fields: fields.into_iter().collect() })
}

/// The A2A parts of a mesh part.
fn parts_of(p: &mesh::TaskPart) -> Vec<Part> {
    if !p.uri.is_empty() && p.data.is_empty() {
        return vec![Part {
            content: Some(part::Content::Url(p.uri.clone())),
            filename: p.name.clone(),
            media_type: p.content_type.clone(),
            metadata: None,
        }];
    }
    let mut parts = parts_of_payload(p.data.clone(), &p.content_type);
    if let [one] = parts.as_mut_slice() {
        one.filename = p.name.clone();
    }
    parts
}

fn message_of(task: &mesh::Task, m: &mesh::TaskMessage) -> Message {
    Message {
        message_id: m.message_id.clone(),
        context_id: task.context_id.clone(),
        task_id: task.id.clone(),
        role: if m.role == mesh::TaskRole::Agent as i32 { Role::Agent } else { Role::User } as i32,
        parts: m.parts.iter().flat_map(parts_of).collect(),
        metadata: strings(&m.metadata),
        ..Default::default()
    }
}

fn status_of(task: &mesh::Task) -> TaskStatus {
    let status = task.status.clone().unwrap_or_default();
    let message = match &status.message {
        Some(m) => Some(message_of(task, m)),
        None if !status.reason.is_empty() => Some(Message {
            message_id: format!("{}-status-{}", task.id, task.version),
            context_id: task.context_id.clone(),
            task_id: task.id.clone(),
            role: Role::Agent as i32,
            parts: vec![Part {
                content: Some(part::Content::Text(format!("{}: {}", status.reason, status.detail))),
                ..Default::default()
            }],
            ..Default::default()
        }),
        None => None,
    };
    TaskStatus { state: status.state, message, timestamp: Some(timestamp(status.at_ms)) }
}

/// The failure's reason and detail, when the status has them.
fn reason_metadata(task: &mesh::Task) -> Option<pbjson_types::Struct> {
    let status = task.status.as_ref()?;
    if status.reason.is_empty() {
        return None;
    }
    strings(&std::collections::HashMap::from([
        ("reason".to_string(), status.reason.clone()),
        ("detail".to_string(), status.detail.clone()),
    ]))
}

fn artifact_of(a: &mesh::TaskArtifact) -> Artifact {
    Artifact {
        artifact_id: a.artifact_id.clone(),
        name: a.name.clone(),
        description: a.description.clone(),
        parts: a.parts.iter().flat_map(parts_of).collect(),
        metadata: strings(&a.metadata),
        extensions: vec![],
    }
}

/// A durable mesh task as an A2A task.
pub(super) fn to_a2a(task: &mesh::Task) -> Task {
    Task {
        id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: Some(status_of(task)),
        artifacts: task.artifacts.iter().map(artifact_of).collect(),
        history: task.messages.iter().map(|m| message_of(task, m)).collect(),
        metadata: reason_metadata(task),
    }
}

/// The A2A updates between two versions of a task: new artifacts, then the new status.
fn changes(prev: &mesh::Task, next: &mesh::Task) -> Vec<StreamResponse> {
    let mut out = Vec::new();
    for a in next.artifacts.iter().skip(prev.artifacts.len()) {
        out.push(StreamResponse {
            payload: Some(stream_response::Payload::ArtifactUpdate(TaskArtifactUpdateEvent {
                task_id: next.id.clone(),
                context_id: next.context_id.clone(),
                artifact: Some(artifact_of(a)),
                append: false,
                last_chunk: true,
                metadata: None,
            })),
        });
    }
    let (p, n) = (prev.status.clone().unwrap_or_default(), next.status.clone().unwrap_or_default());
    if p.state != n.state || p.at_ms != n.at_ms || p.message != n.message {
        out.push(StreamResponse {
            payload: Some(stream_response::Payload::StatusUpdate(TaskStatusUpdateEvent {
                task_id: next.id.clone(),
                context_id: next.context_id.clone(),
                status: Some(status_of(next)),
                metadata: reason_metadata(next),
            })),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: mesh::TaskState, at_ms: u64) -> mesh::Task {
        mesh::Task {
            id: "t1".into(),
            context_id: "c1".into(),
            target: Some(mesh::Target { kind: Some(mesh::target::Kind::Agent("upper".into())), tags: vec![] }),
            status: Some(mesh::TaskStatus { state: state as i32, at_ms, ..Default::default() }),
            messages: vec![mesh::TaskMessage {
                message_id: "m1".into(),
                role: mesh::TaskRole::User as i32,
                parts: vec![mesh::TaskPart {
                    data: "hello".into(),
                    content_type: "text/plain".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_mesh_task_reads_as_an_a2a_task() {
        let mut t = task(mesh::TaskState::Failed, 1_500);
        t.status.as_mut().unwrap().reason = "INSTANCE_LOST".into();
        t.status.as_mut().unwrap().detail = "the instance died".into();
        let a = to_a2a(&t);
        assert_eq!((a.id.as_str(), a.context_id.as_str()), ("t1", "c1"));
        let status = a.status.unwrap();
        assert_eq!(status.state(), TaskState::Failed);
        assert_eq!(status.timestamp, Some(pbjson_types::Timestamp { seconds: 1, nanos: 500_000_000 }));
        let text = &status.message.unwrap().parts[0].content;
        assert_eq!(text, &Some(part::Content::Text("INSTANCE_LOST: the instance died".into())));
        assert_eq!(a.history.len(), 1);
        assert_eq!(a.history[0].role(), Role::User);
        assert_eq!(a.history[0].parts[0].content, Some(part::Content::Text("hello".into())));
        let reason = a.metadata.unwrap().fields.get("reason").cloned().and_then(|v| v.kind);
        assert_eq!(reason, Some(pbjson_types::value::Kind::StringValue("INSTANCE_LOST".into())));
        assert_eq!(agent_of(&t), Some("upper"));
    }

    #[test]
    fn a_message_of_several_parts_comes_back_as_its_parts() {
        let m = Message {
            message_id: "m1".into(),
            parts: vec![
                Part { content: Some(part::Content::Text("a".into())), ..Default::default() },
                Part { content: Some(part::Content::Text("b".into())), ..Default::default() },
            ],
            ..Default::default()
        };
        let (data, content_type) = payload_of(&m).unwrap();
        let parts = parts_of(&mesh::TaskPart { data, content_type, ..Default::default() });
        assert_eq!(parts, m.parts);
    }

    #[test]
    fn versions_become_artifact_then_status_updates() {
        let working = task(mesh::TaskState::Working, 10);
        let mut done = task(mesh::TaskState::Completed, 20);
        done.artifacts.push(mesh::TaskArtifact {
            artifact_id: "r".into(),
            name: "result".into(),
            parts: vec![mesh::TaskPart {
                data: "HELLO".into(),
                content_type: "text/plain".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let kinds: Vec<&'static str> = changes(&working, &done)
            .iter()
            .map(|e| match &e.payload {
                Some(stream_response::Payload::ArtifactUpdate(_)) => "artifact",
                Some(stream_response::Payload::StatusUpdate(u))
                    if u.status.as_ref().unwrap().state() == TaskState::Completed =>
                {
                    "completed"
                }
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["artifact", "completed"]);
        // A version that changes neither (a claim renewal) is no update.
        assert!(changes(&working, &working.clone()).is_empty());
    }
}
