//! Reconnect and retry delays: exponential growth from a base to a cap, with jitter so
//! many clients that failed together do not come back together.

use std::time::Duration;

/// The delay before retry number `attempt` (0-based): `base * 2^attempt`, capped at `cap`,
/// then scaled by a random factor in [0.5, 1.0].
pub fn jittered(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    exp.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_within_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(5);
        for (attempt, full) in [(0, 100), (1, 200), (3, 800), (10, 5000), (40, 5000)] {
            let d = jittered(attempt, base, cap);
            let full = Duration::from_millis(full);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?} not in [{:?}, {full:?}]", full / 2);
        }
    }
}
