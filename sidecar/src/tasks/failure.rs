//! How a durable task's failed call is read: the reason it names ([`reason_of`]), whether
//! it is worth retrying at all ([`transient`], for calls to control) and, for an attempt's
//! call to the agent, whether it never reached an agent, lost its instance, or was the
//! agent's own answer ([`classify`]).

use agent_reach::reason::{self, Reason};
use tonic::{Code, Status};

/// The ErrorInfo reason of `status`, else its code in SCREAMING_SNAKE_CASE.
pub(super) fn reason_of(status: &Status) -> String {
    match reason::error_info(status) {
        Some(info) => info.reason,
        None => {
            let mut name = String::new();
            for (i, c) in format!("{:?}", status.code()).chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            name
        }
    }
}

/// Whether control (or the store behind it) could not be reached: worth retrying.
pub(super) fn transient(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled)
}

/// How an attempt's call failed.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Failure {
    /// Never reached an agent: try again later.
    NotDelivered,
    /// The instance (or its sidecar) went away, maybe mid-work.
    Lost,
    /// The agent answered an error: the task fails (or is rejected).
    Agent,
}

/// Whether a failed attempt is tried again, and whether its instance may have run it.
pub(super) fn classify(status: &Status) -> Failure {
    if let Some(info) = reason::error_info(status) {
        return match Reason::parse(&info.reason) {
            Some(
                Reason::NoHealthyInstance
                | Reason::AgentNotFound
                | Reason::CircuitOpen
                | Reason::AgentOverloaded
                | Reason::RateLimited
                | Reason::ShuttingDown
                | Reason::ControlUnavailable,
            ) => Failure::NotDelivered,
            Some(Reason::InstanceUnreachable | Reason::SidecarUnreachable) => Failure::Lost,
            _ => Failure::Agent,
        };
    }
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled => Failure::Lost,
        _ => Failure::Agent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_reason() {
        let s = reason::status(Reason::NoHealthyInstance, "none", &[]);
        assert_eq!(classify(&s), Failure::NotDelivered);
        let s = reason::status(Reason::InstanceUnreachable, "gone", &[]);
        assert_eq!(classify(&s), Failure::Lost);
        assert_eq!(classify(&Status::unavailable("connection reset")), Failure::Lost);
        assert_eq!(classify(&Status::invalid_argument("bad input")), Failure::Agent);
        assert_eq!(reason_of(&Status::invalid_argument("x")), "INVALID_ARGUMENT");
    }
}
