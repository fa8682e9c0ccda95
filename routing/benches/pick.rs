//! The pick on the call path, with 10,000 instances in the table: criterion timings per
//! strategy, then a p50/p99/p99.9 report of single picks (each timed on its own) against the
//! 1 µs p99 budget, the tenant's sidecar count (first ask, later asks) and a pinned
//! instance's lookup.
//! Run: `cargo bench -p agent-reach-routing --bench pick`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use agent_reach::model::{HealthState, Priority, Target, fixture};
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, Strategy};
use agent_reach_routing::{PickRequest, RoutingTable, clock, pick};
use criterion::Criterion;

const INSTANCES: usize = 10_000;

/// 10,000 instances: capability "big" on all of them (tags en/zh alternating, 2 % DOWN),
/// plus 100 capabilities of 100 instances each.
fn table(strategy: Strategy) -> RoutingTable {
    let mut map = HashMap::new();
    for i in 0..INSTANCES {
        let id = format!("agent-{i:05}");
        let lang = if i % 2 == 0 { "en" } else { "zh" };
        let inst = fixture::instance(&id)
            .agent(&format!("agent-{}", i % 100))
            .version(if i % 10 == 0 { "2.0" } else { "1.0" })
            .capability("big", &[lang])
            .capability(&format!("cap-{}", i % 100), &[])
            .sidecar(&format!("sidecar-{}", i % 100), "127.0.0.1:2")
            .state(if i % 50 == 7 { HealthState::Down } else { HealthState::Up })
            .build();
        map.insert(id, Arc::new(inst));
    }
    let mut policies = agent_reach_routing::table::Policies::default();
    let mut weights = std::collections::BTreeMap::new();
    if strategy == Strategy::Weighted {
        weights.insert("1.0".to_string(), 9);
        weights.insert("2.0".to_string(), 1);
    }
    for cap in ["big".to_string()].into_iter().chain((0..100).map(|i| format!("cap-{i}"))) {
        let spec = PolicySpec { strategy: Some(strategy), weights: weights.clone(), ..Default::default() };
        let p = Policy {
            tenant: "default".into(),
            kind: PolicyKind::Capability,
            name: cap.clone(),
            spec,
            description: String::new(),
        };
        policies.insert((PolicyKind::Capability, cap), Arc::new(p));
    }
    let t = RoutingTable::build(1, map, policies, None);
    // Give least_loaded something to compare.
    let now = clock();
    for (n, m) in t.instances.values().enumerate() {
        m.stats.observe(std::time::Duration::from_micros(100 + (n % 900) as u64), now);
    }
    t
}

const STRATEGIES: [Strategy; 5] =
    [Strategy::LeastLoaded, Strategy::RoundRobin, Strategy::Random, Strategy::Weighted, Strategy::ConsistentHash];

fn percentiles(strategy: Strategy, target: &Target, label: &str) {
    let t = table(strategy);
    let sessions: Vec<String> = (0..1024).map(|i| format!("session-{i}")).collect();
    let mut samples = Vec::with_capacity(200_000);
    for i in 0..200_000 {
        let req = PickRequest {
            target,
            priority: Priority::Normal,
            hash_key: Some(&sessions[i % sessions.len()]),
            exclude: &[],
            version: None,
            now: clock(),
            prefer: None,
        };
        let start = Instant::now();
        let picked = pick(&t, &req);
        let elapsed = start.elapsed();
        black_box(picked.is_ok());
        samples.push(elapsed.as_nanos() as u64);
    }
    samples.sort_unstable();
    let q = |p: f64| samples[((samples.len() as f64) * p) as usize];
    let p99 = q(0.99);
    println!(
        "{:<16} {:<24} p50 {:>5} ns  p99 {:>5} ns  p99.9 {:>6} ns  {}",
        strategy.as_str(),
        label,
        q(0.50),
        p99,
        q(0.999),
        if p99 <= 1000 { "within the 1 µs p99 budget" } else { "OVER the 1 µs p99 budget" }
    );
}

fn main() {
    println!("pick with {INSTANCES} instances in the table (single picks, timed one by one)");
    let all = Target::capability("big");
    let tagged = Target { tags: vec!["zh".into()], ..Target::capability("big") };
    let small = Target::capability("cap-42");
    for s in STRATEGIES {
        percentiles(s, &all, "10,000-instance group");
        percentiles(s, &tagged, "same, tag zh (half match)");
        percentiles(s, &small, "100-instance group");
    }

    // A tenant-wide rate limit is shared among the tenant's sidecars: counted once per table
    // (every call of such a tenant asks; counting on each call was O(instances)).
    let t = table(Strategy::RoundRobin);
    let start = Instant::now();
    let sidecars = black_box(&t).sidecar_count();
    let first = start.elapsed();
    const ASKS: u32 = 1_000_000;
    let start = Instant::now();
    for _ in 0..ASKS {
        black_box(black_box(&t).sidecar_count());
    }
    let later = start.elapsed() / ASKS;
    println!(
        "sidecar count ({sidecars} sidecars): first ask {:.1} µs (counted), later asks {} ns each",
        first.as_secs_f64() * 1e6,
        later.as_nanos()
    );

    // A call pinned to one instance (an A2A call for a task that instance owns) finds it in the
    // group by id: by halving, against the walk it replaced, over every id of the group.
    let group = &t.by_capability["big"];
    let ids: Vec<&str> = group.members.iter().map(|m| m.id()).collect();
    let time = |find: &dyn Fn(&str) -> bool| {
        let start = Instant::now();
        for id in &ids {
            assert!(find(black_box(id)));
        }
        start.elapsed().as_nanos() / ids.len() as u128
    };
    let halving = time(&|id| group.member(id).is_some());
    let walk = time(&|id| group.members.iter().any(|m| m.id() == id));
    println!("pinned instance in the {}-instance group: {halving} ns by id (halving), {walk} ns by a walk", ids.len());

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("pick_10k");
    for s in STRATEGIES {
        let t = table(s);
        group.bench_function(s.as_str(), |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let key = i.to_string();
                let req = PickRequest {
                    target: &all,
                    priority: Priority::Normal,
                    hash_key: Some(&key),
                    exclude: &[],
                    version: None,
                    now: clock(),
                    prefer: None,
                };
                black_box(pick(&t, &req).is_ok())
            })
        });
    }
    group.finish();
    c.final_summary();
}
