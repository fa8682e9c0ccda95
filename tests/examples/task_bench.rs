//! Durable tasks, measured and shown end to end: a real etcd, control, a caller sidecar and
//! a target sidecar with one Rust SDK agent. Submits tasks open-loop at a fixed rate and
//! prints submit → agent-starts-work p50/p99 and the etcd writes per task (task keys,
//! counted by a watch on the task prefix; and every store write of control).
//!
//! `cargo run -p agent-reach-e2e --example task_bench -- [rate/s] [tasks]` (defaults 100, 500).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::proto::TaskState;
use agent_reach::{Agent, Client, Reply};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_e2e::{Backend, TestStore, listener, sidecar_config, start_sidecar, wait_for_instances};
use futures_util::StreamExt;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let count: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(500);

    let ts = TestStore::start(Backend::Etcd).await;
    let control = ControlHandle::spawn(ts.store.clone(), ControlConfig::default(), listener().await).expect("control");
    // The production control timeout (3 s), not the tests' 1 s.
    let config = |id: &str| {
        let mut c = sidecar_config(&control.endpoint(), id);
        c.control_timeout = Duration::from_secs(3);
        c
    };
    let a = start_sidecar(config("caller")).await;
    let b = start_sidecar(config("target")).await;

    // The agent: notes when it starts each task, answers at once.
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen = started.clone();
    let agent = Agent::builder("worker")
        .sidecar(b.local_addr().to_string())
        .capability("work", Vec::<String>::new())
        .handle("work", move |call| {
            let seen = seen.clone();
            async move {
                if let Some(task) = call.task() {
                    seen.lock().unwrap().insert(task.id().to_string(), Instant::now());
                }
                Ok(Reply::text(format!("done:{}", call.text()?)))
            }
        })
        .start()
        .await
        .expect("agent");
    wait_for_instances(&a, &[agent.instance_id()]).await;
    let client = Client::connect(&a.local_addr().to_string()).await.expect("client");
    for i in 0..20 {
        client.submit("work").text(format!("warm-{i}")).send().await.unwrap().wait().await.unwrap();
    }

    // Writes to task keys, counted from etcd itself.
    let from = ts.store.current_revision().await.unwrap() + 1;
    let mut watch = ts.store.watch_prefix(agent_reach_control::tasks::ROOT, from).await.unwrap();
    let task_writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = task_writes.clone();
    tokio::spawn(async move {
        while let Some(Ok(batch)) = watch.next().await {
            counter.fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        }
    });
    let control_writes_before = control.stats().store_writes.load(Ordering::Relaxed);

    let t0 = tokio::time::Instant::now();
    let mut submits = Vec::new();
    for i in 0..count {
        let client = client.clone();
        let at = t0 + Duration::from_micros(i as u64 * 1_000_000 / rate);
        submits.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let sent = Instant::now();
            let task = client.submit("work").text(format!("job-{i}")).send().await;
            (sent, task)
        }));
    }
    let mut sent = Vec::new();
    let mut refused = 0;
    for s in submits {
        match s.await.unwrap() {
            (at, Ok(task)) => sent.push((task.id().to_string(), at, task)),
            (_, Err(e)) => {
                eprintln!("submit refused: {e}");
                refused += 1;
            }
        }
    }
    let mut failed = 0;
    for (_, _, task) in &sent {
        // Waiting itself goes through control; retried while control is slow to answer.
        let mut done = None;
        for _ in 0..10 {
            match task.wait().await {
                Ok(t) => {
                    done = Some(t);
                    break;
                }
                Err(e) => eprintln!("wait: {e}"),
            }
        }
        if done.and_then(|d| d.status).map(|s| s.state) != Some(TaskState::Completed as i32) {
            failed += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let control_writes = control.stats().store_writes.load(Ordering::Relaxed) - control_writes_before;
    let started = started.lock().unwrap().clone();
    let mut latencies: Vec<Duration> =
        sent.iter().filter_map(|(id, at, _)| started.get(id).map(|s| s.saturating_duration_since(*at))).collect();
    latencies.sort();
    println!("tasks: {count} at {rate}/s, submits refused: {refused}, not completed: {failed}");
    println!(
        "submit -> agent starts: p50 {:.2} ms, p99 {:.2} ms (n = {})",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.len()
    );
    println!(
        "etcd writes per task: {:.2} to task keys; {:.2} by control in all (incl. leases, heartbeats)",
        task_writes.load(Ordering::Relaxed) as f64 / sent.len() as f64,
        control_writes as f64 / sent.len() as f64
    );
    agent.abort();
    a.stop().await;
    b.stop().await;
    control.shutdown().await;
}
