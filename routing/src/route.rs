//! Picking an instance for a call from the routing table, and explaining the choice.
//!
//! Resolution: the target's agent name or capability within the table (the sidecar's
//! tenant only), then all-of tag matching, then health (`UP` preferred, `DEGRADED` only
//! when no `UP` instance is left), then round-robin among what remains. Everything here is
//! synchronous and allocation-free on the pick path; it reads one immutable table.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent_reach::model::{HealthState, Instance, Target, TargetKind};

use crate::table::{Group, RoutingTable};

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
    /// Machine-readable: `STATE_DOWN`, `STATE_PAUSED`, `MISSING_TAGS`, `ALREADY_TRIED`...
    pub reason: String,
    pub detail: String,
}

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

fn capability_tags_ok(inst: &Instance, target: &Target) -> bool {
    if target.tags.is_empty() {
        return true;
    }
    let caps = &inst.record.registration.capabilities;
    match &target.kind {
        TargetKind::Capability(name) => caps.iter().any(|c| &c.name == name && c.has_tags(&target.tags)),
        // By agent name, any of the agent's capabilities may carry the tags.
        TargetKind::Agent(_) => target.tags.iter().all(|t| caps.iter().any(|c| c.tags.contains(t))),
    }
}

fn eligible(inst: &Instance, target: &Target, exclude: &[String], state: HealthState) -> bool {
    inst.record.state == state && capability_tags_ok(inst, target) && !exclude.iter().any(|e| e == inst.id())
}

/// Picks an instance for `target`, never one in `exclude`.
pub fn pick(table: &RoutingTable, target: &Target, exclude: &[String]) -> Result<Arc<Instance>, RouteError> {
    let group = resolve(table, target)?;
    for state in [HealthState::Up, HealthState::Degraded] {
        let count = group.instances.iter().filter(|i| eligible(i, target, exclude, state)).count();
        if count == 0 {
            continue;
        }
        let n = group.cursor.fetch_add(1, Ordering::Relaxed) % count;
        if let Some(inst) = group.instances.iter().filter(|i| eligible(i, target, exclude, state)).nth(n) {
            return Ok(inst.clone());
        }
    }
    let skipped = explain(table, target, exclude, 0).skipped;
    let why = if skipped.is_empty() {
        "no instances".to_string()
    } else {
        skipped.iter().map(|s| format!("{} {}", s.instance_id, s.reason)).collect::<Vec<_>>().join(", ")
    };
    Err(RouteError::NoHealthyInstance { target: target.to_string(), why, tried: exclude.to_vec() })
}

/// Where a call would go: candidates in the order they would be tried, and every other
/// instance of the target with the reason it was skipped.
#[derive(Debug, Default)]
pub struct Explanation {
    pub candidates: Vec<(Arc<Instance>, f64)>,
    pub skipped: Vec<Skip>,
}

/// Explains routing for `target` without moving the round-robin cursor. Candidate scores
/// are the position in the try order (lower is better). `max` of 0 means no limit.
pub fn explain(table: &RoutingTable, target: &Target, exclude: &[String], max: usize) -> Explanation {
    let mut out = Explanation::default();
    let Ok(group) = resolve(table, target) else { return out };
    let mut up = Vec::new();
    let mut degraded = Vec::new();
    for inst in &group.instances {
        let skip = |reason: &str, detail: String| Skip {
            instance_id: inst.id().to_string(),
            agent: inst.agent().to_string(),
            reason: reason.to_string(),
            detail,
        };
        if exclude.iter().any(|e| e == inst.id()) {
            out.skipped.push(skip("ALREADY_TRIED", "this call already failed on it".into()));
        } else if !capability_tags_ok(inst, target) {
            let have: Vec<&str> =
                inst.record.registration.capabilities.iter().flat_map(|c| c.tags.iter().map(String::as_str)).collect();
            out.skipped
                .push(skip("MISSING_TAGS", format!("requires [{}], has [{}]", target.tags.join(","), have.join(","))));
        } else {
            match inst.record.state {
                HealthState::Up => up.push(inst.clone()),
                HealthState::Degraded => degraded.push(inst.clone()),
                s => out.skipped.push(skip(&format!("STATE_{s}"), format!("instance is {s}"))),
            }
        }
    }
    // Rotate each list to where the round-robin cursor points, so the first candidate is
    // the one the next call would get.
    let cursor = group.cursor.load(Ordering::Relaxed);
    for list in [&mut up, &mut degraded] {
        if !list.is_empty() {
            let len = list.len();
            list.rotate_left(cursor % len);
        }
    }
    for (pos, inst) in up.into_iter().chain(degraded).enumerate() {
        if max == 0 || out.candidates.len() < max {
            out.candidates.push((inst, pos as f64));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use agent_reach::model::{Capability, InstanceRecord, Registration};

    use super::*;

    fn inst(id: &str, agent: &str, cap: &str, tags: &[&str], state: HealthState) -> Instance {
        Instance {
            record: InstanceRecord {
                instance_id: id.into(),
                tenant: "default".into(),
                registration: Registration {
                    agent: agent.into(),
                    capabilities: vec![Capability {
                        name: cap.into(),
                        tags: tags.iter().map(|t| t.to_string()).collect(),
                    }],
                    endpoint: "http://127.0.0.1:1".into(),
                    ..Default::default()
                },
                sidecar_id: "s".into(),
                sidecar_address: "127.0.0.1:2".into(),
                state,
                load: Default::default(),
                registered_at_ms: 0,
            },
            revision: 1,
        }
    }

    fn table(list: Vec<Instance>) -> RoutingTable {
        let map: HashMap<String, Arc<Instance>> =
            list.into_iter().map(|i| (i.record.instance_id.clone(), Arc::new(i))).collect();
        RoutingTable::build(7, map, HashMap::new())
    }

    #[test]
    fn round_robin_is_exact_and_respects_tags() {
        let t = table(vec![
            inst("a", "sum", "text.summarize", &["en"], HealthState::Up),
            inst("b", "sum", "text.summarize", &["en", "zh"], HealthState::Up),
            inst("c", "sum", "text.summarize", &["zh"], HealthState::Up),
        ]);
        let target = Target::capability("text.summarize");
        let picks: Vec<String> = (0..6).map(|_| pick(&t, &target, &[]).unwrap().id().to_string()).collect();
        assert_eq!(picks, ["a", "b", "c", "a", "b", "c"]);

        let zh = Target { tags: vec!["zh".into()], ..target.clone() };
        let mut seen: Vec<String> = (0..4).map(|_| pick(&t, &zh, &[]).unwrap().id().to_string()).collect();
        seen.sort();
        assert_eq!(seen, ["b", "b", "c", "c"]);

        let both = Target { tags: vec!["en".into(), "zh".into()], ..target };
        assert_eq!(pick(&t, &both, &[]).unwrap().id(), "b");
    }

    #[test]
    fn unhealthy_and_excluded_instances_are_skipped() {
        let t = table(vec![
            inst("a", "sum", "x", &[], HealthState::Down),
            inst("b", "sum", "x", &[], HealthState::Degraded),
            inst("c", "sum", "x", &[], HealthState::Up),
        ]);
        let target = Target::capability("x");
        for _ in 0..3 {
            assert_eq!(pick(&t, &target, &[]).unwrap().id(), "c");
        }
        // Only when no UP instance is left does DEGRADED serve.
        assert_eq!(pick(&t, &target, &["c".into()]).unwrap().id(), "b");
        let err = pick(&t, &target, &["b".into(), "c".into()]).unwrap_err();
        match err {
            RouteError::NoHealthyInstance { why, tried, .. } => {
                assert_eq!(tried, ["b", "c"]);
                assert!(why.contains("a STATE_DOWN"), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let e = explain(&t, &target, &[], 0);
        assert_eq!(e.candidates.iter().map(|(i, _)| i.id()).collect::<Vec<_>>(), ["c", "b"]);
        assert_eq!(e.skipped.len(), 1);
        assert_eq!((e.skipped[0].instance_id.as_str(), e.skipped[0].reason.as_str()), ("a", "STATE_DOWN"));
    }

    #[test]
    fn unknown_targets_get_suggestions() {
        let t = table(vec![
            inst("a", "summarizer", "text.summarize", &[], HealthState::Up),
            inst("b", "translator", "text.translate", &[], HealthState::Up),
        ]);
        match pick(&t, &Target::capability("text.summarise"), &[]).unwrap_err() {
            RouteError::NotFound { suggestions, .. } => assert_eq!(suggestions[0], "text.summarize"),
            other => panic!("unexpected {other:?}"),
        }
        match pick(&t, &Target::agent("translater"), &[]).unwrap_err() {
            RouteError::NotFound { suggestions, .. } => assert_eq!(suggestions, ["translator"]),
            other => panic!("unexpected {other:?}"),
        }
        match pick(&t, &Target::capability("image.render"), &[]).unwrap_err() {
            RouteError::NotFound { suggestions, .. } => assert!(suggestions.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn explain_names_missing_tags_and_follows_the_cursor() {
        let t = table(vec![
            inst("a", "sum", "x", &["en"], HealthState::Up),
            inst("b", "sum", "x", &["zh"], HealthState::Up),
            inst("c", "sum", "x", &["zh"], HealthState::Up),
        ]);
        let zh = Target { tags: vec!["zh".into()], ..Target::capability("x") };
        let e = explain(&t, &zh, &[], 5);
        assert_eq!(e.skipped[0].reason, "MISSING_TAGS");
        assert_eq!(e.skipped[0].detail, "requires [zh], has [en]");
        let first = e.candidates[0].0.id().to_string();
        assert_eq!(pick(&t, &zh, &[]).unwrap().id(), first);
    }
}
