//! The operators' web dashboard, served by the control service on its own HTTP/1.1
//! listener (`--dashboard-listen`, 127.0.0.1:7802 by default).
//!
//! The page (`assets/`, embedded in the binary, plain JavaScript modules, no build step)
//! shows a tenant's agents and instances, policies, tenants and alerts, and follows them
//! live over server-sent events (`/api/events`): each event is the tenant's whole state as
//! this replica's tenant feed ([`crate::feed`]) holds it in memory, sent when the feed's
//! head revision moves or an alert fires or resolves, at most one every
//! [`EVENT_INTERVAL`] (changes in between coalesce into the next one, never queue). So the
//! page reads no store and polls nothing. `/api/search` suggests capability and agent
//! names close to what was typed, with the code `AGENT_NOT_FOUND` uses.
//!
//! Access goes through one hook, [`Authorize`]. Until operators have tokens, the only
//! implementation is [`LoopbackOnly`]: the listener must be a loopback address (checked at
//! start) and requests must name a loopback host in `Host` (so a web page elsewhere cannot
//! reach it through DNS rebinding). The dashboard changes nothing yet: policies are shown,
//! not edited.

mod view;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent_reach::model::validate_tenant;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::alerts::Alerts;
use crate::feed::{Feed, Feeds};
use crate::registry::Registry;

/// At most one state event per stream this often.
pub const EVENT_INTERVAL: Duration = Duration::from_millis(250);
/// A comment line keeps idle event streams (and proxies in between) open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Event streams open at once, at most; more are refused with 503.
pub const MAX_EVENT_STREAMS: usize = 64;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

type Body = BoxBody<Bytes, Infallible>;

/// Why a request was refused.
#[derive(Debug)]
pub struct Denied {
    pub status: StatusCode,
    pub reason: String,
}

/// Decides who may see the dashboard. The viewer/operator tokens of the identity work plug
/// in here; the token must come in a header, never in a URL.
pub trait Authorize: Send + Sync + 'static {
    /// Whether the request may see `tenant` (empty for tenant-independent resources).
    fn may_view(&self, request: &http::request::Parts, tenant: &str) -> Result<(), Denied>;
}

/// Allows whoever reaches the loopback listener and names a loopback host (see the module
/// documentation).
pub struct LoopbackOnly;

/// Whether `host` (a `Host` header value) names this machine's loopback interface.
fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "localhost" | "[::1]") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

impl Authorize for LoopbackOnly {
    fn may_view(&self, request: &http::request::Parts, _tenant: &str) -> Result<(), Denied> {
        let host = request.headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if loopback_host(host) {
            Ok(())
        } else {
            Err(Denied {
                status: StatusCode::FORBIDDEN,
                reason: format!("the dashboard answers only to a loopback host name, not {host:?}"),
            })
        }
    }
}

/// Checks that `addr` may serve the dashboard without operator tokens.
pub fn check_listen_address(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!(
            "--dashboard-listen {addr}: the dashboard has no login yet and listens on loopback addresses only \
             (127.0.0.1, ::1); reach it remotely through an SSH tunnel or kubectl port-forward"
        ))
    }
}

/// What the dashboard reads.
pub struct Dashboard {
    pub feeds: Arc<Feeds>,
    pub registry: Arc<Registry>,
    pub alerts: Arc<Alerts>,
    pub auth: Box<dyn Authorize>,
    /// Event streams open now.
    streams: AtomicUsize,
}

impl Dashboard {
    pub fn new(feeds: Arc<Feeds>, registry: Arc<Registry>, alerts: Arc<Alerts>, auth: Box<dyn Authorize>) -> Self {
        Dashboard { feeds, registry, alerts, auth, streams: AtomicUsize::new(0) }
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(body) => full(StatusCode::OK, "application/json", body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn error(status: StatusCode, reason: &str) -> Response<Body> {
    json_status(status, &serde_json::json!({ "error": reason }))
}

fn json_status(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut response = full(status, "application/json", value.to_string());
    *response.status_mut() = status;
    response
}

/// The value of query parameter `name`, percent-decoded.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Adds the headers every answer carries: no caching of live data, no framing, no sniffing,
/// scripts and styles from this origin only.
fn harden(response: &mut Response<Body>) {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

impl Dashboard {
    /// The tenant named by `?tenant=` ("default" when absent), validated.
    fn tenant(query: Option<&str>) -> Result<String, Refusal> {
        let tenant = query_param(query, "tenant").unwrap_or_else(|| "default".to_string());
        validate_tenant("tenant", &tenant)
            .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("{}: {}", e.field, e.reason)))?;
        Ok(tenant)
    }

    async fn feed(&self, tenant: &str) -> Result<Arc<Feed>, Refusal> {
        self.feeds.get(tenant).await.map_err(|e| Refusal(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
    }

    async fn route(self: &Arc<Self>, request: Request<Incoming>, shutdown: watch::Receiver<bool>) -> Response<Body> {
        let (parts, _) = request.into_parts();
        if parts.method != http::Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "the dashboard only reads");
        }
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let tenant = match path.starts_with("/api/") && path != "/api/tenants" {
            true => match Self::tenant(query.as_deref()) {
                Ok(t) => t,
                Err(refusal) => return refusal.into(),
            },
            false => String::new(),
        };
        if let Err(denied) = self.auth.may_view(&parts, &tenant) {
            return error(denied.status, &denied.reason);
        }
        match path.as_str() {
            "/" | "/index.html" => full(StatusCode::OK, "text/html; charset=utf-8", INDEX_HTML),
            "/assets/app.js" => full(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS),
            "/assets/style.css" => full(StatusCode::OK, "text/css; charset=utf-8", STYLE_CSS),
            "/api/tenants" => match self.registry.list_tenants().await {
                Ok(records) => {
                    let mut names: Vec<String> = records.into_iter().map(|(t, _)| t.name).collect();
                    if !names.iter().any(|n| n == "default") {
                        names.insert(0, "default".to_string());
                    }
                    json(&view::tenants(&names))
                }
                Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
            },
            "/api/state" => match self.feed(&tenant).await {
                Ok(feed) => json(&view::state(&tenant, &feed, &self.alerts)),
                Err(refusal) => refusal.into(),
            },
            "/api/search" => match self.feed(&tenant).await {
                Ok(feed) => {
                    let q = query_param(query.as_deref(), "q").unwrap_or_default();
                    json(&view::search(&feed, &q))
                }
                Err(refusal) => refusal.into(),
            },
            "/api/events" => self.events(tenant, shutdown).await,
            _ => error(StatusCode::NOT_FOUND, &format!("no such page: {path}")),
        }
    }

    /// The server-sent event stream of one tenant (see the module documentation).
    async fn events(self: &Arc<Self>, tenant: String, mut shutdown: watch::Receiver<bool>) -> Response<Body> {
        if self.streams.fetch_add(1, Ordering::Relaxed) >= MAX_EVENT_STREAMS {
            self.streams.fetch_sub(1, Ordering::Relaxed);
            return error(StatusCode::SERVICE_UNAVAILABLE, "too many dashboard event streams open");
        }
        let guard = StreamGuard(self.clone());
        let feed = match self.feed(&tenant).await {
            Ok(feed) => feed,
            Err(refusal) => return refusal.into(),
        };
        let mut head = feed.subscribe();
        let mut alerts = self.alerts.subscribe();
        let dashboard = self.clone();
        let stream = async_stream(move |tx| async move {
            let _guard = guard;
            let mut first = true;
            loop {
                if !first {
                    tokio::select! {
                        _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                        changed = head.changed() => if changed.is_err() { return },
                        changed = alerts.changed() => if changed.is_err() { return },
                        _ = tokio::time::sleep(KEEP_ALIVE) => {
                            if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() { return }
                            continue;
                        }
                    }
                }
                first = false;
                head.borrow_and_update();
                alerts.borrow_and_update();
                let state = view::state(&tenant, &feed, &dashboard.alerts);
                let Ok(data) = serde_json::to_string(&state) else { return };
                let event = format!("id: {}\nevent: state\ndata: {data}\n\n", state.revision);
                if tx.send(Bytes::from(event)).await.is_err() {
                    return;
                }
                // Coalesce what changes next into one event.
                tokio::select! {
                    _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                    _ = tokio::time::sleep(EVENT_INTERVAL) => {}
                }
            }
        });
        let body = StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b))));
        let mut response = Response::new(BodyExt::boxed(body));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        response
    }
}

/// A request refused with a status and why.
struct Refusal(StatusCode, String);

impl From<Refusal> for Response<Body> {
    fn from(r: Refusal) -> Self {
        error(r.0, &r.1)
    }
}

/// Counts an open event stream until dropped.
struct StreamGuard(Arc<Dashboard>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream of what `produce` sends, ending when it returns (or the stream is dropped).
fn async_stream<F, Fut>(produce: F) -> impl futures_util::Stream<Item = Bytes> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // One event in flight: a slow browser holds back this stream only.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(produce(tx));
    let abort = task.abort_handle();
    futures_util::stream::unfold((rx, AbortOnDrop(abort)), |(mut rx, guard)| async move {
        let item = rx.recv().await?;
        Some((item, (rx, guard)))
    })
}

/// Stops the producing task when the browser goes away.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves the dashboard on `listener` until `shutdown` turns true; every event stream ends
/// then.
pub async fn serve(listener: TcpListener, dashboard: Arc<Dashboard>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let dashboard = dashboard.clone();
        let mut stop = shutdown.clone();
        let streams_stop = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let dashboard = dashboard.clone();
                let stop = streams_stop.clone();
                async move {
                    let mut response = dashboard.route(request, stop).await;
                    harden(&mut response);
                    Ok::<_, Infallible>(response)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => {}
                _ = agent_reach_support::process::stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_and_addresses() {
        for host in ["127.0.0.1:7802", "localhost:7802", "[::1]:7802", "localhost", "127.0.0.2"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in ["evil.example:7802", "10.0.0.1:7802", "", "localhost.evil.example", "127.0.0.1.nip.io:80"] {
            assert!(!loopback_host(host), "{host}");
        }
        assert!(check_listen_address("127.0.0.1:7802".parse().unwrap()).is_ok());
        assert!(check_listen_address("[::1]:7802".parse().unwrap()).is_ok());
        let refused = check_listen_address("0.0.0.0:7802".parse().unwrap()).unwrap_err();
        assert!(refused.contains("--dashboard-listen"), "{refused}");
    }

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(query_param(Some("tenant=a-b&q=text.tr%61nslate"), "q").as_deref(), Some("text.translate"));
        assert_eq!(query_param(Some("tenant=a-b&q=x+y"), "q").as_deref(), Some("x y"));
        assert_eq!(query_param(Some("q=%zz%4"), "q").as_deref(), Some("%zz%4"));
        assert_eq!(query_param(None, "q"), None);
    }
}
