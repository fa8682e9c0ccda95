//! The watch contract every sidecar relies on, on a real etcd: a snapshot, then deltas
//! strictly in revision order with no gaps and no duplicates, across crashes of the control
//! replica serving the sidecar, and exactly one resync when etcd compacted past it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_control::ControlConfig;
use agent_reach_control::feed::{Prefixes, deltas_from_events};
use agent_reach_e2e::{
    Backend, TestStore, WatchProbe, admin_client, control_client_as, eventually, init_logging, registration,
    restart_replica, start_control, start_replica, store_view, table_matches,
};
use agent_reach_sidecar::control::Applied;
use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::mpsc;

const TENANT: &str = "fidelity";

fn sidecar(id: &str) -> Option<proto::SidecarIdentity> {
    Some(proto::SidecarIdentity { sidecar_id: id.into(), mesh_address: format!("{id}:7701") })
}

/// Every revision at which the tenant's routing state changed, from `from` on, read by a
/// direct etcd watch (the reference the sidecar is checked against).
fn reference_revisions(events: &[agent_reach_store::Event], start: i64) -> Vec<i64> {
    deltas_from_events(&Prefixes::new(TENANT), events, start).iter().map(|d| d.revision).collect()
}

/// Thousands of registrations, state changes, re-registrations, deregistrations and policy
/// changes while the replica a sidecar watches is killed and restarted again and again: the
/// sidecar applies exactly the revisions etcd recorded, in order, never resyncs, and ends
/// with a table equal to etcd at head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_stay_exact_while_the_serving_replica_restarts() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let etcd = ts.etcd.as_ref().expect("etcd").endpoint();
    let start = ts.store.current_revision().await.unwrap();
    // The reference: etcd's own record of the tenant's changes.
    let mut reference_watch = ts.store.watch_prefix(&Prefixes::new(TENANT).all, start + 1).await.unwrap();
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let reference = tokio::spawn(async move {
        while let Some(Ok(batch)) = reference_watch.next().await {
            if events_tx.send(batch.events).is_err() {
                return;
            }
        }
    });

    // The writer goes through a replica that stays up; the sidecar watches one that does not.
    // A lease that outlives the test, so nothing expires while the tables are compared.
    let writer = start_control(ts.store.clone(), Duration::from_secs(600)).await;
    let config = ControlConfig { watch_history: 64, ..ControlConfig::default() };
    let mut serving = start_replica(&etcd, config.clone());
    let serving_addr = serving.addr();
    let probe = WatchProbe::start(&[serving.endpoint()], TENANT);
    probe.wait_for(Duration::from_secs(10), |t| t.revision > 0).await.unwrap();

    let write = tokio::spawn(write_load(writer.endpoint(), 3000));
    for round in 1..=8 {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(300..700))).await;
        serving.kill();
        tracing::info!(round, "killed the serving replica");
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..300))).await;
        serving = restart_replica(&etcd, config.clone(), serving_addr).await;
        // The next kill cuts a live stream.
        eventually(Duration::from_secs(10), "the probe reconnected", || {
            probe.stats.connections.load(Ordering::Relaxed) > round
        })
        .await;
    }
    let ops = write.await.unwrap();
    assert!(ops >= 3000, "only {ops} writes");

    let (head, instances, policies) = store_view(&ts.store, TENANT).await;
    probe
        .wait_for(Duration::from_secs(30), |t| t.revision >= head && table_matches(t, &instances, &policies))
        .await
        .unwrap_or_else(|e| {
            let table = probe.table.load();
            let differ: Vec<String> = instances
                .iter()
                .filter(|(id, i)| table.instances.get(*id).is_none_or(|t| *t.instance != **i))
                .map(|(id, i)| format!("{id}: etcd {i:?} table {:?}", table.instances.get(id).map(|m| &m.instance)))
                .chain(
                    table
                        .instances
                        .keys()
                        .filter(|id| !instances.contains_key(*id))
                        .map(|id| format!("{id}: only in the table")),
                )
                .take(5)
                .collect();
            panic!("{e}; etcd at {head} has {} instances; differences {differ:#?}", instances.len())
        });
    assert!(instances.len() > 10, "the load left {} instances", instances.len());

    let log = probe.log();
    let stats = &probe.stats;
    // One snapshot, at the start; every reconnection resumed with deltas.
    assert_eq!(stats.snapshots.load(Ordering::Relaxed), 1, "{log:?}");
    assert_eq!(stats.resyncs.load(Ordering::Relaxed), 0);
    assert_eq!((stats.rejected.load(Ordering::Relaxed), stats.gaps.load(Ordering::Relaxed)), (0, 0));
    assert!(stats.connections.load(Ordering::Relaxed) >= 9, "the probe never reconnected");
    let Applied::Snapshot { revision: snapshot, resync: false } = log[0] else { panic!("first event {:?}", log[0]) };
    let mut table_revision = snapshot;
    let mut applied = Vec::new();
    for entry in &log[1..] {
        match *entry {
            Applied::Delta { from, revision, changes } => {
                assert_eq!(from, table_revision, "a delta applied on another revision");
                assert!(revision > from, "revision went backwards: {entry:?}");
                table_revision = revision;
                if changes > 0 {
                    applied.push(revision);
                }
            }
            ref other => panic!("unexpected {other:?}"),
        }
    }
    // Exactly etcd's revisions after the snapshot: none missing, none twice, none invented.
    // A key that is not routing state marks the end of the reference's events.
    let sentinel = ts.store.put(&format!("{}zz-end", Prefixes::new(TENANT).all), "x".into(), None).await.unwrap();
    let mut events: Vec<agent_reach_store::Event> = Vec::new();
    let reference_done = async {
        while events.last().is_none_or(|e| e.kv.mod_revision < sentinel) {
            events.extend(events_rx.recv().await.expect("the reference watch"));
        }
        events
    };
    let events = tokio::time::timeout(Duration::from_secs(10), reference_done).await.expect("reference events");
    reference.abort();
    let expected: Vec<i64> =
        reference_revisions(&events, start).into_iter().filter(|r| *r > snapshot && *r <= table_revision).collect();
    assert_eq!(applied.len(), expected.len(), "applied {} deltas, etcd recorded {}", applied.len(), expected.len());
    assert_eq!(applied, expected);
    assert!(applied.len() > 1000, "only {} deltas reached the sidecar", applied.len());

    probe.stop().await;
    serving.kill();
    writer.shutdown().await;
}

/// Registrations, state changes, re-registrations, deregistrations and policy changes of
/// `TENANT` through the Control and Admin APIs at `endpoint`, 8 at a time, until `ops`
/// writes have been made; returns how many were made.
async fn write_load(endpoint: String, ops: usize) -> usize {
    let mut control = control_client_as(&endpoint, TENANT, "writer").await;
    let mut admin = admin_client(&endpoint).await;
    let first = control
        .register(proto::ControlRegisterRequest {
            tenant: TENANT.into(),
            sidecar: sidecar("writer"),
            instance_id: "seed-0".into(),
            registration: Some(registration("seed", "1", "seed", &[])),
            state: proto::HealthState::Up as i32,
            lease_id: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let lease = first.lease_id;
    let live = Arc::new(std::sync::Mutex::new(BTreeSet::<u32>::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8u32 {
        let (mut control, mut admin, live) = (control.clone(), admin.clone(), live.clone());
        let per_worker = ops.div_ceil(8);
        tasks.spawn(async move {
            let mut done = 0;
            for n in 0..per_worker as u32 {
                let id = worker * 100_000 + n;
                let pick = rand::rng().random_range(0..100);
                let existing = {
                    let live = live.lock().unwrap();
                    let mine: Vec<u32> = live.iter().copied().filter(|i| i / 100_000 == worker).collect();
                    (!mine.is_empty()).then(|| mine[rand::rng().random_range(0..mine.len())])
                };
                let agent = |i: u32| format!("agent-{}", i % 7);
                match (pick, existing) {
                    (0..40, _) | (_, None) => {
                        control
                            .register(proto::ControlRegisterRequest {
                                tenant: TENANT.into(),
                                sidecar: sidecar("writer"),
                                instance_id: format!("i-{id}"),
                                registration: Some(registration(&agent(id), "1", &format!("cap-{}", id % 5), &["t"])),
                                state: proto::HealthState::Up as i32,
                                lease_id: lease,
                            })
                            .await
                            .unwrap();
                        live.lock().unwrap().insert(id);
                    }
                    (40..65, Some(e)) => {
                        let state =
                            if n % 2 == 0 { proto::HealthState::Degraded } else { proto::HealthState::Up } as i32;
                        control
                            .heartbeat(proto::ControlHeartbeatRequest {
                                report: None,
                                tenant: TENANT.into(),
                                sidecar: sidecar("writer"),
                                instances: vec![proto::InstanceHeartbeat {
                                    instance_id: format!("i-{e}"),
                                    agent: agent(e),
                                    lease_id: lease,
                                    state,
                                    load: None,
                                }],
                                lease_id: lease,
                            })
                            .await
                            .unwrap();
                    }
                    (65..75, Some(e)) => {
                        // A restart with a new version: the record is replaced whole.
                        control
                            .register(proto::ControlRegisterRequest {
                                tenant: TENANT.into(),
                                sidecar: sidecar("writer"),
                                instance_id: format!("i-{e}"),
                                registration: Some(registration(
                                    &agent(e),
                                    &format!("{n}"),
                                    &format!("cap-{}", n % 5),
                                    &[],
                                )),
                                state: proto::HealthState::Up as i32,
                                lease_id: lease,
                            })
                            .await
                            .unwrap();
                    }
                    (75..95, Some(e)) => {
                        control
                            .deregister(proto::ControlDeregisterRequest {
                                tenant: TENANT.into(),
                                instance_id: format!("i-{e}"),
                                agent: agent(e),
                                lease_id: 0,
                                expected_lease_id: lease,
                            })
                            .await
                            .unwrap();
                        live.lock().unwrap().remove(&e);
                    }
                    _ => {
                        let name = format!("cap-{}", n % 5);
                        if n % 3 == 0 {
                            let _ = admin
                                .delete_policy(proto::DeletePolicyRequest {
                                    tenant: TENANT.into(),
                                    kind: proto::PolicyKind::Capability as i32,
                                    name,
                                })
                                .await;
                        } else {
                            let spec = proto::PolicySpec { default_timeout_ms: 100 + n, ..Default::default() };
                            admin
                                .put_policy(proto::PutPolicyRequest {
                                    policy: Some(proto::Policy {
                                        tenant: TENANT.into(),
                                        kind: proto::PolicyKind::Capability as i32,
                                        name,
                                        spec: Some(spec),
                                        ..Default::default()
                                    }),
                                })
                                .await
                                .unwrap();
                        }
                    }
                }
                done += 1;
                // Paced, so the writes span the replica's restarts.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            done
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.unwrap();
    }
    let _ = (&mut control, &mut admin);
    total
}

/// A sidecar that was away while etcd compacted past its revision gets exactly one fresh
/// snapshot flagged resync, and routes to nothing that was deleted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_disconnected_gives_exactly_one_resync() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let etcd = ts.etcd.as_ref().expect("etcd").endpoint();
    let writer = start_control(ts.store.clone(), Duration::from_secs(20)).await;
    let mut control = control_client_as(&writer.endpoint(), TENANT, "writer").await;
    let register = |id: &str, lease: i64| proto::ControlRegisterRequest {
        tenant: TENANT.into(),
        sidecar: sidecar("writer"),
        instance_id: id.into(),
        registration: Some(registration("worker", "1", "work", &[])),
        state: proto::HealthState::Up as i32,
        lease_id: lease,
    };
    let lease = control.register(register("w-0", 0)).await.unwrap().into_inner().lease_id;
    for i in 1..5 {
        control.register(register(&format!("w-{i}"), lease)).await.unwrap();
    }
    let serving = start_replica(&etcd, ControlConfig::default());
    let serving_addr = serving.addr();
    let probe = WatchProbe::start(&[serving.endpoint()], TENANT);
    probe.wait_for(Duration::from_secs(10), |t| t.len() == 5).await.unwrap();

    serving.kill();
    eventually(Duration::from_secs(10), "the probe lost its replica", || {
        !probe.stats.connected.load(Ordering::Relaxed)
    })
    .await;
    // While the sidecar is away: two instances leave, one arrives, and etcd compacts.
    for gone in ["w-1", "w-3"] {
        control
            .deregister(proto::ControlDeregisterRequest {
                tenant: TENANT.into(),
                instance_id: gone.into(),
                agent: "worker".into(),
                lease_id: 0,
                expected_lease_id: lease,
            })
            .await
            .unwrap();
    }
    control.register(register("w-5", lease)).await.unwrap();
    let head = ts.store.current_revision().await.unwrap();
    ts.store.compact(head).await.unwrap();
    let serving = restart_replica(&etcd, ControlConfig::default(), serving_addr).await;

    let (head, instances, policies) = store_view(&ts.store, TENANT).await;
    probe.wait_for(Duration::from_secs(15), |t| table_matches(t, &instances, &policies)).await.unwrap();
    let ids: BTreeSet<String> = probe.table.load().instances.keys().cloned().collect();
    assert_eq!(ids, ["w-0", "w-2", "w-4", "w-5"].map(String::from).into());
    assert!(probe.table.load().revision >= head);
    let log = probe.log();
    let resyncs: Vec<&Applied> = log.iter().filter(|a| matches!(a, Applied::Snapshot { resync: true, .. })).collect();
    assert_eq!(resyncs.len(), 1, "{log:?}");
    assert_eq!(probe.stats.resyncs.load(Ordering::Relaxed), 1);
    assert_eq!(probe.stats.snapshots.load(Ordering::Relaxed), 2);
    // Routing has nothing deleted left to pick from.
    let table = probe.table.load_full();
    for group in [table.by_capability.get("work"), table.by_agent.get("worker")] {
        let members: BTreeSet<&str> = group.expect("the group").members.iter().map(|m| m.id()).collect();
        assert_eq!(members, BTreeSet::from(["w-0", "w-2", "w-4", "w-5"]));
    }

    probe.stop().await;
    serving.kill();
    writer.shutdown().await;
}
