//! The session delivered with a call (`HandleRequest.session`): a handler's
//! `call.session()` reads are answered in-process from it, with no read reaching the
//! sidecar (its cache's hit and miss counts do not move), its own writes read back from
//! it; the next call carries the session with that write; a call delivered by the same
//! sidecar (no mesh hop) gets it too; a session over `--session-snapshot-max-bytes` is
//! not delivered and the same reads go to the sidecar, with the same answers. Real etcd.

use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::{Agent, Client, HandlerError, Policy, Reply, SessionError, proto};
use agent_reach_e2e::{sidecar_config, start_sidecar, wait_for_instances};
use agent_reach_sidecar::Sidecar;
use tonic::Code;

use crate::sessions::{Mesh, Sessions};

fn handler_error(e: SessionError) -> HandlerError {
    HandlerError::new(e.code(), e.to_string())
}

fn text(field: Option<proto::SessionField>) -> String {
    field.map_or("-".into(), |f| String::from_utf8_lossy(&f.value).into_owned())
}

/// (hits, misses, snapshots attached, snapshots too large, prewarms) of `sidecar`.
fn counts(sidecar: &Sidecar) -> (u64, u64, u64, u64, u64) {
    let s = sidecar.session_stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    (load(&s.hits), load(&s.misses), load(&s.snapshots), load(&s.snapshots_too_large), load(&s.prewarms))
}

/// Reads until the sidecar's cache answers `session` fresh (its watch has the sidecar's
/// own last write): then a call carrying it gets it.
async fn until_fresh(sidecar: &Sidecar, session: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let request = proto::GetSessionRequest { session_id: session.into(), ..Default::default() };
        if sidecar.session_cache().get(request).await.expect("read").cached {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{session} never became fresh in the cache");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handler_reads_come_from_the_delivered_session_within_its_size_limit() {
    let mut mesh = Mesh::start(Sessions::Etcd, 1).await;
    let mut config = sidecar_config(&mesh.control.endpoint(), "target");
    config.session_snapshot_max_bytes = 4096;
    mesh.sidecars.push(start_sidecar(config).await);
    let (caller, target) = (&mesh.sidecars[0], &mesh.sidecars[1]);

    // Reads order_id, a field that does not exist and status; with the payload "write",
    // sets status and reads it back.
    let reader = Agent::builder("reader")
        .sidecar(target.local_addr().to_string())
        .capability("read.it", Vec::<String>::new())
        .handle("read.it", |call| async move {
            let s = call.session();
            let delivered = s.delivered_version();
            let order = text(s.get("order_id").await.map_err(handler_error)?);
            let missing = s.get("missing").await.map_err(handler_error)?.is_none();
            let before = text(s.get("status").await.map_err(handler_error)?);
            let (mut wrote, mut after) = (0, "-".to_string());
            if call.text()? == "write" {
                wrote = s.set("status", "seen").await.map_err(handler_error)?;
                let status = s.get("status").await.map_err(handler_error)?;
                let status = status.ok_or_else(|| HandlerError::new(Code::Internal, "own write not read back"))?;
                if status.version != wrote || status.writer_agent != "reader" {
                    return Err(HandlerError::new(Code::Internal, format!("own write read back as {status:?}")));
                }
                after = String::from_utf8_lossy(&status.value).into_owned();
            }
            Ok(Reply::text(format!(
                "order={order} missing={missing} before={before} after={after} wrote={wrote} delivered={delivered:?} reads={}",
                s.delivered_reads()
            )))
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("reader agent");
    let writer = agent_reach_e2e::echo_agent(caller.local_addr(), "writer", &[("write.it", &[])]).await;
    wait_for_instances(caller, &[reader.instance_id(), writer.instance_id()]).await;
    wait_for_instances(target, &[reader.instance_id(), writer.instance_id()]).await;
    let client = Client::connect(&caller.local_addr().to_string()).await.unwrap();

    // A small session, new to the target's sidecar: prewarmed, then delivered.
    let v1 = writer.client().session("small").put([("order_id", "o-7", Policy::LastWriter)]).await.unwrap();
    let before = counts(target);
    let reply = client.invoke("read.it").session("small").text("write").send().await.expect("call 1");
    let after = counts(target);
    let wrote: u64 = reply.text().split("wrote=").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(wrote > v1);
    assert_eq!(
        reply.text(),
        format!("order=o-7 missing=true before=- after=seen wrote={wrote} delivered=Some({v1}) reads=4")
    );
    // Not one of the handler's 4 reads reached the sidecar; one snapshot, one prewarm.
    assert_eq!((after.0, after.1), (before.0, before.1), "hits and misses: {before:?} -> {after:?}");
    assert_eq!((after.2 - before.2, after.3 - before.3, after.4 - before.4), (1, 0, 1));

    // The next call carries the session with the handler's write (once the watch has it).
    until_fresh(target, "small").await;
    let before = counts(target);
    let reply = client.invoke("read.it").session("small").text("read").send().await.expect("call 2");
    let after = counts(target);
    assert_eq!(
        reply.text(),
        format!("order=o-7 missing=true before=seen after=- wrote=0 delivered=Some({wrote}) reads=3")
    );
    assert_eq!((after.0, after.1, after.2 - before.2, after.4 - before.4), (before.0, before.1, 1, 0));

    // Delivered by the same sidecar (no mesh hop, no prewarm): the session still comes.
    let local = Client::connect(&target.local_addr().to_string()).await.unwrap();
    let before = counts(target);
    let reply = local.invoke("read.it").session("small").text("read").send().await.expect("call 3");
    let after = counts(target);
    assert_eq!(
        reply.text(),
        format!("order=o-7 missing=true before=seen after=- wrote=0 delivered=Some({wrote}) reads=3")
    );
    assert_eq!((after.0, after.1, after.2 - before.2), (before.0, before.1, 1));

    // Over the target's 4096-byte limit: not delivered; the same reads go to the sidecar
    // (its cache, which the prewarm filled: 3 hits) and answer the same.
    let blob = bytes::Bytes::from(vec![b'x'; 5000]);
    let fields =
        [("order_id", bytes::Bytes::from_static(b"o-8"), Policy::LastWriter), ("blob", blob, Policy::LastWriter)];
    writer.client().session("big").put(fields).await.expect("a 5 KB session is within the store's limits");
    let before = counts(target);
    let reply = client.invoke("read.it").session("big").text("read").send().await.expect("call 4");
    let after = counts(target);
    assert_eq!(reply.text(), "order=o-8 missing=true before=- after=- wrote=0 delivered=None reads=0");
    assert_eq!((after.0 - before.0, after.1 - before.1), (3, 0), "hits, misses: {before:?} -> {after:?}");
    assert_eq!((after.2 - before.2, after.3 - before.3, after.4 - before.4), (0, 1, 1));

    // A call with no session gets none, and reads are refused as before.
    let reply = client.invoke("read.it").text("read").send().await;
    let e = reply.expect_err("no session");
    assert!(e.to_string().contains("this call carries no session id"), "{e}");
    mesh.stop(vec![reader, writer]).await;
}
