//! `agent-reach-bench`: measurements of the Agent-Reach call path.
//!
//! - `latency`: quick in-process probe, direct vs two sidecar hops, sequential calls.
//! - `run`: the side-by-side benchmark against nginx and Envoy (see `bench/run.sh` and
//!   BENCHMARKS.md); writes `latest.json` and `latest.md`.
//! - `up`: starts every path as `run` does and keeps it up (for profiling).
//! - `load`: the open-loop fixed-rate generator `run` uses; prints JSON.
//! - `agent`: the echo agent `run` uses.
//! - `sidecar`, `control`: the sidecar and control service run from this binary (the
//!   smoke test's `run --embedded`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use agent_reach_bench::load::{self, LoadSpec};
use agent_reach_bench::orchestrate::{self, RunArgs};
use agent_reach_bench::wire::Kind;
use agent_reach_bench::{agent, embedded, latency};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "agent-reach-bench", about = "Measurements of the Agent-Reach call path")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn duration(s: &str) -> Result<Duration, String> {
    agent_reach::duration::parse(s)
}

#[derive(Subcommand)]
enum Command {
    /// Sequential call latency: direct to the agent vs through two sidecars (one process).
    Latency {
        /// Calls per path (after warm-up).
        #[arg(long, default_value_t = 5000)]
        calls: usize,
        /// Payload size in bytes.
        #[arg(long, default_value_t = 12)]
        payload: usize,
        /// Runtime worker threads for everything in the process.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// The benchmark against nginx and Envoy on the same hop, all paths in one run.
    Run(RunArgs),
    /// Starts every path as `run` does and keeps it up until ctrl-c (for profiling).
    Up(RunArgs),
    /// Open-loop load at a fixed rate against one path; prints the result as JSON.
    Load {
        /// First hop ("127.0.0.1:port").
        #[arg(long)]
        addr: SocketAddr,
        /// `agent`: Agent/Handle (direct, nginx, Envoy); `mesh`: Sidecar/Invoke.
        #[arg(long, value_enum)]
        kind: Kind,
        #[arg(long, default_value_t = 12)]
        payload: usize,
        /// Calls per second.
        #[arg(long)]
        rate: f64,
        #[arg(long, default_value = "10s", value_parser = duration)]
        duration: Duration,
        #[arg(long, default_value = "2s", value_parser = duration)]
        warmup: Duration,
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// A call unanswered after this counts as an error.
        #[arg(long, default_value = "5s", value_parser = duration)]
        timeout: Duration,
    },
    /// The echo agent: registers with a sidecar and answers every call with its payload.
    Agent {
        /// The sidecar's local API ("host:port").
        #[arg(long)]
        sidecar: String,
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Runtime worker threads (1 = a single-threaded runtime).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Leave the SDK's sockets without TCP_NODELAY (see the `agent` module).
        #[arg(long)]
        no_nodelay_workaround: bool,
    },
    /// agent-reach-sidecar, run from this binary (same flags).
    #[command(hide = true)]
    Sidecar {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// agent-reach-control, run from this binary (same flags).
    #[command(hide = true)]
    Control {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Latency { calls, payload, threads } => latency::run(calls, payload, threads),
        Command::Run(args) => match orchestrate::run_blocking(args) {
            Ok(report) if report.ok => Ok(()),
            Ok(report) => Err(format!("paths answered errors:\n  {}", report.failures.join("\n  "))),
            Err(e) => Err(e),
        },
        Command::Up(args) => orchestrate::up_blocking(args),
        Command::Load { addr, kind, payload, rate, duration, warmup, connections, timeout } => {
            let spec = LoadSpec { addr, kind, payload, rate, duration, warmup, connections, timeout };
            load::run(&spec)
                .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string()))
                .map(|json| println!("{json}"))
        }
        Command::Agent { sidecar, listen, threads, no_nodelay_workaround } => {
            agent_reach::process::runtime(threads).map_err(|e| format!("runtime: {e}")).and_then(|rt| {
                agent_reach::process::init_logging("text");
                rt.block_on(agent::run(sidecar, listen, !no_nodelay_workaround))
            })
        }
        Command::Sidecar { args } => embedded::sidecar(&args),
        Command::Control { args } => embedded::control(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-reach-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
