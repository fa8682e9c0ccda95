//! Dispatch of durable tasks: the sidecar that stores a task claims it and calls an
//! instance of its target through its own outbound stack, as the task's verified submitter
//! (see `caller`; so admission, priorities, authorization, rate limits, retries and
//! breakers are those of any call), with the task id as the idempotency key and the
//! metadata `ar-task-id` / `ar-task-attempt`.
//!
//! One attempt is one call. Its outcome decides the task: a reply completes it (the reply is
//! the artifact "result"; over the result limit it fails with TASK_RESULT_TOO_LARGE); an
//! agent's error fails it (or rejects it, for PERMISSION_DENIED / UNAUTHENTICATED); a call
//! that was never delivered (no instance, breaker open, overloaded) is tried again after a
//! back-off; a call whose instance or sidecar went away mid-work is tried again on another
//! instance, unless the task is `run_once`, which then ends FAILED with INSTANCE_LOST. The
//! task's final state (a cancel, or the agent's own report) ends the attempt at once: the
//! call is dropped, which cancels it at the agent. Attempts are bounded by count and by
//! `--task-timeout`, so no task hangs.
//!
//! The claim: the dispatcher is named in the task with a deadline, renewed every third of
//! `--task-claim-ttl` while it runs. [`Tasks::run_recovery`] takes over unfinished tasks
//! whose claim lapsed (their dispatcher died), and, after a restart, this sidecar's own.
//! An attempt left open by a dead dispatcher is recorded as "lost".
//!
//! Push notifications: while a task with `push` is dispatched here, every change is
//! posted, in order, to the webhook (JSON, `x-agent-reach-signature: sha256=<hex
//! HMAC-SHA256 of the body>` keyed by the task's secret) or invoked on the mesh target
//! (payload: the `TaskEvent`, signature in metadata `ar-task-signature`), each retried with
//! back-off until delivered.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::proto::tasks_client::TasksClient;
use agent_reach::proto::{self, TaskState};
use agent_reach::reason::{self, Reason};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{EventStream, META_TASK_ATTEMPT, META_TASK_ID, RESULT_ARTIFACT, Tasks, lock};

/// Most attempts of one task.
pub const MAX_ATTEMPTS: u32 = 20;
/// Longest pause between two attempts (and between two deliveries of a push).
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A push notification not delivered for this long is dropped.
pub const PUSH_GIVE_UP: Duration = Duration::from_secs(600);
/// Header (webhook) and metadata key (mesh target) of a push's signature.
pub const SIGNATURE_HEADER: &str = "x-agent-reach-signature";
pub const SIGNATURE_METADATA: &str = "ar-task-signature";

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn state_of(t: &proto::Task) -> TaskState {
    t.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default()
}

/// Whether a task in `state` is finished for good.
pub fn is_final(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

fn backoff(n: u32) -> Duration {
    (Duration::from_millis(100) * 2u32.saturating_pow(n.min(10))).min(MAX_BACKOFF)
}

fn reason_of(status: &Status) -> String {
    match reason::error_info(status) {
        Some(info) => info.reason,
        None => {
            let mut name = String::new();
            for (i, c) in format!("{:?}", status.code()).chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            name
        }
    }
}

/// Whether control (or the store behind it) could not be reached: worth retrying.
fn transient(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled)
}

/// How an attempt's call failed.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// Never reached an agent: try again later.
    NotDelivered,
    /// The instance (or its sidecar) went away, maybe mid-work.
    Lost,
    /// The agent answered an error: the task fails (or is rejected).
    Agent,
}

fn classify(status: &Status) -> Failure {
    if let Some(info) = reason::error_info(status) {
        return match Reason::parse(&info.reason) {
            Some(
                Reason::NoHealthyInstance
                | Reason::AgentNotFound
                | Reason::CircuitOpen
                | Reason::AgentOverloaded
                | Reason::RateLimited
                | Reason::ShuttingDown
                | Reason::ControlUnavailable,
            ) => Failure::NotDelivered,
            Some(Reason::InstanceUnreachable | Reason::SidecarUnreachable) => Failure::Lost,
            _ => Failure::Agent,
        };
    }
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled => Failure::Lost,
        _ => Failure::Agent,
    }
}

/// Checks a push target when a task is submitted.
pub fn check_push(push: &proto::TaskPush) -> Result<(), Status> {
    match &push.kind {
        Some(proto::task_push::Kind::Url(url)) => {
            let uri: http::Uri = url.parse().map_err(|_| reason::invalid_argument("push.url", "is not a URL"))?;
            if uri.scheme_str() != Some("http") || uri.host().is_none() {
                return Err(reason::invalid_argument(
                    "push.url",
                    "must be an http:// URL (https webhooks are not supported yet)",
                ));
            }
            Ok(())
        }
        Some(proto::task_push::Kind::Target(t)) if t.kind.is_some() => Ok(()),
        _ => Err(reason::invalid_argument("push", "name a url or a mesh target")),
    }
}

/// The HMAC-SHA256 of `body` under `secret`, as `sha256=<hex>`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The JSON body of a webhook push: the task's status after one change.
pub fn push_body(event: &proto::TaskEvent) -> Vec<u8> {
    let task = event.task.clone().unwrap_or_default();
    let status = task.status.clone().unwrap_or_default();
    serde_json::json!({
        "taskId": task.id,
        "contextId": task.context_id,
        "version": task.version,
        "final": event.r#final,
        "status": {
            "state": TaskState::try_from(status.state).unwrap_or_default().as_str_name(),
            "atMs": status.at_ms,
            "reason": status.reason,
            "detail": status.detail,
        },
    })
    .to_string()
    .into_bytes()
}

/// How one attempt ended.
enum Outcome {
    Replied(Box<proto::InvokeReply>),
    Failed(Status),
    /// The task reached a final state while the call ran (cancel, the agent's report).
    Ended(Box<proto::Task>),
    /// The sidecar stops: the claim lapses and the task is resumed later.
    Stopped,
}

impl Tasks {
    /// Starts dispatching `task` here (and pushing its changes), unless it already is.
    pub(crate) fn start(self: Arc<Self>, task: proto::Task, _secret: Bytes) {
        if !lock(&self.running).insert(task.id.clone()) {
            return;
        }
        if task.push.is_some() {
            tokio::spawn(self.clone().push_changes(task.id.clone(), task.version.saturating_sub(1)));
        }
        tokio::spawn(async move {
            let id = task.id.clone();
            self.dispatch(task).await;
            lock(&self.running).remove(&id);
        });
    }

    /// Control's watch of a task as a stream that survives control restarts.
    pub(crate) async fn watch_stream(
        &self,
        task_id: &str,
        after_version: u64,
        with_push_secret: bool,
    ) -> Result<EventStream, Status> {
        let request = proto::WatchTaskRequest {
            tenant: self.tenant.clone(),
            task_id: task_id.to_string(),
            after_version,
            with_push_secret,
        };
        let first = self
            .call(|mut c| {
                let r = request.clone();
                async move { c.watch_task(r).await }
            })
            .await?;
        let (tx, rx) = mpsc::channel(16);
        let endpoints = self.control.clients();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = shutdown.wait_for(|s| *s).await;
            };
            tokio::select! {
                _ = stop => {}
                _ = relay(endpoints, request, first, tx) => {}
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    /// An update that must land: retried with back-off while control is unreachable.
    async fn update_retrying(&self, r: proto::UpdateTaskRequest) -> Result<proto::Task, Status> {
        let mut n = 0;
        loop {
            match self.update(r.clone()).await {
                Err(s) if transient(&s) && !*self.shutdown.borrow() => {
                    tokio::time::sleep(backoff(n)).await;
                    n += 1;
                }
                other => return other,
            }
        }
    }

    fn claim(&self) -> (String, u64) {
        (self.sidecar_id.clone(), now_ms() + self.claim_ttl.as_millis() as u64)
    }

    /// Ends the task in `state` with a reason, closing `attempt` if given.
    async fn finish(
        &self,
        task: &proto::Task,
        state: TaskState,
        why: &str,
        detail: String,
        attempt: Option<proto::TaskAttempt>,
    ) {
        let r = proto::UpdateTaskRequest {
            task_id: task.id.clone(),
            status: Some(proto::TaskStatus { state: state as i32, reason: why.into(), detail, ..Default::default() }),
            attempt: attempt.clone(),
            ..Default::default()
        };
        match self.update_retrying(r).await {
            Ok(_) => {
                self.stats.finished.fetch_add(1, Ordering::Relaxed);
            }
            Err(s) if reason_of(&s) == Reason::TaskFinished.as_str() => self.end_attempt(task, attempt).await,
            Err(s) => tracing::warn!(task = %task.id, "cannot finish the task: {s}"),
        }
    }

    /// Records the end of an attempt of a task that is already finished.
    async fn end_attempt(&self, task: &proto::Task, attempt: Option<proto::TaskAttempt>) {
        if let Some(a) = attempt {
            let r = proto::UpdateTaskRequest { task_id: task.id.clone(), attempt: Some(a), ..Default::default() };
            if let Err(s) = self.update_retrying(r).await {
                tracing::debug!(task = %task.id, "cannot record the attempt's end: {s}");
            }
        }
    }

    /// Runs attempts until the task is finished (or the sidecar stops).
    async fn dispatch(self: &Arc<Self>, mut task: proto::Task) {
        let started = Instant::now();
        let mut failures = 0u32;
        loop {
            if *self.shutdown.borrow() || is_final(state_of(&task)) {
                return;
            }
            // An attempt left open by a dispatcher that died: its instance may have run it.
            if let Some(open) = task.attempts.iter().find(|a| a.ended_at_ms == 0).cloned() {
                let lost = proto::TaskAttempt { ended_at_ms: now_ms(), outcome: "lost".into(), ..open };
                if task.run_once {
                    let detail = format!("attempt {} was cut off and the task must not run twice", lost.number);
                    self.finish(&task, TaskState::Failed, "INSTANCE_LOST", detail, Some(lost)).await;
                    return;
                }
                let (dispatcher, claim_until_ms) = self.claim();
                let r = proto::UpdateTaskRequest {
                    task_id: task.id.clone(),
                    attempt: Some(lost),
                    dispatcher,
                    claim_until_ms,
                    ..Default::default()
                };
                match self.update_retrying(r).await {
                    Ok(t) => task = t,
                    Err(s) => {
                        tracing::warn!(task = %task.id, "cannot record a lost attempt: {s}");
                        return;
                    }
                }
                continue;
            }
            let number = task.attempts.iter().map(|a| a.number).max().unwrap_or(0) + 1;
            if number > MAX_ATTEMPTS || started.elapsed() > self.task_timeout {
                let detail = format!("no attempt succeeded in {} tries", number - 1);
                self.finish(&task, TaskState::Failed, "TASK_ATTEMPTS_EXHAUSTED", detail, None).await;
                return;
            }
            let attempt = proto::TaskAttempt { number, started_at_ms: now_ms(), ..Default::default() };
            let (dispatcher, claim_until_ms) = self.claim();
            let r = proto::UpdateTaskRequest {
                task_id: task.id.clone(),
                expected_version: task.version,
                status: Some(proto::TaskStatus { state: TaskState::Working as i32, ..Default::default() }),
                attempt: Some(attempt.clone()),
                dispatcher,
                claim_until_ms,
                ..Default::default()
            };
            match self.update_retrying(r).await {
                Ok(t) => task = t,
                Err(s) if reason_of(&s) == Reason::TaskConflict.as_str() => {
                    match self.get(&task.id).await {
                        Ok(t) => task = t,
                        Err(_) => tokio::time::sleep(backoff(failures)).await,
                    }
                    continue;
                }
                Err(s) => {
                    tracing::debug!(task = %task.id, "not dispatching: {s}");
                    return;
                }
            }
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let outcome = self.run_attempt(&task, number).await;
            let ended = |instance: &str, agent: &str, outcome: &str| proto::TaskAttempt {
                instance_id: instance.to_string(),
                agent: agent.to_string(),
                ended_at_ms: now_ms(),
                outcome: outcome.to_string(),
                ..attempt.clone()
            };
            match outcome {
                Outcome::Stopped => return,
                Outcome::Ended(t) => {
                    let state = state_of(&t).as_str_name().trim_start_matches("TASK_STATE_").to_lowercase();
                    self.end_attempt(&t, Some(ended("", "", &state))).await;
                    return;
                }
                Outcome::Replied(reply) => {
                    let artifact = proto::TaskArtifact {
                        artifact_id: RESULT_ARTIFACT.into(),
                        name: RESULT_ARTIFACT.into(),
                        parts: vec![proto::TaskPart {
                            data: reply.payload.clone(),
                            content_type: reply.content_type.clone(),
                            ..Default::default()
                        }],
                        metadata: reply.metadata.clone(),
                        ..Default::default()
                    };
                    let a = ended(&reply.instance_id, &reply.agent, "completed");
                    let r = proto::UpdateTaskRequest {
                        task_id: task.id.clone(),
                        status: Some(proto::TaskStatus { state: TaskState::Completed as i32, ..Default::default() }),
                        artifacts: vec![artifact],
                        attempt: Some(a.clone()),
                        ..Default::default()
                    };
                    match self.update_retrying(r).await {
                        Ok(_) => {
                            self.stats.finished.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(s) if reason_of(&s) == Reason::TaskResultTooLarge.as_str() => {
                            let a = proto::TaskAttempt { outcome: Reason::TaskResultTooLarge.as_str().into(), ..a };
                            self.finish(
                                &task,
                                TaskState::Failed,
                                Reason::TaskResultTooLarge.as_str(),
                                s.message().into(),
                                Some(a),
                            )
                            .await;
                        }
                        // Canceled meanwhile, or the agent reported its own end.
                        Err(s) if reason_of(&s) == Reason::TaskFinished.as_str() => {
                            self.end_attempt(&task, Some(a)).await
                        }
                        Err(s) => tracing::warn!(task = %task.id, "cannot complete the task: {s}"),
                    }
                    return;
                }
                Outcome::Failed(status) => {
                    // Ended meanwhile (a cancel, the agent's own report): the call's error
                    // is only the consequence.
                    if let Ok(t) = self.get(&task.id).await
                        && is_final(state_of(&t))
                    {
                        let state = state_of(&t).as_str_name().trim_start_matches("TASK_STATE_").to_lowercase();
                        self.end_attempt(&t, Some(ended("", "", &state))).await;
                        return;
                    }
                    let why = reason_of(&status);
                    match classify(&status) {
                        Failure::Agent => {
                            let state = if matches!(status.code(), Code::PermissionDenied | Code::Unauthenticated) {
                                TaskState::Rejected
                            } else {
                                TaskState::Failed
                            };
                            let a = ended("", "", &why);
                            self.finish(&task, state, &why, status.message().to_string(), Some(a)).await;
                            return;
                        }
                        Failure::Lost if task.run_once => {
                            let a = ended("", "", "lost");
                            let detail = format!("{why}: {}; the task must not run twice", status.message());
                            self.finish(&task, TaskState::Failed, "INSTANCE_LOST", detail, Some(a)).await;
                            return;
                        }
                        kind => {
                            let outcome = if kind == Failure::Lost { format!("lost: {why}") } else { why };
                            let r = proto::UpdateTaskRequest {
                                task_id: task.id.clone(),
                                attempt: Some(ended("", "", &outcome)),
                                ..Default::default()
                            };
                            match self.update_retrying(r).await {
                                Ok(t) => task = t,
                                Err(_) => return,
                            }
                            tokio::time::sleep(backoff(failures)).await;
                            failures += 1;
                        }
                    }
                }
            }
        }
    }

    /// One call to the task's target, ended early by the task's final state or a stop;
    /// the claim is renewed while it runs.
    async fn run_attempt(self: &Arc<Self>, task: &proto::Task, number: u32) -> Outcome {
        let Some(invoker) = self.invoker.get().cloned() else {
            return Outcome::Failed(Status::unavailable("the sidecar's outbound stack is not up"));
        };
        let input = task.messages.first().and_then(|m| m.parts.first()).cloned().unwrap_or_default();
        let mut metadata = task.metadata.clone();
        metadata.insert(META_TASK_ID.into(), task.id.clone());
        metadata.insert(META_TASK_ATTEMPT.into(), number.to_string());
        let invoke = proto::InvokeRequest {
            target: task.target.clone(),
            payload: input.data,
            content_type: input.content_type,
            session_id: task.session_id.clone(),
            priority: task.priority,
            idempotency_key: task.id.clone(),
            metadata,
            message_id: format!("{}.{number}", task.id),
            caller: task.submitter.clone(),
        };
        let (submitter, timeout) = (super::caller::of(task), self.task_timeout);
        let call = async move { invoker.invoke(invoke, submitter, Some(timeout)).await };
        tokio::pin!(call);
        // Without a watch (control unreachable) the attempt still runs; the final state
        // is then noticed when the call ends.
        let (mut events, mut watching): (EventStream, bool) =
            match self.watch_stream(&task.id, task.version, false).await {
                Ok(s) => (s, true),
                Err(_) => (Box::pin(futures_util::stream::pending()), false),
            };
        let mut renew = tokio::time::interval_at(Instant::now() + self.claim_ttl / 3, self.claim_ttl / 3);
        let mut shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                result = &mut call => {
                    return match result {
                        Ok(reply) => Outcome::Replied(Box::new(reply)),
                        Err(status) => Outcome::Failed(status),
                    };
                }
                event = events.next(), if watching => {
                    match event {
                        Some(Ok(e)) if e.r#final => return Outcome::Ended(Box::new(e.task.unwrap_or_default())),
                        Some(Ok(_)) => {}
                        _ => watching = false,
                    }
                }
                _ = renew.tick() => {
                    let (dispatcher, claim_until_ms) = self.claim();
                    let r = proto::UpdateTaskRequest { task_id: task.id.clone(), dispatcher, claim_until_ms, ..Default::default() };
                    if let Err(s) = self.update(r).await {
                        tracing::debug!(task = %task.id, "claim not renewed: {s}");
                    }
                }
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return Outcome::Stopped,
            }
        }
    }

    /// Takes over, every third of the claim TTL, the tenant's unfinished tasks whose
    /// dispatcher stopped renewing its claim, and this sidecar's own after a restart.
    pub(crate) async fn run_recovery(self: Arc<Self>) {
        let mut shutdown = self.shutdown.clone();
        let period = (self.claim_ttl / 3).max(Duration::from_millis(200));
        let mut tick = tokio::time::interval_at(Instant::now() + Duration::from_millis(500), period);
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            if let Err(s) = self.recover_once().await {
                tracing::debug!("task recovery pass failed: {s}");
            }
        }
    }

    /// One recovery pass; returns how many tasks it took over.
    pub async fn recover_once(self: &Arc<Self>) -> Result<usize, Status> {
        let mut token = String::new();
        let mut taken = 0;
        loop {
            let page = self
                .list(proto::ListTasksRequest {
                    states: vec![
                        TaskState::Submitted as i32,
                        TaskState::Working as i32,
                        TaskState::InputRequired as i32,
                        TaskState::AuthRequired as i32,
                    ],
                    page_size: 1000,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await?;
            let now = now_ms();
            for t in page.tasks {
                if lock(&self.running).contains(&t.id) {
                    continue;
                }
                if t.dispatcher != self.sidecar_id && t.claim_until_ms > now {
                    continue;
                }
                let (dispatcher, claim_until_ms) = self.claim();
                let r = proto::UpdateTaskRequest {
                    task_id: t.id.clone(),
                    expected_version: t.version,
                    dispatcher,
                    claim_until_ms,
                    ..Default::default()
                };
                if let Ok(t) = self.update(r).await {
                    self.stats.taken_over.fetch_add(1, Ordering::Relaxed);
                    taken += 1;
                    self.clone().start(t, Bytes::new());
                }
            }
            if page.next_page_token.is_empty() {
                return Ok(taken);
            }
            token = page.next_page_token;
        }
    }

    /// Posts every change of the task after `after` to its push target, in order, each
    /// retried with back-off until delivered, until the final state is delivered.
    async fn push_changes(self: Arc<Self>, task_id: String, after: u64) {
        let Ok(mut events) = self.watch_stream(&task_id, after, true).await else { return };
        while let Some(Ok(event)) = events.next().await {
            let Some(push) = event.task.as_ref().and_then(|t| t.push.clone()) else { return };
            let secret = event.push_secret.clone();
            let final_ = event.r#final;
            let mut event = event;
            event.push_secret = Bytes::new();
            let give_up = Instant::now() + PUSH_GIVE_UP;
            let mut n = 0;
            loop {
                match self.push_one(&push, &event, &secret).await {
                    Ok(()) => break,
                    Err(e) if Instant::now() < give_up && !*self.shutdown.borrow() => {
                        tracing::debug!(task = %task_id, "push not delivered, retrying: {e}");
                        tokio::time::sleep(backoff(n)).await;
                        n += 1;
                    }
                    Err(e) => {
                        tracing::warn!(task = %task_id, "push dropped: {e}");
                        break;
                    }
                }
            }
            if final_ {
                return;
            }
        }
    }

    async fn push_one(&self, push: &proto::TaskPush, event: &proto::TaskEvent, secret: &[u8]) -> Result<(), String> {
        match &push.kind {
            Some(proto::task_push::Kind::Url(url)) => {
                let body = push_body(event);
                let req = http::Request::post(url.as_str())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .header(SIGNATURE_HEADER, sign(secret, &body))
                    .header("x-agent-reach-task", event.task.as_ref().map(|t| t.id.as_str()).unwrap_or_default())
                    .body(http_body_util::Full::new(Bytes::from(body)))
                    .map_err(|e| e.to_string())?;
                let resp = tokio::time::timeout(Duration::from_secs(10), crate::http_client::client().request(req))
                    .await
                    .map_err(|_| "no answer within 10s".to_string())?
                    .map_err(|e| e.to_string())?;
                if resp.status().is_success() { Ok(()) } else { Err(format!("webhook answered {}", resp.status())) }
            }
            Some(proto::task_push::Kind::Target(target)) => {
                let Some(invoker) = self.invoker.get() else { return Err("outbound stack not up".into()) };
                let payload = Bytes::from(prost::Message::encode_to_vec(event));
                let mut metadata = std::collections::HashMap::new();
                metadata.insert(SIGNATURE_METADATA.to_string(), sign(secret, &payload));
                let version = event.task.as_ref().map(|t| t.version).unwrap_or_default();
                let id = event.task.as_ref().map(|t| t.id.clone()).unwrap_or_default();
                metadata.insert(META_TASK_ID.to_string(), id.clone());
                let invoke = proto::InvokeRequest {
                    target: Some(target.clone()),
                    payload,
                    content_type: "application/x-protobuf; type=agentreach.v1.TaskEvent".into(),
                    idempotency_key: format!("push.{id}.{version}"),
                    metadata,
                    ..Default::default()
                };
                // Pushed as the task's submitter, like its dispatch.
                let submitter = event.task.as_ref().and_then(super::caller::of);
                invoker.invoke(invoke, submitter, None).await.map(|_| ()).map_err(|s| s.to_string())
            }
            None => Err("no push target".into()),
        }
    }
}

/// Forwards a task watch to `tx`, reconnecting from the last version seen when control's
/// stream breaks, until the final event is sent or the receiver is gone.
pub(crate) async fn relay(
    endpoints: Vec<TasksClient<Channel>>,
    mut request: proto::WatchTaskRequest,
    first: tonic::Streaming<proto::TaskEvent>,
    tx: mpsc::Sender<Result<proto::TaskEvent, Status>>,
) {
    let mut stream = Some(first);
    let mut failures = 0u32;
    let mut idx = 0usize;
    loop {
        if let Some(mut s) = stream.take() {
            loop {
                match s.next().await {
                    Some(Ok(event)) => {
                        failures = 0;
                        let final_ = event.r#final;
                        request.after_version = event.task.as_ref().map(|t| t.version).unwrap_or(request.after_version);
                        if tx.send(Ok(event)).await.is_err() || final_ {
                            return;
                        }
                    }
                    Some(Err(status)) if !transient(&status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    // Control went away (restart, failover): watch again from the last version.
                    _ => break,
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff(failures)).await;
        failures += 1;
        let mut client = endpoints[idx % endpoints.len()].clone();
        idx += 1;
        match client.watch_task(request.clone()).await {
            Ok(s) => stream = Some(s.into_inner()),
            Err(status) if !transient(&status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_reason() {
        let s = reason::status(Reason::NoHealthyInstance, "none", &[]);
        assert_eq!(classify(&s), Failure::NotDelivered);
        let s = reason::status(Reason::InstanceUnreachable, "gone", &[]);
        assert_eq!(classify(&s), Failure::Lost);
        assert_eq!(classify(&Status::unavailable("connection reset")), Failure::Lost);
        assert_eq!(classify(&Status::invalid_argument("bad input")), Failure::Agent);
        assert_eq!(reason_of(&Status::invalid_argument("x")), "INVALID_ARGUMENT");
    }

    #[test]
    fn signatures_are_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        let sig = sign(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn only_http_urls_and_mesh_targets_take_pushes() {
        let url = |u: &str| proto::TaskPush { kind: Some(proto::task_push::Kind::Url(u.into())) };
        assert!(check_push(&url("http://127.0.0.1:9000/hook")).is_ok());
        assert!(check_push(&url("https://example.com/hook")).is_err());
        assert!(check_push(&url("not a url")).is_err());
        assert!(check_push(&proto::TaskPush { kind: None }).is_err());
    }
}
