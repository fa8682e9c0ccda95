//! Several control replicas on one etcd: the same view from each, and sidecars that move
//! to another replica when theirs dies.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::Client;
use agent_reach::proto;
use agent_reach_control::ControlConfig;
use agent_reach_e2e::{
    Backend, TestStore, admin_client, echo_agent, eventually, init_logging, sidecar_config, start_replica,
    start_sidecar, wait_for_instances,
};

fn ids(instances: &[proto::Instance]) -> Vec<(String, i32, i64)> {
    instances.iter().map(|i| (i.instance_id.clone(), i.state, i.revision)).collect()
}

/// Two replicas give the same view; when the one a sidecar watches and reports to is
/// killed, the sidecar keeps its table, resumes its watch on the other replica from its
/// revision (no snapshot), and its lease, registrations and calls carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_move_to_the_other_replica_and_keep_their_tables() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let etcd = ts.etcd.as_ref().expect("etcd").endpoint();
    // A short lease, so that the test outlives it several times after the kill.
    let config = ControlConfig { lease_ttl: Duration::from_secs(2), ..ControlConfig::default() };
    let one = start_replica(&etcd, config.clone());
    let two = start_replica(&etcd, config);
    let mut a_config = sidecar_config(&one.endpoint(), "host-a");
    a_config.control = vec![one.endpoint(), two.endpoint()];
    let mut b_config = sidecar_config(&two.endpoint(), "host-b");
    b_config.control = vec![two.endpoint(), one.endpoint()];
    let a = start_sidecar(a_config).await;
    let b = start_sidecar(b_config).await;
    let alpha = echo_agent(a.local_addr(), "alpha", &[("greet", &["en"])]).await;
    let beta = echo_agent(b.local_addr(), "beta", &[("greet", &["fr"])]).await;
    let both = [alpha.instance_id(), beta.instance_id()];
    wait_for_instances(&a, &both).await;
    wait_for_instances(&b, &both).await;

    // The same view from both replicas, at the same revision.
    let list = |endpoint: String| async move {
        let mut admin = admin_client(&endpoint).await;
        let request = proto::ListInstancesRequest { tenant: "default".into(), filter: None };
        admin.list_instances(request).await.unwrap().into_inner()
    };
    let (from_one, from_two) = (list(one.endpoint()).await, list(two.endpoint()).await);
    assert_eq!(ids(&from_one.instances), ids(&from_two.instances));
    assert_eq!(from_one.instances.len(), 2);
    assert_eq!(a.table().revision, b.table().revision);

    let revision = a.table().revision;
    one.kill();
    // The table stays as it was while the sidecar moves.
    assert_eq!(a.table().len(), 2);
    assert_eq!(a.table().revision, revision);
    eventually(Duration::from_secs(10), "sidecar a watches the other replica", || {
        a.watch_stats().connections.load(Ordering::Relaxed) >= 2
    })
    .await;
    // A new registration through `a` goes to the surviving replica and reaches both tables.
    let gamma = echo_agent(a.local_addr(), "gamma", &[("greet", &["de"])]).await;
    let all = [alpha.instance_id(), beta.instance_id(), gamma.instance_id()];
    wait_for_instances(&a, &all).await;
    wait_for_instances(&b, &all).await;
    // Three lease TTLs later, renewals through the surviving replica kept everything alive.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let live: BTreeSet<String> = a.table().instances.keys().cloned().collect();
    assert_eq!(live, all.iter().cloned().collect());
    let client = Client::connect(&b.local_addr().to_string()).await.unwrap();
    let reply = client.invoke("greet").tags(["en"]).text("hi").send().await.unwrap();
    assert_eq!(reply.instance(), alpha.instance_id());

    // Resumed, never resynced or refused, on either sidecar.
    for sidecar in [&a, &b] {
        let stats = sidecar.watch_stats();
        assert_eq!(stats.snapshots.load(Ordering::Relaxed), 1, "{}", sidecar.id());
        assert_eq!(stats.resyncs.load(Ordering::Relaxed), 0);
        assert_eq!((stats.rejected.load(Ordering::Relaxed), stats.gaps.load(Ordering::Relaxed)), (0, 0));
    }
    assert_eq!(a.table().revision, b.table().revision);
    assert_eq!(ids(&list(two.endpoint()).await.instances).len(), 3);

    for agent in [alpha, beta, gamma] {
        agent.shutdown().await;
    }
    a.shutdown().await;
    b.shutdown().await;
    two.kill();
}
