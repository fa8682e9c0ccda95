//! Lifecycle under load: SIGKILL of an instance, graceful drains of agents and sidecars,
//! control and etcd going away, a sidecar restarted from its saved table, and streams with
//! back-pressure and cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_reach::policy::{PolicySpec, RetryPolicy, Strategy};
use agent_reach::{Agent, Client, Reply};
use agent_reach_e2e::{
    AgentProcess, Backend, TestStore, capability_policy, echo_agent, init_logging, listener, put_policy,
    sidecar_config, start_control, start_control_plaintext, start_sidecar, wait_for_instances,
};
use agent_reach_sidecar::Sidecar;
use futures_util::StreamExt;
use tonic::Code;

const TEST_AGENT: &str = env!("CARGO_BIN_EXE_test-agent");

/// Steady load on two capabilities while one of three instances is SIGKILLed: calls that
/// may be retried never fail; the others fail only when they were in flight on the dead
/// instance, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_one_instance_under_steady_load() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let mut agents: Vec<AgentProcess> = (0..3)
        .map(|_| AgentProcess::start(TEST_AGENT, b.local_addr(), "worker", &["work.safe", "work.once"], 5))
        .collect();
    let ids: Vec<String> = agents.iter().map(|p| p.instance_id.clone()).collect();
    wait_for_instances(&a, &ids).await;
    let idempotent = PolicySpec {
        strategy: Some(Strategy::RoundRobin),
        retry: Some(RetryPolicy { idempotent: true, ..Default::default() }),
        ..Default::default()
    };
    put_policy(&ts.store, &[&a, &b], capability_policy("work.safe", idempotent)).await;
    put_policy(
        &ts.store,
        &[&a, &b],
        capability_policy("work.once", PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() }),
    )
    .await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..6 {
        let (client, stop) = (client.clone(), stop.clone());
        let capability = if w % 2 == 0 { "work.safe" } else { "work.once" };
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client.invoke(capability).text("x").timeout(Duration::from_secs(5)).send().await {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(e),
                }
            }
            (capability, ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    agents[0].kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut safe_ok, mut once_ok, mut once_failed) = (0, 0, Vec::new());
    for w in workers {
        let (capability, ok, failed) = w.await.unwrap();
        if capability == "work.safe" {
            assert!(failed.is_empty(), "retryable calls failed: {failed:?}");
            safe_ok += ok;
        } else {
            once_ok += ok;
            once_failed.extend(failed);
        }
    }
    assert!(safe_ok > 100 && once_ok > 100, "too little load: {safe_ok} / {once_ok}");
    // A non-idempotent call can only fail if it was in flight on the killed instance: at
    // most one per worker on that capability, each with a reason naming the instance.
    assert!(once_failed.len() <= 3, "{} non-idempotent calls failed: {once_failed:?}", once_failed.len());
    for e in &once_failed {
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        assert!(e.message().contains(&ids[0]), "the error names the dead instance: {e}");
    }
    drop(agents);
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// Graceful shutdown of an agent and of a sidecar while calls are in flight: none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_loses_no_call() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let c = start_sidecar(sidecar_config(&control.endpoint(), "host-c")).await;
    let slow = |sidecar: &Sidecar| {
        Agent::builder("slow").sidecar(sidecar.local_addr().to_string()).handle("slow", |call| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(Reply::text(call.instance_id().to_string()))
        })
    };
    let leaving = slow(&b).start().await.unwrap();
    let staying = slow(&c).start().await.unwrap();
    wait_for_instances(&a, &[leaving.instance_id(), staying.instance_id()]).await;
    put_policy(
        &ts.store,
        &[&a, &b, &c],
        capability_policy("slow", PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() }),
    )
    .await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    // Warm A's connections to B and C (mutual TLS handshakes) so the calls below are in
    // flight on both agents within the 100 ms before the shutdown.
    for _ in 0..2 {
        client.invoke("slow").text("warm").send().await.unwrap();
    }

    // 1. The agent drains: 20 calls in flight (about half on it), then SIGTERM-like shutdown.
    let calls: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn({
                let c = client.clone();
                async move { c.invoke("slow").text("x").send().await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leaving_id = leaving.instance_id();
    let drained = tokio::spawn(leaving.shutdown());
    let mut served_by_leaving = 0;
    for call in calls {
        let reply = call.await.unwrap().expect("a call accepted before shutdown succeeds");
        if reply.instance() == leaving_id {
            served_by_leaving += 1;
        }
    }
    drained.await.unwrap();
    assert!(served_by_leaving > 0, "no call was in flight on the draining agent");
    wait_for_instances(&a, &[staying.instance_id()]).await;

    // 2. The sidecar drains: calls in flight through sidecar C finish before it stops.
    let calls: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn({
                let c = client.clone();
                async move { c.invoke("slow").text("x").send().await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(c.calls_in_flight() > 0);
    let t0 = Instant::now();
    c.shutdown().await;
    assert!(t0.elapsed() >= Duration::from_millis(100), "the sidecar waited for its calls");
    for call in calls {
        call.await.unwrap().expect("a call accepted before the sidecar's shutdown succeeds");
    }
    staying.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// Control and etcd both die for 60 s: calls to known agents keep succeeding, and a
/// sidecar restarted meanwhile routes from its saved table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_survives_control_and_etcd_outage_and_a_sidecar_restart() {
    init_logging();
    let mut ts = TestStore::start(Backend::Etcd).await;
    // Explicit plaintext: this test is about the saved table; the restart of a sidecar with
    // identity from its saved certificate is `offline_start.rs`.
    let control = start_control_plaintext(ts.store.clone(), Duration::from_secs(15)).await;
    let table_file = tempfile::tempdir().unwrap();
    let path = table_file.path().join("a.table.json");
    let mut config_a = sidecar_config(&control.endpoint(), "host-a");
    config_a.table_file = Some(path.clone());
    let a_local = listener().await;
    let a_addr = a_local.local_addr().unwrap();
    let a = Sidecar::start(config_a.clone(), a_local, listener().await).await.unwrap();
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    // The saver writes within about a second of a change.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    control.shutdown().await;
    ts.etcd.as_mut().unwrap().kill();
    let client = Client::connect(&a_addr.to_string()).await.unwrap();
    let t0 = Instant::now();
    let (mut ok, mut calls) = (0u64, 0u64);
    let mut restarted = false;
    let mut a = Some(a);
    while t0.elapsed() < Duration::from_secs(60) {
        if !restarted && t0.elapsed() > Duration::from_secs(20) {
            // Restart sidecar A on the same address while control is still down.
            a.take().unwrap().stop().await;
            let local = tokio::net::TcpListener::bind(a_addr).await.unwrap();
            a = Some(Sidecar::start(config_a.clone(), local, listener().await).await.unwrap());
            restarted = true;
            let route = client.route(agent_reach::model::Target::capability("echo"), 5).await.unwrap();
            assert!(route.table_stale, "a table loaded from disk is marked stale");
            assert!(route.table_age_ms >= 20_000, "its age counts from when it was saved: {}", route.table_age_ms);
        }
        calls += 1;
        match client.invoke("echo").text("x").send().await {
            Ok(reply) if reply.instance() == agent.instance_id() => ok += 1,
            other => panic!("call {calls} failed during the outage: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(restarted);
    assert_eq!(ok, calls, "100 % of calls to a known agent succeeded");
    assert!(calls > 400);
    agent.abort();
    a.unwrap().stop().await;
    b.stop().await;
}

/// A table file with an instance planted in it, then a corrupt one: the sidecar never
/// routes to anything from the file once control answers — the first snapshot replaces
/// the loaded table whole — and the next save writes a valid file again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_or_corrupt_table_file_is_never_routed_once_control_answers() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let state = tempfile::tempdir().unwrap();
    let path = state.path().join("a.table.json");
    let mut config_a = sidecar_config(&control.endpoint(), "host-a");
    config_a.table_file = Some(path.clone());
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    let a = start_sidecar(config_a.clone()).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    // The saver writes within about a second of a change.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.stop().await;

    // Plant an instance of the same capability, as a valid record at a revision the file
    // claims to have seen.
    let mut saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut planted = saved["instances"][0].clone();
    planted["record"]["instance_id"] = "planted-1".into();
    planted["record"]["sidecar_address"] = "127.0.0.1:9".into();
    saved["instances"].as_array_mut().unwrap().push(planted);
    std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();

    let agent_id = agent.instance_id();
    let check = |a: Sidecar| {
        let want = agent_id.clone();
        async move {
            // Once control answers, the table is exactly what control holds.
            wait_for_instances(&a, std::slice::from_ref(&want)).await;
            let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
            for i in 0..50 {
                let reply = client.invoke("echo").text(format!("{i}")).send().await.unwrap();
                assert_eq!(reply.instance(), want);
                let route = client.route(agent_reach::model::Target::capability("echo"), 5).await.unwrap();
                assert!(!route.table_stale);
                assert!(route.table_revision > 0);
                assert!(route.candidates.iter().all(|c| c.instance.as_ref().unwrap().instance_id != "planted-1"));
                assert!(route.skipped.iter().all(|s| s.instance_id != "planted-1"));
            }
            a
        }
    };
    let a = check(start_sidecar(config_a.clone()).await).await;
    assert!(!a.table().instances.contains_key("planted-1"));
    a.stop().await;

    // A corrupt file is refused: the sidecar routes from nothing until control answers,
    // then saves a valid table over it.
    std::fs::write(&path, b"{\"format\": 1, \"tenant\": \"default\", \"instances\": [{\"rec").unwrap();
    let a = check(start_sidecar(config_a.clone()).await).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rewritten: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let ids: Vec<&str> = rewritten["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["record"]["instance_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [agent.instance_id().as_str()]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    agent.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

/// A stream through two sidecars is paced by its reader, and a reader that goes away
/// stops the agent's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_have_back_pressure_and_cancellation() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let produced = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (p, d) = (produced.clone(), dropped.clone());
    let agent = Agent::builder("firehose")
        .sidecar(b.local_addr().to_string())
        .handle_stream("firehose", move |_call| {
            let (p, guard) = (p.clone(), OnDrop(d.clone()));
            futures_util::stream::unfold((0u64, guard), move |(n, guard)| {
                let p = p.clone();
                async move {
                    p.fetch_add(1, Ordering::SeqCst);
                    Some((Ok(Reply::bytes(vec![b'x'; 1024])), (n + 1, guard)))
                }
            })
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let mut stream = client.invoke("firehose").send_stream().await.unwrap();
    for _ in 0..10 {
        stream.next().await.unwrap().unwrap();
    }
    // The reader pauses: the producer must stall within the flow-control windows of the
    // three hops (each at most a few MiB), not run ahead without bound.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stalled_at = produced.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(produced.load(Ordering::SeqCst), stalled_at, "the producer kept going while nobody read");
    assert!(stalled_at < 30_000, "{stalled_at} chunks of 1 KiB buffered ahead of the reader");
    assert!(!dropped.load(Ordering::SeqCst));
    drop(stream);
    let t0 = Instant::now();
    while !dropped.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < Duration::from_secs(2), "the agent's stream was not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    agent.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
