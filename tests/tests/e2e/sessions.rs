//! Session context end to end: real control (sessions on a real etcd, or on a real
//! `redis-server`), three sidecars and SDK agents. A chain A → B → C where B writes a field
//! of the call's session and C reads it without it being in the call; policy refusals as
//! typed SDK errors; reads answered from the sidecar's cache; tenants kept apart. The
//! backend switch ([`Sessions`]) and the [`Mesh`] are shared with the other `session_*`
//! test modules.

use std::sync::Arc;
use std::time::Duration;

use agent_reach::{Agent, Client, HandlerError, Policy, Reply, RunningAgent, SessionError};
use agent_reach_control::{ControlConfig, ControlHandle, config::SessionBackend};
use agent_reach_e2e::{Backend, TestStore, init_logging, listener, sidecar_config, start_sidecar};
use agent_reach_session::testing::RedisServer;
use agent_reach_session::{Limits, RedisSessions};
use agent_reach_sidecar::Sidecar;
use tonic::Code;

/// Where control keeps session context: its own etcd, or a real `redis-server`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sessions {
    Etcd,
    Redis,
}

impl Sessions {
    /// Sets `config` up for this backend: for Redis, starts a `redis-server` (returned: it
    /// lives as long as the caller keeps it) and points `config.session_store` at it.
    pub(crate) async fn configure(self, config: &mut ControlConfig) -> Option<RedisServer> {
        match self {
            Sessions::Etcd => None,
            Sessions::Redis => {
                let server = tokio::task::spawn_blocking(RedisServer::start)
                    .await
                    .expect("redis start task")
                    .unwrap_or_else(|e| panic!("redis-server is required for this test and did not start: {e}"));
                let redis = RedisSessions::connect(&server.url(), Limits::default()).await.expect("connect to redis");
                config.session_store = Some(SessionBackend(Arc::new(redis)));
                Some(server)
            }
        }
    }
}

/// A real etcd, control (sessions on [`Sessions`]) and `hosts` sidecars.
pub(crate) struct Mesh {
    _store: TestStore,
    _redis: Option<RedisServer>,
    pub(crate) control: ControlHandle,
    pub(crate) sidecars: Vec<Sidecar>,
}

impl Mesh {
    pub(crate) async fn start(sessions: Sessions, hosts: usize) -> Mesh {
        init_logging();
        let store = TestStore::start(Backend::Etcd).await;
        let mut config = ControlConfig { lease_ttl: Duration::from_secs(15), ..ControlConfig::default() };
        let redis = sessions.configure(&mut config).await;
        let control = ControlHandle::spawn(store.store.clone(), config, listener().await).expect("control");
        let mut sidecars = Vec::new();
        for i in 0..hosts {
            sidecars.push(start_sidecar(sidecar_config(&control.endpoint(), &format!("host-{i}"))).await);
        }
        Mesh { _store: store, _redis: redis, control, sidecars }
    }

    pub(crate) async fn stop(self, agents: Vec<RunningAgent>) {
        for agent in agents {
            agent.abort();
        }
        for sidecar in self.sidecars {
            sidecar.stop().await;
        }
        self.control.shutdown().await;
    }
}

fn handler_error(e: SessionError) -> HandlerError {
    HandlerError::new(e.code(), e.to_string())
}

/// B ("refund") writes `refund_amount` into the call's session and calls C ("finance")
/// with a payload that does not carry it; C reads it from the session.
async fn chain(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 3).await;
    let (a, b, c) = (&mesh.sidecars[0], &mesh.sidecars[1], &mesh.sidecars[2]);

    let finance = Agent::builder("finance")
        .sidecar(c.local_addr().to_string())
        .capability("finance.approve", Vec::<String>::new())
        .handle("finance.approve", |call| async move {
            let amount = call.session().get("refund_amount").await.map_err(handler_error)?;
            let amount = amount.ok_or_else(|| HandlerError::new(Code::FailedPrecondition, "no refund_amount"))?;
            Ok(Reply::text(format!(
                "approved {} (written by {}/{}) for {}",
                String::from_utf8_lossy(&amount.value),
                amount.writer_agent,
                amount.writer_instance,
                call.text()?
            )))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("finance agent");
    let b_addr = b.local_addr().to_string();
    let refund = Agent::builder("refund")
        .sidecar(b_addr.clone())
        .capability("refund.decide", Vec::<String>::new())
        .handle("refund.decide", move |call| {
            let b_addr = b_addr.clone();
            async move {
                call.session().set("refund_amount", "42.50").await.map_err(handler_error)?;
                let mesh =
                    Client::connect(&b_addr).await.map_err(|e| HandlerError::new(Code::Internal, e.to_string()))?;
                let reply = mesh
                    .invoke("finance.approve")
                    .session(call.session_id())
                    .text("approve")
                    .send()
                    .await
                    .map_err(|e| HandlerError::new(Code::Internal, e.to_string()))?;
                Ok(Reply::text(reply.text().into_owned()))
            }
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("refund agent");
    let refund_instance = refund.instance_id();
    agent_reach_e2e::wait_for_instances(a, &[refund_instance.clone(), finance.instance_id()]).await;
    agent_reach_e2e::wait_for_instances(b, &[refund_instance.clone(), finance.instance_id()]).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let reply = client.invoke("refund.decide").session("order-42").text("order 42").send().await.expect("chain");
    assert_eq!(reply.text(), format!("approved 42.50 (written by refund/{refund_instance}) for approve"));

    // The field is in the session for anyone of the tenant, with its writer and version.
    let snapshot = client.session("order-42").read().await.expect("read");
    assert!(snapshot.found);
    let field = &snapshot.fields["refund_amount"];
    assert_eq!((field.value.as_ref(), field.writer_agent.as_str()), (&b"42.50"[..], "refund"));
    assert_eq!(field.version, snapshot.version);
    mesh.stop(vec![refund, finance]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_field_written_by_b_is_read_by_c_on_etcd() {
    chain(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_field_written_by_b_is_read_by_c_on_redis() {
    chain(Sessions::Redis).await;
}

/// Policies refuse with typed errors naming the first writer or the current version;
/// reads of a followed session are answered from the sidecar's cache, never older than
/// the sidecar's own last write; other tenants and unregistered writers are refused.
async fn policies_and_cache(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 2).await;
    let (a, b) = (&mesh.sidecars[0], &mesh.sidecars[1]);
    let intake = agent_reach_e2e::echo_agent(a.local_addr(), "intake", &[("intake.start", &[])]).await;
    let audit = agent_reach_e2e::echo_agent(b.local_addr(), "audit", &[("audit.check", &[])]).await;
    let on_a = intake.client().session("s-7");
    let on_b = audit.client().session("s-7");

    let first = on_a.put_first("user_id", "u-1").await.expect("first writer");
    match on_b.put_first("user_id", "u-2").await {
        Err(SessionError::FieldLocked { field, writer_agent, writer_instance, version }) => {
            assert_eq!((field.as_str(), writer_agent.as_str()), ("user_id", "intake"));
            assert_eq!((writer_instance, version), (intake.instance_id(), first));
        }
        other => panic!("expected FieldLocked, got {other:?}"),
    }
    let counter = on_b.put([("n", "1", Policy::CompareAndSet(0))]).await.expect("create counter");
    match on_a.put([("n", "2", Policy::CompareAndSet(counter - 1))]).await {
        Err(SessionError::Conflict { field, current_version }) => {
            assert_eq!((field.as_str(), current_version), ("n", counter))
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    // A refused multi-field write stores nothing.
    let refused = on_a.put([("note", "x", Policy::LastWriter), ("user_id", "u-3", Policy::LastWriter)]).await;
    assert!(matches!(refused, Err(SessionError::FieldLocked { .. })), "{refused:?}");

    // Sidecar A follows s-7 (its agent wrote it): once the watch has the latest write,
    // reads cost no round trip.
    let hits = || a.session_stats().hits.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let snapshot = loop {
        let snapshot = on_a.read_at_least(counter).await.expect("read");
        if snapshot.cached {
            break snapshot;
        }
        assert!(tokio::time::Instant::now() < deadline, "sidecar A never answered s-7 from its cache");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(snapshot.version, counter);
    assert_eq!(snapshot.fields.len(), 2, "{:?}", snapshot.fields.keys());
    assert!(!snapshot.fields.contains_key("note"));
    let before = hits();
    for _ in 0..10 {
        assert!(on_a.read().await.unwrap().cached);
    }
    assert_eq!(hits(), before + 10);
    // Read-your-writes: right after its own write, a read is never older.
    let v = on_a.set("status", "open").await.unwrap();
    let snapshot = on_a.read().await.unwrap();
    assert!(snapshot.version >= v, "read {} after writing {v}", snapshot.version);
    assert_eq!(snapshot.fields["status"].value.as_ref(), b"open");

    // Another tenant and unregistered writers are refused.
    let mut raw = intake.client().raw();
    let other = raw
        .get_session(agent_reach::proto::GetSessionRequest {
            tenant: "other".into(),
            session_id: "s-7".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::PermissionDenied);
    let stranger = Client::connect(&a.local_addr().to_string()).await.unwrap().with_caller("ghost", "ghost-1");
    match stranger.session("s-7").set("x", "1").await {
        Err(SessionError::Status(s)) => {
            assert_eq!(agent_reach::reason::error_info(&s).unwrap().reason, "INSTANCE_NOT_FOUND");
        }
        other => panic!("expected INSTANCE_NOT_FOUND, got {other:?}"),
    }
    // Deleting the session ends it everywhere.
    assert!(on_b.delete(&[]).await.unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while on_a.read().await.unwrap().found {
        assert!(tokio::time::Instant::now() < deadline, "sidecar A still serves the deleted session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    mesh.stop(vec![intake, audit]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_and_cached_reads_on_etcd() {
    policies_and_cache(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_and_cached_reads_on_redis() {
    policies_and_cache(Sessions::Redis).await;
}

/// An agent whose handler reads its session (saying whether the read was a cache hit),
/// counts a turn in it, and answers "<instance>|cached=<bool>|turns=<n>".
async fn turn_agent(sidecar: &Sidecar) -> RunningAgent {
    Agent::builder("support")
        .sidecar(sidecar.local_addr().to_string())
        .capability("support.answer", Vec::<String>::new())
        .handle("support.answer", |call| async move {
            let session = call.session();
            let snapshot = session.read().await.map_err(handler_error)?;
            let turns = snapshot
                .fields
                .get("turns")
                .map(|f| String::from_utf8_lossy(&f.value).parse::<u64>().unwrap_or(0))
                .unwrap_or(0)
                + 1;
            session.set("turns", turns.to_string()).await.map_err(handler_error)?;
            Ok(Reply::text(format!("{}|cached={}|turns={turns}", call.instance_id(), snapshot.cached)))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("support agent")
}

/// The instance serving a session dies; the next call of the session lands on an instance
/// behind another sidecar, which fetches the session before delivering the call (and says
/// so in `ar-session-prewarmed`): the agent's first read there is a cache hit with the
/// whole context.
async fn prewarm(sessions: Sessions) {
    let mesh = Mesh::start(sessions, 3).await;
    let (a, b, c) = (&mesh.sidecars[0], &mesh.sidecars[1], &mesh.sidecars[2]);
    let mut agents = vec![turn_agent(b).await, turn_agent(c).await];
    let ids: Vec<String> = agents.iter().map(|a| a.instance_id()).collect();
    agent_reach_e2e::wait_for_instances(a, &ids).await;

    let client = Client::connect(&a.local_addr().to_string()).await.unwrap();
    let call = || {
        let mut raw = client.raw();
        async move {
            let request = agent_reach::proto::InvokeRequest {
                target: Some(agent_reach::proto::Target {
                    kind: Some(agent_reach::proto::target::Kind::Capability("support.answer".into())),
                    tags: vec![],
                }),
                session_id: "chat-1".into(),
                payload: bytes::Bytes::from_static(b"hello"),
                ..Default::default()
            };
            let reply = raw.invoke(request).await.expect("support call");
            let prewarmed = reply.metadata().get(agent_reach::headers::SESSION_PREWARMED).is_some();
            (String::from_utf8_lossy(&reply.get_ref().payload).into_owned(), prewarmed)
        }
    };
    let (first, _) = call().await;
    let served = first.split('|').next().unwrap().to_string();
    assert!(first.ends_with("|cached=false|turns=1"), "{first}");

    let dead = agents.iter().position(|agent| agent.instance_id() == served).expect("a known instance served");
    agents.remove(dead).abort();
    let (second, prewarmed) = call().await;
    let survivor = agents[0].instance_id();
    assert_eq!(second, format!("{survivor}|cached=true|turns=2"), "the first read on the new instance");
    assert!(prewarmed, "the reply must say the session was prewarmed");
    let stats = if dead == 0 { c.session_stats() } else { b.session_stats() };
    assert_eq!(stats.prewarms.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A session the sidecar already follows is not fetched again.
    let (third, prewarmed) = call().await;
    assert!(third.starts_with(&format!("{survivor}|")) && third.ends_with("|turns=3"), "{third}");
    assert!(!prewarmed, "a followed session was prewarmed again");
    mesh.stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_session_is_prewarmed_on_etcd() {
    prewarm(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_session_is_prewarmed_on_redis() {
    prewarm(Sessions::Redis).await;
}
