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
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = match agent_reach_support::process::runtime(args.worker_threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agent-reach-control: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent_reach_control::run(args, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-reach-control: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
