//! Failures the mesh absorbs: a dead instance, a dead control service, a slow agent.

use std::time::{Duration, Instant};

use agent_reach::{Agent, Client, Reply};
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, sidecar_config, start_control, start_sidecar, wait_for_instances,
};
use tonic::Code;

/// A call routed to an instance that died is retried once on another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_killed_instance() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let one = echo_agent(b.local_addr(), "worker", &[("work", &[])]).await;
    let two = echo_agent(b.local_addr(), "worker", &[("work", &[])]).await;
    let survivor = two.instance_id();
    wait_for_instances(&a, &[one.instance_id(), survivor.clone()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();

    one.abort();
    let mut retried = 0;
    for i in 0..10 {
        let reply = client.invoke("work").text(format!("{i}")).send().await.unwrap();
        assert_eq!(reply.instance(), survivor);
        if reply.attempts() == 2 {
            retried += 1;
        }
    }
    assert!(retried >= 1, "the dead instance was never picked, so the retry path was not exercised");

    two.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}

/// With control gone, sidecars keep routing from their last table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_keep_routing_without_control() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();

    control.shutdown().await;
    a.wait_for_table(Duration::from_secs(5), |_| !a.watch_stats().connected.load(std::sync::atomic::Ordering::Relaxed))
        .await
        .unwrap();
    for i in 0..20 {
        let reply = client.invoke("echo").text(format!("{i}")).send().await.unwrap();
        assert_eq!(reply.instance(), agent.instance_id());
    }
    agent.abort();
    a.shutdown().await;
    b.shutdown().await;
}

/// The caller's deadline travels to the agent, shrunk at each hop, and the caller gets
/// DEADLINE_EXCEEDED on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_propagate_and_expire() {
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::builder("slow")
        .sidecar(b.local_addr().to_string())
        .handle("slow", move |call| {
            let seen = seen_tx.clone();
            async move {
                let left = call.deadline().map(|d| d.saturating_duration_since(std::time::Instant::now()));
                let _ = seen.send(left);
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(Reply::text("late"))
            }
        })
        .handle("warm", |_call| async move { Ok(Reply::text("warm")) })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    // Open A's connection to B (a mutual TLS handshake) before timing a 200 ms deadline.
    client.invoke("warm").text("x").send().await.unwrap();

    let t0 = Instant::now();
    let err = client.invoke("slow").text("x").timeout(Duration::from_millis(200)).send().await.unwrap_err();
    let took = t0.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(took < Duration::from_millis(250), "caller waited {took:?} for a 200 ms deadline");
    let left = seen_rx.recv().await.unwrap().expect("the agent saw a deadline");
    assert!(left < Duration::from_millis(200), "agent saw {left:?} left of a 200 ms deadline");
    assert!(left > Duration::from_millis(100), "agent saw only {left:?} left");

    agent.abort();
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}
