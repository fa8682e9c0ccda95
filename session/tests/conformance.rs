//! Both session backends against the conformance suite: the store backend on a real etcd
//! and on the embedded store, the Redis backend on a real `redis-server`. Needs the etcd and
//! redis-server binaries; these tests fail, never skip, without them.

use std::sync::Arc;
use std::time::Duration;

use agent_reach_session::conformance;
use agent_reach_session::testing::RedisServer;
use agent_reach_session::{KvSessions, RedisSessions};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{EmbeddedStore, EtcdOptions, EtcdStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_sessions_pass_the_conformance_suite() {
    let server = EtcdServer::start().unwrap_or_else(|e| panic!("{e}"));
    let options = EtcdOptions {
        user: None,
        tls: None,
        endpoints: vec![server.endpoint()],
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
    };
    let store = EtcdStore::connect(options).await.unwrap_or_else(|e| panic!("connect: {e}"));
    conformance::run_all(Arc::new(KvSessions::new(Arc::new(store), conformance::limits()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_sessions_pass_the_conformance_suite() {
    let store = Arc::new(EmbeddedStore::default());
    conformance::run_all(Arc::new(KvSessions::new(store, conformance::limits()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sessions_pass_the_conformance_suite() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let sessions = RedisSessions::connect(&server.url(), conformance::limits()).await.unwrap_or_else(|e| panic!("{e}"));
    conformance::run_all(Arc::new(sessions)).await;
}
