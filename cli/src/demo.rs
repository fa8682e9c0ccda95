//! `agent-reach demo`: a whole mesh in one process, exercised and explained.
//!
//! Starts the control service on the embedded store, two sidecars ("host-a", "host-b"),
//! four sample agents over two capabilities plus a planner agent, then makes calls by
//! capability from the planner and prints where each went: the spread across instances,
//! tag filtering, a chain planner → summarizer → translator, an unknown capability with its
//! suggestion, and calls that still succeed after an instance is killed. Returns an error
//! (non-zero exit) if anything does not behave as shown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::model::Target;
use agent_reach::policy::{Policy, PolicyKind, PolicySpec, Strategy};
use agent_reach::{Agent, Client, Reply, RunningAgent};
use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::{EmbeddedStore, Store};
use tokio::net::TcpListener;

async fn bind() -> Result<TcpListener, String> {
    TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("cannot bind 127.0.0.1: {e}"))
}

async fn sidecar(store: &Arc<dyn Store>, control: &ControlHandle, id: &str) -> Result<Sidecar, String> {
    let mut config = SidecarConfig::new(vec![control.endpoint()]);
    config.identity = Some(crate::dev::identity(store, control, &config.tenant).await?);
    config.sidecar_id = id.to_string();
    config.heartbeat_interval = Duration::from_millis(500);
    config.probe_interval = Duration::from_millis(500);
    Sidecar::start_with_admin(config, bind().await?, bind().await?, Some(bind().await?))
        .await
        .map_err(|e| e.to_string())
}

async fn summarizer(sidecar: &Sidecar, tags: &[&str]) -> Result<RunningAgent, String> {
    Agent::builder("summarizer")
        .version("1.2.0")
        .capability("text.summarize", tags.iter().copied())
        .handle("text.summarize", |call| async move {
            let text = call.text()?;
            let words: Vec<&str> = text.split_whitespace().collect();
            let summary = if words.len() > 4 { format!("{} …", words[..4].join(" ")) } else { text.to_string() };
            Ok(Reply::text(summary))
        })
        .sidecar(sidecar.local_addr().to_string())
        .start()
        .await
        .map_err(|e| e.to_string())
}

async fn translator(sidecar: &Sidecar, tags: &[&str]) -> Result<RunningAgent, String> {
    Agent::builder("translator")
        .version("2.0.1")
        .capability("text.translate", tags.iter().copied())
        .handle("text.translate", |call| async move {
            let lang = call.metadata().get("lang").cloned().unwrap_or_else(|| "zh".into());
            Ok(Reply::text(format!("[{lang}] {}", call.text()?)))
        })
        .sidecar(sidecar.local_addr().to_string())
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// The planner chains two capabilities: summarize, then translate the summary.
async fn planner(sidecar: &Sidecar) -> Result<RunningAgent, String> {
    let mesh = Client::lazy(&sidecar.local_addr().to_string()).map_err(|e| e.to_string())?.with_caller("planner", "");
    Agent::builder("planner")
        .version("0.3.0")
        .capability("task.plan", ["demo"])
        .handle("task.plan", move |call| {
            let mesh = mesh.clone();
            async move {
                // `within(&call)` continues the caller's trace through this agent's own calls.
                let summary =
                    mesh.invoke("text.summarize").within(&call).payload(call.payload().clone()).send().await?;
                let translated = mesh
                    .invoke("text.translate")
                    .within(&call)
                    .tags(["zh"])
                    .payload(summary.payload().clone())
                    .send()
                    .await?;
                Ok(Reply::text(format!(
                    "{}  (summarized by {}, translated by {})",
                    translated.text(),
                    summary.instance(),
                    translated.instance()
                )))
            }
        })
        .sidecar(sidecar.local_addr().to_string())
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// Stores a capability policy with `strategy`, as `agent-reach ctl policy put` would, and
/// waits until the sidecars have it.
async fn set_strategy(
    store: &Arc<dyn Store>,
    sidecars: &[&Sidecar],
    capability: &str,
    strategy: Strategy,
) -> Result<(), String> {
    let policy = Policy {
        tenant: "default".into(),
        kind: PolicyKind::Capability,
        name: capability.into(),
        spec: PolicySpec { strategy: Some(strategy), ..Default::default() },
        description: "demo".into(),
    };
    policy.validate().map_err(|e| e.to_string())?;
    let key = agent_reach_control::keys::policy_key("default", PolicyKind::Capability, capability);
    store.put(&key, agent_reach_control::registry::encode_policy(&policy), None).await.map_err(|e| e.to_string())?;
    for sc in sidecars {
        sc.wait_for_table(Duration::from_secs(10), |t| t.policy(PolicyKind::Capability, capability).is_some()).await?;
    }
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("demo check failed: {what}")) }
}

pub async fn run() -> Result<(), String> {
    let started = Instant::now();
    println!("Agent-Reach demo: a control service, two sidecars and five agents in this process, on 127.0.0.1.\n");
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
    // Mutual TLS between everything, with a CA generated here (secure by default).
    let config = ControlConfig { mtls: agent_reach_control::identity::Mtls::Required, ..ControlConfig::default() };
    let control = ControlHandle::spawn(store.clone(), config, bind().await?).map_err(|e| e.to_string())?;
    let a = sidecar(&store, &control, "host-a").await?;
    let b = sidecar(&store, &control, "host-b").await?;
    println!("  control    {}  (embedded store: registrations on 20 s leases)", control.addr());
    println!("  sidecar A  host-a  local API {}  mesh API {}", a.local_addr(), a.mesh_addr());
    println!("  sidecar B  host-b  local API {}  mesh API {}", b.local_addr(), b.mesh_addr());

    let sum_a = summarizer(&a, &["en"]).await?;
    let sum_b = summarizer(&b, &["en", "zh"]).await?;
    let tr_b = translator(&b, &["zh"]).await?;
    let tr_a = translator(&a, &["zh", "fr"]).await?;
    let plan = planner(&a).await?;
    let host = |id: &str| {
        if [&sum_a, &tr_a, &plan].iter().any(|x| x.instance_id() == id) { "host-a" } else { "host-b" }
    };
    println!("\nAgents registered (each with its own sidecar, which assigned the instance id):");
    for (agent, caps) in [
        (&sum_a, "text.summarize [en]"),
        (&sum_b, "text.summarize [en,zh]"),
        (&tr_b, "text.translate [zh]"),
        (&tr_a, "text.translate [zh,fr]"),
        (&plan, "task.plan [demo]"),
    ] {
        println!("  {:<11} {:<24} {:<24} on {}", agent.name(), agent.instance_id(), caps, host(&agent.instance_id()));
    }
    let everyone: Vec<String> = [&sum_a, &sum_b, &tr_b, &tr_a, &plan].iter().map(|x| x.instance_id()).collect();
    for sc in [&a, &b] {
        sc.wait_for_table(Duration::from_secs(10), |t| everyone.iter().all(|id| t.instances.contains_key(id))).await?;
    }
    println!(
        "  both sidecars' routing tables hold all {} instances (from the control service's watch stream)",
        everyone.len()
    );

    let mesh = plan.client();
    println!("\n1. The planner calls text.summarize 8 times. The default strategy, least_loaded, compares two");
    println!("   instances by latency x calls in flight, so the summarizer next door (no mesh hop) takes most:");
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    for i in 1..=8 {
        let reply = mesh
            .invoke("text.summarize")
            .text(format!("report {i}: the quarterly numbers went up across every region"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        println!("   call {i} -> {} on {}: {:?}", reply.instance(), host(reply.instance()), reply.text());
        *spread.entry(reply.instance().to_string()).or_default() += 1;
    }
    let line: Vec<String> = spread.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    println!("   spread: {}", line.join(", "));
    check(
        spread.keys().all(|k| *k == sum_a.instance_id() || *k == sum_b.instance_id()),
        "every text.summarize call went to a summarizer",
    )?;

    println!("\n   A policy switches text.summarize to round_robin (stored as `agent-reach ctl policy put` would,");
    println!("   pushed to both sidecars through the watch stream); 8 more calls split exactly 4/4:");
    set_strategy(&store, &[&a, &b], "text.summarize", Strategy::RoundRobin).await?;
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    for i in 9..=16 {
        let reply =
            mesh.invoke("text.summarize").text(format!("report {i}")).send().await.map_err(|e| e.to_string())?;
        *spread.entry(reply.instance().to_string()).or_default() += 1;
    }
    let line: Vec<String> = spread.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    println!("   spread: {}", line.join(", "));
    check(
        spread.len() == 2 && spread.values().all(|n| *n == 4),
        "8 round-robin calls split 4/4 across the two summarizers",
    )?;

    println!("\n2. Required tags: text.translate with tags [fr] can only go to the translator tagged fr:");
    for _ in 0..3 {
        let reply = mesh
            .invoke("text.translate")
            .tags(["fr"])
            .metadata("lang", "fr")
            .text("bonjour")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        println!("   -> {} on {}: {:?}", reply.instance(), host(reply.instance()), reply.text());
        check(reply.instance() == tr_a.instance_id(), "the [fr] call went to the fr translator")?;
    }

    println!("\n3. A chain: a client calls task.plan; the planner calls text.summarize, then text.translate [zh]:");
    let client = Client::connect(&b.local_addr().to_string()).await.map_err(|e| e.to_string())?;
    let reply = client
        .invoke("task.plan")
        .text("customers in three regions asked for refunds after the outage on Monday")
        .force_trace()
        .send()
        .await
        .map_err(|e| e.to_string())?;
    println!("   -> {} on {}: {}", reply.instance(), host(reply.instance()), reply.text());
    if let Some(trace_id) = reply.trace_id() {
        let admins: Vec<String> = [&a, &b].iter().filter_map(|s| s.admin_addr()).map(|a| a.to_string()).collect();
        println!("   The call was traced; `agent-reach trace {trace_id} --admin … --admin …` shows its hops:");
        crate::trace::run(trace_id, &admins, false).await?;
    }

    println!("\n4. An unknown capability gets a reason and suggestions, not a timeout:");
    let err = mesh.invoke("text.summarise").text("x").send().await.err().ok_or("text.summarise was served")?;
    println!("   text.summarise -> {:?} {}: {}", err.code(), err.reason().unwrap_or("-"), err.message());
    check(
        err.reason() == Some("AGENT_NOT_FOUND") && err.suggestions() == ["text.summarize"],
        "AGENT_NOT_FOUND suggests text.summarize",
    )?;

    println!("\n5. Route explains a choice without making the call (text.translate [zh]):");
    let route = mesh
        .route(Target { tags: vec!["zh".into()], ..Target::capability("text.translate") }, 5)
        .await
        .map_err(|e| e.to_string())?;
    for c in &route.candidates {
        let inst = c.instance.as_ref().map(|i| i.instance_id.as_str()).unwrap_or("?");
        println!("   candidate {inst}  cost {:.3} (least_loaded: latency x calls in flight; lower is better)", c.score);
    }

    let dead = tr_b.instance_id();
    set_strategy(&store, &[&a, &b], "text.translate", Strategy::RoundRobin).await?;
    println!("\n6. With text.translate on round_robin, kill translator {dead} on host-b without deregistering,");
    println!("   then call text.translate [zh] 6 times:");
    tr_b.abort();
    let mut retried = 0;
    for i in 1..=6 {
        let reply = mesh
            .invoke("text.translate")
            .tags(["zh"])
            .text(format!("message {i}"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let note = if reply.attempts() > 1 {
            retried += 1;
            format!(
                "  (attempt {}: the first try hit the dead instance and never reached an agent, so sidecar A retried elsewhere)",
                reply.attempts()
            )
        } else {
            String::new()
        };
        println!("   call {i} -> {}{note}", reply.instance());
        check(reply.instance() != dead, "no call was served by the killed instance")?;
    }
    println!(
        "   6/6 succeeded, {retried} after a retry on another instance; its sidecar marks the dead one DOWN once a probe fails, and removes it 30 s later."
    );

    println!(
        "\nSummary: calls by capability (least_loaded, then round_robin 4/4 by policy), tags honoured, a 3-agent \
         chain, a helpful NOT_FOUND, and no failed call after a kill. Done in {:.1} s.",
        started.elapsed().as_secs_f64()
    );
    for agent in [sum_a, sum_b, tr_a, plan] {
        agent.shutdown().await;
    }
    a.shutdown().await;
    b.shutdown().await;
    control.shutdown().await;
    Ok(())
}
