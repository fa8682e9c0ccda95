//! Transport `a2a`: the local agent is an A2A server (`lf.a2a.v1.A2AService`, gRPC binding,
//! e.g. one written with the a2a-sdk's server) at its registered endpoint. Each call the
//! sidecar delivers to it becomes one blocking `SendMessage` on the pooled HTTP/2 connection:
//! the payload is the message's single part (text for `text/*`, data for JSON, raw bytes
//! otherwise; a payload that is a whole A2A message keeps its parts), the session id is the
//! A2A `context_id`, the call's metadata is the message's metadata. The answer (a task's
//! artifacts, or a message) is the reply; a task that fails, is rejected or canceled answers
//! an error (FAILED_PRECONDITION for one that waits for input or authentication), with the
//! agent's status text. A stream call (`InvokeStream`) gets the reply as its one chunk.
//!
//! A call whose payload is itself an A2A request (content type `application/a2a+proto`, the
//! method in its metadata) is carried to the agent unchanged instead ([`super::a2a_forward`]).
//!
//! Health: the agent's gRPC server answers a `grpc.health.v1` check (any gRPC status, an
//! a2a-sdk server answers UNIMPLEMENTED) — see `probe.rs`.

use agent_reach::proto;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response};
use prost::Message as _;
use tonic::{Code, Status};

use crate::a2a_wire::proto::{self as a2a, SendMessageConfiguration, SendMessageRequest, TaskState, part};
use crate::call::{Attempt, Shape};
use crate::error::DeliveryError;
use crate::grpc::{self, Body, Frames, StoredResponse};
use crate::pool::{Conn, SendError, To, send_h2};

/// The method a call becomes.
const PATH_SEND_MESSAGE: &str = "/lf.a2a.v1.A2AService/SendMessage";

/// The A2A request for one mesh call.
pub(crate) fn request_of(call: &proto::HandleRequest) -> SendMessageRequest {
    let parts = crate::a2a_wire::parts_of_payload(call.payload.clone(), &call.content_type);
    let fields = call
        .metadata
        .iter()
        .map(|(k, v)| {
            (k.clone(), pbjson_types::Value { kind: Some(pbjson_types::value::Kind::StringValue(v.clone())) })
        })
        .collect();
    let message = a2a::Message {
        message_id: if call.message_id.is_empty() {
            format!("ar-{:032x}", rand::random::<u128>())
        } else {
            call.message_id.clone()
        },
        context_id: call.session_id.clone(),
        role: a2a::Role::User as i32,
        parts,
        metadata: if call.metadata.is_empty() { None } else { Some(pbjson_types::Struct { fields }) },
        ..Default::default()
    };
    SendMessageRequest {
        tenant: String::new(),
        message: Some(message),
        configuration: Some(SendMessageConfiguration { return_immediately: false, ..Default::default() }),
        metadata: None,
    }
}

/// The mesh reply of an A2A answer, or the status it fails with.
pub(crate) fn reply_of(answer: a2a::SendMessageResponse) -> Result<proto::HandleReply, Status> {
    use a2a::send_message_response::Payload;
    let (parts, metadata) = match answer.payload {
        Some(Payload::Message(m)) => (m.parts, Default::default()),
        Some(Payload::Task(task)) => {
            let status = task.status.clone().unwrap_or_default();
            let said = status.message.as_ref().map(text_of).unwrap_or_default();
            let code = match status.state() {
                TaskState::Completed => None,
                TaskState::Failed => Some(Code::Aborted),
                TaskState::Rejected => Some(Code::PermissionDenied),
                TaskState::Canceled => Some(Code::Cancelled),
                TaskState::InputRequired | TaskState::AuthRequired => Some(Code::FailedPrecondition),
                // Blocking: the agent answered before the task ended.
                _ => Some(Code::Internal),
            };
            if let Some(code) = code {
                return Err(Status::new(
                    code,
                    format!("the A2A agent's task {} is {}: {said}", task.id, status.state().as_str_name()),
                ));
            }
            let metadata =
                [("a2a-task-id".to_string(), task.id.clone()), ("a2a-context-id".to_string(), task.context_id)]
                    .into_iter()
                    .collect();
            (task.artifacts.into_iter().flat_map(|a| a.parts).collect(), metadata)
        }
        None => return Err(Status::internal("the A2A agent answered neither a task nor a message")),
    };
    let whole = a2a::Message { parts, ..Default::default() };
    let (payload, content_type) = match whole.parts.len() {
        0 => (Bytes::new(), String::new()),
        _ => crate::a2a_wire::payload_of(&whole)
            .map_err(|e| Status::internal(format!("the A2A agent's answer: {e:?}")))?,
    };
    Ok(proto::HandleReply { payload, content_type, metadata })
}

fn text_of(m: &a2a::Message) -> String {
    m.parts
        .iter()
        .filter_map(|p| match &p.content {
            Some(part::Content::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Delivers one call (the `HandleRequest` in gRPC framing, `data`) to the A2A agent on `conn`.
pub(crate) async fn deliver(
    conn: Conn,
    instance_id: &str,
    data: Vec<Bytes>,
    mut headers: HeaderMap,
    shape: Shape,
    limit: usize,
) -> Attempt {
    let data: Bytes = data.concat().into();
    let call = match grpc::single_message(&data).map(proto::HandleRequest::decode) {
        Some(Ok(c)) => c,
        _ => return Attempt::Failed(DeliveryError::InvalidArgument("the call is not one HandleRequest".into())),
    };
    if super::a2a_forward::is_pass_through(&call) {
        return super::a2a_forward::forward(conn, instance_id, call, headers, shape, limit).await;
    }
    let message = request_of(&call).encode_to_vec();
    let mut framed = BytesMut::with_capacity(grpc::PREFIX_LEN + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    headers.insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    let resp = match send_h2(
        conn,
        http::uri::PathAndQuery::from_static(PATH_SEND_MESSAGE),
        headers,
        vec![framed.freeze()],
        To::Agent,
    )
    .await
    {
        Ok(r) => r,
        Err(SendError::NotSent(e)) => {
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!("instance {instance_id}: {e}")));
        }
        Err(SendError::Failed(e)) => {
            return Attempt::Failed(DeliveryError::Unavailable(format!("A2A agent {instance_id}: {e}")));
        }
    };
    let stored = match StoredResponse::collect(resp, limit).await {
        Ok(s) => s,
        Err(e) => return Attempt::Failed(DeliveryError::Unavailable(format!("reading the A2A agent's answer: {e}"))),
    };
    let status =
        stored.trailers.as_ref().and_then(Status::from_header_map).or_else(|| Status::from_header_map(&stored.headers));
    let reply = match status {
        Some(s) if s.code() != Code::Ok => {
            Err(Status::new(s.code(), format!("the A2A agent answered: {}", s.message())))
        }
        _ => grpc::single_message(&stored.data)
            .ok_or_else(|| Status::internal("the A2A agent answered no single message"))
            .and_then(|m| {
                a2a::SendMessageResponse::decode(m)
                    .map_err(|e| Status::internal(format!("the A2A agent's answer is not a SendMessageResponse: {e}")))
            })
            .and_then(reply_of),
    };
    let reply = match reply {
        Ok(r) => r,
        Err(status) => return Attempt::Answered(grpc::status_response(status), None),
    };
    let message = match shape {
        Shape::Unary => reply.encode_to_vec(),
        Shape::Stream => {
            proto::Chunk { payload: reply.payload, content_type: reply.content_type, metadata: reply.metadata }
                .encode_to_vec()
        }
    };
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::HEADER_GRPC_STATUS, HeaderValue::from_static("0"));
    let frames = Frames::message(Bytes::from(message), &[]).with_trailers(Some(trailers));
    let mut resp = Response::new(Body::Frames(frames));
    resp.headers_mut().insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    Attempt::Answered(resp, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_becomes_a_blocking_message_and_a_task_its_reply() {
        let call = proto::HandleRequest {
            payload: Bytes::from("hello"),
            content_type: "text/plain".into(),
            session_id: "s1".into(),
            message_id: "m1".into(),
            metadata: [("k".to_string(), "v".to_string())].into_iter().collect(),
            ..Default::default()
        };
        let req = request_of(&call);
        let m = req.message.unwrap();
        assert_eq!((m.message_id.as_str(), m.context_id.as_str(), m.role()), ("m1", "s1", a2a::Role::User));
        assert_eq!(m.parts[0].content, Some(part::Content::Text("hello".into())));
        assert!(!req.configuration.unwrap().return_immediately);

        let text = |t: &str| a2a::Part { content: Some(part::Content::Text(t.into())), ..Default::default() };
        let task = |state: TaskState| a2a::SendMessageResponse {
            payload: Some(a2a::send_message_response::Payload::Task(a2a::Task {
                id: "t1".into(),
                status: Some(a2a::TaskStatus {
                    state: state as i32,
                    message: Some(a2a::Message { parts: vec![text("why")], ..Default::default() }),
                    timestamp: None,
                }),
                artifacts: vec![a2a::Artifact { parts: vec![text("HELLO")], ..Default::default() }],
                ..Default::default()
            })),
        };
        let reply = reply_of(task(TaskState::Completed)).unwrap();
        assert_eq!((&reply.payload[..], reply.content_type.as_str()), (&b"HELLO"[..], "text/plain"));
        assert_eq!(reply.metadata.get("a2a-task-id").map(String::as_str), Some("t1"));
        let failed = reply_of(task(TaskState::Failed)).unwrap_err();
        assert_eq!(failed.code(), Code::Aborted);
        assert!(failed.message().contains("TASK_STATE_FAILED: why"), "{}", failed.message());
        assert_eq!(reply_of(task(TaskState::InputRequired)).unwrap_err().code(), Code::FailedPrecondition);
    }
}
