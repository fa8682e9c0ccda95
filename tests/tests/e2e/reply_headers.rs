//! What a reply carries back, end to end on a real etcd: the target sidecar's `ar-load`
//! trailer steering the caller's sidecar's next pick, the `ar-route` digest the caller
//! reads, and `consistent_hash` on a policy's metadata `hash_key`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agent_reach::model::Target;
use agent_reach::policy::{Admission, Policy, PolicyKind, PolicySpec, Strategy};
use agent_reach::{Agent, Client, Reply, RunningAgent, proto};
use agent_reach_e2e::{Backend, capability_policy, echo_agent, eventually, wait_for_instances};
use agent_reach_sidecar::Sidecar;

use crate::two_sidecars::Mesh;

/// The load ratio `sidecar` last read from an `ar-load` trailer of `instance_id`.
fn reported_load(sidecar: &Sidecar, instance_id: &str) -> Option<f64> {
    let table = sidecar.table();
    table.instances.get(instance_id)?.stats.reported_load(agent_reach_routing::clock())
}

/// Calls capability `work` `n` times from `client` and counts the serving instances,
/// checking every reply's `ar-route` on the way.
async fn spread(client: &Client, n: usize) -> BTreeMap<String, usize> {
    let mut served = BTreeMap::new();
    for i in 0..n {
        let reply = client.invoke("work").text(format!("w{i}")).timeout(Duration::from_secs(5)).send().await.unwrap();
        assert_eq!(reply.route(), format!("round_robin capability work -> {} (attempt 1)", reply.instance()));
        *served.entry(reply.instance().to_string()).or_default() += 1;
    }
    served
}

/// A reply's `ar-load` trailer (written by the target's sidecar from the instance's
/// admission gate) is read by the caller's sidecar and decides its next pick: an instance
/// that answered with load 1.000 is passed over by round_robin until a later reply from it
/// says 0.000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ar_load_trailer_of_a_reply_steers_the_callers_next_pick() {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    // worker-x has one slot; a call saying "hold" keeps it until the test releases it.
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(AtomicU32::new(0));
    let (r, e) = (release.clone(), entered.clone());
    let x = Agent::builder("worker-x")
        .sidecar(mesh.b.local_addr().to_string())
        .max_concurrency(1)
        .handle("work", move |call| {
            let (release, entered) = (r.clone(), e.clone());
            async move {
                let text = call.text()?.to_string();
                if text == "hold" {
                    entered.fetch_add(1, Ordering::SeqCst);
                    release.acquire().await?.forget();
                }
                Ok(Reply::text(format!("worker-x:{text}")))
            }
        })
        .start()
        .await
        .unwrap();
    let y = echo_agent(mesh.b.local_addr(), "worker-y", &[("work", &[])]).await;
    let (x_id, y_id) = (x.instance_id(), y.instance_id());
    for sc in [&mesh.a, &mesh.b] {
        wait_for_instances(sc, &[x_id.clone(), y_id.clone()]).await;
    }
    // A waiter for worker-x's slot queues for up to 30 s instead of the default 100 ms.
    let admission = Admission { queue_timeout_ms: 30_000, ..Default::default() };
    mesh.policy(Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "worker-x".into(),
        spec: PolicySpec { admission: Some(admission), ..Default::default() },
        description: String::new(),
    })
    .await;
    mesh.policy(capability_policy("work", PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() }))
        .await;
    let client_a = mesh.client().await;
    let client_b = Client::connect(&mesh.b.local_addr().to_string()).await.unwrap();

    // Round robin alternates; worker-x's replies report it idle (its own call not counted).
    let even: BTreeMap<String, usize> = [(x_id.clone(), 2), (y_id.clone(), 2)].into();
    assert_eq!(spread(&client_a, 4).await, even);
    assert_eq!(reported_load(&mesh.a, &x_id), Some(0.0));

    // Sidecar A's call holds worker-x's only slot; sidecar B's call waits for it in the queue.
    let held = tokio::spawn({
        let c = client_a.clone();
        async move { c.invoke_agent("worker-x").text("hold").send().await }
    });
    eventually(Duration::from_secs(5), "sidecar A's call reached worker-x", || entered.load(Ordering::SeqCst) == 1)
        .await;
    let queued = tokio::spawn({
        let c = client_b.clone();
        async move { c.invoke_agent("worker-x").text("hold").send().await }
    });
    eventually(Duration::from_secs(5), "sidecar B's call is on its way to worker-x", || {
        mesh.b.table().instances.get(&x_id).is_some_and(|m| m.stats.in_flight() == 1)
    })
    .await;
    // From B's routing to B's admission queue is a hop on the same host.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(entered.load(Ordering::SeqCst), 1, "one slot: B's call waits");

    // The held call ends while B's waits: its trailer says (1 running + 1 waiting - itself) / 1.
    release.add_permits(1);
    let reply = held.await.unwrap().unwrap();
    assert_eq!((reply.instance(), reply.text().as_ref()), (x_id.as_str(), "worker-x:hold"));
    assert_eq!(reported_load(&mesh.a, &x_id), Some(1.0));
    eventually(Duration::from_secs(5), "B's call got the slot", || entered.load(Ordering::SeqCst) == 2).await;

    // Sidecar A now passes worker-x over: every call goes to worker-y.
    let all_y: BTreeMap<String, usize> = [(y_id.clone(), 4)].into();
    assert_eq!(spread(&client_a, 4).await, all_y);
    assert_eq!(x.handled(), 3, "worker-x saw no call while reported loaded");

    // B's call ends; a call by agent name can only go to worker-x, and its reply says 0.000.
    release.add_permits(1);
    assert_eq!(queued.await.unwrap().unwrap().instance(), x_id);
    let reply = client_a.invoke_agent("worker-x").text("ping").send().await.unwrap();
    assert_eq!(reply.text(), "worker-x:ping");
    assert_eq!(reported_load(&mesh.a, &x_id), Some(0.0));
    // And round robin takes worker-x back.
    assert_eq!(spread(&client_a, 4).await, even);
    mesh.stop(vec![x, y]).await;
}

/// `ar-route` (exposed as `InvokeReply::route`) says "<strategy> <target> -> <instance>
/// (attempt <n>)", for the default strategy with tags, for a policy's, and after a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ar_route_names_the_strategy_target_instance_and_attempt() {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    let sum_a = echo_agent(mesh.a.local_addr(), "summarizer", &[("text.summarize", &["en"])]).await;
    let sum_b = echo_agent(mesh.b.local_addr(), "summarizer", &[("text.summarize", &["en", "zh"])]).await;
    let w1 = echo_agent(mesh.b.local_addr(), "worker", &[("work", &[])]).await;
    let w2 = echo_agent(mesh.b.local_addr(), "worker", &[("work", &[])]).await;
    let ids = [sum_a.instance_id(), sum_b.instance_id(), w1.instance_id(), w2.instance_id()];
    wait_for_instances(&mesh.a, &ids).await;
    let client = mesh.client().await;

    // Default strategy, with the required tags in the target.
    let reply = client.invoke("text.summarize").tags(["zh"]).text("x").send().await.unwrap();
    assert_eq!(
        reply.route(),
        format!("least_loaded capability text.summarize [zh] -> {} (attempt 1)", sum_b.instance_id())
    );

    // A policy's strategy; round robin starts with the smallest instance id. Kill that one:
    // the first attempt is not delivered, the second is served by the other worker.
    mesh.policy(capability_policy("work", PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() }))
        .await;
    let (dead, alive) = if w1.instance_id() < w2.instance_id() { (w1, w2) } else { (w2, w1) };
    let (dead_id, alive_id) = (dead.instance_id(), alive.instance_id());
    dead.abort();
    let request = proto::InvokeRequest {
        target: Some(Target::capability("work").into()),
        payload: bytes::Bytes::from_static(b"x"),
        ..Default::default()
    };
    let answer = client.raw().invoke(request).await.unwrap();
    let header = |name: &str| answer.metadata().get(name).map(|v| v.to_str().unwrap().to_string());
    let reply = answer.get_ref();
    assert_eq!((reply.instance_id.as_str(), reply.attempts), (alive_id.as_str(), 2));
    assert_eq!(header("ar-attempts").as_deref(), Some("2"));
    // The instance not delivered to, then the one that served.
    assert_eq!(header("ar-instances-tried"), Some(format!("{dead_id},{alive_id}")));
    assert_eq!(header("ar-route"), Some(format!("round_robin capability work -> {alive_id} (attempt 2)")));

    // A call by agent name takes the agent's policy, and ar-route names it (not the
    // strategy of a capability that happens to share the name).
    mesh.policy(Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "summarizer".into(),
        spec: PolicySpec { strategy: Some(Strategy::RoundRobin), ..Default::default() },
        description: String::new(),
    })
    .await;
    let reply = client.invoke_agent("summarizer").text("x").send().await.unwrap();
    assert_eq!(reply.route(), format!("round_robin agent summarizer -> {} (attempt 1)", reply.instance()));

    mesh.stop(vec![sum_a, sum_b, alive]).await;
}

/// The caller's answer carries the mesh's own headers but neither the `date` that the
/// agent's server (tonic, on hyper) puts on every answer nor a `content-length` (the
/// status follows in trailers), whether the instance is behind another sidecar or this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_carries_no_date_of_the_agents_server_and_no_content_length() {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    let far = echo_agent(mesh.b.local_addr(), "far", &[("far", &[])]).await;
    let near = echo_agent(mesh.a.local_addr(), "near", &[("near", &[])]).await;
    wait_for_instances(&mesh.a, &[far.instance_id(), near.instance_id()]).await;
    let client = mesh.client().await;
    for (capability, instance) in [("far", far.instance_id()), ("near", near.instance_id())] {
        let request = proto::InvokeRequest {
            target: Some(Target::capability(capability).into()),
            payload: bytes::Bytes::from_static(b"x"),
            ..Default::default()
        };
        let answer = client.raw().invoke(request).await.unwrap();
        let headers = answer.metadata();
        assert_eq!(headers.get("ar-instance").map(|v| v.to_str().unwrap()), Some(instance.as_str()), "{capability}");
        let tried = headers.get("ar-instances-tried").map(|v| v.to_str().unwrap());
        assert_eq!(tried, Some(instance.as_str()), "{capability}: one attempt");
        assert!(headers.get("ar-route").is_some(), "{capability}");
        assert_eq!((headers.get("date"), headers.get("content-length")), (None, None), "{capability}: {headers:?}");
    }
    mesh.stop(vec![far, near]).await;
}

/// With `consistent_hash` and `hash_key: "user"`, the metadata value `user` — not the
/// session — decides the instance: every call of a user lands on the instance the
/// sidecar's Route names for that key, whatever its session, and users spread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_on_a_metadata_hash_key_keeps_each_user_on_one_instance() {
    let mesh = Mesh::start_on(Backend::Etcd).await;
    let mut agents: Vec<RunningAgent> = Vec::new();
    for _ in 0..3 {
        agents.push(echo_agent(mesh.b.local_addr(), "w", &[("work", &[])]).await);
    }
    let ids: Vec<String> = agents.iter().map(RunningAgent::instance_id).collect();
    wait_for_instances(&mesh.a, &ids).await;
    let spec = PolicySpec { strategy: Some(Strategy::ConsistentHash), hash_key: "user".into(), ..Default::default() };
    mesh.policy(capability_policy("work", spec)).await;
    let client = mesh.client().await;

    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for u in 0..12 {
        let user = format!("user-{u}");
        // Route ranks by the same ring, with the session id as the key it hashes.
        let route = client
            .raw()
            .route(proto::RouteRequest {
                target: Some(Target::capability("work").into()),
                session_id: user.clone(),
                max_candidates: 1,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.strategy, "consistent_hash");
        let expected = route.candidates[0].instance.as_ref().unwrap().instance_id.clone();
        for s in 0..3 {
            let reply = client
                .invoke("work")
                .session(format!("session-{u}-{s}"))
                .metadata("user", &user)
                .text("x")
                .send()
                .await
                .unwrap();
            assert_eq!(reply.instance(), expected, "{user}, session {s}");
            assert_eq!(reply.route(), format!("consistent_hash capability work -> {expected} (attempt 1)"));
        }
        owner.insert(user, expected);
    }
    let used: BTreeSet<&String> = owner.values().collect();
    assert!(used.len() >= 2, "12 users all hashed to one of 3 instances: {owner:?}");

    // One session shared by two users of different instances: each still goes to its own.
    let (first, second) = {
        let (u1, i1) = owner.iter().next().unwrap();
        let (u2, i2) = owner.iter().find(|(_, i)| *i != i1).unwrap();
        ((u1.clone(), i1.clone()), (u2.clone(), i2.clone()))
    };
    for (user, instance) in [&first, &second] {
        let reply =
            client.invoke("work").session("shared").metadata("user", user.as_str()).text("x").send().await.unwrap();
        assert_eq!(reply.instance(), instance.as_str(), "{user} in the shared session");
    }
    mesh.stop(agents).await;
}
