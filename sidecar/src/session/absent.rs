//! Sessions a prewarm found not to exist, remembered for a while so that calls carrying a
//! session id that nobody writes to (an id used for stickiness only, a conversation whose
//! agents keep no context) do not each pay a round trip to control before delivery.
//!
//! Forgetting or remembering wrongly costs no correctness: a prewarm only decides whether
//! the session is fetched before the call is delivered. A session written elsewhere within
//! [`ABSENT_FOR`] of being found absent here is read from control by the agent's first
//! read (a cache miss), as it would be with no prewarm; a write by an agent of this sidecar
//! forgets the entry at once (and the sidecar follows the session from then on).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long a session found absent is not fetched again by a prewarm.
pub const ABSENT_FOR: Duration = Duration::from_secs(5);
/// Sessions remembered as absent at most (when full of live entries, no more are added:
/// those prewarms fetch as before).
pub const MAX_ABSENT: usize = 4096;

/// The sessions found absent, each with when.
#[derive(Debug, Default)]
pub(super) struct Absent {
    since: HashMap<String, Instant>,
}

impl Absent {
    /// Whether `session` was found absent less than [`ABSENT_FOR`] ago.
    pub fn remembers(&mut self, session: &str, now: Instant) -> bool {
        match self.since.get(session) {
            Some(at) if now.duration_since(*at) < ABSENT_FOR => true,
            Some(_) => {
                self.since.remove(session);
                false
            }
            None => false,
        }
    }

    /// `session` was found absent at `now`.
    pub fn found_absent(&mut self, session: &str, now: Instant) {
        if self.since.len() >= MAX_ABSENT && !self.since.contains_key(session) {
            self.since.retain(|_, at| now.duration_since(*at) < ABSENT_FOR);
            if self.since.len() >= MAX_ABSENT {
                return;
            }
        }
        self.since.insert(session.to_string(), now);
    }

    /// `session` exists now (written or fetched here).
    pub fn forget(&mut self, session: &str) {
        self.since.remove(session);
    }

    pub fn len(&self) -> usize {
        self.since.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_absent_session_is_remembered_for_its_window_then_fetched_again() {
        let mut absent = Absent::default();
        let t0 = Instant::now();
        assert!(!absent.remembers("s", t0));
        absent.found_absent("s", t0);
        assert!(absent.remembers("s", t0));
        assert!(absent.remembers("s", t0 + ABSENT_FOR - Duration::from_millis(1)));
        assert!(!absent.remembers("other", t0));
        // At the end of the window it is forgotten (and dropped).
        assert!(!absent.remembers("s", t0 + ABSENT_FOR));
        assert_eq!(absent.len(), 0);
        // A write here forgets it at once.
        absent.found_absent("s", t0);
        absent.forget("s");
        assert!(!absent.remembers("s", t0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_memo_is_capped_and_makes_room_from_expired_entries_only() {
        let mut absent = Absent::default();
        let t0 = Instant::now();
        for i in 0..MAX_ABSENT {
            absent.found_absent(&format!("s{i}"), t0);
        }
        assert_eq!(absent.len(), MAX_ABSENT);
        // Full of live entries: one more is not remembered, none is dropped.
        absent.found_absent("late", t0 + Duration::from_secs(1));
        assert!(!absent.remembers("late", t0 + Duration::from_secs(1)));
        assert_eq!(absent.len(), MAX_ABSENT);
        // Once they expired, a new one makes room by dropping them.
        absent.found_absent("later", t0 + ABSENT_FOR);
        assert_eq!(absent.len(), 1);
        assert!(absent.remembers("later", t0 + ABSENT_FOR));
    }
}
