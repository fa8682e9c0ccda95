//! gRPC messages as bytes: building one message with a fresh length prefix ([`Frames`]),
//! reading the single message of a unary request without copying, splitting a collected
//! answer, and keeping a whole unary answer in memory ([`StoredResponse`]).

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::Status;

use super::{Body, COALESCE_LIMIT, PREFIX_LEN};

/// A protobuf field the mesh appends to a message it forwards ([`Frames::message_fields`]),
/// borrowed from where its value lives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Field<'a> {
    /// A string field, as its bytes (text the caller vouches for, e.g. [`Field::text`]).
    Str(&'a [u8]),
    U32(u32),
}

impl<'a> Field<'a> {
    /// A string field from text.
    pub(crate) const fn text(s: &'a str) -> Field<'a> {
        Field::Str(s.as_bytes())
    }

    /// Its length on the wire under `tag`: 0 for an empty string or zero, which prost
    /// leaves out too.
    fn encoded_len(self, tag: u32) -> usize {
        use prost::encoding::{encoded_len_varint, key_len};
        match self {
            Field::Str([]) | Field::U32(0) => 0,
            Field::Str(s) => key_len(tag) + encoded_len_varint(s.len() as u64) + s.len(),
            Field::U32(v) => key_len(tag) + encoded_len_varint(u64::from(v)),
        }
    }

    fn encode(self, tag: u32, buf: &mut BytesMut) {
        // The key and the length (or value) as varints, gathered on the stack and put in
        // one go (prost's encoders put them byte by byte).
        let mut head = [0u8; 15];
        let (wire, value, bytes) = match self {
            Field::Str([]) | Field::U32(0) => return,
            Field::Str(s) => (2, s.len() as u64, s),
            Field::U32(v) => (0, u64::from(v), &[][..]),
        };
        let at = put_varint(&mut head, 0, (u64::from(tag) << 3) | wire);
        let at = put_varint(&mut head, at, value);
        buf.put_slice(&head[..at]);
        buf.put_slice(bytes);
    }
}

/// Writes `v` as a varint into `out` from `at` (room for a key of five bytes and a value
/// of ten); returns where it ends.
fn put_varint(out: &mut [u8; 15], mut at: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[at] = (v as u8) | 0x80;
        v >>= 7;
        at += 1;
    }
    out[at] = v as u8;
    at + 1
}

/// Writes `fields` in the order given (prost writes them by tag; callers list them so).
fn encode_fields(fields: &[(u32, Field<'_>)], buf: &mut BytesMut) {
    for &(tag, field) in fields {
        field.encode(tag, buf);
    }
}

/// A short sequence of data buffers followed by optional trailers.
///
/// Boxed: a [`Body`] (and every request and answer holding one) is moved several times
/// per call on its way through the stacks, and the buffers and trailers inline made it
/// 240 bytes to copy at each move.
pub(crate) struct Frames(Box<Parts>);

struct Parts {
    parts: [Option<Bytes>; 3],
    next: usize,
    trailers: Option<HeaderMap>,
    /// Its size is not given as exact though no trailers follow (see
    /// [`Frames::with_open_length`]).
    open_length: bool,
}

impl Frames {
    fn new(parts: [Option<Bytes>; 3]) -> Frames {
        Frames(Box::new(Parts { parts, next: 0, trailers: None, open_length: false }))
    }

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
        Frames::new(parts)
    }

    /// [`Frames::message`] with `fields` appended, encoded straight into the message's
    /// buffer (for the mesh's own fields: no message struct of copied strings, no buffer
    /// of their own).
    pub(crate) fn message_fields(message: Bytes, fields: &[(u32, Field<'_>)]) -> Frames {
        let extra: usize = fields.iter().map(|&(tag, f)| f.encoded_len(tag)).sum();
        let len = message.len() + extra;
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[1..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        let mut buf =
            BytesMut::with_capacity(if len <= COALESCE_LIMIT { PREFIX_LEN + len } else { PREFIX_LEN + extra });
        buf.put_slice(&prefix);
        let parts = if len <= COALESCE_LIMIT {
            buf.put_slice(&message);
            encode_fields(fields, &mut buf);
            [Some(buf.freeze()), None, None]
        } else {
            let prefix = buf.split();
            encode_fields(fields, &mut buf);
            [Some(prefix.freeze()), Some(message), Some(buf.freeze())]
        };
        Frames::new(parts)
    }

    /// Bytes passed on as they are.
    pub(crate) fn raw(data: Bytes) -> Frames {
        Frames::new([Some(data), None, None])
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
        Frames::new(parts)
    }

    pub(crate) fn with_trailers(mut self, trailers: Option<HeaderMap>) -> Frames {
        self.0.trailers = trailers;
        self
    }

    /// The next data frame, then the trailers; `None` when all were taken.
    pub(crate) fn take_frame(&mut self) -> Option<Frame<Bytes>> {
        self.next_frame()
    }

    pub(super) fn next_frame(&mut self) -> Option<Frame<Bytes>> {
        let f = &mut *self.0;
        while f.next < f.parts.len() {
            let i = f.next;
            f.next += 1;
            if let Some(b) = f.parts[i].take().filter(|b| !b.is_empty()) {
                return Some(Frame::data(b));
            }
        }
        f.trailers.take().map(Frame::trailers)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.parts.iter().all(|p| p.as_ref().is_none_or(Bytes::is_empty)) && self.0.trailers.is_none()
    }

    pub(super) fn len(&self) -> usize {
        self.0.parts.iter().flatten().map(Bytes::len).sum()
    }

    /// A body whose size hint has only a lower bound: an answer whose status is in its
    /// headers (a whole answer, see [`crate::hop`]) goes without `content-length`, which
    /// hyper writes from an exact hint and each hop would encode, parse and drop.
    pub(crate) fn with_open_length(mut self) -> Frames {
        self.0.open_length = true;
        self
    }

    /// Whether the size hint is a lower bound only: trailers follow the data, or
    /// [`Frames::with_open_length`].
    pub(super) fn open_length(&self) -> bool {
        self.0.trailers.is_some() || self.0.open_length
    }
}

/// A unary answer's body read whole, at most `limit` bytes: its data (joined only when it
/// came in more than one frame) and its trailers, taken, not copied.
pub(crate) async fn read_whole(body: Body, limit: usize) -> Result<(Bytes, Option<HeaderMap>), super::BoxError> {
    enum Data {
        None,
        One(Bytes),
        Joined(BytesMut),
    }
    let mut body = http_body_util::Limited::new(body, limit);
    let mut data = Data::None;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(chunk) => match &mut data {
                Data::None => data = Data::One(chunk),
                Data::One(first) => {
                    let mut all = BytesMut::with_capacity(first.len() + chunk.len());
                    all.extend_from_slice(first);
                    all.extend_from_slice(&chunk);
                    data = Data::Joined(all);
                }
                Data::Joined(all) => all.extend_from_slice(&chunk),
            },
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(more),
                        None => trailers = Some(more),
                    }
                }
            }
        }
    }
    let data = match data {
        Data::None => Bytes::new(),
        Data::One(only) => only,
        Data::Joined(all) => all.freeze(),
    };
    Ok((data, trailers))
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
