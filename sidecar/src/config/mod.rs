//! The sidecar's configuration: command-line flags and `AGENT_REACH_*` environment
//! variables, parsed once at start into [`SidecarConfig`]. Bad values fail start with a
//! message naming the flag. Nothing here is read again after start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// The version and how the binary was optimized: "standard build", or "profile-guided
/// build" from `scripts/build-pgo.sh` (see the sidecar's build script).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("AGENT_REACH_SIDECAR_BUILD"), ")");

/// agent-reach-sidecar: routes agents' calls by capability and carries them to the sidecar
/// next to the chosen instance.
#[derive(Clone, Debug, Parser)]
#[command(name = "agent-reach-sidecar", version = VERSION, about)]
pub struct SidecarArgs {
    /// Address of the local API (agents call Register, Invoke... here).
    #[arg(long, env = "AGENT_REACH_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,

    /// Address of the mesh API (other sidecars deliver calls here).
    #[arg(long, env = "AGENT_REACH_MESH_LISTEN", default_value = "0.0.0.0:7701")]
    pub mesh_listen: SocketAddr,

    /// Mesh address other sidecars use to reach this one ("host:port"). Default: the mesh
    /// listen address, or this host's name with the mesh port when listening on 0.0.0.0.
    #[arg(long, env = "AGENT_REACH_ADVERTISE")]
    pub advertise: Option<String>,

    /// Control service endpoints, comma-separated ("http://host:7800,...").
    #[arg(long, env = "AGENT_REACH_CONTROL", value_delimiter = ',', default_value = "http://127.0.0.1:7800")]
    pub control: Vec<String>,

    /// Tenant this sidecar and its agents belong to.
    #[arg(long, env = "AGENT_REACH_TENANT", default_value = "default")]
    pub tenant: String,

    /// Unique id of this sidecar. Default: host name plus a random suffix.
    #[arg(long, env = "AGENT_REACH_SIDECAR_ID")]
    pub sidecar_id: Option<String>,

    /// Largest payload accepted in a call, in bytes.
    #[arg(long, env = "AGENT_REACH_MAX_PAYLOAD_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_payload_bytes: usize,

    /// Deadline applied to calls that carry none, e.g. "30s".
    #[arg(long, env = "AGENT_REACH_DEFAULT_TIMEOUT", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub default_timeout: Duration,

    /// Time kept back from the remaining deadline at each hop, so an answer that arrives is
    /// never already too late for the caller, e.g. "5ms".
    #[arg(long, env = "AGENT_REACH_DEADLINE_RESERVE", default_value = "5ms", value_parser = agent_reach_support::duration::parse)]
    pub deadline_reserve: Duration,

    /// How often agents are asked to heartbeat. An agent silent for two intervals is
    /// UNKNOWN and gets probed.
    #[arg(long, env = "AGENT_REACH_HEARTBEAT_INTERVAL", default_value = "2s", value_parser = agent_reach_support::duration::parse)]
    pub heartbeat_interval: Duration,

    /// How often a silent agent is probed with grpc.health.v1 (2 s timeout); a probe
    /// settles it UP or DOWN.
    #[arg(long, env = "AGENT_REACH_PROBE_INTERVAL", default_value = "2s", value_parser = agent_reach_support::duration::parse)]
    pub probe_interval: Duration,

    /// An agent with no heartbeat and no successful probe for this long is removed. The
    /// default outlasts a 10 s GC pause three times over, so a paused agent keeps its
    /// instance id and registration (it shows UNKNOWN, then DOWN, then its own state again).
    #[arg(long, env = "AGENT_REACH_DEAD_AFTER", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub dead_after: Duration,

    /// How often the sidecar's traffic report (call edges, open breakers, last heartbeats,
    /// newest spans) rides on a heartbeat to control, for the dashboard and alerts; "0s"
    /// sends none. Control stores each one, so this is one store write per sidecar per
    /// interval.
    #[arg(long, env = "AGENT_REACH_REPORT_INTERVAL", default_value = "10s", value_parser = agent_reach_support::duration::parse)]
    pub report_interval: Duration,

    /// Timeout of control-service requests (Register, Heartbeat, Deregister).
    #[arg(long, env = "AGENT_REACH_CONTROL_TIMEOUT", default_value = "3s", value_parser = agent_reach_support::duration::parse)]
    pub control_timeout: Duration,

    /// Where the last routing table is saved, to route from it after a restart while
    /// control is unreachable. Default: agent-reach/<tenant>-<local port>.table.json in
    /// $XDG_STATE_HOME, else ~/.local/state (off when neither is set); "off" disables it. The
    /// directory must not be writable by others.
    #[arg(long, env = "AGENT_REACH_TABLE_FILE")]
    pub table_file: Option<String>,

    /// On shutdown (SIGTERM), how long calls in flight may take to finish after the local
    /// agents are reported PAUSED and before they are deregistered.
    #[arg(long, env = "AGENT_REACH_DRAIN_TIMEOUT", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub drain_timeout: Duration,

    /// How long an idempotency key's answer is kept and replayed to duplicates (here and in
    /// the key's claim with control; 1s to 24h).
    #[arg(long, env = "AGENT_REACH_IDEMPOTENCY_WINDOW", default_value = "10m", value_parser = agent_reach_support::duration::parse)]
    pub idempotency_window: Duration,

    /// Largest answer kept for idempotency replays, in bytes; duplicates of a call with a
    /// larger answer are refused rather than run again.
    #[arg(long, env = "AGENT_REACH_IDEMPOTENCY_MAX_REPLY_BYTES", default_value_t = 1024 * 1024)]
    pub idempotency_max_reply_bytes: usize,

    /// Bytes of answers kept for idempotency replays in all; past it the oldest answered
    /// keys are forgotten first.
    #[arg(long, env = "AGENT_REACH_IDEMPOTENCY_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub idempotency_max_bytes: usize,

    /// Memory of the result cache of read-only capabilities, in bytes.
    #[arg(long, env = "AGENT_REACH_CACHE_MAX_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub cache_max_bytes: usize,

    /// Largest session (encoded bytes) delivered with a call to a gRPC agent, whose SDK then
    /// answers the handler's reads of it in-process; larger sessions are read through the
    /// sidecar. 0: never delivered.
    #[arg(long, env = "AGENT_REACH_SESSION_SNAPSHOT_MAX_BYTES", default_value_t = 64 * 1024)]
    pub session_snapshot_max_bytes: usize,

    /// Hosts an HTTP agent's endpoint may name besides loopback (127.0.0.0/8, ::1,
    /// localhost), comma-separated, e.g. "10.0.0.5,agents.internal"; "*" allows any host.
    /// Default: none, so the sidecar cannot be pointed at other machines (server-side
    /// request forgery); a registration naming another host is refused.
    #[arg(long, env = "AGENT_REACH_HTTP_AGENT_ALLOWED_HOSTS", value_delimiter = ',')]
    pub http_agent_allowed_hosts: Vec<String>,

    /// Largest request header list on the local and mesh ports, in bytes (HPACK size:
    /// name + value + 32 per field). A larger one is refused on its stream with
    /// LIMIT_EXCEEDED; the connection and its other streams carry on.
    #[arg(long, env = "AGENT_REACH_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024)]
    pub max_header_list_bytes: u32,

    /// HTTP/2 streams open at once on one connection of the local or mesh port; streams
    /// past it are refused (REFUSED_STREAM) and clients queue them.
    #[arg(long, env = "AGENT_REACH_MAX_CONCURRENT_STREAMS", default_value_t = 256)]
    pub max_concurrent_streams: u32,

    /// Connections open at once on each of the local and mesh ports; one more is closed
    /// as soon as it is accepted.
    #[arg(long, env = "AGENT_REACH_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Connections open at once from one peer sidecar (its verified identity) on the mesh
    /// port with mutual TLS; one more is closed after its handshake.
    #[arg(long, env = "AGENT_REACH_MAX_CONNECTIONS_PER_PEER", default_value_t = 64)]
    pub max_connections_per_peer: usize,

    /// PING, SETTINGS, PRIORITY and empty DATA frames one connection to the local or mesh
    /// port may send within a second; one more closes it (GOAWAY ENHANCE_YOUR_CALM).
    #[arg(long, env = "AGENT_REACH_MAX_CONTROL_FRAMES_PER_SECOND", default_value_t = 1000)]
    pub max_control_frames_per_second: u32,

    /// Time a new connection to the local or mesh port has to send its first request
    /// headers before it is closed.
    #[arg(long, env = "AGENT_REACH_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = agent_reach_support::duration::parse)]
    pub header_read_timeout: Duration,

    /// Time a call has to send its request body; a call whose body stalls is refused with
    /// LIMIT_EXCEEDED before it takes an admission slot.
    #[arg(long, env = "AGENT_REACH_BODY_READ_TIMEOUT", default_value = "15s", value_parser = agent_reach_support::duration::parse)]
    pub body_read_timeout: Duration,

    /// A connection to the local or mesh port with no call in flight for this long is
    /// closed (GOAWAY).
    #[arg(long, env = "AGENT_REACH_IDLE_TIMEOUT", default_value = "5m", value_parser = agent_reach_support::duration::parse)]
    pub idle_timeout: Duration,

    /// A reply on the local or mesh port that waits this long for the client's HTTP/2
    /// flow-control window (a client that never sends WINDOW_UPDATE) has its stream reset
    /// (RST_STREAM CANCEL); the call's slot and buffered bytes are freed.
    #[arg(long, env = "AGENT_REACH_SEND_STALL_TIMEOUT", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub send_stall_timeout: Duration,

    /// Admin HTTP address: /metrics, /healthz, /readyz, /traces/{trace-id}; "off" disables it.
    #[arg(long, env = "AGENT_REACH_ADMIN_LISTEN", default_value = "127.0.0.1:7702")]
    pub admin_listen: String,

    /// Local HTTP address of the A2A JSON-RPC binding (with SSE streaming; agent cards at
    /// /agents/{agent}/.well-known/agent-card.json); "off" disables it. The A2A gRPC binding
    /// (lf.a2a.v1.A2AService) is always served on the local API port.
    #[arg(long, env = "AGENT_REACH_A2A_LISTEN", default_value = "127.0.0.1:7703")]
    pub a2a_listen: String,

    /// A2A tasks kept in memory for GetTask and ListTasks; beyond it the oldest finished
    /// task is forgotten, and new messages are refused while every kept task still runs.
    #[arg(long, env = "AGENT_REACH_A2A_MAX_TASKS", default_value_t = 10_000)]
    pub a2a_max_tasks: usize,

    /// OTLP/gRPC collector to export spans to, e.g. http://127.0.0.1:4317; none = no export
    /// (recent spans still show on the admin port).
    #[arg(long, env = "AGENT_REACH_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Share of calls traced when the caller's trace context does not decide (0.0..=1.0).
    /// A sampled `traceparent`, or the request header `ar-trace: force`, traces the whole chain.
    #[arg(long, env = "AGENT_REACH_TRACE_SAMPLE_RATIO", default_value_t = 0.01)]
    pub trace_sample_ratio: f64,

    /// /readyz stays ready without control for this long, routing from the last table.
    #[arg(long, env = "AGENT_REACH_READY_MAX_STALE", default_value = "5m", value_parser = agent_reach_support::duration::parse)]
    pub ready_max_stale: Duration,

    /// After a reconnection to control, removals of instances are held this long, until
    /// their own sidecar registers them again: records lost to lease expiry during a long
    /// control outage stay routable meanwhile. "0s" applies removals at once.
    #[arg(long, env = "AGENT_REACH_REMOVAL_GRACE", default_value = "10s", value_parser = agent_reach_support::duration::parse)]
    pub removal_grace: Duration,

    /// Runtime worker threads (0 = one per core the process may use, 1 = a single-threaded
    /// runtime, as is 0 on one core).
    #[arg(long, env = "AGENT_REACH_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// Trust bundle (PEM) to check the control service's certificate with. With it, the
    /// sidecar speaks mutual TLS to control: it buys a certificate with --join-token-file
    /// and renews it at two thirds of its lifetime.
    #[arg(long, env = "AGENT_REACH_TRUST_BUNDLE_FILE", requires = "join_token_file")]
    pub trust_bundle_file: Option<PathBuf>,

    /// File holding a join token of --tenant (from `agent-reach ctl join-token create`).
    #[arg(long, env = "AGENT_REACH_JOIN_TOKEN_FILE", requires = "trust_bundle_file")]
    pub join_token_file: Option<PathBuf>,

    /// Where the workload certificate and its key are kept (mode 0600), so the sidecar
    /// starts while control is unreachable. Default: next to the table file
    /// (<table file>.identity.json); "off" keeps them in memory only.
    #[arg(long, env = "AGENT_REACH_IDENTITY_FILE")]
    pub identity_file: Option<String>,

    /// Mutual TLS on the mesh port: "required" (every peer presents a sidecar certificate
    /// of the trust bundle) or "permissive" (migration only: plaintext connections are
    /// served too, without a verified peer, counted and warned about at start).
    #[arg(long, env = "AGENT_REACH_MESH_MTLS", default_value = "required", value_parser = ["required", "permissive"])]
    pub mesh_mtls: String,

    /// Trust domain of the mesh's SPIFFE ids.
    #[arg(long, env = "AGENT_REACH_TRUST_DOMAIN", default_value = agent_reach_identity::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,

    /// A task this sidecar dispatches is claimed for this long, renewed while it runs; a
    /// claim not renewed in time (the sidecar died) lets another sidecar take the task over.
    #[arg(long, env = "AGENT_REACH_TASK_CLAIM_TTL", default_value = "30s", value_parser = agent_reach_support::duration::parse)]
    pub task_claim_ttl: Duration,

    /// Longest time one attempt of a task may run before it fails (reason DEADLINE_EXCEEDED).
    #[arg(long, env = "AGENT_REACH_TASK_TIMEOUT", default_value = "1h", value_parser = agent_reach_support::duration::parse)]
    pub task_timeout: Duration,

    /// Also serve the local API on this Unix domain socket (file mode --local-uds-mode).
    #[arg(long, env = "AGENT_REACH_LOCAL_UDS")]
    pub local_uds: Option<PathBuf>,

    /// File mode of the --local-uds socket, in octal (who may connect).
    #[arg(long, env = "AGENT_REACH_LOCAL_UDS_MODE", default_value = "600")]
    pub local_uds_mode: String,

    /// File holding the local API token (at least 16 characters): every local request must
    /// then carry it as the metadata ar-api-token (SDKs: AGENT_REACH_API_TOKEN), health
    /// checks excepted.
    #[arg(long, env = "AGENT_REACH_LOCAL_TOKEN_FILE")]
    pub local_token_file: Option<PathBuf>,

    /// INSECURE: talk to control in plaintext and serve the mesh port in plaintext, with no
    /// certificate (development only; warned about at start). Without it the sidecar needs
    /// --trust-bundle-file and --join-token-file.
    #[arg(long, env = "AGENT_REACH_INSECURE_PLAINTEXT_CONTROL", conflicts_with_all = ["trust_bundle_file", "join_token_file"])]
    pub insecure_plaintext_control: bool,

    /// Log format: "text" or "json".
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Validated configuration.
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    pub tenant: String,
    pub sidecar_id: String,
    /// Filled in by [`crate::Sidecar::start`] from the bound mesh listener when not given.
    pub advertise: Option<String>,
    pub control: Vec<String>,
    pub max_payload_bytes: usize,
    pub default_timeout: Duration,
    pub deadline_reserve: Duration,
    pub heartbeat_interval: Duration,
    pub probe_interval: Duration,
    pub dead_after: Duration,
    /// How often a traffic report rides on a heartbeat (zero: never).
    pub report_interval: Duration,
    pub control_timeout: Duration,
    /// Where the routing table is saved and loaded from; `None` = not at all.
    pub table_file: Option<PathBuf>,
    pub drain_timeout: Duration,
    pub idempotency_window: Duration,
    pub idempotency_max_reply_bytes: usize,
    /// Keys kept at most (the oldest answered keys go first beyond it).
    pub idempotency_max_keys: usize,
    /// Bytes of answers kept at most (`--idempotency-max-bytes`).
    pub idempotency_max_bytes: usize,
    pub cache_max_bytes: usize,
    pub cache_max_entries: usize,
    /// Largest session delivered with a call (`--session-snapshot-max-bytes`); 0: none.
    pub session_snapshot_max_bytes: usize,
    pub otlp_endpoint: Option<String>,
    pub trace_sample_ratio: f64,
    /// Spans kept in memory for /traces.
    pub recent_spans: usize,
    pub ready_max_stale: Duration,
    /// Removals arriving within this long after a reconnection to control are held (see
    /// `grace.rs`); zero: never.
    pub removal_grace: Duration,
    /// Where the A2A JSON-RPC binding listens; `None`: not served (the gRPC binding is).
    pub a2a_listen: Option<SocketAddr>,
    /// A2A tasks kept in memory.
    pub a2a_max_tasks: usize,
    /// Mutual TLS toward control with a certificate bought with a join token; `None`:
    /// plaintext.
    pub identity: Option<crate::identity::IdentitySettings>,
    /// Where the workload certificate is kept (`--identity-file`); `None`: in memory only.
    pub identity_file: Option<PathBuf>,
    /// `--mesh-mtls permissive`: the mesh port serves plaintext connections too.
    pub mesh_permissive: bool,
    /// Non-loopback hosts an HTTP agent's endpoint may name (`--http-agent-allowed-hosts`).
    pub http_agent_allowed_hosts: Vec<String>,
    /// Durable tasks: how long this sidecar's dispatch claim lasts unless renewed.
    pub task_claim_ttl: Duration,
    /// Longest attempt of a task.
    pub task_timeout: Duration,
    /// The local API also on this Unix socket, with this file mode (`--local-uds`).
    pub local_uds: Option<(PathBuf, u32)>,
    /// The token every local request must carry (`--local-token-file`); `None`: none.
    pub local_token: Option<crate::local_access::ApiToken>,
    /// Limits of the local and mesh ports.
    pub limits: crate::limits::PortLimits,
}

impl SidecarConfig {
    /// Defaults for a sidecar talking to `control` (used by tests and `agent-reach up`).
    pub fn new(control: Vec<String>) -> SidecarConfig {
        SidecarConfig {
            tenant: "default".into(),
            sidecar_id: default_sidecar_id(),
            advertise: None,
            control,
            max_payload_bytes: 4 * 1024 * 1024,
            default_timeout: Duration::from_secs(30),
            deadline_reserve: Duration::from_millis(5),
            heartbeat_interval: Duration::from_secs(2),
            probe_interval: Duration::from_secs(2),
            dead_after: Duration::from_secs(30),
            report_interval: Duration::from_secs(10),
            control_timeout: Duration::from_secs(3),
            table_file: None,
            drain_timeout: Duration::from_secs(30),
            idempotency_window: Duration::from_secs(600),
            idempotency_max_reply_bytes: 1024 * 1024,
            idempotency_max_keys: 100_000,
            idempotency_max_bytes: 256 * 1024 * 1024,
            cache_max_bytes: 64 * 1024 * 1024,
            cache_max_entries: 100_000,
            session_snapshot_max_bytes: 64 * 1024,
            otlp_endpoint: None,
            trace_sample_ratio: 0.01,
            recent_spans: 4096,
            ready_max_stale: Duration::from_secs(300),
            removal_grace: Duration::from_secs(10),
            a2a_listen: None,
            a2a_max_tasks: 10_000,
            identity: None,
            identity_file: None,
            mesh_permissive: false,
            http_agent_allowed_hosts: Vec::new(),
            task_claim_ttl: Duration::from_secs(30),
            task_timeout: Duration::from_secs(3600),
            local_uds: None,
            local_token: None,
            limits: crate::limits::PortLimits::default(),
        }
    }
}

impl TryFrom<&SidecarArgs> for SidecarConfig {
    type Error = String;

    fn try_from(a: &SidecarArgs) -> Result<Self, String> {
        agent_reach::model::validate_tenant("--tenant", &a.tenant).map_err(|e| e.to_string())?;
        if a.control.is_empty() || a.control.iter().any(|c| c.trim().is_empty()) {
            return Err("--control: at least one control endpoint is required".into());
        }
        if a.max_payload_bytes == 0 {
            return Err("--max-payload-bytes must be greater than 0".into());
        }
        if a.heartbeat_interval.is_zero() || a.probe_interval.is_zero() || a.control_timeout.is_zero() {
            return Err("--heartbeat-interval, --probe-interval and --control-timeout must be greater than 0".into());
        }
        if !(0.0..=1.0).contains(&a.trace_sample_ratio) {
            return Err("--trace-sample-ratio must be between 0 and 1".into());
        }
        if a.admin_listen != "off" && a.admin_listen.parse::<SocketAddr>().is_err() {
            return Err(format!("--admin-listen: {:?} is not host:port or \"off\"", a.admin_listen));
        }
        let a2a_listen = match a.a2a_listen.as_str() {
            "off" => None,
            l => Some(l.parse::<SocketAddr>().map_err(|_| format!("--a2a-listen: {l:?} is not host:port or \"off\""))?),
        };
        if a.a2a_max_tasks == 0 {
            return Err("--a2a-max-tasks must be greater than 0".into());
        }
        // Control keeps a key's claim for the window and refuses windows over 24 hours.
        if a.idempotency_window < Duration::from_secs(1) || a.idempotency_window > Duration::from_secs(24 * 3600) {
            return Err("--idempotency-window must be between 1s and 24h".into());
        }
        let settle = a.heartbeat_interval * 2 + crate::probe::PROBE_TIMEOUT;
        if a.dead_after <= settle {
            return Err(format!(
                "--dead-after must be longer than two heartbeat intervals plus the 2s probe timeout ({settle:?}), got {:?}",
                a.dead_after
            ));
        }
        if a.default_timeout.is_zero() {
            return Err("--default-timeout must be greater than 0".into());
        }
        if a.task_claim_ttl < Duration::from_secs(1) {
            return Err(format!("--task-claim-ttl must be at least 1s, got {:?}", a.task_claim_ttl));
        }
        if a.task_timeout.is_zero() {
            return Err("--task-timeout must be greater than 0".into());
        }
        let limits = crate::limits::PortLimits {
            max_header_list_bytes: a.max_header_list_bytes,
            max_concurrent_streams: a.max_concurrent_streams,
            max_connections: a.max_connections,
            max_connections_per_peer: a.max_connections_per_peer,
            max_control_frames_per_second: a.max_control_frames_per_second,
            header_read_timeout: a.header_read_timeout,
            body_read_timeout: a.body_read_timeout,
            idle_timeout: a.idle_timeout,
            send_stall_timeout: a.send_stall_timeout,
        };
        limits.validate()?;
        let sidecar_id = match &a.sidecar_id {
            Some(id) => {
                agent_reach::model::validate_name("--sidecar-id", id).map_err(|e| e.to_string())?;
                id.clone()
            }
            None => default_sidecar_id(),
        };
        let table_file = match a.table_file.as_deref() {
            Some("off") => None,
            Some("") => return Err("--table-file: empty path (use \"off\" to disable)".into()),
            Some(path) => Some(PathBuf::from(path)),
            None => crate::persist::default_path(&a.tenant, a.listen.port()),
        };
        let identity_file = match a.identity_file.as_deref() {
            Some("off") => None,
            Some("") => return Err("--identity-file: empty path (use \"off\" to disable)".into()),
            Some(path) => Some(PathBuf::from(path)),
            None => table_file.as_ref().map(|t| t.with_extension("identity.json")),
        };
        if a.mesh_mtls == "permissive" && a.insecure_plaintext_control {
            return Err("--mesh-mtls permissive needs a certificate (--trust-bundle-file and --join-token-file); \
                        with --insecure-plaintext-control the mesh port is plaintext already"
                .into());
        }
        Ok(SidecarConfig {
            tenant: a.tenant.clone(),
            sidecar_id,
            advertise: a.advertise.clone(),
            control: a.control.iter().map(|c| c.trim().to_string()).collect(),
            max_payload_bytes: a.max_payload_bytes,
            default_timeout: a.default_timeout,
            deadline_reserve: a.deadline_reserve,
            heartbeat_interval: a.heartbeat_interval,
            probe_interval: a.probe_interval,
            dead_after: a.dead_after,
            report_interval: a.report_interval,
            control_timeout: a.control_timeout,
            table_file,
            drain_timeout: a.drain_timeout,
            idempotency_window: a.idempotency_window,
            idempotency_max_reply_bytes: a.idempotency_max_reply_bytes,
            idempotency_max_keys: 100_000,
            idempotency_max_bytes: a.idempotency_max_bytes,
            cache_max_bytes: a.cache_max_bytes,
            cache_max_entries: 100_000,
            session_snapshot_max_bytes: a.session_snapshot_max_bytes,
            otlp_endpoint: a.otlp_endpoint.clone(),
            trace_sample_ratio: a.trace_sample_ratio,
            recent_spans: 4096,
            ready_max_stale: a.ready_max_stale,
            removal_grace: a.removal_grace,
            a2a_listen,
            a2a_max_tasks: a.a2a_max_tasks,
            identity: match (&a.trust_bundle_file, &a.join_token_file) {
                (Some(bundle), Some(token)) => {
                    let read = |flag: &str, path: &std::path::Path| {
                        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
                    };
                    let join_token = read("--join-token-file", token)?.trim().to_string();
                    if join_token.is_empty() {
                        return Err("--join-token-file: the file is empty".into());
                    }
                    Some(crate::identity::IdentitySettings {
                        trust_domain: a.trust_domain.clone(),
                        trust_bundle_pem: read("--trust-bundle-file", bundle)?,
                        join_token,
                    })
                }
                _ if a.insecure_plaintext_control => None,
                _ => {
                    return Err("--trust-bundle-file and --join-token-file are required: the sidecar speaks mutual \
                                TLS to control and on the mesh port (for a plaintext development setup, pass \
                                --insecure-plaintext-control)"
                        .into());
                }
            },
            identity_file,
            mesh_permissive: a.mesh_mtls == "permissive",
            http_agent_allowed_hosts: a
                .http_agent_allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            task_claim_ttl: a.task_claim_ttl,
            task_timeout: a.task_timeout,
            local_uds: match &a.local_uds {
                None => None,
                Some(path) => {
                    let mode = u32::from_str_radix(&a.local_uds_mode, 8)
                        .ok()
                        .filter(|m| *m <= 0o777)
                        .ok_or_else(|| format!("--local-uds-mode: {:?} is not an octal file mode", a.local_uds_mode))?;
                    Some((path.clone(), mode))
                }
            },
            local_token: a.local_token_file.as_deref().map(crate::local_access::ApiToken::from_file).transpose()?,
            limits,
        })
    }
}

/// This host's name (or "sidecar") plus 6 random hex digits.
pub fn default_sidecar_id() -> String {
    let host = hostname().unwrap_or_else(|| "sidecar".into());
    let host: String =
        host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect();
    format!("{host}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// The host name from the environment or /etc/hostname.
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests;
