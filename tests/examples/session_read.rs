//! Reads of session context, measured: how long a read of an unchanged session takes when
//! the sidecar's cache answers it, inside the sidecar (the cache lookup `GetSession` does
//! first), through the SDK's local gRPC round trip to its sidecar, and in a handler from the
//! session the sidecar delivered with the call (`HandleRequest.session`, answered
//! in-process: 20,000 reads in one call, and the first read of each of 2,000 calls), next to
//! a read the cache cannot answer (a session new to the sidecar: a round trip to control
//! and etcd). A real etcd, control and one sidecar with one Rust SDK agent; prints
//! p50/p99/max per kind and the cache's hit and miss counts.
//!
//! Consistency of a cached read (see `sidecar/src/session.rs`): the cache answers only while
//! its watch of the session is live, and only when the cached version is at least the
//! `min_version` asked for and at least this sidecar's own last write to it
//! (read-your-writes); otherwise the read goes to control. Writes made through another
//! sidecar show up once the watch delivers them (eventually consistent across sidecars;
//! pass the write's version as `min_version` to read it for sure).
//!
//! `cargo run -p agent-reach-e2e --example session_read -- [reads]` (default 20000).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::proto;
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::{Backend, TestStore, echo_agent, listener, sidecar_config, start_sidecar, wait_for_instances};

fn line(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{label:<44} n {:>6}  p50 {:>9.2?}  p99 {:>9.2?}  max {:>9.2?}",
        samples.len(),
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let reads: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let ts = TestStore::start(Backend::Etcd).await;
    let control = ControlHandle::spawn(ts.store.clone(), ControlConfig::default(), listener().await).expect("control");
    // The production control timeout (3 s), not the tests' 1 s.
    let config = |id: &str| {
        let mut c = sidecar_config(&control.endpoint(), id);
        c.control_timeout = Duration::from_secs(3);
        c
    };
    let sidecar = start_sidecar(config("bench")).await;
    let agent = echo_agent(sidecar.local_addr(), "reader", &[("read.it", &[])]).await;
    wait_for_instances(&sidecar, &[agent.instance_id()]).await;

    // A session of 8 fields of 256 bytes, written once, then read again and again.
    let session = agent.client().session("bench-1");
    let fields: Vec<_> = (0..8).map(|i| (format!("f{i}"), vec![b'x'; 256], agent_reach::Policy::LastWriter)).collect();
    let version = session.put(fields).await.expect("write");
    // The write makes the sidecar follow the session; wait until a read is a hit.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !session.read_at_least(version).await.expect("read").cached {
        assert!(Instant::now() < deadline, "the session never became cached");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Inside the sidecar: the cache lookup of a local GetSession (whole session, one field).
    let cache = sidecar.session_cache().clone();
    for (label, names) in
        [("in-sidecar cache hit, whole session", vec![]), ("in-sidecar cache hit, one field", vec!["f3".to_string()])]
    {
        let request = proto::GetSessionRequest { session_id: "bench-1".into(), fields: names, ..Default::default() };
        let mut samples = Vec::with_capacity(reads);
        for _ in 0..reads {
            let started = Instant::now();
            let reply = cache.get(request.clone()).await.expect("read");
            samples.push(started.elapsed());
            assert!(reply.cached);
        }
        line(label, samples);
    }

    // As a handler sees it: the SDK's GetSession on the local sidecar.
    let mut samples = Vec::with_capacity(reads);
    for _ in 0..reads {
        let started = Instant::now();
        let field = session.get("f3").await.expect("read");
        samples.push(started.elapsed());
        assert!(field.is_some());
    }
    line("SDK read via the local sidecar, cache hit", samples);

    // In a handler, from the session delivered with the call: `reads` reads in one call,
    // then the first read of each of `calls` calls (a fresh snapshot each time).
    let timed: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let samples_in = timed.clone();
    let in_handler = agent_reach::Agent::builder("snapshot-reader")
        .sidecar(sidecar.local_addr().to_string())
        .capability("read.delivered", Vec::<String>::new())
        .handle("read.delivered", move |call| {
            let timed = samples_in.clone();
            async move {
                let n: usize = call.text()?.parse().unwrap_or(1);
                let session = call.session();
                let mut samples = Vec::with_capacity(n);
                for _ in 0..n {
                    let started = Instant::now();
                    let field = session.get("f3").await;
                    samples.push(started.elapsed());
                    assert!(matches!(field, Ok(Some(_))));
                }
                assert_eq!(session.delivered_reads(), n as u64, "every read answered from the delivered session");
                timed.lock().unwrap().extend(samples);
                Ok(agent_reach::Reply::text("ok"))
            }
        })
        .register_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect("snapshot reader");
    wait_for_instances(&sidecar, &[agent.instance_id(), in_handler.instance_id()]).await;
    let mesh = agent_reach::Client::connect(&sidecar.local_addr().to_string()).await.expect("client");
    let hits_before = sidecar.session_stats().hits.load(Ordering::Relaxed);
    mesh.invoke("read.delivered").session("bench-1").text(reads.to_string()).send().await.expect("call");
    line("SDK read in a handler, delivered session", std::mem::take(&mut *timed.lock().unwrap()));
    let calls = (reads / 10).max(1);
    for _ in 0..calls {
        mesh.invoke("read.delivered").session("bench-1").text("1").send().await.expect("call");
    }
    line("  first read of each call", std::mem::take(&mut *timed.lock().unwrap()));
    let hits_after = sidecar.session_stats().hits.load(Ordering::Relaxed);
    println!(
        "reads in handlers that reached the sidecar: {} (snapshots attached {})",
        hits_after - hits_before,
        sidecar.session_stats().snapshots.load(Ordering::Relaxed)
    );
    in_handler.abort();

    // Misses: sessions written through another sidecar, each read once here (new to this
    // sidecar, so the read goes to control and etcd).
    let other = start_sidecar(config("writer")).await;
    let writer = echo_agent(other.local_addr(), "writer", &[("write.it", &[])]).await;
    wait_for_instances(&other, &[writer.instance_id(), agent.instance_id()]).await;
    let misses = (reads / 50).clamp(50, 500);
    for i in 0..misses {
        writer.client().session(format!("cold-{i}")).set("f", "v").await.expect("write");
    }
    let mut samples = Vec::with_capacity(misses);
    for i in 0..misses {
        let cold = agent.client().session(format!("cold-{i}"));
        let started = Instant::now();
        let read = cold.read().await.expect("read");
        samples.push(started.elapsed());
        assert!(read.found && !read.cached);
    }
    line("SDK read, cache miss (control + etcd)", samples);
    let stats = sidecar.session_stats();
    println!("cache hits {} misses {}", stats.hits.load(Ordering::Relaxed), stats.misses.load(Ordering::Relaxed));
    agent.abort();
    writer.abort();
    other.stop().await;
    sidecar.stop().await;
    control.shutdown().await;
}
