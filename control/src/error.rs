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
    #[error(transparent)]
    Refused(#[from] TokenRefusal),
    #[error("join token {0} not found")]
    JoinTokenNotFound(String),
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    #[error("{field} names tenant {claimed:?} but the caller's certificate is of tenant {verified:?}")]
    TenantMismatch { field: String, claimed: String, verified: String },
    #[error("sidecar_id {claimed:?} is not the caller's certificate's sidecar {verified:?}")]
    SidecarMismatch { claimed: String, verified: String },
    #[error(transparent)]
    Identity(#[from] agent_reach_identity::IdentityError),
    #[error("instance {instance} is not the caller's: {why}")]
    NotOwned { instance: String, why: String },
    #[error("lease {lease:x} is not the caller's (it belongs to {owner})")]
    LeaseNotOwned { lease: LeaseId, owner: String },
    /// Roles by name (`Role::as_str`), so errors need not know the identity module.
    #[error("{who} has role {role}, this needs {needed}")]
    RoleNotAllowed { who: String, role: &'static str, needed: &'static str },
    #[error("{who} may not act on tenant {tenant}")]
    TenantNotAllowed { who: String, tenant: String },
    /// A limit of this replica (`flag`) was reached: RESOURCE_EXHAUSTED `LIMIT_EXCEEDED`.
    #[error("{message}")]
    LimitExceeded { flag: &'static str, message: String },
    /// A cross-tenant lookup without both grants: PERMISSION_DENIED `NOT_AUTHORIZED`.
    #[error("{caller} may not call {target}: not granted by policy {policy}")]
    NotAuthorized { caller: String, target: String, policy: String },
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
            ControlError::Refused(refusal) => match refusal {
                TokenRefusal::Invalid => reason::status(Reason::JoinTokenInvalid, message, &[]),
                TokenRefusal::Expired(id) => reason::status(Reason::JoinTokenExpired, message, &[("id", id)]),
                TokenRefusal::Revoked(id) => reason::status(Reason::JoinTokenRevoked, message, &[("id", id)]),
                TokenRefusal::Used { id, by } => {
                    reason::status(Reason::JoinTokenUsed, message, &[("id", id), ("used_by", by)])
                }
                TokenRefusal::WrongTenant { id, requested, .. } => reason::status(
                    Reason::TenantMismatch,
                    message,
                    &[("field", "tenant".into()), ("id", id), ("tenant", requested)],
                ),
            },
            ControlError::JoinTokenNotFound(id) => reason::status(Reason::JoinTokenNotFound, message, &[("id", id)]),
            ControlError::Unauthenticated(_) => reason::status(Reason::Unauthenticated, message, &[]),
            ControlError::NotAuthorized { caller, target, policy } => reason::status(
                Reason::NotAuthorized,
                message,
                &[("caller", caller), ("target", target), ("policy", policy)],
            ),
            ControlError::TenantMismatch { field, claimed, verified } => reason::status(
                Reason::TenantMismatch,
                message,
                &[("field", field), ("claimed", claimed), ("verified", verified)],
            ),
            ControlError::SidecarMismatch { claimed, verified } => reason::status(
                Reason::SidecarMismatch,
                message,
                &[("field", "sidecar_id".into()), ("claimed", claimed), ("verified", verified)],
            ),
            ControlError::Identity(agent_reach_identity::IdentityError::InvalidCsr(why)) => {
                reason::invalid_argument("csr_pem", &why)
            }
            ControlError::Identity(_) => reason::status(Reason::Internal, message, &[]),
            ControlError::RoleNotAllowed { needed, .. } => {
                reason::status(Reason::RoleNotAllowed, message, &[("needed", needed.into())])
            }
            ControlError::TenantNotAllowed { tenant, .. } => {
                reason::status(Reason::TenantNotAllowed, message, &[("tenant", tenant)])
            }
            ControlError::LeaseNotOwned { lease, .. } => {
                reason::status(Reason::InstanceNotOwned, message, &[("lease", format!("{lease:x}"))])
            }
            ControlError::NotOwned { instance, .. } => {
                reason::status(Reason::InstanceNotOwned, message, &[("instance", instance)])
            }
            ControlError::LimitExceeded { flag, .. } => reason::status(
                Reason::LimitExceeded,
                message,
                &[(reason::META_LIMIT, flag.trim_start_matches('-').to_string())],
            ),
        }
    }
}

/// Why a token does not buy a certificate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("the join token is malformed or unknown, or its secret is wrong")]
    Invalid,
    #[error("join token {0} has expired")]
    Expired(String),
    #[error("join token {0} has been revoked")]
    Revoked(String),
    #[error("join token {id} is single-use and was used by sidecar {by}")]
    Used { id: String, by: String },
    #[error("join token {id} belongs to tenant {token_tenant}, not {requested}")]
    WrongTenant { id: String, token_tenant: String, requested: String },
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
