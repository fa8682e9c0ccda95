//! Malformed requests to the third-party gRPC services Agent-Reach serves (`grpc.health.v1`
//! from tonic-health, `grpc.reflection.*` from tonic-reflection), answered like every
//! other RPC: INVALID_ARGUMENT with an `ErrorInfo` (reason `INVALID_ARGUMENT`, `field:
//! request`), see [`crate::codec`]. Their generated servers decode with tonic's own codec,
//! which answers INTERNAL (health), or end the stream with OK and nothing in it
//! (reflection).
//!
//! [`Strict`] wraps such a service: it reads each gRPC message of the request as it passes
//! (without copying the body) and decodes it as `Req`; at the first one that does not
//! decode, the request body ends there and the answer's status (in its headers, or in its
//! trailers for a stream) becomes the INVALID_ARGUMENT. Compressed messages and messages
//! over 4 MiB are passed on unchecked (the service refuses those itself, with their own
//! codes).

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame};
use prost::Message;
use tonic::Status;
use tonic::server::NamedService;

/// Messages larger than this are not checked.
const MAX_CHECKED: usize = 4 * 1024 * 1024;

/// A service whose malformed requests are answered with INVALID_ARGUMENT (module doc).
pub struct Strict<S, Req> {
    inner: S,
    _req: PhantomData<fn() -> Req>,
}

impl<S: Clone, Req> Clone for Strict<S, Req> {
    fn clone(&self) -> Self {
        Strict { inner: self.inner.clone(), _req: PhantomData }
    }
}

impl<S, Req> Strict<S, Req> {
    /// `inner`, whose request messages are `Req`.
    pub fn new(inner: S) -> Strict<S, Req> {
        Strict { inner, _req: PhantomData }
    }
}

impl<S: NamedService, Req> NamedService for Strict<S, Req> {
    const NAME: &'static str = S::NAME;
}

/// The first malformed message's status, shared by the request and response bodies.
type Bad = Arc<OnceLock<Status>>;

impl<S, B, RB, Req> tower_service::Service<http::Request<B>> for Strict<S, Req>
where
    S: tower_service::Service<http::Request<Checked<B, Req>>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: Body<Data = Bytes> + Send + Unpin + 'static,
    RB::Error: Into<tonic::codegen::StdError>,
    Req: Message + Default + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let bad = Bad::default();
        let checked = bad.clone();
        let call = self.inner.call(req.map(move |body| Checked::new(body, checked)));
        Box::pin(async move {
            let (mut parts, body) = call.await?.into_parts();
            if let Some(status) = bad.get()
                && parts.headers.contains_key("grpc-status")
            {
                replace_status(&mut parts.headers, status);
            }
            Ok(http::Response::from_parts(parts, tonic::body::Body::new(Answer { body, bad })))
        })
    }
}

/// Puts `status` in place of the gRPC status in `headers`.
fn replace_status(headers: &mut http::HeaderMap, status: &Status) {
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        headers.remove(name);
    }
    if status.add_header(headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
}

/// A request body whose gRPC messages are checked as they pass (module doc).
pub struct Checked<B, Req> {
    body: B,
    bad: Bad,
    /// The bytes of the message being read, once its 5-byte prefix is complete.
    pending: BytesMut,
    /// Bytes of an unchecked message (compressed or too large) still to pass.
    skip: usize,
    ended: bool,
    _req: PhantomData<fn() -> Req>,
}

impl<B, Req> Checked<B, Req> {
    fn new(body: B, bad: Bad) -> Self {
        Checked { body, bad, pending: BytesMut::new(), skip: 0, ended: false, _req: PhantomData }
    }
}

impl<B, Req: Message + Default> Checked<B, Req> {
    /// Follows the messages in `data`; false at the first one that does not decode.
    fn check(&mut self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let wanted = if self.pending.len() < 5 {
                5 - self.pending.len()
            } else {
                let len = u32::from_be_bytes([self.pending[1], self.pending[2], self.pending[3], self.pending[4]]);
                5 + len as usize - self.pending.len()
            };
            let n = wanted.min(data.len());
            self.pending.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.pending.len() == 5 {
                let len = u32::from_be_bytes([self.pending[1], self.pending[2], self.pending[3], self.pending[4]]);
                if self.pending[0] != 0 || len as usize > MAX_CHECKED {
                    self.skip = len as usize;
                    self.pending.clear();
                    continue;
                }
            }
            let len = self.pending.len();
            if len >= 5
                && len
                    == 5 + u32::from_be_bytes([self.pending[1], self.pending[2], self.pending[3], self.pending[4]])
                        as usize
            {
                let mut message = self.pending.split().freeze();
                message.advance(5);
                if let Err(e) = Req::decode(message) {
                    let _ = self.bad.set(crate::codec::decode_error::<Req>(Status::internal(e.to_string())));
                    return false;
                }
            }
        }
        true
    }
}

impl<B, Req> Body for Checked<B, Req>
where
    B: Body<Data = Bytes> + Unpin,
    Req: Message + Default,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && !this.check(data)
        {
            // The service sees the request end before the malformed message.
            this.ended = true;
            return Poll::Ready(None);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }
}

/// The answer's body, with the status in its trailers replaced when the request was
/// malformed.
struct Answer<RB> {
    body: RB,
    bad: Bad,
}

impl<RB: Body<Data = Bytes> + Unpin> Body for Answer<RB> {
    type Data = Bytes;
    type Error = RB::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, RB::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        Poll::Ready(match frame {
            Some(Ok(frame)) if frame.is_trailers() => match self.bad.get() {
                Some(status) => {
                    let mut trailers = frame.into_trailers().unwrap_or_default();
                    replace_status(&mut trailers, status);
                    Some(Ok(Frame::trailers(trailers)))
                }
                None => Some(Ok(frame)),
            },
            other => other,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(bytes: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
        m.extend_from_slice(bytes);
        m
    }

    type Req = tonic_health::pb::HealthCheckRequest;

    fn checker() -> (Checked<(), Req>, Bad) {
        let bad = Bad::default();
        (Checked::new((), bad.clone()), bad)
    }

    #[test]
    fn valid_messages_pass_in_any_split() {
        let good = Req { service: "agentreach.v1.Sidecar".into() }.encode_to_vec();
        let mut stream = message(&good);
        stream.extend(message(&[]));
        stream.extend(message(&good));
        for split in 1..stream.len() {
            let (mut c, bad) = checker();
            assert!(stream.chunks(split).all(|part| c.check(part)), "split {split}");
            assert!(bad.get().is_none());
        }
    }

    #[test]
    fn a_malformed_message_is_invalid_argument_naming_the_request() {
        let (mut c, bad) = checker();
        assert!(!c.check(&message(&[0xff, 0xff, 0xff])));
        let status = bad.get().unwrap();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("HealthCheckRequest"), "{}", status.message());
        let info = crate::reason::error_info(status).unwrap();
        assert_eq!(info.reason, "INVALID_ARGUMENT");
        assert_eq!(info.metadata.get("field").map(String::as_str), Some("request"));
    }

    #[test]
    fn compressed_and_huge_messages_are_passed_unchecked() {
        let (mut c, bad) = checker();
        let mut compressed = message(&[0xff, 0xff]);
        compressed[0] = 1;
        assert!(c.check(&compressed));
        let mut huge = vec![0];
        huge.extend_from_slice(&u32::try_from(MAX_CHECKED + 1).unwrap().to_be_bytes());
        assert!(c.check(&huge));
        let body = vec![0xffu8; MAX_CHECKED + 1];
        assert!(c.check(&body));
        assert!(c.check(&message(&[])), "the next message is checked again");
        assert!(bad.get().is_none());
    }
}
