//! `agent-reach-control`: the control service binary.

use agent_reach_control::{ControlArgs, ControlConfig};
use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = ControlArgs::parse();
    let config = match ControlConfig::try_from(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-reach-control: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    agent_reach::process::init_logging(&args.log_format);
    let runtime = match agent_reach::process::runtime(args.worker_threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agent-reach-control: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-reach-control: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: ControlArgs, config: ControlConfig) -> Result<(), String> {
    let store = agent_reach_control::open_store(&args.etcd_endpoints, args.etcd_timeout)
        .await
        .map_err(|e| format!("--etcd-endpoints: {e}"))?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    tracing::info!(listen = %args.listen, store = store.backend(), lease_ttl = ?config.lease_ttl, "control service started");
    agent_reach_control::serve(store, config, listener, agent_reach::process::shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}
