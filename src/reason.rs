//! Machine-readable error reasons of the mesh and the `tonic::Status` each becomes.
//!
//! Every error the mesh returns is a gRPC status whose details carry a
//! `google.rpc.ErrorInfo` (domain [`DOMAIN`]) with one of the [`Reason`]s below and
//! reason-specific metadata (e.g. `suggestions`), and for bad input a
//! `google.rpc.BadRequest` naming the field. A caller never needs logs to know why a call
//! failed. This module builds and reads such statuses; it does not decide when to fail.

use std::collections::HashMap;
use std::fmt;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of every Agent-Reach error.
pub const DOMAIN: &str = "agent-reach.dev";

/// Metadata key listing close capability or agent names, comma-separated.
pub const META_SUGGESTIONS: &str = "suggestions";
/// Metadata key naming the offending request field.
pub const META_FIELD: &str = "field";

macro_rules! reasons {
    ($($variant:ident => $text:literal, $code:ident;)*) => {
        /// Why a call or request failed.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason { $($variant),* }

        impl Reason {
            /// The reason string carried in `ErrorInfo.reason`.
            pub fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => $text),* }
            }
            /// The gRPC code that goes with the reason.
            pub fn code(self) -> Code {
                match self { $(Reason::$variant => Code::$code),* }
            }
            /// Parses a reason string.
            pub fn parse(s: &str) -> Option<Reason> {
                match s { $($text => Some(Reason::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    AgentNotFound => "AGENT_NOT_FOUND", NotFound;
    NoHealthyInstance => "NO_HEALTHY_INSTANCE", Unavailable;
    InvalidArgument => "INVALID_ARGUMENT", InvalidArgument;
    PayloadTooLarge => "PAYLOAD_TOO_LARGE", ResourceExhausted;
    ControlUnavailable => "CONTROL_UNAVAILABLE", Unavailable;
    StoreUnavailable => "STORE_UNAVAILABLE", Unavailable;
    InstanceNotFound => "INSTANCE_NOT_FOUND", NotFound;
    PolicyNotFound => "POLICY_NOT_FOUND", NotFound;
    LeaseNotFound => "LEASE_NOT_FOUND", NotFound;
    Conflict => "CONFLICT", Aborted;
    InstanceUnreachable => "INSTANCE_UNREACHABLE", Unavailable;
    SidecarUnreachable => "SIDECAR_UNREACHABLE", Unavailable;
    DeadlineExceeded => "DEADLINE_EXCEEDED", DeadlineExceeded;
    AgentOverloaded => "AGENT_OVERLOADED", ResourceExhausted;
    RateLimited => "RATE_LIMITED", ResourceExhausted;
    CircuitOpen => "CIRCUIT_OPEN", Unavailable;
    PermissionDenied => "PERMISSION_DENIED", PermissionDenied;
    ShuttingDown => "SHUTTING_DOWN", Unavailable;
    IdempotentReplyNotStored => "IDEMPOTENT_REPLY_NOT_STORED", FailedPrecondition;
    Internal => "INTERNAL", Internal;
    ContextFieldLocked => "CONTEXT_FIELD_LOCKED", FailedPrecondition;
    ContextConflict => "CONTEXT_CONFLICT", Aborted;
    ContextTooLarge => "CONTEXT_TOO_LARGE", ResourceExhausted;
    ContextTooManySessions => "CONTEXT_TOO_MANY_SESSIONS", ResourceExhausted;
    ContextHistoryCompacted => "CONTEXT_HISTORY_COMPACTED", OutOfRange;
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Builds the status for `reason` with a human message and ErrorInfo metadata.
pub fn status(reason: Reason, message: impl Into<String>, metadata: &[(&str, String)]) -> Status {
    let meta: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let details = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, meta);
    Status::with_error_details(reason.code(), message, details)
}

/// Like [`status`], with a `google.rpc.RetryInfo` saying when to try again (and the same
/// in ErrorInfo metadata `retry_after_ms`).
pub fn status_retry_after(
    reason: Reason,
    message: impl Into<String>,
    metadata: &[(&str, String)],
    retry_after: std::time::Duration,
) -> Status {
    let mut meta: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    meta.insert(META_RETRY_AFTER_MS.to_string(), retry_after.as_millis().max(1).to_string());
    let mut details = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, meta);
    details.set_retry_info(Some(retry_after));
    Status::with_error_details(reason.code(), message, details)
}

/// Metadata key: milliseconds to wait before trying again.
pub const META_RETRY_AFTER_MS: &str = "retry_after_ms";

/// NOT_FOUND / AGENT_NOT_FOUND for `target`, with the closest names in the message and in
/// the `suggestions` metadata (comma-separated).
pub fn agent_not_found(message: String, target: String, suggestions: &[String]) -> Status {
    let message =
        if suggestions.is_empty() { message } else { format!("{message}; did you mean {}?", suggestions.join(", ")) };
    status(Reason::AgentNotFound, message, &[("target", target), (META_SUGGESTIONS, suggestions.join(","))])
}

/// An INVALID_ARGUMENT status naming the bad field, with a `BadRequest` violation.
pub fn invalid_argument(field: &str, why: &str) -> Status {
    let mut details = ErrorDetails::with_error_info(
        Reason::InvalidArgument.as_str(),
        DOMAIN,
        HashMap::from([(META_FIELD.to_string(), field.to_string())]),
    );
    details.add_bad_request_violation(field, why);
    Status::with_error_details(Code::InvalidArgument, format!("invalid {field}: {why}"), details)
}

/// The reason and metadata read back from a status, when it carries an ErrorInfo.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorInfo {
    pub reason: String,
    pub domain: String,
    pub metadata: HashMap<String, String>,
}

/// Reads the ErrorInfo of a status, if any.
pub fn error_info(status: &Status) -> Option<ErrorInfo> {
    let details = status.get_error_details();
    details.error_info().map(|info| ErrorInfo {
        reason: info.reason.clone(),
        domain: info.domain.clone(),
        metadata: info.metadata.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_reason_and_metadata() {
        let s = status(Reason::AgentNotFound, "no such capability", &[(META_SUGGESTIONS, "text.summarize".into())]);
        assert_eq!(s.code(), Code::NotFound);
        let info = error_info(&s).expect("error info");
        assert_eq!(info.reason, "AGENT_NOT_FOUND");
        assert_eq!(info.domain, DOMAIN);
        assert_eq!(info.metadata[META_SUGGESTIONS], "text.summarize");
        assert_eq!(Reason::parse("AGENT_NOT_FOUND"), Some(Reason::AgentNotFound));
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let s = invalid_argument("registration.agent", "must not be empty");
        assert_eq!(s.code(), Code::InvalidArgument);
        let d = s.get_error_details();
        let v = &d.bad_request().expect("bad request").field_violations[0];
        assert_eq!(v.field, "registration.agent");
        assert_eq!(error_info(&s).unwrap().metadata[META_FIELD], "registration.agent");
    }
}
