//! Exactly once across instances, on a real etcd: two instances of one agent behind two
//! sidecars, clients on both sidecars sending duplicates of one idempotency key. The key is
//! claimed with control (in etcd) before any delivery, so one call runs and every duplicate,
//! wherever it lands, gets its reply; a sidecar that never saw the key replays it from the
//! store; a call cut off by its deadline is never run again; with control gone, keyed calls
//! are refused (CONTROL_UNAVAILABLE) rather than run without a claim.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agent_reach::policy::{PolicySpec, Strategy};
use agent_reach::{Agent, Client, Reply, RunningAgent};
use agent_reach_e2e::{Backend, capability_policy, sidecar_config, start_sidecar, wait_for_instances};
use agent_reach_sidecar::Sidecar;

use crate::two_sidecars::Mesh;

/// The handler's time: long enough for duplicates to meet the first call in flight.
const WORK: Duration = Duration::from_millis(300);

/// An instance of "payments" on `sidecar` counting its executions in `runs`.
async fn payments(sidecar: &Sidecar, runs: Arc<AtomicU32>) -> RunningAgent {
    Agent::builder("payments")
        .sidecar(sidecar.local_addr().to_string())
        .handle("charge", move |call| {
            let runs = runs.clone();
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(WORK).await;
                Ok(Reply::text(format!("charge #{n} of {} by {}", call.text()?, call.instance_id())))
            }
        })
        .start()
        .await
        .unwrap()
}

/// 10 clients (5 on each sidecar) × 20 sends of `key`; every reply.
async fn duplicates(clients: &[Client; 2], key: &str) -> Vec<String> {
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let c = clients[i % 2].clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let mut replies = Vec::new();
                for _ in 0..20 {
                    let r = c.invoke("charge").idempotency_key(key.clone()).text("10 EUR").send().await;
                    replies.push(r.map(|r| r.text().to_string()).unwrap_or_else(|e| panic!("duplicate of {key}: {e}")));
                }
                replies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// How many times a sidecar asked control about a key (claims won, replays, polls).
fn asked(s: &Sidecar) -> u64 {
    let c = s.claim_stats();
    c.claimed.load(Ordering::Relaxed) + c.replayed.load(Ordering::Relaxed) + c.polls.load(Ordering::Relaxed)
}

async fn one_execution_across_two_instances(strategy: Option<Strategy>) {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    let runs = Arc::new(AtomicU32::new(0));
    let one = payments(&mesh.a, runs.clone()).await;
    let two = payments(&mesh.b, runs.clone()).await;
    let ids = [one.instance_id(), two.instance_id()];
    wait_for_instances(&mesh.a, &ids).await;
    wait_for_instances(&mesh.b, &ids).await;
    if let Some(strategy) = strategy {
        mesh.policy(capability_policy("charge", PolicySpec { strategy: Some(strategy), ..Default::default() })).await;
    }
    let clients = [
        Client::connect(&mesh.a.local_addr().to_string()).await.unwrap(),
        Client::connect(&mesh.b.local_addr().to_string()).await.unwrap(),
    ];

    let started = tokio::time::Instant::now();
    let all = duplicates(&clients, "order-42").await;
    let took = started.elapsed();
    assert_eq!(all.len(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "200 duplicates on two instances, one execution: {:?}", &all[..3]);
    assert!(
        all.iter().all(|r| r == &all[0]),
        "identical replies: {:?}",
        all.iter().collect::<std::collections::BTreeSet<_>>()
    );
    let claimed =
        mesh.a.claim_stats().claimed.load(Ordering::Relaxed) + mesh.b.claim_stats().claimed.load(Ordering::Relaxed);
    assert_eq!(claimed, 1, "one claim won in all");
    let stat = |s: &Sidecar| (asked(s), s.claim_stats().replayed.load(Ordering::Relaxed));
    eprintln!(
        "{strategy:?}: 200 duplicates in {took:?}; target sidecars asked control (claims + replays + polls, replays): \
         a {:?}, b {:?}",
        stat(&mesh.a),
        stat(&mesh.b)
    );
    if strategy.is_none() {
        // Under the default strategy the duplicates reach both instances' sidecars.
        assert!(asked(&mesh.a) > 0 && asked(&mesh.b) > 0, "both target sidecars saw the key");
    }

    // Both sidecars that saw the key go away (their instances with them). A new sidecar that
    // never saw the key, with a new instance, replays the stored reply from etcd.
    let Mesh { a, b, control, .. } = mesh;
    // Deregistered (not left to their lease), so the new sidecar routes only its own.
    a.shutdown().await;
    b.shutdown().await;
    one.abort();
    two.abort();
    let c = start_sidecar(sidecar_config(&control.endpoint(), "host-c")).await;
    let three = payments(&c, runs.clone()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.table().len() != 1 {
        let routed: Vec<String> = c.table().instances.keys().cloned().collect();
        assert!(tokio::time::Instant::now() < deadline, "only the new instance should be routed: {routed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(asked(&c), 0);
    let c_client = Client::connect(&c.local_addr().to_string()).await.unwrap();
    let again = c_client.invoke("charge").idempotency_key("order-42").text("10 EUR").send().await.unwrap();
    assert_eq!(again.text(), all[0], "replayed from the store by a sidecar that never saw the key");
    assert_eq!(again.instance(), three.instance_id(), "answered through the new instance's sidecar");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "still one execution");
    assert_eq!(c.claim_stats().replayed.load(Ordering::Relaxed), 1);

    // Another key runs once on its own.
    let fresh = c_client.invoke("charge").idempotency_key("order-43").text("5 EUR").send().await.unwrap();
    assert!(fresh.text().starts_with("charge #2 of 5 EUR"), "{}", fresh.text());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A call cut off by its deadline may have run: a duplicate is refused, never run.
    let cut = c_client
        .invoke("charge")
        .idempotency_key("order-44")
        .timeout(Duration::from_millis(150))
        .text("7 EUR")
        .send()
        .await
        .unwrap_err();
    assert!(matches!(cut.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled), "{cut}");
    tokio::time::sleep(WORK).await;
    let runs_before = runs.load(Ordering::SeqCst);
    assert_eq!(runs_before, 3, "the cut call reached the agent");
    let refused = c_client.invoke("charge").idempotency_key("order-44").text("7 EUR").send().await.unwrap_err();
    assert_eq!(refused.reason(), Some("IDEMPOTENT_REPLY_NOT_STORED"), "{refused}");
    assert_eq!(runs.load(Ordering::SeqCst), runs_before, "a cut call is not run again");

    // Control gone: a keyed call is refused, not run without a claim; others still run.
    control.shutdown().await;
    let unclaimed = c_client.invoke("charge").idempotency_key("order-45").text("1 EUR").send().await.unwrap_err();
    // The only instance's sidecar refused it as not delivered; the caller's sidecar had no
    // other instance to try.
    assert_eq!(unclaimed.reason(), Some("NO_HEALTHY_INSTANCE"), "{unclaimed}");
    assert!(
        unclaimed.message().contains("cannot claim the idempotency key with control")
            && unclaimed.message().contains("the call is not run without a claim"),
        "{unclaimed}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), runs_before, "not run without a claim");
    c_client.invoke("charge").text("no key").send().await.expect("calls without a key need no claim");
    assert_eq!(runs.load(Ordering::SeqCst), runs_before + 1);
    three.abort();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_execution_across_two_instances_under_the_default_strategy() {
    one_execution_across_two_instances(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_execution_across_two_instances_under_consistent_hash() {
    one_execution_across_two_instances(Some(Strategy::ConsistentHash)).await;
}

/// The cost of a claim: p50 of 200 sequential calls with a fresh key each against 200
/// without a key, through one sidecar to its local instance, on etcd (printed; the
/// assertions are the execution counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cost_of_a_claim_per_keyed_call() {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    let agent = Agent::builder("fast")
        .sidecar(mesh.a.local_addr().to_string())
        .handle("fast", |call| async move { Ok(Reply::text(call.text()?.to_string())) })
        .start()
        .await
        .unwrap();
    wait_for_instances(&mesh.a, &[agent.instance_id()]).await;
    let client = Client::connect(&mesh.a.local_addr().to_string()).await.unwrap();
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    // Warm up connections and the window's lease.
    for i in 0..20 {
        client.invoke("fast").idempotency_key(format!("warm-{i}")).text("x").send().await.unwrap();
    }
    let (mut keyed, mut plain) = (Vec::new(), Vec::new());
    for i in 0..200 {
        let t = std::time::Instant::now();
        client.invoke("fast").text("x").send().await.unwrap();
        plain.push(t.elapsed());
        let t = std::time::Instant::now();
        client.invoke("fast").idempotency_key(format!("cost-{i}")).text("x").send().await.unwrap();
        keyed.push(t.elapsed());
    }
    // And 200 duplicates answered by this sidecar's memory (no claim needed).
    let mut replayed = Vec::new();
    for i in 0..200 {
        let t = std::time::Instant::now();
        client.invoke("fast").idempotency_key(format!("cost-{i}")).text("x").send().await.unwrap();
        replayed.push(t.elapsed());
    }
    assert_eq!(agent.handled(), 20 + 400, "every fresh key ran once, every duplicate was replayed");
    assert_eq!(mesh.a.claim_stats().claimed.load(Ordering::Relaxed), 220);
    let (k, p, r) = (p50(keyed), p50(plain), p50(replayed));
    eprintln!(
        "keyed call p50 {k:?}, unkeyed p50 {p:?}, added {:?}; duplicate replayed from memory p50 {r:?}",
        k.saturating_sub(p)
    );
    mesh.stop(vec![agent]).await;
}
