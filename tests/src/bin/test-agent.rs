//! A sample agent in its own process, for tests that kill agents with SIGKILL.
//!
//! `test-agent --sidecar HOST:PORT --name NAME --capability CAP [--capability CAP...]
//! [--delay-ms N]`: answers every capability with "<name>@<instance>:<payload>" after the
//! delay, prints `READY <instance id>` on stdout once registered, and runs until killed
//! (SIGTERM: graceful shutdown). `--relay CAP=TARGET` adds a capability CAP that calls the
//! capability TARGET through the mesh with its payload (in the call's trace) and answers
//! "<name>@<instance>:<TARGET's answer>" (the cross-language tests call Python agents so).

use std::time::Duration;

use agent_reach::{Agent, Reply};

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut sidecar, mut name, mut caps, mut delay, mut relays) = (None, None, Vec::new(), 0u64, Vec::new());
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sidecar" => sidecar = Some(value),
            "--name" => name = Some(value),
            "--capability" => caps.push(value),
            "--delay-ms" => delay = value.parse().map_err(|e| format!("--delay-ms: {e}"))?,
            "--relay" => {
                let (cap, target) = value.split_once('=').ok_or("--relay needs CAP=TARGET")?;
                relays.push((cap.to_string(), target.to_string()));
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let sidecar = sidecar.ok_or("--sidecar is required")?;
    let name = name.ok_or("--name is required")?;
    let runtime = agent_reach_support::process::runtime(2).map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let mut builder = Agent::builder(&name).version("1.0.0").sidecar(sidecar.clone());
        let client = agent_reach::Client::lazy(&sidecar).map_err(|e| e.to_string())?;
        for (cap, target) in relays {
            let (name, client) = (name.clone(), client.clone());
            builder = builder.handle(cap, move |call| {
                let (name, client, target) = (name.clone(), client.clone(), target.clone());
                async move {
                    let mut nested = client.invoke(target).within(&call).payload(call.payload().clone());
                    if let Some(deadline) = call.deadline() {
                        nested = nested.timeout(deadline.saturating_duration_since(std::time::Instant::now()));
                    }
                    let reply =
                        nested.send().await.map_err(|e| agent_reach::HandlerError::unavailable(e.to_string()))?;
                    Ok(Reply::text(format!("{name}@{}:{}", call.instance_id(), reply.text())))
                }
            });
        }
        for cap in caps {
            let name = name.clone();
            builder = builder.handle(cap, move |call| {
                let name = name.clone();
                async move {
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    Ok(Reply::text(format!("{name}@{}:{}", call.instance_id(), call.text()?)))
                }
            });
        }
        let agent = builder.start().await.map_err(|e| e.to_string())?;
        println!("READY {}", agent.instance_id());
        agent_reach_support::process::shutdown_signal().await;
        agent.shutdown().await;
        Ok(())
    })
}
