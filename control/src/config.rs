//! The control service's configuration: flags and `AGENT_REACH_*` environment variables,
//! parsed once at start into [`ControlConfig`]; bad values fail start naming the flag.
//!
//! Timing defaults, and why (they must survive a 10 s stall of any one process without
//! flapping):
//! - Leases live 20 s (`--lease-ttl`). Sidecars renew their one lease every quarter of it
//!   (5 s), so a renewal is never more than 5 s old and at least 15 s of lease remain when
//!   a stall begins: a sidecar, control replica or etcd leader frozen for 10 s (a GC or VM
//!   pause, a failover to another control replica) loses no lease and no instance. A host
//!   that really died disappears from routing tables 20 s later at most; until then its
//!   refused connections are retried on other instances.
//! - Load reports are written at most once per 5 s per instance (`--load-report-interval`,
//!   one renewal period) and only when the load ratio moved by 0.1 or more (`--load-step`);
//!   state changes are written at once. So heartbeats cost lease renewals, not writes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use agent_reach_identity::Ca;
use clap::Parser;

use crate::alerts::{AlertConfig, WebhookConfig};
use crate::identity::{IdentityConfig, Mtls};

/// agent-reach-control: holds registrations on etcd leases and streams routing state to
/// every sidecar.
#[derive(Clone, Debug, Parser)]
#[command(name = "agent-reach-control", version, about)]
pub struct ControlArgs {
    /// gRPC listen address (Control and Admin APIs, grpc.health.v1).
    #[arg(long, env = "AGENT_REACH_LISTEN", default_value = "0.0.0.0:7800")]
    pub listen: SocketAddr,

    /// Admin HTTP address: /metrics, /healthz, /readyz (the store answers); "off" disables it.
    #[arg(long, env = "AGENT_REACH_ADMIN_LISTEN", default_value = "0.0.0.0:7801")]
    pub admin_listen: String,

    /// Dashboard HTTP address (the operators' web page); "off" disables it. Loopback
    /// addresses only until the dashboard has logins.
    #[arg(long, env = "AGENT_REACH_DASHBOARD_LISTEN", default_value = "127.0.0.1:7802")]
    pub dashboard_listen: String,

    /// Link each trace of the dashboard's traces view to the tracing backend: a URL
    /// template with `{trace_id}` (replaced by the trace id, URL-encoded), e.g.
    /// `http://jaeger:16686/trace/{trace_id}`. Must be http:// or https://. Unset: no link.
    #[arg(long, env = "AGENT_REACH_DASHBOARD_TRACE_URL")]
    pub dashboard_trace_url: Option<String>,

    /// Alert when an agent has fewer healthy (UP, DEGRADED, STARTING or operator-held)
    /// instances than this; 0 disables the rule.
    #[arg(long, env = "AGENT_REACH_ALERT_MIN_HEALTHY", default_value_t = 1)]
    pub alert_min_healthy: u32,

    /// Alert when this many instances of one agent are lost within --alert-lost-window.
    #[arg(long, env = "AGENT_REACH_ALERT_LOST_COUNT", default_value_t = 2)]
    pub alert_lost_count: usize,

    /// Calls of one target served by its fallback within a minute (summed over the
    /// sidecars' traffic reports) that fire the "served by its fallback" alert; 0 disables it.
    #[arg(long, env = "AGENT_REACH_ALERT_FALLBACK_CALLS", default_value_t = 5)]
    pub alert_fallback_calls: u64,

    /// The window of --alert-lost-count.
    #[arg(long, env = "AGENT_REACH_ALERT_LOST_WINDOW", default_value = "15s", value_parser = agent_reach_support::duration::parse)]
    pub alert_lost_window: Duration,

    /// POST every alert as JSON to this http:// URL, signed with --alert-webhook-secret-file.
    #[arg(long, env = "AGENT_REACH_ALERT_WEBHOOK_URL", requires = "alert_webhook_secret_file")]
    pub alert_webhook_url: Option<String>,

    /// File holding the webhook's HMAC-SHA256 key (its bytes, trailing newline removed).
    #[arg(long, env = "AGENT_REACH_ALERT_WEBHOOK_SECRET_FILE", requires = "alert_webhook_url")]
    pub alert_webhook_secret_file: Option<PathBuf>,

    /// Attempts per alert to deliver it to the webhook (retries back off exponentially).
    #[arg(long, env = "AGENT_REACH_ALERT_WEBHOOK_ATTEMPTS", default_value_t = 6)]
    pub alert_webhook_attempts: u32,

    /// Timeout of one webhook attempt.
    #[arg(long, env = "AGENT_REACH_ALERT_WEBHOOK_TIMEOUT", default_value = "5s", value_parser = agent_reach_support::duration::parse)]
    pub alert_webhook_timeout: Duration,

    /// etcd endpoints, comma-separated ("http://etcd-0:2379,..."). Without it the control
    /// service keeps its state in memory (embedded store, for development: state is lost
    /// when the process stops and replicas do not share it).
    #[arg(long, env = "AGENT_REACH_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// CA certificate (PEM) to verify etcd with; enables TLS (endpoints must be https://).
    #[arg(long, env = "AGENT_REACH_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) for etcd's client-certificate authentication; needs
    /// --etcd-key-file.
    #[arg(long, env = "AGENT_REACH_ETCD_CERT_FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,

    /// Private key (PEM) of --etcd-cert-file.
    #[arg(long, env = "AGENT_REACH_ETCD_KEY_FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,

    /// etcd user for etcd's authentication (RBAC); needs --etcd-password-file. Use TLS to
    /// etcd with it, or the password crosses the network in clear.
    #[arg(long, env = "AGENT_REACH_ETCD_USERNAME", requires = "etcd_password_file")]
    pub etcd_username: Option<String>,

    /// File holding the password of --etcd-username (one line).
    #[arg(long, env = "AGENT_REACH_ETCD_PASSWORD_FILE", requires = "etcd_username")]
    pub etcd_password_file: Option<PathBuf>,

    /// Timeout of each etcd request.
    #[arg(long, env = "AGENT_REACH_ETCD_TIMEOUT", default_value = "5s", value_parser = agent_reach_support::duration::parse)]
    pub etcd_timeout: Duration,

    /// Lifetime of a sidecar's lease without renewals (whole seconds). Sidecars renew every
    /// quarter of it; when it runs out, the sidecar's instances are removed.
    #[arg(long, env = "AGENT_REACH_LEASE_TTL", default_value = "20s", value_parser = agent_reach_support::duration::parse)]
    pub lease_ttl: Duration,

    /// Smallest change of an instance's load ratio (0..1) that is written to the store.
    #[arg(long, env = "AGENT_REACH_LOAD_STEP", default_value_t = 0.1)]
    pub load_step: f64,

    /// Load changes of one instance are written at most once per this interval (state
    /// changes are written at once).
    #[arg(long, env = "AGENT_REACH_LOAD_REPORT_INTERVAL", default_value = "5s", value_parser = agent_reach_support::duration::parse)]
    pub load_report_interval: Duration,

    /// Deltas each tenant feed keeps in memory for sidecars that reconnect; older
    /// revisions are replayed from etcd's history.
    #[arg(long, env = "AGENT_REACH_WATCH_HISTORY", default_value_t = 4096)]
    pub watch_history: usize,

    /// Tenants this replica follows at once (one store watch each); a Watch for one more
    /// tenant, while every feed is in use, is refused with LIMIT_EXCEEDED.
    #[arg(long, env = "AGENT_REACH_MAX_TENANT_FEEDS", default_value_t = crate::feed::DEFAULT_MAX_FEEDS)]
    pub max_tenant_feeds: usize,

    /// Runtime worker threads (0 = one per core the process may use, 1 = a single-threaded
    /// runtime, as is 0 on one core).
    #[arg(long, env = "AGENT_REACH_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// Trust domain of the mesh's SPIFFE ids
    /// (spiffe://<trust-domain>/tenant/<tenant>/sidecar/<id>).
    #[arg(long, env = "AGENT_REACH_TRUST_DOMAIN", default_value = agent_reach_identity::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,

    /// Certificate (PEM) of the CA that signs sidecars' certificates; needs --ca-key-file.
    /// Without it, a CA is generated in memory at start (development: every replica and
    /// every restart has its own).
    #[arg(long, env = "AGENT_REACH_CA_CERT_FILE", requires = "ca_key_file")]
    pub ca_cert_file: Option<PathBuf>,

    /// Private key (PEM) of --ca-cert-file.
    #[arg(long, env = "AGENT_REACH_CA_KEY_FILE", requires = "ca_cert_file")]
    pub ca_key_file: Option<PathBuf>,

    /// Trust bundle (PEM) handed to sidecars: the signing CA and, while a CA is rotated,
    /// the other one. Default: the signing CA alone.
    #[arg(long, env = "AGENT_REACH_TRUST_BUNDLE_FILE", requires = "ca_cert_file")]
    pub trust_bundle_file: Option<PathBuf>,

    /// Lifetime of the certificates issued to sidecars (they renew at two thirds of it).
    #[arg(long, env = "AGENT_REACH_CERT_TTL", default_value = "24h", value_parser = agent_reach_support::duration::parse)]
    pub cert_ttl: Duration,

    /// File holding the bootstrap admin token (cluster-wide admin role); every Admin call
    /// needs an operator token (`authorization: Bearer <token>`). When the file does not
    /// exist, a token is generated and written to it (mode 0600) once. Without this flag a
    /// token is generated at start and printed once to standard error.
    #[arg(long, env = "AGENT_REACH_ADMIN_TOKEN_FILE", conflicts_with = "insecure_open_admin_api")]
    pub admin_token_file: Option<PathBuf>,

    /// INSECURE: serve the Admin API without operator tokens, to anyone who reaches the port
    /// (development only; warned about at start).
    #[arg(long, env = "AGENT_REACH_INSECURE_OPEN_ADMIN_API")]
    pub insecure_open_admin_api: bool,

    /// Mutual TLS on the gRPC port: "required" (the default: every Control call needs a
    /// sidecar certificate issued by this CA), "permissive" (migration only: calls without
    /// one pass as anonymous and are counted), or "off" (INSECURE: plaintext, nothing
    /// checked; warned about at start).
    #[arg(long, env = "AGENT_REACH_MTLS", default_value = "required", value_parser = ["required", "permissive", "off"])]
    pub mtls: String,
    /// Redis URL (`redis://host:port`) to keep session context in, for high write rates.
    /// Without it sessions live in the control service's own store (etcd or embedded).
    #[arg(long, env = "AGENT_REACH_SESSION_REDIS")]
    pub session_redis: Option<String>,

    /// A session not written for this long is deleted (whole seconds).
    #[arg(long, env = "AGENT_REACH_SESSION_TTL", default_value = "24h", value_parser = agent_reach_support::duration::parse)]
    pub session_ttl: Duration,

    /// Largest session field (name + value + content type), in bytes.
    #[arg(long, env = "AGENT_REACH_SESSION_MAX_FIELD_BYTES", default_value_t = 64 * 1024)]
    pub session_max_field_bytes: usize,

    /// Largest session (the sum over its fields), in bytes.
    #[arg(long, env = "AGENT_REACH_SESSION_MAX_BYTES", default_value_t = 1024 * 1024)]
    pub session_max_bytes: usize,

    /// Most fields in one session.
    #[arg(long, env = "AGENT_REACH_SESSION_MAX_FIELDS", default_value_t = 256)]
    pub session_max_fields: usize,

    /// Most live sessions of one tenant.
    #[arg(long, env = "AGENT_REACH_SESSION_MAX_PER_TENANT", default_value_t = 10_000)]
    pub session_max_per_tenant: usize,

    /// A finished task (completed, failed, canceled, rejected) is kept this long.
    #[arg(long, env = "AGENT_REACH_TASK_RETENTION", default_value = "24h", value_parser = agent_reach_support::duration::parse)]
    pub task_retention: Duration,

    /// Largest task result (the sum of its artifacts), in bytes; larger ones are refused
    /// at completion.
    #[arg(long, env = "AGENT_REACH_TASK_MAX_RESULT_BYTES", default_value_t = 1024 * 1024)]
    pub task_max_result_bytes: usize,

    /// HTTP/2 streams open at once on one connection to the gRPC port.
    #[arg(long, env = "AGENT_REACH_MAX_CONCURRENT_STREAMS", default_value_t = 256)]
    pub max_concurrent_streams: u32,

    /// Requests handled at once per connection to the gRPC port; more wait their turn.
    #[arg(long, env = "AGENT_REACH_MAX_CONCURRENT_REQUESTS", default_value_t = 256)]
    pub max_concurrent_requests: usize,

    /// Largest request header list on the gRPC port, in bytes; a larger one is refused on
    /// its stream with LIMIT_EXCEEDED (past eight times it, HTTP 431).
    #[arg(long, env = "AGENT_REACH_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024)]
    pub max_header_list_bytes: u32,

    /// Time a gRPC request may take until its answer starts (streams: their first message);
    /// past it the request is refused with LIMIT_EXCEEDED.
    #[arg(long, env = "AGENT_REACH_REQUEST_TIMEOUT", default_value = "60s", value_parser = agent_reach_support::duration::parse)]
    pub request_timeout: Duration,

    /// Time a new connection to the gRPC port has to send its first complete request
    /// headers before it is closed (GOAWAY); with TLS, counted after the handshake.
    #[arg(long, env = "AGENT_REACH_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = agent_reach_support::duration::parse)]
    pub header_read_timeout: Duration,

    /// A connection to the gRPC port with no request in flight for this long is closed
    /// (GOAWAY).
    #[arg(long, env = "AGENT_REACH_IDLE_TIMEOUT", default_value = "5m", value_parser = agent_reach_support::duration::parse)]
    pub idle_timeout: Duration,

    /// A connection to the gRPC port with an open stream whose flow-control send window
    /// (or the connection's) has stayed at 0 or below for this long is closed (GOAWAY): a
    /// client that stalls a reply by never reading it.
    #[arg(long, env = "AGENT_REACH_SEND_STALL_TIMEOUT", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub send_stall_timeout: Duration,

    /// Connections open at once on the gRPC port; one more is closed as soon as it is
    /// accepted (with TLS, a connection counts from its accept, its handshake included).
    #[arg(long, env = "AGENT_REACH_MAX_CONNECTIONS", default_value_t = 8192)]
    pub max_connections: usize,

    /// PING, SETTINGS, PRIORITY and empty DATA frames one connection to the gRPC port may
    /// send within a second; one more closes it (GOAWAY ENHANCE_YOUR_CALM).
    #[arg(long, env = "AGENT_REACH_MAX_CONTROL_FRAMES_PER_SECOND", default_value_t = 1000)]
    pub max_control_frames_per_second: u32,

    /// Log format: "text" or "json".
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Validated configuration of the control service (the parts the service itself uses).
#[derive(Clone, Debug)]
pub struct ControlConfig {
    pub lease_ttl: Duration,
    pub load_step: f64,
    pub load_report_interval: Duration,
    pub watch_history: usize,
    /// Tenant feeds this replica runs at most (`--max-tenant-feeds`).
    pub max_tenant_feeds: usize,
    pub alerts: AlertConfig,
    /// The CA and certificate lifetime; `None` generates a development CA at start.
    pub identity: Option<IdentityConfig>,
    /// Mutual TLS on the gRPC port.
    pub mtls: Mtls,
    /// The bootstrap admin token; `None`: the Admin API is not authenticated.
    pub admin_token: Option<BootstrapToken>,
    /// What the session store enforces.
    pub session_limits: agent_reach_session::Limits,
    /// Where sessions live; `None`: in the control service's own store.
    pub session_store: Option<SessionBackend>,
    /// What the task store enforces.
    pub task_limits: crate::tasks::TaskLimits,
    /// Limits of the gRPC port.
    pub grpc_limits: crate::limits::GrpcLimits,
    /// The dashboard's link from a trace to the tracing backend (`--dashboard-trace-url`),
    /// validated; `None`: no link.
    pub dashboard_trace_url: Option<String>,
}

/// The bootstrap admin token (never printed).
#[derive(Clone)]
pub struct BootstrapToken(pub String);

impl BootstrapToken {
    /// 32 random bytes, hex.
    pub fn generate() -> BootstrapToken {
        BootstrapToken((0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect())
    }

    /// Writes the token to a new file at `path`, readable by this user only; fails when
    /// the file exists.
    pub fn write_new(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path)?;
        std::io::Write::write_all(&mut file, self.0.as_bytes())
    }
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BootstrapToken(..)")
    }
}

/// A session store chosen at start (Redis), shared by the service.
#[derive(Clone)]
pub struct SessionBackend(pub std::sync::Arc<dyn agent_reach_session::SessionStore>);

impl std::fmt::Debug for SessionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionBackend({})", self.0.backend())
    }
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            lease_ttl: Duration::from_secs(20),
            load_step: 0.1,
            load_report_interval: Duration::from_secs(5),
            watch_history: 4096,
            max_tenant_feeds: crate::feed::DEFAULT_MAX_FEEDS,
            alerts: AlertConfig::default(),
            identity: None,
            mtls: Mtls::Off,
            admin_token: None,
            session_limits: agent_reach_session::Limits::default(),
            session_store: None,
            task_limits: crate::tasks::TaskLimits::default(),
            grpc_limits: crate::limits::GrpcLimits::default(),
            dashboard_trace_url: None,
        }
    }
}

impl TryFrom<&ControlArgs> for ControlConfig {
    type Error = String;

    fn try_from(a: &ControlArgs) -> Result<Self, String> {
        let grpc_limits = crate::limits::GrpcLimits {
            max_concurrent_streams: a.max_concurrent_streams,
            max_concurrent_requests: a.max_concurrent_requests,
            max_header_list_bytes: a.max_header_list_bytes,
            request_timeout: a.request_timeout,
            header_read_timeout: a.header_read_timeout,
            idle_timeout: a.idle_timeout,
            send_stall_timeout: a.send_stall_timeout,
            max_connections: a.max_connections,
            max_control_frames_per_second: a.max_control_frames_per_second,
        };
        grpc_limits.validate()?;
        if a.admin_listen != "off" && a.admin_listen.parse::<SocketAddr>().is_err() {
            return Err(format!("--admin-listen: {:?} is not host:port or \"off\"", a.admin_listen));
        }
        if a.lease_ttl < Duration::from_secs(2) {
            return Err(format!("--lease-ttl must be at least 2s (etcd's minimum), got {:?}", a.lease_ttl));
        }
        if a.lease_ttl.subsec_nanos() != 0 {
            return Err("--lease-ttl must be whole seconds (etcd leases have second granularity)".into());
        }
        if a.etcd_endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err("--etcd-endpoints: empty endpoint in the list".into());
        }
        if a.etcd_username.is_some() && a.etcd_endpoints.is_empty() {
            return Err("--etcd-username needs --etcd-endpoints".into());
        }
        let tls = a.etcd_ca_file.is_some() || a.etcd_cert_file.is_some();
        if tls && a.etcd_endpoints.is_empty() {
            return Err("--etcd-ca-file / --etcd-cert-file need --etcd-endpoints".into());
        }
        if let Some(plain) = a.etcd_endpoints.iter().find(|e| tls && !e.trim().starts_with("https://")) {
            return Err(format!("--etcd-endpoints: {plain} must be https:// when etcd TLS files are given"));
        }
        if !(a.load_step > 0.0 && a.load_step <= 1.0) {
            return Err(format!("--load-step must be in (0, 1], got {}", a.load_step));
        }
        if a.load_report_interval.is_zero() {
            return Err("--load-report-interval must be greater than 0".into());
        }
        if a.watch_history == 0 {
            return Err("--watch-history must be at least 1".into());
        }
        if a.max_tenant_feeds == 0 {
            return Err("--max-tenant-feeds must be at least 1".into());
        }
        if a.cert_ttl < Duration::from_secs(60) || a.cert_ttl > Duration::from_secs(30 * 24 * 3600) {
            return Err(format!("--cert-ttl must be between 1m and 30d, got {:?}", a.cert_ttl));
        }
        let identity = match (&a.ca_cert_file, &a.ca_key_file) {
            (Some(cert), Some(key)) => {
                let read = |flag: &str, path: &std::path::Path| {
                    std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
                };
                let bundle = a.trust_bundle_file.as_deref().map(|p| read("--trust-bundle-file", p)).transpose()?;
                let ca = Ca::from_pem(
                    &a.trust_domain,
                    &read("--ca-cert-file", cert)?,
                    &read("--ca-key-file", key)?,
                    bundle.as_deref(),
                )
                .map_err(|e| format!("--ca-cert-file / --ca-key-file / --trust-bundle-file: {e}"))?;
                Some(IdentityConfig { ca: Arc::new(ca), cert_ttl: a.cert_ttl })
            }
            _ => {
                let ca = Ca::generate(&a.trust_domain).map_err(|e| format!("--trust-domain: {e}"))?;
                tracing::warn!(
                    trust_domain = %a.trust_domain,
                    "no --ca-cert-file: generated a development CA in memory; other replicas and restarts have \
                     their own, so give every replica the same CA files in production"
                );
                Some(IdentityConfig { ca: Arc::new(ca), cert_ttl: a.cert_ttl })
            }
        };
        if a.dashboard_listen != "off" {
            let addr = a
                .dashboard_listen
                .parse::<SocketAddr>()
                .map_err(|_| format!("--dashboard-listen: {:?} is not host:port or \"off\"", a.dashboard_listen))?;
            // With operator tokens people log in, and the dashboard may listen anywhere.
            if a.admin_token_file.is_none() {
                crate::dashboard::check_listen_address(addr)?;
            }
        }
        if a.alert_lost_count == 0 {
            return Err("--alert-lost-count must be at least 1".into());
        }
        if a.alert_lost_window.is_zero() {
            return Err("--alert-lost-window must be greater than 0".into());
        }
        let webhook = match (&a.alert_webhook_url, &a.alert_webhook_secret_file) {
            (Some(url), Some(secret_file)) => Some(webhook(a, url, secret_file)?),
            _ => None,
        };
        if a.session_ttl < Duration::from_secs(2) || a.session_ttl.subsec_nanos() != 0 {
            return Err(format!("--session-ttl must be whole seconds, at least 2s, got {:?}", a.session_ttl));
        }
        for (flag, value) in [
            ("--session-max-field-bytes", a.session_max_field_bytes),
            ("--session-max-bytes", a.session_max_bytes),
            ("--session-max-fields", a.session_max_fields),
            ("--session-max-per-tenant", a.session_max_per_tenant),
        ] {
            if value == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if a.session_max_field_bytes > a.session_max_bytes {
            return Err("--session-max-field-bytes must not exceed --session-max-bytes".into());
        }
        if a.task_retention < Duration::from_secs(2) || a.task_retention.subsec_nanos() != 0 {
            return Err(format!("--task-retention must be whole seconds, at least 2s, got {:?}", a.task_retention));
        }
        if a.task_max_result_bytes == 0 {
            return Err("--task-max-result-bytes must be at least 1".into());
        }
        if let Some(url) = &a.session_redis
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return Err(format!("--session-redis: {url:?} is not a redis:// URL"));
        }
        Ok(ControlConfig {
            lease_ttl: a.lease_ttl,
            load_step: a.load_step,
            load_report_interval: a.load_report_interval,
            watch_history: a.watch_history,
            max_tenant_feeds: a.max_tenant_feeds,
            alerts: AlertConfig {
                lost_window: a.alert_lost_window,
                lost_count: a.alert_lost_count,
                min_healthy: a.alert_min_healthy,
                fallback_calls: a.alert_fallback_calls,
                webhook,
                ..AlertConfig::default()
            },
            identity,
            mtls: Mtls::parse(&a.mtls).ok_or_else(|| format!("--mtls: unknown mode {:?}", a.mtls))?,
            admin_token: admin_token(a)?,
            session_limits: agent_reach_session::Limits {
                ttl: a.session_ttl,
                max_field_bytes: a.session_max_field_bytes,
                max_session_bytes: a.session_max_bytes,
                max_fields: a.session_max_fields,
                max_sessions_per_tenant: a.session_max_per_tenant,
            },
            session_store: None,
            task_limits: crate::tasks::TaskLimits {
                retention: a.task_retention,
                max_result_bytes: a.task_max_result_bytes,
                ..crate::tasks::TaskLimits::default()
            },
            grpc_limits,
            dashboard_trace_url: a.dashboard_trace_url.as_deref().map(trace_url_template).transpose()?,
        })
    }
}

/// Checks a `--dashboard-trace-url` template: an http:// or https:// URL with a host,
/// holding `{trace_id}`, without spaces or control characters (the page puts it in a link's
/// `href`, so nothing but a web address may come out of it).
pub fn trace_url_template(url: &str) -> Result<String, String> {
    let flag = "--dashboard-trace-url";
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://")) else {
        return Err(format!("{flag} {url:?}: must be an http:// or https:// URL"));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') || host.contains("{trace_id}") {
        return Err(format!("{flag} {url:?}: names no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{flag} {url:?}: holds a space or a control character"));
    }
    if !url.contains("{trace_id}") {
        return Err(format!("{flag} {url:?}: must contain {{trace_id}}, where the trace id goes"));
    }
    Ok(url.to_string())
}

/// The bootstrap admin token the flags ask for: read from `--admin-token-file`, generated
/// into it when the file does not exist, generated and printed once without the flag, or
/// none with `--insecure-open-admin-api`.
fn admin_token(a: &ControlArgs) -> Result<Option<BootstrapToken>, String> {
    if a.insecure_open_admin_api {
        return Ok(None);
    }
    let Some(path) = &a.admin_token_file else {
        let token = BootstrapToken::generate();
        eprintln!(
            "agent-reach-control: no --admin-token-file: generated the bootstrap admin token (cluster admin; \
             shown only now, pass --admin-token-file to keep one):\n{}",
            token.0
        );
        return Ok(Some(token));
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.len() < 16 {
                return Err("--admin-token-file: the token must be at least 16 characters".into());
            }
            Ok(Some(BootstrapToken(token)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = BootstrapToken::generate();
            token.write_new(path).map_err(|e| format!("--admin-token-file {}: {e}", path.display()))?;
            eprintln!(
                "agent-reach-control: generated the bootstrap admin token into {} (readable by this user only)",
                path.display()
            );
            Ok(Some(token))
        }
        Err(e) => Err(format!("--admin-token-file {}: {e}", path.display())),
    }
}

fn webhook(a: &ControlArgs, url: &str, secret_file: &std::path::Path) -> Result<WebhookConfig, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("--alert-webhook-url {url}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!("--alert-webhook-url {url}: must be an http:// URL (https is not supported yet)"));
    }
    let mut secret = std::fs::read(secret_file)
        .map_err(|e| format!("--alert-webhook-secret-file {}: {e}", secret_file.display()))?;
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    if secret.len() < 16 {
        return Err("--alert-webhook-secret-file: the key must be at least 16 bytes".into());
    }
    if a.alert_webhook_attempts == 0 {
        return Err("--alert-webhook-attempts must be at least 1".into());
    }
    if a.alert_webhook_timeout.is_zero() {
        return Err("--alert-webhook-timeout must be greater than 0".into());
    }
    Ok(WebhookConfig {
        url: uri,
        secret,
        attempts: a.alert_webhook_attempts,
        timeout: a.alert_webhook_timeout,
        backoff: Duration::from_millis(500),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, value) in [
            ("--lease-ttl", "1s"),
            ("--lease-ttl", "2500ms"),
            ("--load-step", "0"),
            ("--load-step", "1.5"),
            ("--load-report-interval", "0s"),
            ("--watch-history", "0"),
            ("--dashboard-listen", "0.0.0.0:7802"),
            ("--dashboard-listen", "nowhere"),
            ("--alert-lost-count", "0"),
            ("--session-ttl", "1s"),
            ("--session-max-fields", "0"),
            ("--session-redis", "http://r:6379"),
        ] {
            let a = ControlArgs::parse_from(["control", flag, value]);
            let error = ControlConfig::try_from(&a).unwrap_err();
            assert!(error.contains(flag), "{flag} {value}: {error}");
        }
    }

    #[test]
    fn the_dashboard_trace_url_is_an_http_template_with_the_trace_id() {
        let a = ControlArgs::parse_from(["control"]);
        assert_eq!(ControlConfig::try_from(&a).unwrap().dashboard_trace_url, None);
        for good in [
            "http://jaeger:16686/trace/{trace_id}",
            "https://tempo.example/explore?trace={trace_id}&orgId=1",
            "HTTPS://grafana.example/{trace_id}",
        ] {
            let a = ControlArgs::parse_from(["control", "--dashboard-trace-url", good]);
            assert_eq!(ControlConfig::try_from(&a).unwrap().dashboard_trace_url.as_deref(), Some(good));
        }
        for (bad, why) in [
            ("http://jaeger:16686/trace/", "must contain {trace_id}"),
            ("ftp://jaeger/{trace_id}", "http:// or https://"),
            ("javascript:alert(1)//{trace_id}", "http:// or https://"),
            ("jaeger:16686/trace/{trace_id}", "http:// or https://"),
            ("http:///trace/{trace_id}", "names no host"),
            ("http://{trace_id}/", "names no host"),
            ("http://:16686/{trace_id}", "names no host"),
            ("http://jaeger/trace/{trace_id} x", "space or a control character"),
            ("http://jaeger/trace/{trace_id}\n", "space or a control character"),
        ] {
            let a = ControlArgs::parse_from(["control", "--dashboard-trace-url", bad]);
            let error = ControlConfig::try_from(&a).unwrap_err();
            assert!(error.starts_with("--dashboard-trace-url ") && error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn the_etcd_user_needs_its_password_file_and_etcd() {
        assert!(ControlArgs::try_parse_from(["control", "--etcd-username", "agent-reach"]).is_err());
        assert!(ControlArgs::try_parse_from(["control", "--etcd-password-file", "/p"]).is_err());
        let a = ControlArgs::parse_from(["control", "--etcd-username", "u", "--etcd-password-file", "/p"]);
        assert!(ControlConfig::try_from(&a).unwrap_err().contains("--etcd-username"));
    }

    #[test]
    fn a_missing_admin_token_file_is_generated_once_and_then_read() {
        let dir = std::env::temp_dir().join(format!("ar-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let _ = std::fs::remove_file(&path);
        let args = ControlArgs::parse_from(["control", "--admin-token-file", path.to_str().unwrap()]);
        let first = ControlConfig::try_from(&args).unwrap().admin_token.unwrap().0;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        #[cfg(unix)]
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions()) & 0o777,
            0o600
        );
        let second = ControlConfig::try_from(&args).unwrap().admin_token.unwrap().0;
        assert_eq!(first, second, "an existing file is read, not replaced");
        std::fs::write(&path, "short").unwrap();
        assert!(ControlConfig::try_from(&args).unwrap_err().contains("at least 16"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn defaults() {
        let a = ControlArgs::parse_from(["control"]);
        let c = ControlConfig::try_from(&a).unwrap();
        let d = ControlConfig::default();
        assert_eq!(
            (c.lease_ttl, c.load_report_interval, c.watch_history),
            (d.lease_ttl, d.load_report_interval, d.watch_history)
        );
        assert_eq!(c.lease_ttl, Duration::from_secs(20));
        assert_eq!(c.load_step, 0.1);
        assert_eq!(c.session_limits, agent_reach_session::Limits::default());
        assert!(a.etcd_endpoints.is_empty());
        // Secure by default: mutual TLS required and an Admin token generated.
        assert_eq!(c.mtls, Mtls::Required);
        assert!(c.admin_token.as_ref().is_some_and(|t| t.0.len() == 64));
        let a = ControlArgs::parse_from(["control", "--mtls", "off", "--insecure-open-admin-api"]);
        let c = ControlConfig::try_from(&a).unwrap();
        assert_eq!((c.mtls, c.admin_token.is_none()), (Mtls::Off, true));
        assert!(
            ControlArgs::try_parse_from(["control", "--insecure-open-admin-api", "--admin-token-file", "/t"]).is_err(),
            "an open Admin API and a token file contradict each other"
        );
        let a = ControlArgs::parse_from(["control", "--etcd-endpoints", "http://e:2379", "--etcd-ca-file", "/ca.pem"]);
        assert!(ControlConfig::try_from(&a).unwrap_err().contains("https://"));
        assert!(
            ControlArgs::try_parse_from(["control", "--etcd-cert-file", "/c.pem"]).is_err(),
            "a cert needs its key"
        );
    }
}
