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
//! Push notifications are in [`super::push`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach::headers;
use agent_reach::proto::tasks_client::TasksClient;
use agent_reach::proto::{self, TaskState};
use agent_reach::reason::Reason;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::failure::{Failure, classify, reason_of, transient};
use super::{EventStream, RESULT_ARTIFACT, Tasks, lock};

/// Most attempts of one task.
pub(crate) const MAX_ATTEMPTS: u32 = 20;
/// Longest pause between two attempts (and between two deliveries of a push).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn state_of(t: &proto::Task) -> TaskState {
    t.status.as_ref().and_then(|s| TaskState::try_from(s.state).ok()).unwrap_or_default()
}

/// Whether a task in `state` is finished for good.
pub(crate) fn is_final(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

pub(super) fn backoff(n: u32) -> Duration {
    (Duration::from_millis(100) * 2u32.saturating_pow(n.min(10))).min(MAX_BACKOFF)
}

/// What the dispatch loop does after a step.
enum Next {
    /// Go on with the task as it now is.
    Again(Box<proto::Task>),
    /// The dispatch is over (the task finished, or another dispatcher or a stop took it).
    Done,
}

/// How starting an attempt went.
enum Begun {
    /// The attempt is recorded; the task as it now is.
    Started(proto::Task),
    /// Another writer changed the task first: look at it again.
    Again(proto::Task),
    Done,
}

/// `attempt`, ended now by `instance` of `agent` with `outcome`.
fn ended(attempt: &proto::TaskAttempt, instance: &str, agent: &str, outcome: &str) -> proto::TaskAttempt {
    proto::TaskAttempt {
        instance_id: instance.to_string(),
        agent: agent.to_string(),
        ended_at_ms: now_ms(),
        outcome: outcome.to_string(),
        ..attempt.clone()
    }
}

/// The task's state as an attempt's outcome: `canceled`, `completed`, ...
fn state_name(task: &proto::Task) -> String {
    state_of(task).as_str_name().trim_start_matches("TASK_STATE_").to_lowercase()
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
                match self.record_lost(&task, open).await {
                    Next::Again(t) => task = *t,
                    Next::Done => return,
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
            match self.begin_attempt(&task, &attempt, failures).await {
                Begun::Started(t) => task = t,
                Begun::Again(t) => {
                    task = t;
                    continue;
                }
                Begun::Done => return,
            }
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let outcome = self.run_attempt(&task, number).await;
            match self.conclude(&task, &attempt, outcome).await {
                Next::Again(t) => task = *t,
                Next::Done => return,
            }
            tokio::time::sleep(backoff(failures)).await;
            failures += 1;
        }
    }

    /// Records an attempt a dead dispatcher left open as lost (and claims the task), or
    /// fails a task that must not run twice.
    async fn record_lost(&self, task: &proto::Task, open: proto::TaskAttempt) -> Next {
        let lost = proto::TaskAttempt { ended_at_ms: now_ms(), outcome: "lost".into(), ..open };
        if task.run_once {
            let detail = format!("attempt {} was cut off and the task must not run twice", lost.number);
            self.finish(task, TaskState::Failed, "INSTANCE_LOST", detail, Some(lost)).await;
            return Next::Done;
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
            Ok(t) => Next::Again(Box::new(t)),
            Err(s) => {
                tracing::warn!(task = %task.id, "cannot record a lost attempt: {s}");
                Next::Done
            }
        }
    }

    /// Marks the task WORKING with `attempt` open, at the version read; on a conflict the
    /// task is read again (after a pause when it cannot be).
    async fn begin_attempt(&self, task: &proto::Task, attempt: &proto::TaskAttempt, failures: u32) -> Begun {
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
            Ok(t) => Begun::Started(t),
            Err(s) if reason_of(&s) == Reason::TaskConflict.as_str() => match self.get(&task.id).await {
                Ok(t) => Begun::Again(t),
                Err(_) => {
                    tokio::time::sleep(backoff(failures)).await;
                    Begun::Again(task.clone())
                }
            },
            Err(s) => {
                tracing::debug!(task = %task.id, "not dispatching: {s}");
                Begun::Done
            }
        }
    }

    /// Records how `attempt` ended; [`Next::Again`] when the task is to be tried again.
    async fn conclude(&self, task: &proto::Task, attempt: &proto::TaskAttempt, outcome: Outcome) -> Next {
        match outcome {
            Outcome::Stopped => {}
            Outcome::Ended(t) => self.end_attempt(&t, Some(ended(attempt, "", "", &state_name(&t)))).await,
            Outcome::Replied(reply) => {
                self.complete(task, ended(attempt, &reply.instance_id, &reply.agent, "completed"), &reply).await
            }
            Outcome::Failed(status) => return self.after_failure(task, attempt, status).await,
        }
        Next::Done
    }

    /// Completes the task with the agent's reply as its result artifact.
    async fn complete(&self, task: &proto::Task, a: proto::TaskAttempt, reply: &proto::InvokeReply) {
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
                let too_large = Reason::TaskResultTooLarge.as_str();
                self.finish(task, TaskState::Failed, too_large, s.message().into(), Some(a)).await;
            }
            // Canceled meanwhile, or the agent reported its own end.
            Err(s) if reason_of(&s) == Reason::TaskFinished.as_str() => self.end_attempt(task, Some(a)).await,
            Err(s) => tracing::warn!(task = %task.id, "cannot complete the task: {s}"),
        }
    }

    /// After a failed call: ends the task when the agent refused it (or it must not run
    /// twice), else records the attempt and answers [`Next::Again`].
    async fn after_failure(&self, task: &proto::Task, attempt: &proto::TaskAttempt, status: Status) -> Next {
        // Ended meanwhile (a cancel, the agent's own report): the call's error is only the
        // consequence.
        if let Ok(t) = self.get(&task.id).await
            && is_final(state_of(&t))
        {
            self.end_attempt(&t, Some(ended(attempt, "", "", &state_name(&t)))).await;
            return Next::Done;
        }
        let why = reason_of(&status);
        match classify(&status) {
            Failure::Agent => {
                let state = if matches!(status.code(), Code::PermissionDenied | Code::Unauthenticated) {
                    TaskState::Rejected
                } else {
                    TaskState::Failed
                };
                let a = ended(attempt, "", "", &why);
                self.finish(task, state, &why, status.message().to_string(), Some(a)).await;
                Next::Done
            }
            Failure::Lost if task.run_once => {
                let a = ended(attempt, "", "", "lost");
                let detail = format!("{why}: {}; the task must not run twice", status.message());
                self.finish(task, TaskState::Failed, "INSTANCE_LOST", detail, Some(a)).await;
                Next::Done
            }
            kind => {
                let outcome = if kind == Failure::Lost { format!("lost: {why}") } else { why };
                let r = proto::UpdateTaskRequest {
                    task_id: task.id.clone(),
                    attempt: Some(ended(attempt, "", "", &outcome)),
                    ..Default::default()
                };
                match self.update_retrying(r).await {
                    Ok(t) => Next::Again(Box::new(t)),
                    Err(_) => Next::Done,
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
        metadata.insert(headers::TASK_ID.into(), task.id.clone());
        metadata.insert(headers::TASK_ATTEMPT.into(), number.to_string());
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
    pub(crate) async fn recover_once(self: &Arc<Self>) -> Result<usize, Status> {
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
