//! The `agentreach.v1.Tasks` gRPC service: sidecars create, read, list, change and watch
//! their tenant's durable tasks, kept in the control service's store (etcd in production).
//!
//! One key per task, `/agent-reach/v1/tasks/{tenant}/{id}`, holding the task (protobuf,
//! with its push secret). DEVIATION from `/agent-reach/v1/tenants/{t}/tasks/{id}`: every
//! control replica loads and watches the whole tenant prefix for routing (see [`crate::feed`]),
//! so task writes there would flow through every routing feed; sessions live outside the
//! tenant prefix for the same reason. A task's version is its key's mod revision, so
//! `UpdateTask` with `expected_version` is one compare-and-swap and `WatchTask` resumes from
//! a version with the store's own watch. Every change is checked here (state transitions,
//! finished tasks stay finished, result size) and stamped with its time; a task that reaches
//! a final state is put on a lease that expires after the retention window (leases shared
//! by the tasks finishing within the same minute, so finishing costs no extra lease grant).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::identity::{Authorizer, request_peer};
use agent_reach::model::validate_tenant;
use agent_reach::proto::tasks_server::Tasks;
use agent_reach::proto::{self, TaskState};
use agent_reach::reason::{self, Reason};
use agent_reach_store::{Compare, EventKind, LeaseId, Op, Store, StoreError, Txn};
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

/// Root of every tenant's tasks.
pub const ROOT: &str = "/agent-reach/v1/tasks/";

/// Prefix of every task of `tenant` (ends with `/`).
pub fn tasks_prefix(tenant: &str) -> String {
    format!("{ROOT}{tenant}/")
}

/// Key of one task.
pub fn task_key(tenant: &str, id: &str) -> String {
    format!("{ROOT}{tenant}/{id}")
}

/// What the task store enforces; every limit has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLimits {
    /// Largest result (the sum of the artifacts' part sizes) stored with a task.
    pub max_result_bytes: usize,
    /// Largest message (input, note, question or answer), summed over its parts.
    pub max_message_bytes: usize,
    /// Most messages in one task's conversation.
    pub max_messages: usize,
    /// How long a finished task is kept.
    pub retention: Duration,
    /// Most tasks one ListTasks page returns.
    pub max_page: usize,
}

impl Default for TaskLimits {
    fn default() -> TaskLimits {
        TaskLimits {
            max_result_bytes: 1 << 20,
            max_message_bytes: 1 << 20,
            max_messages: 256,
            retention: Duration::from_secs(24 * 3600),
            max_page: 1000,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether a task in `state` is finished for good.
pub fn is_final(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

fn state_of(t: &proto::Task) -> TaskState {
    t.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or(TaskState::Unspecified)
}

/// Whether a task may go from `from` to `to`.
pub fn transition_allowed(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
    if is_final(from) || to == Unspecified {
        return false;
    }
    match to {
        // Back to submitted: a lost attempt, dispatched again.
        Submitted => matches!(from, Working | InputRequired | AuthRequired),
        Working | Failed | Canceled | Rejected => true,
        InputRequired | AuthRequired | Completed => matches!(from, Working | InputRequired | AuthRequired),
        Unspecified => false,
    }
}

fn message_bytes(m: &proto::TaskMessage) -> usize {
    m.parts.iter().map(|p| p.data.len() + p.uri.len() + p.name.len()).sum()
}

fn result_bytes(t: &proto::Task) -> usize {
    t.artifacts.iter().flat_map(|a| a.parts.iter()).map(|p| p.data.len() + p.uri.len()).sum()
}

/// A task as stored: the task and its push secret (never returned by reads).
fn encode(task: &proto::Task, push_secret: &Bytes) -> Bytes {
    let mut task = task.clone();
    task.version = 0;
    proto::CreateTaskRequest { tenant: task.tenant.clone(), task: Some(task), push_secret: push_secret.clone() }
        .encode_to_vec()
        .into()
}

fn decode(kv: &agent_reach_store::KeyValue) -> Result<(proto::Task, Bytes), Status> {
    let stored = proto::CreateTaskRequest::decode(kv.value.clone())
        .map_err(|e| reason::status(Reason::Internal, format!("stored task {} is corrupt: {e}", kv.key), &[]))?;
    let mut task =
        stored.task.ok_or_else(|| reason::status(Reason::Internal, format!("stored task {} is empty", kv.key), &[]))?;
    task.version = kv.mod_revision as u64;
    Ok((task, stored.push_secret))
}

fn store_status(e: StoreError) -> Status {
    reason::status(Reason::StoreUnavailable, e.to_string(), &[])
}

fn not_found(id: &str) -> Status {
    reason::status(Reason::TaskNotFound, format!("task {id} does not exist"), &[("task_id", id.to_string())])
}

/// Checks a task id: 1..=128 characters of `[A-Za-z0-9._:-]`.
pub fn validate_task_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() || id.len() > 128 {
        return Err(reason::invalid_argument(field, "must be 1 to 128 characters"));
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')) {
        return Err(reason::invalid_argument(field, "may only contain letters, digits, '.', '_', ':' and '-'"));
    }
    Ok(())
}

/// The Tasks service.
pub struct TaskService {
    store: Arc<dyn Store>,
    limits: TaskLimits,
    shutdown: watch::Receiver<bool>,
    authz: Arc<Authorizer>,
    /// The lease finished tasks are put on now, and when it was granted.
    retention_lease: Mutex<Option<(Instant, LeaseId)>>,
}

/// A stream of task events.
pub type EventStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<proto::TaskEvent, Status>> + Send>>;

impl TaskService {
    pub fn new(
        store: Arc<dyn Store>,
        limits: TaskLimits,
        shutdown: watch::Receiver<bool>,
        authz: Arc<Authorizer>,
    ) -> TaskService {
        TaskService { store, limits, shutdown, authz, retention_lease: Mutex::new(None) }
    }

    fn tenant<T>(&self, request: &Request<T>, tenant: &str) -> Result<(), Status> {
        validate_tenant("tenant", tenant).map_err(|f| reason::invalid_argument(&f.field, &f.reason))?;
        self.authz.sidecar(request_peer(request), tenant, None)?;
        Ok(())
    }

    /// The lease a task finishing now goes on: one per minute, living the retention
    /// window plus that minute.
    async fn retention_lease(&self) -> Result<LeaseId, Status> {
        const BUCKET: Duration = Duration::from_secs(60);
        if let Some((at, id)) = *self.retention_lease.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < BUCKET
        {
            return Ok(id);
        }
        let grant = self.store.grant_lease(self.limits.retention + BUCKET).await.map_err(store_status)?;
        *self.retention_lease.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), grant.id));
        Ok(grant.id)
    }

    async fn read(&self, tenant: &str, id: &str) -> Result<(proto::Task, Bytes, i64), Status> {
        let kv = self.store.get(&task_key(tenant, id)).await.map_err(store_status)?.ok_or_else(|| not_found(id))?;
        let (task, secret) = decode(&kv)?;
        Ok((task, secret, kv.mod_revision))
    }

    fn check_message(&self, field: &str, m: &proto::TaskMessage) -> Result<(), Status> {
        let size = message_bytes(m);
        if size > self.limits.max_message_bytes {
            return Err(reason::status(
                Reason::PayloadTooLarge,
                format!("{field} is {size} bytes, over the limit of {}", self.limits.max_message_bytes),
                &[("size", size.to_string()), ("limit", self.limits.max_message_bytes.to_string())],
            ));
        }
        Ok(())
    }

    /// Stores a new task in state SUBMITTED (or answers the existing one).
    pub async fn create(&self, r: proto::CreateTaskRequest) -> Result<proto::CreateTaskReply, Status> {
        let mut task = r.task.ok_or_else(|| reason::invalid_argument("task", "is required"))?;
        validate_task_id("task.id", &task.id)?;
        if task.target.is_none() {
            return Err(reason::invalid_argument("task.target", "is required"));
        }
        for m in &task.messages {
            self.check_message("task.messages", m)?;
        }
        let key = task_key(&r.tenant, &task.id);
        let now = now_ms();
        task.tenant = r.tenant.clone();
        let status = proto::TaskStatus { state: TaskState::Submitted as i32, at_ms: now, ..Default::default() };
        task.status = Some(status.clone());
        task.history = vec![status];
        task.artifacts.clear();
        task.attempts.clear();
        task.created_at_ms = now;
        task.updated_at_ms = now;
        task.expires_at_ms = 0;
        for m in &mut task.messages {
            m.at_ms = now;
        }
        let txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), 0)],
            success: vec![Op::Put { key: key.clone(), value: encode(&task, &r.push_secret), lease: None }],
            failure: vec![],
        };
        let done = self.store.txn(txn).await.map_err(store_status)?;
        if done.succeeded {
            task.version = done.revision as u64;
            return Ok(proto::CreateTaskReply { task: Some(task), created: true });
        }
        let (existing, _, _) = self.read(&r.tenant, &task.id).await?;
        Ok(proto::CreateTaskReply { task: Some(existing), created: false })
    }

    /// Applies one change (see the proto's `UpdateTask`).
    pub async fn update(&self, r: proto::UpdateTaskRequest) -> Result<proto::Task, Status> {
        validate_task_id("task_id", &r.task_id)?;
        for m in &r.messages {
            self.check_message("messages", m)?;
        }
        let key = task_key(&r.tenant, &r.task_id);
        // Retried only when the task changed between the read and the write and the caller
        // did not pin a version.
        for _ in 0..100 {
            let (mut task, secret, revision) = self.read(&r.tenant, &r.task_id).await?;
            if r.expected_version != 0 && r.expected_version as i64 != revision {
                return Err(reason::status(
                    Reason::TaskConflict,
                    format!("task {} is at version {revision}, not {}", r.task_id, r.expected_version),
                    &[("expected_version", r.expected_version.to_string()), ("current_version", revision.to_string())],
                ));
            }
            let from = state_of(&task);
            let now = now_ms();
            let to = r.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default();
            let only_attempt_end = to == TaskState::Unspecified
                && r.messages.is_empty()
                && r.artifacts.is_empty()
                && r.attempt.as_ref().is_some_and(|a| a.ended_at_ms != 0);
            if is_final(from) && !only_attempt_end {
                return Err(reason::status(
                    Reason::TaskFinished,
                    format!("task {} is already {}", r.task_id, from.as_str_name()),
                    &[("state", from.as_str_name().to_string())],
                ));
            }
            if to != TaskState::Unspecified
                && !(to == from && to == TaskState::Working)
                && !transition_allowed(from, to)
            {
                return Err(reason::status(
                    Reason::TaskBadTransition,
                    format!("task {} cannot go from {} to {}", r.task_id, from.as_str_name(), to.as_str_name()),
                    &[("from", from.as_str_name().to_string()), ("to", to.as_str_name().to_string())],
                ));
            }
            if task.messages.len() + r.messages.len() > self.limits.max_messages {
                return Err(reason::status(
                    Reason::PayloadTooLarge,
                    format!("task {} would have more than {} messages", r.task_id, self.limits.max_messages),
                    &[("limit", self.limits.max_messages.to_string())],
                ));
            }
            for m in &r.messages {
                let mut m = m.clone();
                m.at_ms = now;
                task.messages.push(m);
            }
            for a in &r.artifacts {
                match task.artifacts.iter_mut().find(|x| !a.artifact_id.is_empty() && x.artifact_id == a.artifact_id) {
                    Some(existing) => *existing = a.clone(),
                    None => task.artifacts.push(a.clone()),
                }
            }
            let size = result_bytes(&task);
            if size > self.limits.max_result_bytes {
                return Err(reason::status(
                    Reason::TaskResultTooLarge,
                    format!(
                        "the result of task {} is {size} bytes, over the limit of {}",
                        r.task_id, self.limits.max_result_bytes
                    ),
                    &[("size", size.to_string()), ("limit", self.limits.max_result_bytes.to_string())],
                ));
            }
            if let Some(a) = &r.attempt {
                match task.attempts.iter_mut().find(|x| x.number == a.number) {
                    Some(existing) => *existing = a.clone(),
                    None => task.attempts.push(a.clone()),
                }
            }
            if !r.dispatcher.is_empty() {
                task.dispatcher = r.dispatcher.clone();
                task.claim_until_ms = r.claim_until_ms;
            }
            if let Some(s) = &r.status
                && to != TaskState::Unspecified
            {
                let mut s = s.clone();
                s.at_ms = now;
                if let Some(m) = &mut s.message {
                    m.at_ms = now;
                }
                task.status = Some(s.clone());
                task.history.push(s);
            }
            task.updated_at_ms = now;
            let finished = is_final(state_of(&task));
            let lease = if finished {
                task.expires_at_ms = now + self.limits.retention.as_millis() as u64;
                task.claim_until_ms = 0;
                Some(self.retention_lease().await?)
            } else {
                None
            };
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.clone(), revision)],
                success: vec![Op::Put { key: key.clone(), value: encode(&task, &secret), lease }],
                failure: vec![],
            };
            let done = match self.store.txn(txn).await {
                Ok(done) => done,
                // The minute's lease may have been lost (e.g. a store restore): a new one.
                Err(StoreError::LeaseNotFound(_)) => {
                    *self.retention_lease.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    continue;
                }
                Err(e) => return Err(store_status(e)),
            };
            if done.succeeded {
                task.version = done.revision as u64;
                return Ok(task);
            }
            if r.expected_version != 0 {
                continue; // reported as a conflict by the next read
            }
        }
        Err(reason::status(Reason::TaskConflict, format!("task {} changes too often", r.task_id), &[]))
    }

    /// The tenant's tasks, newest first, filtered.
    pub async fn list(&self, r: proto::ListTasksRequest) -> Result<proto::ListTasksReply, Status> {
        let range = self.store.get_prefix(&tasks_prefix(&r.tenant)).await.map_err(store_status)?;
        let states: Vec<i32> = r.states.clone();
        let mut tasks = Vec::new();
        for kv in &range.kvs {
            let (task, _) = decode(kv)?;
            let state = task.status.as_ref().map(|s| s.state).unwrap_or_default();
            if (!states.is_empty() && !states.contains(&state))
                || (!r.context_id.is_empty() && task.context_id != r.context_id)
                || (!r.submitter_agent.is_empty()
                    && task.submitter.as_ref().is_none_or(|c| c.agent != r.submitter_agent))
            {
                continue;
            }
            tasks.push(task);
        }
        tasks.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        let offset: usize = if r.page_token.is_empty() {
            0
        } else {
            r.page_token.parse().map_err(|_| reason::invalid_argument("page_token", "is not a token of ListTasks"))?
        };
        let size = match r.page_size as usize {
            0 => 100,
            n => n.min(self.limits.max_page),
        };
        let total = tasks.len();
        let page: Vec<_> = tasks.into_iter().skip(offset).take(size).collect();
        let next = offset + page.len();
        Ok(proto::ListTasksReply {
            tasks: page,
            next_page_token: if next < total { next.to_string() } else { String::new() },
        })
    }

    /// The task at every version after `after_version`, until its final state.
    pub async fn watch(&self, r: proto::WatchTaskRequest) -> Result<EventStream, Status> {
        validate_task_id("task_id", &r.task_id)?;
        let (first, secret, _) = self.read(&r.tenant, &r.task_id).await?;
        let secret = if r.with_push_secret { secret } else { Bytes::new() };
        let (tx, rx) = mpsc::channel(16);
        let store = self.store.clone();
        let key = task_key(&r.tenant, &r.task_id);
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = shutdown.wait_for(|s| *s).await;
            };
            tokio::select! {
                _ = stop => {}
                _ = follow(store, key, first, r.after_version, secret, tx) => {}
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Sends `task` when it is newer than `after`; returns the new `after`, or `None` when the
/// stream is over (final state sent, or the receiver gone).
async fn send_if_new(
    tx: &mpsc::Sender<Result<proto::TaskEvent, Status>>,
    task: proto::Task,
    after: u64,
    secret: &Bytes,
) -> Option<u64> {
    let final_ = is_final(state_of(&task));
    if task.version <= after {
        return if final_ { None } else { Some(after) };
    }
    let version = task.version;
    tx.send(Ok(proto::TaskEvent { task: Some(task), r#final: final_, push_secret: secret.clone() })).await.ok()?;
    (!final_).then_some(version)
}

async fn follow(
    store: Arc<dyn Store>,
    key: String,
    mut current: proto::Task,
    after: u64,
    secret: Bytes,
    tx: mpsc::Sender<Result<proto::TaskEvent, Status>>,
) {
    let mut after = after;
    loop {
        let start = current.version as i64 + 1;
        let Some(a) = send_if_new(&tx, current.clone(), after, &secret).await else { return };
        after = a;
        let mut stream = match store.watch_prefix(&key, start).await {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(store_status(e))).await;
                return;
            }
        };
        // Until the watch falls behind compaction or the store goes away: then the task is
        // read again (it carries its whole history, so nothing is lost) and watched from there.
        while let Some(Ok(batch)) = stream.next().await {
            for event in batch.events.into_iter().filter(|e| e.kv.key == key) {
                if event.kind == EventKind::Delete {
                    return; // expired after its retention window
                }
                let Ok((task, _)) = decode(&event.kv) else { return };
                current = task.clone();
                let Some(a) = send_if_new(&tx, task, after, &secret).await else { return };
                after = a;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        match store.get(&key).await {
            Ok(Some(kv)) => match decode(&kv) {
                Ok((task, _)) => current = task,
                Err(_) => return,
            },
            Ok(None) => return,
            Err(_) => continue,
        }
    }
}

#[tonic::async_trait]
impl Tasks for TaskService {
    async fn create_task(
        &self,
        request: Request<proto::CreateTaskRequest>,
    ) -> Result<Response<proto::CreateTaskReply>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        Ok(Response::new(self.create(request.into_inner()).await?))
    }

    async fn get_task(&self, request: Request<proto::GetTaskRequest>) -> Result<Response<proto::Task>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        validate_task_id("task_id", &r.task_id)?;
        Ok(Response::new(self.read(&r.tenant, &r.task_id).await?.0))
    }

    async fn list_tasks(
        &self,
        request: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksReply>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        Ok(Response::new(self.list(request.into_inner()).await?))
    }

    async fn update_task(&self, request: Request<proto::UpdateTaskRequest>) -> Result<Response<proto::Task>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        Ok(Response::new(self.update(request.into_inner()).await?))
    }

    type WatchTaskStream = EventStream;

    async fn watch_task(&self, request: Request<proto::WatchTaskRequest>) -> Result<Response<EventStream>, Status> {
        self.tenant(&request, &request.get_ref().tenant)?;
        Ok(Response::new(self.watch(request.into_inner()).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    #[test]
    fn finished_tasks_stay_finished_and_questions_need_a_worker() {
        for done in [Completed, Failed, Canceled, Rejected] {
            for to in [Submitted, Working, InputRequired, Completed, Failed, Canceled] {
                assert!(!transition_allowed(done, to), "{done:?} -> {to:?}");
            }
        }
        assert!(transition_allowed(Submitted, Working));
        assert!(transition_allowed(Submitted, Canceled));
        assert!(!transition_allowed(Submitted, InputRequired));
        assert!(!transition_allowed(Submitted, Completed));
        assert!(transition_allowed(Working, InputRequired));
        assert!(transition_allowed(InputRequired, Working));
        assert!(transition_allowed(Working, Submitted));
        assert!(!transition_allowed(Working, Unspecified));
    }

    #[test]
    fn task_ids_are_checked() {
        assert!(validate_task_id("id", "t-1:a.b_c").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(129)] {
            assert_eq!(validate_task_id("id", bad).unwrap_err().code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    fn service() -> TaskService {
        let store: Arc<dyn Store> = Arc::new(agent_reach_store::EmbeddedStore::new(Default::default()));
        // Watches end when the service shuts down, i.e. when this sender is dropped.
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        let stats = Arc::new(crate::ControlStats::default());
        let authz = Arc::new(Authorizer::new(crate::identity::Mtls::Off, stats));
        TaskService::new(store, TaskLimits { max_result_bytes: 10, ..TaskLimits::default() }, rx, authz)
    }

    fn new_task(id: &str) -> proto::CreateTaskRequest {
        proto::CreateTaskRequest {
            tenant: "t".into(),
            task: Some(proto::Task {
                id: id.into(),
                target: Some(proto::Target { kind: Some(proto::target::Kind::Capability("c".into())), tags: vec![] }),
                ..Default::default()
            }),
            push_secret: Bytes::new(),
        }
    }

    fn to(id: &str, state: TaskState) -> proto::UpdateTaskRequest {
        proto::UpdateTaskRequest {
            tenant: "t".into(),
            task_id: id.into(),
            status: Some(proto::TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_task_records_every_transition_and_refuses_big_results() {
        let s = service();
        let created = s.create(new_task("a")).await.unwrap();
        assert!(created.created);
        let again = s.create(new_task("a")).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.task.unwrap().version, created.task.unwrap().version);

        let working = s.update(to("a", Working)).await.unwrap();
        let mut big = to("a", Completed);
        big.artifacts = vec![proto::TaskArtifact {
            parts: vec![proto::TaskPart { data: Bytes::from(vec![0u8; 11]), ..Default::default() }],
            ..Default::default()
        }];
        let refused = s.update(big).await.unwrap_err();
        assert_eq!(reason::error_info(&refused).unwrap().reason, "TASK_RESULT_TOO_LARGE");
        let mut stale = to("a", Completed);
        stale.expected_version = working.version - 1;
        assert_eq!(reason::error_info(&s.update(stale).await.unwrap_err()).unwrap().reason, "TASK_CONFLICT");

        let done = s.update(to("a", Completed)).await.unwrap();
        let states: Vec<i32> = done.history.iter().map(|h| h.state).collect();
        assert_eq!(states, vec![Submitted as i32, Working as i32, Completed as i32]);
        assert!(done.expires_at_ms > now_ms());
        let finished = s.update(to("a", Failed)).await.unwrap_err();
        assert_eq!(reason::error_info(&finished).unwrap().reason, "TASK_FINISHED");
        let bad = s.create(new_task("b")).await.unwrap();
        assert!(bad.created);
        let err = s.update(to("b", InputRequired)).await.unwrap_err();
        assert_eq!(reason::error_info(&err).unwrap().reason, "TASK_BAD_TRANSITION");

        let listed = s
            .list(proto::ListTasksRequest { tenant: "t".into(), states: vec![Completed as i32], ..Default::default() })
            .await
            .unwrap();
        assert_eq!(listed.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec!["a"]);
    }

    #[tokio::test]
    async fn a_watch_resumes_after_a_version_and_ends_at_the_final_state() {
        let s = service();
        let v1 = s.create(new_task("w")).await.unwrap().task.unwrap().version;
        let v2 = s.update(to("w", Working)).await.unwrap().version;
        let mut events = s
            .watch(proto::WatchTaskRequest {
                tenant: "t".into(),
                task_id: "w".into(),
                after_version: v1,
                with_push_secret: false,
            })
            .await
            .unwrap();
        let first = events.next().await.unwrap().unwrap();
        assert_eq!((first.task.unwrap().version, first.r#final), (v2, false));
        let v3 = s.update(to("w", Completed)).await.unwrap().version;
        let last = events.next().await.unwrap().unwrap();
        assert_eq!((last.task.unwrap().version, last.r#final), (v3, true));
        assert!(events.next().await.is_none());
    }
}
