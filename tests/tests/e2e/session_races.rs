//! Session write policies under contention and limits, through sidecars and the Rust SDK,
//! with sessions on a real etcd and on a real `redis-server`: 20 agents race a first_writer
//! write of `user_id` (one value stands, the 19 others are refused naming the winner), 10
//! writers each make 100 compare_and_set increments of one counter with retries on
//! conflict (exactly 1,000, no increment lost or doubled), and oversize writes are refused
//! with their limit and store nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::{Policy, RunningAgent, SessionError};
use agent_reach_e2e::{echo_agent, wait_for_instances};
use futures_util::future::join_all;
use rand::Rng;
use tokio::sync::Barrier;

use super::sessions::{Mesh, Sessions};

/// `n` agents `racer-0` … behind the mesh's sidecars in turn, each with a capability of
/// its own; returns once every sidecar's table has them all.
async fn racers(mesh: &Mesh, n: usize) -> Vec<RunningAgent> {
    let starts = (0..n).map(|i| {
        let sidecar = mesh.sidecars[i % mesh.sidecars.len()].local_addr();
        async move {
            let capability = format!("race.run-{i}");
            echo_agent(sidecar, &format!("racer-{i}"), &[(capability.as_str(), &[])]).await
        }
    });
    let agents = join_all(starts).await;
    let ids: Vec<String> = agents.iter().map(|a| a.instance_id()).collect();
    for sidecar in &mesh.sidecars {
        wait_for_instances(sidecar, &ids).await;
    }
    agents
}

/// 20 agents on two sidecars write `user_id` first_writer at once: exactly one write is
/// taken, each of the 19 others gets `CONTEXT_FIELD_LOCKED` naming that agent, instance
/// and version, and both sidecars read the winner's value.
async fn first_writer_race(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 2).await;
    let agents = racers(&mesh, 20).await;
    let barrier = Arc::new(Barrier::new(agents.len()));
    let writes = agents.iter().enumerate().map(|(i, agent)| {
        let session = agent.client().session("race-1");
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            session.put_first("user_id", format!("u-{i}")).await
        }
    });
    let results = join_all(writes).await;

    let winners: Vec<(usize, u64)> =
        results.iter().enumerate().filter_map(|(i, r)| r.as_ref().ok().map(|v| (i, *v))).collect();
    assert_eq!(winners.len(), 1, "exactly one first writer: {results:?}");
    let (winner, version) = winners[0];
    let winner_instance = agents[winner].instance_id();
    for (i, result) in results.iter().enumerate().filter(|(i, _)| *i != winner) {
        match result {
            Err(SessionError::FieldLocked { field, writer_agent, writer_instance, version: locked_at }) => {
                assert_eq!(field, "user_id", "racer {i}");
                assert_eq!(writer_agent, &format!("racer-{winner}"), "racer {i} is told the winner");
                assert_eq!((writer_instance, *locked_at), (&winner_instance, version), "racer {i}");
            }
            other => panic!("racer {i}: expected FieldLocked, got {other:?}"),
        }
    }
    // One value stands, the winner's, seen through both sidecars.
    for agent in &agents[..2] {
        let snapshot = agent.client().session("race-1").read_at_least(version).await.expect("read");
        assert_eq!((snapshot.version, snapshot.fields.len()), (version, 1), "{:?}", snapshot.fields.keys());
        let field = &snapshot.fields["user_id"];
        assert_eq!(field.value.as_ref(), format!("u-{winner}").as_bytes());
        assert_eq!(
            (field.writer_agent.as_str(), field.writer_instance.as_str()),
            (format!("racer-{winner}").as_str(), winner_instance.as_str())
        );
    }
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_agents_race_a_first_writer_field_through_sidecars_on_etcd() {
    first_writer_race(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_agents_race_a_first_writer_field_through_sidecars_on_redis() {
    first_writer_race(Sessions::Redis).await;
}

const WRITERS: usize = 10;
const INCREMENTS: usize = 100;

/// One writer's increments of the counter `n`: read it, write value + 1 compare_and_set
/// on the version read, and on a conflict wait a random pause (doubling with each conflict
/// in a row, at most 16 ms, so the losers of a round do not all collide again) and read
/// again at least at the version the refusal names. Returns the values this writer wrote, the version of its last write and how
/// many conflicts it met.
async fn increment(session: agent_reach::Session) -> (Vec<u64>, u64, usize) {
    let mut wrote = Vec::with_capacity(INCREMENTS);
    let mut conflicts = 0;
    let mut streak = 0;
    let mut at_least = 0;
    while wrote.len() < INCREMENTS {
        let snapshot = session.read_at_least(at_least).await.expect("read the counter");
        let (value, version) = match snapshot.fields.get("n") {
            Some(f) => (String::from_utf8_lossy(&f.value).parse::<u64>().expect("a number"), f.version),
            None => (0, 0),
        };
        match session.put([("n", (value + 1).to_string(), Policy::CompareAndSet(version))]).await {
            Ok(written) => {
                wrote.push(value + 1);
                at_least = written;
                streak = 0;
            }
            Err(SessionError::Conflict { field, current_version }) => {
                assert_eq!(field, "n");
                assert!(current_version > version, "conflict at {current_version} after reading {version}");
                conflicts += 1;
                at_least = current_version;
                streak = (streak + 1).min(5);
                let pause = rand::rng().random_range(0..500u64 << streak);
                tokio::time::sleep(Duration::from_micros(pause)).await;
            }
            Err(e) => panic!("increment refused: {e:?}"),
        }
    }
    (wrote, at_least, conflicts)
}

/// 10 writers (agents on two sidecars) × 100 compare_and_set increments of one counter
/// field, retrying on conflict: the counter ends at exactly 1,000 and the values written
/// are 1 … 1,000, each once (no lost update, no double write).
async fn compare_and_set_counter(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 2).await;
    let agents = racers(&mesh, WRITERS).await;
    let started = std::time::Instant::now();
    let runs = agents.iter().map(|agent| increment(agent.client().session("counter-1")));
    let results = join_all(runs).await;
    let elapsed = started.elapsed();

    let mut written = BTreeSet::new();
    for (i, (values, _, _)) in results.iter().enumerate() {
        assert_eq!(values.len(), INCREMENTS, "writer {i}");
        for v in values {
            assert!(written.insert(*v), "value {v} was written twice");
        }
    }
    let total = (WRITERS * INCREMENTS) as u64;
    assert_eq!(written, (1..=total).collect::<BTreeSet<u64>>(), "every increment exactly once");
    let conflicts: usize = results.iter().map(|(_, _, c)| c).sum();
    let last = results.iter().map(|(_, v, _)| *v).max().expect("writers");
    tracing::info!("{total} increments by {WRITERS} writers in {elapsed:?} with {conflicts} conflicts ({sessions:?})");

    // The last write is 1,000, read through both sidecars.
    for agent in &agents[..2] {
        let snapshot = agent.client().session("counter-1").read_at_least(last).await.expect("read");
        let counter = &snapshot.fields["n"];
        assert_eq!((counter.value.as_ref(), counter.version), (&b"1000"[..], last));
    }
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_writers_make_a_thousand_compare_and_set_increments_through_sidecars_on_etcd() {
    compare_and_set_counter(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_writers_make_a_thousand_compare_and_set_increments_through_sidecars_on_redis() {
    compare_and_set_counter(Sessions::Redis).await;
}

/// Default limits: a field is at most 64 KiB (name + value + content type), a session 1 MiB.
const MAX_FIELD: u64 = 64 * 1024;
const MAX_SESSION: u64 = 1024 * 1024;

/// An oversize field, and a write that would make the session oversize, are refused
/// through the SDK with `CONTEXT_TOO_LARGE` naming the limit, its size and the write's;
/// the small fields written along with them are not stored and the version stays.
async fn oversize_refusals(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 1).await;
    let agents = racers(&mesh, 1).await;
    let session = agents[0].client().session("big-1");
    let first = session.set("kept", "1").await.expect("a small write");

    let blob = vec![b'x'; MAX_FIELD as usize];
    match session.put([("note", b"x".to_vec(), Policy::LastWriter), ("blob", blob, Policy::LastWriter)]).await {
        Err(SessionError::TooLarge { limit_name, size, limit }) => {
            assert_eq!((limit_name.as_str(), size, limit), ("max_field_bytes", 4 + MAX_FIELD, MAX_FIELD));
        }
        other => panic!("expected TooLarge for the field, got {other:?}"),
    }

    // 16 fields of 60,000 bytes fit (960,053 bytes with their names and `kept`) ...
    let big = |name: String| (name, vec![b'y'; 60_000], Policy::LastWriter);
    let filled = session.put((0..16).map(|i| big(format!("f{i:02}")))).await.expect("16 fields of 60,000 bytes");
    // ... two more (and a small one) would not.
    let over =
        session.put([("note".to_string(), b"x".to_vec(), Policy::LastWriter), big("g0".into()), big("g1".into())]);
    match over.await {
        Err(SessionError::TooLarge { limit_name, size, limit }) => {
            let expected = 5 + 16 * 60_003 + 5 + 2 * 60_002;
            assert_eq!((limit_name.as_str(), size, limit), ("max_session_bytes", expected, MAX_SESSION));
        }
        other => panic!("expected TooLarge for the session, got {other:?}"),
    }

    let snapshot = session.read_at_least(filled).await.expect("read");
    assert_eq!(snapshot.version, filled, "a refused write takes no version");
    let names: BTreeSet<&str> = snapshot.fields.keys().map(String::as_str).collect();
    let mut expected: BTreeSet<String> = (0..16).map(|i| format!("f{i:02}")).collect();
    expected.insert("kept".into());
    assert_eq!(names, expected.iter().map(String::as_str).collect(), "nothing of the refused writes is stored");
    assert_eq!(snapshot.fields["kept"].version, first);
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversize_writes_are_refused_through_the_sdk_and_store_nothing_on_etcd() {
    oversize_refusals(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversize_writes_are_refused_through_the_sdk_and_store_nothing_on_redis() {
    oversize_refusals(Sessions::Redis).await;
}
