//! The HTTP/JSON adapter: agents registered with transport `http` receive each call as a
//! JSON `POST` to their endpoint URL and answer JSON, so agents without gRPC can join.
//!
//! Request body (`Content-Type: application/json`):
//! ```json
//! { "capability": "text.summarize", "target": {"capability": "text.summarize", "tags": ["en"]},
//!   "message_id": "…", "session_id": "…", "priority": "NORMAL", "idempotency_key": "",
//!   "metadata": {"k": "v"}, "caller": {"agent": "planner", "instance_id": "planner-…"},
//!   "instance_id": "summarizer-…", "attempt": 1, "tenant": "default",
//!   "content_type": "text/plain", "payload_base64": "aGVsbG8=", "text": "hello",
//!   "deadline_ms": 2950, "stream": false }
//! ```
//! `text` is present when the payload is valid UTF-8. The remaining deadline is also sent
//! as the header `X-Agent-Reach-Deadline-Ms`, and `traceparent` travels as a header.
//!
//! `caller` is what the caller wrote about itself. The caller the mesh verified (its agent
//! credential, vouched for by its sidecar over mutual TLS) comes as `"verified_caller":
//! {"agent": …, "instance_id": …, "tenant": …}` and as the headers
//! `X-Agent-Reach-Caller-Agent`, `X-Agent-Reach-Caller-Instance` and
//! `X-Agent-Reach-Caller-Tenant` (the caller's tenant: this one's, or the tenant another
//! tenant's grant let in); all are absent for anonymous calls. The sidecar
//! builds each request to the agent from scratch (only `traceparent` is carried over), so
//! a caller cannot smuggle those headers in.
//!
//! Answer: HTTP 2xx with `{"text": "…"}` or `{"payload_base64": "…"}`, optionally
//! `"content_type"` and `"metadata"`. For `InvokeStream` (`"stream": true`) the answer is
//! newline-delimited JSON (`application/x-ndjson`), one such object per chunk. Errors: a
//! non-2xx status with `{"error": "why"}`; 400 → INVALID_ARGUMENT, 404 → NOT_FOUND,
//! 409 → ABORTED, 429 → RESOURCE_EXHAUSTED, 503 → UNAVAILABLE, 504 → DEADLINE_EXCEEDED,
//! anything else → INTERNAL. Only the `error` text (256 bytes at most) reaches the caller;
//! any other body is not quoted (see [`error_reason`]).
//!
//! Health: `GET` of the agent's `health_path` (registration metadata, default `/healthz`).

use std::collections::HashMap;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_telemetry::trace::TRACEPARENT;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;
use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

use crate::call::{Attempt, Caller, Shape};
use crate::error::DeliveryError;
use crate::grpc::{self, Body, ChannelBody, Frames, header};
use crate::http_client::client;
use crate::registry::LocalInstance;

/// Largest JSON answer accepted from an HTTP agent.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

#[derive(Serialize)]
struct JsonCall<'a> {
    capability: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<JsonTarget<'a>>,
    message_id: &'a str,
    session_id: &'a str,
    priority: &'static str,
    idempotency_key: &'a str,
    metadata: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    caller: Option<JsonCaller<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified_caller: Option<JsonCaller<'a>>,
    instance_id: &'a str,
    attempt: u32,
    tenant: &'a str,
    content_type: &'a str,
    payload_base64: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<u64>,
    stream: bool,
}

#[derive(Serialize)]
struct JsonTarget<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capability: Option<&'a str>,
    tags: &'a [String],
}

#[derive(Serialize)]
struct JsonCaller<'a> {
    agent: &'a str,
    instance_id: &'a str,
    /// Only for the verified caller: its tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JsonAnswer {
    text: Option<String>,
    payload_base64: Option<String>,
    content_type: Option<String>,
    metadata: HashMap<String, String>,
    error: Option<String>,
}

impl JsonAnswer {
    fn into_chunk(self) -> Result<proto::Chunk, Status> {
        let (payload, default_type) = match (self.text, self.payload_base64) {
            (Some(t), None) => (Bytes::from(t), "text/plain; charset=utf-8"),
            (None, Some(b)) => (
                Bytes::from(
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .map_err(|e| Status::internal(format!("HTTP agent answered invalid payload_base64: {e}")))?,
                ),
                "",
            ),
            (None, None) => (Bytes::new(), ""),
            (Some(_), Some(_)) => {
                return Err(Status::internal("HTTP agent answered both text and payload_base64"));
            }
        };
        Ok(proto::Chunk {
            payload,
            content_type: self.content_type.unwrap_or_else(|| default_type.to_string()),
            metadata: self.metadata,
        })
    }
}

fn priority_name(p: i32) -> &'static str {
    agent_reach::convert::priority_from_i32(p).as_str()
}

fn code_for(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::InvalidArgument,
        404 => Code::NotFound,
        409 => Code::Aborted,
        429 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// The JSON body an HTTP agent receives for `call`.
fn json_call(
    call: &proto::HandleRequest,
    verified: Option<(&Caller, &str)>,
    remaining: Option<Duration>,
    shape: Shape,
) -> Result<Vec<u8>, serde_json::Error> {
    let target = call.target.as_ref().map(|t| JsonTarget {
        agent: match &t.kind {
            Some(proto::target::Kind::Agent(a)) => Some(a.as_str()),
            _ => None,
        },
        capability: match &t.kind {
            Some(proto::target::Kind::Capability(c)) => Some(c.as_str()),
            _ => None,
        },
        tags: &t.tags,
    });
    let json = JsonCall {
        capability: &call.capability,
        target,
        message_id: &call.message_id,
        session_id: &call.session_id,
        priority: priority_name(call.priority),
        idempotency_key: &call.idempotency_key,
        metadata: &call.metadata,
        caller: call.caller.as_ref().map(|c| JsonCaller { agent: &c.agent, instance_id: &c.instance_id, tenant: None }),
        verified_caller: verified.map(|(c, tenant)| JsonCaller {
            agent: &c.agent,
            instance_id: &c.instance,
            tenant: Some(tenant),
        }),
        instance_id: &call.instance_id,
        attempt: call.attempt,
        tenant: &call.tenant,
        content_type: &call.content_type,
        payload_base64: base64::engine::general_purpose::STANDARD.encode(&call.payload),
        text: std::str::from_utf8(&call.payload).ok(),
        deadline_ms: remaining.map(|r| r.as_millis() as u64),
        stream: shape == Shape::Stream,
    };
    serde_json::to_vec(&json)
}

/// Delivers one call to an HTTP/JSON agent and converts its answer back to gRPC. `tenant`
/// is the one the caller was verified as (a message naming another is refused), `caller`
/// the verified agent, if any.
pub(crate) async fn deliver(
    local: &LocalInstance,
    body: Body,
    remaining: Option<Duration>,
    headers: &HeaderMap,
    shape: Shape,
    tenant: &str,
    caller: Option<&Caller>,
) -> Attempt {
    let verified = caller.map(|c| (c, tenant));
    let collected = match Limited::new(body, MAX_ANSWER_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return Attempt::Failed(DeliveryError::Internal(format!("reading the call: {e}"))),
    };
    let Some(message) = grpc::single_message(&collected) else {
        return Attempt::Failed(DeliveryError::InvalidArgument("the call is not a single uncompressed message".into()));
    };
    let call = match proto::HandleRequest::decode(message) {
        Ok(c) => c,
        Err(e) => return Attempt::Failed(DeliveryError::InvalidArgument(format!("not a HandleRequest: {e}"))),
    };
    if let Err(e) = super::check_tenant_field(&call.tenant, tenant) {
        return Attempt::Failed(e);
    }
    let body = match json_call(&call, verified, remaining, shape) {
        Ok(b) => b,
        Err(e) => return Attempt::Failed(DeliveryError::Internal(format!("encoding the call as JSON: {e}"))),
    };
    let url = format!("http://{}{}", local.authority, agent_reach::model::endpoint_path(&local.registration.endpoint));
    let mut req = match Request::post(&url).body(Full::new(Bytes::from(body))) {
        Ok(r) => r,
        Err(e) => return Attempt::NotDelivered(DeliveryError::Unavailable(format!("bad agent endpoint {url:?}: {e}"))),
    };
    let h = req.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if shape == Shape::Stream {
        h.insert(http::header::ACCEPT, HeaderValue::from_static("application/x-ndjson"));
    }
    if let Some(r) = remaining
        && let Ok(v) = HeaderValue::from_str(&r.as_millis().to_string())
    {
        h.insert(header::HTTP_AGENT_DEADLINE_MS, v);
    }
    if let Some(tp) = headers.get(TRACEPARENT) {
        h.insert(TRACEPARENT, tp.clone());
    }
    if let Some((c, tenant)) = verified
        && let (Ok(agent), Ok(instance), Ok(tenant)) =
            (HeaderValue::from_str(&c.agent), HeaderValue::from_str(&c.instance), HeaderValue::from_str(tenant))
    {
        h.insert(header::HTTP_AGENT_CALLER_AGENT, agent);
        h.insert(header::HTTP_AGENT_CALLER_INSTANCE, instance);
        h.insert(header::HTTP_AGENT_CALLER_TENANT, tenant);
    }
    let sent = client().request(req);
    let resp = match remaining {
        Some(r) => match tokio::time::timeout(r, sent).await {
            Ok(r) => r,
            Err(_) => {
                return Attempt::Failed(DeliveryError::DeadlineExceeded(format!(
                    "HTTP agent did not answer within {r:?}"
                )));
            }
        },
        None => sent.await,
    };
    let resp = match resp {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!("HTTP agent {url}: {e}")));
        }
        Err(e) => return Attempt::Failed(DeliveryError::Unavailable(format!("HTTP agent {url}: {e}"))),
    };
    let status = resp.status();
    if !status.is_success() {
        let bytes = Limited::new(resp.into_body(), MAX_ERROR_BODY_BYTES)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let why = error_reason(&bytes);
        let status = Status::new(code_for(status), format!("HTTP agent answered {status}: {why}"));
        return Attempt::Answered(grpc::status_response(status), None);
    }
    if shape == Shape::Stream {
        return Attempt::Answered(stream_answer(resp.into_body()), None);
    }
    let bytes = match Limited::new(resp.into_body(), MAX_ANSWER_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return Attempt::Failed(DeliveryError::Unavailable(format!("reading the HTTP agent's answer: {e}"))),
    };
    let answer = serde_json::from_slice::<JsonAnswer>(&bytes)
        .map_err(|e| Status::internal(format!("HTTP agent answered invalid JSON: {e}")))
        .and_then(JsonAnswer::into_chunk);
    match answer {
        Ok(chunk) => {
            let reply = proto::HandleReply {
                payload: chunk.payload,
                content_type: chunk.content_type,
                metadata: chunk.metadata,
            };
            Attempt::Answered(grpc_ok(Frames::message(Bytes::from(reply.encode_to_vec()), &[])), None)
        }
        Err(status) => Attempt::Answered(grpc::status_response(status), None),
    }
}

/// The part of an error answer's body read: an `{"error": "why"}` is short.
const MAX_ERROR_BODY_BYTES: usize = 4 * 1024;
/// The longest `error` text passed on to the caller.
const MAX_ERROR_TEXT_BYTES: usize = 256;

/// What the caller learns of an HTTP agent's error answer: the `error` field of its JSON
/// body, cut to 256 bytes, and nothing else of the body. The endpoint may be a server that
/// is not an agent at all (an internal page an agent's registration points at), so an
/// arbitrary body is never quoted: that would hand its content to any caller.
fn error_reason(body: &[u8]) -> String {
    match serde_json::from_slice::<JsonAnswer>(body).ok().and_then(|a| a.error) {
        Some(why) => agent_reach::reason::truncate(&why, MAX_ERROR_TEXT_BYTES).into_owned(),
        None if body.is_empty() => "(empty body)".to_string(),
        None => format!("(a body of {} bytes that is not {{\"error\": …}} JSON; not shown)", body.len()),
    }
}

/// A gRPC answer carrying `frames` and status OK.
fn grpc_ok(frames: Frames) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::HEADER_GRPC_STATUS, HeaderValue::from_static("0"));
    let mut resp = Response::new(Body::Frames(frames.with_trailers(Some(trailers))));
    resp.headers_mut().insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    resp
}

/// The lines of an HTTP agent's NDJSON answer as they arrive, each a chunk.
#[derive(Default)]
pub(crate) struct NdjsonLines {
    buf: BytesMut,
}

impl NdjsonLines {
    /// Adds bytes of the answer; RESOURCE_EXHAUSTED when a line grows past
    /// [`MAX_ANSWER_BYTES`].
    pub(crate) fn push(&mut self, data: &[u8]) -> Result<(), Status> {
        self.buf.extend_from_slice(data);
        if self.buf.len() > MAX_ANSWER_BYTES && !self.buf.contains(&b'\n') {
            return Err(Status::resource_exhausted(format!(
                "HTTP agent streamed a line longer than {MAX_ANSWER_BYTES} bytes"
            )));
        }
        Ok(())
    }

    /// The next complete line's chunk (blank lines are skipped), or its error.
    pub(crate) fn next_chunk(&mut self) -> Option<Result<proto::Chunk, Status>> {
        loop {
            let pos = self.buf.iter().position(|b| *b == b'\n')?;
            let line = self.buf.split_to(pos + 1);
            let line = &line[..line.len() - 1];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(
                serde_json::from_slice::<JsonAnswer>(line)
                    .map_err(|e| Status::internal(format!("HTTP agent streamed invalid JSON: {e}")))
                    .and_then(JsonAnswer::into_chunk),
            );
        }
    }
}

/// Converts an NDJSON answer into a gRPC stream of `Chunk`s, one per line, with
/// back-pressure through a small channel.
fn stream_answer(body: hyper::body::Incoming) -> Response<Body> {
    let (tx, channel) = ChannelBody::new(4);
    tokio::spawn(async move {
        let mut body = body;
        let mut lines = NdjsonLines::default();
        let status = 'read: loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if let Err(status) = lines.push(&data) {
                        break status;
                    }
                    while let Some(line) = lines.next_chunk() {
                        match line {
                            Ok(chunk) => {
                                let mut frames = Frames::message(Bytes::from(chunk.encode_to_vec()), &[]);
                                while let Some(f) = frames.take_frame() {
                                    if tx.send(Ok(f)).await.is_err() {
                                        return; // the caller went away
                                    }
                                }
                            }
                            Err(status) => break 'read status,
                        }
                    }
                }
                Some(Err(e)) => break Status::unavailable(format!("HTTP agent stream failed: {e}")),
                None => break Status::new(Code::Ok, ""),
            }
        };
        let mut trailers = HeaderMap::new();
        if status.add_header(&mut trailers).is_ok() {
            let _ = tx.send(Ok(http_body::Frame::trailers(trailers))).await;
        }
    });
    let mut resp = Response::new(Body::Channel(channel));
    resp.headers_mut().insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The chunks (or error messages) of `parts` fed to [`NdjsonLines`] in order.
    fn read_all(parts: &[&[u8]]) -> Vec<Result<proto::Chunk, String>> {
        let mut lines = NdjsonLines::default();
        let mut out = Vec::new();
        for part in parts {
            if let Err(s) = lines.push(part) {
                out.push(Err(s.message().to_string()));
                return out;
            }
            while let Some(line) = lines.next_chunk() {
                out.push(line.map_err(|s| s.message().to_string()));
            }
        }
        out
    }

    proptest! {
        #[test]
        fn ndjson_never_panics_and_reads_the_same_in_any_split(bytes in proptest::collection::vec(any::<u8>(), 0..512), split in 1usize..64) {
            let whole = read_all(&[&bytes]);
            let parts: Vec<&[u8]> = bytes.chunks(split).collect();
            prop_assert_eq!(read_all(&parts), whole);
        }

        #[test]
        fn ndjson_text_lines_round_trip(texts in proptest::collection::vec(".*", 0..8), split in 1usize..64) {
            let mut answer = Vec::new();
            for t in &texts {
                answer.extend(serde_json::to_vec(&serde_json::json!({"text": t})).unwrap());
                answer.extend(b"\n\n");
            }
            let parts: Vec<&[u8]> = answer.chunks(split).collect();
            let read: Vec<String> = read_all(&parts)
                .into_iter()
                .map(|c| String::from_utf8(c.unwrap().payload.to_vec()).unwrap())
                .collect();
            prop_assert_eq!(read, texts);
        }
    }

    #[test]
    fn a_line_past_the_limit_is_refused() {
        let mut lines = NdjsonLines::default();
        let long = vec![b'x'; MAX_ANSWER_BYTES];
        assert!(lines.push(&long).is_ok());
        assert_eq!(lines.push(b"x").unwrap_err().code(), Code::ResourceExhausted);
    }

    #[test]
    fn an_error_answer_passes_on_its_error_field_only() {
        assert_eq!(error_reason(br#"{"error":"no such order"}"#), "no such order");
        let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(1000));
        assert!(error_reason(long.as_bytes()).len() <= MAX_ERROR_TEXT_BYTES + 4);
        let page = b"<html>internal admin page: token=s3cr3t</html>";
        let why = error_reason(page);
        assert!(!why.contains("s3cr3t"), "{why}");
        assert_eq!(why, format!("(a body of {} bytes that is not {{\"error\": …}} JSON; not shown)", page.len()));
        assert_eq!(error_reason(b""), "(empty body)");
    }
}
