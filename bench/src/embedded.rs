//! The sidecar and control binaries' `main`, runnable from this binary
//! (`agent-reach-bench sidecar ...`, `agent-reach-bench control ...`) with the same flags.
//! The smoke test uses them so that it measures code built from the current source with
//! no separate build step; full runs use the real `agent-reach-sidecar` and
//! `agent-reach-control` release binaries instead. Keep in step with `sidecar/src/main.rs`
//! and `control/src/main.rs`.

use agent_reach_control::{ControlArgs, ControlConfig};
use agent_reach_sidecar::{Sidecar, SidecarArgs, SidecarConfig};
use clap::Parser;

/// Runs a sidecar with the flags of `agent-reach-sidecar`.
pub fn sidecar(args: &[String]) -> Result<(), String> {
    let args = SidecarArgs::parse_from(std::iter::once("agent-reach-sidecar".to_string()).chain(args.iter().cloned()));
    let config = SidecarConfig::try_from(&args)?;
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = agent_reach_support::process::runtime(args.worker_threads).map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let local =
            tokio::net::TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
        let mesh = tokio::net::TcpListener::bind(args.mesh_listen)
            .await
            .map_err(|e| format!("--mesh-listen {}: {e}", args.mesh_listen))?;
        let sidecar = Sidecar::start(config, local, mesh).await.map_err(|e| e.to_string())?;
        sidecar.run_until(agent_reach_support::process::shutdown_signal()).await;
        Ok(())
    })
}

/// Runs the control service with the flags of `agent-reach-control`.
pub fn control(args: &[String]) -> Result<(), String> {
    let args = ControlArgs::parse_from(std::iter::once("agent-reach-control".to_string()).chain(args.iter().cloned()));
    let config = ControlConfig::try_from(&args)?;
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = agent_reach_support::process::runtime(args.worker_threads).map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(agent_reach_control::run(args, config))
}
