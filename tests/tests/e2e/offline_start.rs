//! A sidecar with identity starts while control is down: the certificate and key it
//! received are kept in its identity file (mode 0600) and reused, with its saved routing
//! table, so it routes over mutual TLS without asking control. Real etcd, certificates
//! made by the harness's CA.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agent_reach::Client;
use agent_reach_e2e::*;
use agent_reach_sidecar::Sidecar;

async fn bind_again(addr: std::net::SocketAddr) -> tokio::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_identity_restarts_while_control_is_down_from_its_saved_certificate() {
    init_logging();
    let ts = TestStore::start(Backend::Etcd).await;
    let control = start_control(ts.store.clone(), Duration::from_secs(15)).await;
    let state = tempfile::tempdir().unwrap();
    let identity_file = state.path().join("host-a.identity.json");
    let mut config_a = sidecar_config(&control.endpoint(), "host-a");
    config_a.table_file = Some(state.path().join("host-a.table.json"));
    config_a.identity_file = Some(identity_file.clone());
    let config_a = secure::sidecar_identity(config_a).await;
    assert!(config_a.identity.is_some(), "the harness gives sidecar A an identity");
    let a_local = listener().await;
    let a_addr = a_local.local_addr().unwrap();
    let a = Sidecar::start(config_a.clone(), a_local, listener().await).await.expect("sidecar A");
    let b = start_sidecar(sidecar_config(&control.endpoint(), "host-b")).await;
    let agent = echo_agent(b.local_addr(), "echo", &[("echo", &[])]).await;
    wait_for_instances(&a, &[agent.instance_id()]).await;
    // The table saver writes within about a second of a change.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(a.identity_stats().unwrap().issued.load(Ordering::Relaxed), 1);
    let mode = std::fs::metadata(&identity_file).expect("the certificate is kept").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the sidecar's user may read its key");
    let saved = std::fs::read(&identity_file).unwrap();
    a.stop().await;
    control.shutdown().await;

    // Control is down. Without the file, a sidecar with identity cannot start...
    let mut without_file = config_a.clone();
    without_file.identity_file = None;
    let refused =
        tokio::time::timeout(Duration::from_secs(30), Sidecar::start(without_file, listener().await, listener().await))
            .await
            .expect("the start gives up");
    assert!(refused.is_err(), "no certificate without control and without the file");

    // ...with it, A starts from its saved certificate and table and calls B's agent over
    // the mutual-TLS mesh.
    let started = Instant::now();
    let a = Sidecar::start(config_a.clone(), bind_again(a_addr).await, listener().await)
        .await
        .expect("sidecar A starts while control is down");
    assert!(started.elapsed() < Duration::from_secs(5), "started without waiting for control: {:?}", started.elapsed());
    assert_eq!(a.identity_stats().unwrap().issued.load(Ordering::Relaxed), 0, "no certificate was bought");
    let client = Client::connect(&a_addr.to_string()).await.unwrap();
    for i in 0..20 {
        let reply = client.invoke("echo").text(format!("call {i}")).send().await.expect("a call over the saved route");
        assert_eq!(reply.instance(), agent.instance_id());
    }
    assert_eq!(agent.handled(), 20);
    assert_eq!(std::fs::read(&identity_file).unwrap(), saved, "the saved certificate was reused as it was");
    agent.abort();
    a.stop().await;
    b.stop().await;
}

/// Every renewed certificate is kept too: with 3 s certificates (renewed at two thirds of
/// their lifetime) the file soon holds a newer certificate of the same identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_renewed_certificate_is_kept() {
    use crate::identity::{anonymous_channel, create_token, identity_settings, mtls_control};
    init_logging();
    let store = TestStore::start(Backend::Embedded).await;
    let control = mtls_control(&store, Duration::from_secs(3)).await;
    let mut admin = agent_reach::proto::admin_client::AdminClient::new(anonymous_channel(&control));
    let (_, token) = create_token(&mut admin, "default", 0, false).await;
    let state = tempfile::tempdir().unwrap();
    let identity_file = state.path().join("renewing.identity.json");
    let mut config = sidecar_config(&control.endpoint(), "renewing");
    config.identity = Some(identity_settings(&control, &token));
    config.identity_file = Some(identity_file.clone());
    let sidecar = start_sidecar(config).await;
    let read = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(&identity_file).unwrap()).unwrap() };
    let first = read();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sidecar.identity_stats().unwrap().issued.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "no renewal within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed = read();
    assert_ne!(renewed["certificate_pem"], first["certificate_pem"], "the renewed certificate replaced the first");
    assert_ne!(renewed["private_key_pkcs8_base64"], first["private_key_pkcs8_base64"], "with its new key");
    assert_eq!(renewed["identity"], first["identity"]);
    assert_eq!(std::fs::metadata(&identity_file).unwrap().permissions().mode() & 0o777, 0o600);
    sidecar.stop().await;
    control.shutdown().await;
}
