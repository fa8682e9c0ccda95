//! The sidecar's session cache follows at most `MAX_CACHED` sessions at once, each with one
//! watch stream on its connection to control (at most 256 concurrent streams by default).
//! An agent touching many more sessions than that must not stall the connection: every
//! write completes, the cache holds exactly `MAX_CACHED` sessions (the least recently read
//! ones were dropped with their watches), and the sidecar's routing watch still works.

use std::time::Duration;

use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, listener, sidecar_config, start_sidecar_with_admin,
    wait_for_instances,
};

/// `GET path` on an admin port: the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sidecar_touching_many_sessions_keeps_its_control_connection_usable() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control =
        agent_reach_control::ControlHandle::spawn(ts.store.clone(), Default::default(), listener().await).unwrap();
    let mut config = sidecar_config(&control.endpoint(), "host-a");
    config.control_timeout = Duration::from_secs(3);
    let a = start_sidecar_with_admin(config).await;
    let agent = echo_agent(a.local_addr(), "busy", &[("busy.work", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;

    let max = agent_reach_sidecar::MAX_CACHED_SESSIONS;
    let sessions = 300;
    assert!(sessions > 256 && max < 256);
    let client = agent.client();
    for i in 0..sessions {
        // Each write makes the sidecar follow the session (a watch stream to control).
        client.session(format!("s-{i}")).set("f", "v").await.unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    // Every follow started, and all but MAX_CACHED were dropped to make room.
    let stats = a.session_stats();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while stats.watches_started.load(std::sync::atomic::Ordering::Relaxed) < sessions {
        assert!(tokio::time::Instant::now() < deadline, "follows never started: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = http_get(a.admin_addr().unwrap(), "/metrics").await;
    let followed = format!("agent_reach_session_cache_sessions {max}");
    assert!(metrics.lines().any(|l| l == followed), "{metrics}");
    assert_eq!(stats.watch_failures.load(std::sync::atomic::Ordering::Relaxed), 0);
    // The most recent session is a hit; the first one was dropped, so reading it is a miss.
    assert!(client.session(format!("s-{}", sessions - 1)).read().await.unwrap().cached);
    assert!(!client.session("s-0").read().await.unwrap().cached);
    // The connection still carries everything else: a new agent registers and is routable.
    let late = echo_agent(a.local_addr(), "late", &[("late.work", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id(), late.instance_id()]).await;

    agent.abort();
    late.abort();
    a.stop().await;
    control.shutdown().await;
}
