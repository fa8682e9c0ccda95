//! The operators' web dashboard, served by the control service on its own HTTP/1.1
//! listener (`--dashboard-listen`, 127.0.0.1:7802 by default).
//!
//! The page (`assets/`, embedded in the binary, plain JavaScript modules, no build step)
//! shows a tenant's agents and instances, the call topology, recent traces, policies,
//! tenants and alerts, and follows them live over server-sent events (`/api/events`): each
//! event is the tenant's whole state as this replica's tenant feed ([`crate::feed`]) holds
//! it in memory, sent when the feed's head revision moves, an alert fires or resolves, or
//! a sidecar's traffic report ([`crate::reports`]) arrives, at most one every
//! [`EVENT_INTERVAL`] (changes in between coalesce into the next one, never queue). So the
//! page reads no store and polls nothing. The call topology, the instances' last
//! heartbeats and the open breakers come from the sidecars' reports, which every replica
//! follows, so the page of any replica shows the whole mesh; `/api/traces?q=` finds recent
//! traces by trace id or session id in the reports' span summaries. `/api/search` suggests
//! capability and agent names close to what was typed, with the code `AGENT_NOT_FOUND`
//! uses. With `--dashboard-trace-url`, `/api/session` names the tracing backend's URL
//! template and the traces view links each trace there.
//!
//! Access: [`auth`]. Without operator tokens the dashboard is loopback-only and changes
//! nothing; with them, people log in with their token (kept in an HttpOnly cookie), viewers
//! see, and operators also validate and save policies (`POST /api/policies/validate`,
//! `POST /api/policies`), which reach the sidecars through the store like an Admin change.

pub mod auth;
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

use self::auth::{Access, Caller, Denied};
use crate::alerts::Alerts;
use crate::feed::{Feed, Feeds};
use crate::identity::{Action, operators};
use crate::registry::Registry;
use crate::reports::Reports;

/// At most one state event per stream this often.
pub const EVENT_INTERVAL: Duration = Duration::from_millis(250);
/// A comment line keeps idle event streams (and proxies in between) open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// An open event stream checks its token again this often.
const RECHECK: Duration = Duration::from_secs(15);
/// Largest request body (a login, a policy).
const MAX_BODY: usize = 64 * 1024;
/// Event streams open at once, at most; more are refused with 503.
pub const MAX_EVENT_STREAMS: usize = 64;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

type Body = BoxBody<Bytes, Infallible>;

/// Checks that `addr` may serve the dashboard without operator tokens (with them, any
/// address may).
pub fn check_listen_address(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!(
            "--dashboard-listen {addr}: without operator tokens (--admin-token-file) the dashboard has no login and \
             listens on loopback addresses only (127.0.0.1, ::1); reach it remotely through an SSH tunnel or \
             kubectl port-forward, or give control operator tokens"
        ))
    }
}

/// What the dashboard reads.
pub struct Dashboard {
    pub feeds: Arc<Feeds>,
    pub registry: Arc<Registry>,
    pub alerts: Arc<Alerts>,
    /// Every sidecar's traffic report, whichever replica it talks to.
    pub reports: Arc<Reports>,
    pub access: Access,
    /// The tracing backend's URL template (`--dashboard-trace-url`, with `{trace_id}`), for
    /// the page's link from each trace; `None`: no link.
    pub trace_url: Option<String>,
    /// Event streams open now.
    streams: AtomicUsize,
}

impl Dashboard {
    pub fn new(
        feeds: Arc<Feeds>,
        registry: Arc<Registry>,
        alerts: Arc<Alerts>,
        reports: Arc<Reports>,
        access: Access,
    ) -> Self {
        Dashboard { feeds, registry, alerts, reports, access, trace_url: None, streams: AtomicUsize::new(0) }
    }

    /// Links each trace of the traces view to `template` (a validated
    /// [`crate::config::trace_url_template`]); `None`: no link.
    pub fn with_trace_url(mut self, template: Option<String>) -> Self {
        self.trace_url = template;
        self
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

/// A JSON document already written.
fn json_text(body: String) -> Response<Body> {
    full(StatusCode::OK, "application/json", body)
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

/// Whether the request says its body is JSON.
fn json_body(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes.
async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, Refusal> {
    let bytes = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| Refusal(StatusCode::PAYLOAD_TOO_LARGE, format!("bodies are at most {MAX_BODY} bytes")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("not the JSON expected: {e}")))
}

/// A policy of `tenant` from a JSON body (`kind`, `name`, `spec`, `description`),
/// validated.
async fn policy_body(body: Incoming, tenant: &str) -> Result<agent_reach::policy::Policy, Refusal> {
    let mut value: serde_json::Value = read_json(body).await?;
    let Some(object) = value.as_object_mut() else {
        return Err(Refusal(StatusCode::BAD_REQUEST, "a policy is a JSON object".into()));
    };
    object.insert("tenant".into(), serde_json::Value::String(tenant.to_string()));
    object.remove("revision");
    let policy: agent_reach::policy::Policy =
        serde_json::from_value(value).map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("not a policy: {e}")))?;
    policy.validate().map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("{}: {}", e.field, e.reason)))?;
    Ok(policy)
}

/// What `/api/session` and a login answer; `trace_url` is the tracing backend's URL
/// template the traces view links to (`null` without one).
fn session_view(caller: &Caller, login: bool, trace_url: Option<&str>) -> serde_json::Value {
    let who = caller.principal();
    serde_json::json!({
        "authenticated": true,
        "login": login,
        "name": who.name,
        "role": who.role.as_str(),
        "tenants": who.tenants,
        "may_edit": matches!(caller, Caller::Operator(..)) && who.role >= crate::identity::Role::Operator,
        "trace_url": trace_url,
    })
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
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let get = parts.method == http::Method::GET;
        let post = parts.method == http::Method::POST;
        // The page itself holds no data: anyone who may reach the listener gets it (in
        // loopback mode, only under a loopback host name).
        let page = match path.as_str() {
            "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX_HTML)),
            "/assets/app.js" => Some(("text/javascript; charset=utf-8", APP_JS)),
            "/assets/style.css" => Some(("text/css; charset=utf-8", STYLE_CSS)),
            _ => None,
        };
        if let Some((content_type, text)) = page {
            if !get {
                return error(StatusCode::METHOD_NOT_ALLOWED, "pages are only read");
            }
            if !self.access.has_login()
                && let Err(denied) = self.access.caller(&parts.headers).await
            {
                return error(denied.status, &denied.reason);
            }
            return full(StatusCode::OK, content_type, text);
        }
        if post && !json_body(&parts.headers) {
            return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "changes are sent as application/json");
        }
        match (post, path.as_str()) {
            (true, "/api/login") => return self.login(body).await,
            (true, "/api/logout") => {
                let mut response = json(&serde_json::json!({ "logged_out": true }));
                response.headers_mut().insert(header::SET_COOKIE, Access::logout_cookie());
                return response;
            }
            (false, "/api/session") if get => return self.session(&parts.headers).await,
            _ => {}
        }
        let caller = match self.access.caller(&parts.headers).await {
            Ok(caller) => caller,
            Err(denied) => return error(denied.status, &denied.reason),
        };
        if path == "/api/tenants" {
            if !get {
                return error(StatusCode::METHOD_NOT_ALLOWED, "tenants are only read here");
            }
            return match self.registry.list_tenants().await {
                Ok(records) => {
                    let mut names: Vec<String> = records.into_iter().map(|(t, _)| t.name).collect();
                    if !names.iter().any(|n| n == "default") {
                        names.insert(0, "default".to_string());
                    }
                    names.retain(|n| caller.sees(n));
                    json(&view::tenants(&names))
                }
                Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
            };
        }
        if !path.starts_with("/api/") {
            return error(StatusCode::NOT_FOUND, &format!("no such page: {path}"));
        }
        let tenant = match Self::tenant(query.as_deref()) {
            Ok(t) => t,
            Err(refusal) => return refusal.into(),
        };
        let action = if post { Action::Change } else { Action::Read };
        if !get && !post {
            return error(StatusCode::METHOD_NOT_ALLOWED, "the dashboard reads with GET and changes with POST");
        }
        if let Err(denied) = caller.may(action, Some(&tenant)) {
            return error(denied.status, &denied.reason);
        }
        match (post, path.as_str()) {
            (false, "/api/state") => match self.feed(&tenant).await {
                Ok(feed) => match self.state_json(&tenant, &feed).await {
                    Some((_, data)) => json_text(data),
                    None => error(StatusCode::INTERNAL_SERVER_ERROR, "the tenant's state could not be written"),
                },
                Err(refusal) => refusal.into(),
            },
            (false, "/api/search") => match self.feed(&tenant).await {
                Ok(feed) => {
                    let q = query_param(query.as_deref(), "q").unwrap_or_default();
                    // Reads every name of the tenant: off the runtime's workers, as the state.
                    match tokio::task::spawn_blocking(move || view::search(&feed, &q)).await {
                        Ok(found) => json(&found),
                        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the search failed"),
                    }
                }
                Err(refusal) => refusal.into(),
            },
            (false, "/api/traces") => {
                let q = query_param(query.as_deref(), "q").unwrap_or_default();
                // Reads every span summary the tenant's sidecars reported: off the workers.
                let reports = self.reports.clone();
                match tokio::task::spawn_blocking(move || view::traces(&reports.tenant(&tenant), &q)).await {
                    Ok(found) => json(&found),
                    Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the trace search failed"),
                }
            }
            (false, "/api/events") => self.events(tenant, caller, shutdown).await,
            // Validating answers whether the policy is valid; only saving refuses one.
            (true, "/api/policies/validate") => match policy_body(body, &tenant).await {
                Ok(policy) => json(&serde_json::json!({ "valid": true, "policy": policy })),
                Err(Refusal(status, why)) if status == StatusCode::BAD_REQUEST => {
                    json(&serde_json::json!({ "valid": false, "error": why }))
                }
                Err(refusal) => refusal.into(),
            },
            (true, "/api/policies") => {
                let policy = match policy_body(body, &tenant).await {
                    Ok(policy) => policy,
                    Err(refusal) => return refusal.into(),
                };
                let what = format!("PutPolicy {}/{} (dashboard)", policy.kind.as_str(), policy.name);
                let result = self.registry.put_policy(&policy).await;
                operators::audit(&caller.principal(), &what, &tenant, &result);
                match result {
                    Ok(revision) => json(&serde_json::json!({ "revision": revision, "policy": policy })),
                    Err(e) => error(Denied::from(e).status, "the policy could not be stored"),
                }
            }
            (true, "/api/policies/delete") => self.delete_policy(body, &tenant, &caller).await,
            (true, _) => error(StatusCode::NOT_FOUND, &format!("nothing to change at {path}")),
            (false, _) => error(StatusCode::NOT_FOUND, &format!("no such page: {path}")),
        }
    }

    /// `POST /api/policies/delete` with `{"kind", "name"}`: removes the policy (operators).
    async fn delete_policy(&self, body: Incoming, tenant: &str, caller: &Caller) -> Response<Body> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Delete {
            kind: agent_reach::policy::PolicyKind,
            name: String,
        }
        let delete: Delete = match read_json(body).await {
            Ok(delete) => delete,
            Err(refusal) => return refusal.into(),
        };
        let what = format!("DeletePolicy {}/{} (dashboard)", delete.kind.as_str(), delete.name);
        let result = self.registry.delete_policy(tenant, delete.kind, &delete.name).await;
        operators::audit(&caller.principal(), &what, tenant, &result);
        match result {
            Ok(revision) => {
                json(&serde_json::json!({ "revision": revision, "kind": delete.kind, "name": delete.name }))
            }
            Err(e) => {
                let denied = Denied::from(e);
                error(denied.status, &denied.reason)
            }
        }
    }

    /// `POST /api/login` with `{"token": "..."}`: sets the session cookie.
    async fn login(&self, body: Incoming) -> Response<Body> {
        #[derive(serde::Deserialize)]
        struct Login {
            token: String,
        }
        let login: Login = match read_json(body).await {
            Ok(login) => login,
            Err(refusal) => return refusal.into(),
        };
        match self.access.login(&login.token).await {
            Ok((who, cookie)) => {
                tracing::info!(target: "audit", who = %who.name, role = who.role.as_str(), "dashboard login");
                let mut response =
                    json(&session_view(&Caller::Operator(who, String::new()), true, self.trace_url.as_deref()));
                response.headers_mut().insert(header::SET_COOKIE, cookie);
                response
            }
            Err(denied) => {
                tracing::info!(target: "audit", status = denied.status.as_u16(), "dashboard login refused");
                error(denied.status, &denied.reason)
            }
        }
    }

    /// `GET /api/session`: who is logged in, and whether a login is needed.
    async fn session(&self, headers: &http::HeaderMap) -> Response<Body> {
        match self.access.caller(headers).await {
            Ok(caller) => json(&session_view(&caller, self.access.has_login(), self.trace_url.as_deref())),
            Err(denied) if denied.status == StatusCode::UNAUTHORIZED => {
                json(&serde_json::json!({ "authenticated": false, "login": true }))
            }
            Err(denied) => error(denied.status, &denied.reason),
        }
    }

    /// The tenant's state ([`view::state`]): its revision and its JSON. Built on a
    /// blocking thread: for a large tenant it takes tens of milliseconds of CPU
    /// (10,000 instances: a 6.7 MiB document), which on a runtime worker would hold up the
    /// feed's events and every sidecar's deltas behind it, for each open dashboard every
    /// [`EVENT_INTERVAL`]. `None` when it could not be written.
    async fn state_json(self: &Arc<Self>, tenant: &str, feed: &Arc<Feed>) -> Option<(i64, String)> {
        let (me, tenant, feed) = (self.clone(), tenant.to_string(), feed.clone());
        tokio::task::spawn_blocking(move || {
            let state = view::state(&tenant, &feed, &me.alerts, &me.reports);
            Some((state.revision, serde_json::to_string(&state).ok()?))
        })
        .await
        .ok()
        .flatten()
    }

    /// The server-sent event stream of one tenant (see the module documentation).
    async fn events(
        self: &Arc<Self>,
        tenant: String,
        caller: Caller,
        mut shutdown: watch::Receiver<bool>,
    ) -> Response<Body> {
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
        let mut reports = self.reports.subscribe();
        let dashboard = self.clone();
        let stream = async_stream(move |tx| async move {
            let _guard = guard;
            let mut first = true;
            let mut checked = tokio::time::Instant::now();
            loop {
                // A token revoked or expired since the stream opened ends it.
                if checked.elapsed() >= RECHECK {
                    if dashboard.access.recheck(&caller).await.is_err() {
                        return;
                    }
                    checked = tokio::time::Instant::now();
                }
                if !first {
                    tokio::select! {
                        _ = agent_reach_support::process::stopped(&mut shutdown) => return,
                        changed = head.changed() => if changed.is_err() { return },
                        changed = alerts.changed() => if changed.is_err() { return },
                        changed = reports.changed() => if changed.is_err() { return },
                        _ = tokio::time::sleep(KEEP_ALIVE) => {
                            if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() { return }
                            continue;
                        }
                    }
                }
                first = false;
                head.borrow_and_update();
                alerts.borrow_and_update();
                reports.borrow_and_update();
                let Some((revision, data)) = dashboard.state_json(&tenant, &feed).await else { return };
                let event = format!("id: {revision}\nevent: state\ndata: {data}\n\n");
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
    // Connection cap, accept back-off and header-read timeout (see the telemetry crate's
    // `http1`).
    let mut acceptor = agent_reach_telemetry::http1::Acceptor::new(listener);
    loop {
        let (tcp, slot) = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            a = acceptor.accept() => a,
        };
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
            let conn = agent_reach_telemetry::http1::builder().serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => {}
                _ = agent_reach_support::process::stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_without_tokens() {
        assert!(check_listen_address("127.0.0.1:7802".parse().unwrap()).is_ok());
        assert!(check_listen_address("[::1]:7802".parse().unwrap()).is_ok());
        let refused = check_listen_address("0.0.0.0:7802".parse().unwrap()).unwrap_err();
        assert!(refused.contains("--dashboard-listen"), "{refused}");
    }

    #[test]
    fn the_session_names_the_trace_url_template_or_null() {
        let with = session_view(&Caller::Loopback, false, Some("http://jaeger:16686/trace/{trace_id}"));
        assert_eq!(with["trace_url"], "http://jaeger:16686/trace/{trace_id}");
        assert_eq!(with["may_edit"], false);
        let without = session_view(&Caller::Loopback, false, None);
        assert_eq!(without["trace_url"], serde_json::Value::Null);
    }

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(query_param(Some("tenant=a-b&q=text.tr%61nslate"), "q").as_deref(), Some("text.translate"));
        assert_eq!(query_param(Some("tenant=a-b&q=x+y"), "q").as_deref(), Some("x y"));
        assert_eq!(query_param(Some("q=%zz%4"), "q").as_deref(), Some("%zz%4"));
        assert_eq!(query_param(None, "q"), None);
    }
}
