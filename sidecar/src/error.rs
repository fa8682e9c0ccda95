//! Every way a sidecar request can fail, and the one place where a failure becomes the
//! `tonic::Status` (code + `ErrorInfo` reason + details) the caller sees.

use std::time::Duration;

use agent_reach::model::FieldError;
use agent_reach::reason::{self, Reason};
use tonic::Status;

/// A failed sidecar request.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
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
    #[error("sidecar is shutting down")]
    ShuttingDown,
    #[error("rate limited by the {bucket} bucket of policy {policy}; retry in {retry_after:?}")]
    RateLimited { bucket: String, policy: String, retry_after: Duration },
    #[error("internal error: {0}")]
    Internal(String),
}

impl SidecarError {
    /// The machine-readable reason the caller will see.
    pub fn reason(&self) -> Reason {
        match self {
            SidecarError::InvalidArgument(_) => Reason::InvalidArgument,
            SidecarError::PayloadTooLarge { .. } => Reason::PayloadTooLarge,
            SidecarError::AgentNotFound { .. } => Reason::AgentNotFound,
            SidecarError::NoHealthyInstance { .. } => Reason::NoHealthyInstance,
            SidecarError::ControlUnavailable(_) => Reason::ControlUnavailable,
            SidecarError::InstanceNotFound(_) => Reason::InstanceNotFound,
            SidecarError::InstanceUnreachable { .. } => Reason::InstanceUnreachable,
            SidecarError::DeadlineExceeded { .. } => Reason::DeadlineExceeded,
            SidecarError::ShuttingDown => Reason::ShuttingDown,
            SidecarError::RateLimited { .. } => Reason::RateLimited,
            SidecarError::Internal(_) => Reason::Internal,
        }
    }

    /// The status a caller receives.
    pub fn into_status(self) -> Status {
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
            SidecarError::ShuttingDown => reason::status(Reason::ShuttingDown, message, &[]),
            SidecarError::RateLimited { bucket, policy, retry_after } => reason::status_retry_after(
                Reason::RateLimited,
                message,
                &[("mechanism", "token_bucket".into()), ("bucket", bucket), ("policy", policy)],
                retry_after,
            ),
            SidecarError::Internal(_) => reason::status(Reason::Internal, message, &[]),
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
