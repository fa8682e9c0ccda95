//! Durable tasks on the local API (`SubmitTask`, `GetTask`, `ListTasks`, `CancelTask`,
//! `SubscribeTask`, `ReportTask`, `AnswerTask`) and the dispatch of the tasks this sidecar
//! is responsible for ([`dispatch`]).
//!
//! Tasks are kept by the control service (`agentreach.v1.Tasks`, in etcd); this module
//! holds no task state of its own beyond the dispatches it runs, so a restart loses
//! nothing: a task whose dispatcher stopped renewing its claim is taken over by the next
//! recovery pass of any sidecar of the tenant (the same sidecar after a restart at once).
//! Every request acts in the sidecar's tenant. [`Tasks`] is also the API the sidecar's
//! other front ends (the A2A binding) call; its methods answer statuses whose ErrorInfo
//! reasons come from control unchanged (TASK_NOT_FOUND, TASK_FINISHED, ...).

mod caller;
pub(crate) mod dispatch;
mod failure;
mod push;

pub use push::sign;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_reach::proto::tasks_client::TasksClient;
use agent_reach::proto::{self, TaskState};
use agent_reach::reason::{self, Reason};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::Status;
use tonic::transport::Channel;

use crate::control::{Failover, Rules};

/// The name of the artifact holding the agent's reply.
pub(crate) const RESULT_ARTIFACT: &str = "result";

/// A task's changes as the local API streams them.
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<proto::TaskEvent, Status>> + Send>>;

/// Counters of the dispatcher (read by tests and the benchmark).
#[derive(Debug, Default)]
pub struct TaskStats {
    /// Attempts started (calls made to agents).
    pub attempts: AtomicU64,
    /// Tasks taken over from a dispatcher that stopped renewing its claim.
    pub taken_over: AtomicU64,
    /// Tasks finished by this sidecar's dispatcher.
    pub finished: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The task front end and dispatcher of one sidecar.
pub struct Tasks {
    tenant: String,
    sidecar_id: String,
    /// The tasks service of every control endpoint.
    control: Failover<TasksClient<Channel>>,
    /// This sidecar's outbound stack, through which tasks are dispatched like any call
    /// (as their verified submitter, see [`caller`]).
    invoker: OnceLock<caller::TaskInvoker>,
    /// Tasks this sidecar dispatches now.
    running: Mutex<std::collections::HashSet<String>>,
    claim_ttl: Duration,
    task_timeout: Duration,
    stats: TaskStats,
    shutdown: watch::Receiver<bool>,
}

impl Tasks {
    /// Clients of every control endpoint on `channels`; nothing is dialled until used.
    pub(crate) fn new(
        config: &crate::config::SidecarConfig,
        channels: Vec<(String, Channel)>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Tasks, String> {
        let endpoints = channels.into_iter().map(|(uri, c)| (uri, TasksClient::new(c))).collect();
        let control = Failover::new(endpoints, config.control_timeout, Rules::Agent)?;
        Ok(Tasks {
            tenant: config.tenant.clone(),
            sidecar_id: config.sidecar_id.clone(),
            control,
            invoker: OnceLock::new(),
            running: Mutex::new(Default::default()),
            claim_ttl: config.task_claim_ttl,
            task_timeout: config.task_timeout,
            stats: TaskStats::default(),
            shutdown,
        })
    }

    /// Dispatches through `entry` (the sidecar's outbound stack), reading answers of up to
    /// `reply_limit` bytes.
    pub(crate) fn set_invoker(&self, entry: crate::outbound::invoke::InvokeEntry, reply_limit: usize) {
        let _ = self.invoker.set(caller::TaskInvoker::new(entry, reply_limit));
    }

    /// The dispatcher's counters.
    pub fn stats(&self) -> &TaskStats {
        &self.stats
    }

    /// Calls control, trying each endpoint once while they answer UNAVAILABLE or time out
    /// ([`Failover`]).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(TasksClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.control.call(f).await
    }

    fn check_tenant(&self, requested: &str) -> Result<String, Status> {
        if !requested.is_empty() && requested != self.tenant {
            return Err(reason::status(
                Reason::PermissionDenied,
                format!("this sidecar serves tenant {:?}, not {requested:?}", self.tenant),
                &[("tenant", requested.to_string())],
            ));
        }
        Ok(self.tenant.clone())
    }

    pub(crate) async fn update(&self, mut r: proto::UpdateTaskRequest) -> Result<proto::Task, Status> {
        r.tenant = self.tenant.clone();
        self.call(|mut c| {
            let r = r.clone();
            async move { c.update_task(r).await }
        })
        .await
    }

    /// `SubmitTask` by `submitter` (verified by its credential; `None`: anonymous): stores
    /// the task (claimed by this sidecar) and starts dispatching it as that caller.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        r: proto::SubmitTaskRequest,
        submitter: Option<crate::call::Caller>,
    ) -> Result<proto::SubmitTaskReply, Status> {
        let target = r.target.ok_or_else(|| reason::invalid_argument("target", "is required"))?;
        if target.kind.is_none() {
            return Err(reason::invalid_argument("target", "name an agent or a capability"));
        }
        let mut message = r.message.unwrap_or_default();
        if message.parts.is_empty() {
            return Err(reason::invalid_argument("message.parts", "a task needs an input (at least one part)"));
        }
        message.role = proto::TaskRole::User as i32;
        if message.message_id.is_empty() {
            message.message_id = new_id("m");
        }
        let id = if r.task_id.is_empty() { new_id("task") } else { r.task_id };
        let push_secret: bytes::Bytes = match &r.push {
            Some(push) => {
                push::check_push(push)?;
                rand::random::<[u8; 32]>().to_vec().into()
            }
            None => bytes::Bytes::new(),
        };
        let task = proto::Task {
            id,
            context_id: if r.context_id.is_empty() { r.session_id.clone() } else { r.context_id },
            target: Some(target),
            priority: r.priority,
            session_id: r.session_id,
            submitter: r.caller,
            messages: vec![message],
            metadata: r.metadata,
            push: r.push,
            dispatcher: self.sidecar_id.clone(),
            claim_until_ms: dispatch::now_ms() + self.claim_ttl.as_millis() as u64,
            run_once: r.run_once,
            verified_submitter: caller::record(submitter.as_ref()),
            ..Default::default()
        };
        let request = proto::CreateTaskRequest {
            tenant: self.tenant.clone(),
            task: Some(task),
            push_secret: push_secret.clone(),
        };
        let created = self
            .call(|mut c| {
                let r = request.clone();
                async move { c.create_task(r).await }
            })
            .await?;
        let task = created.task.unwrap_or_default();
        if created.created {
            self.clone().start(task.clone(), push_secret.clone());
        }
        Ok(proto::SubmitTaskReply {
            task: Some(task),
            push_secret: if created.created { push_secret } else { Default::default() },
            created: created.created,
        })
    }

    /// `GetTask`.
    pub(crate) async fn get(&self, task_id: &str) -> Result<proto::Task, Status> {
        let r = proto::GetTaskRequest { tenant: self.tenant.clone(), task_id: task_id.to_string() };
        self.call(|mut c| {
            let r = r.clone();
            async move { c.get_task(r).await }
        })
        .await
    }

    /// `ListTasks`.
    pub(crate) async fn list(&self, mut r: proto::ListTasksRequest) -> Result<proto::ListTasksReply, Status> {
        r.tenant = self.check_tenant(&r.tenant)?;
        self.call(|mut c| {
            let r = r.clone();
            async move { c.list_tasks(r).await }
        })
        .await
    }

    /// `CancelTask`: the task ends CANCELED; its dispatcher then cancels the agent's call.
    pub(crate) async fn cancel(&self, r: proto::CancelTaskRequest) -> Result<proto::Task, Status> {
        self.update(proto::UpdateTaskRequest {
            task_id: r.task_id,
            status: Some(proto::TaskStatus {
                state: TaskState::Canceled as i32,
                reason: "CANCELED".into(),
                detail: r.reason,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
    }

    /// `SubscribeTask`: control's watch, reconnected from the last version seen when it
    /// breaks (a control restart), so the subscriber misses nothing.
    pub(crate) async fn subscribe(&self, r: proto::SubscribeTaskRequest) -> Result<EventStream, Status> {
        self.watch_stream(&r.task_id, r.after_version, false).await
    }

    /// `ReportTask` by `instance` (registered here): progress, a question, or the end.
    pub(crate) async fn report(&self, r: proto::ReportTaskRequest, agent: &str) -> Result<proto::Task, Status> {
        let state = TaskState::try_from(r.state).unwrap_or_default();
        if !matches!(
            state,
            TaskState::Working
                | TaskState::InputRequired
                | TaskState::AuthRequired
                | TaskState::Completed
                | TaskState::Failed
                | TaskState::Rejected
        ) {
            return Err(reason::invalid_argument(
                "state",
                "an agent reports WORKING, INPUT_REQUIRED, AUTH_REQUIRED, COMPLETED, FAILED or REJECTED",
            ));
        }
        let message = r.message.map(|mut m| {
            m.role = proto::TaskRole::Agent as i32;
            if m.message_id.is_empty() {
                m.message_id = new_id("m");
            }
            m.metadata.insert("agent".into(), agent.to_string());
            m.metadata.insert("instance_id".into(), r.instance_id.clone());
            m
        });
        self.update(proto::UpdateTaskRequest {
            task_id: r.task_id,
            status: Some(proto::TaskStatus { state: state as i32, message: message.clone(), ..Default::default() }),
            messages: message.into_iter().collect(),
            artifacts: r.artifacts,
            ..Default::default()
        })
        .await
    }

    /// `AnswerTask`: only a task waiting for input (or authentication) takes an answer.
    pub(crate) async fn answer(&self, r: proto::AnswerTaskRequest) -> Result<proto::Task, Status> {
        let mut message = r.message.unwrap_or_default();
        if message.parts.is_empty() {
            return Err(reason::invalid_argument("message.parts", "an answer needs at least one part"));
        }
        message.role = proto::TaskRole::User as i32;
        if message.message_id.is_empty() {
            message.message_id = new_id("m");
        }
        for _ in 0..10 {
            let task = self.get(&r.task_id).await?;
            let state = task.status.as_ref().map(|s| s.state).unwrap_or_default();
            if state != TaskState::InputRequired as i32 && state != TaskState::AuthRequired as i32 {
                return Err(reason::status(
                    Reason::TaskBadTransition,
                    format!("task {} is not waiting for input", r.task_id),
                    &[("state", TaskState::try_from(state).unwrap_or_default().as_str_name().to_string())],
                ));
            }
            let answered = self
                .update(proto::UpdateTaskRequest {
                    task_id: r.task_id.clone(),
                    expected_version: task.version,
                    status: Some(proto::TaskStatus { state: TaskState::Working as i32, ..Default::default() }),
                    messages: vec![message.clone()],
                    ..Default::default()
                })
                .await;
            match answered {
                Err(s) if reason::error_info(&s).is_some_and(|i| i.reason == Reason::TaskConflict.as_str()) => continue,
                other => return other,
            }
        }
        Err(reason::status(Reason::TaskConflict, format!("task {} changes too often", r.task_id), &[]))
    }
}

/// A new random id with `prefix`.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// The local API's task methods.
pub(crate) const PATHS: &[&str] = &[
    "/agentreach.v1.Sidecar/SubmitTask",
    "/agentreach.v1.Sidecar/GetTask",
    "/agentreach.v1.Sidecar/ListTasks",
    "/agentreach.v1.Sidecar/CancelTask",
    "/agentreach.v1.Sidecar/SubscribeTask",
    "/agentreach.v1.Sidecar/ReportTask",
    "/agentreach.v1.Sidecar/AnswerTask",
];

/// The agent of an instance registered here.
fn local_agent(registry: &crate::registry::Registry, instance: &str) -> Result<String, Status> {
    if instance.is_empty() {
        return Err(reason::invalid_argument("instance_id", "name the instance (registered here) that reports"));
    }
    let local = registry.get(instance).ok_or_else(|| {
        reason::status(
            Reason::InstanceNotFound,
            format!("instance {instance} is not registered at this sidecar"),
            &[("instance", instance.to_string())],
        )
    })?;
    Ok(local.registration.agent.clone())
}

/// Serves one task method of the local API.
pub(crate) async fn local_api(
    tasks: Arc<Tasks>,
    registry: Arc<crate::registry::Registry>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<crate::grpc::Body> {
    let path = req.uri().path().rsplit('/').next().unwrap_or_default().to_string();
    match path.as_str() {
        "SubmitTask" => {
            let submitter = match caller::submitter(&registry, req.headers()) {
                Ok(s) => s,
                Err(status) => return crate::grpc::status_response(status),
            };
            unary(req, move |r: tonic::Request<proto::SubmitTaskRequest>| {
                let (tasks, submitter) = (tasks.clone(), submitter.clone());
                async move { tasks.submit(r.into_inner(), submitter).await }
            })
            .await
        }
        "GetTask" => {
            unary(req, move |r: tonic::Request<proto::GetTaskRequest>| {
                let tasks = tasks.clone();
                async move {
                    let r = r.into_inner();
                    tasks.check_tenant(&r.tenant)?;
                    tasks.get(&r.task_id).await
                }
            })
            .await
        }
        "ListTasks" => {
            unary(req, move |r: tonic::Request<proto::ListTasksRequest>| {
                let tasks = tasks.clone();
                async move { tasks.list(r.into_inner()).await }
            })
            .await
        }
        "CancelTask" => {
            unary(req, move |r: tonic::Request<proto::CancelTaskRequest>| {
                let tasks = tasks.clone();
                async move { tasks.cancel(r.into_inner()).await }
            })
            .await
        }
        "ReportTask" => {
            unary(req, move |r: tonic::Request<proto::ReportTaskRequest>| {
                let (tasks, registry) = (tasks.clone(), registry.clone());
                async move {
                    let r = r.into_inner();
                    let agent = local_agent(&registry, &r.instance_id)?;
                    tasks.report(r, &agent).await
                }
            })
            .await
        }
        "AnswerTask" => {
            unary(req, move |r: tonic::Request<proto::AnswerTaskRequest>| {
                let tasks = tasks.clone();
                async move { tasks.answer(r.into_inner()).await }
            })
            .await
        }
        _ => {
            struct Svc(Arc<Tasks>);
            impl tonic::server::ServerStreamingService<proto::SubscribeTaskRequest> for Svc {
                type Response = proto::TaskEvent;
                type ResponseStream = EventStream;
                type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<EventStream>, Status>> + Send>>;
                fn call(&mut self, r: tonic::Request<proto::SubscribeTaskRequest>) -> Self::Future {
                    let tasks = self.0.clone();
                    Box::pin(async move { tasks.subscribe(r.into_inner()).await.map(tonic::Response::new) })
                }
            }
            let mut grpc = tonic::server::Grpc::new(agent_reach::codec::StrictCodec::<
                proto::TaskEvent,
                proto::SubscribeTaskRequest,
            >::default());
            grpc.server_streaming(Svc(tasks), req).await.map(crate::grpc::Body::Tonic)
        }
    }
}

/// A unary method whose failures are statuses (control's pass through unchanged).
async fn unary<Req, Resp, F, Fut>(
    req: http::Request<hyper::body::Incoming>,
    handler: F,
) -> http::Response<crate::grpc::Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(tonic::Request<Req>) -> Fut + Send,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    struct Svc<F>(F);
    impl<Req, Resp, F, Fut> tonic::server::UnaryService<Req> for Svc<F>
    where
        F: FnMut(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        type Response = Resp;
        type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Resp>, Status>> + Send>>;
        fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
            let fut = (self.0)(request);
            Box::pin(async move { fut.await.map(tonic::Response::new) })
        }
    }
    let mut grpc = tonic::server::Grpc::new(agent_reach::codec::StrictCodec::<Resp, Req>::default());
    grpc.unary(Svc(handler), req).await.map(crate::grpc::Body::Tonic)
}
