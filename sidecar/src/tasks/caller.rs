//! Who a durable task runs as. `SubmitTask` verifies the agent credential the submitter
//! presents (metadata `ar-agent-credential`, checked as on `Invoke`) and the task records
//! that agent as its `verified_submitter`; never a request field. Every attempt of the task,
//! and every push of its changes to a mesh target, then goes through this sidecar's
//! outbound stack in process ([`TaskInvoker`]) as that caller, exactly like the submitter's
//! own calls: the target's sidecar receives the caller over mutual TLS, so authorization
//! policies and rate limits by verified caller apply to task dispatch as to calls. A task
//! submitted without a credential runs as an anonymous caller.
//!
//! Dispatching in process (not through the sidecar's own local API port) also means the
//! dispatch needs no local API token: the check of `--local-token-file` guards the port,
//! which dispatch does not use.

use std::time::Duration;

use agent_reach::proto;
use prost::Message as _;
use tonic::Status;

use crate::call::{Caller, Shape, verify_credential};
use crate::grpc;
use crate::outbound::invoke::{InvokeEntry, read_reply};
use crate::registry::Registry;

/// The caller a `SubmitTask` request proves with its agent credential (`None`: none
/// presented, anonymous); a credential that does not verify is refused.
pub(crate) fn submitter(registry: &Registry, headers: &http::HeaderMap) -> Result<Option<Caller>, Status> {
    verify_credential(registry, headers).map_err(|e| e.into_status())
}

/// The verified submitter as the task records it.
pub(crate) fn record(submitter: Option<&Caller>) -> Option<proto::Caller> {
    submitter.map(|c| proto::Caller { agent: c.agent.to_string(), instance_id: c.instance.to_string() })
}

/// The caller a task is dispatched as: its verified submitter, or anonymous.
pub(crate) fn of(task: &proto::Task) -> Option<Caller> {
    task.verified_submitter
        .as_ref()
        .filter(|c| !c.agent.is_empty())
        .map(|c| Caller { agent: c.agent.as_str().into(), instance: c.instance_id.as_str().into() })
}

/// Calls through this sidecar's outbound stack on behalf of a task.
#[derive(Clone)]
pub(crate) struct TaskInvoker {
    entry: InvokeEntry,
    /// Largest answer read (the sidecar's payload limit plus the envelope allowance).
    reply_limit: usize,
}

impl TaskInvoker {
    pub(crate) fn new(entry: InvokeEntry, reply_limit: usize) -> TaskInvoker {
        TaskInvoker { entry, reply_limit }
    }

    /// One unary call as `caller`, with `timeout` as its deadline (if any).
    pub(crate) async fn invoke(
        &self,
        request: proto::InvokeRequest,
        caller: Option<Caller>,
        timeout: Option<Duration>,
    ) -> Result<proto::InvokeReply, Status> {
        let mut headers = http::HeaderMap::new();
        if let Some(t) = timeout
            && let Ok(v) = agent_reach_support::grpc_timeout::format(t).parse()
        {
            headers.insert(grpc::HEADER_GRPC_TIMEOUT, v);
        }
        let message = bytes::Bytes::from(request.encode_to_vec());
        let resp = self.entry.call_as(message, headers, Shape::Unary, caller).await;
        read_reply(resp, self.reply_limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_runs_as_its_recorded_verified_submitter_and_never_as_the_named_one() {
        let planner = Caller { agent: "planner".into(), instance: "planner-1".into() };
        let task = proto::Task {
            submitter: Some(proto::Caller { agent: "admin".into(), instance_id: "x".into() }),
            verified_submitter: record(Some(&planner)),
            ..Default::default()
        };
        assert_eq!(of(&task), Some(planner));
        let anonymous = proto::Task {
            submitter: Some(proto::Caller { agent: "planner".into(), instance_id: "planner-1".into() }),
            verified_submitter: record(None),
            ..Default::default()
        };
        assert_eq!(of(&anonymous), None, "a name the submitter wrote is not an identity");
    }
}
