//! gRPC over raw HTTP/2 for the forwarding path: length-prefixed message frames, the one
//! body type every request and response of the sidecar uses, and status-only responses.
//!
//! The forwarding path never decodes payloads: it reads a unary message as `Bytes`, slices
//! it, and forwards it with a few appended protobuf fields (protobuf merges concatenated
//! messages). Streams pass through frame by frame. This module does no routing and knows
//! nothing of the layers above it: what taps an answer's trailers is handed in as a
//! [`TrailersHook`].

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::Status;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Length of the prefix of a gRPC message: compressed flag + u32 big-endian length.
pub(crate) const PREFIX_LEN: usize = 5;
/// Messages up to this size are forwarded as one contiguous buffer; larger ones as slices.
const COALESCE_LIMIT: usize = 16 * 1024;

pub(crate) const CONTENT_TYPE_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
pub(crate) const HEADER_GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(crate) const HEADER_GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
pub(crate) const HEADER_TE: HeaderName = HeaderName::from_static("te");
pub(crate) const TRAILERS: HeaderValue = HeaderValue::from_static("trailers");

/// Room for the envelope fields around a payload of the maximum size.
pub(crate) const ENVELOPE_ALLOWANCE: usize = 64 * 1024;

/// The methods the sidecar serves and calls.
pub(crate) const PATH_INVOKE: &str = "/agentreach.v1.Sidecar/Invoke";
pub(crate) const PATH_INVOKE_STREAM: &str = "/agentreach.v1.Sidecar/InvokeStream";
pub(crate) const PATH_DELIVER: &str = "/agentreach.v1.Mesh/Deliver";
pub(crate) const PATH_DELIVER_STREAM: &str = "/agentreach.v1.Mesh/DeliverStream";
pub(crate) const PATH_HANDLE: &str = "/agentreach.v1.Agent/Handle";
pub(crate) const PATH_HANDLE_STREAM: &str = "/agentreach.v1.Agent/HandleStream";

/// The mesh's headers ([`agent_reach::headers`]) as header names.
pub(crate) mod header {
    use agent_reach::headers as h;
    use http::HeaderName;

    pub(crate) const INSTANCE: HeaderName = HeaderName::from_static(h::INSTANCE);
    pub(crate) const NOT_DELIVERED: HeaderName = HeaderName::from_static(h::NOT_DELIVERED);
    pub(crate) const ATTEMPTS: HeaderName = HeaderName::from_static(h::ATTEMPTS);
    pub(crate) const INSTANCES_TRIED: HeaderName = HeaderName::from_static(h::INSTANCES_TRIED);
    pub(crate) const FALLBACK_FROM: HeaderName = HeaderName::from_static(h::FALLBACK_FROM);
    pub(crate) const AGENT_VERSION: HeaderName = HeaderName::from_static(h::AGENT_VERSION);
    pub(crate) const ROUTE: HeaderName = HeaderName::from_static(h::ROUTE);
    pub(crate) const CACHE: HeaderName = HeaderName::from_static(h::CACHE);
    pub(crate) const TRACE_ID: HeaderName = HeaderName::from_static(h::TRACE_ID);
    pub(crate) const TRACE: HeaderName = HeaderName::from_static(h::TRACE);
    pub(crate) const TENANT: HeaderName = HeaderName::from_static(h::TENANT);
    pub(crate) const PRIORITY: HeaderName = HeaderName::from_static(h::PRIORITY);
    pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(h::IDEMPOTENCY_KEY);
    pub(crate) const LOAD: HeaderName = HeaderName::from_static(h::LOAD);
    pub(crate) const SESSION: HeaderName = HeaderName::from_static(h::SESSION);
    pub(crate) const SESSION_PREWARMED: HeaderName = HeaderName::from_static(h::SESSION_PREWARMED);
    pub(crate) const AGENT_CREDENTIAL: HeaderName = HeaderName::from_static(h::AGENT_CREDENTIAL);
    pub(crate) const CALLER_AGENT: HeaderName = HeaderName::from_static(h::CALLER_AGENT);
    pub(crate) const CALLER_INSTANCE: HeaderName = HeaderName::from_static(h::CALLER_INSTANCE);
    pub(crate) const CAPABILITY: HeaderName = HeaderName::from_static(h::CAPABILITY);
}

/// A hook on an answer's trailers, held until the answer ends: the target's sidecar writes
/// its instance's load into them, the caller's sidecar reads it. Dropping the hook ends
/// what it holds (an admission slot, a call counted in flight).
pub(crate) trait TrailersHook: Send + Sync + 'static {
    fn on_trailers(&self, trailers: &mut HeaderMap);
}

/// A boxed [`TrailersHook`].
pub(crate) type Hook = Box<dyn TrailersHook>;

/// The body of every request and response the sidecar sends.
#[derive(Default)]
pub(crate) enum Body {
    /// No data (status-only responses).
    #[default]
    Empty,
    /// Up to three buffers, then optional trailers (a built or rebuilt message).
    Frames(Frames),
    /// A body passed through unchanged from another connection.
    Incoming(Incoming),
    /// An answer received on one of the pool's `h2` connections, passed through.
    H2(H2Body),
    /// Frames produced by a task (e.g. a streamed answer converted from JSON lines).
    Channel(ChannelBody),
    /// A body whose trailers are read or annotated on the way, and whose call stays counted
    /// in flight until it ends.
    Tapped(Tapped),
    /// A body produced by tonic (the non-forwarding RPCs).
    Tonic(tonic::body::Body),
}

impl Body {
    /// Taps this body: `annotate` sees the trailers first (target side), then `observe`
    /// (caller side); both are held until the body ends.
    pub(crate) fn tap(self, annotate: Option<Hook>, observe: Option<Hook>) -> Body {
        let inner = match self {
            Body::Incoming(b) => Source::Incoming(b),
            Body::H2(b) => Source::H2(b),
            Body::Frames(f) => Source::Frames(f),
            Body::Channel(c) => Source::Channel(c),
            Body::Tapped(mut t) => {
                t.annotate = t.annotate.or(annotate);
                if observe.is_some() {
                    t.observe = observe;
                }
                return Body::Tapped(t);
            }
            other => return other,
        };
        Body::Tapped(Tapped { inner, annotate, observe })
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Frames(f) => Poll::Ready(f.next_frame().map(Ok)),
            Body::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Body::H2(b) => b.poll_frame(cx),
            Body::Channel(c) => c.poll_frame(cx),
            Body::Tapped(t) => t.poll_frame(cx),
            Body::Tonic(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Frames(f) => f.is_empty(),
            Body::Incoming(b) => b.is_end_stream(),
            Body::H2(b) => b.is_end_stream(),
            Body::Channel(_) => false,
            Body::Tapped(t) => t.inner.is_end_stream(),
            Body::Tonic(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Frames(f) => SizeHint::with_exact(f.len() as u64),
            Body::Incoming(b) => b.size_hint(),
            Body::H2(_) => SizeHint::default(),
            Body::Channel(_) => SizeHint::default(),
            Body::Tapped(t) => t.inner.size_hint(),
            Body::Tonic(b) => b.size_hint(),
        }
    }
}

/// Frames sent by a task through a bounded channel (the bound is the back-pressure).
pub(crate) struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
}

impl ChannelBody {
    /// A body and the sender that feeds it, holding at most `capacity` frames.
    pub(crate) fn new(capacity: usize) -> (tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>, ChannelBody) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity);
        (tx, ChannelBody { rx })
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx)
    }
}

/// The body of an answer received with `h2`: data (returning flow-control capacity as it
/// is read, so the peer keeps sending only as fast as we pass it on), then trailers.
pub(crate) struct H2Body {
    recv: h2::RecvStream,
    data_done: bool,
    done: bool,
}

impl H2Body {
    pub(crate) fn new(recv: h2::RecvStream) -> H2Body {
        let done = recv.is_end_stream();
        H2Body { recv, data_done: done, done }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.data_done {
            match self.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => self.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(Ok(None)) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.done = true;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What a [`Tapped`] body passes through.
enum Source {
    Incoming(Incoming),
    H2(H2Body),
    Frames(Frames),
    Channel(ChannelBody),
}

impl Source {
    fn is_end_stream(&self) -> bool {
        match self {
            Source::Incoming(b) => b.is_end_stream(),
            Source::H2(b) => b.is_end_stream(),
            Source::Frames(f) => f.is_empty(),
            Source::Channel(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Incoming(b) => b.size_hint(),
            Source::H2(_) => SizeHint::default(),
            Source::Frames(f) => SizeHint::with_exact(f.len() as u64),
            Source::Channel(_) => SizeHint::default(),
        }
    }
}

/// See [`Body::tap`].
pub(crate) struct Tapped {
    inner: Source,
    annotate: Option<Hook>,
    observe: Option<Hook>,
}

impl Tapped {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = match &mut self.inner {
            Source::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Source::H2(b) => b.poll_frame(cx),
            Source::Frames(f) => Poll::Ready(f.next_frame().map(Ok)),
            Source::Channel(c) => c.poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                let mut trailers = frame.into_trailers().unwrap_or_default();
                for hook in [&self.annotate, &self.observe].into_iter().flatten() {
                    hook.on_trailers(&mut trailers);
                }
                // The call is over once its trailers pass.
                self.annotate = None;
                self.observe = None;
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(None) => {
                self.annotate = None;
                self.observe = None;
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

/// A short sequence of data buffers followed by optional trailers.
#[derive(Default)]
pub(crate) struct Frames {
    parts: [Option<Bytes>; 3],
    next: usize,
    trailers: Option<HeaderMap>,
}

impl Frames {
    /// One gRPC message: `message` followed by the encoded fields `extra`, with a fresh
    /// length prefix. Small messages are copied into one buffer (one DATA frame); large ones
    /// are sent as slices without copying the payload.
    pub(crate) fn message(message: Bytes, extra: &[u8]) -> Frames {
        let len = message.len() + extra.len();
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[1..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        let parts = if len <= COALESCE_LIMIT {
            let mut buf = BytesMut::with_capacity(PREFIX_LEN + len);
            buf.put_slice(&prefix);
            buf.put_slice(&message);
            buf.put_slice(extra);
            [Some(buf.freeze()), None, None]
        } else {
            [Some(Bytes::copy_from_slice(&prefix)), Some(message), Some(Bytes::copy_from_slice(extra))]
        };
        Frames { parts, next: 0, trailers: None }
    }

    /// Bytes passed on as they are.
    pub(crate) fn raw(data: Bytes) -> Frames {
        Frames { parts: [Some(data), None, None], next: 0, trailers: None }
    }

    /// A request body read whole, passed on as it came: up to three chunks as they are,
    /// more joined into one buffer.
    pub(crate) fn chunks(chunks: Vec<Bytes>) -> Frames {
        let mut parts = [None, None, None];
        if chunks.len() > parts.len() {
            let mut joined = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
            for c in &chunks {
                joined.extend_from_slice(c);
            }
            parts[0] = Some(joined.freeze());
        } else {
            for (part, chunk) in parts.iter_mut().zip(chunks) {
                *part = Some(chunk);
            }
        }
        Frames { parts, next: 0, trailers: None }
    }

    pub(crate) fn with_trailers(mut self, trailers: Option<HeaderMap>) -> Frames {
        self.trailers = trailers;
        self
    }

    /// The next data frame, then the trailers; `None` when all were taken.
    pub(crate) fn take_frame(&mut self) -> Option<Frame<Bytes>> {
        self.next_frame()
    }

    fn next_frame(&mut self) -> Option<Frame<Bytes>> {
        while self.next < self.parts.len() {
            let i = self.next;
            self.next += 1;
            if let Some(b) = self.parts[i].take().filter(|b| !b.is_empty()) {
                return Some(Frame::data(b));
            }
        }
        self.trailers.take().map(Frame::trailers)
    }

    fn is_empty(&self) -> bool {
        self.parts.iter().all(|p| p.as_ref().is_none_or(Bytes::is_empty)) && self.trailers.is_none()
    }

    fn len(&self) -> usize {
        self.parts.iter().flatten().map(Bytes::len).sum()
    }
}

/// A complete unary answer kept in memory (idempotency replays, the result cache).
#[derive(Debug, Clone)]
pub(crate) struct StoredResponse {
    pub headers: HeaderMap,
    pub data: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl StoredResponse {
    /// Collects a unary answer (at most `limit` bytes of body).
    pub(crate) async fn collect(resp: http::Response<Body>, limit: usize) -> Result<StoredResponse, String> {
        let (parts, body) = resp.into_parts();
        let collected = http_body_util::Limited::new(body, limit).collect().await.map_err(|e| e.to_string())?;
        let trailers = collected.trailers().cloned();
        Ok(StoredResponse { headers: parts.headers, data: collected.to_bytes(), trailers })
    }

    /// The gRPC status of the answer (trailers, or headers for trailers-only answers).
    pub(crate) fn status_code(&self) -> Option<tonic::Code> {
        self.trailers
            .as_ref()
            .and_then(Status::from_header_map)
            .or_else(|| Status::from_header_map(&self.headers))
            .map(|s| s.code())
    }

    /// Bytes kept.
    pub(crate) fn size(&self) -> usize {
        self.data.len()
    }

    /// A fresh response with the same headers, body and trailers.
    pub(crate) fn to_response(&self) -> http::Response<Body> {
        let mut resp =
            http::Response::new(Body::Frames(Frames::raw(self.data.clone()).with_trailers(self.trailers.clone())));
        *resp.headers_mut() = self.headers.clone();
        resp.headers_mut().remove(http::header::CONTENT_LENGTH);
        resp
    }
}

/// Why a unary message could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The declared message length is over the limit.
    TooLarge(usize),
    /// The message is compressed; the sidecar forwards only uncompressed messages.
    Compressed,
    /// Not exactly one well-formed message.
    Malformed(&'static str),
    /// The stream failed while reading.
    Body(String),
}

/// Reads the single message of a unary request body, without copying when it arrives in
/// one DATA frame. Fails as soon as the length prefix announces more than `limit` bytes.
pub(crate) async fn read_message(body: &mut Incoming, limit: usize) -> Result<Bytes, ReadError> {
    let mut buf = BytesMut::new();
    let mut first: Option<Bytes> = None;
    let mut expected: Option<usize> = None;
    loop {
        let have = first.as_ref().map_or(0, Bytes::len) + buf.len();
        if let Some(total) = expected
            && have >= total
        {
            break;
        }
        let Some(frame) = body.frame().await else { break };
        let frame = frame.map_err(|e| ReadError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        if first.is_none() && buf.is_empty() {
            first = Some(data);
        } else {
            if let Some(f) = first.take() {
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&data);
        }
        if expected.is_none() {
            let head: &[u8] = first.as_deref().unwrap_or(&buf);
            if head.len() >= PREFIX_LEN {
                if head[0] != 0 {
                    return Err(ReadError::Compressed);
                }
                let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
                if len > limit {
                    return Err(ReadError::TooLarge(len));
                }
                expected = Some(PREFIX_LEN + len);
            }
        }
    }
    let data = match first {
        Some(f) => f,
        None => buf.freeze(),
    };
    let Some(total) = expected else {
        return Err(ReadError::Malformed("request ended before a complete gRPC message"));
    };
    if data.len() < total {
        return Err(ReadError::Malformed("request ended before a complete gRPC message"));
    }
    if data.len() > total || !body.is_end_stream() && more_data(body).await {
        return Err(ReadError::Malformed("a unary request must carry exactly one message"));
    }
    Ok(data.slice(PREFIX_LEN..total))
}

/// Whether the rest of the body holds more data (an empty final DATA frame does not count).
async fn more_data(body: &mut Incoming) -> bool {
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) if f.data_ref().is_some_and(|d| !d.is_empty()) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Takes the data buffers of `frames` (for sending them on an `h2` stream).
pub(crate) fn frames_data(mut frames: Frames) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(3);
    while let Some(f) = frames.next_frame() {
        if let Ok(d) = f.into_data() {
            out.push(d);
        }
    }
    out
}

/// Splits one collected response body into its message (without prefix). `None` when the
/// body is not exactly one uncompressed message.
pub(crate) fn single_message(data: &Bytes) -> Option<Bytes> {
    if data.len() < PREFIX_LEN || data[0] != 0 {
        return None;
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    (data.len() == PREFIX_LEN + len).then(|| data.slice(PREFIX_LEN..))
}

/// A trailers-only gRPC response carrying `status`.
/// Its message and details are cut to `agent_reach::reason`'s bounds.
pub(crate) fn status_response(status: Status) -> http::Response<Body> {
    agent_reach::reason::bounded(status).into_http()
}

/// A trailers-only response telling the caller's sidecar that the call never reached the
/// agent, so it may retry on another instance.
pub(crate) fn not_delivered_response(status: Status) -> http::Response<Body> {
    let mut resp = agent_reach::reason::bounded(status).into_http::<Body>();
    resp.headers_mut().insert(header::NOT_DELIVERED, HeaderValue::from_static("1"));
    resp
}

/// Whether a request header should travel on to the next hop: custom metadata and trace
/// context do; HTTP/2 and gRPC framing headers and the mesh's own `ar-*` headers do not.
pub(crate) fn forwardable_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    !(n.starts_with("grpc-")
        || n.starts_with(agent_reach::headers::PREFIX)
        || matches!(n, "content-type" | "te" | "user-agent" | "content-length" | "host" | "connection"))
}

/// Copies the headers that travel on to the next hop ([`forwardable_header`]).
pub(crate) fn copy_forwardable(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if forwardable_header(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Writes the remaining deadline as `grpc-timeout`, in whole milliseconds (rounded down, so
/// the next hop never believes it has more time than the caller), as a never-indexed
/// header: a value that changes with every call would only churn the HPACK table.
pub(crate) fn set_timeout(headers: &mut HeaderMap, remaining: std::time::Duration) {
    let ms = remaining.as_millis().max(1);
    if let Ok(mut v) = HeaderValue::from_str(&format!("{}m", ms.min(99_999_999))) {
        v.set_sensitive(true);
        headers.insert(HEADER_GRPC_TIMEOUT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(msg: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    #[test]
    fn message_frames_prefix_the_new_length() {
        let mut f = Frames::message(Bytes::from_static(b"hello"), b"!!");
        let data = f.next_frame().unwrap().into_data().unwrap();
        assert_eq!(&data[..], &frame(b"hello!!")[..]);
        assert!(f.next_frame().is_none());

        let big = Bytes::from(vec![7u8; COALESCE_LIMIT + 1]);
        let mut f = Frames::message(big.clone(), b"x");
        assert_eq!(f.len(), PREFIX_LEN + big.len() + 1);
        let parts: Vec<Bytes> = std::iter::from_fn(|| f.next_frame()).map(|fr| fr.into_data().unwrap()).collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1].as_ptr(), big.as_ptr(), "large payloads are not copied");
        let mut joined = parts.concat();
        assert_eq!(joined.split_off(PREFIX_LEN).len(), big.len() + 1);
        assert_eq!(u32::from_be_bytes(joined[1..5].try_into().unwrap()) as usize, big.len() + 1);
    }

    #[test]
    fn single_message_requires_exact_length() {
        assert_eq!(single_message(&Bytes::from(frame(b"abc"))).as_deref(), Some(&b"abc"[..]));
        let mut two = frame(b"a");
        two.extend(frame(b"b"));
        assert_eq!(single_message(&Bytes::from(two)), None);
        assert_eq!(single_message(&Bytes::from_static(&[0, 0, 0])), None);
        let mut compressed = frame(b"abc");
        compressed[0] = 1;
        assert_eq!(single_message(&Bytes::from(compressed)), None);
    }

    #[test]
    fn internal_headers_are_not_forwarded() {
        for (name, fwd) in [
            ("x-tenant-hint", true),
            ("traceparent", true),
            ("grpc-timeout", false),
            ("ar-instance", false),
            ("te", false),
        ] {
            assert_eq!(forwardable_header(&HeaderName::from_static(name)), fwd, "{name}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn joined(frames: Frames) -> Bytes {
            frames_data(frames).concat().into()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn any_bytes_are_one_message_or_refused_without_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
                let data = Bytes::from(data);
                if let Some(message) = single_message(&data) {
                    prop_assert_eq!(message.len() + PREFIX_LEN, data.len());
                }
            }

            #[test]
            fn a_framed_message_reads_back_whole(
                message in proptest::collection::vec(any::<u8>(), 0..(COALESCE_LIMIT * 2)),
                extra in proptest::collection::vec(any::<u8>(), 0..8),
            ) {
                let framed = joined(Frames::message(Bytes::from(message.clone()), &extra));
                let mut whole = message;
                whole.extend_from_slice(&extra);
                prop_assert_eq!(single_message(&framed), Some(Bytes::from(whole)));
            }

            #[test]
            fn chunks_pass_on_their_bytes_in_order(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..32), 0..8)) {
                let expected: Vec<u8> = chunks.concat();
                let frames = Frames::chunks(chunks.into_iter().map(Bytes::from).collect());
                prop_assert_eq!(joined(frames), Bytes::from(expected));
            }
        }
    }
}
