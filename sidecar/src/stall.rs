//! The send-stall timeout of the local and mesh ports (`--send-stall-timeout`): a reply
//! that has waited that long for the client's HTTP/2 flow-control window (a client that
//! advertises a window of 0 and never sends WINDOW_UPDATE, or stops reading) has its
//! stream reset (RST_STREAM CANCEL) and everything it held dropped: its buffered bytes,
//! the rest of its body, the call's admission slot and its place among the connection's
//! requests in flight. The connection and its other streams carry on.
//!
//! How: hyper writes a response body from a task of its own per stream, which it hands
//! to the connection's executor (which spawns it, or has the connection's own task run
//! it: [`crate::conn_streams`]), and polls the body for its next frame only once the
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
//!
//! The body is polled only from the stream's own task, so whether the reply waits can
//! change only while that task polls the stream: [`Watched`] looks right after each poll
//! and runs a timer only while the reply waits (never for a reply that got its window at
//! once, i.e. almost every call), with no wake-up of its own.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use crate::grpc::Body;

/// Largest piece of a reply's data handed to hyper at once (h2's default frame size).
pub(crate) const CHUNK: usize = 16 * 1024;

/// Whether one reply waits for send capacity: the number of DATA frames it handed hyper,
/// twice, plus one while hyper has not polled it again since the last (odd: waiting).
#[derive(Debug, Default)]
pub(crate) struct SendStall(AtomicU64);

impl SendStall {
    pub(crate) fn new() -> Arc<SendStall> {
        Arc::new(SendStall::default())
    }

    /// The reply handed hyper a DATA frame: it waits until polled again.
    fn arm(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store((n | 1) + 2, Ordering::Relaxed);
    }

    /// The reply was polled: hyper is not waiting for capacity.
    fn clear(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(n & !1, Ordering::Relaxed);
    }

    /// Which wait the reply is in (one per DATA frame handed on), if it waits.
    fn waiting(&self) -> Option<u64> {
        let n = self.0.load(Ordering::Relaxed);
        (n & 1 == 1).then_some(n)
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

/// The executor of the local and mesh ports' HTTP/2 connections: hands each stream's
/// task to its connection's own task ([`crate::conn_streams`]) or spawns it on tokio,
/// dropping it (the stream is reset) when its reply stalls for
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
        // Run by the connection's own task when it takes its streams, else spawned.
        match NEXT.with(|n| n.borrow_mut().take()) {
            Some(stall) => crate::conn_streams::start(Watched::new(fut, stall, self.timeout, self.stalled.clone())),
            None => crate::conn_streams::start(fut),
        }
    }
}

pin_project_lite::pin_project! {
    /// A stream's task, ended (its stream reset) once its reply has waited `timeout` for
    /// send capacity without being polled.
    struct Watched<F> {
        #[pin]
        fut: F,
        stall: Arc<SendStall>,
        timeout: Duration,
        stalled: Arc<AtomicU64>,
        // The wait timed, and its timer; none while the reply does not wait.
        timer: Option<(u64, Pin<Box<Sleep>>)>,
    }
}

impl<F> Watched<F> {
    fn new(fut: F, stall: Arc<SendStall>, timeout: Duration, stalled: Arc<AtomicU64>) -> Watched<F> {
        Watched { fut, stall, timeout, stalled, timer: None }
    }
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.fut.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(wait) = this.stall.waiting() else {
            *this.timer = None;
            return Poll::Pending;
        };
        let timer = match this.timer {
            Some((timed, timer)) if *timed == wait => timer,
            slot => &mut slot.insert((wait, Box::pin(tokio::time::sleep(*this.timeout)))).1,
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.stalled.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            timeout = ?this.timeout,
            "stream reset: its reply waited for the client's flow-control window longer than --send-stall-timeout"
        );
        Poll::Ready(())
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

    /// A stream's task as hyper runs it, watched with a 30 s send-stall timeout: it waits
    /// for its reply (`ready`), then hands each DATA frame of a `len`-byte body on and waits
    /// for send capacity (`capacity`) before polling for the next.
    struct Stream {
        watched: Watched<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
        ready: tokio::sync::oneshot::Sender<()>,
        capacity: tokio::sync::mpsc::UnboundedSender<()>,
        /// Streams ended by the watch.
        stalled: Arc<AtomicU64>,
        /// Set once the body ended.
        done: Arc<std::sync::atomic::AtomicBool>,
    }

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn stream(len: usize) -> Stream {
        let stall = SendStall::new();
        let (stalled, done) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let (ready, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (capacity, mut capacity_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut tracked = Tracked::new(body(len), stall.clone(), ());
        let finished = done.clone();
        let task = Box::pin(async move {
            let _ = ready_rx.await;
            while let Some(frame) = tracked.frame().await {
                if frame.unwrap().is_data() && capacity_rx.recv().await.is_none() {
                    return;
                }
            }
            finished.store(true, Ordering::SeqCst);
        });
        Stream { watched: Watched::new(task, stall, TIMEOUT, stalled.clone()), ready, capacity, stalled, done }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_not_polled_after_handing_on_data_is_ended_after_the_timeout() {
        // Two DATA frames: CHUNK bytes, then 10.
        let Stream { watched, ready, capacity, stalled, done } = stream(CHUNK + 10);
        let watched = tokio::spawn(watched);
        // No reply yet: the handler may take as long as it likes.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!watched.is_finished());
        // The first frame is handed on; hyper waits for capacity 29 s, gets it, hands on
        // the second: the wait starts over.
        ready.send(()).unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!watched.is_finished());
        capacity.send(()).unwrap();
        tokio::task::yield_now().await;
        let second = tokio::time::Instant::now();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!watched.is_finished(), "29 s into the second wait");
        // No capacity for the second frame: ended exactly one timeout after it waited.
        tokio::time::advance(Duration::from_secs(1)).await;
        watched.await.unwrap();
        assert_eq!(tokio::time::Instant::now() - second, TIMEOUT);
        assert_eq!(stalled.load(Ordering::SeqCst), 1);
        assert!(!done.load(Ordering::SeqCst), "the stream's task was dropped, not finished");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_that_gets_its_window_runs_to_its_end_without_a_timer() {
        let Stream { watched, ready, capacity, stalled, done } = stream(CHUNK * 2 + 100);
        for _ in 0..3 {
            capacity.send(()).unwrap();
        }
        ready.send(()).unwrap();
        let mut watched = Box::pin(watched);
        // Capacity was there for every frame: one poll runs the stream to its end, and no
        // timer was started on the way.
        let polled = std::future::poll_fn(|cx| Poll::Ready(watched.as_mut().poll(cx))).await;
        assert!(polled.is_ready());
        assert!(watched.timer.is_none());
        assert_eq!((done.load(Ordering::SeqCst), stalled.load(Ordering::SeqCst)), (true, 0));
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
