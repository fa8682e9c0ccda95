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
/// Metadata key naming the limit (its flag, without dashes) a `LIMIT_EXCEEDED` refusal hit.
pub const META_LIMIT: &str = "limit";

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
    IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED", FailedPrecondition;
    Unauthenticated => "UNAUTHENTICATED", Unauthenticated;
    JoinTokenInvalid => "JOIN_TOKEN_INVALID", Unauthenticated;
    JoinTokenExpired => "JOIN_TOKEN_EXPIRED", Unauthenticated;
    JoinTokenRevoked => "JOIN_TOKEN_REVOKED", Unauthenticated;
    JoinTokenUsed => "JOIN_TOKEN_USED", Unauthenticated;
    JoinTokenNotFound => "JOIN_TOKEN_NOT_FOUND", NotFound;
    TenantMismatch => "TENANT_MISMATCH", PermissionDenied;
    SidecarMismatch => "SIDECAR_MISMATCH", PermissionDenied;
    InstanceNotOwned => "INSTANCE_NOT_OWNED", PermissionDenied;
    RoleNotAllowed => "ROLE_NOT_ALLOWED", PermissionDenied;
    TenantNotAllowed => "TENANT_NOT_ALLOWED", PermissionDenied;
    NotAuthorized => "NOT_AUTHORIZED", PermissionDenied;
    AgentCredentialInvalid => "AGENT_CREDENTIAL_INVALID", Unauthenticated;
    Internal => "INTERNAL", Internal;
    ContextFieldLocked => "CONTEXT_FIELD_LOCKED", FailedPrecondition;
    ContextConflict => "CONTEXT_CONFLICT", Aborted;
    ContextTooLarge => "CONTEXT_TOO_LARGE", ResourceExhausted;
    ContextTooManySessions => "CONTEXT_TOO_MANY_SESSIONS", ResourceExhausted;
    ContextHistoryCompacted => "CONTEXT_HISTORY_COMPACTED", OutOfRange;
    ContextPolicyOverride => "CONTEXT_POLICY_OVERRIDE", FailedPrecondition;
    ContextWriterNotAllowed => "CONTEXT_WRITER_NOT_ALLOWED", PermissionDenied;
    ContextWriterMismatch => "CONTEXT_WRITER_MISMATCH", PermissionDenied;
    TaskNotFound => "TASK_NOT_FOUND", NotFound;
    TaskFinished => "TASK_FINISHED", FailedPrecondition;
    TaskBadTransition => "TASK_BAD_TRANSITION", FailedPrecondition;
    TaskConflict => "TASK_CONFLICT", Aborted;
    TaskResultTooLarge => "TASK_RESULT_TOO_LARGE", ResourceExhausted;
    LimitExceeded => "LIMIT_EXCEEDED", ResourceExhausted;
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest message a status carries: longer ones are cut (error messages may quote a
/// caller's input, and gRPC clients commonly refuse response metadata past 8 KiB).
pub const MAX_MESSAGE_BYTES: usize = 384;
/// Longest ErrorInfo metadata value, BadRequest field or description.
pub const MAX_DETAIL_BYTES: usize = 128;

fn bounded_meta<'a>(metadata: impl Iterator<Item = (&'a str, &'a str)>) -> HashMap<String, String> {
    metadata
        .map(|(k, v)| (truncate(k, MAX_DETAIL_BYTES).into_owned(), truncate(v, MAX_DETAIL_BYTES).into_owned()))
        .collect()
}

/// Builds the status for `reason` with a human message and ErrorInfo metadata (both cut
/// to [`MAX_MESSAGE_BYTES`] and [`MAX_DETAIL_BYTES`]).
pub fn status(reason: Reason, message: impl Into<String>, metadata: &[(&str, String)]) -> Status {
    let meta = bounded_meta(metadata.iter().map(|(k, v)| (*k, v.as_str())));
    let details = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, meta);
    bounded(Status::with_error_details(
        reason.code(),
        truncate(&message.into(), MAX_MESSAGE_BYTES).into_owned(),
        details,
    ))
}

/// Most bytes of details (message, ErrorInfo, RetryInfo, BadRequest) a status carries.
pub const MAX_DETAILS_BYTES: usize = 1024;

/// `status` with its message and details cut to fit [`MAX_DETAILS_BYTES`] (ErrorInfo,
/// RetryInfo and the first BadRequest violations are kept, each string cut shorter until
/// the whole fits); unchanged when already within. Every status the sidecar and control
/// build with this module, and every status the sidecar answers with, passes through it.
pub fn bounded(status: Status) -> Status {
    if status.message().len() <= MAX_MESSAGE_BYTES + 3 && status.details().len() <= MAX_DETAILS_BYTES {
        return status;
    }
    if status.details().is_empty() {
        return Status::new(status.code(), truncate(status.message(), MAX_MESSAGE_BYTES).into_owned());
    }
    let details = status.get_error_details();
    // (message, each string, metadata entries, violations), tighter each round.
    let rounds = [(MAX_MESSAGE_BYTES, MAX_DETAIL_BYTES, 4, 4), (256, 64, 4, 2), (128, 32, 3, 1), (64, 16, 2, 1)];
    let mut last = None;
    for (message_max, string_max, entries, violations) in rounds {
        let mut out = ErrorDetails::new();
        if let Some(info) = details.error_info() {
            let mut meta: Vec<_> = info.metadata.iter().collect();
            meta.sort();
            let meta: HashMap<String, String> = meta
                .into_iter()
                .take(entries)
                .map(|(k, v)| (truncate(k, string_max).into_owned(), truncate(v, string_max).into_owned()))
                .collect();
            out.set_error_info(truncate(&info.reason, string_max), truncate(&info.domain, string_max), meta);
        }
        if let Some(retry) = details.retry_info() {
            out.set_retry_info(retry.retry_delay);
        }
        if let Some(bad) = details.bad_request() {
            for v in bad.field_violations.iter().take(violations) {
                out.add_bad_request_violation(truncate(&v.field, string_max), truncate(&v.description, string_max));
            }
        }
        let cut = Status::with_error_details(status.code(), truncate(status.message(), message_max).into_owned(), out);
        if cut.details().len() <= MAX_DETAILS_BYTES {
            return cut;
        }
        last = Some(cut);
    }
    last.unwrap_or(status)
}

/// Like [`status`], with a `google.rpc.RetryInfo` saying when to try again (and the same
/// in ErrorInfo metadata `retry_after_ms`).
pub fn status_retry_after(
    reason: Reason,
    message: impl Into<String>,
    metadata: &[(&str, String)],
    retry_after: std::time::Duration,
) -> Status {
    let mut meta = bounded_meta(metadata.iter().map(|(k, v)| (*k, v.as_str())));
    meta.insert(META_RETRY_AFTER_MS.to_string(), retry_after.as_millis().max(1).to_string());
    let mut details = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, meta);
    details.set_retry_info(Some(retry_after));
    bounded(Status::with_error_details(
        reason.code(),
        truncate(&message.into(), MAX_MESSAGE_BYTES).into_owned(),
        details,
    ))
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
    let (field, why) = (truncate(field, MAX_DETAIL_BYTES), truncate(why, MAX_MESSAGE_BYTES / 2));
    let (field, why) = (field.as_ref(), why.as_ref());
    let mut details = ErrorDetails::with_error_info(
        Reason::InvalidArgument.as_str(),
        DOMAIN,
        HashMap::from([(META_FIELD.to_string(), field.to_string())]),
    );
    details.add_bad_request_violation(field, why);
    bounded(Status::with_error_details(
        Code::InvalidArgument,
        truncate(&format!("invalid {field}: {why}"), MAX_MESSAGE_BYTES).into_owned(),
        details,
    ))
}

/// The reason and metadata read back from a status, when it carries an ErrorInfo.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorInfo {
    pub reason: String,
    pub domain: String,
    pub metadata: HashMap<String, String>,
}

/// `text` cut to at most `max` bytes (on a character boundary), with `…` appended when
/// cut: what an error message may quote of a caller's input.
pub fn truncate(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
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
    use std::time::Duration;

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

    #[test]
    fn long_input_is_quoted_short() {
        let long = "x".repeat(64 * 1024);
        let s = status(Reason::AgentNotFound, format!("no agent for {long}"), &[("target", long.clone())]);
        assert_eq!(s.message().len(), MAX_MESSAGE_BYTES + "…".len());
        assert!(s.message().ends_with('…'));
        assert_eq!(error_info(&s).unwrap().metadata["target"].len(), MAX_DETAIL_BYTES + "…".len());
        assert!(s.details().len() <= 1024, "{}", s.details().len());
        let s = invalid_argument(&long, &long);
        assert!(s.message().len() <= MAX_MESSAGE_BYTES + 3 && s.details().len() <= 1024);
        let s =
            status_retry_after(Reason::RateLimited, long.clone(), &[("bucket", long.clone())], Duration::from_secs(1));
        assert!(s.message().len() <= MAX_MESSAGE_BYTES + 3 && s.details().len() <= 1024);
        let s = agent_not_found(long.clone(), long.clone(), &vec![long.clone(); 100]);
        assert!(s.message().len() <= MAX_MESSAGE_BYTES + 3 && s.details().len() <= 1024);
    }

    #[test]
    fn bounded_cuts_any_status_and_keeps_its_reason() {
        let long = "é".repeat(10_000);
        let mut details =
            ErrorDetails::with_error_info("SOME_REASON", DOMAIN, HashMap::from([("k".to_string(), long.clone())]));
        details.set_retry_info(Some(Duration::from_millis(1500)));
        for i in 0..50 {
            details.add_bad_request_violation(format!("f{i}"), long.clone());
        }
        let s = bounded(Status::with_error_details(Code::Unavailable, long.clone(), details));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().len() <= MAX_MESSAGE_BYTES + 3);
        assert!(s.details().len() <= 1024, "{}", s.details().len());
        let d = s.get_error_details();
        assert_eq!(d.error_info().unwrap().reason, "SOME_REASON");
        assert_eq!(d.retry_info().unwrap().retry_delay, Some(Duration::from_millis(1500)));
        assert!(!d.bad_request().unwrap().field_violations.is_empty());
        let plain = bounded(Status::internal(long));
        assert!(plain.message().len() <= MAX_MESSAGE_BYTES + 3);
        let short = Status::not_found("short");
        assert_eq!(bounded(short.clone()).message(), short.message());
    }

    #[test]
    fn truncate_cuts_on_a_character_boundary() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc…");
        assert_eq!(truncate("éé", 3), "é…");
    }
}
