//! `EtcdStore` on an etcd with authentication enabled (etcd RBAC): with its user and
//! password it passes the whole conformance suite inside the prefix its role may use; with
//! a wrong password it does not connect; without a user, or outside its prefix, etcd refuses.
//! Needs an etcd binary (see `agent_reach_store::testing`); fails, never skips, without one.

use std::time::Duration;

use agent_reach_store::conformance;
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EtcdOptions, EtcdStore, EtcdUser, Store};
use bytes::Bytes;
use etcd_client::{Client, Permission};

fn options(server: &EtcdServer, user: Option<(&str, &str)>) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![server.endpoint()],
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        tls: None,
        user: user.map(|(name, password)| EtcdUser { name: name.into(), password: password.into() }),
    }
}

/// Turns on authentication: `root`, and `agent-reach` with read-write on `/agent-reach/`.
async fn enable_auth(server: &EtcdServer) {
    let mut root = Client::connect([server.endpoint()], None).await.expect("connect as admin");
    root.user_add("root", "root-password", None).await.expect("add root");
    root.user_grant_role("root", "root").await.expect("root role");
    root.role_add("agent-reach").await.expect("add role");
    root.role_grant_permission("agent-reach", Permission::read_write("/agent-reach/").with_prefix())
        .await
        .expect("grant /agent-reach/");
    root.user_add("agent-reach", "s3cret-password", None).await.expect("add user");
    root.user_grant_role("agent-reach", "agent-reach").await.expect("grant role");
    root.auth_enable().await.expect("enable auth");
}

#[tokio::test]
async fn etcd_store_works_with_a_user_and_password_and_not_without() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    enable_auth(&server).await;

    let store = EtcdStore::connect(options(&server, Some(("agent-reach", "s3cret-password"))))
        .await
        .unwrap_or_else(|e| panic!("connect with the user: {e}"));
    conformance::run_all(&store, "/agent-reach/conformance").await;
    let outside = store.put("/elsewhere/x", Bytes::from_static(b"v"), None).await;
    assert!(outside.is_err(), "the role only covers /agent-reach/: {outside:?}");

    let wrong = EtcdStore::connect(options(&server, Some(("agent-reach", "wrong-password")))).await;
    assert!(wrong.is_err(), "a wrong password must not connect");

    // Without a user, etcd refuses the requests (connecting itself may succeed).
    match EtcdStore::connect(options(&server, None)).await {
        Err(_) => {}
        Ok(anonymous) => {
            let put = anonymous.put("/agent-reach/x", Bytes::from_static(b"v"), None).await;
            assert!(put.is_err(), "an anonymous client must not write: {put:?}");
        }
    }
}
