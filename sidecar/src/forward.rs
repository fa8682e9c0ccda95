//! The call path. [`invoke`] runs in the caller's sidecar: it reads the caller's message,
//! decodes only the routing fields, picks an instance, and forwards the caller's bytes
//! (plus a few appended fields) to the instance's sidecar over `Mesh`, retrying once on
//! another instance when the call provably never reached an agent. [`deliver`] runs in
//! the target's sidecar: it passes the body through to the local agent without decoding
//! it.
//!
//! Payloads are never decoded or copied (beyond coalescing small messages into one
//! buffer). Deadlines shrink at every hop by the configured reserve. Only the caller's
//! sidecar retries, so retries never multiply across hops.

use std::sync::Arc;
use std::time::Duration;

use agent_reach::convert::target_from_proto;
use agent_reach::grpc_timeout;
use agent_reach::model::{FieldError, Instance, TargetKind};
use agent_reach::proto;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prost::Message;
use tokio::time::Instant;
use tonic::Status;

use crate::Inner;
use crate::error::SidecarError;
use crate::grpc::{self, Body, Frames, ReadError};
use agent_reach_routing as route;

/// Room for the envelope fields around a payload of the maximum size.
const ENVELOPE_ALLOWANCE: usize = 64 * 1024;
/// A call that never reached an agent is tried on at most this many instances.
const MAX_ATTEMPTS: u32 = 2;

pub const PATH_INVOKE: &str = "/agentreach.v1.Sidecar/Invoke";
pub const PATH_INVOKE_STREAM: &str = "/agentreach.v1.Sidecar/InvokeStream";
pub const PATH_DELIVER: &str = "/agentreach.v1.Mesh/Deliver";
pub const PATH_DELIVER_STREAM: &str = "/agentreach.v1.Mesh/DeliverStream";
const PATH_HANDLE: &str = "/agentreach.v1.Agent/Handle";
const PATH_HANDLE_STREAM: &str = "/agentreach.v1.Agent/HandleStream";

/// The fields of an `InvokeRequest` the caller's sidecar needs for routing. Same field
/// numbers as `InvokeRequest`; content type and metadata are skipped unread.
#[derive(Clone, PartialEq, Message)]
struct InvokeHead {
    #[prost(message, optional, tag = "1")]
    target: Option<proto::Target>,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
    #[prost(string, tag = "8")]
    message_id: String,
}

/// Unary or server-streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Unary,
    Stream,
}

/// How one forwarding attempt ended.
enum Attempt {
    /// The target's sidecar (or agent) answered; the call may have run.
    Answered(Response<Incoming>),
    /// The call provably never reached an agent.
    NotDelivered(String),
    /// The call failed after it may have reached an agent.
    Failed(Status),
}

/// Serves `Sidecar/Invoke` and `Sidecar/InvokeStream`.
pub async fn invoke(inner: Arc<Inner>, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    match invoke_inner(&inner, req, shape).await {
        Ok(resp) => resp,
        Err(e) => grpc::status_response(e.into_status()),
    }
}

async fn invoke_inner(inner: &Inner, req: Request<Incoming>, shape: Shape) -> Result<Response<Body>, SidecarError> {
    let started = Instant::now();
    let cfg = &inner.config;
    let (parts, mut body) = req.into_parts();
    let timeout = parts
        .headers
        .get(grpc::HEADER_GRPC_TIMEOUT)
        .and_then(|v| grpc_timeout::parse(v.as_bytes()))
        .unwrap_or(cfg.default_timeout);
    let deadline = started + timeout;
    let limit = cfg.max_payload_bytes;
    let message = match grpc::read_message(&mut body, limit + ENVELOPE_ALLOWANCE).await {
        Ok(m) => m,
        Err(ReadError::TooLarge(size)) => return Err(SidecarError::PayloadTooLarge { size, limit }),
        Err(ReadError::Compressed) => {
            return Err(FieldError::new("grpc-encoding", "compressed requests are not supported; use identity").into());
        }
        Err(ReadError::Malformed(why)) => return Err(FieldError::new("request", why).into()),
        Err(ReadError::Body(e)) => return Err(SidecarError::Internal(format!("reading the request: {e}"))),
    };
    let head = InvokeHead::decode(message.clone())
        .map_err(|e| FieldError::new("request", format!("not a valid InvokeRequest: {e}")))?;
    if head.payload.len() > limit {
        return Err(SidecarError::PayloadTooLarge { size: head.payload.len(), limit });
    }
    let target = target_from_proto(head.target)?;
    let capability = match &target.kind {
        TargetKind::Capability(c) => c.clone(),
        TargetKind::Agent(_) => String::new(),
    };
    let message_id =
        if head.message_id.is_empty() { format!("{:032x}", rand::random::<u128>()) } else { String::new() };

    let mut tried: Vec<String> = Vec::new();
    let mut last_failure = String::new();
    for attempt in 1..=MAX_ATTEMPTS {
        let instance = match route::pick(&inner.table.load(), &target, &tried) {
            Ok(i) => i,
            Err(route::RouteError::NoHealthyInstance { target, why, tried }) if !last_failure.is_empty() => {
                return Err(SidecarError::NoHealthyInstance {
                    target,
                    why: format!("{last_failure}; and no other instance: {why}"),
                    tried,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let remaining = deadline.saturating_duration_since(Instant::now()).saturating_sub(cfg.deadline_reserve);
        if remaining.is_zero() {
            return Err(SidecarError::DeadlineExceeded { deadline: timeout, attempts: attempt - 1, tried });
        }
        let extension = proto::HandleRequest {
            message_id: message_id.clone(),
            instance_id: instance.record.instance_id.clone(),
            attempt,
            capability: capability.clone(),
            tenant: cfg.tenant.clone(),
            ..Default::default()
        }
        .encode_to_vec();
        let body = Body::Frames(Frames::message(message.clone(), &extension));
        let outcome =
            tokio::time::timeout_at(deadline, send(inner, &instance, body, remaining, &parts.headers, shape)).await;
        tried.push(instance.record.instance_id.clone());
        match outcome {
            Err(_) => return Err(SidecarError::DeadlineExceeded { deadline: timeout, attempts: attempt, tried }),
            Ok(Attempt::Answered(resp)) => return finish(inner, resp, &instance, attempt, shape).await,
            Ok(Attempt::Failed(status)) => return Ok(grpc::status_response(status)),
            Ok(Attempt::NotDelivered(why)) => {
                tracing::debug!(instance = %instance.record.instance_id, attempt, "not delivered: {why}");
                last_failure = format!("{} not delivered: {why}", instance.record.instance_id);
            }
        }
    }
    Err(SidecarError::NoHealthyInstance {
        target: target.to_string(),
        why: format!("{last_failure} (gave up after {MAX_ATTEMPTS} attempts)"),
        tried,
    })
}

/// Sends one attempt to `instance`: straight to the agent when it is local, else to its
/// sidecar's mesh API.
async fn send(
    inner: &Inner,
    instance: &Instance,
    body: Body,
    remaining: Duration,
    headers: &HeaderMap,
    shape: Shape,
) -> Attempt {
    let rec = &instance.record;
    if rec.sidecar_id == inner.config.sidecar_id {
        return deliver_local(inner, &rec.instance_id, body, Some(remaining), headers, shape).await;
    }
    let mut sender = match inner.pool.get(&rec.sidecar_address).await {
        Ok(s) => s,
        Err(e) => return Attempt::NotDelivered(e.to_string()),
    };
    let path = match shape {
        Shape::Unary => PATH_DELIVER,
        Shape::Stream => PATH_DELIVER_STREAM,
    };
    let uri = match uri(&rec.sidecar_address, path) {
        Ok(u) => u,
        Err(e) => return Attempt::NotDelivered(e),
    };
    let mut req = grpc::grpc_request(uri, body);
    copy_forwardable(headers, req.headers_mut());
    set_timeout(req.headers_mut(), remaining);
    if let Ok(v) = HeaderValue::from_str(&rec.instance_id) {
        req.headers_mut().insert(grpc::HEADER_INSTANCE, v);
    }
    match sender.send_request(req).await {
        Ok(resp) if resp.headers().contains_key(grpc::HEADER_NOT_DELIVERED) => {
            let why = Status::from_header_map(resp.headers())
                .map(|s| s.message().to_string())
                .unwrap_or_else(|| "refused by the remote sidecar".into());
            Attempt::NotDelivered(why)
        }
        Ok(resp) => Attempt::Answered(resp),
        // Canceled: the connection closed before the request was written.
        Err(e) if e.is_canceled() => Attempt::NotDelivered(format!("sidecar {}: {e}", rec.sidecar_address)),
        Err(e) => Attempt::Failed(
            SidecarError::InstanceUnreachable {
                instance: rec.instance_id.clone(),
                cause: format!("connection to sidecar {} failed mid-call: {e}", rec.sidecar_address),
            }
            .into_status(),
        ),
    }
}

/// Turns the target side's answer into the caller's answer: status-only answers and
/// streams pass through; a unary reply gets the serving instance appended.
async fn finish(
    inner: &Inner,
    resp: Response<Incoming>,
    instance: &Instance,
    attempts: u32,
    shape: Shape,
) -> Result<Response<Body>, SidecarError> {
    let (mut parts, body) = resp.into_parts();
    if let Ok(v) = HeaderValue::from_str(&instance.record.instance_id) {
        parts.headers.insert(grpc::HEADER_INSTANCE, v);
    }
    if parts.headers.contains_key(grpc::HEADER_GRPC_STATUS) {
        return Ok(Response::from_parts(parts, Body::Empty));
    }
    if shape == Shape::Stream {
        return Ok(Response::from_parts(parts, Body::Incoming(body)));
    }
    let limit = inner.config.max_payload_bytes + ENVELOPE_ALLOWANCE;
    let collected = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| SidecarError::Internal(format!("reading the reply of {}: {e}", instance.record.instance_id)))?;
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let ok = trailers.as_ref().and_then(|t| t.get(grpc::HEADER_GRPC_STATUS)).is_some_and(|s| s.as_bytes() == b"0");
    if !ok {
        // An error (or a malformed answer) passes through unchanged.
        return Ok(Response::from_parts(parts, Body::Frames(Frames::raw(data).with_trailers(trailers))));
    }
    let Some(message) = grpc::single_message(&data) else {
        return Err(SidecarError::Internal(format!(
            "the reply of {} is not a single uncompressed message",
            instance.record.instance_id
        )));
    };
    let reg = &instance.record.registration;
    let extension = proto::InvokeReply {
        instance_id: instance.record.instance_id.clone(),
        agent: reg.agent.clone(),
        agent_version: reg.version.clone(),
        attempts,
        ..Default::default()
    }
    .encode_to_vec();
    Ok(Response::from_parts(parts, Body::Frames(Frames::message(message, &extension).with_trailers(trailers))))
}

/// Serves `Mesh/Deliver` and `Mesh/DeliverStream`: delivers to the local instance named by
/// the `ar-instance` header, passing the body through undecoded.
pub async fn deliver(inner: Arc<Inner>, req: Request<Incoming>, shape: Shape) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Some(instance_id) = parts.headers.get(grpc::HEADER_INSTANCE).and_then(|v| v.to_str().ok()) else {
        return grpc::status_response(
            SidecarError::from(FieldError::new("ar-instance", "header naming the instance is required")).into_status(),
        );
    };
    let timeout = parts.headers.get(grpc::HEADER_GRPC_TIMEOUT).and_then(|v| grpc_timeout::parse(v.as_bytes()));
    let reserve = inner.config.deadline_reserve;
    let remaining = timeout.map(|t| t.saturating_sub(reserve));
    match deliver_local(&inner, instance_id, Body::Incoming(body), remaining, &parts.headers, shape).await {
        Attempt::Answered(resp) => resp.map(Body::Incoming),
        Attempt::NotDelivered(why) => grpc::not_delivered_response(Status::unavailable(why)),
        Attempt::Failed(status) => grpc::status_response(status),
    }
}

/// Hands a call to a local agent instance.
async fn deliver_local(
    inner: &Inner,
    instance_id: &str,
    body: Body,
    remaining: Option<Duration>,
    headers: &HeaderMap,
    shape: Shape,
) -> Attempt {
    let Some(local) = inner.registry.get(instance_id) else {
        return Attempt::NotDelivered(format!(
            "instance {instance_id} is not registered at sidecar {}",
            inner.config.sidecar_id
        ));
    };
    let state = local.effective_state();
    if !state.routable() {
        return Attempt::NotDelivered(format!("instance {instance_id} is {state}"));
    }
    let mut sender = match inner.pool.get(&local.authority).await {
        Ok(s) => s,
        Err(e) => return Attempt::NotDelivered(format!("instance {instance_id}: {e}")),
    };
    let path = match shape {
        Shape::Unary => PATH_HANDLE,
        Shape::Stream => PATH_HANDLE_STREAM,
    };
    let uri = match uri(&local.authority, path) {
        Ok(u) => u,
        Err(e) => return Attempt::NotDelivered(e),
    };
    let mut req = grpc::grpc_request(uri, body);
    copy_forwardable(headers, req.headers_mut());
    if let Some(r) = remaining {
        if r.is_zero() {
            return Attempt::Failed(
                SidecarError::DeadlineExceeded { deadline: Duration::ZERO, attempts: 0, tried: Vec::new() }
                    .into_status(),
            );
        }
        set_timeout(req.headers_mut(), r);
    }
    let sent = sender.send_request(req);
    let result = match remaining {
        Some(r) => match tokio::time::timeout(r, sent).await {
            Ok(r) => r,
            Err(_) => {
                return Attempt::Failed(
                    SidecarError::DeadlineExceeded { deadline: r, attempts: 1, tried: vec![instance_id.to_string()] }
                        .into_status(),
                );
            }
        },
        None => sent.await,
    };
    match result {
        Ok(resp) => Attempt::Answered(resp),
        Err(e) if e.is_canceled() => Attempt::NotDelivered(format!("instance {instance_id}: {e}")),
        Err(e) => Attempt::Failed(
            SidecarError::InstanceUnreachable { instance: instance_id.to_string(), cause: e.to_string() }.into_status(),
        ),
    }
}

fn uri(authority: &str, path: &'static str) -> Result<Uri, String> {
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("bad address {authority:?}: {e}"))
}

fn copy_forwardable(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if grpc::forwardable_header(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

fn set_timeout(headers: &mut HeaderMap, remaining: Duration) {
    if let Ok(v) = HeaderValue::from_str(&grpc_timeout::format(remaining)) {
        headers.insert(grpc::HEADER_GRPC_TIMEOUT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invoke_head_reads_the_routing_fields_of_an_invoke_request() {
        let req = proto::InvokeRequest {
            target: Some(agent_reach::model::Target::capability("c").into()),
            payload: Bytes::from_static(b"payload"),
            content_type: "x".into(),
            session_id: "s".into(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            message_id: "m".into(),
            ..Default::default()
        };
        let head = InvokeHead::decode(Bytes::from(req.encode_to_vec())).unwrap();
        assert_eq!(head.target, req.target);
        assert_eq!(head.payload, req.payload);
        assert_eq!(head.message_id, "m");
    }
}
