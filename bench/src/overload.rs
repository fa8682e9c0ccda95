//! `overload`: one instance offered a multiple of its capacity, through two sidecars.
//!
//! The agent has `slots` concurrency slots (its registration's `max_concurrency`) and spends
//! `work` per call, so its capacity is slots / work calls per second. An open-loop generator
//! offers `factor` × capacity for `seconds` through sidecar A, in a priority mix (HIGH may
//! use every slot, NORMAL and LOW only their shares, so an all-NORMAL load can use no more
//! than the NORMAL share by design); sidecar B's admission sheds what the slots cannot take.
//! The agent's policy sets the admission queue (`queue_length` waiting calls per priority,
//! for at most `queue_timeout`).
//!
//! Reported: admitted and shed latency percentiles (from the moment each call is sent; the
//! generator's lag behind its schedule is reported beside them) and their p99 ratio,
//! goodput against capacity, admitted calls per priority, the most calls the agent ever ran
//! at once, and every other outcome with its first message.
//! Targets (issue #6): shed p99 at least 10× faster than admitted p99, in-flight never above
//! the cap, goodput ≥ 90 % of capacity. Everything runs in this process on 127.0.0.1.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agent_reach::model::Priority;
use agent_reach::policy::{Admission, Policy, PolicyKind, PolicySpec};
use agent_reach::{Agent, Client, Reply};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::{EmbeddedStore, Store};
use tokio::net::TcpListener;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct OverloadSpec {
    pub slots: u32,
    pub work: Duration,
    pub factor: f64,
    pub seconds: u64,
    /// Percent of calls sent HIGH, NORMAL and LOW.
    pub mix: [u32; 3],
    pub queue_length: u32,
    pub queue_timeout: Duration,
}

const PRIORITIES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

/// The priority of call `i` for a mix in percent: spread evenly (a deterministic pattern).
fn priority_of(i: usize, mix: [u32; 3]) -> usize {
    let slot = (i * 37 % 100) as u32;
    if slot < mix[0] {
        0
    } else if slot < mix[0] + mix[1] {
        1
    } else {
        2
    }
}

async fn bind() -> Result<TcpListener, String> {
    TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// Runs the overload benchmark and prints its report.
pub async fn run(spec: OverloadSpec) -> Result<(), String> {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
    let control =
        ControlHandle::spawn(store.clone(), ControlConfig::default(), bind().await?).map_err(|e| e.to_string())?;
    let mut sidecars = Vec::new();
    for id in ["overload-a", "overload-b"] {
        let mut config = SidecarConfig::new(vec![control.endpoint()]);
        config.sidecar_id = id.into();
        config.trace_sample_ratio = 0.0;
        sidecars.push(Sidecar::start(config, bind().await?, bind().await?).await.map_err(|e| e.to_string())?);
    }
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let running = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let (r, p, work) = (running.clone(), peak.clone(), spec.work);
    let agent = Agent::builder("worker")
        .max_concurrency(spec.slots)
        .sidecar(b.local_addr().to_string())
        .handle("work", move |_call| {
            let (r, p) = (r.clone(), p.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(work).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(Reply::bytes(&b"done"[..]))
            }
        })
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let id = agent.instance_id();
    a.wait_for_table(Duration::from_secs(10), |t| t.instances.contains_key(&id)).await?;
    let policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Agent,
        name: "worker".into(),
        spec: PolicySpec {
            admission: Some(Admission {
                queue_length: spec.queue_length,
                queue_timeout_ms: u32::try_from(spec.queue_timeout.as_millis()).unwrap_or(u32::MAX),
                ..Default::default()
            }),
            ..Default::default()
        },
        description: "overload benchmark".into(),
    };
    let key = agent_reach_control::keys::policy_key("default", PolicyKind::Agent, "worker");
    store.put(&key, agent_reach_control::registry::encode_policy(&policy), None).await.map_err(|e| e.to_string())?;
    for sc in [a, b] {
        sc.wait_for_table(Duration::from_secs(10), |t| t.policy(PolicyKind::Agent, "worker").is_some()).await?;
    }

    let capacity = f64::from(spec.slots) / spec.work.as_secs_f64();
    let rate = capacity * spec.factor;
    let total = (rate * spec.seconds as f64) as usize;
    let client = Client::connect(&a.local_addr().to_string()).await.map_err(|e| e.to_string())?;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut calls = Vec::with_capacity(total);
    let mut lag = Vec::with_capacity(total);
    for i in 0..total {
        let due = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        lag.push(due.elapsed());
        let client = client.clone();
        let priority = priority_of(i, spec.mix);
        calls.push(tokio::spawn(async move {
            let sent = Instant::now();
            let result = client
                .invoke("work")
                .text("x")
                .priority(PRIORITIES[priority])
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            let result =
                result.map(|_| ()).map_err(|e| (e.reason().unwrap_or("?").to_string(), e.message().to_string()));
            (priority, sent.elapsed(), result)
        }));
    }
    let mut admitted = Vec::new();
    let mut shed = Vec::new();
    let mut by_priority = [[0usize; 2]; 3];
    // Other failures by reason: count and the first message.
    let mut other: std::collections::BTreeMap<String, (usize, String)> = std::collections::BTreeMap::new();
    for c in calls {
        let (priority, latency, result) = c.await.map_err(|e| e.to_string())?;
        match result {
            Ok(()) => {
                admitted.push(latency);
                by_priority[priority][0] += 1;
            }
            Err((reason, _)) if reason == "AGENT_OVERLOADED" => {
                shed.push(latency);
                by_priority[priority][1] += 1;
            }
            Err((reason, message)) => other.entry(reason).or_insert((0, message)).0 += 1,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    admitted.sort();
    shed.sort();
    lag.sort();
    let goodput = admitted.len() as f64 / elapsed;
    let (a99, s99) = (percentile(&admitted, 0.99), percentile(&shed, 0.99));
    println!(
        "# agent-reach-bench overload — {}, {}",
        crate::machine::utc_now(),
        crate::machine::Machine::current().describe()
    );
    println!(
        "# one instance: {} slots x {:?} per call = capacity {capacity:.0} calls/s; offered {:.1}x = {rate:.0} calls/s for {} s ({total} calls)",
        spec.slots, spec.work, spec.factor, spec.seconds
    );
    println!(
        "# priority mix HIGH/NORMAL/LOW {}/{}/{} %; admission queue {} per priority, timeout {:?}; generator lag p99 {:.3} ms",
        spec.mix[0],
        spec.mix[1],
        spec.mix[2],
        spec.queue_length,
        spec.queue_timeout,
        percentile(&lag, 0.99)
    );
    println!("{:<10} {:>8} {:>9} {:>9} {:>9}", "outcome", "calls", "p50 ms", "p99 ms", "max ms");
    for (name, list) in [("admitted", &admitted), ("shed", &shed)] {
        println!(
            "{name:<10} {:>8} {:>9.3} {:>9.3} {:>9.3}",
            list.len(),
            percentile(list, 0.5),
            percentile(list, 0.99),
            list.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        );
    }
    for (p, [ok, no]) in PRIORITIES.iter().zip(by_priority) {
        println!("{:<10} admitted {ok:>6}  shed {no:>6}", p.as_str());
    }
    for (reason, (n, message)) in &other {
        println!("{reason:<10} {n:>8}   first: {message}");
    }
    let peak = peak.load(Ordering::SeqCst);
    println!("shed p99 / admitted p99: {:.3} (target <= 0.1: shed answered >= 10x faster)", s99 / a99);
    println!("goodput: {goodput:.0} calls/s = {:.1} % of capacity (target >= 90 %)", goodput / capacity * 100.0);
    println!("most calls in the agent at once: {peak} (cap {})", spec.slots);
    agent.shutdown().await;
    for s in sidecars {
        s.stop().await;
    }
    control.shutdown().await;
    if !other.is_empty() {
        return Err(format!("calls failed for other reasons: {other:?}"));
    }
    Ok(())
}
