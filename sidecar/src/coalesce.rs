//! Write coalescing for the sidecar's HTTP/2 connections, plaintext and TLS.
//!
//! h2 sends a DATA frame of 256 bytes or more from the caller's buffer instead of copying
//! it, and sets only one such frame aside: before it can queue the next one it flushes to
//! the socket. With 1 KiB messages that is one `writev` per message on every connection
//! (measured at sidecar A under `h2load -c 4 -m 16`: 0.77 writes per call, against 0.07
//! with 12-byte messages, whose frames h2 copies into one buffer), and on loopback every
//! write also runs the peer's TCP input and wakes it. Over TLS each of those writes is a
//! TLS record of its own too: tokio-rustls encrypts what each `poll_write` hands it and
//! writes it to the socket at once (sidecar A with mutual TLS, `h2load -c 4 -m 16`, 1 KiB:
//! 1.09 socket writes per call without the outbox, 0.10 with it).
//!
//! [`coalesced`] (a TCP stream) and [`coalesced_stream`] (any other stream: TLS) put an
//! outbox between h2 and the stream: what h2 writes while its connection task is polled is
//! copied into the outbox, and [`Flushing`], wrapped around that task's future, writes the
//! outbox to the stream once after each poll, then flushes the stream (tokio-rustls keeps
//! the records the socket would not take in rustls's buffer until its next write or flush;
//! a TCP stream's flush does nothing). So a poll's frames leave in one write: on TLS as
//! records of up to 16 KiB, in one `writev`. A write of [`DIRECT`] bytes or more goes
//! straight to the stream when the outbox is empty, so large payloads are not copied into
//! it; the outbox is written out before it would pass [`LIMIT`].
//!
//! The stream is used as two halves, one read by h2 and one written by the outbox, rather
//! than held whole behind the outbox's lock: a TCP stream's halves (`into_split`) need no
//! lock, so h2's reads of a plaintext connection take none (held whole, every read would
//! take the outbox's lock). A TLS stream's reads and writes both go through its rustls
//! session, so [`coalesced_stream`] splits it with `tokio::io::split`, which holds it
//! behind a mutex of its own: one lock per read, and one per write or flush of the drain
//! besides the outbox's (a poll's writes into the outbox take only the outbox's). Every one
//! of these locks is taken on the connection's task only (h2 reads and writes there, and
//! [`Flushing`] drains there), so none is ever contended.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// A write this large goes to the stream directly when nothing waits in the outbox.
pub(crate) const DIRECT: usize = 16 * 1024;
/// The outbox is written out before it grows past this.
pub(crate) const LIMIT: usize = 256 * 1024;

struct Outbox<W> {
    buf: BytesMut,
    write: W,
    /// The stream is to be flushed at the next drain: h2 asked for a flush, or the stream
    /// was written to since its last flush.
    flush: bool,
    /// A failed write or flush of the stream, reported to h2 at its next write or flush.
    failed: Option<io::ErrorKind>,
    /// Writes to the stream made (for tests).
    writes: u64,
}

impl<W: AsyncWrite + Unpin> Outbox<W> {
    /// Writes the outbox to the stream and flushes it; Pending, with the waker registered,
    /// while the stream cannot take more.
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
                    self.flush = true;
                    self.buf.advance(n);
                }
                Err(e) => return Poll::Ready(Err(self.fail(e.kind()))),
            }
        }
        if self.flush {
            if let Err(e) = ready!(Pin::new(&mut self.write).poll_flush(cx)) {
                return Poll::Ready(Err(self.fail(e.kind())));
            }
            self.flush = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl<W> Outbox<W> {
    fn fail(&mut self, kind: io::ErrorKind) -> io::Error {
        self.failed = Some(kind);
        self.buf.clear();
        kind.into()
    }
}

struct Shared<W>(Arc<Mutex<Outbox<W>>>);

impl<W> Clone for Shared<W> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<W> Shared<W> {
    fn lock(&self) -> MutexGuard<'_, Outbox<W>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The stream as h2 sees it: reads go to the stream's read half `R`, writes to the outbox
/// in front of its write half `W`.
pub(crate) struct CoalescedIo<R, W> {
    read: R,
    outbox: Shared<W>,
}

/// The I/O object to give h2 and the handle that drains its outbox (pass it to
/// [`Flushing::new`] with the connection's future).
pub(crate) type Coalesced<R, W> = (CoalescedIo<R, W>, Drain<W>);

/// Splits a TCP `stream` into its [`Coalesced`] parts.
pub(crate) fn coalesced(stream: TcpStream) -> Coalesced<OwnedReadHalf, OwnedWriteHalf> {
    let (read, write) = stream.into_split();
    halves(read, write)
}

/// [`coalesced`] for any other stream (a TLS stream), split with `tokio::io::split`.
pub(crate) fn coalesced_stream<S>(stream: S) -> Coalesced<ReadHalf<S>, WriteHalf<S>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (read, write) = tokio::io::split(stream);
    halves(read, write)
}

fn halves<R, W>(read: R, write: W) -> Coalesced<R, W> {
    let outbox = Shared(Arc::new(Mutex::new(Outbox {
        buf: BytesMut::with_capacity(16 * 1024),
        write,
        flush: false,
        failed: None,
        writes: 0,
    })));
    (CoalescedIo { read, outbox: outbox.clone() }, Drain(outbox))
}

/// Drains the outbox of one [`CoalescedIo`].
pub(crate) struct Drain<W>(Shared<W>);

impl<W> Drain<W> {
    #[cfg(test)]
    /// Writes to the stream made so far.
    pub(crate) fn writes(&self) -> u64 {
        self.0.lock().writes
    }
}

impl<R: AsyncRead + Unpin, W> AsyncRead for CoalescedIo<R, W> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<R, W: AsyncWrite + Unpin> AsyncWrite for CoalescedIo<R, W> {
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
                    out.flush = true;
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

    /// Does not write: [`Flushing`] writes the outbox after the poll that filled it, and
    /// flushes the stream then, so what h2 flushes several times within one poll leaves
    /// in one write.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.outbox.lock();
        match out.failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => {
                out.flush = true;
                Poll::Ready(Ok(()))
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.outbox.lock();
        ready!(out.poll_drain(cx))?;
        Pin::new(&mut out.write).poll_shutdown(cx)
    }
}

/// A connection's future that writes the connection's outbox after each poll.
pub(crate) struct Flushing<F, W> {
    inner: Pin<Box<F>>,
    drain: Drain<W>,
}

impl<F: Future, W> Flushing<F, W> {
    pub(crate) fn new(inner: F, drain: Drain<W>) -> Flushing<F, W> {
        Flushing { inner: Box::pin(inner), drain }
    }

    /// The connection's future (e.g. to start its graceful shutdown).
    pub(crate) fn inner(self: Pin<&mut Self>) -> Pin<&mut F> {
        self.get_mut().inner.as_mut()
    }
}

impl<F: Future, W: AsyncWrite + Unpin> Future for Flushing<F, W> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let output = self.inner.as_mut().poll(cx);
        // Pending drain: the stream's writability wakes this task. A failed write is kept
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use agent_reach_identity::Ca;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket};
    use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// A TCP pair whose socket buffers are as small as the kernel allows, so that the
    /// client's writes soon block while the server does not read.
    async fn small_pair() -> (TcpStream, TcpStream) {
        let listening = TcpSocket::new_v4().unwrap();
        listening.set_recv_buffer_size(4096).unwrap();
        listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listening.listen(1).unwrap();
        let connecting = TcpSocket::new_v4().unwrap();
        connecting.set_send_buffer_size(4096).unwrap();
        let (client, accepted) = tokio::join!(connecting.connect(listener.local_addr().unwrap()), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// A TCP stream that counts its successful writes (each one a `write`/`writev`).
    struct Counting {
        tcp: TcpStream,
        writes: Arc<AtomicU64>,
    }

    impl Counting {
        fn counted<T>(&self, written: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
            if let Poll::Ready(Ok(_)) = written {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            written
        }
    }

    impl AsyncRead for Counting {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counting {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.tcp).poll_write(cx, buf);
            self.counted(written)
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
            self.counted(written)
        }
        fn is_write_vectored(&self) -> bool {
            self.tcp.is_write_vectored()
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tcp).poll_shutdown(cx)
        }
    }

    type TlsClient = client::TlsStream<Counting>;

    /// A mutual TLS connection over `(client, server)`: the client's TLS stream, whose
    /// socket counts its writes (zero when the handshake is done), and the server's.
    async fn tls(
        (client, server): (TcpStream, TcpStream),
    ) -> (TlsClient, Arc<AtomicU64>, server::TlsStream<TcpStream>) {
        let ca = Ca::generate("mesh.test").unwrap();
        let (a, b) = (crate::mesh_tls::test_configs(&ca, "a"), crate::mesh_tls::test_configs(&ca, "b"));
        let writes = Arc::new(AtomicU64::new(0));
        let name = rustls::pki_types::ServerName::try_from(agent_reach_identity::tls::SERVER_NAME).unwrap();
        let counting = Counting { tcp: client, writes: writes.clone() };
        let (client, server) = tokio::join!(
            TlsConnector::from(a.client()).connect(name, counting),
            TlsAcceptor::from(b.server()).accept(server)
        );
        let (client, server) = (client.unwrap(), server.unwrap());
        writes.store(0, Ordering::Relaxed);
        (client, writes, server)
    }

    /// A future that makes `writes` (one poll_write each) and flushes after each, all in
    /// one poll, like h2 with one chained DATA frame per message.
    fn write_all_in_one_poll<'a, IO: AsyncWrite + Unpin>(
        io: &'a mut IO,
        writes: &'a [Vec<u8>],
    ) -> impl Future<Output = ()> + 'a {
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

    /// 40 messages of 1033 bytes (a 1 KiB gRPC message in its DATA frame, as h2 writes it).
    fn messages() -> Vec<Vec<u8>> {
        (0..40u8).map(|i| vec![i; 1033]).collect()
    }

    #[tokio::test]
    async fn writes_and_flushes_of_one_poll_leave_in_one_socket_write() {
        let (client, mut server) = pair().await;
        let (mut io, drain) = coalesced(client);
        let writes = messages();
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
    async fn over_tls_writes_and_flushes_of_one_poll_leave_in_one_socket_write() {
        let writes = messages();
        // Without the outbox: a record and a socket write per message.
        let (mut bare, socket_writes, mut server) = tls(pair().await).await;
        write_all_in_one_poll(&mut bare, &writes).await;
        assert_eq!(socket_writes.load(Ordering::Relaxed), 40);
        let mut got = vec![0u8; 40 * 1033];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, writes.concat());

        let (client, socket_writes, mut server) = tls(pair().await).await;
        let (mut io, drain) = coalesced_stream(client);
        let stats = Drain(drain.0.clone());
        Flushing::new(write_all_in_one_poll(&mut io, &writes), drain).await;
        assert_eq!(stats.writes(), 1, "one write to the TLS stream");
        assert_eq!(socket_writes.load(Ordering::Relaxed), 1, "its records in one socket write");
        let mut got = vec![0u8; 40 * 1033];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, writes.concat(), "intact at the peer");
        std::future::poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx)).await.unwrap();
        assert_eq!(stats.writes(), 1, "nothing was left for the shutdown");
        assert_eq!(socket_writes.load(Ordering::Relaxed), 2, "and close_notify");
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "a clean end: {} bytes more", rest.len());
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

    /// A connection that writes `total` bytes in its first poll and then waits (as h2 does
    /// for the peer) without waking itself, while the peer does not read: the outbox is
    /// left pending, and the stream's writability alone must drain it (and, over TLS, flush
    /// the records rustls kept) once the peer reads.
    async fn a_pending_stream_is_drained_when_writable<R, W, P>(io: CoalescedIo<R, W>, drain: Drain<W>, mut peer: P)
    where
        R: Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
        P: AsyncRead + Unpin,
    {
        let total = 200 * 1033;
        let sent: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let stats = Drain(drain.0.clone());
        let (mut io, data) = (io, sent.clone());
        let mut written = false;
        let task = tokio::spawn(Flushing::new(
            std::future::poll_fn(move |cx| {
                if !written {
                    written = true;
                    for chunk in data.chunks(1033) {
                        assert!(Pin::new(&mut io).poll_write(cx, chunk).is_ready());
                        assert!(Pin::new(&mut io).poll_flush(cx).is_ready());
                    }
                }
                Poll::<()>::Pending
            }),
            drain,
        ));
        // The socket is full: the drain is pending with most of the outbox left.
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while stats.writes() == 0 {
            assert!(tokio::time::Instant::now() < until, "the drain never wrote");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let left = stats.0.lock().buf.len();
        assert!(left > 0, "the socket took everything: not a test of a pending drain");
        let mut got = vec![0u8; total];
        tokio::time::timeout(Duration::from_secs(10), peer.read_exact(&mut got))
            .await
            .expect("the drain went on when the socket could take more")
            .unwrap();
        assert!(got == sent, "intact and in order");
        assert!(stats.0.lock().buf.is_empty());
        assert!(!task.is_finished(), "the connection still waits");
        task.abort();
    }

    #[tokio::test]
    async fn a_pending_socket_is_drained_when_writable() {
        let (client, server) = small_pair().await;
        let (io, drain) = coalesced(client);
        a_pending_stream_is_drained_when_writable(io, drain, server).await;
    }

    #[tokio::test]
    async fn over_tls_a_pending_socket_is_drained_and_flushed_when_writable() {
        let (client, _, server) = tls(small_pair().await).await;
        let (io, drain) = coalesced_stream(client);
        a_pending_stream_is_drained_when_writable(io, drain, server).await;
    }

    /// A write of [`DIRECT`] bytes goes straight to the stream when the outbox is empty,
    /// and queues behind what is in it otherwise; `peer` receives everything in order.
    async fn large_writes_skip_the_outbox_only_when_it_is_empty<R, W, P>(
        mut io: CoalescedIo<R, W>,
        drain: Drain<W>,
        mut peer: P,
    ) where
        R: Unpin,
        W: AsyncWrite + Unpin,
        P: AsyncRead + Unpin,
    {
        let big = vec![7u8; DIRECT];
        io.write_all(&big).await.unwrap();
        assert_eq!(drain.writes(), 1, "straight to the stream");
        assert!(drain.0.lock().buf.is_empty());
        io.write_all(b"small").await.unwrap();
        io.write_all(&big).await.unwrap();
        assert_eq!(drain.writes(), 1, "queued behind the small write, in order");
        assert_eq!(drain.0.lock().buf.len(), DIRECT + 5);
        io.shutdown().await.unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, [&big[..], b"small", &big[..]].concat());
    }

    #[tokio::test]
    async fn large_writes_skip_the_outbox_only_when_it_is_empty_over_tcp() {
        let (client, server) = pair().await;
        let (io, drain) = coalesced(client);
        large_writes_skip_the_outbox_only_when_it_is_empty(io, drain, server).await;
    }

    #[tokio::test]
    async fn large_writes_skip_the_outbox_only_when_it_is_empty_over_tls() {
        let (client, _, server) = tls(pair().await).await;
        let (io, drain) = coalesced_stream(client);
        large_writes_skip_the_outbox_only_when_it_is_empty(io, drain, server).await;
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_at_the_next_write_and_flush() {
        let (client, server) = pair().await;
        let (client, _, server) = tls((client, server)).await;
        let (mut io, drain) = coalesced_stream(client);
        drop(server);
        let stats = Drain(drain.0.clone());
        let mut task = Flushing::new(std::future::pending::<()>(), drain);
        // The peer is gone: writes fail once its RST is back (a few tries at most).
        let failed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                io.write_all(&[1u8; 1033]).await.unwrap_or_default();
                std::future::poll_fn(|cx| {
                    let _ = Pin::new(&mut task).poll(cx);
                    Poll::Ready(())
                })
                .await;
                if stats.0.lock().failed.is_some() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(failed.is_ok(), "the write never failed");
        assert!(io.write_all(b"more").await.is_err());
        assert!(io.flush().await.is_err());
        assert!(io.shutdown().await.is_err());
    }
}
