//! The streaming client (`agent-reach-bench stream`): server-streaming gRPC calls, each
//! asking the echo agent for a fixed number of chunks of [`STREAM_CHUNK`] bytes
//! (`Agent/HandleStream` on the direct, nginx and Envoy paths, `Sidecar/InvokeStream` on
//! the mesh), `concurrency` of them in flight at once over a few HTTP/2 connections (raw
//! `h2`, the windows of [`crate::load`]), one after another on each worker for a fixed
//! duration after a warm-up.
//!
//! Every stream is checked whole: HTTP 200, every gRPC message a `Chunk` whose payload is
//! [`STREAM_CHUNK`] bytes, exactly the chunk count asked for, trailers with
//! `grpc-status` 0. Anything else (a reset, a short stream, a timeout) is an error, with a
//! few samples kept. The figure is payload bytes of the streams started in the measured
//! period, divided by the time from its start until the last of them ended (every stream
//! is read to its end, so none is cut off), in MB/s (10^6 bytes). Single-threaded: pin it
//! to one CPU.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use agent_reach::proto;
use bytes::{Buf, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{Request, Uri};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::load::{connect, grpc_ok};
use crate::wire::{self, Kind, STREAM_CHUNK};

/// Errors kept as samples in a result.
const ERROR_SAMPLES: usize = 5;

/// What to run.
#[derive(Clone, Debug)]
pub struct StreamSpec {
    pub addr: SocketAddr,
    pub kind: Kind,
    /// Chunks of [`STREAM_CHUNK`] bytes each stream asks for.
    pub chunks: u32,
    /// Streams in flight at once.
    pub concurrency: usize,
    pub connections: usize,
    /// Measured period: streams start until it ends, and are read to their end.
    pub duration: Duration,
    /// Streams run the same way before measuring (their errors still count).
    pub warmup: Duration,
    /// A stream not finished within this is an error.
    pub timeout: Duration,
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamResult {
    pub chunk_bytes: usize,
    pub chunks_per_stream: u32,
    pub concurrency: usize,
    pub connections: usize,
    /// Streams that ended with every chunk and grpc-status 0, warm-up included.
    pub ok: u64,
    /// Streams that failed in any way, warm-up included.
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Chunk payload bytes of the `ok` streams (warm-up included).
    pub payload_bytes: u64,
    /// Streams and payload bytes of the measured period.
    pub measured_streams: u64,
    pub measured_bytes: u64,
    /// From the measured period's start until its last stream ended.
    pub measured_s: f64,
    /// `measured_bytes` / `measured_s` / 10^6.
    pub mb_per_s: f64,
}

/// Runs `spec` on a single-threaded runtime of its own.
pub fn run(spec: &StreamSpec) -> Result<StreamResult, String> {
    if spec.chunks == 0 || spec.chunks > wire::MAX_STREAM_CHUNKS {
        return Err(format!("chunks must be within 1..={}", wire::MAX_STREAM_CHUNKS));
    }
    if spec.connections == 0 || spec.concurrency == 0 {
        return Err("at least one connection and one stream are needed".into());
    }
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, drive(spec.clone()))
}

/// Counters shared by the workers (all on one thread).
#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    samples: Vec<String>,
    bytes: u64,
}

impl Tally {
    fn record(&mut self, outcome: Result<u64, String>) -> u64 {
        match outcome {
            Ok(bytes) => {
                self.ok += 1;
                self.bytes += bytes;
                bytes
            }
            Err(e) => {
                self.errors += 1;
                if self.samples.len() < ERROR_SAMPLES {
                    self.samples.push(e);
                }
                0
            }
        }
    }
}

async fn drive(spec: StreamSpec) -> Result<StreamResult, String> {
    let mut senders = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        senders.push(connect(spec.addr).await?);
    }
    let uri: Uri =
        format!("http://{}{}", spec.addr, spec.kind.stream_path()).parse().map_err(|e| format!("bad address: {e}"))?;
    let body = wire::stream_request_body(spec.kind, spec.chunks);
    let tally = Rc::new(RefCell::new(Tally::default()));
    if !spec.warmup.is_zero() {
        phase(&spec, &senders, &uri, &body, &tally, spec.warmup).await;
    }
    let started = Instant::now();
    let (streams, bytes) = phase(&spec, &senders, &uri, &body, &tally, spec.duration).await;
    let measured_s = started.elapsed().as_secs_f64();
    let t = tally.borrow();
    Ok(StreamResult {
        chunk_bytes: STREAM_CHUNK,
        chunks_per_stream: spec.chunks,
        concurrency: spec.concurrency,
        connections: spec.connections,
        ok: t.ok,
        errors: t.errors,
        error_samples: t.samples.clone(),
        payload_bytes: t.bytes,
        measured_streams: streams,
        measured_bytes: bytes,
        measured_s,
        mb_per_s: bytes as f64 / measured_s.max(1e-9) / 1e6,
    })
}

/// `concurrency` workers, each starting one stream after another until `length` has
/// passed; returns once all have ended, with the streams and payload bytes they received.
async fn phase(
    spec: &StreamSpec,
    senders: &[SendRequest<Bytes>],
    uri: &Uri,
    body: &Bytes,
    tally: &Rc<RefCell<Tally>>,
    length: Duration,
) -> (u64, u64) {
    let until = Instant::now() + length;
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..spec.concurrency {
        let (sender, uri, body, tally) = (senders[w % senders.len()].clone(), uri.clone(), body.clone(), tally.clone());
        let (chunks, timeout) = (spec.chunks, spec.timeout);
        workers.spawn_local(async move {
            let (mut streams, mut bytes) = (0u64, 0u64);
            while Instant::now() < until {
                let outcome = match tokio::time::timeout(
                    timeout,
                    stream(sender.clone(), uri.clone(), body.clone(), chunks),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(format!("stream not finished within {timeout:?}")),
                };
                let ok = outcome.is_ok();
                bytes += tally.borrow_mut().record(outcome);
                streams += u64::from(ok);
                if !ok {
                    // A failing path fails the run; do not spin on it.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            (streams, bytes)
        });
    }
    let (mut streams, mut bytes) = (0, 0);
    while let Some(r) = workers.join_next().await {
        if let Ok((s, b)) = r {
            streams += s;
            bytes += b;
        }
    }
    (streams, bytes)
}

/// One streamed call; the payload bytes received when it ended with `chunks` chunks of
/// [`STREAM_CHUNK`] bytes and grpc-status 0.
async fn stream(sender: SendRequest<Bytes>, uri: Uri, body: Bytes, chunks: u32) -> Result<u64, String> {
    let mut sender = sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let request = Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut send) = sender.send_request(request, false).map_err(|e| format!("send: {e}"))?;
    send.send_data(body, true).map_err(|e| format!("send: {e}"))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    let (parts, mut reply) = response.into_parts();
    if parts.headers.contains_key("grpc-status") {
        grpc_ok(&parts.headers)?;
        return Err("trailers-only answer without chunks".into());
    }
    let mut frames = Frames::default();
    let mut seen = Seen::default();
    while let Some(data) = reply.data().await {
        let data = data.map_err(|e| format!("reply after {} chunks: {e}", seen.chunks))?;
        let _ = reply.flow_control().release_capacity(data.len());
        frames.push(data, |message| seen.chunk(message))?;
    }
    let trailers = reply.trailers().await.map_err(|e| format!("trailers: {e}"))?.ok_or("no trailers")?;
    grpc_ok(&trailers).map_err(|e| format!("{e} after {} chunks", seen.chunks))?;
    if frames.pending() {
        return Err("the stream ended inside a gRPC message".into());
    }
    seen.check(chunks)
}

/// The chunks of one stream so far.
#[derive(Default)]
struct Seen {
    chunks: u32,
    bytes: u64,
}

impl Seen {
    fn chunk(&mut self, message: Bytes) -> Result<(), String> {
        let chunk = proto::Chunk::decode(message).map_err(|e| format!("chunk {}: {e}", self.chunks + 1))?;
        if chunk.payload.len() != STREAM_CHUNK {
            return Err(format!("chunk {} carries {} bytes, not {STREAM_CHUNK}", self.chunks + 1, chunk.payload.len()));
        }
        self.chunks += 1;
        self.bytes += chunk.payload.len() as u64;
        Ok(())
    }

    fn check(&self, asked: u32) -> Result<u64, String> {
        if self.chunks != asked {
            return Err(format!("{} chunks received of the {asked} asked for", self.chunks));
        }
        Ok(self.bytes)
    }
}

/// Splits a gRPC response body (DATA frames of any size) into messages. A message inside
/// one DATA frame is handed on without a copy; one spanning frames is gathered.
#[derive(Default)]
struct Frames {
    buf: BytesMut,
}

impl Frames {
    fn push(&mut self, mut data: Bytes, mut each: impl FnMut(Bytes) -> Result<(), String>) -> Result<(), String> {
        loop {
            if self.buf.is_empty() {
                // Whole messages straight from the frame.
                while let Some(len) = message_len(&data)? {
                    if data.len() < 5 + len {
                        break;
                    }
                    data.advance(5);
                    each(data.split_to(len))?;
                }
                self.buf.extend_from_slice(&data);
                return Ok(());
            }
            // Complete the message gathered so far.
            let need = match message_len(&self.buf)? {
                Some(len) => 5 + len - self.buf.len(),
                None => 5 - self.buf.len(),
            };
            let take = need.min(data.len());
            self.buf.extend_from_slice(&data.split_to(take));
            if let Some(len) = message_len(&self.buf)?
                && self.buf.len() == 5 + len
            {
                let mut message = std::mem::take(&mut self.buf).freeze();
                message.advance(5);
                each(message)?;
            }
            if data.is_empty() {
                return Ok(());
            }
        }
    }

    /// Whether part of a message is still waiting for its end.
    fn pending(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// The length of the message whose 5-byte prefix starts `b`, once the prefix is there.
fn message_len(b: &[u8]) -> Result<Option<usize>, String> {
    if b.len() < 5 {
        return Ok(None);
    }
    if b[0] != 0 {
        return Err(format!("compressed or unknown gRPC message flag {}", b[0]));
    }
    Ok(Some(u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk_message(len: usize) -> Bytes {
        let chunk = proto::Chunk { payload: wire::payload(len), ..Default::default() };
        wire::grpc_frame(&chunk.encode_to_vec())
    }

    /// The same body split into DATA frames of every size from 1 byte to whole messages.
    #[test]
    fn messages_are_found_across_any_frame_split() {
        let mut body = Vec::new();
        for _ in 0..3 {
            body.extend_from_slice(&chunk_message(STREAM_CHUNK));
        }
        for size in [1, 4, 5, 6, 8192, 16_384, STREAM_CHUNK + 5, STREAM_CHUNK + 10, body.len()] {
            let (mut frames, mut seen) = (Frames::default(), Seen::default());
            for piece in body.chunks(size) {
                frames.push(Bytes::copy_from_slice(piece), |m| seen.chunk(m)).unwrap();
            }
            assert!(!frames.pending(), "frame size {size}");
            assert_eq!(seen.check(3), Ok(3 * STREAM_CHUNK as u64), "frame size {size}");
        }
    }

    #[test]
    fn short_streams_and_wrong_chunks_are_errors() {
        let (mut frames, mut seen) = (Frames::default(), Seen::default());
        let one = chunk_message(STREAM_CHUNK);
        frames.push(one.slice(..one.len() - 1), |m| seen.chunk(m)).unwrap();
        assert!(frames.pending(), "the last byte is missing");
        assert_eq!(seen.check(1), Err("0 chunks received of the 1 asked for".into()));

        let mut seen = Seen::default();
        let err = Frames::default().push(chunk_message(100), |m| seen.chunk(m)).unwrap_err();
        assert_eq!(err, format!("chunk 1 carries 100 bytes, not {STREAM_CHUNK}"));

        let mut compressed = chunk_message(STREAM_CHUNK).to_vec();
        compressed[0] = 1;
        assert!(Frames::default().push(compressed.into(), |_| Ok(())).is_err());
    }
}
