//! `agent-reach-bench`: measurements of the Agent-Reach call path.
//!
//! - `latency`: quick in-process probe, direct vs two sidecar hops, sequential calls.
//! - `run`: the side-by-side benchmark against nginx and Envoy (see `bench/run.sh` and
//!   BENCHMARKS.md); writes `latest.json` and `latest.md`.
//! - `up`: starts every path as `run` does and keeps it up (for profiling).
//! - `load`: the open-loop fixed-rate generator `run` uses; prints JSON.
//! - `stream`: the streaming client `run` uses (64 KiB chunks); prints JSON.
//! - `agent`: the echo agent `run` uses.
//! - `overload`: one instance offered a multiple of its capacity through two sidecars
//!   (admission control of issue #6).
//! - `instructions`: instructions per call of each sidecar, and of each nginx of the
//!   nginx → nginx path, under valgrind's callgrind (`--tls`: with TLS between the hops,
//!   as `run --tls`).
//! - `table-rss`: sidecar memory with large routing tables alone (the table of `run`).
//! - `fill`: registers fake instances with a running control service (for heap profiles
//!   of a sidecar holding them).
//! - `sidecar`, `control`: the sidecar and control service run from this binary (the
//!   smoke test's `run --embedded`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use agent_reach_bench::load::{self, LoadSpec};
use agent_reach_bench::orchestrate::{self, RunArgs};
use agent_reach_bench::stream::{self, StreamSpec};
use agent_reach_bench::wire::Kind;
use agent_reach_bench::{agent, embedded, instructions, latency, overload, table_rss};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "agent-reach-bench", about = "Measurements of the Agent-Reach call path")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn duration(s: &str) -> Result<Duration, String> {
    agent_reach_support::duration::parse(s)
}

/// "H:N:L" percentages summing to 100.
fn mix(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<u32> =
        s.split(':').map(|p| p.trim().parse::<u32>()).collect::<Result<_, _>>().map_err(|e| format!("{s:?}: {e}"))?;
    match parts[..] {
        [h, n, l] if h + n + l == 100 => Ok([h, n, l]),
        _ => Err(format!("{s:?}: expected HIGH:NORMAL:LOW percentages summing to 100")),
    }
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
    /// One instance offered a multiple of its capacity through two sidecars (one process):
    /// shed vs admitted latency, goodput, most calls in the agent at once.
    Overload {
        /// The agent's concurrency slots (max_concurrency).
        #[arg(long, default_value_t = 8)]
        slots: u32,
        /// Time the agent spends on each call.
        #[arg(long, default_value = "100ms", value_parser = duration)]
        work: Duration,
        /// Offered load as a multiple of capacity (slots / work).
        #[arg(long, default_value_t = 3.0)]
        factor: f64,
        /// Percent of calls sent HIGH:NORMAL:LOW.
        #[arg(long, default_value = "20:60:20", value_parser = mix)]
        mix: [u32; 3],
        /// The policy's admission queue length per priority.
        #[arg(long, default_value_t = 4)]
        queue_length: u32,
        /// The policy's admission queue timeout.
        #[arg(long, default_value = "5ms", value_parser = duration)]
        queue_timeout: Duration,
        /// Seconds of offered load.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Runtime worker threads for everything in the process.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
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
    /// Server-streaming calls of 64 KiB chunks against one path for a fixed duration;
    /// prints the payload MB/s and every stream's outcome as JSON.
    Stream {
        /// First hop ("127.0.0.1:port").
        #[arg(long)]
        addr: SocketAddr,
        /// `agent`: Agent/HandleStream (direct, nginx, Envoy); `mesh`: Sidecar/InvokeStream.
        #[arg(long, value_enum)]
        kind: Kind,
        /// Chunks of 64 KiB each stream asks for.
        #[arg(long, default_value_t = 64)]
        chunks: u32,
        /// Streams in flight at once.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        #[arg(long, default_value_t = 2)]
        connections: usize,
        #[arg(long, default_value = "10s", value_parser = duration)]
        duration: Duration,
        #[arg(long, default_value = "2s", value_parser = duration)]
        warmup: Duration,
        /// A stream not finished after this counts as an error.
        #[arg(long, default_value = "30s", value_parser = duration)]
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
    },
    /// Sidecar memory with large routing tables, alone (the `run` table); prints JSON.
    TableRss {
        /// Table sizes (instances).
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        sizes: Vec<usize>,
        /// Run the sidecar and control from this binary instead of the release binaries.
        #[arg(long)]
        embedded: bool,
    },
    /// Instructions per call of each sidecar, and of each nginx of the nginx → nginx path,
    /// counted by valgrind's callgrind (needs valgrind); prints JSON (and the two side by
    /// side on stderr). A measure that does not depend on the machine's load.
    Instructions {
        /// Calls counted (after the warm-up).
        #[arg(long, default_value_t = 2000)]
        calls: usize,
        #[arg(long, default_value_t = 200)]
        warmup: usize,
        /// Callers, each sending its share of the calls one after another.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        #[arg(long, default_value_t = 12)]
        payload: usize,
        /// Run the sidecar and control from this binary instead of the release binaries.
        #[arg(long)]
        embedded: bool,
        /// Count the sidecars only, not the nginx → nginx path beside them.
        #[arg(long)]
        no_nginx: bool,
        /// TLS 1.3 with client certificates between the two hops, as `run --tls`: mutual
        /// TLS between the sidecars (certificates from control), nginx A → nginx B with
        /// `grpc_pass grpcs://`.
        #[arg(long)]
        tls: bool,
        /// Keep callgrind's output files (the counted window of each process is
        /// `callgrind.<process>.1`, for `callgrind_annotate`) and the logs in this directory
        #[arg(long)]
        keep: Option<std::path::PathBuf>,
    },
    /// Registers fake instances (as `table-rss` does) with a running control service.
    Fill {
        /// The control service's gRPC port on 127.0.0.1 (plaintext, `--mtls off`).
        #[arg(long)]
        control_port: u16,
        #[arg(long, default_value_t = 10_000)]
        instances: usize,
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
        Command::Overload { slots, work, factor, seconds, threads, mix, queue_length, queue_timeout } => {
            let spec = overload::OverloadSpec { slots, work, factor, seconds, mix, queue_length, queue_timeout };
            agent_reach_support::process::runtime(threads)
                .map_err(|e| format!("runtime: {e}"))
                .and_then(|rt| rt.block_on(overload::run(spec)))
        }
        Command::Load { addr, kind, payload, rate, duration, warmup, connections, timeout } => {
            let spec = LoadSpec { addr, kind, payload, rate, duration, warmup, connections, timeout };
            load::run(&spec)
                .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string()))
                .map(|json| println!("{json}"))
        }
        Command::Stream { addr, kind, chunks, concurrency, connections, duration, warmup, timeout } => {
            let spec = StreamSpec { addr, kind, chunks, concurrency, connections, duration, warmup, timeout };
            stream::run(&spec)
                .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string()))
                .map(|json| println!("{json}"))
        }
        Command::Agent { sidecar, listen, threads } => {
            agent_reach_support::process::runtime(threads).map_err(|e| format!("runtime: {e}")).and_then(|rt| {
                agent_reach_support::process::init_logging("text");
                rt.block_on(agent::run(sidecar, listen))
            })
        }
        Command::Instructions { calls, warmup, concurrency, payload, embedded, no_nginx, tls, keep } => {
            let spec =
                instructions::Spec { calls, warmup, concurrency, payload, embedded, nginx: !no_nginx, tls, keep };
            instructions::run_blocking(&spec)
        }
        Command::TableRss { sizes, embedded } => table_rss::run_blocking(&sizes, embedded),
        Command::Fill { control_port, instances } => agent_reach_support::process::runtime(2)
            .map_err(|e| format!("runtime: {e}"))
            .and_then(|rt| rt.block_on(table_rss::fill(control_port, instances)))
            .map(|revision| println!("{{\"revision\":{revision}}}")),
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
