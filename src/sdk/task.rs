//! Durable tasks in the SDK, both sides.
//!
//! The submitter: [`Client::submit`] returns a [`TaskHandle`] at once; the mesh stores the
//! task and dispatches it to an instance of the target. [`TaskHandle::updates`] streams the
//! task after every change (resumable: each item is the whole task with its version),
//! [`TaskHandle::wait`] waits for its final state, [`TaskHandle::answer`] answers a question
//! and [`TaskHandle::cancel`] cancels it.
//!
//! The agent: a dispatched task reaches an ordinary handler; [`Call::task`] gives its
//! [`TaskContext`], to report progress ([`TaskContext::progress`]), ask the submitter for
//! input and wait for the answer ([`TaskContext::ask`]), or learn that the task was
//! canceled ([`TaskContext::canceled`]; the mesh also cancels the handler's call). The
//! handler's reply becomes the task's artifact "result".
//!
//! ```no_run
//! # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
//! let task = mesh.submit("research.report").text("state of A2A adoption").send().await?;
//! let done = task.wait().await?;
//! println!("{:?}", done.artifacts.first().map(|a| &a.parts[0].data));
//! # Ok(())
//! # }
//! ```

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use std::pin::Pin;

use crate::proto::sidecar_client::SidecarClient;
use crate::proto::{self, TaskState};
use crate::{Call, Client, InvokeError};

/// Whether a task in `state` is finished for good.
pub fn is_final(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

/// The state of a task.
pub fn state(task: &proto::Task) -> TaskState {
    task.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default()
}

fn text_part(text: impl Into<String>) -> proto::TaskPart {
    proto::TaskPart { data: Bytes::from(text.into()), content_type: "text/plain".into(), ..Default::default() }
}

fn text_message(text: impl Into<String>) -> proto::TaskMessage {
    proto::TaskMessage { parts: vec![text_part(text)], ..Default::default() }
}

/// The task's stream of changes.
pub type TaskUpdates = Pin<Box<dyn Stream<Item = Result<proto::Task, InvokeError>> + Send>>;

impl Client {
    /// Starts a task for any instance offering `capability`. With an agent credential
    /// ([`Client::with_credential`], or an agent's own [client](crate::RunningAgent::client)),
    /// the task is dispatched as that agent; without one, anonymously.
    pub fn submit(&self, capability: impl Into<String>) -> SubmitBuilder {
        SubmitBuilder {
            sidecar: self.raw(),
            credential: self.credential().map(str::to_string),
            request: proto::SubmitTaskRequest {
                target: Some(crate::model::Target::capability(capability).into()),
                caller: self.caller_proto(),
                ..Default::default()
            },
        }
    }

    /// A handle on an existing task of this client's tenant.
    pub fn task(&self, task_id: impl Into<String>) -> TaskHandle {
        TaskHandle { id: task_id.into(), sidecar: self.raw() }
    }
}

/// A task being built by [`Client::submit`]; [`send`](SubmitBuilder::send) stores it.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), agent_reach::InvokeError> {
/// let mesh = agent_reach::Client::connect_local().await?;
/// let submitted = mesh
///     .submit("research.report")
///     .id("report-2026-12") // submitting the same id again returns the existing task
///     .text("state of A2A adoption")
///     .session("s-42")
///     .priority(agent_reach::Priority::High)
///     .run_once()
///     .push_url("http://127.0.0.1:9000/hooks/tasks")
///     .send()
///     .await?;
/// println!("task {} created: {}, push secret {} bytes", submitted.id(), submitted.created, submitted.push_secret.len());
/// # Ok(())
/// # }
/// ```
#[must_use = "a task is only submitted by send()"]
pub struct SubmitBuilder {
    sidecar: SidecarClient<super::SidecarChannel>,
    request: proto::SubmitTaskRequest,
    credential: Option<String>,
}

impl SubmitBuilder {
    /// The input, as text.
    pub fn text(self, text: impl Into<String>) -> Self {
        self.payload("text/plain", text.into())
    }
    /// The input, as bytes of `content_type`.
    pub fn payload(mut self, content_type: &str, data: impl Into<Bytes>) -> Self {
        self.request.message = Some(proto::TaskMessage {
            parts: vec![proto::TaskPart { data: data.into(), content_type: content_type.into(), ..Default::default() }],
            ..Default::default()
        });
        self
    }
    /// Your own task id (submitting it again returns the existing task).
    pub fn id(mut self, task_id: impl Into<String>) -> Self {
        self.request.task_id = task_id.into();
        self
    }
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.metadata.insert(key.into(), value.into());
        self
    }
    pub fn session(mut self, session_id: impl Into<String>) -> Self {
        self.request.session_id = session_id.into();
        self
    }
    pub fn priority(mut self, priority: crate::Priority) -> Self {
        self.request.priority = proto::Priority::from(priority) as i32;
        self
    }
    /// The task must not run twice: if its instance dies mid-work it fails instead of
    /// running again elsewhere.
    pub fn run_once(mut self) -> Self {
        self.request.run_once = true;
        self
    }
    /// Posts every change to this http:// webhook, signed with the task's secret
    /// ([`Submitted::push_secret`]).
    pub fn push_url(mut self, url: impl Into<String>) -> Self {
        self.request.push = Some(proto::TaskPush { kind: Some(proto::task_push::Kind::Url(url.into())) });
        self
    }
    /// Stores the task; returns once it is stored (not when it is done).
    pub async fn send(mut self) -> Result<Submitted, InvokeError> {
        let mut request = tonic::Request::new(self.request);
        if let Some(v) = self.credential.and_then(|c| c.parse().ok()) {
            request.metadata_mut().insert(crate::headers::AGENT_CREDENTIAL, v);
        }
        let reply = self.sidecar.submit_task(request).await?.into_inner();
        let task = reply.task.unwrap_or_default();
        Ok(Submitted {
            handle: TaskHandle { id: task.id.clone(), sidecar: self.sidecar },
            task,
            push_secret: reply.push_secret,
            created: reply.created,
        })
    }
}

/// A submitted task: the handle, the task as stored, and its push secret.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub handle: TaskHandle,
    pub task: proto::Task,
    /// The HMAC key of the task's push notifications (empty without a push target).
    pub push_secret: Bytes,
    /// False when a task with the same id existed already.
    pub created: bool,
}

impl std::ops::Deref for Submitted {
    type Target = TaskHandle;
    fn deref(&self) -> &TaskHandle {
        &self.handle
    }
}

/// A task of the client's tenant, by id: from [`SubmitBuilder::send`] or, for a task
/// submitted earlier (by anyone of the tenant), [`Client::task`].
///
/// # Examples
///
/// ```no_run
/// use futures_util::StreamExt;
/// use agent_reach::proto::TaskState;
///
/// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
/// let task = mesh.task("report-2026-12");
/// let mut updates = task.updates().await?;
/// while let Some(update) = updates.next().await {
///     let update = update?;
///     let state = TaskState::try_from(update.status.as_ref().map_or(0, |s| s.state)).unwrap_or_default();
///     if state == TaskState::InputRequired {
///         task.answer("only Europe").await?;
///     }
///     println!("version {}: {state:?}", update.version);
/// }
/// let done = task.wait().await?; // returns at once: the stream above ended at the final state
/// # let _ = done;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TaskHandle {
    id: String,
    sidecar: SidecarClient<super::SidecarChannel>,
}

impl TaskHandle {
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The task now.
    pub async fn get(&self) -> Result<proto::Task, InvokeError> {
        let r = proto::GetTaskRequest { task_id: self.id.clone(), ..Default::default() };
        Ok(self.sidecar.clone().get_task(r).await?.into_inner())
    }
    /// The task after every change from now on (the current task first), until its final
    /// state.
    pub async fn updates(&self) -> Result<TaskUpdates, InvokeError> {
        self.updates_after(0).await
    }
    /// The task after every change past `version` (resume with the last version seen).
    pub async fn updates_after(&self, version: u64) -> Result<TaskUpdates, InvokeError> {
        let r = proto::SubscribeTaskRequest { task_id: self.id.clone(), after_version: version };
        let stream = self.sidecar.clone().subscribe_task(r).await?.into_inner();
        Ok(Box::pin(stream.map(|e| e.map(|e| e.task.unwrap_or_default()).map_err(InvokeError::from))))
    }
    /// Waits for the final state and returns the task then.
    pub async fn wait(&self) -> Result<proto::Task, InvokeError> {
        let mut last = 0;
        loop {
            let mut updates = self.updates_after(last).await?;
            while let Some(task) = updates.next().await {
                let task = task?;
                last = task.version;
                if is_final(state(&task)) {
                    return Ok(task);
                }
            }
        }
    }
    /// Cancels the task (the running agent's call is canceled).
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<proto::Task, InvokeError> {
        let r = proto::CancelTaskRequest { task_id: self.id.clone(), reason: reason.into() };
        Ok(self.sidecar.clone().cancel_task(r).await?.into_inner())
    }
    /// Answers the task's question (it must be INPUT_REQUIRED).
    pub async fn answer(&self, text: impl Into<String>) -> Result<proto::Task, InvokeError> {
        let r = proto::AnswerTaskRequest { task_id: self.id.clone(), message: Some(text_message(text)) };
        Ok(self.sidecar.clone().answer_task(r).await?.into_inner())
    }
}

/// The task a handler is working on (from [`Call::task`]).
///
/// # Examples
///
/// ```no_run
/// use agent_reach::{Agent, Reply};
///
/// # async fn example() -> Result<(), agent_reach::AgentError> {
/// Agent::builder("researcher")
///     .capability("research.report", ["en"])
///     .handle("research.report", |call| async move {
///         let topic = call.text()?.to_string();
///         if let Some(task) = call.task() {
///             task.progress("collecting sources").await?;
///             let region = task.ask("which region?").await?;
///             return Ok(Reply::text(format!("{topic} in {region}: ...")));
///         }
///         Ok(Reply::text(format!("{topic}: ...")))
///     })
///     .serve()
///     .await
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TaskContext {
    handle: TaskHandle,
    instance_id: String,
}

impl Call {
    /// The task this call works on, when the mesh dispatched a task to the handler.
    pub fn task(&self) -> Option<TaskContext> {
        let id = self.metadata().get(crate::headers::TASK_ID)?.clone();
        Some(TaskContext {
            handle: TaskHandle { id, sidecar: self.sidecar_client()? },
            instance_id: self.instance_id().to_string(),
        })
    }
}

impl TaskContext {
    pub fn id(&self) -> &str {
        self.handle.id()
    }
    pub fn handle(&self) -> &TaskHandle {
        &self.handle
    }
    async fn report(&self, state: TaskState, text: String) -> Result<proto::Task, InvokeError> {
        let r = proto::ReportTaskRequest {
            task_id: self.handle.id.clone(),
            instance_id: self.instance_id.clone(),
            state: state as i32,
            message: Some(text_message(text)),
            artifacts: vec![],
        };
        Ok(self.handle.sidecar.clone().report_task(r).await?.into_inner())
    }
    /// Reports progress (the task stays WORKING, with this note).
    pub async fn progress(&self, note: impl Into<String>) -> Result<(), InvokeError> {
        self.report(TaskState::Working, note.into()).await.map(|_| ())
    }
    /// Asks the submitter a question (INPUT_REQUIRED) and waits for the answer's text.
    pub async fn ask(&self, question: impl Into<String>) -> Result<String, InvokeError> {
        let asked = self.report(TaskState::InputRequired, question.into()).await?;
        let asked_messages = asked.messages.len();
        let mut last = asked.version;
        loop {
            let mut updates = self.handle.updates_after(last).await?;
            while let Some(task) = updates.next().await {
                let task = task?;
                last = task.version;
                if is_final(state(&task)) {
                    return Err(crate::reason::status(
                        crate::reason::Reason::TaskFinished,
                        format!("task {} ended while waiting for an answer", task.id),
                        &[],
                    )
                    .into());
                }
                if let Some(answer) =
                    task.messages.iter().skip(asked_messages).find(|m| m.role == proto::TaskRole::User as i32)
                {
                    let data = answer.parts.first().map(|p| p.data.clone()).unwrap_or_default();
                    return Ok(String::from_utf8_lossy(&data).into_owned());
                }
            }
        }
    }
    /// Resolves when the task is canceled (or otherwise finished by someone else).
    pub async fn canceled(&self) -> Result<proto::Task, InvokeError> {
        self.handle.wait().await
    }
}
