//! HTTP/2 serving of the local and mesh ports: the accept loop with graceful shutdown,
//! within the port's limits ([`crate::limits::Port`]: connection cap, header list,
//! header-read and idle timeouts, control-frame floods). What each port answers is in [`crate::api`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::coalesce;
use crate::grpc::Body;
use crate::limits::{Activity, Port};

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// Accepts HTTP/2 connections until shutdown, then closes them gracefully.
pub(crate) async fn serve_http2<F>(
    listener: TcpListener,
    port: Arc<Port>,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> HandlerFuture + Clone + Send + Sync + 'static,
{
    let builder = port.builder();
    // Each connection's task holds a sender; all are gone when every connection ended.
    let (running, mut all_ended) = mpsc::channel::<()>(1);
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
        let Some(slot) = port.admit() else { continue };
        crate::limits::serve_tcp(&stream);
        let activity = Activity::new();
        let service = port.clone().service(activity.clone(), handler.clone());
        let (io, drain) = coalesce::coalesced(stream);
        let io = TokioIo::new(port.guard(io));
        let conn = coalesce::Flushing::new(builder.serve_connection(io, service), drain);
        let (port, shutdown, running) = (port.clone(), shutdown.clone(), running.clone());
        tokio::spawn(async move {
            port.drive(conn, |c| c.inner().graceful_shutdown(), activity, shutdown, slot, running).await;
        });
    }
    drop(listener);
    drop(running);
    if tokio::time::timeout(Duration::from_secs(10), all_ended.recv()).await.is_err() {
        tracing::warn!("connections still open 10s after shutdown");
    }
}
