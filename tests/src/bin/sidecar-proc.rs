//! The sidecar in a process of its own, for tests that measure its memory (RSS) while
//! hostile clients hit it: `sidecar-proc [agent-reach-sidecar flags...]`, the same flags
//! and start as `agent-reach-sidecar` (built from the current source with the tests,
//! unlike `target/debug/agent-reach-sidecar`, which the test command does not rebuild).
//! Prints `READY local=ADDR mesh=ADDR admin=ADDR` on stdout once its ports listen (pass
//! port 0 to have them chosen), then runs until SIGTERM. Keep in step with
//! `sidecar/src/main.rs`.

use std::io::Write;

use agent_reach_sidecar::{Sidecar, SidecarArgs, SidecarConfig};
use clap::Parser;

fn main() -> Result<(), String> {
    let args = SidecarArgs::parse();
    let config = SidecarConfig::try_from(&args)?;
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = agent_reach_support::process::runtime(args.worker_threads).map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let bind = |addr: std::net::SocketAddr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("{addr}: {e}"))
        };
        let local = bind(args.listen).await?;
        let mesh = bind(args.mesh_listen).await?;
        let admin = bind(args.admin_listen.parse().map_err(|e| format!("--admin-listen: {e}"))?).await?;
        let addr = |l: &tokio::net::TcpListener| l.local_addr().map_err(|e| e.to_string());
        let ready = format!("READY local={} mesh={} admin={}", addr(&local)?, addr(&mesh)?, addr(&admin)?);
        let sidecar = Sidecar::start_with_admin(config, local, mesh, Some(admin)).await.map_err(|e| e.to_string())?;
        let mut out = std::io::stdout();
        writeln!(out, "{ready}").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
        sidecar.run_until(agent_reach_support::process::shutdown_signal()).await;
        Ok(())
    })
}
