//! Long outages: control unreachable for much longer than the lease TTL (cut by the
//! fault-injecting proxy between the sidecars and control, so etcd deletes every record
//! meanwhile), and etcd down while control stays up. Calls to known agents never fail,
//! during the outage or after it, and instances keep their ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent_reach::Client;
use agent_reach_control::keys;
use agent_reach_e2e::fault::FaultProxy;
use agent_reach_e2e::*;
use tokio::time::Instant;

/// Calls "echo" through `client` from `workers` loops, each pausing `pause` between calls,
/// until `stop`; counts successes and keeps the first failures.
struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `config` with the harness identity of its control, then pointed at `proxy` in front of
/// that control (TLS passes through the proxy untouched).
async fn through(config: agent_reach_sidecar::SidecarConfig, proxy: &FaultProxy) -> agent_reach_sidecar::SidecarConfig {
    let mut config = agent_reach_e2e::secure::sidecar_identity(config).await;
    config.control = vec![proxy.addr().to_string()];
    config
}

/// The load the outage tests offer, in calls per second: `AGENT_REACH_E2E_OUTAGE_RATE`, by
/// default 800 (16 workers pausing 20 ms). A debug build of this test process (client, both
/// sidecars over mTLS and the agents on two runtime threads) reaches 170-190 calls/s on a
/// 2-core machine, so there the load is as much as the machine gives; a release build
/// (`cargo test --release`) is run at 1,000 with the variable set to drive the rate.
fn outage_rate() -> f64 {
    std::env::var("AGENT_REACH_E2E_OUTAGE_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(800.0)
}

impl Load {
    /// The outage tests' load: at least 16 workers, one per 50 calls/s offered, each
    /// pausing so that together they offer [`outage_rate`].
    async fn offered(sidecar: std::net::SocketAddr) -> Load {
        let rate = outage_rate();
        let workers = ((rate / 50.0).ceil() as usize).max(16);
        Load::start(sidecar, workers, Duration::from_secs_f64(workers as f64 / rate)).await
    }

    async fn start(sidecar: std::net::SocketAddr, workers: usize, pause: Duration) -> Load {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for w in 0..workers {
            let client = Client::connect(&sidecar.to_string()).await.unwrap();
            let (ok, failed, failures, stop) = (ok.clone(), failed.clone(), failures.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match client.invoke("echo").text(format!("{w}-{i}")).timeout(Duration::from_secs(5)).send().await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            let mut f = failures.lock().unwrap();
                            if f.len() < 10 {
                                f.push(format!("{e:?}"));
                            }
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    tokio::time::sleep(pause).await;
                }
            }));
        }
        Load { ok, failed, failures, stop, tasks }
    }

    fn counts(&self) -> (u64, u64) {
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }

    async fn stop(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let (ok, failed) = (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        (ok, failed, self.failures.lock().unwrap().clone())
    }
}

/// A target sidecar for these tests: agents heartbeat every second, so an agent starved of
/// CPU for a few hundred milliseconds on a loaded test machine is not judged UNKNOWN (and
/// refused calls) for reasons that have nothing to do with the fault under test.
fn target_config(control: &str, id: &str) -> agent_reach_sidecar::SidecarConfig {
    let mut config = sidecar_config(control, id);
    config.heartbeat_interval = Duration::from_secs(1);
    config
}

async fn instance_keys(store: &Arc<dyn agent_reach_store::Store>) -> usize {
    let prefix = keys::tenant_prefix("default");
    let range = store.get_prefix(&prefix).await.unwrap();
    range.kvs.iter().filter(|kv| kv.key.contains("/agents/")).count()
}

/// Control unreachable for 60 s with a 5 s lease TTL, at ~200 calls/s: etcd deletes every
/// record during the outage; when the caller's sidecar is back first, it holds the removals
/// it learns until the target's sidecar, back a few seconds later, registers its instances
/// again under their own ids. Not one call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_outage_longer_than_the_lease_ttl_loses_no_call() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let ttl = Duration::from_secs(5);
    let control = start_control(ts.store.clone(), ttl).await;
    // Each sidecar reaches control through its own proxy, so the links can come back
    // one after the other.
    let to_control_a = FaultProxy::start(control.addr()).await;
    let to_control_b = FaultProxy::start(control.addr()).await;
    let a = start_sidecar(through(sidecar_config(&control.endpoint(), "host-a"), &to_control_a).await).await;
    let b = start_sidecar(through(target_config(&control.endpoint(), "host-b"), &to_control_b).await).await;
    let e1 = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    let e2 = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    let ids = [e1.instance_id(), e2.instance_id()];
    wait_for_instances(&a, &ids).await;
    assert_eq!(instance_keys(&ts.store).await, 2);
    // An operator holds e2 (calls go to e1 only); the hold must outlive e2's lease.
    let mut admin = admin_client(&control.endpoint()).await;
    admin
        .set_instance_state(agent_reach::proto::SetInstanceStateRequest {
            tenant: "default".into(),
            instance_id: e2.instance_id(),
            state: agent_reach::proto::HealthState::Paused as i32,
            reason: "disk replacement".into(),
        })
        .await
        .expect("hold e2");
    wait_for_state(&a, &e2.instance_id(), agent_reach::model::HealthState::Paused).await;

    let load = Load::offered(a.local_addr()).await;
    let load_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    to_control_a.partition();
    to_control_b.partition();
    let cut = Instant::now();
    eventually(Duration::from_secs(10), "the sidecars notice that control is gone", || {
        !a.watch_stats().connected.load(Ordering::Relaxed) && !b.watch_stats().connected.load(Ordering::Relaxed)
    })
    .await;
    // Well past the TTL, etcd has deleted both records.
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(instance_keys(&ts.store).await, 0, "the leases expired during the outage");
    let during = load.counts();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(cut.elapsed())).await;
    let (ok_during, failed_during) = load.counts();
    assert_eq!(failed_during, 0, "no call failed during the outage: {:?}", load.failures.lock().unwrap());
    assert!(ok_during > during.0, "calls went on during the outage");

    // The caller's side comes back first and learns the removals...
    to_control_a.heal();
    eventually(Duration::from_secs(15), "the caller's sidecar learns the removals", || {
        a.watch_stats().connected.load(Ordering::Relaxed) && a.watch_stats().held_removals.load(Ordering::Relaxed) >= 2
    })
    .await;
    // ...and keeps routing to both instances while it holds them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(a.table().instances.len(), 2);
    assert_eq!(load.counts().1, 0, "no call failed while the removals were held: {:?}", load.failures.lock().unwrap());
    // Then the target's side: it registers its instances again at once, under their ids.
    let healed = Instant::now();
    to_control_b.heal();
    eventually(Duration::from_secs(5), "the instances are registered again", || {
        b.registry().stats().reregistrations.load(Ordering::Relaxed) >= 2
    })
    .await;
    let reregistered_in = healed.elapsed();
    wait_for_instances(&a, &ids).await;
    assert_eq!(instance_keys(&ts.store).await, 2);
    // 30 s after the recovery, still nothing failed and nothing was removed.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (ok, failed, failures) = load.stop().await;
    let rate = ok as f64 / load_started.elapsed().as_secs_f64();
    println!(
        "control outage: {ok} calls ({rate:.0}/s), {failed} failed, re-registered {reregistered_in:?} after control was back"
    );
    assert_eq!(failed, 0, "no call failed: {failures:?}");
    assert!(rate > 20.0, "calls kept flowing: {ok} ({rate:.0}/s)");
    assert_eq!(a.watch_stats().held_expired.load(Ordering::Relaxed), 0, "every held instance registered again");
    let mut now: Vec<String> = a.table().instances.keys().cloned().collect();
    now.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(now, want, "the instances kept their ids");
    assert!(reregistered_in < Duration::from_secs(3), "registered again {reregistered_in:?} after control was back");
    // The hold came back with e2, in the caller's table and at control.
    assert_eq!(state_in(&a, &e2.instance_id()), Some(agent_reach::model::HealthState::Paused));
    let held = admin
        .get_instance(agent_reach::proto::GetInstanceRequest {
            tenant: "default".into(),
            instance_id: e2.instance_id(),
        })
        .await
        .expect("e2 at control")
        .into_inner()
        .instance
        .expect("e2 is registered");
    assert_eq!(held.holds.len(), 1, "{:?}", held.holds);
    assert_eq!(held.holds[0].reason, "disk replacement");

    e1.abort();
    e2.abort();
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}

/// etcd down for 60 s (twelve lease TTLs) while control stays up, at ~200 calls/s: calls keep
/// succeeding from the sidecars' tables, the records are still there when etcd returns,
/// and a registration made after its return reaches the caller within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_longer_than_the_lease_ttl_loses_no_call() {
    init_logging();
    let mut ts = TestStore::start(Backend::Etcd).await;
    let ttl = Duration::from_secs(5);
    let control = start_control(ts.store.clone(), ttl).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(target_config(&control.endpoint(), "host-b")).await;
    let e1 = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[e1.instance_id()]).await;

    let load = Load::offered(a.local_addr()).await;
    let load_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    ts.etcd.as_mut().unwrap().kill();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(load.counts().1, 0, "no call failed while etcd was down: {:?}", load.failures.lock().unwrap());
    tokio::task::block_in_place(|| ts.etcd.as_mut().unwrap().restart()).unwrap();
    let back = Instant::now();
    let e2 = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[e1.instance_id(), e2.instance_id()]).await;
    let converged_in = back.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (ok, failed, failures) = load.stop().await;
    let rate = ok as f64 / load_started.elapsed().as_secs_f64();
    println!("etcd outage: {ok} calls ({rate:.0}/s), {failed} failed, converged {converged_in:?} after etcd was back");
    assert_eq!(failed, 0, "no call failed: {failures:?}");
    assert!(rate > 20.0, "calls kept flowing: {ok} ({rate:.0}/s)");
    assert!(converged_in < Duration::from_secs(5), "converged {converged_in:?} after etcd was back");
    assert_eq!(instance_keys(&ts.store).await, 2, "the first record survived etcd's outage");

    e1.abort();
    e2.abort();
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}

/// The link to one of two target sidecars goes through the fault proxy. With 50 ± 20 ms of
/// latency each way, 10 % of new connections reset and every open connection reset every
/// second, at least 99.9 % of 1,000 idempotent calls succeed within the retry budget. Then
/// the link turns half-open (requests arrive, replies never come back): the instance's
/// breaker takes it out after exactly the configured 3 failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_mesh_link_loses_no_idempotent_call_and_a_dead_one_trips_the_breaker() {
    use agent_reach::policy::{CircuitBreaker, PolicySpec, RetryPolicy, Strategy};
    use agent_reach_e2e::fault::Faults;
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    // Sidecar B is advertised at the proxy, so every caller reaches it through the faults.
    let b_mesh = listener().await;
    let link = FaultProxy::start(b_mesh.local_addr().unwrap()).await;
    let mut config_b = agent_reach_e2e::secure::sidecar_identity(target_config(&control.endpoint(), "host-b")).await;
    config_b.advertise = Some(link.addr().to_string());
    let b = agent_reach_sidecar::Sidecar::start(config_b, listener().await, b_mesh).await.unwrap();
    let c = start_sidecar(target_config(&control.endpoint(), "host-c")).await;
    let on_b = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    let on_c = echo_agent(c.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[on_b.instance_id(), on_c.instance_id()]).await;
    // A retry budget of 50 % of calls + 20/s: every reset cuts all calls in flight on B.
    let retry = RetryPolicy { idempotent: true, budget_ratio: 0.5, budget_min_per_second: 20, ..Default::default() };
    let lenient = CircuitBreaker { consecutive_failures: 100_000, min_requests: 100_000, ..Default::default() };
    let spec = |breaker| PolicySpec {
        strategy: Some(Strategy::RoundRobin),
        retry: Some(retry),
        breaker: Some(breaker),
        ..Default::default()
    };
    put_policy(&ts.store, &[&a], capability_policy("echo", spec(lenient))).await;

    link.set(Faults { reset_share: 0.1, ..Faults::latency(Duration::from_millis(50), Duration::from_millis(20)) });
    // Until B answers through the faulty link: the first new connection after the change is
    // reset, and while the caller's sidecar reconnects every pick of B goes to C, so without
    // this the calls below can all end before the first reset of open connections.
    let warm = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let warm_until = Instant::now() + Duration::from_secs(15);
    let mut warm_calls = 0;
    loop {
        warm_calls += 1;
        if let Ok(reply) = warm.invoke("echo").text(format!("warm-{warm_calls}")).send().await
            && reply.instance() == on_b.instance_id()
        {
            break;
        }
        assert!(Instant::now() < warm_until, "B answers through the faulty link within 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resetting = Arc::new(AtomicBool::new(true));
    let resets = {
        let resetting = resetting.clone();
        let link = &link;
        async move {
            while resetting.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                link.reset_all();
            }
        }
    };
    let calls = async {
        let ok = Arc::new(AtomicU64::new(0));
        let mut failures = Vec::new();
        let mut workers = Vec::new();
        for w in 0..8 {
            let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
            workers.push(tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..125 {
                    match client.invoke("echo").text(format!("{w}-{i}")).timeout(Duration::from_secs(5)).send().await {
                        Ok(reply) if reply.text().starts_with("echo@") => {}
                        other => failed.push(format!("{other:?}")),
                    }
                }
                failed
            }));
        }
        for w in workers {
            let failed = w.await.unwrap();
            ok.fetch_add(125 - failed.len() as u64, Ordering::Relaxed);
            failures.extend(failed);
        }
        resetting.store(false, Ordering::Relaxed);
        (ok.load(Ordering::Relaxed), failures)
    };
    let ((ok, failures), ()) = tokio::join!(calls, resets);
    println!("faulty link: {ok} of 1000 idempotent calls succeeded; failures {failures:?}");
    assert!(ok >= 999, "at least 99.9 % of 1,000 calls succeeded: {ok}, failures {failures:?}");
    assert!(link.stats().reset_on_arrival.load(Ordering::Relaxed) > 0, "some new connections were reset");
    assert!(link.stats().reset_open.load(Ordering::Relaxed) > 0, "open connections were reset");

    // The link heals, and the strict breaker is in place before B's link turns half-open.
    // A call answered by B first: the last attempt on B of the reset phase may have failed,
    // and a breaker counts consecutive failures across a change of policy, so without a
    // success on B it could open after only two failures of the half-open phase.
    link.heal();
    let strict = CircuitBreaker { consecutive_failures: 3, open_ms: 60_000, ..Default::default() };
    put_policy(&ts.store, &[&a], capability_policy("echo", spec(strict))).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let mut answered_by_b = false;
    for i in 0..20 {
        let reply =
            client.invoke("echo").text(format!("healed-{i}")).send().await.expect("a call over the healed link");
        if reply.instance() == on_b.instance_id() {
            answered_by_b = true;
            break;
        }
    }
    assert!(answered_by_b, "round robin reaches B over the healed link");
    // Half-open: B's sidecar gets the calls but its answers never come back.
    link.set(Faults::half_open());
    let mut failed = 0;
    for i in 0..30 {
        match client.invoke("echo").text(format!("{i}")).timeout(Duration::from_millis(500)).send().await {
            Ok(reply) => assert_eq!(reply.instance(), on_c.instance_id()),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(failed, 3, "the breaker opened after exactly 3 failures");
    let route = client.route(agent_reach::model::Target::capability("echo"), 5).await.unwrap();
    let skipped: Vec<(&str, &str)> =
        route.skipped.iter().map(|s| (s.instance_id.as_str(), s.reason.as_str())).collect();
    assert_eq!(skipped, [(on_b.instance_id().as_str(), "BREAKER_OPEN")]);

    on_b.abort();
    on_c.abort();
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
    control.shutdown().await;
}

/// A tenant of 12,000 instances with 4 KiB of metadata each (over 50 MB of records) loads
/// into a new sidecar: control sends its snapshot in parts under the sidecars' message
/// limit, and the sidecar applies them together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_over_50_mb_loads_into_a_new_sidecar() {
    use agent_reach::model::fixture;
    use agent_reach_control::record::{StoredInstance, encode};
    use futures_util::StreamExt;
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    const N: usize = 12_000;
    let blob = "m".repeat(4096);
    let started = Instant::now();
    let mut total = 0usize;
    let values: Vec<(String, bytes::Bytes)> = (0..N)
        .map(|i| {
            let agent = format!("agent-{}", i % 100);
            let record = fixture::instance(&format!("{agent}-{i}"))
                .agent(&agent)
                .version("1.0.0")
                .capability(&format!("cap-{}", i % 100), &[])
                .metadata("blob", &blob)
                .sidecar("elsewhere", "127.0.0.1:9")
                .record();
            let stored = StoredInstance { record, instance_hold: None, agent_hold: None, generation: 1 };
            let value = encode(&stored);
            total += value.len();
            (keys::instance_key("default", &agent, &stored.record.instance_id), value)
        })
        .collect();
    assert!(total > 50 * 1000 * 1000, "{total} bytes of records");
    let store = ts.store.clone();
    futures_util::stream::iter(values)
        .for_each_concurrent(64, |(key, value)| {
            let store = store.clone();
            async move {
                store.put(&key, value, None).await.unwrap();
            }
        })
        .await;
    println!("large tenant: written to etcd in {:?}", started.elapsed());

    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let t0 = Instant::now();
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    a.wait_for_table(Duration::from_secs(120), |t| t.len() == N).await.unwrap();
    let loaded_in = t0.elapsed();
    println!("large tenant: {N} instances, {total} bytes of records, loaded into a new sidecar in {loaded_in:?}");
    assert_eq!(a.watch_stats().snapshots.load(Ordering::Relaxed), 1, "one snapshot, applied whole");
    assert!(control.stats().snapshots_sent.load(Ordering::Relaxed) >= 1);
    let table = a.table();
    let cap7: Vec<_> =
        table.instances.values().filter(|m| m.instance.record.registration.capabilities[0].name == "cap-7").collect();
    assert_eq!(cap7.len(), N / 100);
    assert!(cap7.iter().all(|m| m.instance.record.registration.metadata["blob"].len() == 4096));
    a.shutdown().await;
    control.shutdown().await;
}
