//! The bodies the sidecar passes through without reading them whole: frames a task
//! produces ([`ChannelBody`]), an answer received on a pooled `h2` connection
//! ([`H2Body`]), and a body whose trailers are tapped on the way ([`Tapped`]).

use std::pin::Pin;
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

    pub(super) fn is_end_stream(&self) -> bool {
        self.done
    }

    pub(super) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
