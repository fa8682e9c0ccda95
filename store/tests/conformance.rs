//! Both store backends against the conformance suite, and `EtcdStore` against a real etcd
//! that dies and comes back: calls fail fast with `Unavailable`, watches end with an error,
//! and the same store works again after a restart. Needs an etcd binary (see
//! `agent_reach_store::testing`); these tests fail, never skip, without one.

use std::future::Future;
use std::time::Duration;

use agent_reach_store::conformance::{self, Watcher, call};
use agent_reach_store::testing::EtcdServer;
use agent_reach_store::{Compare, EmbeddedStore, EtcdOptions, EtcdStore, Op, Store, StoreError, Txn};
use bytes::Bytes;
use tokio::time::Instant;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

fn start_etcd() -> EtcdServer {
    EtcdServer::start().unwrap_or_else(|error| panic!("{error}"))
}

async fn connect(server: &EtcdServer) -> EtcdStore {
    let options = EtcdOptions {
        user: None,
        tls: None,
        endpoints: vec![server.endpoint()],
        connect_timeout: Duration::from_secs(1),
        request_timeout: REQUEST_TIMEOUT,
    };
    EtcdStore::connect(options).await.unwrap_or_else(|error| panic!("connect: {error}"))
}

#[tokio::test]
async fn embedded_store_passes_the_conformance_suite() {
    conformance::run_all(&EmbeddedStore::default(), "/conformance").await;
}

#[tokio::test]
async fn etcd_store_passes_the_conformance_suite() {
    let server = start_etcd();
    let store = connect(&server).await;
    conformance::run_all(&store, "/conformance").await;
}

/// Asserts that a call fails with `Unavailable` within the request timeout (plus slack).
async fn fails_fast<T>(what: &str, call: impl Future<Output = Result<T, StoreError>>) {
    let started = Instant::now();
    let result = tokio::time::timeout(REQUEST_TIMEOUT * 5, call).await;
    let elapsed = started.elapsed();
    match result {
        Ok(Err(StoreError::Unavailable(_))) => {}
        Ok(Err(error)) => panic!("{what} with etcd dead: expected Unavailable, got {error:?}"),
        Ok(Ok(_)) => panic!("{what} with etcd dead succeeded"),
        Err(_) => panic!("{what} with etcd dead hung for {elapsed:?}"),
    }
    assert!(elapsed <= REQUEST_TIMEOUT * 2, "{what} took {elapsed:?} to fail");
}

#[tokio::test]
async fn etcd_store_fails_fast_when_etcd_dies() {
    let mut server = start_etcd();
    let store = connect(&server).await;
    let lease = call("grant_lease", store.grant_lease(Duration::from_secs(60))).await;
    call("keep_alive", store.keep_alive(lease.id)).await;
    let revision = call("put", store.put("/dies/k", Bytes::from_static(b"v"), Some(lease.id))).await;
    let mut watch = Watcher::open(&store, "/dies/", revision + 1).await;

    server.kill();
    let error = watch.error().await;
    assert!(matches!(error, StoreError::Unavailable(_)), "the watch ended with {error:?}");

    fails_fast("put", store.put("/dies/k", Bytes::from_static(b"w"), None)).await;
    fails_fast("get", store.get("/dies/k")).await;
    fails_fast("get_prefix", store.get_prefix("/dies/")).await;
    fails_fast("delete", store.delete("/dies/k")).await;
    let txn = Txn { compares: vec![Compare::ModRevision("/dies/k".into(), 0)], ..Txn::default() };
    fails_fast("txn", store.txn(txn)).await;
    fails_fast("grant_lease", store.grant_lease(Duration::from_secs(5))).await;
    fails_fast("keep_alive", store.keep_alive(lease.id)).await;
    fails_fast("revoke_lease", store.revoke_lease(lease.id)).await;
    fails_fast("watch_prefix", store.watch_prefix("/dies/", 1)).await;
    fails_fast("compact", store.compact(revision)).await;
    fails_fast("current_revision", store.current_revision()).await;

    // Connecting to a dead etcd fails too, rather than at the first request.
    let options = EtcdOptions {
        user: None,
        tls: None,
        endpoints: vec![server.endpoint()],
        connect_timeout: Duration::from_secs(1),
        request_timeout: REQUEST_TIMEOUT,
    };
    let started = Instant::now();
    let result = EtcdStore::connect(options).await;
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "connect: {result:?}");
    assert!(started.elapsed() <= REQUEST_TIMEOUT * 3, "connect took {:?}", started.elapsed());
}

/// Retries a call until it succeeds, for up to 15 s (the client reconnects with backoff).
async fn eventually<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(error) if Instant::now() >= deadline => panic!("{what} still fails: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test]
async fn etcd_store_works_again_after_etcd_restarts() {
    let mut server = start_etcd();
    let store = connect(&server).await;
    let lease = call("grant_lease", store.grant_lease(Duration::from_secs(60))).await;
    call("keep_alive", store.keep_alive(lease.id)).await;
    let r1 = call("put", store.put("/restart/a", Bytes::from_static(b"1"), Some(lease.id))).await;

    server.kill();
    fails_fast("keep_alive", store.keep_alive(lease.id)).await;
    server.restart().unwrap_or_else(|error| panic!("{error}"));

    let r2 = eventually("put", || store.put("/restart/b", Bytes::from_static(b"2"), None)).await;
    assert_eq!(r2, r1 + 1, "the data survived the restart");
    // The keep-alive stream is reopened; the lease survived the restart.
    let ttl = eventually("keep_alive", || store.keep_alive(lease.id)).await;
    assert_eq!(ttl, Duration::from_secs(60));
    let a = call("get", store.get("/restart/a")).await.expect("/restart/a survived");
    assert_eq!((a.mod_revision, a.lease), (r1, lease.id));
    let mut watch = Watcher::open(&store, "/restart/", r1).await;
    let keys: Vec<_> = watch.events(2).await.into_iter().map(|event| event.kv.key).collect();
    assert_eq!(keys, ["/restart/a", "/restart/b"]);
    call("revoke_lease", store.revoke_lease(lease.id)).await;
    assert_eq!(call("get", store.get("/restart/a")).await, None);
}

#[tokio::test]
async fn keep_alives_share_one_etcd_stream() {
    let server = start_etcd();
    let store = connect(&server).await;
    let mut leases = Vec::new();
    for _ in 0..50 {
        leases.push(call("grant_lease", store.grant_lease(Duration::from_secs(30))).await.id);
    }
    let revoked = call("grant_lease", store.grant_lease(Duration::from_secs(30))).await.id;
    call("revoke_lease", store.revoke_lease(revoked)).await;

    // 20 rounds of concurrent keep-alives of every lease, with a revoked one among them.
    let mut calls = Vec::new();
    for round in 0..20 {
        for &lease in &leases {
            calls.push((lease, store.keep_alive(lease)));
        }
        if round % 5 == 0 {
            calls.push((revoked, store.keep_alive(revoked)));
        }
    }
    let (ids, futures): (Vec<_>, Vec<_>) = calls.into_iter().unzip();
    let results = futures_util::future::join_all(futures).await;
    for (lease, result) in ids.into_iter().zip(results) {
        if lease == revoked {
            assert_eq!(result, Err(StoreError::LeaseNotFound(revoked)));
        } else {
            assert_eq!(result, Ok(Duration::from_secs(30)), "keep-alive of lease {lease:x}");
        }
    }

    let metrics = server.metrics().unwrap_or_else(|error| panic!("{error}"));
    let streams: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("grpc_server_started_total") && line.contains("LeaseKeepAlive"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(streams, 1.0, "keep-alive streams opened:\n{metrics}");
}

#[tokio::test]
async fn dropping_a_watch_cancels_it_in_etcd() {
    let server = start_etcd();
    let store = connect(&server).await;
    let revision = call("current_revision", store.current_revision()).await;
    let watches = [
        Watcher::open(&store, "/drop/a/", revision + 1).await,
        Watcher::open(&store, "/drop/b/", revision + 1).await,
        Watcher::open(&store, "/drop/c/", 1).await,
    ];
    let watchers = || server.metric("etcd_debugging_mvcc_watcher_total").unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(watchers(), 3.0);
    drop(watches);
    let deadline = Instant::now() + Duration::from_secs(5);
    while watchers() > 0.0 {
        assert!(Instant::now() < deadline, "etcd still has {} watchers", watchers());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection is still fine for new work.
    let txn = Txn { success: vec![Op::Delete { key: "/drop/a/x".into() }], ..Txn::default() };
    assert!(call("txn", store.txn(txn)).await.succeeded);
}
