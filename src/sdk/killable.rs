//! Connections an agent can drop at once, as a crash would: [`RunningAgent::abort`] cancels
//! a token, and every connection of the agent's server then fails its next read or write
//! (a parked read is woken for it), so its peers see the connection die rather than a
//! graceful goodbye.
//!
//! [`RunningAgent::abort`]: super::agent::RunningAgent::abort

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A TCP connection that breaks when its token is cancelled.
pub struct KillableIo {
    inner: TcpStream,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl KillableIo {
    pub fn new(inner: TcpStream, token: &CancellationToken) -> KillableIo {
        KillableIo { inner, killed: Box::pin(token.clone().cancelled_owned()) }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.killed.as_mut().poll(cx).is_ready() {
            Err(io::Error::new(io::ErrorKind::ConnectionReset, "agent aborted"))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for KillableIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connected for KillableIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}
