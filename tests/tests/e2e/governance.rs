//! Governance through real sidecars: rate limits, admission by priority, circuit breakers,
//! canary splits, idempotency and the result cache, all set by policies that reach every
//! sidecar through the watch stream (no restarts).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agent_reach::convert::policy_to_proto;
use agent_reach::policy::{Admission, CircuitBreaker, Policy, PolicyKind, PolicySpec, RateLimit, VersionSplit};
use agent_reach::reason::error_info;
use agent_reach::{Agent, HandlerError, Reply};
use agent_reach_e2e::{capability_policy, echo_agent, wait_for_instances};
use agent_reach_sidecar::Sidecar;

use crate::two_sidecars::Mesh;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_refuses_at_once_and_spares_other_callers() {
    let mesh = Mesh::start().await;
    let agent = echo_agent(mesh.b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&mesh.a, &[agent.instance_id()]).await;
    // Buckets are per verified caller: two registered agents, calling with their credentials.
    let planner_agent = echo_agent(mesh.a.local_addr(), "planner", &[("plan", &[])]).await;
    let auditor_agent = echo_agent(mesh.a.local_addr(), "auditor", &[("audit", &[])]).await;
    let (planner, auditor) = (planner_agent.client(), auditor_agent.client());
    // 1 call per second, burst 3: ten quick calls from one caller, three pass.
    let limit = PolicySpec { rate_limit: Some(RateLimit { per_second: 1.0, burst: 3 }), ..Default::default() };
    mesh.policy(capability_policy("echo", limit.clone())).await;
    let mut refused = 0;
    for _ in 0..10 {
        match planner.invoke("echo").text("x").send().await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                assert_eq!(e.reason(), Some("RATE_LIMITED"));
                assert_eq!(e.detail("policy"), Some("capability/echo"));
                assert_eq!(e.detail("bucket"), Some("planner→capability echo"));
                let wait: u64 = e.detail("retry_after_ms").unwrap().parse().unwrap();
                assert!(wait > 0 && wait <= 1000, "retry after {wait} ms");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 7);
    assert_eq!(agent.handled(), 3, "refused calls never reached the agent");
    // An invalid change is refused whole, naming the field; both sidecars keep the old policy.
    let old = capability_policy("echo", limit);
    let bad = PolicySpec { rate_limit: Some(RateLimit { per_second: 0.0, burst: 3 }), ..Default::default() };
    let refusal = mesh.put_policy(policy_to_proto(&capability_policy("echo", bad), 0)).await.expect("refused");
    assert_eq!(refusal.code(), Code::InvalidArgument);
    let info = error_info(&refusal).expect("error info");
    assert_eq!(info.metadata.get("field").map(String::as_str), Some("policy.spec.rate_limit.per_second"));
    for sc in [&mesh.a, &mesh.b] {
        assert_eq!(sc.table().policy(PolicyKind::Capability, "echo").map(|p| (**p).clone()), Some(old.clone()));
    }
    // Another caller has its own bucket.
    auditor.invoke("echo").text("x").send().await.unwrap();
    assert_eq!(agent.handled(), 4);
    // Raising the limit takes effect without restarting anything.
    let generous = PolicySpec { rate_limit: Some(RateLimit { per_second: 1000.0, burst: 100 }), ..Default::default() };
    mesh.policy(capability_policy("echo", generous)).await;
    for _ in 0..20 {
        planner.invoke("echo").text("x").send().await.unwrap();
    }
    mesh.stop(vec![agent, planner_agent, auditor_agent]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_caps_in_flight_and_sheds_the_excess_with_a_reason() {
    let mesh = Mesh::start().await;
    let running = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let (r, p) = (running.clone(), peak.clone());
    let agent = Agent::builder("busy")
        .sidecar(mesh.b.local_addr().to_string())
        .max_concurrency(2)
        .handle("busy", move |_call| {
            let (r, p) = (r.clone(), p.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(Reply::text("done"))
            }
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&mesh.a, &[agent.instance_id()]).await;
    let admission = Admission { queue_length: 2, queue_timeout_ms: 50, ..Default::default() };
    mesh.policy(Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "busy".into(),
        spec: PolicySpec { admission: Some(admission), ..Default::default() },
        description: String::new(),
    })
    .await;
    let client = mesh.client().await;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.invoke("busy").priority(agent_reach::Priority::High).text("x").send().await })
        })
        .collect();
    let (mut ok, mut shed) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
                assert_eq!(e.reason(), Some("AGENT_OVERLOADED"));
                assert_eq!(e.detail("policy"), Some("agent/busy"));
                shed += 1;
            }
        }
    }
    assert_eq!(ok, 2, "two slots, each call holding one for 200 ms; waiters give up after 50 ms");
    assert_eq!(shed, 6);
    assert_eq!(peak.load(Ordering::SeqCst), 2, "never more than max_concurrency in the agent");
    mesh.stop(vec![agent]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_breaker_takes_a_failing_instance_out() {
    let mesh = Mesh::start().await;
    let bad = Agent::builder("flaky")
        .sidecar(mesh.b.local_addr().to_string())
        .handle("work", |_call| async move { Err::<Reply, _>(HandlerError::unavailable("down for maintenance")) })
        .start()
        .await
        .unwrap();
    let good = echo_agent(mesh.b.local_addr(), "steady", &[("work", &[])]).await;
    wait_for_instances(&mesh.a, &[bad.instance_id(), good.instance_id()]).await;
    let breaker = CircuitBreaker { consecutive_failures: 3, open_ms: 60_000, ..Default::default() };
    mesh.policy(capability_policy(
        "work",
        PolicySpec {
            strategy: Some(agent_reach::policy::Strategy::RoundRobin),
            breaker: Some(breaker),
            ..Default::default()
        },
    ))
    .await;
    let client = mesh.client().await;
    let mut failures = 0;
    for i in 0..30 {
        if client.invoke("work").text(format!("{i}")).send().await.is_err() {
            failures += 1;
        }
    }
    assert_eq!(failures, 3, "the breaker opened after exactly 3 failures");
    assert_eq!(bad.handled(), 3);
    let route = client.route(agent_reach::model::Target::capability("work"), 5).await.unwrap();
    let skipped: Vec<(&str, &str)> =
        route.skipped.iter().map(|s| (s.instance_id.as_str(), s.reason.as_str())).collect();
    let bad_id = bad.instance_id();
    assert_eq!(skipped, [(bad_id.as_str(), "BREAKER_OPEN")]);
    mesh.stop(vec![bad, good]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_split_is_sticky_per_session_and_matches_metadata() {
    let mesh = Mesh::start().await;
    let version = |v: &'static str| {
        Agent::builder("ranker")
            .version(v)
            .sidecar(mesh.b.local_addr().to_string())
            .handle("rank", move |_call| async move { Ok(Reply::text(v)) })
    };
    let stable = version("1.0").start().await.unwrap();
    let canary = version("1.1").start().await.unwrap();
    wait_for_instances(&mesh.a, &[stable.instance_id(), canary.instance_id()]).await;
    let split = VersionSplit {
        weights: vec![("1.0".into(), 90), ("1.1".into(), 10)],
        match_key: "x-canary".into(),
        match_value: "true".into(),
        match_version: "1.1".into(),
    };
    mesh.policy(capability_policy("rank", PolicySpec { split: Some(split), ..Default::default() })).await;
    let client = mesh.client().await;
    let mut on_canary = 0;
    for s in 0..400 {
        let mut seen = BTreeSet::new();
        for _ in 0..3 {
            let reply = client.invoke("rank").session(format!("user-{s}")).text("q").send().await.unwrap();
            seen.insert(reply.text().to_string());
        }
        assert_eq!(seen.len(), 1, "session user-{s} flipped between versions: {seen:?}");
        if seen.contains("1.1") {
            on_canary += 1;
        }
    }
    assert!((20..=60).contains(&on_canary), "{on_canary} of 400 sessions on the 10 % canary");
    for _ in 0..10 {
        let reply = client.invoke("rank").metadata("x-canary", "true").text("q").send().await.unwrap();
        assert_eq!(reply.text(), "1.1");
    }
    mesh.stop(vec![stable, canary]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_runs_once_for_every_duplicate() {
    let mesh = Mesh::start().await;
    let runs = Arc::new(AtomicU32::new(0));
    let charge = |sidecar: &Sidecar, runs: Arc<AtomicU32>| {
        Agent::builder("payments").sidecar(sidecar.local_addr().to_string()).handle("charge", move |call| {
            let runs = runs.clone();
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
                Ok(Reply::text(format!("charge #{n} by {}", call.instance_id())))
            }
        })
    };
    let one = charge(&mesh.b, runs.clone()).start().await.unwrap();
    let two = charge(&mesh.b, runs.clone()).start().await.unwrap();
    wait_for_instances(&mesh.a, &[one.instance_id(), two.instance_id()]).await;
    let client = mesh.client().await;
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move {
                let mut replies = Vec::new();
                for _ in 0..20 {
                    let r = c.invoke("charge").idempotency_key("order-42").text("10 EUR").send().await.unwrap();
                    replies.push(r.text().to_string());
                }
                replies
            })
        })
        .collect();
    let mut all = Vec::new();
    for c in callers {
        all.extend(c.await.unwrap());
    }
    assert_eq!(all.len(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "200 duplicates, one execution");
    assert!(all.iter().all(|r| r == &all[0]), "identical replies");
    // Another key runs on its own.
    client.invoke("charge").idempotency_key("order-43").text("5 EUR").send().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    mesh.stop(vec![one, two]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_read_only_capabilities_are_cached() {
    let mesh = Mesh::start().await;
    let agent = Agent::builder("lookup")
        .sidecar(mesh.b.local_addr().to_string())
        .handle("weather", |call| async move { Ok(Reply::text(format!("sunny in {}", call.text()?))) })
        .handle("order", |call| async move { Ok(Reply::text(format!("ordered {}", call.text()?))) })
        .start()
        .await
        .unwrap();
    wait_for_instances(&mesh.a, &[agent.instance_id()]).await;
    mesh.policy(capability_policy(
        "weather",
        PolicySpec { read_only: true, cache_ttl_ms: 60_000, ..Default::default() },
    ))
    .await;
    let client = mesh.client().await;
    for _ in 0..5 {
        assert_eq!(client.invoke("weather").text("Paris").send().await.unwrap().text(), "sunny in Paris");
    }
    assert_eq!(agent.handled(), 1, "four of five identical read-only calls came from the cache");
    client.invoke("weather").text("Oslo").send().await.unwrap();
    assert_eq!(agent.handled(), 2, "a different payload is a different entry");
    for _ in 0..5 {
        client.invoke("order").text("pizza").send().await.unwrap();
    }
    assert_eq!(agent.handled(), 7, "a capability not marked read-only is never cached");
    mesh.stop(vec![agent]).await;
}
