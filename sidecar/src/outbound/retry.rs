//! Whether a failed attempt is tried again, and where. Retries happen in the caller's
//! sidecar only, so they never multiply across hops, and always on an instance not tried
//! yet (the router excludes the instances tried from its next pick):
//! - a call that provably never reached an agent (connection refused, instance gone,
//!   paused or overloaded at its sidecar, breaker open) is retried, the first time always;
//! - a call that may have run is retried only when the target's policy marks it idempotent
//!   or the call carries an idempotency key, the failure is UNAVAILABLE or an overload, the
//!   payload is under the policy's retry size limit, and the target's retry budget has
//!   room.
//!
//! At most [`MAX_ATTEMPTS`] instances are tried per target.

use agent_reach::policy::RetryPolicy;
use agent_reach::reason::{self, Reason};
use tonic::{Code, Status};

/// Most instances one call is tried on.
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// How an attempt ended, as far as retrying cares.
pub(crate) enum Ended<'a> {
    /// The call provably never reached an agent.
    NotDelivered,
    /// The call may have run, and failed with this status.
    Failed(&'a Status),
}

/// What a call allows, worked out once per target.
pub(crate) struct Rules {
    /// The policy marks the target idempotent, or the call carries an idempotency key.
    may_rerun: bool,
    /// The payload is under the policy's retry size limit.
    payload_ok: bool,
}

impl Rules {
    pub(crate) fn new(retry: &RetryPolicy, idempotency_key: &str, payload_len: usize) -> Rules {
        Rules {
            may_rerun: retry.idempotent || !idempotency_key.is_empty(),
            payload_ok: payload_len <= retry.max_payload_bytes() as usize,
        }
    }
}

/// Whether to try the call again, on another instance, after attempt number `attempt`
/// ended as `ended`. `budget` spends from the target's retry budget; it is asked last, and
/// only when everything else allows the retry.
pub(crate) fn again(ended: Ended<'_>, attempt: u32, rules: &Rules, budget: impl FnOnce() -> bool) -> bool {
    if attempt >= MAX_ATTEMPTS {
        return false;
    }
    match ended {
        // The first such retry is always allowed; later ones spend budget.
        Ended::NotDelivered => attempt == 1 || budget(),
        Ended::Failed(status) => rules.may_rerun && rules.payload_ok && retryable(status) && budget(),
    }
}

/// Failures worth another instance, for calls that may run twice.
pub(crate) fn retryable(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        // Overloaded elsewhere is worth a try; a rate limit on this caller is not.
        Code::ResourceExhausted => reason::error_info(status).is_none_or(|i| i.reason != Reason::RateLimited.as_str()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_and_overload_are_retryable() {
        assert!(retryable(&Status::unavailable("x")));
        assert!(retryable(&reason::status(Reason::AgentOverloaded, "busy", &[])));
        assert!(!retryable(&reason::status(Reason::RateLimited, "slow down", &[])));
        assert!(!retryable(&Status::internal("x")));
        assert!(!retryable(&Status::invalid_argument("x")));
    }
}
