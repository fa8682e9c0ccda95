//! The bodies the sidecar passes through without reading them whole: frames a task
//! produces ([`ChannelBody`]), an answer received on a pooled `h2` connection
//! ([`H2Body`]), and a body whose trailers are tapped on the way ([`Tapped`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;

use super::{BoxError, Frames, Hook};

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

    pub(super) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx)
    }
}

/// A pooled connection's last cleanly ended answer stream, kept until the connection's
/// next call is sent (then [`Parked::release`] drops it).
///
/// `h2` wakes the connection's task when the last handle of a closed stream is dropped
/// (so that the stream leaves its store). An answer's [`h2::RecvStream`] is that last handle,
/// and the task that reads it to its end drops it when the connection's task has nothing
/// left to do: one more poll of the connection per call, which reads and writes nothing.
/// Dropped right after the next call's HEADERS are queued (which has woken the connection's
/// task already, and taken its waker), the stream wakes nothing. A stream that ended with an
/// error is not kept (its reset, if any, must not wait); at most one stream per connection
/// is, until the next call or until the connection's last handle goes.
#[derive(Default)]
pub(crate) struct Parked(std::sync::Mutex<Option<h2::RecvStream>>);

impl Parked {
    fn park(&self, recv: h2::RecvStream) {
        let previous = self.0.lock().unwrap_or_else(|e| e.into_inner()).replace(recv);
        drop(previous);
    }

    /// Drops the kept stream, if any (outside the lock).
    pub(crate) fn release(&self) {
        let previous = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(previous);
    }

    #[cfg(test)]
    pub(crate) fn is_kept(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// The body of an answer received with `h2`: data (returning flow-control capacity as it
/// is read, so the peer keeps sending only as fast as we pass it on), then trailers.
pub(crate) struct H2Body {
    /// `None` once a clean end handed it to `parked`.
    recv: Option<h2::RecvStream>,
    parked: Option<Arc<Parked>>,
    data_done: bool,
    done: bool,
}

impl H2Body {
    /// `parked`: where the stream goes once it ended cleanly (see [`Parked`]); `None`: it is
    /// dropped with the body.
    pub(crate) fn new(recv: h2::RecvStream, parked: Option<Arc<Parked>>) -> H2Body {
        let done = recv.is_end_stream();
        let mut body = H2Body { recv: Some(recv), parked, data_done: done, done };
        if done {
            body.park();
        }
        body
    }

    /// After a clean end: the stream goes to the connection's [`Parked`] slot, if it has one.
    fn park(&mut self) {
        if let Some(parked) = self.parked.take()
            && let Some(recv) = self.recv.take()
        {
            parked.park(recv);
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.done
    }

    pub(super) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(recv) = self.recv.as_mut().filter(|_| !self.done) else {
            return Poll::Ready(None);
        };
        if !self.data_done {
            match recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = recv.flow_control().release_capacity(data.len());
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
        let polled = match recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => {
                self.done = true;
                return Poll::Ready(Some(Err(e.into())));
            }
            Poll::Pending => return Poll::Pending,
        };
        self.done = true;
        self.park();
        polled
    }
}

/// What a [`Tapped`] body passes through.
pub(super) enum Source {
    Incoming(Incoming),
    H2(H2Body),
    Frames(Frames),
    Channel(ChannelBody),
}

impl Source {
    pub(super) fn is_end_stream(&self) -> bool {
        match self {
            Source::Incoming(b) => b.is_end_stream(),
            Source::H2(b) => b.is_end_stream(),
            Source::Frames(f) => f.is_empty(),
            Source::Channel(_) => false,
        }
    }

    pub(super) fn size_hint(&self) -> SizeHint {
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
    pub(super) inner: Source,
    pub(super) annotate: Option<Hook>,
    pub(super) observe: Option<Hook>,
}

impl Tapped {
    pub(super) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
