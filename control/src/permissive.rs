//! The control port in permissive mutual TLS (`--mtls permissive`, migration only): each
//! connection is TLS when it opens with a TLS handshake and plaintext otherwise
//! ([`agent_reach_identity::net::accept_either_admitted`]; plaintext connections are
//! counted in `agent_reach_plaintext_connections_total`). A TLS connection's verified
//! certificate identity travels with its requests as [`ConnPeer`], which
//! [`crate::identity::request_peer`] reads; a plaintext one carries none, so its calls
//! are anonymous, as are TLS calls without a client certificate.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use agent_reach_identity::PeerId;
use agent_reach_identity::net::Accepted;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The verified identity of a permissive connection's peer (`None`: plaintext, or TLS
/// without a client certificate).
#[derive(Clone, Debug)]
pub struct ConnPeer(pub Option<PeerId>);

/// A connection of the permissive port, TLS or plaintext.
pub(crate) struct Either {
    io: Accepted,
    peer: Option<PeerId>,
}

impl Either {
    pub(crate) fn new(io: Accepted) -> Either {
        let peer = match &io {
            Accepted::Tls(tls) => {
                agent_reach_identity::tls::peer_identity(tls.get_ref().1.peer_certificates()).ok().flatten()
            }
            Accepted::Plain(_) => None,
        };
        Either { io, peer }
    }
}

impl Connected for Either {
    type ConnectInfo = ConnPeer;

    fn connect_info(&self) -> ConnPeer {
        ConnPeer(self.peer.clone())
    }
}

macro_rules! both {
    ($self:ident, $io:ident => $e:expr) => {
        match &mut $self.io {
            Accepted::Tls(t) => {
                let $io = Pin::new(t.as_mut());
                $e
            }
            Accepted::Plain(t) => {
                let $io = Pin::new(t);
                $e
            }
        }
    };
}

impl AsyncRead for Either {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        both!(self, io => io.poll_read(cx, buf))
    }
}

impl AsyncWrite for Either {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        both!(self, io => io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        both!(self, io => io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Accepted::Tls(t) => t.is_write_vectored(),
            Accepted::Plain(t) => t.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, io => io.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, io => io.poll_shutdown(cx))
    }
}
