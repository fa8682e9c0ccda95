//! HTTP/2 serving of the local and mesh ports: the server settings and the accept loop
//! with graceful shutdown. What each port answers is in [`crate::api`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::coalesce;
use crate::grpc::Body;

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// The HTTP/2 server settings of the local and mesh ports.
pub(crate) fn server_builder() -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_concurrent_streams(4096)
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}

/// Accepts HTTP/2 connections until shutdown, then closes them gracefully.
pub(crate) async fn serve_http2<F>(listener: TcpListener, mut shutdown: watch::Receiver<bool>, handler: F)
where
    F: Fn(Request<Incoming>) -> HandlerFuture + Clone + Send + Sync + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = server_builder();
    loop {
        let accepted = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => break,
            a = listener.accept() => a,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = hyper::service::service_fn(move |req| {
            let fut = handler(req);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let (io, drain) = coalesce::coalesced(stream);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let conn = coalesce::Flushing::new(graceful.watch(conn), drain);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open 10s after shutdown");
    }
}
