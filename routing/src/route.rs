//! Picking an instance for a call from the routing table, and explaining the choice.
//!
//! 1. Resolve the target (agent name or capability) within the table — the sidecar's
//!    tenant only — or fail with AGENT_NOT_FOUND and the closest names.
//! 2. Keep instances that carry every required tag and were not already tried.
//! 3. Sort them into tiers: first choice (UP; DEGRADED too for NORMAL/LOW calls), then
//!    overloaded ones (DEGRADED for HIGH calls, instances that refused work recently or
//!    report a load ratio ≥ 1), then UNKNOWN as a last resort. PAUSED, DOWN and STARTING
//!    instances take no calls.
//! 4. Pick within the best non-empty tier with the group's strategy: `least_loaded` (power
//!    of two choices over peak-EWMA latency × in-flight, raised by reported load),
//!    `round_robin`, `random`, `weighted`, or `consistent_hash` on a session key with
//!    bounded load.
//!
//! The common case (first tier non-empty) reads precomputed per-group lists and samples a
//! few members: no allocation, no lock, independent of group size. Only when sampling finds
//! nothing usable does it scan the group.

use rand::Rng;

use agent_reach::model::{HealthState, Priority, Target, TargetKind};
use agent_reach::policy::{CircuitBreaker, Strategy};

use crate::ring::hash64;
use crate::table::{Group, Member, RoutingTable, weight};

/// Why no instance could be picked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Nothing in the table offers the target.
    #[error("no agent offers {target}")]
    NotFound { target: String, suggestions: Vec<String> },
    /// Instances exist, but none can take the call.
    #[error("no healthy instance for {target}: {why}")]
    NoHealthyInstance { target: String, why: String, tried: Vec<String> },
}

/// Why an instance of the target was not a candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    pub instance_id: String,
    pub agent: String,
    /// Machine-readable: `STATE_DOWN`, `STATE_PAUSED`, `MISSING_TAGS`, `ALREADY_TRIED`,
    /// `WEIGHT_ZERO`...
    pub reason: String,
    pub detail: String,
}

impl From<Skip> for agent_reach::proto::SkippedInstance {
    fn from(s: Skip) -> Self {
        agent_reach::proto::SkippedInstance {
            instance_id: s.instance_id,
            agent: s.agent,
            reason: s.reason,
            detail: s.detail,
        }
    }
}

/// What a pick needs to know about the call.
#[derive(Clone, Copy, Debug)]
pub struct PickRequest<'a> {
    pub target: &'a Target,
    pub priority: Priority,
    /// The consistent-hash key (the session id, or the metadata value the policy names).
    pub hash_key: Option<&'a str>,
    /// Instances this call already tried.
    pub exclude: &'a [String],
    /// Only instances of this agent version (a canary split's choice); when none of them
    /// can take the call, any version may.
    pub version: Option<&'a str>,
    /// Now, on [`crate::stats::clock`].
    pub now: u64,
    /// An instance to pick ahead of the strategy when it can take the call (see
    /// [`preferred`]): the one owning the claim of the call's idempotency key.
    pub prefer: Option<&'a str>,
}

impl<'a> PickRequest<'a> {
    pub fn new(target: &'a Target, now: u64) -> PickRequest<'a> {
        PickRequest {
            target,
            priority: Priority::Normal,
            hash_key: None,
            exclude: &[],
            version: None,
            now,
            prefer: None,
        }
    }
}

/// Tier 0: first choice; 1: overloaded; 2: last resort.
pub type Tier = u8;

/// The group of instances the target names, or AGENT_NOT_FOUND with suggestions.
pub fn resolve<'t>(table: &'t RoutingTable, target: &Target) -> Result<&'t Group, RouteError> {
    let (groups, name) = match &target.kind {
        TargetKind::Capability(c) => (&table.by_capability, c),
        TargetKind::Agent(a) => (&table.by_agent, a),
    };
    groups.get(name.as_str()).ok_or_else(|| RouteError::NotFound {
        target: target.to_string(),
        suggestions: suggestions(groups.keys().map(String::as_str), name),
    })
}

/// Up to three known names closest to `wanted`, best first.
pub fn suggestions<'a>(known: impl Iterator<Item = &'a str>, wanted: &str) -> Vec<String> {
    let wanted_lower = wanted.to_ascii_lowercase();
    let mut scored: Vec<(f64, &str)> = known
        .map(|k| (strsim::normalized_damerau_levenshtein(&k.to_ascii_lowercase(), &wanted_lower), k))
        .filter(|(score, _)| *score >= 0.6)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().take(3).map(|(_, k)| k.to_string()).collect()
}

fn tags_ok(m: &Member, target: &Target) -> bool {
    if target.tags.is_empty() {
        return true;
    }
    let caps = &m.instance.record.registration.capabilities;
    match &target.kind {
        TargetKind::Capability(name) => caps.iter().any(|c| &c.name == name && c.has_tags(&target.tags)),
        // By agent name, any of the agent's capabilities may carry the tags.
        TargetKind::Agent(_) => target.tags.iter().all(|t| caps.iter().any(|c| c.tags.contains(t))),
    }
}

fn usable(m: &Member, req: &PickRequest<'_>, breaker: &CircuitBreaker) -> bool {
    tags_ok(m, req.target)
        && !req.exclude.iter().any(|e| e == m.id())
        && req.version.is_none_or(|v| m.instance.record.registration.version == v)
        && m.stats.breaker.can_pass(req.now, breaker)
}

/// The breaker settings of a group: its policy's, else the defaults.
pub fn breaker_settings(group: &Group) -> CircuitBreaker {
    group.spec().and_then(|s| s.breaker).unwrap_or_default()
}

/// The tier of a member for a call of `priority`, or `None` when its state takes no calls.
pub fn tier_of(m: &Member, priority: Priority, now: u64) -> Option<Tier> {
    let overloaded = m.stats.overloaded(now);
    match m.instance.record.state {
        HealthState::Up => Some(if overloaded { 1 } else { 0 }),
        HealthState::Degraded => Some(if priority == Priority::High || overloaded { 1 } else { 0 }),
        HealthState::Unknown => Some(2),
        HealthState::Paused | HealthState::Down | HealthState::Starting => None,
    }
}

/// Random samples tried before falling back to a scan.
const SAMPLES: usize = 8;
/// Bounded-load factor of consistent hashing: no instance takes more than (1 + ε) times
/// the group's average in-flight calls from this sidecar.
const BOUNDED_LOAD_EPSILON: f64 = 0.25;

/// Picks an instance for the call described by `req`.
pub fn pick(
    table: &RoutingTable,
    req: &PickRequest<'_>,
) -> Result<(Member, std::sync::Arc<crate::table::GroupState>), RouteError> {
    pick_from(table, resolve(table, req.target)?, req)
}

/// [`pick`] in `group`, the group of `table` that [`resolve`] gave for `req.target` (a
/// caller that resolved it already does not look it up again).
pub fn pick_from(
    table: &RoutingTable,
    group: &Group,
    req: &PickRequest<'_>,
) -> Result<(Member, std::sync::Arc<crate::table::GroupState>), RouteError> {
    if let Some(i) = preferred(group, req) {
        return Ok((group.members[i as usize].clone(), group.state.clone()));
    }
    let mut picked = pick_in(group, req);
    if picked.is_none() && req.version.is_some() {
        // No instance of the split's version can take the call: any version may.
        picked = pick_in(group, &PickRequest { version: None, ..*req });
    }
    match picked {
        Some(i) => Ok((group.members[i as usize].clone(), group.state.clone())),
        None => {
            let skipped = explain(table, req, 0).skipped;
            let why = if skipped.is_empty() {
                "no instances".to_string()
            } else {
                skipped.iter().map(|s| format!("{} {}", s.instance_id, s.reason)).collect::<Vec<_>>().join(", ")
            };
            Err(RouteError::NoHealthyInstance { target: req.target.to_string(), why, tried: req.exclude.to_vec() })
        }
    }
}

/// The member [`PickRequest::prefer`] names, under any strategy, when it is in the group and
/// healthy for the call: the target's tags, not tried yet, its breaker passing, UP or
/// DEGRADED, and not marked overloaded (which also marks an instance that just failed to
/// take a call, e.g. its sidecar died). Any agent version (a canary split does not move a
/// key's owner). Otherwise `None`, and the strategy picks.
pub fn preferred(group: &Group, req: &PickRequest<'_>) -> Option<u32> {
    let id = req.prefer?;
    let i = group.members.binary_search_by(|m| m.id().cmp(id)).ok()?;
    let m = &group.members[i];
    let req = PickRequest { version: None, ..*req };
    let healthy = matches!(m.instance.record.state, HealthState::Up | HealthState::Degraded);
    (healthy && !m.stats.overloaded(req.now) && usable(m, &req, &breaker_settings(group))).then_some(i as u32)
}

fn pick_in(group: &Group, req: &PickRequest<'_>) -> Option<u32> {
    let breaker = breaker_settings(group);
    // One round-robin ticket per pick, whichever path uses it.
    let ticket = match effective_strategy(group, req) {
        Strategy::RoundRobin => group.state.cursor.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        _ => 0,
    };
    pick_first_tier(group, req, ticket, &breaker).or_else(|| pick_by_scan(group, req, ticket, &breaker))
}

/// The fast path: the precomputed first-tier list, checked member by member.
fn pick_first_tier(group: &Group, req: &PickRequest<'_>, ticket: usize, breaker: &CircuitBreaker) -> Option<u32> {
    let by_state = if req.priority == Priority::High { &group.up } else { &group.up_or_degraded };
    // With required tags, sample among members carrying the rarest of them.
    let list = match req.target.tags.iter().map(|t| group.tagged(t)).min_by_key(|l| l.map_or(0, Vec::len)) {
        Some(None) => return None,
        Some(Some(tagged)) if tagged.len() < by_state.len() => tagged,
        _ => by_state,
    };
    if list.is_empty() {
        return None;
    }
    let ok = |i: u32| {
        let m = &group.members[i as usize];
        usable(m, req, breaker) && tier_of(m, req.priority, req.now) == Some(0)
    };
    let mut rng = rand::rng();
    match effective_strategy(group, req) {
        Strategy::RoundRobin => (0..list.len()).map(|k| list[(ticket + k) % list.len()]).find(|i| ok(*i)),
        Strategy::Random => (0..SAMPLES).map(|_| list[rng.random_range(0..list.len())]).find(|i| ok(*i)),
        Strategy::LeastLoaded => {
            if list.len() == 1 {
                return ok(list[0]).then_some(list[0]);
            }
            // Draw distinct pairs until two usable members are found.
            let mut found: [Option<u32>; 2] = [None, None];
            'draw: for _ in 0..SAMPLES / 2 {
                let a = rng.random_range(0..list.len());
                let mut b = rng.random_range(0..list.len() - 1);
                if b >= a {
                    b += 1;
                }
                for i in [list[a], list[b]] {
                    if found[0] == Some(i) || !ok(i) {
                        continue;
                    }
                    if found[0].is_none() {
                        found[0] = Some(i);
                    } else {
                        found[1] = Some(i);
                        break 'draw;
                    }
                }
            }
            match found {
                [Some(a), Some(b)] => Some(cheaper(group, a, b, req.now)),
                [Some(a), None] => Some(a),
                _ => None,
            }
        }
        // Tagged calls: rejection sampling among the tagged members, accepting a member
        // with probability weight / max weight.
        Strategy::Weighted if !req.target.tags.is_empty() => {
            let max = group.max_weight;
            if max == 0 {
                return None;
            }
            (0..SAMPLES * 2).find_map(|_| {
                let i = list[rng.random_range(0..list.len())];
                let accept = rng.random_range(0..max) < weight(&group.members[i as usize], group.spec());
                (accept && ok(i)).then_some(i)
            })
        }
        // Untagged calls: cumulative weights over `up_or_degraded` (HIGH calls reject
        // DEGRADED via `ok`).
        Strategy::Weighted => {
            let total = *group.cumulative_weights.last()?;
            if total == 0 {
                return None;
            }
            (0..SAMPLES)
                .map(|_| {
                    let r = rng.random_range(0..total);
                    group.up_or_degraded[group.cumulative_weights.partition_point(|c| *c <= r)]
                })
                .find(|i| ok(*i))
        }
        Strategy::ConsistentHash => {
            let key = hash64(req.hash_key?.as_bytes());
            let in_flight = group.state.in_flight.load(std::sync::atomic::Ordering::Relaxed);
            let capacity = ((f64::from(in_flight) + 1.0) * (1.0 + BOUNDED_LOAD_EPSILON) / list.len() as f64).ceil();
            group
                .ring()
                .points_from(key)
                .find(|i| ok(*i) && f64::from(group.members[*i as usize].stats.in_flight()) < capacity)
        }
    }
}

/// `consistent_hash` without a key falls back to `least_loaded`.
fn effective_strategy(group: &Group, req: &PickRequest<'_>) -> Strategy {
    match group.strategy() {
        Strategy::ConsistentHash if req.hash_key.is_none() => Strategy::LeastLoaded,
        s => s,
    }
}

fn cheaper(group: &Group, a: u32, b: u32, now: u64) -> u32 {
    let (ca, cb) = (group.members[a as usize].stats.cost(now), group.members[b as usize].stats.cost(now));
    if cb < ca { b } else { a }
}

/// The slow path: scan the whole group into tiers and pick within the best one.
fn pick_by_scan(group: &Group, req: &PickRequest<'_>, ticket: usize, breaker: &CircuitBreaker) -> Option<u32> {
    let tiers = tiers(group, req, breaker);
    let list = tiers.iter().find(|t| !t.is_empty())?;
    let mut rng = rand::rng();
    Some(match effective_strategy(group, req) {
        Strategy::RoundRobin => list[ticket % list.len()],
        Strategy::Random => list[rng.random_range(0..list.len())],
        Strategy::LeastLoaded if list.len() == 1 => list[0],
        Strategy::LeastLoaded => {
            let a = rng.random_range(0..list.len());
            let mut b = rng.random_range(0..list.len() - 1);
            if b >= a {
                b += 1;
            }
            cheaper(group, list[a], list[b], req.now)
        }
        Strategy::Weighted => {
            let weights: Vec<u64> =
                list.iter().map(|i| u64::from(weight(&group.members[*i as usize], group.spec()))).collect();
            let total: u64 = weights.iter().sum();
            if total == 0 {
                return None;
            }
            let mut r = rng.random_range(0..total);
            let mut chosen = list[0];
            for (i, w) in list.iter().zip(&weights) {
                if r < *w {
                    chosen = *i;
                    break;
                }
                r -= w;
            }
            chosen
        }
        Strategy::ConsistentHash => {
            let key = hash64(req.hash_key.unwrap_or_default().as_bytes());
            group.ring().points_from(key).find(|i| list.binary_search(i).is_ok())?
        }
    })
}

/// Usable members by tier (indices ascending). Weight-0 members are left out when the
/// strategy is weighted.
fn tiers(group: &Group, req: &PickRequest<'_>, breaker: &CircuitBreaker) -> [Vec<u32>; 3] {
    let mut tiers: [Vec<u32>; 3] = Default::default();
    let weighted = group.strategy() == Strategy::Weighted;
    for (i, m) in group.members.iter().enumerate() {
        if !usable(m, req, breaker) || (weighted && weight(m, group.spec()) == 0) {
            continue;
        }
        if let Some(t) = tier_of(m, req.priority, req.now) {
            tiers[t as usize].push(i as u32);
        }
    }
    tiers
}

/// One candidate in an explanation.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub member: Member,
    /// Strategy-specific; lower is better (least_loaded: cost in ms; round_robin and
    /// consistent_hash: position; random and weighted: 1 − share of picks).
    pub score: f64,
    pub tier: Tier,
    /// Why the candidate is not first choice, if it is not.
    pub note: String,
}

/// Where a call would go: candidates in the order they would be tried, and every other
/// instance of the target with the reason it was skipped.
#[derive(Debug, Default)]
pub struct Explanation {
    pub strategy: Option<Strategy>,
    pub candidates: Vec<Candidate>,
    pub skipped: Vec<Skip>,
}

/// Explains routing for `req` without moving any cursor. `max` of 0 means no limit.
pub fn explain(table: &RoutingTable, req: &PickRequest<'_>, max: usize) -> Explanation {
    let mut out = Explanation::default();
    let Ok(group) = resolve(table, req.target) else { return out };
    let strategy = effective_strategy(group, req);
    out.strategy = Some(strategy);
    let weighted = group.strategy() == Strategy::Weighted;
    let breaker = breaker_settings(group);
    for m in &group.members {
        let skip = |reason: &str, detail: String| Skip {
            instance_id: m.id().to_string(),
            agent: m.instance.agent().to_string(),
            reason: reason.to_string(),
            detail,
        };
        if req.exclude.iter().any(|e| e == m.id()) {
            out.skipped.push(skip("ALREADY_TRIED", "this call already failed on it".into()));
        } else if !tags_ok(m, req.target) {
            let have: Vec<&str> = m
                .instance
                .record
                .registration
                .capabilities
                .iter()
                .flat_map(|c| c.tags.iter().map(String::as_str))
                .collect();
            out.skipped.push(skip(
                "MISSING_TAGS",
                format!("requires [{}], has [{}]", req.target.tags.join(","), have.join(",")),
            ));
        } else if req.version.is_some_and(|v| m.instance.record.registration.version != v) {
            out.skipped.push(skip(
                "OTHER_VERSION",
                format!("the split sends this call to version {:?}", req.version.unwrap_or_default()),
            ));
        } else if !m.stats.breaker.can_pass(req.now, &breaker) {
            out.skipped
                .push(skip("BREAKER_OPEN", format!("circuit breaker {}", m.stats.breaker.state(req.now).as_str())));
        } else if weighted && weight(m, group.spec()) == 0 {
            out.skipped.push(skip(
                "WEIGHT_ZERO",
                format!("version {:?} has weight 0", m.instance.record.registration.version),
            ));
        } else if tier_of(m, req.priority, req.now).is_none() {
            let s = m.instance.record.state;
            out.skipped.push(skip(&format!("STATE_{s}"), format!("instance is {s}")));
        }
    }
    let tiers = tiers(group, req, &breaker);
    for (t, list) in tiers.iter().enumerate() {
        let mut ranked: Vec<(u32, f64)> = match strategy {
            Strategy::LeastLoaded => {
                let mut v: Vec<(u32, f64)> =
                    list.iter().map(|i| (*i, group.members[*i as usize].stats.cost(req.now) / 1e6)).collect();
                v.sort_by(|a, b| a.1.total_cmp(&b.1));
                v
            }
            Strategy::RoundRobin => {
                let mut v = list.clone();
                if !v.is_empty() {
                    let len = v.len();
                    v.rotate_left(group.state.cursor.load(std::sync::atomic::Ordering::Relaxed) % len);
                }
                v.into_iter().enumerate().map(|(pos, i)| (i, pos as f64)).collect()
            }
            Strategy::Random => list.iter().map(|i| (*i, 1.0 - 1.0 / list.len() as f64)).collect(),
            Strategy::Weighted => {
                let total: u64 =
                    list.iter().map(|i| u64::from(weight(&group.members[*i as usize], group.spec()))).sum();
                let mut v: Vec<(u32, f64)> = list
                    .iter()
                    .map(|i| {
                        let w = weight(&group.members[*i as usize], group.spec());
                        (*i, 1.0 - f64::from(w) / total.max(1) as f64)
                    })
                    .collect();
                v.sort_by(|a, b| a.1.total_cmp(&b.1));
                v
            }
            Strategy::ConsistentHash => {
                let key = hash64(req.hash_key.unwrap_or_default().as_bytes());
                group
                    .ring()
                    .walk(key)
                    .into_iter()
                    .filter(|i| list.binary_search(i).is_ok())
                    .enumerate()
                    .map(|(pos, i)| (i, pos as f64))
                    .collect()
            }
        };
        for (i, score) in ranked.drain(..) {
            if max != 0 && out.candidates.len() >= max {
                break;
            }
            let m = &group.members[i as usize];
            let note = match t {
                0 => String::new(),
                1 if m.instance.record.state == HealthState::Degraded && req.priority == Priority::High => {
                    "DEGRADED: takes HIGH priority calls only when no UP instance is left".into()
                }
                1 => "OVERLOADED: refused work recently or reports load ≥ 1; used when nothing better is left".into(),
                _ => "UNKNOWN: heartbeats stale; last resort".into(),
            };
            out.candidates.push(Candidate { member: m.clone(), score, tier: t as Tier, note });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;
    use std::time::Duration;

    use agent_reach::model::{Instance, fixture};
    use agent_reach::policy::{Policy, PolicyKind, PolicySpec};

    use super::*;

    const NOW: u64 = 1_000_000_000_000;

    fn inst(id: &str, agent: &str, cap: &str, tags: &[&str], state: HealthState) -> Instance {
        fixture::instance(id).agent(agent).version("1.0").capability(cap, tags).state(state).build()
    }

    fn table_with(list: Vec<Instance>, strategy: Option<Strategy>, cap: &str) -> RoutingTable {
        let map: HashMap<String, Arc<Instance>> =
            list.into_iter().map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect();
        let mut policies = crate::table::Policies::default();
        if let Some(s) = strategy {
            let p = Policy {
                tenant: "default".into(),
                kind: PolicyKind::Capability,
                name: cap.into(),
                spec: PolicySpec { strategy: Some(s), ..Default::default() },
                description: String::new(),
            };
            policies.insert((PolicyKind::Capability, cap.to_string()), Arc::new(p));
        }
        RoutingTable::build(7, map, policies, None)
    }

    fn rr(list: Vec<Instance>) -> RoutingTable {
        table_with(list, Some(Strategy::RoundRobin), "x")
    }

    fn pick_id(t: &RoutingTable, req: &PickRequest<'_>) -> String {
        pick(t, req).unwrap().0.id().to_string()
    }

    #[test]
    fn round_robin_is_exact_and_respects_tags() {
        let t = table_with(
            vec![
                inst("a", "sum", "text.summarize", &["en"], HealthState::Up),
                inst("b", "sum", "text.summarize", &["en", "zh"], HealthState::Up),
                inst("c", "sum", "text.summarize", &["zh"], HealthState::Up),
            ],
            Some(Strategy::RoundRobin),
            "text.summarize",
        );
        let target = Target::capability("text.summarize");
        let picks: Vec<String> = (0..6).map(|_| pick_id(&t, &PickRequest::new(&target, NOW))).collect();
        assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);

        let zh = Target { tags: vec!["zh".into()], ..target.clone() };
        let mut seen: Vec<String> = (0..4).map(|_| pick_id(&t, &PickRequest::new(&zh, NOW))).collect();
        seen.sort();
        assert!(seen.iter().all(|s| s == "b" || s == "c"), "{seen:?}");

        let both = Target { tags: vec!["en".into(), "zh".into()], ..target };
        assert_eq!(pick_id(&t, &PickRequest::new(&both, NOW)), "b");
    }

    #[test]
    fn priorities_and_states_choose_the_tier() {
        let t = rr(vec![
            inst("a", "sum", "x", &[], HealthState::Down),
            inst("b", "sum", "x", &[], HealthState::Degraded),
            inst("c", "sum", "x", &[], HealthState::Up),
            inst("d", "sum", "x", &[], HealthState::Unknown),
            inst("e", "sum", "x", &[], HealthState::Paused),
        ]);
        let target = Target::capability("x");
        let high = PickRequest { priority: Priority::High, ..PickRequest::new(&target, NOW) };
        for _ in 0..4 {
            assert_eq!(pick_id(&t, &high), "c", "HIGH avoids DEGRADED while an UP instance is left");
        }
        let normal = PickRequest::new(&target, NOW);
        let mut seen: Vec<String> = (0..4).map(|_| pick_id(&t, &normal)).collect();
        seen.sort();
        assert_eq!(seen, ["b", "b", "c", "c"], "NORMAL uses UP and DEGRADED alike");
        let excl = ["c".to_string()];
        assert_eq!(pick_id(&t, &PickRequest { exclude: &excl, ..high }), "b", "DEGRADED when nothing UP is left");
        let excl = ["b".to_string(), "c".to_string()];
        assert_eq!(pick_id(&t, &PickRequest { exclude: &excl, ..normal }), "d", "UNKNOWN as the last resort");
        let excl = ["b".to_string(), "c".to_string(), "d".to_string()];
        match pick(&t, &PickRequest { exclude: &excl, ..normal }).unwrap_err() {
            RouteError::NoHealthyInstance { why, tried, .. } => {
                assert_eq!(tried, ["b", "c", "d"]);
                assert!(why.contains("a STATE_DOWN") && why.contains("e STATE_PAUSED"), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let e = explain(&t, &normal, 0);
        let order: Vec<(&str, Tier)> = e.candidates.iter().map(|c| (c.member.id(), c.tier)).collect();
        assert_eq!(order.len(), 3);
        assert_eq!(order[2], ("d", 2));
        let mut skipped: Vec<(&str, &str)> =
            e.skipped.iter().map(|s| (s.instance_id.as_str(), s.reason.as_str())).collect();
        skipped.sort();
        assert_eq!(skipped, [("a", "STATE_DOWN"), ("e", "STATE_PAUSED")]);
    }

    #[test]
    fn overloaded_instances_are_avoided_before_they_fail() {
        let t = rr(vec![inst("a", "s", "x", &[], HealthState::Up), inst("b", "s", "x", &[], HealthState::Up)]);
        t.instances["a"].stats.mark_overloaded(NOW);
        let target = Target::capability("x");
        for _ in 0..4 {
            assert_eq!(pick_id(&t, &PickRequest::new(&target, NOW)), "b");
        }
        // Reported load ≥ 1 counts too; with both overloaded, both serve again.
        t.instances["b"].stats.report_load(1.2, NOW);
        let mut seen: Vec<String> = (0..4).map(|_| pick_id(&t, &PickRequest::new(&target, NOW))).collect();
        seen.sort();
        assert_eq!(seen, ["a", "a", "b", "b"]);
        let e = explain(&t, &PickRequest::new(&target, NOW), 0);
        assert!(e.candidates.iter().all(|c| c.tier == 1 && c.note.starts_with("OVERLOADED")));
    }

    #[test]
    fn least_loaded_prefers_the_fast_idle_instance() {
        let t = table_with(
            vec![inst("fast", "s", "x", &[], HealthState::Up), inst("slow", "s", "x", &[], HealthState::Up)],
            None,
            "x",
        );
        t.instances["fast"].stats.observe(Duration::from_millis(1), NOW);
        t.instances["slow"].stats.observe(Duration::from_millis(20), NOW);
        let target = Target::capability("x");
        let picks: Vec<String> = (0..100).map(|_| pick_id(&t, &PickRequest::new(&target, NOW))).collect();
        assert!(picks.iter().all(|p| p == "fast"), "with two instances P2C compares both every time");
        // In-flight calls raise the cost: 25 calls in flight on "fast" make "slow" cheaper.
        let _guards: Vec<_> = (0..25).map(|_| t.instances["fast"].stats.begin()).collect();
        assert_eq!(pick_id(&t, &PickRequest::new(&target, NOW)), "slow");
        let e = explain(&t, &PickRequest::new(&target, NOW), 0);
        assert_eq!(e.candidates[0].member.id(), "slow");
        assert!(e.candidates[0].score < e.candidates[1].score);
    }

    #[test]
    fn random_and_weighted_spread_by_weight() {
        let mut list = Vec::new();
        for (id, version) in [("a", "1.0"), ("b", "1.0"), ("c", "2.0")] {
            let mut i = inst(id, "s", "x", &[], HealthState::Up);
            i.record.registration.version = version.into();
            list.push(i);
        }
        let map: HashMap<String, Arc<Instance>> =
            list.into_iter().map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect();
        let spec = PolicySpec {
            strategy: Some(Strategy::Weighted),
            weights: BTreeMap::from([("1.0".to_string(), 1), ("2.0".to_string(), 8)]),
            ..Default::default()
        };
        let p = Policy {
            tenant: "default".into(),
            kind: PolicyKind::Capability,
            name: "x".into(),
            spec,
            description: String::new(),
        };
        let t = RoutingTable::build(
            1,
            map,
            crate::table::Policies::from_iter([((PolicyKind::Capability, "x".to_string()), Arc::new(p))]),
            None,
        );
        let target = Target::capability("x");
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..10_000 {
            *counts.entry(pick_id(&t, &PickRequest::new(&target, NOW))).or_default() += 1;
        }
        // Expected shares 1/10, 1/10, 8/10.
        assert!((800..1200).contains(&counts["a"]), "{counts:?}");
        assert!((800..1200).contains(&counts["b"]), "{counts:?}");
        assert!((7600..8400).contains(&counts["c"]), "{counts:?}");

        let t = table_with(
            (0..4).map(|i| inst(&format!("r{i}"), "s", "y", &[], HealthState::Up)).collect(),
            Some(Strategy::Random),
            "y",
        );
        let target = Target::capability("y");
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..8_000 {
            *counts.entry(pick_id(&t, &PickRequest::new(&target, NOW))).or_default() += 1;
        }
        assert_eq!(counts.len(), 4);
        assert!(counts.values().all(|c| (1700..2300).contains(c)), "{counts:?}");
    }

    #[test]
    fn consistent_hash_is_sticky_and_bounded() {
        let t = table_with(
            (0..5).map(|i| inst(&format!("h{i}"), "s", "x", &[], HealthState::Up)).collect(),
            Some(Strategy::ConsistentHash),
            "x",
        );
        let target = Target::capability("x");
        let req = |key: &'static str| PickRequest { hash_key: Some(key), ..PickRequest::new(&target, NOW) };
        let first = pick_id(&t, &req("session-42"));
        for _ in 0..10 {
            assert_eq!(pick_id(&t, &req("session-42")), first, "a session sticks to its instance");
        }
        // Load the owner beyond its bounded share: the session spills to the next instance.
        let owner = &t.instances[&first];
        let group = t.by_capability.get("x").unwrap();
        let mut guards = Vec::new();
        for _ in 0..10 {
            guards.push(owner.stats.begin());
            group.state.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let spilled = pick_id(&t, &req("session-42"));
        assert_ne!(spilled, first, "bounded load moves a hot key off an overloaded instance");
        drop(guards);
        group.state.in_flight.store(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(pick_id(&t, &req("session-42")), first, "and it comes back when the load is gone");
        // Without a key the strategy falls back to least_loaded (no panic, a pick).
        assert!(pick(&t, &PickRequest::new(&target, NOW)).is_ok());
    }

    #[test]
    fn open_breakers_and_other_versions_are_skipped() {
        let mut canary = inst("c", "s", "x", &[], HealthState::Up);
        canary.record.registration.version = "2.0".into();
        let t = rr(vec![inst("a", "s", "x", &[], HealthState::Up), inst("b", "s", "x", &[], HealthState::Up), canary]);
        let target = Target::capability("x");
        let settings = CircuitBreaker::default();
        for _ in 0..10 {
            t.instances["a"].stats.breaker.record(NOW, true, &settings);
        }
        let req = PickRequest::new(&target, NOW);
        for _ in 0..6 {
            assert_ne!(pick_id(&t, &req), "a", "an open breaker takes no calls");
        }
        let e = explain(&t, &req, 0);
        assert_eq!(
            e.skipped.iter().map(|s| (s.instance_id.as_str(), s.reason.as_str())).collect::<Vec<_>>(),
            [("a", "BREAKER_OPEN")]
        );
        let canary_req = PickRequest { version: Some("2.0"), ..req };
        for _ in 0..4 {
            assert_eq!(pick_id(&t, &canary_req), "c");
        }
        // The chosen version gone: any version serves rather than failing the call.
        let excl = ["c".to_string()];
        assert_eq!(pick_id(&t, &PickRequest { exclude: &excl, ..canary_req }), "b");
    }

    #[test]
    fn the_owner_of_a_key_is_picked_under_every_strategy_while_it_can_take_the_call() {
        let strategies = [
            Strategy::RoundRobin,
            Strategy::Random,
            Strategy::LeastLoaded,
            Strategy::Weighted,
            Strategy::ConsistentHash,
        ];
        for strategy in strategies {
            let build = || {
                let mut canary = inst("o", "s", "x", &["en"], HealthState::Up);
                canary.record.registration.version = "2.0".into();
                let others = (0..4).map(|i| inst(&format!("h{i}"), "s", "x", &["en"], HealthState::Up));
                table_with(others.chain([canary]).collect(), Some(strategy), "x")
            };
            let t = build();
            let target = Target::capability("x");
            let plain = PickRequest { hash_key: Some("order-42"), ..PickRequest::new(&target, NOW) };
            let req = PickRequest { prefer: Some("o"), ..plain };
            for _ in 0..20 {
                assert_eq!(pick_id(&t, &req), "o", "{strategy:?}: the owner, whatever the strategy picks");
            }
            // Whatever version a canary split chose, and with the target's tags.
            let en = Target { tags: vec!["en".into()], ..target.clone() };
            assert_eq!(pick_id(&t, &PickRequest { version: Some("1.0"), target: &en, ..req }), "o");
            // Tried already, missing the tags, or not in the table: the strategy picks.
            let excl = ["o".to_string()];
            for _ in 0..10 {
                assert_ne!(pick_id(&t, &PickRequest { exclude: &excl, ..req }), "o", "{strategy:?}");
            }
            let zh = Target { tags: vec!["zh".into()], ..target.clone() };
            assert!(matches!(pick(&t, &PickRequest { target: &zh, ..req }), Err(RouteError::NoHealthyInstance { .. })));
            let gone = PickRequest { prefer: Some("gone"), ..plain };
            assert!(pick(&t, &gone).is_ok(), "{strategy:?}");
            if strategy == Strategy::ConsistentHash {
                assert_eq!(pick_id(&t, &gone), pick_id(&t, &plain), "an unknown owner changes nothing");
            }
            // Its breaker open: the strategy picks.
            let settings = CircuitBreaker::default();
            for _ in 0..10 {
                t.instances["o"].stats.breaker.record(NOW, true, &settings);
            }
            for _ in 0..10 {
                assert_ne!(pick_id(&t, &req), "o", "{strategy:?}: an open breaker");
            }
            // Marked overloaded (it refused work, or failed to take a call): the strategy
            // picks among the others.
            let t = build();
            assert_eq!(pick_id(&t, &req), "o", "{strategy:?}: a new table, a closed breaker");
            t.instances["o"].stats.mark_overloaded(NOW);
            for _ in 0..10 {
                assert_ne!(pick_id(&t, &req), "o", "{strategy:?}: an overloaded owner");
            }
        }
        // Not healthy: DOWN, PAUSED or UNKNOWN owners are passed over.
        for state in [HealthState::Down, HealthState::Paused, HealthState::Unknown, HealthState::Starting] {
            let t = rr(vec![inst("a", "s", "x", &[], HealthState::Up), inst("o", "s", "x", &[], state)]);
            let target = Target::capability("x");
            let req = PickRequest { prefer: Some("o"), ..PickRequest::new(&target, NOW) };
            for _ in 0..4 {
                assert_eq!(pick_id(&t, &req), "a", "{state:?}");
            }
        }
        // DEGRADED takes the owner's duplicates (at any priority).
        let t = rr(vec![inst("a", "s", "x", &[], HealthState::Up), inst("o", "s", "x", &[], HealthState::Degraded)]);
        let target = Target::capability("x");
        let high = PickRequest { prefer: Some("o"), priority: Priority::High, ..PickRequest::new(&target, NOW) };
        assert_eq!(pick_id(&t, &high), "o");
    }

    #[test]
    fn stats_survive_table_swaps() {
        let t1 = rr(vec![inst("a", "s", "x", &[], HealthState::Up)]);
        t1.instances["a"].stats.observe(Duration::from_millis(7), NOW);
        let t2 = t1.apply(crate::table::Change {
            revision: 8,
            upserted: vec![inst("b", "s", "x", &[], HealthState::Up)],
            ..Default::default()
        });
        assert!(Arc::ptr_eq(&t1.instances["a"].stats, &t2.instances["a"].stats));
        assert!(Arc::ptr_eq(&t1.by_capability["x"].state, &t2.by_capability["x"].state));
        assert_eq!(t2.revision, 8);
        assert_eq!(t2.by_capability["x"].members.len(), 2);
    }

    #[test]
    fn unknown_targets_get_suggestions() {
        let t = rr(vec![
            inst("a", "summarizer", "text.summarize", &[], HealthState::Up),
            inst("b", "translator", "text.translate", &[], HealthState::Up),
        ]);
        let err = |target: Target| pick(&t, &PickRequest::new(&target, NOW)).unwrap_err();
        match err(Target::capability("text.summarise")) {
            RouteError::NotFound { suggestions, .. } => assert_eq!(suggestions[0], "text.summarize"),
            other => panic!("unexpected {other:?}"),
        }
        match err(Target::agent("translater")) {
            RouteError::NotFound { suggestions, .. } => assert_eq!(suggestions, ["translator"]),
            other => panic!("unexpected {other:?}"),
        }
        match err(Target::capability("image.render")) {
            RouteError::NotFound { suggestions, .. } => assert!(suggestions.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn explain_names_missing_tags_and_follows_the_cursor() {
        let t = rr(vec![
            inst("a", "sum", "x", &["en"], HealthState::Up),
            inst("b", "sum", "x", &["zh"], HealthState::Up),
            inst("c", "sum", "x", &["zh"], HealthState::Up),
        ]);
        let zh = Target { tags: vec!["zh".into()], ..Target::capability("x") };
        let e = explain(&t, &PickRequest::new(&zh, NOW), 5);
        assert_eq!(e.skipped[0].reason, "MISSING_TAGS");
        assert_eq!(e.skipped[0].detail, "requires [zh], has [en]");
        assert_eq!(e.candidates.len(), 2);
    }

    /// A simulated stream of calls on injected time: `rate` calls/s for `secs` seconds over
    /// three equal `least_loaded` instances, each call taking `latency(instance, t, rng)`.
    /// Completions are observed at their end time, as the sidecar does. Returns the picks
    /// per instance per second.
    fn simulate(
        secs: u64,
        rate: u64,
        latency: impl Fn(&str, u64, &mut rand::rngs::StdRng) -> Duration,
    ) -> Vec<[u32; 3]> {
        use rand::SeedableRng;
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;

        const SEC: u64 = 1_000_000_000;
        let ids = ["a", "b", "c"];
        let t = table_with(ids.iter().map(|i| inst(i, "s", "x", &[], HealthState::Up)).collect(), None, "x");
        let target = Target::capability("x");
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let mut pending: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
        let mut guards: HashMap<usize, crate::stats::InFlight> = HashMap::new();
        let mut per_second = vec![[0u32; 3]; secs as usize];
        let step = SEC / rate;
        for k in 0..secs * rate {
            let now = NOW + k * step;
            while let Some(Reverse((end, lat, key))) = pending.peek().copied() {
                if end > now {
                    break;
                }
                pending.pop();
                let g = guards.remove(&key).unwrap();
                g.stats().observe(Duration::from_nanos(lat), end);
            }
            let id = pick_id(&t, &PickRequest::new(&target, now));
            let n = ids.iter().position(|i| *i == id).unwrap();
            per_second[((k * step) / SEC) as usize][n] += 1;
            let lat = latency(&id, k * step, &mut rng).as_nanos() as u64;
            guards.insert(k as usize, t.instances[id.as_str()].stats.begin());
            pending.push(Reverse((now + lat, lat, k as usize)));
        }
        per_second
    }

    fn total(rows: &[[u32; 3]]) -> [u32; 3] {
        rows.iter().fold([0; 3], |acc, r| [acc[0] + r[0], acc[1] + r[1], acc[2] + r[2]])
    }

    /// Latency of an equal instance on a busy machine: 1 ms, jitter, and a 5–30 ms stall on
    /// 1 % of calls (scheduling, GC) — the stalls are what starved instances before.
    fn busy(rng: &mut rand::rngs::StdRng) -> Duration {
        let base = 1_000_000 + rng.random_range(0..500_000);
        let stall = if rng.random_range(0..100) == 0 { rng.random_range(5_000_000..30_000_000) } else { 0 };
        Duration::from_nanos(base + stall)
    }

    #[test]
    fn least_loaded_shares_equal_instances_evenly() {
        for _ in 0..10 {
            let shares = total(&simulate(10, 300, |_, _, rng| busy(rng)));
            assert_eq!(shares.iter().sum::<u32>(), 3000);
            assert!(
                shares.iter().all(|s| (750..=1250).contains(s)),
                "three equal instances at 300 calls/s for 10 s must each get 1000 ± 25 %: {shares:?}"
            );
        }
    }

    #[test]
    fn an_instance_that_slowed_once_gets_its_share_back() {
        const SEC: u64 = 1_000_000_000;
        // "b" answers in 50 ms for seconds 2–4, then is as fast as the others again.
        let rows = simulate(12, 300, |id, t, rng| {
            if id == "b" && (2 * SEC..4 * SEC).contains(&t) { Duration::from_millis(50) } else { busy(rng) }
        });
        let slow = total(&rows[2..4]);
        assert!(slow[1] * 10 < slow[0] + slow[1] + slow[2], "while slow, b gets under 10 %: {slow:?}");
        // Within 3 s of recovering it is back within ±25 % of an even share.
        // In the first second after it recovers it already takes at least 60 % of an even
        // share, and from then on it gets its third within ±25 %.
        assert!(
            rows[4][1] >= 60,
            "b recovered at 4 s but got {} of 300 calls in the next second: {rows:?}",
            rows[4][1]
        );
        let back = total(&rows[4..12]);
        assert!(
            (600..=1000).contains(&back[1]),
            "b recovered at 4 s; over seconds 4–12 it must get 800 ± 25 % of 2400 calls: {rows:?}"
        );
    }
}
