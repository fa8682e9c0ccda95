//! A2A requests carried through the mesh to an agent registered with transport A2A,
//! unchanged: the call's payload is one `lf.a2a.v1` request in protobuf (content type
//! [`A2A_PROTO_CONTENT_TYPE`]), its metadata names the method ([`A2A_METHOD_KEY`]). The
//! target's sidecar sends the payload as the request of that method to the agent's gRPC
//! server and answers the agent's answer, undecoded: a unary answer is the payload of the
//! reply, each message of a streamed answer the payload of a `Chunk`, both of content type
//! [`A2A_PROTO_CONTENT_TYPE`]. The agent's error status (its A2A `ErrorInfo` included)
//! passes through as it is. The caller's sidecar (`a2a::forward`) makes these calls and
//! reads their answers.

use agent_reach::proto;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use prost::Message as _;
use tonic::{Code, Status};

use crate::a2a_wire::{A2A_METHOD_KEY, A2A_PROTO_CONTENT_TYPE, PASS_THROUGH_METHODS};
use crate::call::{Attempt, Shape};
use crate::error::DeliveryError;
use crate::grpc::{self, Body, ChannelBody, Frames, MessageReader, Read, StoredResponse};
use crate::pool::{Conn, SendError, To, send_h2};

/// Whether the call is an A2A request to carry through unchanged.
pub(crate) fn is_pass_through(call: &proto::HandleRequest) -> bool {
    call.content_type == A2A_PROTO_CONTENT_TYPE
}

/// The gRPC path of `method`, if the call's shape fits it.
fn path_of(method: &str, shape: Shape) -> Result<&'static str, String> {
    let Some((_, path, streams)) = PASS_THROUGH_METHODS.iter().find(|(m, _, _)| *m == method) else {
        let known: Vec<&str> = PASS_THROUGH_METHODS.iter().map(|(m, _, _)| *m).collect();
        return Err(format!(
            "metadata {A2A_METHOD_KEY} {method:?} is not a method carried to A2A agents ({})",
            known.join(", ")
        ));
    };
    match (streams, shape) {
        (true, Shape::Unary) => Err(format!("A2A method {method} answers a stream: call it with InvokeStream")),
        (false, Shape::Stream) => Err(format!("A2A method {method} answers one message: call it with Invoke")),
        _ => Ok(path),
    }
}

/// Forwards the A2A request `call` carries to the agent on `conn`.
pub(crate) async fn forward(
    conn: Conn,
    instance_id: &str,
    call: proto::HandleRequest,
    headers: HeaderMap,
    shape: Shape,
    limit: usize,
) -> Attempt {
    let method = call.metadata.get(A2A_METHOD_KEY).map(String::as_str).unwrap_or_default();
    let path = match path_of(method, shape) {
        Ok(p) => p,
        Err(why) => return Attempt::Failed(DeliveryError::InvalidArgument(why)),
    };
    let data = grpc::frames_data(Frames::message(call.payload, &[]));
    let resp = match send_h2(conn, http::uri::PathAndQuery::from_static(path), headers, data, To::Agent).await {
        Ok(r) => r,
        Err(SendError::NotSent(e)) => {
            return Attempt::NotDelivered(DeliveryError::Unavailable(format!("instance {instance_id}: {e}")));
        }
        Err(SendError::Failed(e)) => {
            return Attempt::Failed(DeliveryError::Unavailable(format!("A2A agent {instance_id}: {e}")));
        }
    };
    // Trailers-only: the agent refused the request (an A2A error), passed on as it is.
    if let Some(status) = Status::from_header_map(resp.headers()).filter(|s| s.code() != Code::Ok) {
        return Attempt::Answered(grpc::status_response(status), None);
    }
    match shape {
        Shape::Unary => unary(resp, limit).await,
        Shape::Stream => Attempt::Answered(stream(resp, instance_id.to_string(), limit), None),
    }
}

/// The agent's one answer as the payload of the reply.
async fn unary(resp: Response<Body>, limit: usize) -> Attempt {
    let stored = match StoredResponse::collect(resp, limit).await {
        Ok(s) => s,
        Err(e) => return Attempt::Failed(DeliveryError::Unavailable(format!("reading the A2A agent's answer: {e}"))),
    };
    if let Some(status) = stored.trailers.as_ref().and_then(Status::from_header_map).filter(|s| s.code() != Code::Ok) {
        return Attempt::Answered(grpc::status_response(status), None);
    }
    let Some(message) = grpc::single_message(&stored.data) else {
        let status = Status::internal("the A2A agent answered no single uncompressed message");
        return Attempt::Answered(grpc::status_response(status), None);
    };
    let reply =
        proto::HandleReply { payload: message, content_type: A2A_PROTO_CONTENT_TYPE.into(), ..Default::default() };
    Attempt::Answered(
        ok_response(Body::Frames(
            Frames::message(Bytes::from(reply.encode_to_vec()), &[]).with_trailers(Some(ok_trailers())),
        )),
        None,
    )
}

/// The agent's streamed answer, each message as the payload of a `Chunk`, then its status.
fn stream(resp: Response<Body>, instance_id: String, limit: usize) -> Response<Body> {
    let (tx, channel) = ChannelBody::new(4);
    tokio::spawn(async move {
        let mut reader = MessageReader::new(resp.into_body(), limit);
        let trailers = loop {
            match reader.next().await {
                Ok(Read::Message(m)) => {
                    let chunk =
                        proto::Chunk { payload: m, content_type: A2A_PROTO_CONTENT_TYPE.into(), ..Default::default() };
                    let mut frames = Frames::message(Bytes::from(chunk.encode_to_vec()), &[]);
                    while let Some(f) = frames.take_frame() {
                        if tx.send(Ok(f)).await.is_err() {
                            return; // the caller went away: dropping the reader resets the agent's stream
                        }
                    }
                }
                Ok(Read::End(Some(trailers))) => break trailers,
                Ok(Read::End(None)) => {
                    break status_trailers(Status::internal(format!(
                        "the A2A agent {instance_id} ended its stream without a status"
                    )));
                }
                Err(e) => break status_trailers(Status::unavailable(format!("the A2A agent {instance_id}: {e}"))),
            }
        };
        let _ = tx.send(Ok(http_body::Frame::trailers(trailers))).await;
    });
    ok_response(Body::Channel(channel))
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::HEADER_GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

fn status_trailers(status: Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        trailers.insert(grpc::HEADER_GRPC_STATUS, HeaderValue::from(Code::Internal as i32));
    }
    trailers
}

fn ok_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(http::header::CONTENT_TYPE, grpc::CONTENT_TYPE_GRPC);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_must_be_known_and_fit_the_shape() {
        assert_eq!(path_of("GetTask", Shape::Unary), Ok("/lf.a2a.v1.A2AService/GetTask"));
        assert_eq!(path_of("SubscribeToTask", Shape::Stream), Ok("/lf.a2a.v1.A2AService/SubscribeToTask"));
        assert_eq!(
            path_of("SubscribeToTask", Shape::Unary),
            Err("A2A method SubscribeToTask answers a stream: call it with InvokeStream".into())
        );
        assert_eq!(
            path_of("SendMessage", Shape::Stream),
            Err("A2A method SendMessage answers one message: call it with Invoke".into())
        );
        let unknown = path_of("DeleteEverything", Shape::Unary).unwrap_err();
        assert!(unknown.starts_with("metadata a2a-method \"DeleteEverything\" is not a method carried to A2A agents (SendMessage, SendStreamingMessage, GetTask"), "{unknown}");
        assert!(path_of("", Shape::Unary).is_err());
    }
}
