//! Canary and weighted splits between agent versions: which version a call should go to.
//!
//! A metadata match (e.g. `x-canary: true`) sends a call to the match's version. Otherwise
//! the call's session key picks a bucket 0..100 by a stable hash, so a session stays on one
//! version; calls without a session key get a random bucket. Only the choice is made here;
//! [`crate::pick`] then prefers instances of that version.

use agent_reach::policy::VersionSplit;
use rand::Rng;

use crate::ring::hash64;

/// The version a call goes to under `split`, if the split decides one.
pub fn choose_version<'s>(
    split: &'s VersionSplit,
    session_key: Option<&str>,
    metadata_value: Option<&str>,
) -> Option<&'s str> {
    if !split.match_key.is_empty() && metadata_value == Some(split.match_value.as_str()) {
        return Some(split.match_version.as_str());
    }
    if split.weights.is_empty() {
        return None;
    }
    let bucket = match session_key {
        Some(k) => (hash64(k.as_bytes()) % 100) as u32,
        None => rand::rng().random_range(0..100),
    };
    let mut upto = 0;
    for (version, percent) in &split.weights {
        upto += percent;
        if bucket < upto {
            return Some(version.as_str());
        }
    }
    split.weights.last().map(|(v, _)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split() -> VersionSplit {
        VersionSplit {
            weights: vec![("1.0".into(), 90), ("1.1".into(), 10)],
            match_key: "x-canary".into(),
            match_value: "true".into(),
            match_version: "1.1".into(),
        }
    }

    #[test]
    fn ten_percent_of_sessions_go_to_the_canary_and_stay() {
        let s = split();
        let sessions = 20_000;
        let canary = (0..sessions).filter(|i| choose_version(&s, Some(&format!("s-{i}")), None) == Some("1.1")).count();
        let share = canary as f64 / sessions as f64;
        assert!((0.09..0.11).contains(&share), "canary share {share}");
        for i in 0..200 {
            let key = format!("s-{i}");
            let first = choose_version(&s, Some(&key), None);
            assert!((0..10).all(|_| choose_version(&s, Some(&key), None) == first), "session {key} flipped");
        }
    }

    #[test]
    fn a_metadata_match_overrides_the_percentages() {
        let s = split();
        for i in 0..100 {
            assert_eq!(choose_version(&s, Some(&format!("s-{i}")), Some("true")), Some("1.1"));
        }
        let only_match = VersionSplit { weights: vec![], ..split() };
        assert_eq!(choose_version(&only_match, Some("s"), Some("false")), None);
        assert_eq!(choose_version(&only_match, Some("s"), Some("true")), Some("1.1"));
    }
}
