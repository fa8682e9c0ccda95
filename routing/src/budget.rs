//! The retry budget of a target: retries are allowed while they stay under a ratio of the
//! calls made over the last ten seconds, plus a small floor per second, so a target that
//! fails everything gets a bounded number of extra attempts instead of a retry storm.
//!
//! A brief `std::sync::Mutex` guards the ten one-second buckets; it is never held across an
//! await and is uncontended in practice (one lock per call and per retry). The buckets are
//! allocated on the first call counted, so the budgets of targets this sidecar never calls
//! (most groups of a large table) cost a lock word.

use std::sync::Mutex;

const WINDOW_SECS: u64 = 10;

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    second: u64,
    calls: u32,
    retries: u32,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct RetryBudget {
    /// None until the first call or retry is counted.
    buckets: Mutex<Option<Box<[Bucket; WINDOW_SECS as usize]>>>,
}

impl RetryBudget {
    fn with<T>(&self, now_ns: u64, f: impl FnOnce(&mut [Bucket; WINDOW_SECS as usize], u64) -> T) -> T {
        let second = now_ns / 1_000_000_000;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        f(buckets.get_or_insert_with(Default::default), second)
    }

    /// Counts a first attempt.
    pub fn record_call(&self, now_ns: u64) {
        self.with(now_ns, |b, second| current(b, second).calls += 1);
    }

    /// Takes one retry from the budget if there is room: ⌊`ratio` × calls⌋ plus
    /// `min_per_second` × 10 retries are allowed over the ten-second window.
    pub fn try_retry(&self, now_ns: u64, ratio: f64, min_per_second: u32) -> bool {
        self.with(now_ns, |b, second| {
            let (calls, retries) = b
                .iter()
                .filter(|k| k.second + WINDOW_SECS > second)
                .fold((0u64, 0u64), |(c, r), k| (c + u64::from(k.calls), r + u64::from(k.retries)));
            let allowed = (ratio * calls as f64).floor() as u64 + u64::from(min_per_second) * WINDOW_SECS;
            if retries < allowed {
                current(b, second).retries += 1;
                true
            } else {
                false
            }
        })
    }
}

fn current(buckets: &mut [Bucket; WINDOW_SECS as usize], second: u64) -> &mut Bucket {
    let b = &mut buckets[(second % WINDOW_SECS) as usize];
    if b.second != second {
        *b = Bucket { second, calls: 0, retries: 0 };
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn floor_then_ratio() {
        let budget = RetryBudget::default();
        // No calls: only the floor (1/s over 10 s = 10 retries).
        let granted = (0..50).filter(|_| budget.try_retry(100 * S, 0.2, 1)).count();
        assert_eq!(granted, 10);
        // 100 calls add 20 more.
        for _ in 0..100 {
            budget.record_call(100 * S);
        }
        let granted = (0..50).filter(|_| budget.try_retry(100 * S, 0.2, 1)).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn an_unused_budget_holds_no_buckets() {
        let budget = RetryBudget::default();
        assert!(budget.buckets.lock().unwrap().is_none());
        budget.record_call(S);
        assert!(budget.buckets.lock().unwrap().is_some());
        assert!(std::mem::size_of::<RetryBudget>() <= 16, "{}", std::mem::size_of::<RetryBudget>());
    }

    #[test]
    fn the_window_slides() {
        let budget = RetryBudget::default();
        let granted = (0..20).filter(|_| budget.try_retry(100 * S, 0.0, 1)).count();
        assert_eq!(granted, 10);
        assert!(!budget.try_retry(109 * S, 0.0, 1), "still inside the window");
        assert!(budget.try_retry(110 * S, 0.0, 1), "the retries of second 100 left the window");
    }
}
