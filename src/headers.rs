//! The mesh's wire contract: every `ar-*` header and metadata key the sidecars and the SDK
//! exchange, named once. The sidecar turns them into `http::HeaderName`s; the SDK reads
//! them from tonic metadata.
//!
//! Response metadata (caller's sidecar → caller):
//! - [`INSTANCE`], [`AGENT_VERSION`]: the instance (and agent version) that served the call;
//! - [`ATTEMPTS`], [`INSTANCES_TRIED`]: attempts made and instances tried, in order;
//! - [`FALLBACK_FROM`]: set when a policy's fallback served the call;
//! - [`ROUTE`]: a short digest of the routing decision, `"<strategy> <target> -> <instance>
//!   (attempt <n>)"`;
//! - [`CACHE`]: `hit` when the result cache answered;
//! - [`TRACE_ID`]: the trace of a sampled call, for `agent-reach trace <id>`;
//! - [`IDEMPOTENCY_OWNER`]: with an idempotency key, the instance whose call of the key ran.
//!
//! Request metadata (caller → its sidecar): [`TRACE`] = [`TRACE_FORCE`] samples the call;
//! [`AGENT_CREDENTIAL`] is the calling agent's credential (from `Register`).
//!
//! Between sidecars (`Mesh`): [`INSTANCE`] names the local instance a call is for;
//! [`TENANT`], [`PRIORITY`], [`IDEMPOTENCY_KEY`] and [`IDEMPOTENCY_DIGEST`] travel with it; [`NOT_DELIVERED`] marks
//! an answer that provably never reached the agent; [`LOAD`] (a trailer) carries the serving
//! instance's load ratio. [`CALLER_AGENT`] and [`CALLER_INSTANCE`] name the caller its
//! sidecar verified, trusted by the target's sidecar only from a mutual-TLS peer of the
//! tenant; [`CAPABILITY`] names the capability the call was routed by. [`HOP`] carries
//! those five in one header to a sidecar that said, with [`HOP_OK`] (answering
//! [`HOP_ASK`]), that it reads it.
//!
//! Target's sidecar → agent: [`CALLER_AGENT`], [`CALLER_INSTANCE`] and [`CALLER_TENANT`]
//! name the verified caller (absent for anonymous calls); an HTTP/JSON agent receives them
//! as [`HTTP_AGENT_CALLER_AGENT`], [`HTTP_AGENT_CALLER_INSTANCE`] and
//! [`HTTP_AGENT_CALLER_TENANT`] (its requests are made
//! by the sidecar from scratch, so no header a caller wrote reaches it).
//!
//! Durable tasks (dispatching sidecar → agent, and push notifications to a mesh target):
//! [`TASK_ID`] names the task a call works on, [`TASK_ATTEMPT`] its attempt number;
//! [`TASK_SIGNATURE`] carries the push's HMAC signature.

/// The prefix of every mesh header; none of them is forwarded to the next hop.
pub const PREFIX: &str = "ar-";
/// The instance a `Mesh` call is for; on answers, the instance that served the call.
pub const INSTANCE: &str = "ar-instance";
/// Set on an answer when the call provably never reached the agent (safe to retry).
pub const NOT_DELIVERED: &str = "ar-not-delivered";
/// Attempts the caller's sidecar made.
pub const ATTEMPTS: &str = "ar-attempts";
/// Instances tried, comma-separated, in order.
pub const INSTANCES_TRIED: &str = "ar-instances-tried";
/// Set when a fallback served the call; names the original target.
pub const FALLBACK_FROM: &str = "ar-fallback-from";
/// The version of the agent that served the call.
pub const AGENT_VERSION: &str = "ar-agent-version";
/// A short digest of the routing decision.
pub const ROUTE: &str = "ar-route";
/// `hit` when the answer came from the result cache.
pub const CACHE: &str = "ar-cache";
/// The trace id of a sampled call.
pub const TRACE_ID: &str = "ar-trace-id";
/// Request metadata: [`TRACE_FORCE`] samples the call whatever the sample ratio.
pub const TRACE: &str = "ar-trace";
/// The value of [`TRACE`] that forces sampling.
pub const TRACE_FORCE: &str = "force";
/// `Mesh` request metadata: the caller's tenant, checked by the target's sidecar.
pub const TENANT: &str = "ar-tenant";
/// `Mesh` request metadata: the call's priority (admission at the target).
pub const PRIORITY: &str = "ar-priority";
/// `Mesh` request metadata: the call's idempotency key (at-most-once at the target).
pub const IDEMPOTENCY_KEY: &str = "ar-idempotency-key";
/// `Mesh` request metadata: the call's session id, so that the target's sidecar can fetch
/// the session's context before delivering the call.
pub const SESSION: &str = "ar-session";
/// `Mesh` request metadata with [`SESSION`]: `1` when the caller's sidecar made the
/// session id for this call (an A2A message without a `context_id`), so the session has no
/// context yet and the target's sidecar does not fetch it before delivery. Only ever skips
/// that fetch: a session that does exist is still read correctly (from control).
pub const SESSION_NEW: &str = "ar-session-new";
/// Response metadata: `1` when the target's sidecar fetched the call's session context
/// before delivering it (the session was new to that sidecar: its calls moved there).
pub const SESSION_PREWARMED: &str = "ar-session-prewarmed";
/// Trailer (or trailers-only header) carrying the serving instance's load ratio.
pub const LOAD: &str = "ar-load";
/// `Mesh` request metadata with [`IDEMPOTENCY_KEY`]: the hex SHA-256 of what the call asks
/// (capability, content type, payload), so a duplicate asking something else is refused.
pub const IDEMPOTENCY_DIGEST: &str = "ar-idempotency-digest";
/// `Mesh` request metadata: [`INSTANCE`], [`TENANT`], [`CAPABILITY`], [`CALLER_AGENT`]
/// and [`CALLER_INSTANCE`] in one header, `instance|tenant|capability|agent|instance`
/// (the last three may be empty), sent in their place to a sidecar that answered
/// [`HOP_OK`] on the connection; a sixth field `w` asks for a unary answer whole (status
/// and load in its headers, no trailers), from a sidecar whose [`HOP_OK`] said it writes
/// one.
pub const HOP: &str = "ar-hop";
/// `Mesh` request metadata on a call made with the separate headers: a token of the
/// connection, which a sidecar that reads [`HOP`] echoes in [`HOP_OK`] (ending in `+`:
/// the asking sidecar reads whole answers).
pub const HOP_ASK: &str = "ar-hop-ask";
/// `Mesh` response metadata: the [`HOP_ASK`] token of the call, from a sidecar that reads
/// [`HOP`] (older ones do not answer it, and keep getting the separate headers; an agent
/// never sees the token, so it cannot answer for its sidecar). One more `+` after a token
/// ending in `+`: the sidecar also writes whole answers.
pub const HOP_OK: &str = "ar-hop-ok";
/// Response metadata of a call with an idempotency key: the instance whose call of the key
/// ran (the owner of the key's claim), so the caller's sidecar sends later duplicates there.
pub const IDEMPOTENCY_OWNER: &str = "ar-idempotency-owner";
/// Request header of a call to an HTTP/JSON agent: the remaining deadline in milliseconds.
pub const HTTP_AGENT_DEADLINE_MS: &str = "x-agent-reach-deadline-ms";
/// Request header of a call to an HTTP/JSON agent: the verified calling agent (absent for
/// anonymous calls; the JSON body's `caller` is what the caller wrote).
pub const HTTP_AGENT_CALLER_AGENT: &str = "x-agent-reach-caller-agent";
/// Request header of a call to an HTTP/JSON agent: the verified calling instance.
pub const HTTP_AGENT_CALLER_INSTANCE: &str = "x-agent-reach-caller-instance";
/// Request header of a call to an HTTP/JSON agent: the verified caller's tenant.
pub const HTTP_AGENT_CALLER_TENANT: &str = "x-agent-reach-caller-tenant";
/// Request metadata (agent → its sidecar): the agent credential `Register` returned.
pub const AGENT_CREDENTIAL: &str = "ar-agent-credential";
/// The calling agent, verified by its sidecar (between sidecars, and to the target agent).
pub const CALLER_AGENT: &str = "ar-caller-agent";
/// The calling instance, verified by its sidecar.
pub const CALLER_INSTANCE: &str = "ar-caller-instance";
/// Target's sidecar → agent: the verified caller's tenant (this tenant's, or the one its
/// sidecar's certificate names for a call another tenant was granted).
pub const CALLER_TENANT: &str = "ar-caller-tenant";
/// `Mesh` request metadata: the capability the call was routed by (absent when by agent).
pub const CAPABILITY: &str = "ar-capability";
/// Request metadata (any client → its sidecar): the sidecar's local API token, when it has
/// one (`--local-token-file`; the SDKs send `$AGENT_REACH_API_TOKEN`).
pub const API_TOKEN: &str = "ar-api-token";
/// Metadata of a call that dispatches a durable task (and of a push to a mesh target): the
/// task's id.
pub const TASK_ID: &str = "ar-task-id";
/// Metadata of a call that dispatches a durable task: the attempt number, from 1.
pub const TASK_ATTEMPT: &str = "ar-task-attempt";
/// Metadata of a task push to a mesh target: the push's HMAC-SHA256 signature.
pub const TASK_SIGNATURE: &str = "ar-task-signature";
