//! The consistent-hash ring of a group: each instance owns [`vnodes`] points on a 64-bit
//! ring, placed by a stable hash of its id, so every sidecar builds the same ring and a key
//! moves only when the instance that owned it leaves or a new instance takes its arc (about
//! 1/N of the keys when one of N instances joins).
//!
//! The ring only orders instances for a key; eligibility and the bounded-load rule are
//! applied by the walker in [`crate::route`].

/// Points per instance: 64 for small groups, fewer for large ones (at least 16), so a ring
/// stays around 64 K points — even spread, fast to build, cache-friendly to search.
pub fn vnodes(members: usize) -> u32 {
    (65_536 / members.max(1)).clamp(16, 64) as u32
}

/// A stable 64-bit hash (FNV-1a followed by a SplitMix64 finaliser). Stable across
/// processes and versions, unlike the standard library's hasher.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Points sorted by position; each names a member index of the group.
#[derive(Debug, Default)]
pub struct Ring {
    points: Vec<(u64, u32)>,
    members: usize,
}

impl Ring {
    /// Builds the ring of members named by `ids` (member index = position in `ids`).
    pub fn build<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Ring {
        let members = ids.len();
        let per = vnodes(members);
        let mut points = Vec::with_capacity(members * per as usize);
        for (i, id) in ids.enumerate() {
            let base = hash64(id.as_bytes());
            for v in 0..per {
                points.push((mix(base ^ u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15)), i as u32));
            }
        }
        points.sort_unstable();
        Ring { points, members }
    }

    /// Member indices of the points in ring order from `key`'s position (a member appears
    /// once per point it owns; no allocation).
    pub fn points_from(&self, key: u64) -> impl Iterator<Item = u32> + '_ {
        let start = self.points.partition_point(|(p, _)| *p < key);
        let n = self.points.len();
        (0..n).map(move |i| self.points[(start + i) % n].1)
    }

    /// Member indices in ring order from `key`'s position, each once.
    pub fn walk(&self, key: u64) -> Vec<u32> {
        let mut seen = vec![false; self.members];
        self.points_from(key).filter(|m| !std::mem::replace(&mut seen[*m as usize], true)).collect()
    }

    /// The member owning `key` (the first in its walk).
    pub fn owner(&self, key: u64) -> Option<u32> {
        if self.points.is_empty() {
            return None;
        }
        let start = self.points.partition_point(|(p, _)| *p < key);
        Some(self.points[start % self.points.len()].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("agent-{i:04}")).collect()
    }

    #[test]
    fn keys_spread_evenly() {
        let ids = ids(10);
        let ring = Ring::build(ids.iter().map(String::as_str));
        let mut counts = [0usize; 10];
        for k in 0..20_000 {
            counts[ring.owner(hash64(format!("session-{k}").as_bytes())).unwrap() as usize] += 1;
        }
        for c in counts {
            assert!((1200..=2800).contains(&c), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn a_joining_instance_moves_about_one_nth_of_the_keys() {
        let before = ids(10);
        let mut after = before.clone();
        after.push("agent-new".into());
        let r1 = Ring::build(before.iter().map(String::as_str));
        let r2 = Ring::build(after.iter().map(String::as_str));
        let keys = 20_000;
        let mut moved = 0;
        for k in 0..keys {
            let h = hash64(format!("session-{k}").as_bytes());
            let a = &before[r1.owner(h).unwrap() as usize];
            let b = &after[r2.owner(h).unwrap() as usize];
            if a != b {
                assert_eq!(b, "agent-new", "a key moved between two old instances");
                moved += 1;
            }
        }
        let share = moved as f64 / keys as f64;
        assert!(share > 0.04 && share < 0.16, "moved {share:.3} of keys; expected about 1/11");
    }

    #[test]
    fn walk_visits_every_member_once() {
        let ids = ids(5);
        let ring = Ring::build(ids.iter().map(String::as_str));
        let mut order = ring.walk(12345);
        assert_eq!(order[0], ring.owner(12345).unwrap());
        order.sort();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn the_hash_is_stable() {
        assert_eq!(hash64(b"session-1"), hash64(b"session-1"));
        assert_ne!(hash64(b"session-1"), hash64(b"session-2"));
    }
}
