//! gRPC over raw HTTP/2 for the forwarding path: length-prefixed message frames, the one
//! body type every request and response of the sidecar uses, and status-only responses.
//!
//! The forwarding path never decodes payloads: it reads a unary message as `Bytes`, slices
//! it, and forwards it with a few appended protobuf fields (protobuf merges concatenated
//! messages). Streams pass through frame by frame. This module does no routing and knows
//! nothing of the layers above it: what taps an answer's trailers is handed in as a
//! [`TrailersHook`].
//!
//! Files: this one (headers, [`Body`], status responses, which headers travel on),
//! `frames.rs` (messages as bytes, unary reads, stored answers), `bodies.rs` (the bodies
//! passed through: channel, `h2`, tapped), `messages.rs` (a streamed body read message by
//! message).

mod bodies;
mod frames;
mod messages;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use tonic::Status;

use bodies::Source;
pub(crate) use bodies::{ChannelBody, H2Body, Parked, Tapped};
pub(crate) use frames::{
    Field, Frames, ReadError, StoredResponse, frames_data, read_message, read_whole, single_message,
};
pub(crate) use messages::{MessageReader, Read};

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

/// The methods the sidecar calls on every call, each parsed once: building an `http`
/// `PathAndQuery` checks every byte (about 250 instructions for these), its clones share
/// the text.
pub(crate) static DELIVER: MethodPath = MethodPath::new(PATH_DELIVER);
pub(crate) static DELIVER_STREAM: MethodPath = MethodPath::new(PATH_DELIVER_STREAM);
pub(crate) static HANDLE: MethodPath = MethodPath::new(PATH_HANDLE);
pub(crate) static HANDLE_STREAM: MethodPath = MethodPath::new(PATH_HANDLE_STREAM);

/// A method's path, parsed the first time it is used.
pub(crate) struct MethodPath {
    text: &'static str,
    parsed: std::sync::OnceLock<http::uri::PathAndQuery>,
}

impl MethodPath {
    pub(crate) const fn new(text: &'static str) -> MethodPath {
        MethodPath { text, parsed: std::sync::OnceLock::new() }
    }

    /// The path as a request's URI takes it.
    pub(crate) fn get(&self) -> http::uri::PathAndQuery {
        self.parsed.get_or_init(|| http::uri::PathAndQuery::from_static(self.text)).clone()
    }
}

/// The mesh's headers ([`agent_reach::headers`]) as header names: a map looks a
/// `HeaderName` up by its hash, but parses a `&str` name again on every lookup.
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
    pub(crate) const IDEMPOTENCY_DIGEST: HeaderName = HeaderName::from_static(h::IDEMPOTENCY_DIGEST);
    pub(crate) const IDEMPOTENCY_OWNER: HeaderName = HeaderName::from_static(h::IDEMPOTENCY_OWNER);
    pub(crate) const LOAD: HeaderName = HeaderName::from_static(h::LOAD);
    pub(crate) const SESSION: HeaderName = HeaderName::from_static(h::SESSION);
    pub(crate) const SESSION_PREWARMED: HeaderName = HeaderName::from_static(h::SESSION_PREWARMED);
    pub(crate) const SESSION_NEW: HeaderName = HeaderName::from_static(h::SESSION_NEW);
    pub(crate) const AGENT_CREDENTIAL: HeaderName = HeaderName::from_static(h::AGENT_CREDENTIAL);
    pub(crate) const CALLER_AGENT: HeaderName = HeaderName::from_static(h::CALLER_AGENT);
    pub(crate) const CALLER_TENANT: HeaderName = HeaderName::from_static(h::CALLER_TENANT);
    pub(crate) const CALLER_INSTANCE: HeaderName = HeaderName::from_static(h::CALLER_INSTANCE);
    pub(crate) const CAPABILITY: HeaderName = HeaderName::from_static(h::CAPABILITY);
    pub(crate) const HOP: HeaderName = HeaderName::from_static(h::HOP);
    pub(crate) const HOP_ASK: HeaderName = HeaderName::from_static(h::HOP_ASK);
    pub(crate) const HOP_OK: HeaderName = HeaderName::from_static(h::HOP_OK);
    pub(crate) const HTTP_AGENT_DEADLINE_MS: HeaderName = HeaderName::from_static(h::HTTP_AGENT_DEADLINE_MS);
    pub(crate) const HTTP_AGENT_CALLER_AGENT: HeaderName = HeaderName::from_static(h::HTTP_AGENT_CALLER_AGENT);
    pub(crate) const HTTP_AGENT_CALLER_INSTANCE: HeaderName = HeaderName::from_static(h::HTTP_AGENT_CALLER_INSTANCE);
    pub(crate) const HTTP_AGENT_CALLER_TENANT: HeaderName = HeaderName::from_static(h::HTTP_AGENT_CALLER_TENANT);
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
            // Exact only without trailers: from an exact hint hyper writes `content-length`
            // into the answer's headers, which a gRPC answer (its status in the trailers)
            // does not use and each hop would encode, parse and drop on every call.
            Body::Frames(f) if f.open_length() => {
                let mut hint = SizeHint::new();
                hint.set_lower(f.len() as u64);
                hint
            }
            Body::Frames(f) => SizeHint::with_exact(f.len() as u64),
            Body::Incoming(b) => b.size_hint(),
            Body::H2(_) => SizeHint::default(),
            Body::Channel(_) => SizeHint::default(),
            Body::Tapped(t) => t.inner.size_hint(),
            Body::Tonic(b) => b.size_hint(),
        }
    }
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

/// Whether a request header should travel on to the next hop: custom metadata does;
/// HTTP/2 and gRPC framing headers and the mesh's own `ar-*` headers do not, and neither
/// does the trace context, which each hop writes for its own span
/// (`agent_reach_telemetry::trace::inject`, right after the copy) instead of copying the
/// caller's and overwriting it.
pub(crate) fn forwardable_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    !(n.starts_with("grpc-")
        || n.starts_with(agent_reach::headers::PREFIX)
        || matches!(
            n,
            "content-type"
                | "te"
                | "user-agent"
                | "content-length"
                | "host"
                | "connection"
                | "traceparent"
                | "tracestate"
        ))
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
    // At most 8 digits (the limit of `grpc-timeout`) and the unit, written by hand: once
    // per call and hop, where `format!` cost about a thousand instructions.
    let mut ms = remaining.as_millis().clamp(1, 99_999_999) as u32;
    let mut buf = [b'm'; 9];
    let mut start = 8;
    while ms > 0 {
        start -= 1;
        buf[start] = b'0' + (ms % 10) as u8;
        ms /= 10;
    }
    if let Ok(mut v) = HeaderValue::from_bytes(&buf[start..]) {
        v.set_sensitive(true);
        headers.insert(HEADER_GRPC_TIMEOUT, v);
    }
}

/// `n` in decimal, written into `buf`.
pub(crate) fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &str {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[start..]).unwrap_or("0")
}

/// The `grpc-status` code `headers` carry, if any, without building a [`Status`]
/// (`Status::from_header_map` copies the whole map even for an OK status): callers build
/// one only for a code that is not OK.
pub(crate) fn status_code(headers: &HeaderMap) -> Option<tonic::Code> {
    headers.get(HEADER_GRPC_STATUS).map(|v| tonic::Code::from_bytes(v.as_bytes()))
}

/// The status `headers` carry when it is not OK (`None`: no status, or OK).
pub(crate) fn failed_status(headers: &HeaderMap) -> Option<Status> {
    match status_code(headers) {
        Some(code) if code != tonic::Code::Ok => Status::from_header_map(headers),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_unary_answer_is_read_whole_with_its_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = |chunks: &[&'static [u8]]| {
            let chunks = chunks.iter().map(|c| Bytes::from_static(c)).collect();
            Body::Frames(Frames::chunks(chunks).with_trailers(Some(trailers.clone())))
        };
        let (data, read) = read_whole(body(&[b"abc"]), 10).await.unwrap();
        assert_eq!((&data[..], read.as_ref()), (&b"abc"[..], Some(&trailers)));
        let (data, _) = read_whole(body(&[b"ab", b"cd", b"e"]), 10).await.unwrap();
        assert_eq!(&data[..], b"abcde");
        assert!(read_whole(body(&[b"abcdef", b"ghijk"]), 10).await.is_err(), "over the limit");
        let (data, read) = read_whole(Body::Empty, 10).await.unwrap();
        assert_eq!((data.len(), read), (0, None));
    }

    #[test]
    fn a_method_path_is_parsed_once_and_shared() {
        for (path, text) in [(&DELIVER, PATH_DELIVER), (&DELIVER_STREAM, PATH_DELIVER_STREAM), (&HANDLE, PATH_HANDLE)] {
            let (first, again) = (path.get(), path.get());
            assert_eq!((first.as_str(), first.path(), first.query()), (text, text, None));
            // Both share the static text (no copy).
            assert_eq!(first.as_str().as_ptr(), again.as_str().as_ptr());
        }
        assert_eq!(HANDLE_STREAM.get().as_str(), PATH_HANDLE_STREAM);
        // Parsed at the first use, kept for every later one.
        let path = MethodPath::new("/a.B/C");
        assert!(path.parsed.get().is_none());
        assert_eq!(path.get().as_str(), "/a.B/C");
        assert_eq!(path.parsed.get().map(http::uri::PathAndQuery::as_str), Some("/a.B/C"));
    }

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
    fn a_body_ending_in_trailers_announces_no_exact_length() {
        use http_body::Body as _;
        let data = Bytes::from(frame(b"hello"));
        let plain = Body::Frames(Frames::raw(data.clone()));
        assert_eq!(plain.size_hint().exact(), Some(10));
        let mut trailers = HeaderMap::new();
        trailers.insert(HEADER_GRPC_STATUS, HeaderValue::from_static("0"));
        let grpc = Body::Frames(Frames::raw(data).with_trailers(Some(trailers)));
        let hint = grpc.size_hint();
        assert_eq!((hint.exact(), hint.lower(), hint.upper()), (None, 10, None));
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
    fn the_timeout_is_whole_milliseconds_rounded_down_and_capped() {
        for (remaining, expected) in [
            (std::time::Duration::ZERO, "1m"),
            (std::time::Duration::from_micros(1_999), "1m"),
            (std::time::Duration::from_millis(10), "10m"),
            (std::time::Duration::from_millis(1_234_567), "1234567m"),
            (std::time::Duration::from_secs(1 << 40), "99999999m"),
        ] {
            let mut headers = HeaderMap::new();
            set_timeout(&mut headers, remaining);
            let v = &headers[HEADER_GRPC_TIMEOUT];
            assert_eq!((v.to_str().unwrap(), v.is_sensitive()), (expected, true), "{remaining:?}");
        }
    }

    #[test]
    fn a_status_is_built_only_when_it_is_not_ok() {
        let mut headers = HeaderMap::new();
        assert_eq!((status_code(&headers), failed_status(&headers).is_none()), (None, true));
        headers.insert(HEADER_GRPC_STATUS, HeaderValue::from_static("0"));
        assert_eq!((status_code(&headers), failed_status(&headers).is_none()), (Some(tonic::Code::Ok), true));
        headers.insert(HEADER_GRPC_STATUS, HeaderValue::from_static("14"));
        headers.insert("grpc-message", HeaderValue::from_static("gone"));
        let failed = failed_status(&headers).unwrap();
        assert_eq!((failed.code(), failed.message()), (tonic::Code::Unavailable, "gone"));
    }

    #[test]
    fn internal_headers_are_not_forwarded() {
        for (name, fwd) in [
            ("x-tenant-hint", true),
            ("traceparent", false),
            ("tracestate", false),
            ("grpc-timeout", false),
            ("ar-instance", false),
            ("ar-hop", false),
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
            fn appended_fields_are_encoded_as_prost_encodes_them(
                message in proptest::collection::vec(any::<u8>(), 0..(COALESCE_LIMIT + 64)),
                id in "[a-z0-9-]{0,200}",
                name in "[a-z.]{0,20}",
                attempt in 0u32..400,
            ) {
                use agent_reach::proto;
                use prost::Message;
                let message = Bytes::from(message);
                let handle = proto::HandleRequest {
                    message_id: id.clone(),
                    instance_id: name.clone(),
                    attempt,
                    capability: id.clone(),
                    tenant: name.clone(),
                    ..Default::default()
                };
                let fields = [
                    (8, Field::text(&id)),
                    (16, Field::text(&name)),
                    (17, Field::U32(attempt)),
                    (18, Field::text(&id)),
                    (19, Field::text(&name)),
                ];
                prop_assert_eq!(
                    joined(Frames::message_fields(message.clone(), &fields)),
                    joined(Frames::message(message.clone(), &handle.encode_to_vec()))
                );
                let reply = proto::InvokeReply {
                    instance_id: name.clone(),
                    agent: id.clone(),
                    attempts: attempt,
                    fallback_from: name.clone(),
                    ..Default::default()
                };
                let fields = [
                    (16, Field::text(&name)),
                    (17, Field::text(&id)),
                    (18, Field::text("")),
                    (19, Field::U32(attempt)),
                    (20, Field::text(&name)),
                ];
                prop_assert_eq!(
                    joined(Frames::message_fields(message.clone(), &fields)),
                    joined(Frames::message(message, &reply.encode_to_vec()))
                );
            }

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
