//! The A2A wire (`lf.a2a.v1`): the vendored messages, and how a mesh payload and an A2A
//! message convert into each other. A leaf: both the A2A endpoints (`a2a`) and delivery to
//! agents that are A2A servers (`inbound::a2a_agent`) build on it.

use bytes::Bytes;

#[cfg(test)]
mod codec;

/// The `lf.a2a.v1` messages and service (vendored `proto/lf/a2a/v1/a2a.proto`), with serde
/// in the protobuf JSON mapping.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/lf.a2a.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/lf.a2a.v1.serde.rs"));
}

use proto::{Message, Part, part};

/// The content type of a payload that is a whole A2A message in the JSON mapping (a
/// message of several parts, or of a URL part).
pub const A2A_MESSAGE_CONTENT_TYPE: &str = "application/a2a-message+json";

/// The content type of a payload that is one `lf.a2a.v1` request or answer in protobuf,
/// carried through the mesh unchanged to an agent registered with transport A2A: the
/// request's method is in the call's metadata under [`A2A_METHOD_KEY`]; each answer (a
/// unary reply, or each chunk of a stream) is the method's answer message.
pub const A2A_PROTO_CONTENT_TYPE: &str = "application/a2a+proto";
/// The call metadata key naming the `lf.a2a.v1.A2AService` method of an
/// [`A2A_PROTO_CONTENT_TYPE`] payload (e.g. `GetTask`).
pub const A2A_METHOD_KEY: &str = "a2a-method";

/// The methods carried through to an A2A agent: name, gRPC path, and whether the answer is
/// a stream.
pub(crate) const PASS_THROUGH_METHODS: [(&str, &str, bool); 6] = [
    ("SendMessage", "/lf.a2a.v1.A2AService/SendMessage", false),
    ("SendStreamingMessage", "/lf.a2a.v1.A2AService/SendStreamingMessage", true),
    ("GetTask", "/lf.a2a.v1.A2AService/GetTask", false),
    ("ListTasks", "/lf.a2a.v1.A2AService/ListTasks", false),
    ("CancelTask", "/lf.a2a.v1.A2AService/CancelTask", false),
    ("SubscribeToTask", "/lf.a2a.v1.A2AService/SubscribeToTask", true),
];

/// Why a message has no mesh payload: the message is not valid, or it could not be encoded.
#[derive(Debug)]
pub(crate) enum WireError {
    InvalidParams(String),
    Internal(String),
}

/// The mesh payload of a message: its single part as text, bytes or JSON; a message of
/// several parts (or of a URL part) as its whole A2A JSON.
pub(crate) fn payload_of(message: &Message) -> Result<(Bytes, String), WireError> {
    let media =
        |p: &Part, default: &str| if p.media_type.is_empty() { default.to_string() } else { p.media_type.clone() };
    match message.parts.as_slice() {
        [] => Err(WireError::InvalidParams("message.parts is empty".into())),
        [p] => match &p.content {
            Some(part::Content::Text(t)) => Ok((Bytes::from(t.clone()), media(p, "text/plain"))),
            Some(part::Content::Raw(b)) => Ok((Bytes::from(b.clone()), media(p, "application/octet-stream"))),
            Some(part::Content::Data(v)) => Ok((
                Bytes::from(serde_json::to_vec(v).map_err(|e| WireError::InvalidParams(e.to_string()))?),
                "application/json".to_string(),
            )),
            Some(part::Content::Url(_)) => whole(message),
            None => Err(WireError::InvalidParams("message.parts[0] has no content".into())),
        },
        _ => whole(message),
    }
}

fn whole(message: &Message) -> Result<(Bytes, String), WireError> {
    let json = serde_json::to_vec(message).map_err(|e| WireError::Internal(e.to_string()))?;
    Ok((Bytes::from(json), A2A_MESSAGE_CONTENT_TYPE.to_string()))
}

/// The A2A part of a reply: text for `text/*`, JSON data for `application/json`, else bytes.
pub(crate) fn part_of(payload: Bytes, content_type: &str) -> Part {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let content = if essence.starts_with("text/") || (essence.is_empty() && std::str::from_utf8(&payload).is_ok()) {
        match String::from_utf8(payload.to_vec()) {
            Ok(t) => part::Content::Text(t),
            Err(_) => part::Content::Raw(payload.to_vec()),
        }
    } else if essence == "application/json" || essence.ends_with("+json") {
        match serde_json::from_slice::<pbjson_types::Value>(&payload) {
            Ok(v) => part::Content::Data(v),
            Err(_) => part::Content::Raw(payload.to_vec()),
        }
    } else {
        part::Content::Raw(payload.to_vec())
    };
    let media_type = if content_type.is_empty() { "text/plain".to_string() } else { content_type.to_string() };
    Part { content: Some(content), metadata: None, filename: String::new(), media_type }
}

/// The A2A parts of a payload: a whole A2A message's parts, or one part.
pub(crate) fn parts_of_payload(payload: bytes::Bytes, content_type: &str) -> Vec<Part> {
    if content_type == A2A_MESSAGE_CONTENT_TYPE
        && let Ok(m) = serde_json::from_slice::<Message>(&payload)
    {
        return m.parts;
    }
    vec![part_of(payload, content_type)]
}
