//! The send-stall timeout of the local and mesh ports (`--send-stall-timeout`): a reply
//! that has waited that long for the client's HTTP/2 flow-control window (a client that
//! advertises a window of 0 and never sends WINDOW_UPDATE, or stops reading) has its
//! stream reset (RST_STREAM CANCEL) and everything it held dropped: its buffered bytes,
//! the rest of its body, the call's admission slot and its place among the connection's
//! requests in flight. The connection and its other streams carry on.
//!
//! How: hyper writes a response body from a task of its own per stream, which it hands
//! to the connection's executor, and polls the body for its next frame only once the
//! frame before it was given send capacity. [`Tracked`] (the body of every reply)
//! records in its [`SendStall`] when it handed hyper a DATA frame and has not been
//! polled since, i.e. hyper waits for window; [`StallExec`], the ports' executor, runs
//! each stream's task against that stall and drops the task once the stall reaches the
//! timeout, which makes h2 reset the stream. Data frames are handed on in pieces of at
//! most [`CHUNK`] bytes, so what h2 buffers beyond the client's window per stream is at
//! most one piece.
//!
//! The stall of a stream reaches the executor through a thread-local slot: hyper calls
//! the connection's service for a new stream ([`hand_off`]) and spawns the stream's task
//! ([`StallExec::execute`]) right after, on the same thread, with nothing in between.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::grpc::Body;

/// Largest piece of a reply's data handed to hyper at once (h2's default frame size).
pub(crate) const CHUNK: usize = 16 * 1024;

/// "Not waiting" in [`SendStall::since_us`].
const NOT_WAITING: u64 = u64::MAX;

/// Whether (and since when) one reply has waited for send capacity.
#[derive(Debug)]
pub(crate) struct SendStall {
    base: Instant,
    /// When the reply last handed hyper a DATA frame without being polled again, in µs
    /// after `base`; [`NOT_WAITING`] otherwise.
    since_us: AtomicU64,
    armed: Notify,
}

impl SendStall {
    pub(crate) fn new() -> Arc<SendStall> {
        Arc::new(SendStall { base: Instant::now(), since_us: AtomicU64::new(NOT_WAITING), armed: Notify::new() })
    }

    /// The reply handed hyper a DATA frame: it waits until polled again.
    fn arm(&self) {
        let now = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(NOT_WAITING - 1);
        self.since_us.store(now, Ordering::Release);
        self.armed.notify_one();
    }

    /// The reply was polled: hyper is not waiting for capacity.
    fn clear(&self) {
        self.since_us.store(NOT_WAITING, Ordering::Release);
    }

    /// Completes once the reply has waited `timeout` without being polled.
    pub(crate) async fn expired(&self, timeout: Duration) {
        loop {
            let since = self.since_us.load(Ordering::Acquire);
            if since == NOT_WAITING {
                self.armed.notified().await;
                continue;
            }
            tokio::time::sleep_until(self.base + Duration::from_micros(since) + timeout).await;
            if self.since_us.load(Ordering::Acquire) == since {
                return;
            }
        }
    }
}

thread_local! {
    /// The stall of the stream whose service was just called (see the module doc).
    static NEXT: RefCell<Option<Arc<SendStall>>> = const { RefCell::new(None) };
}

/// Hands `stall` to the executor's next spawn on this thread: called by a port's service
/// when hyper calls it for a new stream.
pub(crate) fn hand_off(stall: Arc<SendStall>) {
    NEXT.with(|n| *n.borrow_mut() = Some(stall));
}

/// The executor of the local and mesh ports' HTTP/2 connections: spawns each stream's
/// task on tokio, dropping it (the stream is reset) when its reply stalls for
/// `timeout`; counts those in `stalled`.
#[derive(Clone, Debug)]
pub(crate) struct StallExec {
    timeout: Duration,
    stalled: Arc<AtomicU64>,
}

impl StallExec {
    pub(crate) fn new(timeout: Duration, stalled: Arc<AtomicU64>) -> StallExec {
        StallExec { timeout, stalled }
    }
}

impl<F> hyper::rt::Executor<F> for StallExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let Some(stall) = NEXT.with(|n| n.borrow_mut().take()) else {
            tokio::spawn(fut);
            return;
        };
        let (timeout, stalled) = (self.timeout, self.stalled.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = fut => {}
                () = stall.expired(timeout) => {
                    stalled.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        ?timeout,
                        "stream reset: its reply waited for the client's flow-control window longer than \
                         --send-stall-timeout"
                    );
                }
            }
        });
    }
}

/// A reply's body: hands its data on in pieces of at most [`CHUNK`] bytes, records in its
/// stall when hyper waits to send one, and holds `guard` (its request's place among the
/// connection's requests in flight) until it ends.
pub(crate) struct Tracked<G> {
    body: Body,
    /// Data of the last frame not handed on yet.
    rest: Option<Bytes>,
    stall: Arc<SendStall>,
    guard: Option<G>,
}

impl<G> Tracked<G> {
    pub(crate) fn new(body: Body, stall: Arc<SendStall>, guard: G) -> Tracked<G> {
        Tracked { body, rest: None, stall, guard: Some(guard) }
    }
}

impl<G: Unpin> http_body::Body for Tracked<G> {
    type Data = Bytes;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        this.stall.clear();
        let polled = match this.rest.take() {
            Some(rest) => Poll::Ready(Some(Ok(Frame::data(rest)))),
            None => Pin::new(&mut this.body).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                let mut data = frame.into_data().unwrap_or_default();
                if data.len() > CHUNK {
                    this.rest = Some(data.split_off(CHUNK));
                }
                if !data.is_empty() {
                    this.stall.arm();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(None) => {
                this.guard = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.guard = None;
                Poll::Ready(Some(Err(e)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let hint = self.body.size_hint();
        let Some(rest) = &self.rest else { return hint };
        let rest = rest.len() as u64;
        let mut out = SizeHint::new();
        out.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            out.set_upper(upper + rest);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body(len: usize) -> Body {
        Body::Frames(crate::grpc::Frames::raw(Bytes::from(vec![7u8; len])))
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_not_polled_after_handing_on_data_expires_after_the_timeout() {
        let stall = SendStall::new();
        let mut tracked = Tracked::new(body(10), stall.clone(), ());
        let timeout = Duration::from_secs(30);
        let expired = tokio::spawn({
            let stall = stall.clone();
            async move {
                let t = Instant::now();
                stall.expired(timeout).await;
                t.elapsed()
            }
        });
        tokio::task::yield_now().await;
        // Not waiting yet: nothing was handed on. Time passes without expiry.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!expired.is_finished());
        let t0 = Instant::now();
        let frame = tracked.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap().len(), 10);
        // Polled again after 29 s: the wait starts over.
        tokio::time::advance(Duration::from_secs(29)).await;
        tokio::task::yield_now().await;
        assert!(!expired.is_finished());
        assert!(tracked.frame().await.is_none(), "the body ended");
        let t1 = Instant::now();
        assert_eq!(t1 - t0, Duration::from_secs(29));
        // A second data frame, then no poll: expires exactly one timeout later.
        let mut second = Tracked::new(body(5), stall.clone(), ());
        let _ = second.frame().await.unwrap().unwrap();
        let waited = expired.await.unwrap();
        assert_eq!(waited, Duration::from_secs(60 + 29 + 30));
    }

    #[tokio::test]
    async fn data_is_handed_on_in_chunks_and_the_guard_held_until_the_end() {
        let held = Arc::new(());
        let mut tracked = Tracked::new(body(CHUNK * 2 + 100), SendStall::new(), held.clone());
        let mut sizes = Vec::new();
        while let Some(frame) = tracked.frame().await {
            assert_eq!(Arc::strong_count(&held), 2, "held while the body runs");
            sizes.push(frame.unwrap().into_data().unwrap().len());
        }
        assert_eq!(sizes, [CHUNK, CHUNK, 100]);
        assert_eq!(Arc::strong_count(&held), 1, "dropped when the body ended");
        assert!(http_body::Body::is_end_stream(&tracked));
    }
}
