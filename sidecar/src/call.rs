//! The call types every layer passes along: a call on its way out of the caller's sidecar
//! ([`OutboundCall`]), one attempt of it ([`AttemptRequest`]), a call for a local instance
//! ([`InboundCall`]) and how an attempt ended ([`Attempt`]).
//!
//! Plain data, and who the caller is ([`verify_credential`], which the outbound entry, task
//! submission and session writes share): this module depends only on the framing
//! ([`crate::grpc`]), the registry, the agent credentials and the error types, never on the
//! layers that handle the calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::model::{Priority, Target, TargetKind};
use agent_reach::policy::{CircuitBreaker, PolicyKind, PolicySpec};
use agent_reach::proto;
use agent_reach_routing::{Member, RoutingTable};
use bytes::Bytes;
use http::{HeaderMap, Response};
use tokio::time::Instant;

use crate::credentials;
use crate::error::{DeliveryError, SidecarError};
use crate::grpc::{self, Body, Hook};
use crate::registry::{LocalInstance, Registry};

/// The future every layer of the call path answers with (boxed: the layers are generic
/// over what they wrap, and their answers differ in what they await).
pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// `Box::pin($future)` for a future made in place: the box is allocated first and the
/// future written straight into it. `Box::pin(f)` makes `f` on the stack and then copies
/// all of it into the box, although a future not yet polled holds only what it captured:
/// a future is as large as its largest state (a remote attempt's ~4 KB cost a `memcpy` of
/// ~420 instructions under callgrind).
macro_rules! boxed {
    ($future:expr) => {{
        let slot: ::std::boxed::Box<::std::mem::MaybeUninit<_>> = ::std::boxed::Box::new_uninit();
        // Bound first, so that the future's own type, not the caller's `dyn`, is boxed.
        let future = ::std::boxed::Box::write(slot, $future);
        ::std::boxed::Box::into_pin(future)
    }};
}
pub(crate) use boxed;

/// Unary or server-streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Unary,
    Stream,
}

/// The fields of an `InvokeRequest` the caller's sidecar needs. Same field numbers as
/// `InvokeRequest`; metadata is skipped unread (decoded only when a policy needs it).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InvokeHead {
    #[prost(message, optional, tag = "1")]
    pub target: Option<proto::Target>,
    #[prost(bytes = "bytes", tag = "2")]
    pub payload: Bytes,
    #[prost(string, tag = "3")]
    pub content_type: String,
    #[prost(string, tag = "4")]
    pub session_id: String,
    #[prost(int32, tag = "5")]
    pub priority: i32,
    #[prost(string, tag = "6")]
    pub idempotency_key: String,
    #[prost(string, tag = "8")]
    pub message_id: String,
    #[prost(message, optional, tag = "9")]
    pub caller: Option<proto::Caller>,
}

/// The metadata of an `InvokeRequest`, decoded only when a policy needs it.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InvokeMetadata {
    #[prost(map = "string, string", tag = "7")]
    pub metadata: HashMap<String, String>,
}

/// A calling agent its sidecar verified by its agent credential (see `credentials`), or,
/// at the target's sidecar, that a mutual-TLS peer of the tenant vouched for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub agent: Arc<str>,
    pub instance: Arc<str>,
}

/// The caller a local request's `ar-agent-credential` proves (`None`: no credential,
/// anonymous); a credential that does not verify is refused, never made anonymous.
pub(crate) fn verify_credential(
    registry: &Registry,
    headers: &http::HeaderMap,
) -> Result<Option<Caller>, SidecarError> {
    let Some(value) = headers.get(grpc::header::AGENT_CREDENTIAL) else { return Ok(None) };
    let invalid = |why: &str| SidecarError::CredentialInvalid(why.to_string());
    let token = value.to_str().map_err(|_| invalid("not text"))?;
    let (instance_id, hash) = credentials::parse(token).ok_or_else(|| invalid("malformed"))?;
    let local = registry.get(instance_id).ok_or_else(|| invalid("its instance is not registered here"))?;
    // Comparing digests: a mismatch position says nothing usable about the secret.
    if hash != local.credential {
        return Err(invalid("unknown credential"));
    }
    Ok(Some(Caller { agent: local.registration.agent.as_str().into(), instance: instance_id.into() }))
}

/// A call read from the caller, on its way through the outbound stack: its fields
/// ([`CallData`], about 490 bytes) behind one allocation, so that each layer, future and
/// `tower` wrapper it passes through moves a pointer, not the call (unboxed, each move
/// was a `memcpy` of ~90 instructions under callgrind, a dozen or more per call).
pub(crate) type OutboundCall = Box<CallData>;

/// The fields of an [`OutboundCall`].
pub(crate) struct CallData {
    /// The caller's `InvokeRequest`, forwarded as is.
    pub message: Bytes,
    /// The routing fields, but for `target` (taken out: the call's target is `target`).
    pub head: InvokeHead,
    pub target: Target,
    pub priority: Priority,
    pub headers: Arc<HeaderMap>,
    pub shape: Shape,
    pub started: Instant,
    pub timeout: Duration,
    pub deadline: Instant,
    /// The routing table the call is routed with (one table for the whole call).
    pub table: Arc<RoutingTable>,
    /// The caller's-sidecar span of the call (set by the telemetry layer).
    pub trace: opentelemetry::Context,
    /// The verified caller (`None`: anonymous). The `caller` the message names is not
    /// trusted for anything.
    pub caller: Option<Caller>,
    /// The one instance the call must reach (it owns what the call names, e.g. an A2A
    /// task): no other instance is tried and no fallback taken. Set only inside the sidecar.
    pub pin: Option<Arc<str>>,
    /// Set for a call to another tenant's capability: that tenant (`target` names the
    /// capability there, `table` holds that tenant's granted instances).
    pub foreign_tenant: Option<Arc<str>>,
}

impl CallData {
    /// The target as metrics and spans name it: `capability tenant/name` for another
    /// tenant's capability.
    pub(crate) fn target_label(&self) -> String {
        match (&self.foreign_tenant, &self.target.kind) {
            (Some(tenant), TargetKind::Capability(c)) => format!("capability {tenant}/{c}"),
            _ => target_text(&self.target),
        }
    }

    /// The policy of the group the target names.
    pub(crate) fn spec(&self) -> Option<&PolicySpec> {
        policy_of(&self.table, &self.target)
    }

    /// The verified calling agent ("" when the call is anonymous).
    pub(crate) fn caller_agent(&self) -> &str {
        self.caller.as_ref().map(|c| &*c.agent).unwrap_or_default()
    }
}

/// The policy of the group a target names.
pub(crate) fn policy_of<'t>(table: &'t RoutingTable, target: &Target) -> Option<&'t PolicySpec> {
    let (kind, name) = match &target.kind {
        TargetKind::Capability(c) => (PolicyKind::Capability, c),
        TargetKind::Agent(a) => (PolicyKind::Agent, a),
    };
    table.policy(kind, name).map(|p| &p.spec)
}

/// "capability/x" or "agent/y": how errors name the policy behind them. (Made for every
/// call by the rate limits: joined by hand, not by `format!`.)
pub(crate) fn policy_name(target: &Target) -> String {
    let (kind, name) = match &target.kind {
        TargetKind::Capability(c) => ("capability/", c),
        TargetKind::Agent(a) => ("agent/", a),
    };
    let mut out = String::with_capacity(kind.len() + name.len());
    out.push_str(kind);
    out.push_str(name);
    out
}

/// `target` as its `Display` writes it (`capability x`, `agent y [tag,…]`), appended to
/// `out`; a target without tags, the usual one, joined by hand (its `Display` goes through
/// `fmt`, several hundred instructions on each call's path).
pub(crate) fn push_target(out: &mut String, target: &Target) {
    if !target.tags.is_empty() {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(out, "{target}");
        return;
    }
    let (kind, name) = match &target.kind {
        TargetKind::Capability(c) => ("capability ", c),
        TargetKind::Agent(a) => ("agent ", a),
    };
    out.push_str(kind);
    out.push_str(name);
}

/// `target` as its `Display` writes it ([`push_target`]).
pub(crate) fn target_text(target: &Target) -> String {
    let mut out = String::with_capacity(11 + target.name().len());
    push_target(&mut out, target);
    out
}

/// One attempt, as the attempt stack sees it (boxed there, [`BoxedAttempt`]).
pub(crate) struct AttemptRequest {
    /// The attempt's client span.
    pub trace: opentelemetry::Context,
    pub member: Member,
    /// The breaker settings of the group the call was routed by.
    pub breaker: CircuitBreaker,
    pub body: Body,
    pub remaining: Duration,
    pub headers: Arc<HeaderMap>,
    pub shape: Shape,
    pub priority: Priority,
    pub idempotency_key: Option<String>,
    /// With a key: what the call asks ([`payload_digest`]).
    pub payload_digest: Option<PayloadDigest>,
    /// The call's session id, if any (the target's sidecar prefetches its context).
    pub session_id: Option<String>,
    /// The verified caller (`None`: anonymous), vouched for toward the target's sidecar.
    pub caller: Option<Caller>,
    /// The capability the call was routed by ("" when by agent name).
    pub capability: Arc<str>,
}

/// An attempt as the attempt stack takes it: behind one allocation, so that the breaker's
/// and the dispatch's futures move a pointer, not the attempt's ~460 bytes.
pub(crate) type BoxedAttempt = Box<AttemptRequest>;

/// A call for a local instance, on its way through the inbound stack: its fields
/// ([`InboundData`], about 420 bytes) behind one allocation, so that each layer and future
/// it passes through moves a pointer, not the call (unboxed, each move was a `memcpy`, a
/// dozen or more per call).
pub(crate) type InboundCall = Box<InboundData>;

/// The fields of an [`InboundCall`].
pub(crate) struct InboundData {
    pub local: Arc<LocalInstance>,
    pub body: Body,
    /// Time left of the caller's deadline (already shrunk by the reserve), if any.
    pub remaining: Option<Duration>,
    pub headers: Arc<HeaderMap>,
    pub shape: Shape,
    pub priority: Priority,
    pub idempotency_key: Option<String>,
    /// With a key: what the call asks, as its caller's sidecar digested it (`None` from a
    /// sidecar that sends no digest: not compared).
    pub payload_digest: Option<PayloadDigest>,
    /// The caller's tenant (usually this sidecar's: a reference count, not a copy).
    pub tenant: Arc<str>,
    /// The trace context: the caller's attempt span on arrival, the server span once the
    /// telemetry layer opened it.
    pub trace: opentelemetry::Context,
    /// The caller as verified by its sidecar (`None`: anonymous).
    pub caller: Option<Caller>,
    /// The capability the call was routed by ("" when by agent name).
    pub capability: Arc<str>,
}

/// How one forwarding attempt ended.
// Short-lived and moved once per attempt; boxing the large variant would allocate per call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Attempt {
    /// The target's sidecar (or agent) answered; the call may have run. When the agent is
    /// local, the hook holds its admission slot until the answer ends (and writes the
    /// instance's load into the trailers).
    Answered(Response<Body>, Option<Hook>),
    /// The call provably never reached an agent.
    NotDelivered(DeliveryError),
    /// The call failed after it may have reached an agent.
    Failed(DeliveryError),
}

/// SHA-256 of what a keyed call asks: duplicates of an idempotency key must carry the same.
pub(crate) type PayloadDigest = [u8; 32];

/// The digest of a call to `capability` ("" when routed by agent name) with `payload` of
/// `content_type`: each part length-prefixed, so no two calls share one by shifting bytes
/// between parts. Metadata is left out (it steers routing and carries the task attempt).
pub(crate) fn payload_digest(capability: &str, content_type: &str, payload: &[u8]) -> PayloadDigest {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [capability.as_bytes(), content_type.as_bytes(), payload] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// A digest as the `ar-idempotency-digest` header carries it (64 lowercase hex digits).
pub(crate) fn digest_hex(d: &PayloadDigest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest from its header form; `None` unless exactly 64 hex digits.
pub(crate) fn digest_from_hex(s: &str) -> Option<PayloadDigest> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A unary call to capability `c` with nothing in it, for tests of the layers.
#[cfg(test)]
pub(crate) fn test_call() -> OutboundCall {
    let started = Instant::now();
    OutboundCall::new(CallData {
        message: Bytes::new(),
        head: InvokeHead::default(),
        target: Target::capability("c"),
        priority: Priority::Normal,
        headers: Arc::new(HeaderMap::new()),
        shape: Shape::Unary,
        started,
        timeout: Duration::from_secs(1),
        deadline: started + Duration::from_secs(1),
        table: Arc::new(RoutingTable::default()),
        trace: opentelemetry::Context::new(),
        caller: None,
        pin: None,
        foreign_tenant: None,
    })
}

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn targets_and_policies_read_as_display_and_format_write_them() {
        let tagged = Target { tags: vec!["zh".into(), "fast".into()], ..Target::capability("text.translate") };
        for target in [Target::capability("text.summarize"), Target::agent("planner"), tagged] {
            assert_eq!(target_text(&target), target.to_string());
            let mut out = "x ".to_string();
            push_target(&mut out, &target);
            assert_eq!(out, format!("x {target}"));
        }
        assert_eq!(policy_name(&Target::capability("c")), "capability/c");
        assert_eq!(policy_name(&Target::agent("a")), "agent/a");
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn calls_and_attempts_move_as_one_pointer() {
        // The layers and their futures pass these along by value: each stays a pointer.
        assert_eq!(std::mem::size_of::<OutboundCall>(), std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<BoxedAttempt>(), std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<InboundCall>(), std::mem::size_of::<usize>());
    }
}

#[cfg(test)]
mod digest_tests {
    use super::*;

    #[test]
    fn a_digest_names_capability_content_type_and_payload_and_survives_its_header() {
        let d = payload_digest("charge", "text/plain", b"10 EUR");
        assert_eq!(digest_from_hex(&digest_hex(&d)), Some(d));
        assert_ne!(d, payload_digest("charge", "text/plain", b"11 EUR"));
        assert_ne!(d, payload_digest("refund", "text/plain", b"10 EUR"));
        assert_ne!(d, payload_digest("charge", "application/json", b"10 EUR"));
        // Bytes moved between parts make another digest.
        assert_ne!(payload_digest("ab", "", b""), payload_digest("a", "b", b""));
        assert_eq!(digest_from_hex("00"), None);
        assert_eq!(digest_from_hex(&"zz".repeat(32)), None);
        assert_eq!(digest_from_hex(&"é".repeat(32)), None);
    }
}
