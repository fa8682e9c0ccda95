//! The A2A tasks this sidecar created for A2A clients, in memory: each task's latest state,
//! a broadcast of its events for subscribers, and the handle that cancels its call. Bounded:
//! at most `max_tasks`; when full, the oldest finished task is forgotten, and a new task is
//! refused while every kept task is still running.
//!
//! These tasks live as long as the sidecar: they are the A2A view of calls made through this
//! sidecar, not the mesh's durable tasks.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::error::A2aError;
use super::proto::{StreamResponse, Task, TaskState, stream_response};

/// Events buffered per subscriber before it is cut off as too slow.
const EVENTS_BUFFER: usize = 64;

/// Whether a task state is final.
pub(crate) fn is_terminal(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

struct Entry {
    task: Task,
    /// The agent (mesh agent name) the task was sent to.
    agent: String,
    events: broadcast::Sender<StreamResponse>,
    call: Option<AbortHandle>,
    /// When the task was made (ms since the Unix epoch).
    created_ms: u64,
}

/// The tasks of this sidecar's A2A endpoints.
pub(crate) struct Tasks {
    max_tasks: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Task ids, oldest first.
    order: VecDeque<String>,
}

impl Tasks {
    pub(crate) fn new(max_tasks: usize) -> Tasks {
        Tasks { max_tasks: max_tasks.max(1), inner: Mutex::new(Inner::default()) }
    }

    /// Adds a new task.
    pub(crate) fn insert(&self, agent: &str, task: Task) -> Result<(), A2aError> {
        let mut inner = self.inner.lock().expect("tasks lock");
        if inner.by_id.len() >= self.max_tasks {
            let finished =
                inner.order.iter().position(|id| inner.by_id.get(id).is_none_or(|e| is_terminal(state_of(&e.task))));
            match finished {
                Some(i) => {
                    let id = inner.order.remove(i).expect("index in range");
                    inner.by_id.remove(&id);
                }
                None => {
                    return Err(A2aError::Mesh(agent_reach::reason::status(
                        agent_reach::reason::Reason::AgentOverloaded,
                        format!("{} A2A tasks are running on this sidecar (the limit)", self.max_tasks),
                        &[],
                    )));
                }
            }
        }
        let (events, _) = broadcast::channel(EVENTS_BUFFER);
        inner.order.push_back(task.id.clone());
        inner.by_id.insert(
            task.id.clone(),
            Entry { task, agent: agent.to_string(), events, call: None, created_ms: now_ms() },
        );
        Ok(())
    }

    /// Remembers how to cancel the task's call.
    pub(crate) fn set_call(&self, id: &str, call: AbortHandle) {
        if let Some(e) = self.inner.lock().expect("tasks lock").by_id.get_mut(id) {
            e.call = Some(call);
        }
    }

    /// Applies an event to the task and sends it to subscribers. Events after the task
    /// ended are dropped (a cancel wins over a late answer).
    pub(crate) fn apply(&self, id: &str, event: StreamResponse) -> bool {
        let mut inner = self.inner.lock().expect("tasks lock");
        let Some(entry) = inner.by_id.get_mut(id) else { return false };
        if is_terminal(state_of(&entry.task)) {
            return false;
        }
        match &event.payload {
            Some(stream_response::Payload::StatusUpdate(u)) => entry.task.status = u.status.clone(),
            Some(stream_response::Payload::ArtifactUpdate(u)) => {
                entry.task.artifacts.extend(u.artifact.clone());
            }
            Some(stream_response::Payload::Task(t)) => entry.task = t.clone(),
            _ => {}
        }
        if is_terminal(state_of(&entry.task)) {
            entry.call = None;
        }
        let _ = entry.events.send(event);
        true
    }

    /// The task, if the sidecar has it and it belongs to `agent` (when named).
    pub(crate) fn get(&self, id: &str, agent: &str) -> Result<Task, A2aError> {
        let inner = self.inner.lock().expect("tasks lock");
        match inner.by_id.get(id) {
            Some(e) if agent.is_empty() || e.agent == agent => Ok(e.task.clone()),
            _ => Err(A2aError::TaskNotFound(id.to_string())),
        }
    }

    /// The task and a receiver of its later events.
    pub(crate) fn subscribe(
        &self,
        id: &str,
        agent: &str,
    ) -> Result<(Task, broadcast::Receiver<StreamResponse>), A2aError> {
        let inner = self.inner.lock().expect("tasks lock");
        match inner.by_id.get(id) {
            Some(e) if agent.is_empty() || e.agent == agent => Ok((e.task.clone(), e.events.subscribe())),
            _ => Err(A2aError::TaskNotFound(id.to_string())),
        }
    }

    /// Takes the handle of the task's running call, refusing a task that already ended.
    pub(crate) fn take_call(&self, id: &str, agent: &str) -> Result<Option<AbortHandle>, A2aError> {
        let mut inner = self.inner.lock().expect("tasks lock");
        match inner.by_id.get_mut(id) {
            Some(e) if agent.is_empty() || e.agent == agent => {
                let state = state_of(&e.task);
                if is_terminal(state) {
                    return Err(A2aError::TaskNotCancelable(format!("task {id:?} is already {}", state.as_str_name())));
                }
                Ok(e.call.take())
            }
            _ => Err(A2aError::TaskNotFound(id.to_string())),
        }
    }

    /// Tasks of `agent` (all when empty) matching the filter, with their creation times,
    /// newest first.
    pub(crate) fn list(&self, agent: &str, context_id: &str, state: Option<TaskState>) -> Vec<(u64, Task)> {
        let inner = self.inner.lock().expect("tasks lock");
        inner
            .order
            .iter()
            .rev()
            .filter_map(|id| inner.by_id.get(id))
            .filter(|e| agent.is_empty() || e.agent == agent)
            .filter(|e| context_id.is_empty() || e.task.context_id == context_id)
            .filter(|e| state.is_none_or(|s| state_of(&e.task) == s))
            .map(|e| (e.created_ms, e.task.clone()))
            .collect()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// The state of a task (unspecified when it has no status).
pub(crate) fn state_of(task: &Task) -> TaskState {
    task.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::Unspecified)
}

#[cfg(test)]
mod tests {
    use super::super::proto::{TaskStatus, TaskStatusUpdateEvent};
    use super::*;

    fn task(id: &str, state: TaskState) -> Task {
        Task {
            id: id.into(),
            context_id: "c".into(),
            status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    fn status(id: &str, state: TaskState) -> StreamResponse {
        StreamResponse {
            payload: Some(stream_response::Payload::StatusUpdate(TaskStatusUpdateEvent {
                task_id: id.into(),
                context_id: "c".into(),
                status: Some(TaskStatus { state: state as i32, ..Default::default() }),
                metadata: None,
            })),
        }
    }

    #[test]
    fn a_full_store_forgets_the_oldest_finished_task_and_refuses_when_all_run() {
        let tasks = Tasks::new(2);
        tasks.insert("a", task("t1", TaskState::Working)).unwrap();
        tasks.insert("a", task("t2", TaskState::Working)).unwrap();
        let refused = tasks.insert("a", task("t3", TaskState::Working)).unwrap_err();
        assert!(matches!(refused, A2aError::Mesh(ref s) if s.code() == tonic::Code::ResourceExhausted));
        assert!(tasks.apply("t2", status("t2", TaskState::Completed)));
        tasks.insert("a", task("t3", TaskState::Working)).unwrap();
        assert!(matches!(tasks.get("t2", ""), Err(A2aError::TaskNotFound(_))));
        assert_eq!(state_of(&tasks.get("t1", "a").unwrap()), TaskState::Working);
        assert_eq!(tasks.list("a", "", None).iter().map(|(_, t)| t.id.as_str()).collect::<Vec<_>>(), ["t3", "t1"]);
    }

    #[test]
    fn a_finished_task_takes_no_more_events_and_cannot_be_canceled() {
        let tasks = Tasks::new(4);
        tasks.insert("a", task("t1", TaskState::Working)).unwrap();
        assert!(tasks.apply("t1", status("t1", TaskState::Canceled)));
        assert!(!tasks.apply("t1", status("t1", TaskState::Completed)));
        assert_eq!(state_of(&tasks.get("t1", "a").unwrap()), TaskState::Canceled);
        assert!(matches!(tasks.take_call("t1", "a"), Err(A2aError::TaskNotCancelable(_))));
        assert!(matches!(tasks.get("t1", "other-agent"), Err(A2aError::TaskNotFound(_))));
    }
}
