//! Every way a control request can fail, and the one place where a failure becomes the
//! `tonic::Status` (code, `ErrorInfo` reason, details) that both the Control and the Admin
//! API return.

use agent_reach::model::FieldError;
use agent_reach::policy::PolicyKind;
use agent_reach::reason::{self, Reason};
use agent_reach_store::{LeaseId, StoreError};
use tonic::Status;

/// A failed control request.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("invalid argument: {0}")]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored record {key} is unreadable: {why}")]
    Corrupt { key: String, why: String },
    #[error("no agent offers {target}")]
    AgentNotFound { target: String, suggestions: Vec<String> },
    #[error("instance {0} not found")]
    InstanceNotFound(String),
    #[error("no {kind} policy named {name:?}")]
    PolicyNotFound { kind: PolicyKind, name: String },
    #[error("lease {0:x} not found (expired or revoked); register on a new lease")]
    LeaseNotFound(LeaseId),
    #[error("{0} kept changing while it was being written; try again")]
    Conflict(String),
    #[error("the control service is shutting down")]
    ShuttingDown,
}

impl From<ControlError> for Status {
    fn from(e: ControlError) -> Status {
        let message = e.to_string();
        match e {
            ControlError::Invalid(f) => reason::invalid_argument(&f.field, &f.reason),
            ControlError::Store(StoreError::LeaseNotFound(lease)) => {
                reason::status(Reason::LeaseNotFound, message, &[("lease", format!("{lease:x}"))])
            }
            ControlError::Store(StoreError::Unavailable(_)) => reason::status(Reason::StoreUnavailable, message, &[]),
            ControlError::Store(_) | ControlError::Corrupt { .. } => reason::status(Reason::Internal, message, &[]),
            ControlError::AgentNotFound { target, suggestions } => {
                reason::agent_not_found(message, target, &suggestions)
            }
            ControlError::InstanceNotFound(instance) => {
                reason::status(Reason::InstanceNotFound, message, &[("instance", instance)])
            }
            ControlError::PolicyNotFound { kind, name } => {
                reason::status(Reason::PolicyNotFound, message, &[("kind", kind.to_string()), ("name", name)])
            }
            ControlError::LeaseNotFound(lease) => {
                reason::status(Reason::LeaseNotFound, message, &[("lease", format!("{lease:x}"))])
            }
            ControlError::Conflict(_) => reason::status(Reason::Conflict, message, &[]),
            ControlError::ShuttingDown => reason::status(Reason::ShuttingDown, message, &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn errors_carry_their_reason() {
        let cases: Vec<(ControlError, Code, &str)> = vec![
            (FieldError::new("tenant", "bad").into(), Code::InvalidArgument, "INVALID_ARGUMENT"),
            (StoreError::Unavailable("down".into()).into(), Code::Unavailable, "STORE_UNAVAILABLE"),
            (StoreError::LeaseNotFound(7).into(), Code::NotFound, "LEASE_NOT_FOUND"),
            (ControlError::InstanceNotFound("x".into()), Code::NotFound, "INSTANCE_NOT_FOUND"),
            (
                ControlError::PolicyNotFound { kind: PolicyKind::Agent, name: "a".into() },
                Code::NotFound,
                "POLICY_NOT_FOUND",
            ),
            (
                ControlError::AgentNotFound { target: "capability x".into(), suggestions: vec![] },
                Code::NotFound,
                "AGENT_NOT_FOUND",
            ),
            (ControlError::Conflict("x".into()), Code::Aborted, "CONFLICT"),
        ];
        for (error, code, reason) in cases {
            let status = Status::from(error);
            assert_eq!(status.code(), code);
            assert_eq!(agent_reach::reason::error_info(&status).unwrap().reason, reason);
        }
    }
}
