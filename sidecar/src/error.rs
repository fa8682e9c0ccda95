//! Every way a sidecar request can fail, and the one place where a failure becomes the
//! `tonic::Status` (code + `ErrorInfo` reason + details) the caller sees: [`SidecarError`]
//! for a request the sidecar refuses or cannot route, [`DeliveryError`] for one attempt to
//! deliver a call that did not end in an answer. [`StartError`]: why a sidecar could not
//! start.

use std::time::Duration;

use agent_reach::model::FieldError;
use agent_reach::reason::{self, Reason};
use tonic::{Code, Status};

/// A failed sidecar request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SidecarError {
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] FieldError),
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("no agent offers {target}")]
    AgentNotFound { target: String, suggestions: Vec<String> },
    #[error("no healthy instance for {target}: {why}")]
    NoHealthyInstance { target: String, why: String, tried: Vec<String> },
    #[error("control service unavailable: {0}")]
    ControlUnavailable(String),
    #[error("instance {0} is not registered at this sidecar")]
    InstanceNotFound(String),
    #[error("instance {instance} unreachable: {cause}")]
    InstanceUnreachable { instance: String, cause: String },
    #[error("deadline of {deadline:?} exceeded after {attempts} attempt(s) (instances tried: {tried:?})")]
    DeadlineExceeded { deadline: Duration, attempts: u32, tried: Vec<String> },
    #[error("rate limited by the {bucket} bucket of policy {policy}; retry in {retry_after:?}")]
    RateLimited { bucket: String, policy: String, retry_after: Duration },
    /// An agent credential that is not (or no longer) one this sidecar issued.
    #[error("the agent credential is not valid here: {0}")]
    CredentialInvalid(String),
    /// The target's authorization policy does not allow the caller.
    #[error("{caller} may not call {target}: not allowed by policy {policy}")]
    NotAuthorized { caller: String, target: String, policy: String },
    #[error("internal error: {0}")]
    Internal(String),
    /// A limit of the sidecar's (named by its flag) refused the request.
    #[error("{message} ({flag})")]
    LimitExceeded { flag: &'static str, message: String },
}

impl SidecarError {
    /// The machine-readable reason the caller will see.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            SidecarError::InvalidArgument(_) => Reason::InvalidArgument,
            SidecarError::PayloadTooLarge { .. } => Reason::PayloadTooLarge,
            SidecarError::AgentNotFound { .. } => Reason::AgentNotFound,
            SidecarError::NoHealthyInstance { .. } => Reason::NoHealthyInstance,
            SidecarError::ControlUnavailable(_) => Reason::ControlUnavailable,
            SidecarError::InstanceNotFound(_) => Reason::InstanceNotFound,
            SidecarError::InstanceUnreachable { .. } => Reason::InstanceUnreachable,
            SidecarError::DeadlineExceeded { .. } => Reason::DeadlineExceeded,
            SidecarError::RateLimited { .. } => Reason::RateLimited,
            SidecarError::CredentialInvalid(_) => Reason::AgentCredentialInvalid,
            SidecarError::NotAuthorized { .. } => Reason::NotAuthorized,
            SidecarError::Internal(_) => Reason::Internal,
            SidecarError::LimitExceeded { .. } => Reason::LimitExceeded,
        }
    }

    /// The status a caller receives.
    pub(crate) fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            SidecarError::InvalidArgument(e) => reason::invalid_argument(&e.field, &e.reason),
            SidecarError::PayloadTooLarge { size, limit } => reason::status(
                Reason::PayloadTooLarge,
                message,
                &[("size", size.to_string()), ("limit", limit.to_string())],
            ),
            SidecarError::AgentNotFound { target, suggestions } => {
                reason::agent_not_found(message, target, &suggestions)
            }
            SidecarError::NoHealthyInstance { target, tried, .. } => reason::status(
                Reason::NoHealthyInstance,
                message,
                &[("target", target), ("instances_tried", tried.join(","))],
            ),
            SidecarError::ControlUnavailable(_) => reason::status(Reason::ControlUnavailable, message, &[]),
            SidecarError::InstanceNotFound(instance) => {
                reason::status(Reason::InstanceNotFound, message, &[("instance", instance)])
            }
            SidecarError::InstanceUnreachable { instance, .. } => {
                reason::status(Reason::InstanceUnreachable, message, &[("instance", instance)])
            }
            SidecarError::DeadlineExceeded { attempts, tried, .. } => reason::status(
                Reason::DeadlineExceeded,
                message,
                &[("attempts", attempts.to_string()), ("instances_tried", tried.join(","))],
            ),
            SidecarError::RateLimited { bucket, policy, retry_after } => reason::status_retry_after(
                Reason::RateLimited,
                message,
                &[("mechanism", "token_bucket".into()), ("bucket", bucket), ("policy", policy)],
                retry_after,
            ),
            SidecarError::CredentialInvalid(_) => reason::status(
                Reason::AgentCredentialInvalid,
                message,
                &[("field", agent_reach::headers::AGENT_CREDENTIAL.into())],
            ),
            SidecarError::NotAuthorized { caller, target, policy } => reason::status(
                Reason::NotAuthorized,
                message,
                &[("caller", caller), ("target", target), ("policy", policy)],
            ),
            SidecarError::Internal(_) => reason::status(Reason::Internal, message, &[]),
            SidecarError::LimitExceeded { flag, .. } => limit_refusal(flag, message),
        }
    }
}

impl From<agent_reach_routing::RouteError> for SidecarError {
    fn from(e: agent_reach_routing::RouteError) -> Self {
        match e {
            agent_reach_routing::RouteError::NotFound { target, suggestions } => {
                SidecarError::AgentNotFound { target, suggestions }
            }
            agent_reach_routing::RouteError::NoHealthyInstance { target, why, tried } => {
                SidecarError::NoHealthyInstance { target, why, tried }
            }
        }
    }
}

impl From<SidecarError> for Status {
    fn from(e: SidecarError) -> Status {
        e.into_status()
    }
}

/// Why one attempt to deliver a call ended without an answer (see `call::Attempt`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeliveryError {
    /// The instance or its sidecar could not take the call (gone, paused, refused, no
    /// connection).
    #[error("{0}")]
    Unavailable(String),
    /// The instance's admission queue refused the call.
    #[error("instance {instance} is overloaded ({busy} of {max} slots busy, {waiting} waiting): {why}")]
    Overloaded { instance: String, agent: String, busy: u32, max: u32, waiting: u32, why: String },
    /// The instance's circuit breaker is open.
    #[error("the circuit breaker of {instance} is open")]
    CircuitOpen { instance: String },
    /// A duplicate of a call whose reply was too large to keep.
    #[error("a call with this idempotency key already ran; its reply was too large to keep, so it is not run again")]
    ReplyNotStored,
    /// A duplicate of a call that was cancelled after it may have reached its agent.
    #[error(
        "a call with this idempotency key was cancelled after it may have run; it is not run again within the \
         idempotency window"
    )]
    ClaimAbandoned,
    /// A duplicate asking something else (capability, content type or payload) than the
    /// key's first call.
    #[error(
        "idempotency key {key_prefix}… was first used for a call with another payload (capability, content type \
         or payload differ); it is not run: send a different call under a new key"
    )]
    KeyReused { key_prefix: String },
    /// The message's own `tenant` field (the caller's sidecar writes it) names another
    /// tenant than the one the caller was verified as (its certificate).
    #[error("the call's tenant field names {claimed:?} but the caller is verified as tenant {verified:?}")]
    TenantMismatch { claimed: String, verified: String },
    /// The call is malformed for its agent.
    #[error("{0}")]
    InvalidArgument(String),
    /// The agent did not answer in time.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The sidecar failed handling the call.
    #[error("{0}")]
    Internal(String),
    /// A failure the caller sees as a [`SidecarError`] (deadline, unreachable instance).
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    /// A status received from another sidecar, passed on as it came.
    #[error("{}", .0.message())]
    Remote(Status),
}

impl DeliveryError {
    /// The status the caller sees.
    pub(crate) fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            DeliveryError::Unavailable(_) => reason::bounded(Status::unavailable(message)),
            DeliveryError::Overloaded { instance, agent, .. } => reason::status_retry_after(
                Reason::AgentOverloaded,
                message,
                &[("mechanism", "admission".into()), ("policy", format!("agent/{agent}")), ("instance", instance)],
                Duration::from_millis(50),
            ),
            DeliveryError::CircuitOpen { instance } => reason::status(
                Reason::CircuitOpen,
                message,
                &[("mechanism", "circuit_breaker".into()), ("instance", instance)],
            ),
            DeliveryError::ReplyNotStored | DeliveryError::ClaimAbandoned => {
                reason::status(Reason::IdempotentReplyNotStored, message, &[("mechanism", "idempotency".into())])
            }
            DeliveryError::KeyReused { key_prefix } => reason::status(
                Reason::IdempotencyKeyReused,
                message,
                &[("mechanism", "idempotency".into()), ("key_prefix", key_prefix)],
            ),
            DeliveryError::TenantMismatch { claimed, verified } => reason::status(
                Reason::TenantMismatch,
                message,
                &[("field", "tenant".into()), ("claimed", claimed), ("verified", verified)],
            ),
            DeliveryError::InvalidArgument(_) => reason::bounded(Status::invalid_argument(message)),
            DeliveryError::DeadlineExceeded(_) => reason::bounded(Status::deadline_exceeded(message)),
            DeliveryError::Internal(_) => reason::bounded(Status::internal(message)),
            DeliveryError::Sidecar(e) => e.into_status(),
            DeliveryError::Remote(status) => status,
        }
    }

    /// The gRPC code of [`DeliveryError::into_status`].
    pub(crate) fn code(&self) -> Code {
        match self {
            DeliveryError::Unavailable(_) => Code::Unavailable,
            DeliveryError::Overloaded { .. } => Code::ResourceExhausted,
            DeliveryError::CircuitOpen { .. } => Reason::CircuitOpen.code(),
            DeliveryError::ReplyNotStored | DeliveryError::ClaimAbandoned => Reason::IdempotentReplyNotStored.code(),
            DeliveryError::KeyReused { .. } => Reason::IdempotencyKeyReused.code(),
            DeliveryError::TenantMismatch { .. } => Reason::TenantMismatch.code(),
            DeliveryError::InvalidArgument(_) => Code::InvalidArgument,
            DeliveryError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            DeliveryError::Internal(_) => Code::Internal,
            DeliveryError::Sidecar(e) => e.reason().code(),
            DeliveryError::Remote(status) => status.code(),
        }
    }

    /// The machine-readable reason of [`DeliveryError::into_status`], when it has one.
    pub(crate) fn reason(&self) -> Option<Reason> {
        match self {
            DeliveryError::Overloaded { .. } => Some(Reason::AgentOverloaded),
            DeliveryError::CircuitOpen { .. } => Some(Reason::CircuitOpen),
            DeliveryError::ReplyNotStored | DeliveryError::ClaimAbandoned => Some(Reason::IdempotentReplyNotStored),
            DeliveryError::KeyReused { .. } => Some(Reason::IdempotencyKeyReused),
            DeliveryError::TenantMismatch { .. } => Some(Reason::TenantMismatch),
            DeliveryError::Sidecar(e) => Some(e.reason()),
            DeliveryError::Remote(status) => reason::error_info(status).and_then(|i| Reason::parse(&i.reason)),
            _ => None,
        }
    }
}

/// The `LIMIT_EXCEEDED` status naming `flag` (e.g. "--max-header-list-bytes").
pub(crate) fn limit_refusal(flag: &str, message: impl Into<String>) -> Status {
    reason::status(Reason::LimitExceeded, message, &[(reason::META_LIMIT, flag.trim_start_matches('-').to_string())])
}

/// Why a sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("identity: {0}")]
    Identity(#[from] crate::identity::IdentityError),
}
