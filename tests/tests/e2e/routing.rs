//! Calls by capability through two sidecars: matching, spreading, tags, leases, deregistration.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agent_reach::Client;
use agent_reach::model::Target;
use agent_reach::policy::{PolicySpec, Strategy};
use agent_reach_e2e::{
    Backend, TestStore, capability_policy, echo_agent, init_logging, put_policy, sidecar_config, start_control,
    start_sidecar, wait_for_instances,
};

async fn calls_by_capability(backend: Backend) {
    init_logging();
    let ts = TestStore::start(backend).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(2)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;

    let sum_a = echo_agent(a.local_addr(), "summarizer", &[("text.summarize", &["en"])]).await;
    let sum_b = echo_agent(b.local_addr(), "summarizer", &[("text.summarize", &["en", "zh"])]).await;
    let tr_b = echo_agent(b.local_addr(), "translator", &[("text.translate", &["zh"])]).await;
    let all = [sum_a.instance_id(), sum_b.instance_id(), tr_b.instance_id()];
    wait_for_instances(&a, &all).await;
    wait_for_instances(&b, &all).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let round_robin = PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() };
    put_policy(&ts.store, &[&a, &b], capability_policy("text.summarize", round_robin)).await;

    // 20 calls by capability land only on the two summarizers, exactly 10 each.
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..20 {
        let reply = client.invoke("text.summarize").text(format!("doc {i}")).send().await.unwrap();
        assert_eq!(reply.text(), format!("summarizer@{}:doc {i}", reply.instance()));
        assert_eq!((reply.agent(), reply.agent_version(), reply.attempts()), ("summarizer", "1.0.0", 1));
        *served.entry(reply.instance().to_string()).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = [(sum_a.instance_id(), 10), (sum_b.instance_id(), 10)].into();
    assert_eq!(served, expected);

    // Required tags: only the summarizer tagged zh (on the other sidecar) qualifies.
    for _ in 0..6 {
        let reply = client.invoke("text.summarize").tags(["zh"]).text("x").send().await.unwrap();
        assert_eq!(reply.instance(), sum_b.instance_id());
    }
    let reply = client.invoke("text.summarize").tags(["en", "zh"]).text("x").send().await.unwrap();
    assert_eq!(reply.instance(), sum_b.instance_id());
    let err = client.invoke("text.summarize").tags(["fr"]).text("x").send().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.reason(), Some("NO_HEALTHY_INSTANCE"));
    assert!(err.message().contains("MISSING_TAGS"), "{err}");

    // By agent name, across sidecars.
    let reply = client.invoke_agent("translator").text("hola").send().await.unwrap();
    assert_eq!(reply.text(), format!("translator@{}:hola", tr_b.instance_id()));

    // Route explains without calling.
    let route =
        client.route(Target { tags: vec!["zh".into()], ..Target::capability("text.summarize") }, 5).await.unwrap();
    let candidates: Vec<&str> =
        route.candidates.iter().map(|c| c.instance.as_ref().unwrap().instance_id.as_str()).collect();
    assert_eq!(candidates, [sum_b.instance_id().as_str()]);
    assert_eq!(route.skipped.len(), 1);
    assert_eq!(
        (route.skipped[0].instance_id.as_str(), route.skipped[0].reason.as_str()),
        (sum_a.instance_id().as_str(), "MISSING_TAGS")
    );

    // A deregistered agent disappears from every table at once.
    let sum_b_id = sum_b.instance_id();
    let t0 = Instant::now();
    sum_b.shutdown().await;
    let remaining = [sum_a.instance_id(), tr_b.instance_id()];
    wait_for_instances(&a, &remaining).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "deregistration took {:?} to reach the other sidecar", t0.elapsed());
    for _ in 0..4 {
        let reply = client.invoke("text.summarize").text("x").send().await.unwrap();
        assert_eq!(reply.instance(), sum_a.instance_id());
        assert_ne!(reply.instance(), sum_b_id);
    }

    // An agent killed without deregistering leaves when its 2 s lease expires.
    let t0 = Instant::now();
    tr_b.abort();
    wait_for_instances(&a, &[sum_a.instance_id()]).await;
    wait_for_instances(&b, &[sum_a.instance_id()]).await;
    let gone_after = t0.elapsed();
    assert!(gone_after >= Duration::from_millis(1500), "removed after {gone_after:?}, before its lease could expire");
    let err = client.invoke("text.translate").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("AGENT_NOT_FOUND"));

    sum_a.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_by_capability_on_etcd() {
    calls_by_capability(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_by_capability_on_embedded_store() {
    calls_by_capability(Backend::Embedded).await;
}

/// Streams pass through both sidecars chunk by chunk, and name the serving instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_stream_through_two_sidecars() {
    use futures_util::StreamExt;
    init_logging();
    let ts = TestStore::start(Backend::Embedded).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = agent_reach::Agent::builder("counter")
        .sidecar(b.local_addr().to_string())
        .handle_stream("count", |call| {
            let n: usize = call.text().ok().and_then(|t| t.parse().ok()).unwrap_or(0);
            futures_util::stream::iter((1..=n).map(|i| Ok(agent_reach::Reply::text(i.to_string()))))
        })
        .start()
        .await
        .unwrap();
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let stream = client.invoke("count").text("5").send_stream().await.unwrap();
    assert_eq!(stream.instance(), agent.instance_id());
    let chunks: Vec<String> = stream.map(|c| String::from_utf8(c.unwrap().payload.to_vec()).unwrap()).collect().await;
    assert_eq!(chunks, ["1", "2", "3", "4", "5"]);
    agent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}
