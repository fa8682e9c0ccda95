//! Policies at work through real sidecars: strategies, retries and their budget, fallbacks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agent_reach::policy::{CircuitBreaker, Fallback, PolicySpec, RetryPolicy, Strategy};
use agent_reach::{Agent, HandlerError, Reply, RunningAgent};
use agent_reach_e2e::{capability_policy, echo_agent, wait_for_instances};
use agent_reach_sidecar::Sidecar;

use crate::two_sidecars::Mesh;
use tonic::Code;

/// An agent on `sidecar` whose every call fails with UNAVAILABLE.
async fn failing_agent(sidecar: &Sidecar, capability: &str) -> RunningAgent {
    Agent::builder("flaky")
        .sidecar(sidecar.local_addr().to_string())
        .handle(capability, |call| async move {
            Err::<Reply, _>(HandlerError::unavailable(format!("{} is failing", call.instance_id())))
        })
        .start()
        .await
        .unwrap()
}

fn metadata<'a>(err: &'a agent_reach::InvokeError, key: &str) -> &'a str {
    err.status().metadata().get(key).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

fn handled(agents: &[RunningAgent]) -> u64 {
    agents.iter().map(RunningAgent::handled).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_may_have_run_is_retried_only_when_idempotent() {
    let mesh = Mesh::start().await;
    let agents = vec![
        failing_agent(&mesh.b, "work").await,
        failing_agent(&mesh.b, "work").await,
        failing_agent(&mesh.b, "work").await,
    ];
    let ids: Vec<String> = agents.iter().map(RunningAgent::instance_id).collect();
    wait_for_instances(&mesh.a, &ids).await;
    let client = mesh.client().await;

    // Not idempotent: one attempt, the agent's own error.
    let err = client.invoke("work").text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().ends_with("is failing"), "{err}");
    assert_eq!(metadata(&err, "ar-attempts"), "1");
    assert_eq!(handled(&agents), 1, "a non-idempotent call ran exactly once");

    // An idempotency key makes it safe: three attempts, three different instances.
    let err = client.invoke("work").idempotency_key("k-1").text("x").send().await.unwrap_err();
    assert_eq!(metadata(&err, "ar-attempts"), "3");
    let tried: Vec<&str> = metadata(&err, "ar-instances-tried").split(',').collect();
    assert_eq!(tried.len(), 3);
    assert_eq!(tried.iter().collect::<BTreeSet<_>>().len(), 3, "a retry never lands on an instance already tried");
    assert_eq!(handled(&agents), 4);

    // So does a policy marking the capability idempotent.
    mesh.policy(capability_policy(
        "work",
        PolicySpec { retry: Some(RetryPolicy { idempotent: true, ..Default::default() }), ..Default::default() },
    ))
    .await;
    let err = client.invoke("work").text("x").send().await.unwrap_err();
    assert_eq!(metadata(&err, "ar-attempts"), "3");
    assert_eq!(handled(&agents), 7);
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_lands_on_a_healthy_instance() {
    let mesh = Mesh::start().await;
    let bad = failing_agent(&mesh.b, "work").await;
    let good = echo_agent(mesh.b.local_addr(), "steady", &[("work", &[])]).await;
    wait_for_instances(&mesh.a, &[bad.instance_id(), good.instance_id()]).await;
    mesh.policy(capability_policy(
        "work",
        PolicySpec {
            strategy: Some(Strategy::RoundRobin),
            retry: Some(RetryPolicy { idempotent: true, ..Default::default() }),
            ..Default::default()
        },
    ))
    .await;
    let client = mesh.client().await;
    let mut retried = 0;
    for i in 0..10 {
        let reply = client.invoke("work").text(format!("{i}")).send().await.unwrap();
        assert_eq!(reply.instance(), good.instance_id());
        if reply.attempts() == 2 {
            retried += 1;
        }
    }
    assert_eq!(retried as u64, bad.handled(), "every call that hit the failing instance was retried once");
    assert!(retried >= 1);
    mesh.stop(vec![bad, good]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_caps_attempts_when_everything_fails() {
    let mesh = Mesh::start().await;
    let agents = vec![
        failing_agent(&mesh.b, "work").await,
        failing_agent(&mesh.b, "work").await,
        failing_agent(&mesh.b, "work").await,
    ];
    let ids: Vec<String> = agents.iter().map(RunningAgent::instance_id).collect();
    wait_for_instances(&mesh.a, &ids).await;
    // Retries: ⌊0.001 × calls⌋ + 1 per second over 10 s = 10 for 50 calls.
    let retry = RetryPolicy { idempotent: true, budget_ratio: 0.001, budget_min_per_second: 1, max_payload_bytes: 0 };
    // Breakers that never open, so every call reaches the instances and only the budget
    // limits retries.
    let breaker = CircuitBreaker { consecutive_failures: 100_000, min_requests: 100_000, ..Default::default() };
    mesh.policy(capability_policy(
        "work",
        PolicySpec { retry: Some(retry), breaker: Some(breaker), ..Default::default() },
    ))
    .await;
    let client = mesh.client().await;
    for i in 0..50 {
        let err = client.invoke("work").text(format!("{i}")).send().await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
    }
    assert_eq!(handled(&agents), 60, "50 calls and exactly the 10 retries the budget allows");
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_serves_what_the_target_cannot_and_says_so() {
    let mesh = Mesh::start().await;
    let backup = echo_agent(mesh.b.local_addr(), "backup", &[("text.summarize.cheap", &[])]).await;
    wait_for_instances(&mesh.a, &[backup.instance_id()]).await;
    let client = mesh.client().await;
    let err = client.invoke("text.summarize").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"), "without a policy there is no fallback");

    mesh.policy(capability_policy(
        "text.summarize",
        PolicySpec { fallback: Some(Fallback::Capability("text.summarize.cheap".into())), ..Default::default() },
    ))
    .await;
    let reply = client.invoke("text.summarize").text("long text").send().await.unwrap();
    assert_eq!(reply.instance(), backup.instance_id());
    assert_eq!(reply.fallback_from(), Some("capability text.summarize"));
    assert_eq!(reply.text(), format!("backup@{}:long text", backup.instance_id()));
    // ar-route names the target that served the call: the fallback, not the original.
    assert_eq!(
        reply.route(),
        format!("least_loaded capability text.summarize.cheap -> {} (attempt 1)", backup.instance_id())
    );

    // A failing primary also falls back, once its instances cannot take the call.
    let bad = failing_agent(&mesh.b, "text.summarize").await;
    wait_for_instances(&mesh.a, &[backup.instance_id(), bad.instance_id()]).await;
    let err = client.invoke("text.summarize").text("x").send().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "an answer from the agent is not a reason to fall back");
    mesh.stop(vec![backup, bad]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_sends_less_to_a_slow_instance() {
    let mesh = Mesh::start().await;
    let fast = echo_agent(mesh.b.local_addr(), "fast", &[("work", &[])]).await;
    let slow = Agent::builder("slow")
        .sidecar(mesh.b.local_addr().to_string())
        .handle("work", |_call| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok(Reply::text("slow"))
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&mesh.a, &[fast.instance_id(), slow.instance_id()]).await;
    let client = mesh.client().await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                client.invoke("work").text(format!("{w}-{i}")).send().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (f, s) = (fast.handled(), slow.handled());
    assert_eq!(f + s, 320);
    assert!(
        s * 4 < f + s,
        "the slow instance took {s} of {} calls; least_loaded should give it well under 25 %",
        f + s
    );
    mesh.stop(vec![fast, slow]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_keeps_sessions_and_random_spreads() {
    let mesh = Mesh::start().await;
    let agents = vec![
        echo_agent(mesh.b.local_addr(), "w", &[("work", &[])]).await,
        echo_agent(mesh.b.local_addr(), "w", &[("work", &[])]).await,
        echo_agent(mesh.b.local_addr(), "w", &[("work", &[])]).await,
    ];
    let ids: Vec<String> = agents.iter().map(RunningAgent::instance_id).collect();
    wait_for_instances(&mesh.a, &ids).await;
    let client = mesh.client().await;

    mesh.policy(capability_policy(
        "work",
        PolicySpec { strategy: Some(Strategy::ConsistentHash), ..Default::default() },
    ))
    .await;
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in 0..30 {
        for _ in 0..4 {
            let reply = client.invoke("work").session(format!("session-{s}")).text("x").send().await.unwrap();
            owners.entry(format!("session-{s}")).or_default().insert(reply.instance().to_string());
        }
    }
    assert!(owners.values().all(|o| o.len() == 1), "every session stuck to one instance: {owners:?}");
    let used: BTreeSet<&String> = owners.values().flatten().collect();
    assert!(used.len() >= 2, "30 sessions landed on {} instance(s)", used.len());

    mesh.policy(capability_policy("work", PolicySpec { strategy: Some(Strategy::Random), ..Default::default() })).await;
    let before: Vec<u64> = agents.iter().map(RunningAgent::handled).collect();
    for i in 0..300 {
        client.invoke("work").text(format!("{i}")).send().await.unwrap();
    }
    for (agent, b) in agents.iter().zip(before) {
        let got = agent.handled() - b;
        assert!((60..=140).contains(&got), "random gave one of 3 instances {got} of 300 calls");
    }
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_default_timeout_applies_when_the_caller_sets_none() {
    let mesh = Mesh::start().await;
    let slow = Agent::builder("slow")
        .sidecar(mesh.b.local_addr().to_string())
        .handle("slow", |_call| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(Reply::text("late"))
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&mesh.a, &[slow.instance_id()]).await;
    mesh.policy(capability_policy("slow", PolicySpec { default_timeout_ms: Some(300), ..Default::default() })).await;
    let client = mesh.client().await;
    let t0 = std::time::Instant::now();
    let err = client.invoke("slow").text("x").send().await.unwrap_err();
    let took = t0.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(450), "took {took:?}");
    // The caller's own deadline wins over the policy's default.
    let t0 = std::time::Instant::now();
    let err = client.invoke("slow").text("x").timeout(Duration::from_millis(100)).send().await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(t0.elapsed() < Duration::from_millis(250));
    mesh.stop(vec![slow]).await;
}
