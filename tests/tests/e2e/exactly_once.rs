//! Exactly once across instances, on a real etcd: two instances of one agent behind two
//! sidecars, clients on both sidecars sending duplicates of one idempotency key. The key is
//! claimed with control (in etcd) before any delivery, so one call runs and every duplicate,
//! wherever it lands, gets its reply; a sidecar that never saw the key replays it from the
//! store; a call cut off by its deadline is never run again; with control gone, keyed calls
//! are refused (CONTROL_UNAVAILABLE) rather than run without a claim. Duplicates go to the
//! instance that owns the claim, still run once when its sidecar is killed and restarted,
//! and a different payload under the key is refused (IDEMPOTENCY_KEY_REUSED).

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

/// A sidecar started again with `config` on `local` (the address its agents reconnect to),
/// on a new mesh port.
async fn restart_on(config: agent_reach_sidecar::SidecarConfig, local: std::net::SocketAddr) -> Sidecar {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(local).await {
            Ok(l) => {
                let config = agent_reach_e2e::secure::sidecar_identity(config).await;
                return Sidecar::start(config, l, agent_reach_e2e::listener().await).await.expect("sidecar start");
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("rebinding {local}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {local} again: {e}"),
        }
    }
}

/// `n` clients × `each` sends of `key` with `payload` through `client`, all at once; every
/// reply (text, serving instance).
async fn send_all(client: &Client, key: &str, payload: &str, n: usize, each: usize) -> Vec<(String, String)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, key, payload) = (client.clone(), key.to_string(), payload.to_string());
            tokio::spawn(async move {
                let mut replies = Vec::new();
                for _ in 0..each {
                    let r = c.invoke("charge").idempotency_key(key.clone()).text(payload.clone()).send().await;
                    let r = r.unwrap_or_else(|e| panic!("duplicate of {key}: {e}"));
                    replies.push((r.text().to_string(), r.instance().to_string()));
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

/// Exactly once through the death and restart of the owning sidecar: 2 instances on 2
/// sidecars, 10 clients × 20 duplicates meeting a 300 ms first call; then, with every
/// caller's sidecar knowing the owner, 200 more duplicates all reach the owning instance;
/// the owning sidecar is killed (no drain, no deregistration) and started again with the
/// same identity and address between duplicates; a different payload under the key is
/// refused with IDEMPOTENCY_KEY_REUSED through both sidecars.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_through_a_restarted_owner_and_a_reused_key_refused() {
    agent_reach_e2e::init_logging();
    let store = agent_reach_e2e::TestStore::start(Backend::Etcd).await;
    let control = agent_reach_e2e::start_control(store.store.clone(), Duration::from_secs(15)).await;
    let configs = [sidecar_config(&control.endpoint(), "host-a"), sidecar_config(&control.endpoint(), "host-b")];
    let a = start_sidecar(configs[0].clone()).await;
    let b = start_sidecar(configs[1].clone()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let one = payments(&a, runs.clone()).await;
    let two = payments(&b, runs.clone()).await;
    let ids = [one.instance_id(), two.instance_id()];
    wait_for_instances(&a, &ids).await;
    wait_for_instances(&b, &ids).await;
    let clients = [
        Client::connect(&a.local_addr().to_string()).await.unwrap(),
        Client::connect(&b.local_addr().to_string()).await.unwrap(),
    ];
    let key = "order-77";

    // The first call and 200 duplicates sent while it runs (300 ms): one execution.
    let started = tokio::time::Instant::now();
    let first = {
        let c = clients[0].clone();
        tokio::spawn(async move { c.invoke("charge").idempotency_key(key).text("10 EUR").send().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (on_a, on_b) =
        tokio::join!(send_all(&clients[0], key, "10 EUR", 5, 20), send_all(&clients[1], key, "10 EUR", 5, 20));
    let first = first.await.unwrap();
    let reply = first.text().to_string();
    let owner = first.instance().to_string();
    assert!(reply.starts_with("charge #1 of 10 EUR by "), "{reply}");
    assert!(reply.ends_with(&owner), "the first call ran on the instance that answered it: {reply}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution for 201 sends");
    assert!(on_a.iter().chain(&on_b).all(|(text, _)| *text == reply), "identical replies");
    let met = started.elapsed();

    // Every caller's sidecar has learnt the owner from a reply: 200 more duplicates, all
    // delivered to the owning instance, whatever the strategy would pick.
    let started = tokio::time::Instant::now();
    let (on_a, on_b) =
        tokio::join!(send_all(&clients[0], key, "10 EUR", 5, 20), send_all(&clients[1], key, "10 EUR", 5, 20));
    let to_owner = started.elapsed();
    let mut per_instance = std::collections::BTreeMap::<String, usize>::new();
    for (text, instance) in on_a.iter().chain(&on_b) {
        assert_eq!(*text, reply);
        *per_instance.entry(instance.clone()).or_default() += 1;
    }
    assert_eq!(per_instance, [(owner.clone(), 200)].into(), "every duplicate reached the owner");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    eprintln!("first call + 200 duplicates meeting it: {met:?}; 200 duplicates all to the owner: {to_owner:?}");

    // Kill the owning sidecar (no drain, no deregistration: its instance stays in the
    // tables until its lease ends) and send duplicates through the other one.
    let owner_on_a = owner == one.instance_id();
    let [config_a, config_b] = configs;
    let (owning, other, owning_agent, other_agent, owning_config) =
        if owner_on_a { (a, b, one, two, config_a) } else { (b, a, two, one, config_b) };
    let owning_local = owning.local_addr();
    let other_client = Client::connect(&other.local_addr().to_string()).await.unwrap();
    owning.stop().await;
    let started = tokio::time::Instant::now();
    let during = send_all(&other_client, key, "10 EUR", 5, 4).await;
    eprintln!("20 duplicates with the owner's sidecar down: {:?}", started.elapsed());
    assert!(during.iter().all(|(text, _)| *text == reply), "the stored reply while the owner's sidecar is down");
    assert!(during.iter().all(|(_, i)| *i == other_agent.instance_id()), "answered through the live instance");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again with the owner's sidecar gone");

    // Started again: same identity, same address; its agent registers again there.
    let restarted = restart_on(owning_config, owning_local).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while restarted.local_instances() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the owner's agent registers again at the restarted sidecar");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back = owning_agent.instance_id();
    // The killed sidecar's instance goes when its lease ends, 15 s after its last renewal:
    // waited for with room for etcd's expiry and the watch on a busy machine (the full
    // suite once took more than the 15 s since the restart).
    let ids = [back.clone(), other_agent.instance_id()];
    agent_reach_e2e::wait_for_instances_within(&restarted, &ids, Duration::from_secs(40)).await;
    wait_for_instances(&other, &ids).await;
    let restarted_client = Client::connect(&restarted.local_addr().to_string()).await.unwrap();
    let after = send_all(&restarted_client, key, "10 EUR", 5, 4).await;
    let again = send_all(&other_client, key, "10 EUR", 5, 4).await;
    assert!(after.iter().chain(&again).all(|(text, _)| *text == reply), "identical replies after the restart");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "still one execution after the owner's sidecar restarted");
    eprintln!(
        "restarted owner: {} replays from control at the restarted sidecar, {} at the other; instances served \
         after the restart: {:?}",
        restarted.claim_stats().replayed.load(Ordering::Relaxed),
        other.claim_stats().replayed.load(Ordering::Relaxed),
        after.iter().chain(&again).map(|(_, i)| i.as_str()).collect::<std::collections::BTreeSet<_>>()
    );

    // Another payload under the same key: refused, not run, through either sidecar.
    for (client, through) in [(&restarted_client, "the restarted owner's sidecar"), (&other_client, "the other")] {
        for payload in ["99 EUR", "10 EUR "] {
            let e = client.invoke("charge").idempotency_key(key).text(payload).send().await.unwrap_err();
            assert_eq!(e.reason(), Some("IDEMPOTENCY_KEY_REUSED"), "{through}: {e}");
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{through}: {e}");
            assert_eq!(e.detail("key_prefix"), Some(key), "{through}: {e}");
            assert!(e.message().contains("order-77… was first used for a call with another payload"), "{e}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a reused key never runs");
    // The original payload still replays.
    let still = other_client.invoke("charge").idempotency_key(key).text("10 EUR").send().await.unwrap();
    assert_eq!(still.text(), reply);

    owning_agent.abort();
    other_agent.abort();
    restarted.stop().await;
    other.stop().await;
    control.shutdown().await;
    drop(store);
}
