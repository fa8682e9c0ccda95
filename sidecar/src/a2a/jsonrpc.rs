//! The JSON-RPC 2.0 binding over HTTP/1.1 on a local port (default 127.0.0.1:7703):
//! `POST /agents/{agent}` (or `POST /` with the agent in `params.tenant`) takes the A2A
//! methods; `SendStreamingMessage` and `SubscribeToTask` answer server-sent events. Agent
//! cards are at `GET /agents/{agent}/.well-known/agent-card.json`. Messages are the protobuf
//! JSON mapping of `lf.a2a.v1`. The W3C trace context headers travel with the mesh call.
//!
//! With a local API token configured (`--local-token-file`), every request must carry it in
//! the `ar-api-token` header, as on the local gRPC port; without it the answer is HTTP 401
//! with the mesh's UNAUTHENTICATED error (a JSON-RPC error object).
//!
//! Limits: a request body is at most the sidecar's payload limit plus room for the JSON
//! envelope and base64, and its headers must arrive within 10 s.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::proto::StreamResponse;
use super::{A2a, A2aError};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Headers of the HTTP request that travel with the mesh call.
const FORWARDED: [&str; 3] = ["traceparent", "tracestate", agent_reach::headers::TRACE];
/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the binding on `listener` until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    a2a: Arc<A2a>,
    body_limit: usize,
    token: Option<crate::local_access::ApiToken>,
    mut shutdown: watch::Receiver<bool>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let accepted = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("A2A JSON-RPC accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (a2a, token) = (a2a.clone(), token.clone());
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let a2a = a2a.clone();
            let refused = token.as_ref().and_then(|t| t.check(req.uri().path(), req.headers()).err());
            async move {
                Ok::<_, Infallible>(match refused {
                    Some(status) => {
                        json_response(StatusCode::UNAUTHORIZED, error_body(Value::Null, &A2aError::Mesh(status)))
                    }
                    None => handle(a2a, req, body_limit).await,
                })
            }
        });
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("A2A JSON-RPC connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await.is_err() {
        tracing::warn!("A2A JSON-RPC connections still open 10s after shutdown");
    }
}

async fn handle(a2a: Arc<A2a>, req: Request<Incoming>, body_limit: usize) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["agents", agent, ".well-known", "agent-card.json"]) => match a2a.card(agent) {
            Ok(card) => json_response(StatusCode::OK, serde_json::to_value(&card).unwrap_or_default()),
            Err(e) => {
                let code = match &e {
                    A2aError::Mesh(s) if s.code() == tonic::Code::NotFound => StatusCode::NOT_FOUND,
                    _ => StatusCode::BAD_REQUEST,
                };
                json_response(code, json!({"error": e.to_jsonrpc()}))
            }
        },
        (&Method::POST, []) => rpc(a2a, None, req, body_limit).await,
        (&Method::POST, ["agents", agent]) => {
            let agent = agent.to_string();
            rpc(a2a, Some(agent), req, body_limit).await
        }
        (_, []) | (_, ["agents", _]) | (_, ["agents", _, ".well-known", "agent-card.json"]) => {
            json_response(StatusCode::METHOD_NOT_ALLOWED, json!({"error": "method not allowed"}))
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no such path {path:?}; agent cards are at /agents/{{agent}}/.well-known/agent-card.json")}),
        ),
    }
}

/// One JSON-RPC request.
async fn rpc(a2a: Arc<A2a>, agent: Option<String>, req: Request<Incoming>, body_limit: usize) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, body_limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let too_large = e.downcast_ref::<http_body_util::LengthLimitError>().is_some();
            let error = if too_large {
                A2aError::InvalidRequest(format!("the request body is over {body_limit} bytes"))
            } else {
                A2aError::InvalidRequest(format!("reading the request: {e}"))
            };
            let status = if too_large { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
            return json_response(status, error_body(Value::Null, &error));
        }
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return rpc_error(Value::Null, &A2aError::ParseError(format!("not JSON: {e}"))),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return rpc_error(Value::Null, &A2aError::InvalidRequest("id must be a string, a number or null".into()));
    }
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return rpc_error(id, &A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into()));
    }
    let Some(method) = request.get("method").and_then(Value::as_str).map(str::to_string) else {
        return rpc_error(id, &A2aError::InvalidRequest("method must be a string".into()));
    };
    let mut params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    if let Some(agent) = &agent {
        let Some(obj) = params.as_object_mut() else {
            return rpc_error(id, &A2aError::InvalidParams("params must be an object".into()));
        };
        match obj.get("tenant").and_then(Value::as_str) {
            None | Some("") => {
                obj.insert("tenant".into(), Value::String(agent.clone()));
            }
            Some(t) if t == agent => {}
            Some(t) => {
                return rpc_error(
                    id,
                    &A2aError::InvalidParams(format!("params.tenant {t:?} is not the agent of the path ({agent:?})")),
                );
            }
        }
    }
    let headers = forwarded(&parts.headers);
    let result = match method.as_str() {
        "SendMessage" => match parse(params) {
            Ok(r) => a2a.send(r, headers).await.and_then(to_json),
            Err(e) => Err(e),
        },
        "SendStreamingMessage" => {
            let events = match parse(params) {
                Ok(r) => a2a.send_streaming(r, headers).await,
                Err(e) => Err(e),
            };
            return match events {
                Ok(events) => sse(id, events),
                Err(e) => rpc_error(id, &e),
            };
        }
        "SubscribeToTask" => {
            let events = match parse(params) {
                Ok(r) => a2a.subscribe(r, headers).await,
                Err(e) => Err(e),
            };
            return match events {
                Ok(events) => sse(id, events),
                Err(e) => rpc_error(id, &e),
            };
        }
        "GetTask" => match parse(params) {
            Ok(r) => a2a.get_task(r, headers).await.and_then(to_json),
            Err(e) => Err(e),
        },
        "ListTasks" => match parse(params) {
            Ok(r) => a2a.list_tasks(r, headers).await.and_then(to_json),
            Err(e) => Err(e),
        },
        "CancelTask" => match parse(params) {
            Ok(r) => a2a.cancel_task(r, headers).await.and_then(to_json),
            Err(e) => Err(e),
        },
        "GetExtendedAgentCard" => parse::<super::proto::GetExtendedAgentCardRequest>(params)
            .and_then(|r| a2a.card(&r.tenant))
            .and_then(to_json),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(A2aError::PushNotificationNotSupported),
        other => Err(A2aError::MethodNotFound(other.to_string())),
    };
    match result {
        Ok(result) => json_response(StatusCode::OK, json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Err(e) => rpc_error(id, &e),
    }
}

fn parse<T: DeserializeOwned>(params: Value) -> Result<T, A2aError> {
    serde_json::from_value(params).map_err(|e| A2aError::InvalidParams(format!("params: {e}")))
}

fn to_json<T: serde::Serialize>(value: T) -> Result<Value, A2aError> {
    serde_json::to_value(value).map_err(|e| A2aError::Internal(format!("encoding the result: {e}")))
}

fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in FORWARDED {
        if let Some(v) = headers.get(name) {
            out.insert(name, v.clone());
        }
    }
    out
}

/// Server-sent events, one JSON-RPC response per event.
fn sse(id: Value, events: impl futures_util::Stream<Item = StreamResponse> + Send + 'static) -> Response<Body> {
    let frames = events.map(move |e| {
        let event = json!({"jsonrpc": "2.0", "id": id, "result": serde_json::to_value(&e).unwrap_or_default()});
        Ok::<_, Infallible>(Frame::data(Bytes::from(format!("data: {event}\n\n"))))
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    resp.headers_mut().insert(header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    resp
}

fn error_body(id: Value, e: &A2aError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": e.to_jsonrpc()})
}

/// A JSON-RPC error answer (HTTP 200, as JSON-RPC over HTTP answers errors).
fn rpc_error(id: Value, e: &A2aError) -> Response<Body> {
    json_response(StatusCode::OK, error_body(id, e))
}

fn json_response(status: StatusCode, body: Value) -> Response<Body> {
    let mut resp = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(body.to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}
