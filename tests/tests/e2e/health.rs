//! The health model end to end on etcd: what agents report, what silence and probes make
//! of it, operator holds, and re-registration of a stable instance id.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agent_reach::Client;
use agent_reach::model::HealthState;
use agent_reach::proto;
use agent_reach_e2e::{
    Backend, ManualAgent, ProbeAnswer, TestStore, admin_client, echo_agent, eventually, init_logging, registration,
    sidecar_config, start_control, start_sidecar, state_in, wait_for_instances, wait_for_state,
};
use tonic::Code;

const BEAT: Duration = Duration::from_millis(200);

/// Reported states rule while heartbeats are fresh; silence makes an instance UNKNOWN, a
/// hanging probe DOWN (after its 2 s timeout), an answering probe UP; the next heartbeat
/// brings the agent's own report back; silence without answers removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_and_probes_drive_the_state() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(20)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let mut agent = ManualAgent::register(
        a.local_addr(),
        registration("worker", "1", "work", &[]),
        "",
        proto::HealthState::Starting,
    )
    .await
    .unwrap();
    let id = agent.instance_id.clone();
    wait_for_state(&b, &id, HealthState::Starting).await;
    // STARTING takes no calls.
    let client = Client::connect(&b.local_addr().to_string()).await.unwrap();
    let err = client.invoke("work").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("NO_HEALTHY_INSTANCE"));
    agent.start_heartbeats(proto::HealthState::Up, BEAT);
    wait_for_state(&b, &id, HealthState::Up).await;
    agent.start_heartbeats(proto::HealthState::Degraded, BEAT);
    wait_for_state(&b, &id, HealthState::Degraded).await;

    // Frozen: no heartbeats, probes hang. UNKNOWN after two intervals, DOWN once the
    // probe's 2 s timeout passes.
    agent.answer_probes(ProbeAnswer::Hang);
    agent.stop_heartbeats();
    let frozen = Instant::now();
    wait_for_state(&b, &id, HealthState::Unknown).await;
    wait_for_state(&b, &id, HealthState::Down).await;
    assert!(frozen.elapsed() >= Duration::from_millis(2000), "DOWN after {:?}", frozen.elapsed());
    // Awake again: the first heartbeat restores its own report at once.
    agent.answer_probes(ProbeAnswer::Serving);
    agent.heartbeat(proto::HealthState::Degraded).await.unwrap();
    wait_for_state(&b, &id, HealthState::Degraded).await;

    // Silent but answering probes: UP, and kept (successful probes are signs of life) well
    // past the 3 s dead-after of the test sidecars.
    wait_for_state(&b, &id, HealthState::Up).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(state_in(&b, &id), Some(HealthState::Up));
    let mut admin = admin_client(&control.endpoint()).await;
    let seen = admin
        .get_instance(proto::GetInstanceRequest { tenant: "default".into(), instance_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let seen = seen.instance.unwrap();
    assert_eq!((seen.state, seen.reported_state), (proto::HealthState::Up as i32, proto::HealthState::Up as i32));

    // Silent and refusing probes: DOWN, then removed once dead.
    agent.answer_probes(ProbeAnswer::NotServing);
    wait_for_state(&b, &id, HealthState::Down).await;
    b.wait_for_table(Duration::from_secs(10), |t| !t.instances.contains_key(&id)).await.unwrap();
    assert_eq!(a.local_instances(), 0);
    let err = agent.heartbeat(proto::HealthState::Up).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let probes = a.registry().stats().probes.load(Ordering::Relaxed);
    assert!(probes >= 5, "{probes} probes");
    assert_eq!(a.registry().stats().dead_removed.load(Ordering::Relaxed), 1);

    drop(agent);
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}

/// An operator's hold (PAUSED with a reason) wins over the agent's own heartbeats until it
/// is lifted, for one instance or a whole agent, including instances that join meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_holds_survive_heartbeats() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(20)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let one = echo_agent(a.local_addr(), "worker", &[("work", &[])]).await;
    let two = echo_agent(a.local_addr(), "worker", &[("work", &[])]).await;
    wait_for_instances(&a, &[one.instance_id(), two.instance_id()]).await;
    let mut admin = admin_client(&control.endpoint()).await;
    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();

    let set_instance = |instance_id: String, state: proto::HealthState, reason: &str| proto::SetInstanceStateRequest {
        tenant: "default".into(),
        instance_id,
        state: state as i32,
        reason: reason.into(),
    };
    let reply = admin
        .set_instance_state(set_instance(one.instance_id(), proto::HealthState::Paused, "disk replacement"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.instances[0].state, proto::HealthState::Paused as i32);
    wait_for_state(&a, &one.instance_id(), HealthState::Paused).await;
    // Ten heartbeat intervals of UP reports later, still held.
    tokio::time::sleep(BEAT * 10).await;
    assert_eq!(state_in(&a, &one.instance_id()), Some(HealthState::Paused));
    for _ in 0..6 {
        let reply = client.invoke("work").text("x").send().await.unwrap();
        assert_eq!(reply.instance(), two.instance_id());
    }
    let got = admin
        .get_instance(proto::GetInstanceRequest { tenant: "default".into(), instance_id: one.instance_id() })
        .await
        .unwrap()
        .into_inner()
        .instance
        .unwrap();
    assert_eq!((got.state, got.reported_state), (proto::HealthState::Paused as i32, proto::HealthState::Up as i32));
    assert_eq!(
        (got.holds[0].reason.as_str(), got.holds[0].scope),
        ("disk replacement", proto::HoldScope::Instance as i32)
    );
    admin.set_instance_state(set_instance(one.instance_id(), proto::HealthState::Up, "")).await.unwrap();
    wait_for_state(&a, &one.instance_id(), HealthState::Up).await;

    // A hold needs PAUSED (or UP to lift) and a reason; unknown instances are not found.
    let err =
        admin.set_instance_state(set_instance(one.instance_id(), proto::HealthState::Paused, "")).await.unwrap_err();
    assert_eq!(agent_reach::reason::error_info(&err).unwrap().metadata["field"], "reason");
    let err =
        admin.set_instance_state(set_instance(one.instance_id(), proto::HealthState::Down, "x")).await.unwrap_err();
    assert_eq!(agent_reach::reason::error_info(&err).unwrap().metadata["field"], "state");
    let err = admin
        .set_instance_state(set_instance("worker-nope".into(), proto::HealthState::Paused, "x"))
        .await
        .unwrap_err();
    assert_eq!(agent_reach::reason::error_info(&err).unwrap().reason, "INSTANCE_NOT_FOUND");

    // The whole agent: both instances, and a third that registers while the hold is on.
    let set_agent = |state: proto::HealthState, reason: &str| proto::SetAgentStateRequest {
        tenant: "default".into(),
        agent: "worker".into(),
        state: state as i32,
        reason: reason.into(),
    };
    let reply = admin.set_agent_state(set_agent(proto::HealthState::Paused, "scale-in")).await.unwrap().into_inner();
    assert_eq!(reply.instances.len(), 2);
    let three = echo_agent(a.local_addr(), "worker", &[("work", &[])]).await;
    for id in [one.instance_id(), two.instance_id(), three.instance_id()] {
        wait_for_state(&a, &id, HealthState::Paused).await;
    }
    tokio::time::sleep(BEAT * 5).await;
    let err = client.invoke("work").text("x").send().await.unwrap_err();
    assert_eq!(err.reason(), Some("NO_HEALTHY_INSTANCE"));
    let agents = admin
        .list_agents(proto::ListAgentsRequest { tenant: "default".into(), filter: None })
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].instances_by_state.get("PAUSED"), Some(&3));
    assert_eq!(agents[0].hold.as_ref().map(|h| h.reason.as_str()), Some("scale-in"));
    admin.set_agent_state(set_agent(proto::HealthState::Up, "")).await.unwrap();
    for id in [one.instance_id(), two.instance_id(), three.instance_id()] {
        wait_for_state(&a, &id, HealthState::Up).await;
    }
    client.invoke("work").text("x").send().await.unwrap();

    for agent in [one, two, three] {
        agent.shutdown().await;
    }
    a.shutdown().await;
    control.shutdown().await;
}

/// An instance with a stable id that restarts on another host with a new version and new
/// capabilities replaces its record whole: routing sees the old record, then the new one,
/// never a mix; the old sidecar drops the instance instead of fighting over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_instance_id_registers_again_in_one_piece() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(4)).await;
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let mut old = ManualAgent::register(
        a.local_addr(),
        registration("svc", "1.0", "svc.old", &[]),
        "svc-0",
        proto::HealthState::Up,
    )
    .await
    .unwrap();
    old.start_heartbeats(proto::HealthState::Up, BEAT);
    assert_eq!(old.instance_id, "svc-0");
    wait_for_instances(&b, &["svc-0".to_string()]).await;
    let table = b.table();
    let first = &table.instances["svc-0"];
    assert_eq!(
        (first.instance.record.registration.version.as_str(), first.instance.record.sidecar_id.as_str()),
        ("1.0", "host-a")
    );

    let mut new = ManualAgent::register(
        b.local_addr(),
        registration("svc", "2.0", "svc.new", &[]),
        "svc-0",
        proto::HealthState::Up,
    )
    .await
    .unwrap();
    new.start_heartbeats(proto::HealthState::Up, BEAT);
    for sidecar in [&a, &b] {
        sidecar
            .wait_for_table(Duration::from_secs(10), |t| {
                t.instances.get("svc-0").is_some_and(|m| m.instance.record.registration.version == "2.0")
            })
            .await
            .unwrap();
        let table = sidecar.table();
        let record = &table.instances["svc-0"].instance.record;
        assert_eq!(
            (record.sidecar_id.as_str(), record.registration.capabilities[0].name.as_str()),
            ("host-b", "svc.new")
        );
        assert!(!table.by_capability.contains_key("svc.old"), "the old capability lingers");
    }
    // The old sidecar learns from its next report that the id moved, and lets go.
    eventually(Duration::from_secs(10), "the old sidecar dropped the instance", || {
        a.registry().stats().replaced.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(a.local_instances(), 0);
    let mut admin = admin_client(&control.endpoint()).await;
    let got = admin
        .get_instance(proto::GetInstanceRequest { tenant: "default".into(), instance_id: "svc-0".into() })
        .await
        .unwrap()
        .into_inner()
        .instance
        .unwrap();
    assert_eq!((got.generation, got.sidecar_id.as_str()), (2, "host-b"));
    // The record outlives the old agent's heartbeats and the old sidecar's dead-after.
    old.stop_heartbeats();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(b.table().instances["svc-0"].instance.record.registration.version, "2.0");

    drop((old, new));
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
}
