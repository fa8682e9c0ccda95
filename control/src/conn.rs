//! Connections of the control service's gRPC port before tonic serves them: a cap on the
//! connections open at once (`--max-connections`; one more is closed as soon as it is
//! accepted, and with TLS a connection holds its slot from the accept, its handshake
//! included), the guard against HTTP/2 control-frame floods
//! (`--max-control-frames-per-second`, [`agent_reach_support::h2guard`]) and, through the
//! same guard, the header-read, idle and send-stall timeouts (`--header-read-timeout`,
//! `--idle-timeout`, `--send-stall-timeout`: GOAWAY NO_ERROR naming the timeout). Refusals are counted in
//! [`ConnStats`](crate::limit_stats::ConnStats) (`/metrics`: `limit_refusals{limit=...}`), with those of
//! [`crate::refusals`] (header list, request timeout).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use agent_reach_support::h2guard::{FloodLimit, FrameGuard, Timeouts};
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

use crate::limit_stats::ConnStats;
use crate::limits::GrpcLimits;

/// The slots and guard settings of the gRPC port.
#[derive(Clone)]
pub(crate) struct Gate {
    slots: Arc<Semaphore>,
    max: usize,
    flood: FloodLimit,
    header_read_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
    send_stall_timeout: std::time::Duration,
    stats: Arc<ConnStats>,
}

impl Gate {
    pub(crate) fn new(limits: &GrpcLimits, stats: Arc<ConnStats>) -> Gate {
        Gate {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            max: limits.max_connections,
            flood: FloodLimit { max_control_frames_per_second: limits.max_control_frames_per_second },
            header_read_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            send_stall_timeout: limits.send_stall_timeout,
            stats,
        }
    }

    /// A slot for one more connection, or `None` (counted) when the port is full.
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.slots.clone().try_acquire_owned().ok();
        if slot.is_none() {
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(max = self.max, "connection refused: --max-connections reached");
        }
        slot
    }

    /// `io` with its slot, guarded against floods and within the timeouts.
    pub(crate) fn guarded<IO>(&self, io: IO, slot: OwnedSemaphorePermit) -> Guarded<IO> {
        let timeouts = Timeouts {
            header_read: self.header_read_timeout,
            idle: self.idle_timeout,
            send_stall: self.send_stall_timeout,
            header_read_closed: self.stats.header_read_timeout.clone(),
            idle_closed: self.stats.idle_timeout.clone(),
            send_stall_closed: self.stats.send_stall_timeout.clone(),
        };
        let io = FrameGuard::new(io, self.flood, self.stats.control_frames.clone()).with_timeouts(timeouts);
        Guarded { io, _slot: slot }
    }

    /// The plaintext connections of `listener`, within the cap.
    pub(crate) fn plaintext(self, listener: TcpListener) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
        tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| {
            let out = match accepted {
                Ok(tcp) => self.admit().map(|slot| {
                    let _ = tcp.set_nodelay(true);
                    Ok(self.guarded(tcp, slot))
                }),
                Err(e) => Some(Err(e)),
            };
            std::future::ready(out)
        })
    }
}

/// A connection of the gRPC port: guarded, holding its slot until it is dropped.
pub(crate) struct Guarded<IO> {
    io: FrameGuard<IO>,
    _slot: OwnedSemaphorePermit,
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.get_ref().connect_info()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_and_a_freed_slot_serves_again() {
        use tokio::io::AsyncReadExt;
        let limits = GrpcLimits { max_connections: 2, ..GrpcLimits::default() };
        let stats = Arc::new(ConnStats::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(Gate::new(&limits, stats.clone()).plaintext(listener));
        let _a = TcpStream::connect(addr).await.unwrap();
        let first = incoming.next().await.unwrap().unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        // The third is closed at once; the stream waits for the next one.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let next = tokio::spawn(async move { incoming.next().await.map(|c| c.is_ok()) });
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), third.read(&mut [0u8; 8])).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the third connection is closed: {read:?}");
        assert_eq!(stats.counts()[0], ("max_connections", 1));
        drop(first);
        let _d = TcpStream::connect(addr).await.unwrap();
        assert_eq!(next.await.unwrap(), Some(true), "a freed slot serves a new connection");
        assert_eq!(stats.counts()[0], ("max_connections", 1));
    }
}
