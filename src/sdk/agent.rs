//! [`Agent`]: an agent in a few lines. Declare a name, capabilities and handlers; the SDK
//! serves the `Agent` API and `grpc.health.v1` on a local port, registers with the local
//! sidecar, heartbeats with its load, and on shutdown reports PAUSED, deregisters, and lets
//! in-flight calls finish.
//!
//! The SDK does not route or retry calls; it only runs handlers for calls the sidecar
//! delivers.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic::{Code, Status};

use crate::model::{Capability, FieldError, HealthState, Load, Priority, Registration};
use crate::proto;
use crate::proto::agent_server::{Agent as AgentService, AgentServer};
use crate::proto::sidecar_client::SidecarClient;
use crate::reason::{self, Reason};

use super::client::{Client, InvokeError};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = T> + Send>>;
type UnaryHandler = Arc<dyn Fn(Call) -> BoxFuture<Result<Reply, HandlerError>> + Send + Sync>;
type StreamHandler = Arc<dyn Fn(Call) -> BoxStream<Result<Reply, HandlerError>> + Send + Sync>;

/// Entry point of the agent SDK: [`Agent::builder`] describes an agent, and the
/// [`AgentBuilder`] it returns serves it.
///
/// # Examples
///
/// An agent with one capability, serving until ctrl-c or SIGTERM:
///
/// ```no_run
/// use agent_reach::{Agent, Reply};
///
/// #[tokio::main]
/// async fn main() -> Result<(), agent_reach::AgentError> {
///     Agent::builder("summarizer")
///         .version("1.2.0")
///         .capability("text.summarize", ["en", "zh"])
///         .handle("text.summarize", |call| async move {
///             let text = call.text()?;
///             Ok(Reply::text(text.split_whitespace().take(20).collect::<Vec<_>>().join(" ")))
///         })
///         .serve()
///         .await
/// }
/// ```
pub struct Agent;

impl Agent {
    /// Starts describing an agent called `name` (a DNS-label-like name: letters, digits,
    /// `-`, `_`, `.`). Nothing happens until [`AgentBuilder::serve`] or
    /// [`AgentBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = agent_reach::Agent::builder("translator").version("2.0.1");
    /// # drop(builder);
    /// ```
    pub fn builder(name: impl Into<String>) -> AgentBuilder {
        AgentBuilder {
            registration: Registration { agent: name.into(), ..Default::default() },
            unary: HashMap::new(),
            streaming: HashMap::new(),
            sidecar: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            register_timeout: None,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Describes an agent; finish with [`serve`](AgentBuilder::serve) (run until a signal) or
/// [`start`](AgentBuilder::start) (run in the background and get a [`RunningAgent`]).
///
/// Every declared capability needs a handler ([`handle`](AgentBuilder::handle) or
/// [`handle_stream`](AgentBuilder::handle_stream)); `start` refuses the agent otherwise.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use agent_reach::{Agent, HandlerError, Reply};
///
/// # async fn example() -> Result<(), agent_reach::AgentError> {
/// let agent = Agent::builder("translator")
///     .version("2.0.1")
///     .capability("text.translate", ["zh", "fr"])
///     .max_concurrency(8)
///     .metadata("region", "eu-west")
///     .handle("text.translate", |call| async move {
///         let lang = call.metadata().get("lang").cloned().unwrap_or_else(|| "zh".into());
///         if lang.is_empty() {
///             return Err(HandlerError::invalid_argument("lang must not be empty"));
///         }
///         Ok(Reply::text(format!("[{lang}] {}", call.text()?)))
///     })
///     .sidecar("127.0.0.1:7700")
///     .register_timeout(Duration::from_secs(10))
///     .start()
///     .await?;
/// println!("registered as {}", agent.instance_id());
/// agent.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct AgentBuilder {
    registration: Registration,
    unary: HashMap<String, UnaryHandler>,
    streaming: HashMap<String, StreamHandler>,
    sidecar: Option<String>,
    listen: SocketAddr,
    register_timeout: Option<Duration>,
    drain_timeout: Duration,
}

impl AgentBuilder {
    /// The agent's version, shown to callers ([`InvokeReply::agent_version`]) and used by
    /// canary splits and `weighted` routing. Default: empty.
    ///
    /// [`InvokeReply::agent_version`]: crate::InvokeReply::agent_version
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.registration.version = version.into();
        self
    }

    /// Declares a capability with its tags. Calls that require tags (see
    /// [`InvokeBuilder::tags`](crate::InvokeBuilder::tags)) only reach instances whose
    /// capability carries all of them. Declaring a capability again adds tags.
    ///
    /// # Examples
    ///
    /// ```
    /// use agent_reach::{Agent, Reply};
    ///
    /// let builder = Agent::builder("summarizer")
    ///     .capability("text.summarize", ["en"])
    ///     .capability("text.summarize", ["zh"]) // now tagged en and zh
    ///     .capability("text.keywords", Vec::<String>::new())
    ///     .handle("text.summarize", |_call| async { Ok(Reply::text("…")) })
    ///     .handle("text.keywords", |_call| async { Ok(Reply::text("…")) });
    /// # drop(builder);
    /// ```
    pub fn capability<I, S>(mut self, name: impl Into<String>, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let name = name.into();
        let tags: Vec<String> = tags.into_iter().map(Into::into).collect();
        match self.registration.capabilities.iter_mut().find(|c| c.name == name) {
            Some(c) => c.tags.extend(tags),
            None => self.registration.capabilities.push(Capability { name, tags }),
        }
        self
    }

    /// Calls the agent can run at once (0 = unlimited, the default). The agent's sidecar
    /// admits at most this many, by priority, and reports the instance's load to callers
    /// from it.
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.registration.max_concurrency = n;
        self
    }

    /// A registration metadata entry, e.g. `weight` for `weighted` routing or
    /// `health_path` for an HTTP agent's probe; operators see it in
    /// `agent-reach ctl -o json instance <id>`.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.registration.metadata.insert(key.into(), value.into());
        self
    }

    /// The sidecar to join ("host:port"); default `AGENT_REACH_SIDECAR` or 127.0.0.1:7700.
    pub fn sidecar(mut self, addr: impl Into<String>) -> Self {
        self.sidecar = Some(addr.into());
        self
    }

    /// Where the agent serves its API; default 127.0.0.1 on a free port.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// How long [`start`](Self::start) keeps retrying registration while the sidecar or
    /// control service is unavailable; default: until it succeeds.
    pub fn register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = Some(timeout);
        self
    }

    /// How long shutdown waits for in-flight calls; default 30 s.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Handles calls to `capability` (declared without tags if not declared yet). The
    /// handler gets each [`Call`] and answers a [`Reply`] or a [`HandlerError`]; any error
    /// type converts into one (code INTERNAL), so `?` works.
    ///
    /// # Examples
    ///
    /// ```
    /// use agent_reach::{Agent, HandlerError, Reply};
    ///
    /// let builder = Agent::builder("calculator").handle("math.double", |call| async move {
    ///     let n: i64 = call.text()?.trim().parse().map_err(|_| HandlerError::invalid_argument("not a number"))?;
    ///     Ok(Reply::text((n * 2).to_string()))
    /// });
    /// # drop(builder);
    /// ```
    pub fn handle<F, Fut>(mut self, capability: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        let capability = capability.into();
        self = self.capability(capability.clone(), std::iter::empty::<String>());
        self.unary.insert(capability, Arc::new(move |call| Box::pin(handler(call))));
        self
    }

    /// Handles streamed calls (`InvokeStream`) to `capability`: the handler returns a
    /// stream of [`Reply`] chunks, which reach the caller one by one.
    ///
    /// # Examples
    ///
    /// ```
    /// use agent_reach::{Agent, Reply};
    ///
    /// let builder = Agent::builder("counter").handle_stream("count", |call| {
    ///     let n: usize = call.text().ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    ///     futures_util::stream::iter((1..=n).map(|i| Ok(Reply::text(i.to_string()))))
    /// });
    /// # drop(builder);
    /// ```
    pub fn handle_stream<F, S>(mut self, capability: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Call) -> S + Send + Sync + 'static,
        S: Stream<Item = Result<Reply, HandlerError>> + Send + 'static,
    {
        let capability = capability.into();
        self = self.capability(capability.clone(), std::iter::empty::<String>());
        self.streaming.insert(capability, Arc::new(move |call| Box::pin(handler(call))));
        self
    }

    /// Starts the agent and runs it until ctrl-c or SIGTERM, then shuts down gracefully
    /// (see [`RunningAgent::shutdown`]).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use agent_reach::{Agent, Reply};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), agent_reach::AgentError> {
    ///     Agent::builder("echo").handle("echo", |call| async move { Ok(Reply::bytes(call.payload().clone())) }).serve().await
    /// }
    /// ```
    pub async fn serve(self) -> Result<(), AgentError> {
        let agent = self.start().await?;
        agent_reach_support::process::shutdown_signal().await;
        agent.shutdown().await;
        Ok(())
    }

    /// Starts serving the `Agent` API and `grpc.health.v1` on the [`listen`](Self::listen)
    /// address, registers with the sidecar, and returns once registered; heartbeats with
    /// the agent's load then run in the background. Registration is retried while the
    /// sidecar or control service is unavailable (up to the
    /// [`register_timeout`](Self::register_timeout)).
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] when a declared capability has no handler, the address cannot
    /// be bound or the sidecar address is malformed; [`AgentError::Invalid`] when the
    /// registration is invalid (the field is named); [`AgentError::Sidecar`] when the
    /// sidecar refuses the registration or stays unreachable past the timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use agent_reach::{Agent, Reply};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let agent = Agent::builder("echo")
    ///     .handle("echo", |call| async move { Ok(Reply::text(call.text()?)) })
    ///     .start()
    ///     .await?;
    /// // The agent can call other capabilities as itself.
    /// let reply = agent.client().invoke("text.summarize").text("a long text").send().await?;
    /// println!("{}", reply.text());
    /// agent.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn start(self) -> Result<RunningAgent, AgentError> {
        for c in &self.registration.capabilities {
            if !self.unary.contains_key(&c.name) && !self.streaming.contains_key(&c.name) {
                return Err(AgentError::Config(format!("capability {:?} has no handler", c.name)));
            }
        }
        let listener = TcpListener::bind(self.listen)
            .await
            .map_err(|e| AgentError::Config(format!("cannot listen on {}: {e}", self.listen)))?;
        let local = listener.local_addr().map_err(|e| AgentError::Config(e.to_string()))?;
        let mut registration = self.registration;
        registration.endpoint = format!("http://{local}");
        registration.validate().map_err(AgentError::Invalid)?;

        let sidecar_addr = self.sidecar.unwrap_or_else(super::default_sidecar_addr);
        let channel = tonic::transport::Endpoint::from_shared(super::with_scheme(&sidecar_addr))
            .map_err(|e| AgentError::Config(format!("bad sidecar address {sidecar_addr:?}: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        let client = Client::lazy(&sidecar_addr).map_err(AgentError::Sidecar)?;

        let stats = Arc::new(Stats::default());
        // Filled by the registration below (and renewed by each new one); calls arrive after it.
        let credential = Arc::new(Mutex::new(String::new()));
        let service = AgentImpl {
            unary: Arc::new(self.unary),
            streaming: Arc::new(self.streaming),
            default_capability: (registration.capabilities.len() == 1)
                .then(|| registration.capabilities[0].name.clone()),
            stats: stats.clone(),
            sidecar: super::sidecar_client(channel.clone()),
            credential: credential.clone(),
            agent: registration.agent.clone(),
        };
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter.set_serving::<AgentServer<AgentImpl>>().await;
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let kill = tokio_util::sync::CancellationToken::new();
        let killed = kill.clone();
        let server = tokio::spawn(async move {
            // Accepts until killed (the listener then closes); each connection breaks when
            // killed.
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
                .take_until(killed.clone().cancelled_owned())
                .map(move |conn| {
                    conn.map(|tcp| {
                        let _ = tcp.set_nodelay(true);
                        super::killable::KillableIo::new(tcp, &killed)
                    })
                });
            Server::builder()
                .tcp_nodelay(true)
                .add_service(health_service)
                .add_service(AgentServer::new(service))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop_rx.wait_for(|stop| *stop).await;
                })
                .await
        });

        let mut sidecar = super::sidecar_client(channel);
        let deadline = self.register_timeout.map(|t| tokio::time::Instant::now() + t);
        let first = match register(&mut sidecar, &registration, deadline).await {
            Ok(r) => r,
            Err(e) => {
                server.abort();
                return Err(e);
            }
        };
        tracing::info!(agent = %registration.agent, instance = %first.instance_id, endpoint = %registration.endpoint, "registered with sidecar {sidecar_addr}");
        let identity = Arc::new(Mutex::new(first.instance_id.clone()));
        lock(&credential).clone_from(&first.credential);
        let (state_tx, state_rx) = watch::channel(HealthState::Up);
        let heartbeat = tokio::spawn(heartbeat_loop(
            sidecar.clone(),
            registration.clone(),
            identity.clone(),
            credential.clone(),
            Duration::from_millis(u64::from(first.heartbeat_interval_ms.max(50))),
            stats.clone(),
            state_rx,
        ));
        Ok(RunningAgent {
            name: registration.agent.clone(),
            endpoint: registration.endpoint.clone(),
            identity,
            credential,
            sidecar,
            client,
            stats,
            state: state_tx,
            stop: stop_tx,
            kill,
            server,
            heartbeat,
            drain_timeout: self.drain_timeout,
        })
    }
}

async fn register(
    sidecar: &mut SidecarClient<super::SidecarChannel>,
    registration: &Registration,
    deadline: Option<tokio::time::Instant>,
) -> Result<proto::RegisterReply, AgentError> {
    let mut attempt = 0;
    loop {
        let request = proto::RegisterRequest { registration: Some(registration.clone().into()), ..Default::default() };
        match sidecar.register(request).await {
            Ok(reply) => return Ok(reply.into_inner()),
            Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::DeadlineExceeded) => {
                let wait =
                    agent_reach_support::backoff::jittered(attempt, Duration::from_millis(100), Duration::from_secs(5));
                attempt += 1;
                if deadline.is_some_and(|d| tokio::time::Instant::now() + wait > d) {
                    return Err(AgentError::Sidecar(status.into()));
                }
                tracing::warn!(agent = %registration.agent, "registration failed, retrying in {wait:?}: {}", status.message());
                tokio::time::sleep(wait).await;
            }
            Err(status) => return Err(AgentError::Sidecar(status.into())),
        }
    }
}

async fn heartbeat_loop(
    mut sidecar: SidecarClient<super::SidecarChannel>,
    registration: Registration,
    identity: Arc<Mutex<String>>,
    credential: Arc<Mutex<String>>,
    interval: Duration,
    stats: Arc<Stats>,
    state: watch::Receiver<HealthState>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let instance_id = lock(&identity).clone();
        let request = proto::HeartbeatRequest {
            instance_id: instance_id.clone(),
            state: proto::HealthState::from(*state.borrow()) as i32,
            load: Some(stats.load(registration.max_concurrency).into()),
        };
        match sidecar.heartbeat(request).await {
            Ok(_) => {}
            Err(status) if status.code() == Code::NotFound => {
                // The sidecar lost us (it restarted, or our lease expired): join again.
                tracing::warn!(agent = %registration.agent, instance = %instance_id, "sidecar no longer knows this instance; registering again");
                if let Ok(reply) = register(&mut sidecar, &registration, None).await {
                    *lock(&identity) = reply.instance_id;
                    *lock(&credential) = reply.credential;
                }
            }
            Err(status) => {
                tracing::debug!(agent = %registration.agent, "heartbeat failed: {}", status.message());
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the String
    // inside is still valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running agent, from [`AgentBuilder::start`]. Dropping it leaves the agent running in
/// the background; end it with [`shutdown`](RunningAgent::shutdown) (graceful) or
/// [`abort`](RunningAgent::abort) (as a crash).
pub struct RunningAgent {
    name: String,
    endpoint: String,
    identity: Arc<Mutex<String>>,
    /// The agent credential of the current registration.
    credential: Arc<Mutex<String>>,
    sidecar: SidecarClient<super::SidecarChannel>,
    client: Client,
    stats: Arc<Stats>,
    state: watch::Sender<HealthState>,
    stop: watch::Sender<bool>,
    kill: tokio_util::sync::CancellationToken,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    heartbeat: JoinHandle<()>,
    drain_timeout: Duration,
}

impl RunningAgent {
    /// The instance id the sidecar assigned (it changes if the agent had to register again).
    pub fn instance_id(&self) -> String {
        lock(&self.identity).clone()
    }
    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Where the agent serves its API.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    /// A client of the same sidecar whose calls are made as this agent: they present its
    /// agent credential, so its sidecar vouches for it (rate limits per caller, metrics, the
    /// target's authorization policies and [`Call::verified_caller`]), and name it in the
    /// target's [`Call::caller`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach::RunningAgent) -> Result<(), agent_reach::InvokeError> {
    /// let reply = agent.client().invoke("text.translate").tags(["zh"]).text("hello").send().await?;
    /// assert!(!reply.instance().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn client(&self) -> Client {
        self.client.with_caller(&self.name, &self.instance_id()).with_credential(lock(&self.credential).clone())
    }
    /// Calls handled so far.
    pub fn handled(&self) -> u64 {
        self.stats.handled.load(Ordering::Relaxed)
    }

    /// Graceful shutdown, in order: report PAUSED (the sidecar stops handing this instance
    /// new calls at once, and callers' tables follow), let calls in flight finish (up to the
    /// drain timeout), deregister, stop serving. No call accepted before shutdown fails
    /// because of it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach::RunningAgent) {
    /// tokio::signal::ctrl_c().await.ok();
    /// agent.shutdown().await;
    /// # }
    /// ```
    pub async fn shutdown(self) {
        let _ = self.state.send(HealthState::Paused);
        let instance_id = self.instance_id();
        let mut sidecar = self.sidecar.clone();
        let request = proto::HeartbeatRequest {
            instance_id: instance_id.clone(),
            state: proto::HealthState::Paused as i32,
            load: Some(self.stats.load(0).into()),
        };
        if let Err(status) = sidecar.heartbeat(request).await {
            tracing::warn!(instance = %instance_id, "could not report PAUSED: {}", status.message());
        }
        if tokio::time::timeout(self.drain_timeout, self.stats.idle()).await.is_err() {
            tracing::warn!(instance = %instance_id, "calls still in flight after the drain timeout");
        }
        self.heartbeat.abort();
        if let Err(status) = sidecar.deregister(proto::DeregisterRequest { instance_id: instance_id.clone() }).await {
            tracing::warn!(instance = %instance_id, "deregister failed (the lease will expire): {}", status.message());
        }
        let _ = self.stop.send(true);
        if tokio::time::timeout(self.drain_timeout, self.server).await.is_err() {
            tracing::warn!(instance = %instance_id, "the server did not stop within the drain timeout");
        }
    }

    /// Stops at once without deregistering, as a crash looks to the mesh: heartbeats stop,
    /// the listener closes (new connections are refused), every open connection breaks
    /// (calls in flight on it fail), and the registration is left to expire.
    pub fn abort(self) {
        self.heartbeat.abort();
        self.kill.cancel();
    }
}

#[derive(Default)]
struct Stats {
    in_flight: AtomicU32,
    /// Notified when `in_flight` drops to zero.
    idle: tokio::sync::Notify,
    handled: AtomicU64,
    /// EWMA of handler latency in microseconds.
    latency_us: AtomicU64,
}

impl Stats {
    fn load(&self, max_concurrency: u32) -> Load {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        Load {
            in_flight,
            queue_length: 0,
            load_ratio: if max_concurrency == 0 { 0.0 } else { f64::from(in_flight) / f64::from(max_concurrency) },
            avg_latency_ms: u32::try_from(self.latency_us.load(Ordering::Relaxed) / 1000).unwrap_or(u32::MAX),
        }
    }

    /// Completes when no call is in flight.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            notified.await;
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { stats: self.clone(), started: Instant::now() }
    }
}

/// Counts a call in flight until dropped.
struct InFlight {
    stats: Arc<Stats>,
    started: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let s = &self.stats;
        if s.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            s.idle.notify_waiters();
        }
        s.handled.fetch_add(1, Ordering::Relaxed);
        let sample = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let old = s.latency_us.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { (old * 7 + sample) / 8 };
        s.latency_us.store(new, Ordering::Relaxed);
    }
}

struct AgentImpl {
    unary: Arc<HashMap<String, UnaryHandler>>,
    streaming: Arc<HashMap<String, StreamHandler>>,
    default_capability: Option<String>,
    stats: Arc<Stats>,
    /// The agent's sidecar, handed to each call for its session context.
    sidecar: SidecarClient<super::SidecarChannel>,
    /// The agent credential of the current registration (session writes present it).
    credential: Arc<Mutex<String>>,
    /// The agent's name (the writer of its handlers' session writes).
    agent: String,
}

impl AgentImpl {
    /// The capability a call is for: the one the mesh routed by, else the target's, else
    /// the agent's only capability.
    fn capability_of(&self, req: &proto::HandleRequest) -> Result<String, Status> {
        if !req.capability.is_empty() {
            return Ok(req.capability.clone());
        }
        if let Some(proto::target::Kind::Capability(c)) = req.target.as_ref().and_then(|t| t.kind.as_ref()) {
            return Ok(c.clone());
        }
        self.default_capability.clone().ok_or_else(|| {
            reason::invalid_argument("target", "this agent offers several capabilities; call it by capability")
        })
    }
}

fn call_from_request(
    request: tonic::Request<proto::HandleRequest>,
    capability: String,
    sidecar: &SidecarClient<super::SidecarChannel>,
    credential: &Mutex<String>,
    agent: &str,
) -> Call {
    let deadline = request
        .metadata()
        .get(agent_reach_support::grpc_timeout::HEADER)
        .and_then(|v| agent_reach_support::grpc_timeout::parse(v.as_bytes()))
        .map(|d| Instant::now() + d);
    let traceparent = request.metadata().get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = |key: &str| request.metadata().get(key).and_then(|v| v.to_str().ok()).map(str::to_string);
    let verified_caller = text(crate::headers::CALLER_AGENT)
        .map(|agent| proto::Caller { agent, instance_id: text(crate::headers::CALLER_INSTANCE).unwrap_or_default() });
    let verified_tenant = verified_caller.as_ref().and_then(|_| text(crate::headers::CALLER_TENANT));
    let mut inner = request.into_inner();
    // Kept once, in the call's session handles (`as_proto` shows it taken).
    let delivered = crate::sdk::session::Delivered::new(&inner.session_id, inner.session.take(), agent);
    Call {
        inner,
        delivered,
        sidecar: Some(sidecar.clone()),
        credential: Some(lock(credential).clone()).filter(|c| !c.is_empty()),
        capability,
        deadline,
        traceparent,
        verified_caller,
        verified_tenant,
    }
}

#[tonic::async_trait]
impl AgentService for AgentImpl {
    async fn handle(
        &self,
        request: tonic::Request<proto::HandleRequest>,
    ) -> Result<tonic::Response<proto::HandleReply>, Status> {
        let capability = self.capability_of(request.get_ref())?;
        let Some(handler) = self.unary.get(&capability) else {
            return Err(reason::status(
                Reason::AgentNotFound,
                format!("this agent has no unary handler for {capability:?}"),
                &[],
            ));
        };
        let call = call_from_request(request, capability, &self.sidecar, &self.credential, &self.agent);
        let _in_flight = self.stats.begin();
        let reply = handler(call).await.map_err(HandlerError::into_status)?;
        Ok(tonic::Response::new(proto::HandleReply {
            payload: reply.payload,
            content_type: reply.content_type,
            metadata: reply.metadata,
        }))
    }

    type HandleStreamStream = BoxStream<Result<proto::Chunk, Status>>;

    async fn handle_stream(
        &self,
        request: tonic::Request<proto::HandleRequest>,
    ) -> Result<tonic::Response<Self::HandleStreamStream>, Status> {
        let capability = self.capability_of(request.get_ref())?;
        let Some(handler) = self.streaming.get(&capability) else {
            return Err(reason::status(
                Reason::AgentNotFound,
                format!("this agent has no streaming handler for {capability:?}"),
                &[],
            ));
        };
        let call = call_from_request(request, capability, &self.sidecar, &self.credential, &self.agent);
        let in_flight = self.stats.begin();
        let stream = handler(call).map(move |item| {
            let _keep = &in_flight;
            item.map(|r| proto::Chunk { payload: r.payload, content_type: r.content_type, metadata: r.metadata })
                .map_err(HandlerError::into_status)
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// A call delivered to a handler: the payload and what the caller said about it.
///
/// # Examples
///
/// ```
/// use agent_reach::{Call, HandlerError, Reply};
///
/// async fn summarize(call: Call) -> Result<Reply, HandlerError> {
///     let words: Vec<&str> = call.text()?.split_whitespace().take(3).collect();
///     Ok(Reply::text(words.join(" ")).metadata("session", call.session_id()))
/// }
/// # let reply = futures_util::FutureExt::now_or_never(summarize(Call::new("text.summarize", "one two three four"))).unwrap().unwrap();
/// # assert_eq!(reply.payload().as_ref(), b"one two three");
/// ```
#[derive(Clone, Debug)]
pub struct Call {
    inner: proto::HandleRequest,
    /// The sidecar that delivered the call, for [`Call::session`].
    sidecar: Option<SidecarClient<super::SidecarChannel>>,
    /// The serving agent's credential, presented by [`Call::session`] writes.
    credential: Option<String>,
    /// The session the sidecar delivered with the call, answering [`Call::session`] reads.
    delivered: Option<Arc<crate::sdk::session::Delivered>>,
    capability: String,
    deadline: Option<Instant>,
    traceparent: Option<String>,
    verified_caller: Option<proto::Caller>,
    verified_tenant: Option<String>,
}

impl Call {
    /// Builds a call by hand, e.g. to unit-test a handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use agent_reach::{Call, Reply};
    ///
    /// let call = Call::new("text.upper", "hello");
    /// assert_eq!((call.capability(), call.text().unwrap()), ("text.upper", "hello"));
    /// let reply = Reply::text(call.text().unwrap().to_uppercase());
    /// assert_eq!(reply.payload().as_ref(), b"HELLO");
    /// ```
    pub fn new(capability: impl Into<String>, payload: impl Into<Bytes>) -> Call {
        Call {
            inner: proto::HandleRequest { payload: payload.into(), ..Default::default() },
            sidecar: None,
            credential: None,
            delivered: None,
            capability: capability.into(),
            deadline: None,
            traceparent: None,
            verified_caller: None,
            verified_tenant: None,
        }
    }
    /// The call in `session`, delivered with it as the sidecar does: the handler's
    /// [`Call::session`] reads are answered from it (e.g. to unit-test a handler).
    ///
    /// # Examples
    ///
    /// ```
    /// use agent_reach::{Call, proto};
    ///
    /// let field = proto::SessionField { name: "order_id".into(), value: "o-7".into(), version: 3, ..Default::default() };
    /// let session = proto::DeliveredSession { session_id: "s-1".into(), version: 3, fields: vec![field] };
    /// let call = Call::new("refund", "").with_session(session);
    /// let order = futures_util::FutureExt::now_or_never(call.session().get("order_id")).unwrap().unwrap();
    /// assert_eq!(order.unwrap().value.as_ref(), b"o-7");
    /// assert_eq!((call.session_id(), call.session().delivered_reads()), ("s-1", 1));
    /// ```
    pub fn with_session(mut self, session: proto::DeliveredSession) -> Call {
        self.inner.session_id = session.session_id.clone();
        self.delivered = crate::sdk::session::Delivered::new(&self.inner.session_id, Some(session), "");
        self
    }
    /// The payload, as the caller sent it.
    pub fn payload(&self) -> &Bytes {
        &self.inner.payload
    }
    /// The payload as UTF-8; an INVALID_ARGUMENT [`HandlerError`] when it is not, so a
    /// handler can use `call.text()?`.
    ///
    /// # Examples
    ///
    /// ```
    /// let call = agent_reach::Call::new("c", vec![0xff, 0xfe]);
    /// assert!(call.text().is_err());
    /// ```
    pub fn text(&self) -> Result<&str, HandlerError> {
        std::str::from_utf8(&self.inner.payload)
            .map_err(|_| HandlerError::new(Code::InvalidArgument, "payload is not valid UTF-8"))
    }
    /// The payload's content type, as the caller set it (may be empty).
    pub fn content_type(&self) -> &str {
        &self.inner.content_type
    }
    /// The capability this call was routed by.
    pub fn capability(&self) -> &str {
        &self.capability
    }
    /// The session the caller named (empty if none).
    pub fn session_id(&self) -> &str {
        &self.inner.session_id
    }
    /// The call's session context, read through the sidecar that delivered the call and
    /// written as the serving instance (verified: writes present the agent's credential).
    pub fn session(&self) -> crate::Session {
        crate::Session::new(
            self.sidecar.clone(),
            self.inner.session_id.clone(),
            self.inner.instance_id.clone(),
            self.credential.clone(),
        )
        .with_delivered(self.delivered.clone())
    }
    /// The sidecar that delivered the call (none for a call built by hand).
    pub(crate) fn sidecar_client(&self) -> Option<SidecarClient<super::SidecarChannel>> {
        self.sidecar.clone()
    }
    /// The call's message id: the caller's, or one its sidecar assigned.
    pub fn message_id(&self) -> &str {
        &self.inner.message_id
    }
    /// The call's priority (NORMAL unless the caller said otherwise).
    pub fn priority(&self) -> Priority {
        crate::convert::priority_from_i32(self.inner.priority)
    }
    /// The caller's metadata entries.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.inner.metadata
    }
    /// The calling agent and instance, as the caller said (not verified; see
    /// [`Call::verified_caller`]).
    pub fn caller(&self) -> Option<&proto::Caller> {
        self.inner.caller.as_ref()
    }
    /// The calling agent and instance as the mesh verified them (the caller's agent
    /// credential, vouched for by its sidecar over mutual TLS); `None` for anonymous calls.
    pub fn verified_caller(&self) -> Option<&proto::Caller> {
        self.verified_caller.as_ref()
    }
    /// The tenant of [`Call::verified_caller`], as the mesh verified it: this agent's own,
    /// or another tenant's for a call that tenant was granted (its sidecar's certificate
    /// names it). `None` for anonymous calls.
    pub fn verified_caller_tenant(&self) -> Option<&str> {
        self.verified_tenant.as_deref()
    }
    /// The instance handling the call.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }
    /// 1 for a first try, 2 when the caller's sidecar retried on this instance.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }
    /// When the caller stops waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    /// The W3C trace context of the call; pass the call to
    /// [`InvokeBuilder::within`](crate::InvokeBuilder::within) to continue it.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
    /// The request as delivered, for fields this type does not expose.
    pub fn as_proto(&self) -> &proto::HandleRequest {
        &self.inner
    }
}

/// A handler's answer (or one chunk of a streamed answer).
///
/// # Examples
///
/// ```
/// use agent_reach::Reply;
///
/// let reply = Reply::bytes(vec![1, 2, 3]).content_type("application/octet-stream").metadata("model", "small");
/// assert_eq!(reply.payload().as_ref(), [1, 2, 3]);
/// assert_eq!(Reply::text("done").payload().as_ref(), b"done");
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    payload: Bytes,
    content_type: String,
    metadata: HashMap<String, String>,
}

impl Reply {
    /// A binary answer, without a content type.
    pub fn bytes(payload: impl Into<Bytes>) -> Reply {
        Reply { payload: payload.into(), ..Default::default() }
    }
    /// A UTF-8 text answer (content type `text/plain; charset=utf-8`).
    pub fn text(text: impl Into<String>) -> Reply {
        Reply {
            payload: Bytes::from(text.into()),
            content_type: "text/plain; charset=utf-8".into(),
            metadata: HashMap::new(),
        }
    }
    /// Sets the answer's content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Reply {
        self.content_type = content_type.into();
        self
    }
    /// Adds a metadata entry the caller reads from
    /// [`InvokeReply::metadata`](crate::InvokeReply::metadata).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Reply {
        self.metadata.insert(key.into(), value.into());
        self
    }
    /// The answer's payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
}

/// A handler's failure: a gRPC code and a message the caller will see. Any error converts
/// into one with code INTERNAL, so `?` works in handlers.
///
/// The code matters to the mesh: UNAVAILABLE, INTERNAL, UNKNOWN and DEADLINE_EXCEEDED count
/// against the instance's circuit breaker in the caller's sidecar, and UNAVAILABLE is
/// retried on another instance when the call may run twice (idempotent by policy, or with
/// an idempotency key); INVALID_ARGUMENT is the caller's fault and counts for neither.
///
/// # Examples
///
/// ```
/// use agent_reach::HandlerError;
///
/// fn parse(text: &str) -> Result<u32, HandlerError> {
///     Ok(text.parse::<u32>()?) // a ParseIntError becomes INTERNAL
/// }
/// assert!(parse("x").is_err());
///
/// fn check_lang(lang: &str) -> Result<(), HandlerError> {
///     match lang {
///         "en" | "zh" => Ok(()),
///         _ => Err(HandlerError::invalid_argument("lang must be one of en, zh")),
///     }
/// }
/// assert!(check_lang("fr").is_err());
/// ```
#[derive(Debug)]
pub struct HandlerError {
    code: Code,
    message: String,
}

impl HandlerError {
    /// A failure with any gRPC `code`.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = agent_reach::HandlerError::new(tonic::Code::DeadlineExceeded, "the model took too long");
    /// # drop(e);
    /// ```
    pub fn new(code: Code, message: impl Into<String>) -> HandlerError {
        HandlerError { code, message: message.into() }
    }
    /// The caller sent something this handler cannot use (INVALID_ARGUMENT); the mesh does
    /// not retry it elsewhere.
    pub fn invalid_argument(message: impl Into<String>) -> HandlerError {
        HandlerError::new(Code::InvalidArgument, message)
    }
    /// This instance cannot serve now (UNAVAILABLE): counts against its circuit breaker,
    /// and an idempotent call is retried on another instance.
    pub fn unavailable(message: impl Into<String>) -> HandlerError {
        HandlerError::new(Code::Unavailable, message)
    }
    fn into_status(self) -> Status {
        Status::new(self.code, self.message)
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::new(Code::Internal, e.into().to_string())
    }
}

/// Why an agent could not start ([`AgentBuilder::start`], [`AgentBuilder::serve`]).
///
/// # Examples
///
/// ```no_run
/// use agent_reach::{Agent, AgentError, Reply};
///
/// # async fn example() {
/// match Agent::builder("echo").handle("echo", |c| async move { Ok(Reply::text(c.text()?)) }).start().await {
///     Ok(agent) => agent.shutdown().await,
///     Err(AgentError::Invalid(field)) => eprintln!("fix the registration: {field}"),
///     Err(AgentError::Sidecar(e)) if e.reason() == Some("CONTROL_UNAVAILABLE") => eprintln!("retry later: {e}"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The builder's settings cannot work: a capability without a handler, an address that
    /// cannot be bound, a malformed sidecar address.
    #[error("agent configuration: {0}")]
    Config(String),
    /// The registration is invalid; names the field.
    #[error("invalid registration: {0}")]
    Invalid(FieldError),
    /// The sidecar refused the registration, or was unreachable past the register timeout.
    #[error("sidecar refused the registration: {0}")]
    Sidecar(InvokeError),
}
