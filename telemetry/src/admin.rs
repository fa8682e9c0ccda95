//! The admin HTTP port (HTTP/1.1): `/metrics`, `/healthz`, `/readyz`, `/traces/{id}`.
//!
//! The server takes an already-bound listener and a shutdown signal, like every server of
//! the mesh. What the endpoints answer comes from the [`AdminState`] callbacks.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::trace::RecentSpans;

type Callback<T> = Box<dyn Fn() -> T + Send + Sync>;

/// What the admin endpoints answer.
pub struct AdminState {
    /// The Prometheus text exposition.
    pub metrics: Callback<String>,
    /// `Ok(why ready)` or `Err(why not)`.
    pub ready: Callback<Result<String, String>>,
    /// Recent spans, for `/traces/{trace-id}`.
    pub spans: Option<RecentSpans>,
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    resp
}

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    match path {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match (state.ready)() {
            Ok(why) => text(StatusCode::OK, "text/plain", format!("ready: {why}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: {why}\n")),
        },
        "/metrics" => {
            text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", (state.metrics)())
        }
        "/traces" => {
            let ids = state.spans.as_ref().map(RecentSpans::trace_ids).unwrap_or_default();
            text(StatusCode::OK, "application/json", serde_json::to_string(&ids).unwrap_or_default())
        }
        p if p.starts_with("/traces/") => {
            let id = &p["/traces/".len()..];
            let spans = state.spans.as_ref().map(|s| s.trace(id)).unwrap_or_default();
            text(StatusCode::OK, "application/json", serde_json::to_string(&spans).unwrap_or_default())
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", format!("no such endpoint: {path}\n")),
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` turns true.
pub async fn serve_admin(listener: TcpListener, state: Arc<AdminState>, mut shutdown: watch::Receiver<bool>) {
    // Connection cap, accept back-off and header-read timeout: see `http1`.
    let mut acceptor = crate::http1::Acceptor::new(listener);
    loop {
        let (tcp, slot) = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            a = acceptor.accept() => a,
        };
        let state = state.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = route(&state, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = crate::http1::builder().serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => {}
                _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (status, body)
    }

    #[tokio::test]
    async fn endpoints_answer_from_the_callbacks() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ready.clone();
        let state = Arc::new(AdminState {
            metrics: Box::new(|| "# EOF\n".to_string()),
            ready: Box::new(move || {
                if r.load(std::sync::atomic::Ordering::Relaxed) {
                    Ok("table loaded".into())
                } else {
                    Err("no routing table yet".into())
                }
            }),
            spans: None,
        });
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve_admin(listener, state, stopped));
        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(get(addr, "/readyz").await, (503, "not ready: no routing table yet\n".into()));
        ready.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(get(addr, "/readyz").await, (200, "ready: table loaded\n".into()));
        assert_eq!(get(addr, "/metrics").await, (200, "# EOF\n".into()));
        assert_eq!(get(addr, "/nope").await.0, 404);
        stop.send(true).unwrap();
        server.await.unwrap();
    }
}
