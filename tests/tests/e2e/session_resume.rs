//! A session watch across a restart of the watcher's sidecar, with sessions on a real etcd
//! and on a real `redis-server` (control's own routing store is etcd in both): the raw
//! stream ends with a clear UNAVAILABLE / `SHUTTING_DOWN` naming the version to resume
//! after, and the SDK's `Session::follow` resumes by itself from the last version it
//! delivered: the changes written while the sidecar was down arrive once each, in order.

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::Client;
use agent_reach::proto::SessionChange;
use agent_reach_control::ControlConfig;
use agent_reach_e2e::{
    Backend, TestStore, echo_agent, init_logging, listener, sidecar_config, start_control_with, start_sidecar,
};
use agent_reach_sidecar::Sidecar;
use futures_util::{Stream, StreamExt};
use tonic::Code;

use super::sessions::Sessions;

async fn rebind(addr: SocketAddr) -> tokio::net::TcpListener {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    }
}

async fn next_change<S>(changes: &mut S) -> SessionChange
where
    S: Stream<Item = Result<SessionChange, agent_reach::SessionError>> + Unpin,
{
    match tokio::time::timeout(Duration::from_secs(15), changes.next()).await {
        Ok(Some(Ok(change))) => change,
        other => panic!("expected a change, got {other:?}"),
    }
}

fn turn(change: &SessionChange) -> String {
    let field = change.put.iter().find(|f| f.name == "turn").expect("the change writes turn");
    String::from_utf8_lossy(&field.value).into_owned()
}

async fn resume(sessions: Sessions) {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let mut config = ControlConfig { lease_ttl: Duration::from_secs(20), ..ControlConfig::default() };
    let _redis = sessions.configure(&mut config).await;
    let control = start_control_with(ts.store.clone(), config, listener().await);
    let a = start_sidecar(sidecar_config(&control.endpoint(), "host-a")).await;
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let writer = echo_agent(b.local_addr(), "writer", &[("notes.write", &[])]).await;
    let by_writer = writer.client().session("talk-1");
    let start = by_writer.set("turn", "0").await.expect("first write");

    let local = a.local_addr();
    let watcher = Client::connect(&local.to_string()).await.unwrap().session("talk-1");
    let mut followed = Box::pin(watcher.follow(start, Duration::from_secs(30)));
    let mut raw = watcher.watch(start).await.expect("raw watch");
    let mut versions = Vec::new();
    for i in 1..=3 {
        versions.push(by_writer.set("turn", i.to_string()).await.expect("write"));
        let change = next_change(&mut followed).await;
        assert_eq!((change.version, turn(&change)), (versions[i - 1], i.to_string()));
        let change = tokio::time::timeout(Duration::from_secs(15), raw.message()).await.unwrap().unwrap().unwrap();
        assert_eq!(change.version, versions[i - 1]);
    }

    // The watcher's sidecar stops: the raw stream says to resume after the last version.
    a.stop().await;
    let status = tokio::time::timeout(Duration::from_secs(15), raw.message())
        .await
        .expect("the raw stream ends")
        .expect_err("with an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let info = agent_reach::reason::error_info(&status).expect("ErrorInfo");
    assert_eq!(info.reason, "SHUTTING_DOWN");
    assert_eq!(info.metadata["resume_after_version"], versions[2].to_string());

    // Writes while it is down, then the sidecar is back on the same address.
    for i in 4..=6 {
        versions.push(by_writer.set("turn", i.to_string()).await.expect("write"));
    }
    let config = agent_reach_e2e::secure::sidecar_identity(sidecar_config(&control.endpoint(), "host-a")).await;
    let a = Sidecar::start(config, rebind(local).await, listener().await).await.expect("sidecar A again");
    for i in 4..=7 {
        if i == 7 {
            versions.push(by_writer.set("turn", "7").await.expect("a write after the restart"));
        }
        let change = next_change(&mut followed).await;
        assert_eq!((change.version, turn(&change)), (versions[i - 1], i.to_string()), "no gap, no duplicate");
    }
    // Nothing else is pending: no change came twice.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), followed.next()).await.is_err(),
        "a change was delivered again"
    );

    writer.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_resumes_after_a_sidecar_restart_without_gaps_or_duplicates_on_etcd() {
    resume(Sessions::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_resumes_after_a_sidecar_restart_without_gaps_or_duplicates_on_redis() {
    resume(Sessions::Redis).await;
}
