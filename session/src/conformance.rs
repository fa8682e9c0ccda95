//! The conformance suite: exact behaviours every [`SessionStore`] backend passes (feature
//! `test-util`).
//!
//! Cases assert exact counts, versions, writers and error variants, and bound every wait
//! with a timeout so a broken backend fails instead of hanging. Run the suite on a store
//! built with [`limits`] (small sizes and a short TTL, so the limit and expiry cases run
//! quickly). Each run uses tenants of its own, so runs can share one etcd or Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::timeout;

use crate::{Change, ChangeStream, FieldWrite, Limits, SessionError, SessionStore, Version, WritePolicy, Writer};

/// Longest wait for one call or one watched change.
const WAIT: Duration = Duration::from_secs(10);

/// The limits the suite expects the store under test to have.
pub fn limits() -> Limits {
    Limits {
        ttl: Duration::from_secs(3),
        max_field_bytes: 1024,
        max_session_bytes: 4096,
        max_fields: 16,
        max_sessions_per_tenant: 5,
    }
}

/// Runs every case, each on its own tenant.
pub async fn run_all(store: Arc<dyn SessionStore>) {
    assert_eq!(store.limits(), &limits(), "build the store under test with conformance::limits()");
    let run = unique();
    let tenant = |case: &str| format!("{case}-{run}");
    put_and_get(&*store, &tenant("get")).await;
    last_writer(&*store, &tenant("last")).await;
    multi_field_writes_are_atomic(&*store, &tenant("atomic")).await;
    first_writer_race(store.clone(), &tenant("first")).await;
    compare_and_set_counter(store.clone(), &tenant("cas")).await;
    limits_refuse_and_store_nothing(&*store, &tenant("limits")).await;
    session_cap_per_tenant(&*store, &tenant("cap")).await;
    deletes(&*store, &tenant("delete")).await;
    watch_resumes_without_gaps_or_duplicates(&*store, &tenant("watch")).await;
    ttl_expiry(&*store, &tenant("ttl")).await;
}

fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("r{}x{}", nanos % 1_000_000_000_000, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Awaits a store call (bounded), panicking on timeout.
pub async fn call<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    timeout(WAIT, f).await.unwrap_or_else(|_| panic!("{what} took more than {WAIT:?}"))
}

fn writer(n: usize) -> Writer {
    Writer::new(format!("agent-{n}"), format!("agent-{n}-i"))
}

fn lw(name: &str, value: &str) -> FieldWrite {
    FieldWrite::new(name, value.to_string(), WritePolicy::LastWriter)
}

/// Fields written in one put share its version, which reads then report; versions grow.
pub async fn put_and_get(store: &dyn SessionStore, tenant: &str) {
    assert_eq!(call("get", store.get(tenant, "s")).await, Ok(None), "a session never written");
    let w = writer(1);
    let first = call("put", store.put(tenant, "s", &w, vec![lw("a", "1"), lw("b", "2").content_type("text/plain")]))
        .await
        .expect("first put");
    let session = call("get", store.get(tenant, "s")).await.expect("get").expect("the session exists");
    assert_eq!(session.version, first.version);
    assert_eq!(session.fields.len(), 2);
    let b = &session.fields["b"];
    assert_eq!((b.value.as_ref(), b.content_type.as_str(), b.version), (&b"2"[..], "text/plain", first.version));
    assert_eq!(b.writer, w);
    assert!(!b.locked);
    assert!(b.written_at_ms > 0);
    let second = call("put", store.put(tenant, "s", &w, vec![lw("a", "3")])).await.expect("second put");
    assert!(second.version > first.version, "versions grow: {first:?} then {second:?}");
    let session = call("get", store.get(tenant, "s")).await.unwrap().unwrap();
    assert_eq!(
        (session.version, session.fields["a"].version, session.fields["b"].version),
        (second.version, second.version, first.version)
    );
    assert_eq!(session.fields["a"].value, Bytes::from_static(b"3"));
    // Another tenant's session of the same id is another session.
    assert_eq!(call("get", store.get(&format!("{tenant}-other"), "s")).await, Ok(None));
}

/// `last_writer`: the later write wins and names its writer.
pub async fn last_writer(store: &dyn SessionStore, tenant: &str) {
    call("put", store.put(tenant, "s", &writer(1), vec![lw("status", "open")])).await.unwrap();
    let later = call("put", store.put(tenant, "s", &writer(2), vec![lw("status", "closed")])).await.unwrap();
    let field = call("get", store.get(tenant, "s")).await.unwrap().unwrap().fields["status"].clone();
    assert_eq!((field.value, field.writer, field.version), (Bytes::from_static(b"closed"), writer(2), later.version));
}

/// A write of several fields stores all or none; policies are per field.
pub async fn multi_field_writes_are_atomic(store: &dyn SessionStore, tenant: &str) {
    let locked = FieldWrite::new("user_id", "u1", WritePolicy::FirstWriter);
    let v1 = call("put", store.put(tenant, "s", &writer(1), vec![locked, lw("a", "1")])).await.unwrap().version;
    let refused = call(
        "put",
        store.put(
            tenant,
            "s",
            &writer(2),
            vec![lw("a", "2"), lw("new", "x"), FieldWrite::new("user_id", "u2", WritePolicy::LastWriter)],
        ),
    )
    .await;
    assert_eq!(refused, Err(SessionError::FieldLocked { field: "user_id".into(), writer: writer(1), version: v1 }));
    let cas = FieldWrite::new("a", "3", WritePolicy::CompareAndSet { expected: v1 + 1000 });
    let refused = call("put", store.put(tenant, "s", &writer(2), vec![lw("new", "x"), cas])).await;
    assert_eq!(refused, Err(SessionError::Conflict { field: "a".into(), expected: v1 + 1000, current: v1 }));
    let session = call("get", store.get(tenant, "s")).await.unwrap().unwrap();
    assert_eq!(session.version, v1, "a refused write changed the session");
    assert_eq!(session.fields.keys().collect::<Vec<_>>(), ["a", "user_id"]);
    assert_eq!(session.fields["a"].value, Bytes::from_static(b"1"));
    assert!(session.fields["user_id"].locked);
}

/// `first_writer`: of 20 concurrent writers exactly one value stands; the 19 others are
/// refused with `FieldLocked` naming the winner.
pub async fn first_writer_race(store: Arc<dyn SessionStore>, tenant: &str) {
    const WRITERS: usize = 20;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|n| {
            let (store, tenant) = (store.clone(), tenant.to_string());
            tokio::spawn(async move {
                let write = FieldWrite::new("user_id", format!("user-{n}"), WritePolicy::FirstWriter);
                store.put(&tenant, "race", &writer(n), vec![write]).await
            })
        })
        .collect();
    let mut won = Vec::new();
    let mut locked = Vec::new();
    for (n, task) in tasks.into_iter().enumerate() {
        match call("join", task).await.expect("writer task") {
            Ok(written) => won.push((n, written.version)),
            Err(SessionError::FieldLocked { field, writer, version }) => {
                assert_eq!(field, "user_id");
                locked.push((writer, version));
            }
            Err(other) => panic!("writer {n}: {other:?}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one first writer: {won:?}");
    assert_eq!(locked.len(), WRITERS - 1);
    let (winner, version) = won[0];
    for (named, at) in &locked {
        assert_eq!((named, *at), (&writer(winner), version), "a refusal must name the winner");
    }
    let field = call("get", store.get(tenant, "race")).await.unwrap().unwrap().fields["user_id"].clone();
    assert_eq!((field.value, field.writer), (Bytes::from(format!("user-{winner}")), writer(winner)));
}

/// `compare_and_set`: 10 writers × 100 increments with retries on conflict → exactly 1,000.
pub async fn compare_and_set_counter(store: Arc<dyn SessionStore>, tenant: &str) {
    const WRITERS: usize = 10;
    const INCREMENTS: usize = 100;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|n| {
            let (store, tenant) = (store.clone(), tenant.to_string());
            tokio::spawn(async move {
                let mut conflicts = 0u64;
                for _ in 0..INCREMENTS {
                    loop {
                        let session = store.get(&tenant, "counter").await.expect("get");
                        let (value, version) = session
                            .and_then(|s| s.fields.get("n").cloned())
                            .map(|f| (std::str::from_utf8(&f.value).unwrap().parse::<u64>().unwrap(), f.version))
                            .unwrap_or((0, 0));
                        let write = FieldWrite::new(
                            "n",
                            (value + 1).to_string(),
                            WritePolicy::CompareAndSet { expected: version },
                        );
                        match store.put(&tenant, "counter", &writer(n), vec![write]).await {
                            Ok(_) => break,
                            Err(SessionError::Conflict { current, .. }) => {
                                assert_ne!(current, version, "a conflict must report the newer version");
                                conflicts += 1;
                            }
                            Err(other) => panic!("writer {n}: {other:?}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    for task in tasks {
        timeout(Duration::from_secs(120), task).await.expect("the counter writers took too long").expect("writer task");
    }
    let field = call("get", store.get(tenant, "counter")).await.unwrap().unwrap().fields["n"].clone();
    assert_eq!(field.value, Bytes::from(format!("{}", WRITERS * INCREMENTS)));
}

/// Oversize fields and sessions and too many fields are refused with their reason, and
/// nothing of the refused write is stored.
pub async fn limits_refuse_and_store_nothing(store: &dyn SessionStore, tenant: &str) {
    let l = limits();
    let big = "x".repeat(l.max_field_bytes);
    let refused = call("put", store.put(tenant, "s", &writer(1), vec![lw("small", "1"), lw("big", &big)])).await;
    assert_eq!(
        refused,
        Err(SessionError::FieldTooLarge { field: "big".into(), size: l.max_field_bytes + 3, limit: l.max_field_bytes })
    );
    assert_eq!(call("get", store.get(tenant, "s")).await, Ok(None), "a refused first write created the session");

    // Three fields of 1,000 bytes fit in 4,096; a fourth and fifth do not.
    let chunk = "y".repeat(1000 - 2);
    let names = ["f1", "f2", "f3"];
    let writes: Vec<_> = names.iter().map(|n| lw(n, &chunk)).collect();
    let v = call("put", store.put(tenant, "s", &writer(1), writes)).await.unwrap().version;
    let refused = call("put", store.put(tenant, "s", &writer(1), vec![lw("f4", &chunk), lw("f5", &chunk)])).await;
    assert_eq!(refused, Err(SessionError::SessionTooLarge { size: 5000, limit: l.max_session_bytes }));
    // Replacing a field counts its new size only.
    let v2 = call("put", store.put(tenant, "s", &writer(1), vec![lw("f1", &chunk), lw("f4", &chunk)]))
        .await
        .unwrap()
        .version;
    assert!(v2 > v);
    let session = call("get", store.get(tenant, "s")).await.unwrap().unwrap();
    assert_eq!((session.version, session.fields.len(), session.size()), (v2, 4, 4000));

    let many: Vec<_> = (0..l.max_fields).map(|i| lw(&format!("m{i}"), "1")).collect();
    call("put", store.put(tenant, "t", &writer(1), many)).await.expect("exactly max_fields fit");
    let refused = call("put", store.put(tenant, "t", &writer(1), vec![lw("one-more", "1")])).await;
    assert_eq!(refused, Err(SessionError::TooManyFields { count: l.max_fields + 1, limit: l.max_fields }));
    assert_eq!(call("get", store.get(tenant, "t")).await.unwrap().unwrap().fields.len(), l.max_fields);

    let refused = call("put", store.put(tenant, "bad/id", &writer(1), vec![lw("a", "1")])).await;
    assert!(matches!(refused, Err(SessionError::Invalid { ref field, .. }) if field == "session"), "{refused:?}");
}

/// A tenant holds at most `max_sessions_per_tenant` live sessions; existing ones stay
/// writable at the cap, and deleting one frees a place.
pub async fn session_cap_per_tenant(store: &dyn SessionStore, tenant: &str) {
    let cap = limits().max_sessions_per_tenant;
    for i in 0..cap {
        call("put", store.put(tenant, &format!("s{i}"), &writer(1), vec![lw("a", "1")])).await.unwrap();
    }
    assert_eq!(call("live_sessions", store.live_sessions(tenant)).await, Ok(cap as u64));
    let refused = call("put", store.put(tenant, "one-more", &writer(1), vec![lw("a", "1")])).await;
    assert_eq!(refused, Err(SessionError::TooManySessions { limit: cap }));
    assert_eq!(call("get", store.get(tenant, "one-more")).await, Ok(None));
    call("put", store.put(tenant, "s0", &writer(1), vec![lw("a", "2")])).await.expect("an existing session at the cap");
    // Another tenant is not affected.
    call("put", store.put(&format!("{tenant}-b"), "x", &writer(1), vec![lw("a", "1")])).await.unwrap();
    assert!(call("delete", store.delete(tenant, "s1", &[])).await.unwrap().is_some());
    assert_eq!(call("live_sessions", store.live_sessions(tenant)).await, Ok(cap as u64 - 1));
    call("put", store.put(tenant, "one-more", &writer(1), vec![lw("a", "1")])).await.expect("a freed place");
}

/// Field deletes (not of locked fields) and session deletes.
pub async fn deletes(store: &dyn SessionStore, tenant: &str) {
    let locked = FieldWrite::new("k", "1", WritePolicy::FirstWriter);
    let v1 = call("put", store.put(tenant, "s", &writer(1), vec![locked, lw("a", "1"), lw("b", "2")]))
        .await
        .unwrap()
        .version;
    assert_eq!(
        call("delete", store.delete(tenant, "s", &["a".into(), "k".into()])).await,
        Err(SessionError::FieldLocked { field: "k".into(), writer: writer(1), version: v1 })
    );
    let v2 =
        call("delete", store.delete(tenant, "s", &["a".into(), "missing".into()])).await.unwrap().expect("deleted");
    assert!(v2 > v1);
    let session = call("get", store.get(tenant, "s")).await.unwrap().unwrap();
    assert_eq!(
        (session.version, session.fields.keys().cloned().collect::<Vec<_>>()),
        (v2, vec!["b".to_string(), "k".to_string()])
    );
    assert_eq!(call("delete", store.delete(tenant, "s", &["missing".into()])).await, Ok(None));
    assert!(call("delete", store.delete(tenant, "s", &[])).await.unwrap().is_some());
    assert_eq!(call("get", store.get(tenant, "s")).await, Ok(None));
    assert_eq!(call("delete", store.delete(tenant, "s", &[])).await, Ok(None));
    // A deleted session starts over, first writer locks included.
    call("put", store.put(tenant, "s", &writer(2), vec![FieldWrite::new("k", "2", WritePolicy::FirstWriter)]))
        .await
        .unwrap();
    assert_eq!(call("get", store.get(tenant, "s")).await.unwrap().unwrap().fields["k"].writer, writer(2));
}

async fn next_change(watch: &mut ChangeStream) -> Change {
    match timeout(WAIT, watch.next()).await {
        Ok(Some(Ok(change))) => change,
        Ok(Some(Err(e))) => panic!("the watch failed: {e:?}"),
        Ok(None) => panic!("the watch ended"),
        Err(_) => panic!("no change within {WAIT:?}"),
    }
}

/// A watch delivers every change after its version once, in order; a new watch from the
/// last version seen continues exactly where the first stopped; a delete ends it.
pub async fn watch_resumes_without_gaps_or_duplicates(store: &dyn SessionStore, tenant: &str) {
    let v0 = call("put", store.put(tenant, "s", &writer(1), vec![lw("n", "0")])).await.unwrap().version;
    let mut watch = call("watch", store.watch(tenant, "s", v0)).await.expect("watch");
    let mut written: Vec<Version> = Vec::new();
    for i in 1..=5 {
        written.push(
            call("put", store.put(tenant, "s", &writer(1), vec![lw("n", &i.to_string())])).await.unwrap().version,
        );
    }
    let mut seen = Vec::new();
    for i in 1..=3 {
        match next_change(&mut watch).await {
            Change::Put { version, fields } => {
                assert_eq!(fields["n"].value, Bytes::from(i.to_string()));
                assert_eq!(fields["n"].writer, writer(1));
                seen.push(version);
            }
            other => panic!("expected a put, got {other:?}"),
        }
    }
    drop(watch);
    // Writes while no one watches, including a field delete.
    written
        .push(call("put", store.put(tenant, "s", &writer(2), vec![lw("m", "x"), lw("n", "6")])).await.unwrap().version);
    written.push(call("delete", store.delete(tenant, "s", &["m".into()])).await.unwrap().unwrap());

    let mut watch = call("watch", store.watch(tenant, "s", *seen.last().unwrap())).await.expect("resumed watch");
    for _ in 0..2 {
        match next_change(&mut watch).await {
            Change::Put { version, .. } => seen.push(version),
            other => panic!("expected a put, got {other:?}"),
        }
    }
    match next_change(&mut watch).await {
        Change::Put { version, fields } => {
            assert_eq!(fields.keys().collect::<Vec<_>>(), ["m", "n"]);
            assert_eq!(fields["m"].writer, writer(2));
            seen.push(version);
        }
        other => panic!("expected the two-field put, got {other:?}"),
    }
    match next_change(&mut watch).await {
        Change::Removed { version, fields } => {
            assert_eq!(fields, ["m"]);
            seen.push(version);
        }
        other => panic!("expected the field delete, got {other:?}"),
    }
    assert_eq!(seen, written, "every change exactly once, in order");
    let deleted = call("delete", store.delete(tenant, "s", &[])).await.unwrap().unwrap();
    assert_eq!(next_change(&mut watch).await, Change::Ended { version: deleted });
    assert!(timeout(WAIT, watch.next()).await.expect("the watch must end").is_none());
}

/// A session not written for its TTL is gone (and its watch says it ended); writes
/// within the TTL keep it alive.
pub async fn ttl_expiry(store: &dyn SessionStore, tenant: &str) {
    let ttl = limits().ttl;
    call("put", store.put(tenant, "kept", &writer(1), vec![lw("a", "1")])).await.unwrap();
    let v = call("put", store.put(tenant, "s", &writer(1), vec![lw("a", "1")])).await.unwrap().version;
    let mut watch = call("watch", store.watch(tenant, "s", v)).await.expect("watch");
    tokio::time::sleep(ttl / 2).await;
    call("put", store.put(tenant, "kept", &writer(1), vec![lw("a", "2")])).await.unwrap();
    tokio::time::sleep(ttl / 2 + ttl / 4).await;
    // 1.25 TTL after its first write and 0.75 after its second: kept is alive.
    assert!(call("get", store.get(tenant, "kept")).await.unwrap().is_some(), "a write must refresh the TTL");
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(5);
    while call("get", store.get(tenant, "s")).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the session outlived its TTL by 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(matches!(next_change(&mut watch).await, Change::Ended { .. }), "an expiry ends the watch");
}
