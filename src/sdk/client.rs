//! [`Client`]: calls agents by capability or name through the local sidecar.
//!
//! Errors come back as [`InvokeError`], which exposes the gRPC code and the mesh's
//! machine-readable reason (e.g. `AGENT_NOT_FOUND` with suggestions). The client does not
//! retry: the caller's sidecar already retries on another instance where that is safe.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tonic::transport::{Channel, Endpoint};

use crate::headers;
use crate::model::{Priority, Target};
use crate::proto;
use crate::proto::sidecar_client::SidecarClient;
use crate::reason::{self, ErrorInfo, Reason};

/// A connection to a sidecar's local API. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    sidecar: SidecarClient<Channel>,
    caller: Option<proto::Caller>,
}

impl Client {
    /// Connects to the local sidecar (`AGENT_REACH_SIDECAR`, default 127.0.0.1:7700).
    pub async fn connect_local() -> Result<Client, InvokeError> {
        Client::connect(&super::default_sidecar_addr()).await
    }

    /// Connects to a sidecar at `addr` ("host:port" or "http://host:port").
    pub async fn connect(addr: &str) -> Result<Client, InvokeError> {
        let channel = endpoint(addr)?.connect().await.map_err(|e| {
            InvokeError::local(Reason::SidecarUnreachable, format!("cannot connect to sidecar at {addr}: {e}"))
        })?;
        Ok(Client { sidecar: SidecarClient::new(channel), caller: None })
    }

    /// A client that connects on first use (and reconnects after failures).
    pub fn lazy(addr: &str) -> Result<Client, InvokeError> {
        Ok(Client { sidecar: SidecarClient::new(endpoint(addr)?.connect_lazy()), caller: None })
    }

    /// The same connection, with calls marked as made by `agent` / `instance_id`.
    pub fn with_caller(&self, agent: &str, instance_id: &str) -> Client {
        Client {
            sidecar: self.sidecar.clone(),
            caller: Some(proto::Caller { agent: agent.to_string(), instance_id: instance_id.to_string() }),
        }
    }

    /// Starts a call to any instance offering `capability`.
    pub fn invoke(&self, capability: impl Into<String>) -> InvokeBuilder {
        self.call(Target::capability(capability))
    }

    /// Starts a call to an instance of the agent named `agent`.
    pub fn invoke_agent(&self, agent: impl Into<String>) -> InvokeBuilder {
        self.call(Target::agent(agent))
    }

    fn call(&self, target: Target) -> InvokeBuilder {
        InvokeBuilder {
            client: self.clone(),
            request: proto::InvokeRequest {
                target: Some(target.into()),
                caller: self.caller.clone(),
                ..Default::default()
            },
            timeout: None,
            headers: Vec::new(),
        }
    }

    /// Asks the sidecar where a call to `target` would go, without making it.
    pub async fn route(&self, target: Target, max_candidates: u32) -> Result<proto::RouteReply, InvokeError> {
        let request = proto::RouteRequest { target: Some(target.into()), max_candidates, ..Default::default() };
        let mut sidecar = self.sidecar.clone();
        Ok(sidecar.route(request).await.map_err(InvokeError::from)?.into_inner())
    }

    /// The generated client, for RPCs this wrapper does not cover.
    pub fn raw(&self) -> SidecarClient<Channel> {
        self.sidecar.clone()
    }
}

fn endpoint(addr: &str) -> Result<Endpoint, InvokeError> {
    Endpoint::from_shared(super::with_scheme(addr))
        .map(|e| e.tcp_nodelay(true).connect_timeout(Duration::from_secs(5)))
        .map_err(|e| InvokeError::local(Reason::InvalidArgument, format!("bad sidecar address {addr:?}: {e}")))
}

/// A call being built. Finish with [`send`](InvokeBuilder::send) or
/// [`send_stream`](InvokeBuilder::send_stream).
#[must_use = "a call is only made by send() or send_stream()"]
pub struct InvokeBuilder {
    client: Client,
    request: proto::InvokeRequest,
    timeout: Option<Duration>,
    headers: Vec<(&'static str, String)>,
}

impl InvokeBuilder {
    /// Requires the chosen instance to carry all these tags.
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Some(t) = self.request.target.as_mut() {
            t.tags.extend(tags.into_iter().map(Into::into));
        }
        self
    }
    /// The session the call belongs to.
    pub fn session(mut self, session_id: impl Into<String>) -> Self {
        self.request.session_id = session_id.into();
        self
    }
    pub fn priority(mut self, priority: Priority) -> Self {
        self.request.priority = proto::Priority::from(priority) as i32;
        self
    }
    /// The call's deadline, propagated through every hop.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    pub fn payload(mut self, payload: impl Into<Bytes>) -> Self {
        self.request.payload = payload.into();
        self
    }
    /// A UTF-8 text payload (content type `text/plain`).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.request.payload = Bytes::from(text.into());
        self.request.content_type = "text/plain; charset=utf-8".into();
        self
    }
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.request.content_type = content_type.into();
        self
    }
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.metadata.insert(key.into(), value.into());
        self
    }
    /// Calls with the same key are safe to retry (and, with governance, run at most once).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.request.idempotency_key = key.into();
        self
    }
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.request.message_id = id.into();
        self
    }
    /// Continues the trace of `call` (a call this agent is handling), so a chain of agents
    /// is one trace.
    pub fn within(self, call: &crate::Call) -> Self {
        match call.traceparent() {
            Some(tp) => self.traceparent(tp),
            None => self,
        }
    }
    /// The W3C trace context the call belongs to.
    pub fn traceparent(mut self, traceparent: &str) -> Self {
        self.headers.push(("traceparent", traceparent.to_string()));
        self
    }
    /// Traces this call and everything it leads to, whatever the sidecars' sampling ratio.
    pub fn force_trace(mut self) -> Self {
        self.headers.push((headers::TRACE, headers::TRACE_FORCE.to_string()));
        self
    }

    fn into_request(self) -> (SidecarClient<Channel>, tonic::Request<proto::InvokeRequest>) {
        let mut request = tonic::Request::new(self.request);
        if let Some(t) = self.timeout {
            request.set_timeout(t);
        }
        for (name, value) in self.headers {
            if let Ok(v) = value.parse() {
                request.metadata_mut().insert(name, v);
            }
        }
        (self.client.sidecar, request)
    }

    /// Makes the call and waits for the answer.
    pub async fn send(self) -> Result<InvokeReply, InvokeError> {
        let (mut sidecar, request) = self.into_request();
        let reply = sidecar.invoke(request).await?;
        let header =
            |name: &str| reply.metadata().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let (route, trace_id) = (header(headers::ROUTE), header(headers::TRACE_ID));
        Ok(InvokeReply { inner: reply.into_inner(), route, trace_id })
    }

    /// Makes the call and returns the stream of answer chunks.
    pub async fn send_stream(self) -> Result<ChunkStream, InvokeError> {
        let (mut sidecar, request) = self.into_request();
        let response = sidecar.invoke_stream(request).await?;
        let instance =
            response.metadata().get(headers::INSTANCE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        Ok(ChunkStream { inner: response.into_inner(), instance })
    }
}

/// The answer to a call.
#[derive(Clone, Debug, PartialEq)]
pub struct InvokeReply {
    inner: proto::InvokeReply,
    route: String,
    trace_id: String,
}

impl InvokeReply {
    pub fn payload(&self) -> &Bytes {
        &self.inner.payload
    }
    /// The payload as UTF-8 text (lossy).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.inner.payload)
    }
    pub fn content_type(&self) -> &str {
        &self.inner.content_type
    }
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.inner.metadata
    }
    /// The instance that served the call.
    pub fn instance(&self) -> &str {
        &self.inner.instance_id
    }
    pub fn agent(&self) -> &str {
        &self.inner.agent
    }
    pub fn agent_version(&self) -> &str {
        &self.inner.agent_version
    }
    /// Attempts the caller's sidecar made (2 when the call was retried on another instance).
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }
    /// The trace the call was recorded in, when it was traced.
    pub fn trace_id(&self) -> Option<&str> {
        (!self.trace_id.is_empty()).then_some(self.trace_id.as_str())
    }
    /// The routing digest (strategy, target, instance, attempt) from the reply's metadata.
    pub fn route(&self) -> &str {
        &self.route
    }
    /// When a fallback served the call: the target that could not (e.g. "capability x").
    pub fn fallback_from(&self) -> Option<&str> {
        (!self.inner.fallback_from.is_empty()).then_some(self.inner.fallback_from.as_str())
    }
    pub fn into_proto(self) -> proto::InvokeReply {
        self.inner
    }
}

/// The chunks of a streamed answer.
pub struct ChunkStream {
    inner: tonic::Streaming<proto::Chunk>,
    instance: String,
}

impl ChunkStream {
    /// The instance serving the stream.
    pub fn instance(&self) -> &str {
        &self.instance
    }
}

impl Stream for ChunkStream {
    type Item = Result<proto::Chunk, InvokeError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx).map(|o| o.map(|r| r.map_err(InvokeError::from)))
    }
}

/// Why a call failed: the gRPC status and the mesh's reason.
#[derive(Clone)]
pub struct InvokeError {
    status: tonic::Status,
    info: Option<ErrorInfo>,
}

impl InvokeError {
    fn local(reason: Reason, message: String) -> InvokeError {
        reason::status(reason, message, &[]).into()
    }
    pub fn code(&self) -> tonic::Code {
        self.status.code()
    }
    /// The machine-readable reason (e.g. "AGENT_NOT_FOUND"), if the mesh gave one.
    pub fn reason(&self) -> Option<&str> {
        self.info.as_ref().map(|i| i.reason.as_str())
    }
    pub fn message(&self) -> &str {
        self.status.message()
    }
    /// A metadata value of the reason (e.g. "field", "suggestions").
    pub fn detail(&self, key: &str) -> Option<&str> {
        self.info.as_ref()?.metadata.get(key).map(String::as_str)
    }
    /// Close capability or agent names suggested for AGENT_NOT_FOUND.
    pub fn suggestions(&self) -> Vec<String> {
        self.detail(reason::META_SUGGESTIONS)
            .map(|s| s.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    }
    pub fn status(&self) -> &tonic::Status {
        &self.status
    }
}

impl From<tonic::Status> for InvokeError {
    fn from(status: tonic::Status) -> Self {
        let info = reason::error_info(&status);
        InvokeError { status, info }
    }
}

impl fmt::Debug for InvokeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InvokeError")
            .field("code", &self.code())
            .field("reason", &self.reason())
            .field("message", &self.message())
            .field("details", &self.info.as_ref().map(|i| &i.metadata))
            .finish()
    }
}

impl fmt::Display for InvokeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{r} ({:?}): {}", self.code(), self.message()),
            None => write!(f, "{:?}: {}", self.code(), self.message()),
        }
    }
}

impl std::error::Error for InvokeError {}
