//! Push notifications of durable tasks: while a task with `push` is dispatched here, every
//! change is posted, in order, to the webhook (JSON, `x-agent-reach-signature: sha256=<hex
//! HMAC-SHA256 of the body>` keyed by the task's secret) or invoked on the mesh target
//! (payload: the `TaskEvent`, signature in metadata `ar-task-signature`, sent as the task's
//! verified submitter like its dispatch), each retried with back-off until delivered.

use std::sync::Arc;
use std::time::Duration;

use agent_reach::headers;
use agent_reach::proto::{self, TaskState};
use agent_reach::reason;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::Instant;
use tonic::Status;

use super::Tasks;
use super::caller;
use super::dispatch::backoff;

/// A push notification not delivered for this long is dropped.
pub(crate) const PUSH_GIVE_UP: Duration = Duration::from_secs(600);
/// Header of a webhook push's signature (a push to a mesh target carries it as
/// [`headers::TASK_SIGNATURE`]).
pub(crate) const SIGNATURE_HEADER: &str = "x-agent-reach-signature";

/// Checks a push target when a task is submitted.
pub(crate) fn check_push(push: &proto::TaskPush) -> Result<(), Status> {
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
pub(crate) fn push_body(event: &proto::TaskEvent) -> Vec<u8> {
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

impl Tasks {
    /// Posts every change of the task after `after` to its push target, in order, each
    /// retried with back-off until delivered, until the final state is delivered.
    pub(super) async fn push_changes(self: Arc<Self>, task_id: String, after: u64) {
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
                metadata.insert(headers::TASK_SIGNATURE.to_string(), sign(secret, &payload));
                let version = event.task.as_ref().map(|t| t.version).unwrap_or_default();
                let id = event.task.as_ref().map(|t| t.id.clone()).unwrap_or_default();
                metadata.insert(headers::TASK_ID.to_string(), id.clone());
                let invoke = proto::InvokeRequest {
                    target: Some(target.clone()),
                    payload,
                    content_type: "application/x-protobuf; type=agentreach.v1.TaskEvent".into(),
                    idempotency_key: format!("push.{id}.{version}"),
                    metadata,
                    ..Default::default()
                };
                // Pushed as the task's submitter, like its dispatch.
                let submitter = event.task.as_ref().and_then(caller::of);
                invoker.invoke(invoke, submitter, None).await.map(|_| ()).map_err(|s| s.to_string())
            }
            None => Err("no push target".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
