//! Write coalescing for the sidecar's HTTP/2 connections.
//!
//! h2 sends a DATA frame of 256 bytes or more from the caller's buffer instead of copying
//! it, and sets only one such frame aside: before it can queue the next one it flushes to
//! the socket. With 1 KiB messages that is one `writev` per message on every connection
//! (measured at sidecar A under `h2load -c 4 -m 16`: 0.77 writes per call, against 0.07
//! with 12-byte messages, whose frames h2 copies into one buffer), and on loopback every
//! write also runs the peer's TCP input and wakes it.
//!
//! [`coalesced`] puts an outbox between h2 and the socket: what h2 writes while its
//! connection task is polled is copied into the outbox, and [`Flushing`], wrapped around
//! that task's future, writes the outbox to the socket once, after each poll. A write of
//! [`DIRECT`] bytes or more goes straight to the socket when the outbox is empty, so large
//! payloads are not copied; the outbox is written out before it would pass [`LIMIT`].

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// A write this large goes to the socket directly when nothing waits in the outbox.
pub(crate) const DIRECT: usize = 16 * 1024;
/// The outbox is written out before it grows past this.
pub(crate) const LIMIT: usize = 256 * 1024;

struct Outbox {
    buf: BytesMut,
    write: OwnedWriteHalf,
    /// A failed socket write, reported to h2 at its next write or flush.
    failed: Option<io::ErrorKind>,
    /// Socket writes made (for tests).
    writes: u64,
}

impl Outbox {
    /// Writes the outbox to the socket; Pending, with the waker registered, while the
    /// socket is full.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while !self.buf.is_empty() {
            let written = ready!(Pin::new(&mut self.write).poll_write(cx, &self.buf));
            match written {
                Ok(0) => return Poll::Ready(Err(self.fail(io::ErrorKind::WriteZero))),
                Ok(n) => {
                    self.writes += 1;
                    self.buf.advance(n);
                }
                Err(e) => return Poll::Ready(Err(self.fail(e.kind()))),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn fail(&mut self, kind: io::ErrorKind) -> io::Error {
        self.failed = Some(kind);
        self.buf.clear();
        kind.into()
    }
}

#[derive(Clone)]
struct Shared(Arc<Mutex<Outbox>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Outbox> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The socket as h2 sees it: reads go to the socket, writes to the outbox.
pub(crate) struct CoalescedIo {
    read: OwnedReadHalf,
    outbox: Shared,
}

/// Splits `stream` into the I/O object to give h2 and the handle that drains its outbox
/// (pass it to [`Flushing::new`] with the connection's future).
pub(crate) fn coalesced(stream: TcpStream) -> (CoalescedIo, Drain) {
    let (read, write) = stream.into_split();
    let outbox = Shared(Arc::new(Mutex::new(Outbox {
        buf: BytesMut::with_capacity(16 * 1024),
        write,
        failed: None,
        writes: 0,
    })));
    (CoalescedIo { read, outbox: outbox.clone() }, Drain(outbox))
}

/// Drains the outbox of one [`CoalescedIo`].
pub(crate) struct Drain(Shared);

impl Drain {
    #[cfg(test)]
    /// Socket writes made so far.
    pub(crate) fn writes(&self) -> u64 {
        self.0.lock().writes
    }
}

impl AsyncRead for CoalescedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for CoalescedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let mut out = self.outbox.lock();
        if out.buf.len() + len > LIMIT || out.failed.is_some() {
            ready!(out.poll_drain(cx))?;
        }
        if out.buf.is_empty() && len >= DIRECT {
            let written = ready!(Pin::new(&mut out.write).poll_write_vectored(cx, bufs));
            return Poll::Ready(match written {
                Ok(n) => {
                    out.writes += 1;
                    Ok(n)
                }
                Err(e) => Err(out.fail(e.kind())),
            });
        }
        out.buf.reserve(len);
        for b in bufs {
            out.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Does not write: [`Flushing`] writes the outbox after the poll that filled it, so
    /// what h2 flushes several times within one poll leaves in one write.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.outbox.lock().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.outbox.lock();
        ready!(out.poll_drain(cx))?;
        Pin::new(&mut out.write).poll_shutdown(cx)
    }
}

/// A connection's future that writes the connection's outbox after each poll.
pub(crate) struct Flushing<F> {
    inner: Pin<Box<F>>,
    drain: Drain,
}

impl<F: Future> Flushing<F> {
    pub(crate) fn new(inner: F, drain: Drain) -> Flushing<F> {
        Flushing { inner: Box::pin(inner), drain }
    }

    /// The connection's future (e.g. to start its graceful shutdown).
    pub(crate) fn inner(self: Pin<&mut Self>) -> Pin<&mut F> {
        self.get_mut().inner.as_mut()
    }
}

impl<F: Future> Future for Flushing<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let output = self.inner.as_mut().poll(cx);
        // Pending drain: the socket's writability wakes this task. A failed write is kept
        // and h2 learns of it at its next write or flush, so poll the connection once more.
        if let Poll::Ready(Err(_)) = self.drain.0.lock().poll_drain(cx)
            && output.is_pending()
        {
            cx.waker().wake_by_ref();
        }
        output
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// A future that makes `writes` (one poll_write each) and flushes after each, all in
    /// one poll, like h2 with one chained DATA frame per message.
    fn write_all_in_one_poll(io: &mut CoalescedIo, writes: &[Vec<u8>]) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            for w in writes {
                match Pin::new(&mut *io).poll_write(cx, w) {
                    Poll::Ready(Ok(n)) => assert_eq!(n, w.len()),
                    other => panic!("write: {other:?}"),
                }
                assert!(Pin::new(&mut *io).poll_flush(cx).is_ready());
            }
            Poll::Ready(())
        })
    }

    #[tokio::test]
    async fn writes_and_flushes_of_one_poll_leave_in_one_socket_write() {
        let (client, mut server) = pair().await;
        let (mut io, drain) = coalesced(client);
        let writes: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1033]).collect();
        let stats = Drain(drain.0.clone());
        Flushing::new(write_all_in_one_poll(&mut io, &writes), drain).await;
        assert_eq!(stats.writes(), 1);
        std::future::poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx)).await.unwrap();
        assert_eq!(stats.writes(), 1, "nothing was left for the shutdown");
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, writes.concat());
    }

    #[tokio::test]
    async fn a_pending_connection_has_its_outbox_written_after_each_poll() {
        let (client, mut server) = pair().await;
        let (mut io, drain) = coalesced(client);
        let stats = Drain(drain.0.clone());
        let mut round = 0u8;
        let task = Flushing::new(
            std::future::poll_fn(move |cx| {
                round += 1;
                for _ in 0..10 {
                    assert!(Pin::new(&mut io).poll_write(cx, &[round; 300]).is_ready());
                }
                if round == 3 {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }),
            drain,
        );
        task.await;
        // Ten writes per poll, one socket write per poll.
        assert_eq!(stats.writes(), 3);
        let mut got = vec![0u8; 9000];
        server.read_exact(&mut got).await.unwrap();
        for (i, chunk) in got.chunks(3000).enumerate() {
            assert!(chunk.iter().all(|&b| usize::from(b) == i + 1), "round {} in order", i + 1);
        }
    }

    #[tokio::test]
    async fn large_writes_skip_the_outbox_only_when_it_is_empty() {
        let (client, mut server) = pair().await;
        let (mut io, drain) = coalesced(client);
        let big = vec![7u8; DIRECT];
        io.write_all(&big).await.unwrap();
        assert_eq!(drain.writes(), 1, "straight to the socket");
        assert!(drain.0.lock().buf.is_empty());
        io.write_all(b"small").await.unwrap();
        io.write_all(&big).await.unwrap();
        assert_eq!(drain.writes(), 1, "queued behind the small write, in order");
        assert_eq!(drain.0.lock().buf.len(), DIRECT + 5);
        io.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, [&big[..], b"small", &big[..]].concat());
    }
}
