//! `agent-reach-sidecar`: the sidecar binary.

// The sidecar's allocation pattern (many small, short-lived buffers per call) is where
// glibc malloc showed up at 9-12 % of the CPU in profiles (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: agent_reach_sidecar::alloc::Mimalloc = agent_reach_sidecar::alloc::Mimalloc;

/// Frees this thread's empty pages and purges every arena's freed memory now: called after
/// each swap of a large routing table (see `control::set_after_swap`).
fn collect() {
    // SAFETY: mimalloc's collect may run on any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

use agent_reach_sidecar::{Sidecar, SidecarArgs, SidecarConfig};
use clap::Parser;

fn main() -> std::process::ExitCode {
    agent_reach_sidecar::control::set_after_swap(collect);
    let args = SidecarArgs::parse();
    let config = match SidecarConfig::try_from(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-reach-sidecar: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = match agent_reach_support::process::runtime(args.worker_threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agent-reach-sidecar: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-reach-sidecar: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: SidecarArgs, config: SidecarConfig) -> Result<(), String> {
    if args.insecure_plaintext_control {
        tracing::warn!(
            "INSECURE: --insecure-plaintext-control: no certificate; control and the mesh port are plaintext, so \
             anyone on the network can read calls and impersonate this sidecar's tenant"
        );
    }
    let local =
        tokio::net::TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let mesh = tokio::net::TcpListener::bind(args.mesh_listen)
        .await
        .map_err(|e| format!("--mesh-listen {}: {e}", args.mesh_listen))?;
    let admin = match args.admin_listen.as_str() {
        "off" => None,
        addr => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--admin-listen {addr}: {e}"))?),
    };
    let sidecar = Sidecar::start_with_admin(config, local, mesh, admin).await.map_err(|e| e.to_string())?;
    sidecar.run_until(agent_reach_support::process::shutdown_signal()).await;
    Ok(())
}
