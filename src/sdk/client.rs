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
use tonic::transport::Endpoint;

use crate::headers;
use crate::model::{Priority, Target};
use crate::proto;
use crate::proto::sidecar_client::SidecarClient;
use crate::reason::{self, ErrorInfo, Reason};

/// A connection to a sidecar's local API. Cheap to clone (clones share the connection).
///
/// A call names a capability ([`invoke`](Client::invoke)) or an agent
/// ([`invoke_agent`](Client::invoke_agent)); the sidecar picks the instance. Build it up
/// with the [`InvokeBuilder`] and finish with [`send`](InvokeBuilder::send) or
/// [`send_stream`](InvokeBuilder::send_stream).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// #[tokio::main]
/// async fn main() -> Result<(), agent_reach::InvokeError> {
///     let mesh = agent_reach::Client::connect_local().await?;
///     let reply = mesh
///         .invoke("text.summarize")
///         .tags(["zh"])
///         .session("s-42")
///         .timeout(Duration::from_secs(3))
///         .text("long text ...")
///         .send()
///         .await?;
///     println!("{} (served by {})", reply.text(), reply.instance());
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    sidecar: SidecarClient<super::SidecarChannel>,
    caller: Option<proto::Caller>,
    /// The agent credential presented on calls (`ar-agent-credential`).
    credential: Option<String>,
}

impl Client {
    /// Connects to the local sidecar (`AGENT_REACH_SIDECAR`, default
    /// [`DEFAULT_SIDECAR_ADDR`](crate::DEFAULT_SIDECAR_ADDR)).
    ///
    /// # Errors
    ///
    /// `SIDECAR_UNREACHABLE` (UNAVAILABLE) when nothing answers within 5 s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), agent_reach::InvokeError> {
    /// let mesh = agent_reach::Client::connect_local().await?;
    /// # drop(mesh);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_local() -> Result<Client, InvokeError> {
        Client::connect(&super::default_sidecar_addr()).await
    }

    /// Connects to a sidecar at `addr` ("host:port" or "http://host:port").
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a malformed address; `SIDECAR_UNREACHABLE` (UNAVAILABLE) when
    /// nothing answers within 5 s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), agent_reach::InvokeError> {
    /// let mesh = agent_reach::Client::connect("127.0.0.1:7700").await?;
    /// # drop(mesh);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(addr: &str) -> Result<Client, InvokeError> {
        let channel = endpoint(addr)?.connect().await.map_err(|e| {
            InvokeError::local(Reason::SidecarUnreachable, format!("cannot connect to sidecar at {addr}: {e}"))
        })?;
        Ok(Client { sidecar: super::sidecar_client(channel), caller: None, credential: None })
    }

    /// A client that connects on first use (and reconnects after failures): no I/O here,
    /// so it can be built before the sidecar is up, e.g. inside an agent's setup.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a malformed address.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mesh = agent_reach::Client::lazy("127.0.0.1:7700").unwrap();
    /// assert!(agent_reach::Client::lazy("not an address\n").is_err());
    /// # drop(mesh);
    /// # }
    /// ```
    pub fn lazy(addr: &str) -> Result<Client, InvokeError> {
        Ok(Client { sidecar: super::sidecar_client(endpoint(addr)?.connect_lazy()), caller: None, credential: None })
    }

    /// The same connection, with calls naming `agent` / `instance_id` as their caller (the
    /// target's [`Call::caller`](crate::Call::caller)). The name is what the caller says,
    /// not verified: rate limits, metrics and authorization use the caller verified by an
    /// agent credential ([`Client::with_credential`]); a
    /// [`RunningAgent::client`](crate::RunningAgent::client) presents its own.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let planner = mesh.with_caller("planner", "planner-1");
    /// planner.invoke("text.summarize").text("…").send().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_caller(&self, agent: &str, instance_id: &str) -> Client {
        Client {
            sidecar: self.sidecar.clone(),
            caller: Some(proto::Caller { agent: agent.to_string(), instance_id: instance_id.to_string() }),
            credential: self.credential.clone(),
        }
    }

    /// The same connection, presenting the agent credential `Register` returned
    /// ([`RegisterReply::credential`](crate::proto::RegisterReply)) on every call: the
    /// sidecar then vouches for that agent as the caller (rate limits, metrics, the target's
    /// authorization policies). Without one, calls are anonymous.
    pub fn with_credential(&self, credential: impl Into<String>) -> Client {
        Client { credential: Some(credential.into()), ..self.clone() }
    }

    /// The session `session_id` of this client's tenant, written as the client's caller
    /// instance (see [`Client::with_caller`]; reads need none).
    pub fn session(&self, session_id: impl Into<String>) -> crate::Session {
        let instance = self.caller.as_ref().map(|c| c.instance_id.clone()).unwrap_or_default();
        crate::Session::new(Some(self.sidecar.clone()), session_id.into(), instance, self.credential.clone())
    }

    /// Starts a call to any instance offering `capability`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let reply = mesh.invoke("text.translate").tags(["fr"]).metadata("lang", "fr").text("hello").send().await?;
    /// println!("{}", reply.text());
    /// # Ok(())
    /// # }
    /// ```
    pub fn invoke(&self, capability: impl Into<String>) -> InvokeBuilder {
        self.call(Target::capability(capability))
    }

    /// Starts a call to an instance of the agent named `agent`. The agent's handler for
    /// the call is its only capability's (an agent with several answers INVALID_ARGUMENT).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let reply = mesh.invoke_agent("translator").text("hola").send().await?;
    /// assert_eq!(reply.agent(), "translator");
    /// # Ok(())
    /// # }
    /// ```
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

    /// Asks the sidecar where a call to `target` would go, without making it: up to
    /// `max_candidates` ranked candidates (0 means 5) with their scores, the instances
    /// skipped and why, and the strategy.
    ///
    /// # Errors
    ///
    /// `AGENT_NOT_FOUND` (with suggestions) when nothing offers the target.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use agent_reach::model::Target;
    ///
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let route = mesh.route(Target { tags: vec!["zh".into()], ..Target::capability("text.translate") }, 3).await?;
    /// for c in &route.candidates {
    ///     println!("{} {:.3}", c.instance.as_ref().map(|i| i.instance_id.as_str()).unwrap_or("?"), c.score);
    /// }
    /// for s in &route.skipped {
    ///     println!("skipped {}: {}", s.instance_id, s.reason);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn route(&self, target: Target, max_candidates: u32) -> Result<proto::RouteReply, InvokeError> {
        let request = proto::RouteRequest { target: Some(target.into()), max_candidates, ..Default::default() };
        let mut sidecar = self.sidecar.clone();
        Ok(sidecar.route(request).await.map_err(InvokeError::from)?.into_inner())
    }

    /// The generated client, for RPCs and fields this wrapper does not cover (e.g. a
    /// `Route` with a session id).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use agent_reach::{model::Target, proto};
    ///
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), tonic::Status> {
    /// let request = proto::RouteRequest {
    ///     target: Some(Target::capability("work").into()),
    ///     session_id: "user-7".into(),
    ///     ..Default::default()
    /// };
    /// let route = mesh.raw().route(request).await?.into_inner();
    /// println!("strategy {}", route.strategy);
    /// # Ok(())
    /// # }
    /// ```
    pub fn raw(&self) -> SidecarClient<super::SidecarChannel> {
        self.sidecar.clone()
    }

    /// The caller this client's calls and tasks name.
    pub(crate) fn caller_proto(&self) -> Option<proto::Caller> {
        self.caller.clone()
    }

    /// The agent credential this client presents, if any.
    pub(crate) fn credential(&self) -> Option<&str> {
        self.credential.as_deref()
    }
}

fn endpoint(addr: &str) -> Result<Endpoint, InvokeError> {
    Endpoint::from_shared(super::with_scheme(addr))
        .map(|e| e.tcp_nodelay(true).connect_timeout(Duration::from_secs(5)))
        .map_err(|e| InvokeError::local(Reason::InvalidArgument, format!("bad sidecar address {addr:?}: {e}")))
}

/// A call being built, from [`Client::invoke`] or [`Client::invoke_agent`]. Finish with
/// [`send`](InvokeBuilder::send) or [`send_stream`](InvokeBuilder::send_stream).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use agent_reach::Priority;
///
/// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
/// let reply = mesh
///     .invoke("orders.refund")
///     .priority(Priority::High)
///     .idempotency_key("refund-order-42")
///     .timeout(Duration::from_secs(2))
///     .content_type("application/json")
///     .payload(r#"{"order": 42}"#)
///     .send()
///     .await?;
/// println!("refunded by {} after {} attempt(s)", reply.instance(), reply.attempts());
/// # Ok(())
/// # }
/// ```
#[must_use = "a call is only made by send() or send_stream()"]
pub struct InvokeBuilder {
    client: Client,
    request: proto::InvokeRequest,
    timeout: Option<Duration>,
    headers: Vec<(&'static str, String)>,
}

impl InvokeBuilder {
    /// Requires the chosen instance to carry all these tags (on the capability called, or
    /// for a call by agent name on any of its capabilities). Adds to earlier tags.
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
    /// The session the call belongs to: `consistent_hash` (without a `hash_key`) and
    /// canary splits keep a session on one instance or version.
    pub fn session(mut self, session_id: impl Into<String>) -> Self {
        self.request.session_id = session_id.into();
        self
    }
    /// The call's priority (default NORMAL): HIGH may use every admission slot of the
    /// target instance, NORMAL and LOW only their shares.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.request.priority = proto::Priority::from(priority) as i32;
        self
    }
    /// The call's deadline, propagated through every hop. Without one, the target's
    /// policy's default timeout applies, if it has one.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// A binary payload (set its type with [`content_type`](Self::content_type)).
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
    /// The payload's content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.request.content_type = content_type.into();
        self
    }
    /// A metadata entry for the handler ([`Call::metadata`](crate::Call::metadata)); also
    /// what a policy's `hash_key` or canary match reads.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.metadata.insert(key.into(), value.into());
        self
    }
    /// Calls with the same key are safe to retry (and, with governance, run at most once).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.request.idempotency_key = key.into();
        self
    }
    /// The call's message id (default: one the caller's sidecar assigns).
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.request.message_id = id.into();
        self
    }
    /// Continues the trace of `call` (a call this agent is handling), so a chain of agents
    /// is one trace.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use agent_reach::{Agent, Client, Reply};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let mesh = Client::lazy("127.0.0.1:7700")?.with_caller("planner", "");
    /// let planner = Agent::builder("planner").handle("task.plan", move |call| {
    ///     let mesh = mesh.clone();
    ///     async move {
    ///         let summary = mesh.invoke("text.summarize").within(&call).payload(call.payload().clone()).send().await?;
    ///         Ok(Reply::text(summary.text()))
    ///     }
    /// });
    /// planner.serve().await?;
    /// # Ok(())
    /// # }
    /// ```
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
    /// Traces this call and everything it leads to, whatever the sidecars' sampling ratio;
    /// the reply then names the trace ([`InvokeReply::trace_id`]), which
    /// `agent-reach trace <id>` shows.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let reply = mesh.invoke("task.plan").text("…").force_trace().send().await?;
    /// if let Some(id) = reply.trace_id() {
    ///     println!("agent-reach trace {id}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn force_trace(mut self) -> Self {
        self.headers.push((headers::TRACE, headers::TRACE_FORCE.to_string()));
        self
    }

    fn into_request(self) -> (SidecarClient<super::SidecarChannel>, tonic::Request<proto::InvokeRequest>) {
        let mut request = tonic::Request::new(self.request);
        if let Some(t) = self.timeout {
            request.set_timeout(t);
        }
        for (name, value) in self.headers {
            if let Ok(v) = value.parse() {
                request.metadata_mut().insert(name, v);
            }
        }
        if let Some(credential) = &self.client.credential
            && let Ok(v) = credential.parse()
        {
            request.metadata_mut().insert(headers::AGENT_CREDENTIAL, v);
        }
        (self.client.sidecar, request)
    }

    /// Makes the call and waits for the answer.
    ///
    /// # Errors
    ///
    /// The mesh's refusal or the handler's error, as an [`InvokeError`] with the gRPC code
    /// and, from the mesh, a reason such as `AGENT_NOT_FOUND`, `NO_HEALTHY_INSTANCE`,
    /// `RATE_LIMITED` or `DEADLINE_EXCEEDED`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) {
    /// match mesh.invoke("text.summarise").text("…").send().await {
    ///     Ok(reply) => println!("{}", reply.text()),
    ///     Err(e) if e.reason() == Some("AGENT_NOT_FOUND") => println!("did you mean {:?}?", e.suggestions()),
    ///     Err(e) => println!("failed: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn send(self) -> Result<InvokeReply, InvokeError> {
        let (mut sidecar, request) = self.into_request();
        let reply = sidecar.invoke(request).await?;
        let header =
            |name: &str| reply.metadata().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let (route, trace_id) = (header(headers::ROUTE), header(headers::TRACE_ID));
        Ok(InvokeReply { inner: reply.into_inner(), route, trace_id })
    }

    /// Makes the call (`InvokeStream`) and returns the stream of answer chunks, as the
    /// handler yields them.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send) for the call; a chunk may also be an error when the stream
    /// breaks.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use futures_util::StreamExt;
    ///
    /// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
    /// let mut chunks = mesh.invoke("count").text("5").send_stream().await?;
    /// println!("streaming from {}", chunks.instance());
    /// while let Some(chunk) = chunks.next().await {
    ///     println!("{}", String::from_utf8_lossy(&chunk?.payload));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send_stream(self) -> Result<ChunkStream, InvokeError> {
        let (mut sidecar, request) = self.into_request();
        let response = sidecar.invoke_stream(request).await?;
        let instance =
            response.metadata().get(headers::INSTANCE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        Ok(ChunkStream { inner: response.into_inner(), instance })
    }
}

/// The answer to a call: the handler's payload and metadata, and what the mesh adds — the
/// instance that served it, its agent and version, the attempts, the route and the trace.
///
/// # Examples
///
/// ```no_run
/// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
/// let reply = mesh.invoke("text.summarize").text("…").send().await?;
/// println!("{} by {} {} on {}", reply.text(), reply.agent(), reply.agent_version(), reply.instance());
/// println!("route: {}", reply.route()); // e.g. "least_loaded capability text.summarize -> summarizer-1a2b3c4d5e6f (attempt 1)"
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct InvokeReply {
    inner: proto::InvokeReply,
    route: String,
    trace_id: String,
}

impl InvokeReply {
    /// The handler's payload.
    pub fn payload(&self) -> &Bytes {
        &self.inner.payload
    }
    /// The payload as UTF-8 text (lossy).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.inner.payload)
    }
    /// The payload's content type, as the handler set it.
    pub fn content_type(&self) -> &str {
        &self.inner.content_type
    }
    /// The handler's metadata entries ([`Reply::metadata`](crate::Reply::metadata)).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.inner.metadata
    }
    /// The instance that served the call.
    pub fn instance(&self) -> &str {
        &self.inner.instance_id
    }
    /// The name of the agent that served the call.
    pub fn agent(&self) -> &str {
        &self.inner.agent
    }
    /// The version the serving instance registered.
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
    /// The routing digest from the reply's `ar-route` header: `<strategy> <target> ->
    /// <instance> (attempt <n>)`, e.g. `round_robin capability work -> worker-0a1b2c3d4e5f
    /// (attempt 2)`; the target with its required tags, as in `capability text.summarize
    /// [zh]`. Empty when the sidecar sent none.
    pub fn route(&self) -> &str {
        &self.route
    }
    /// When a fallback served the call: the target that could not (e.g. "capability x").
    pub fn fallback_from(&self) -> Option<&str> {
        (!self.inner.fallback_from.is_empty()).then_some(self.inner.fallback_from.as_str())
    }
    /// The reply message as received (without the headers' route and trace id).
    pub fn into_proto(self) -> proto::InvokeReply {
        self.inner
    }
}

/// The chunks of a streamed answer, from [`InvokeBuilder::send_stream`]: a
/// [`Stream`] of [`proto::Chunk`] (payload, content type, metadata) or [`InvokeError`].
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
///
/// Errors from the mesh carry a `google.rpc.ErrorInfo` (domain `agent-reach.dev`) whose
/// reason and metadata this type exposes; errors a handler returned carry only its code and
/// message.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn example(mesh: agent_reach::Client) -> Result<(), agent_reach::InvokeError> {
/// let reply = loop {
///     match mesh.invoke("text.summarize").text("…").send().await {
///         Err(e) if e.reason() == Some("RATE_LIMITED") => {
///             let wait: u64 = e.detail("retry_after_ms").and_then(|ms| ms.parse().ok()).unwrap_or(100);
///             tokio::time::sleep(Duration::from_millis(wait)).await;
///         }
///         other => break other?,
///     }
/// };
/// # drop(reply);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct InvokeError {
    status: tonic::Status,
    info: Option<ErrorInfo>,
}

impl InvokeError {
    fn local(reason: Reason, message: String) -> InvokeError {
        reason::status(reason, message, &[]).into()
    }
    /// The gRPC code (e.g. NOT_FOUND for `AGENT_NOT_FOUND`).
    pub fn code(&self) -> tonic::Code {
        self.status.code()
    }
    /// The machine-readable reason (e.g. "AGENT_NOT_FOUND"), if the mesh gave one.
    pub fn reason(&self) -> Option<&str> {
        self.info.as_ref().map(|i| i.reason.as_str())
    }
    /// The human-readable message.
    pub fn message(&self) -> &str {
        self.status.message()
    }
    /// A metadata value of the reason (e.g. "field", "suggestions").
    pub fn detail(&self, key: &str) -> Option<&str> {
        self.info.as_ref()?.metadata.get(key).map(String::as_str)
    }
    /// Close capability or agent names suggested for AGENT_NOT_FOUND (empty otherwise).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(mesh: agent_reach::Client) {
    /// let err = mesh.invoke("text.summarise").text("x").send().await.unwrap_err();
    /// assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"));
    /// assert_eq!(err.suggestions(), ["text.summarize"]);
    /// # }
    /// ```
    pub fn suggestions(&self) -> Vec<String> {
        self.detail(reason::META_SUGGESTIONS)
            .map(|s| s.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    }
    /// The whole gRPC status, with its details.
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
