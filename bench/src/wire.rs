//! The request every path carries, encoded once: a gRPC unary call to the echo agent,
//! either `Agent/Handle` with a `HandleRequest` (direct, nginx, Envoy: the proxies pass it
//! to the agent unchanged) or `Sidecar/Invoke` with an `InvokeRequest` naming the
//! capability (the mesh). Both carry the same payload bytes. This module does no I/O.

use agent_reach::proto;
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

/// The capability the echo agent serves.
pub const CAPABILITY: &str = "bench.echo";
/// The agent's method (direct, nginx and Envoy paths).
pub const PATH_HANDLE: &str = "/agentreach.v1.Agent/Handle";
/// The sidecar's method (mesh path).
pub const PATH_INVOKE: &str = "/agentreach.v1.Sidecar/Invoke";
/// The agent's streaming method (direct, nginx and Envoy paths of the streaming run).
pub const PATH_HANDLE_STREAM: &str = "/agentreach.v1.Agent/HandleStream";
/// The sidecar's streaming method (mesh path of the streaming run).
pub const PATH_INVOKE_STREAM: &str = "/agentreach.v1.Sidecar/InvokeStream";
/// Payload bytes of each chunk the echo agent streams.
pub const STREAM_CHUNK: usize = 64 * 1024;
/// Most chunks one streamed call may ask for.
pub const MAX_STREAM_CHUNKS: u32 = 65_536;

/// What the first hop of a path expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `Agent/Handle` with a `HandleRequest` (an agent, or a proxy in front of one).
    Agent,
    /// `Sidecar/Invoke` with an `InvokeRequest` by capability (a sidecar's local API).
    Mesh,
}

impl Kind {
    pub fn path(self) -> &'static str {
        match self {
            Kind::Agent => PATH_HANDLE,
            Kind::Mesh => PATH_INVOKE,
        }
    }

    /// The server-streaming method of the same first hop.
    pub fn stream_path(self) -> &'static str {
        match self {
            Kind::Agent => PATH_HANDLE_STREAM,
            Kind::Mesh => PATH_INVOKE_STREAM,
        }
    }
}

/// A payload of `len` printable bytes.
pub fn payload(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>())
}

/// The protobuf request message for `kind` carrying `payload`.
pub fn request_message(kind: Kind, payload: &Bytes) -> Vec<u8> {
    match kind {
        Kind::Agent => handle_request(payload).encode_to_vec(),
        Kind::Mesh => invoke_request(payload).encode_to_vec(),
    }
}

pub fn handle_request(payload: &Bytes) -> proto::HandleRequest {
    proto::HandleRequest { payload: payload.clone(), capability: CAPABILITY.into(), ..Default::default() }
}

pub fn invoke_request(payload: &Bytes) -> proto::InvokeRequest {
    proto::InvokeRequest {
        target: Some(proto::Target {
            kind: Some(proto::target::Kind::Capability(CAPABILITY.into())),
            tags: Vec::new(),
        }),
        payload: payload.clone(),
        ..Default::default()
    }
}

/// `message` as one length-prefixed, uncompressed gRPC message (the request body).
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.len());
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    buf.put_slice(message);
    buf.freeze()
}

/// The full request body of one call of `kind` with a payload of `len` bytes.
pub fn request_body(kind: Kind, len: usize) -> Bytes {
    grpc_frame(&request_message(kind, &payload(len)))
}

/// The request body of a streamed call asking the echo agent for `chunks` chunks of
/// [`STREAM_CHUNK`] bytes: the same message as a unary call of `kind`, its payload the
/// count in decimal.
pub fn stream_request_body(kind: Kind, chunks: u32) -> Bytes {
    grpc_frame(&request_message(kind, &Bytes::from(chunks.to_string())))
}

/// The chunk count a streamed call's payload asks for (see [`stream_request_body`]).
pub fn parse_stream_request(payload: &[u8]) -> Result<u32, String> {
    let n: u32 = std::str::from_utf8(payload)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| format!("the payload must be a chunk count in decimal, got {} bytes", payload.len()))?;
    if n == 0 || n > MAX_STREAM_CHUNKS {
        return Err(format!("chunk count {n} is not within 1..={MAX_STREAM_CHUNKS}"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_decode_as_the_request_types() {
        let body = request_body(Kind::Agent, 12);
        assert_eq!(body[0], 0);
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        assert_eq!(len + 5, body.len());
        let req = proto::HandleRequest::decode(&body[5..]).unwrap();
        assert_eq!(req.payload.len(), 12);
        assert_eq!(req.capability, CAPABILITY);

        let body = request_body(Kind::Mesh, 1024);
        let req = proto::InvokeRequest::decode(&body[5..]).unwrap();
        assert_eq!(req.payload, payload(1024));
        assert!(matches!(req.target.unwrap().kind, Some(proto::target::Kind::Capability(c)) if c == CAPABILITY));
    }

    #[test]
    fn stream_requests_carry_the_chunk_count() {
        let body = stream_request_body(Kind::Mesh, 64);
        let req = proto::InvokeRequest::decode(&body[5..]).unwrap();
        assert_eq!(parse_stream_request(&req.payload), Ok(64));
        let req = proto::HandleRequest::decode(&stream_request_body(Kind::Agent, 3)[5..]).unwrap();
        assert_eq!((parse_stream_request(&req.payload), req.capability.as_str()), (Ok(3), CAPABILITY));
        assert!(parse_stream_request(b"0").is_err());
        assert!(parse_stream_request(b"65537").is_err());
        assert!(parse_stream_request(b"abc").is_err());
        assert_eq!(Kind::Agent.stream_path(), "/agentreach.v1.Agent/HandleStream");
    }
}
