//! Task ids of agents registered with transport A2A, as clients of the mesh see them: the
//! agent's own task id prefixed with the instance that owns the task,
//! `<instance-id>~<agent task id>` (`~` cannot appear in an instance id, so the first one
//! splits). The caller's sidecar writes the prefix into every answer and takes it off every
//! request, routing the request to that instance. Encoded in the id, the owner survives a
//! restart of any sidecar and needs no shared state; a bounded map from task to instance
//! would forget its tasks on a restart and differ between the sidecars of a host.

use super::proto::{Message, StreamResponse, Task, stream_response};

/// Separates the owning instance from the agent's task id.
pub(crate) const SEPARATOR: char = '~';

/// The instance an id names and the agent's own id (`None`: the id names no instance, and
/// any instance of the agent may be asked).
pub(crate) fn split(id: &str) -> (Option<&str>, &str) {
    match id.split_once(SEPARATOR) {
        Some((instance, task)) if !instance.is_empty() => (Some(instance), task),
        _ => (None, id),
    }
}

/// The id a client sees of the task `id` of `instance`.
pub(crate) fn join(instance: &str, id: &str) -> String {
    format!("{instance}{SEPARATOR}{id}")
}

fn own(instance: &str, id: &mut String) {
    if !id.is_empty() {
        *id = join(instance, id);
    }
}

/// Takes the instance prefix off a request's id; the instance it named.
pub(crate) fn unown(id: &mut String) -> Option<String> {
    let (instance, task) = split(id);
    let instance = instance.map(str::to_string);
    *id = task.to_string();
    instance
}

/// A message of `instance`'s agent, with its task ids as clients see them.
pub(crate) fn own_message(instance: &str, m: &mut Message) {
    own(instance, &mut m.task_id);
    for r in &mut m.reference_task_ids {
        own(instance, r);
    }
}

/// A client's message with the agent's own task ids; the instance its task id names.
pub(crate) fn unown_message(m: &mut Message) -> Option<String> {
    for r in &mut m.reference_task_ids {
        unown(r);
    }
    unown(&mut m.task_id)
}

pub(crate) fn own_task(instance: &str, t: &mut Task) {
    own(instance, &mut t.id);
    if let Some(m) = t.status.as_mut().and_then(|s| s.message.as_mut()) {
        own_message(instance, m);
    }
    for m in &mut t.history {
        own_message(instance, m);
    }
}

pub(crate) fn own_event(instance: &str, e: &mut StreamResponse) {
    match &mut e.payload {
        Some(stream_response::Payload::Task(t)) => own_task(instance, t),
        Some(stream_response::Payload::Message(m)) => own_message(instance, m),
        Some(stream_response::Payload::StatusUpdate(u)) => {
            own(instance, &mut u.task_id);
            if let Some(m) = u.status.as_mut().and_then(|s| s.message.as_mut()) {
                own_message(instance, m);
            }
        }
        Some(stream_response::Payload::ArtifactUpdate(u)) => own(instance, &mut u.task_id),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::{TaskStatus, TaskStatusUpdateEvent};
    use super::*;

    #[test]
    fn ids_carry_their_instance_and_split_at_the_first_separator() {
        assert_eq!(join("py-1a2b", "t-1"), "py-1a2b~t-1");
        assert_eq!(split("py-1a2b~t~1"), (Some("py-1a2b"), "t~1"));
        assert_eq!(split("plain-id"), (None, "plain-id"));
        assert_eq!(split("~t"), (None, "~t"));
        let mut id = "py-1a2b~t-1".to_string();
        assert_eq!(unown(&mut id).as_deref(), Some("py-1a2b"));
        assert_eq!(id, "t-1");
    }

    #[test]
    fn every_task_id_of_an_answer_is_owned_and_of_a_request_unowned() {
        let message =
            |task: &str| Message { task_id: task.into(), reference_task_ids: vec!["r".into()], ..Default::default() };
        let mut task = Task {
            id: "t".into(),
            status: Some(TaskStatus { message: Some(message("t")), ..Default::default() }),
            history: vec![message("t"), message("")],
            ..Default::default()
        };
        own_task("i", &mut task);
        assert_eq!(task.id, "i~t");
        assert_eq!(task.status.as_ref().unwrap().message.as_ref().unwrap().task_id, "i~t");
        assert_eq!(task.history[0].task_id, "i~t");
        assert_eq!(task.history[0].reference_task_ids, ["i~r"]);
        assert_eq!(task.history[1].task_id, "", "no task, no owner");
        let mut event = StreamResponse {
            payload: Some(stream_response::Payload::StatusUpdate(TaskStatusUpdateEvent {
                task_id: "t".into(),
                ..Default::default()
            })),
        };
        own_event("i", &mut event);
        let Some(stream_response::Payload::StatusUpdate(u)) = &event.payload else { unreachable!() };
        assert_eq!(u.task_id, "i~t");
        let mut back = task.history[0].clone();
        assert_eq!(unown_message(&mut back).as_deref(), Some("i"));
        assert_eq!((back.task_id.as_str(), back.reference_task_ids[0].as_str()), ("t", "r"));
    }
}
