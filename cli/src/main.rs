//! `agent-reach`: the command-line entry point.
//!
//! - `agent-reach up`: a development mesh in one process — the control service on the
//!   embedded store plus one sidecar — for running your own agents against.
//! - `agent-reach demo`: control, two sidecars and sample agents in one process; makes calls
//!   by capability and shows where they went, then exits.
//! - `agent-reach ctl`: operators' commands over the control service's Admin API (agents,
//!   instances, pause/resume, policies, tenants, route explanations).

// The sidecar's allocation pattern (many small, short-lived buffers per call) is where
// glibc malloc showed up at 9-12 % of the CPU in profiles (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: agent_reach_sidecar::alloc::Mimalloc = agent_reach_sidecar::alloc::Mimalloc;

mod ctl;
mod demo;
mod dev;
mod output;
mod session;
mod trace;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use agent_reach_control::{ControlConfig, ControlHandle};
use agent_reach_sidecar::{Sidecar, SidecarConfig};
use agent_reach_store::EmbeddedStore;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "agent-reach", version, about = "Agent-Reach: a service mesh for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a development mesh: control (embedded store) + one sidecar, until ctrl-c.
    Up(UpArgs),
    /// Run a self-contained demo: control, two sidecars, sample agents, calls; then exit.
    Demo(DemoArgs),
    /// Show the recent hops of a trace, from the sidecars' in-memory span buffers.
    Trace(TraceArgs),
    /// Inspect and change the mesh through the control service's Admin API.
    Ctl(ctl::CtlArgs),
}

#[derive(clap::Args)]
struct TraceArgs {
    /// The trace id (32 hex digits, the second field of a traceparent).
    trace_id: String,
    /// Admin address of a sidecar to ask (repeat for several).
    #[arg(long = "admin", default_value = "127.0.0.1:7702")]
    admins: Vec<String>,
    /// Output: "tree" or "json".
    #[arg(long, default_value = "tree", value_parser = ["tree", "json"])]
    output: String,
}

#[derive(clap::Args)]
struct UpArgs {
    /// Control service gRPC address.
    #[arg(long, env = "AGENT_REACH_CONTROL_LISTEN", default_value = "127.0.0.1:7800")]
    control_listen: SocketAddr,
    /// Sidecar local API address (agents connect here).
    #[arg(long, env = "AGENT_REACH_LISTEN", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Sidecar mesh API address.
    #[arg(long, env = "AGENT_REACH_MESH_LISTEN", default_value = "127.0.0.1:7701")]
    mesh_listen: SocketAddr,
    /// Sidecar admin HTTP address (/metrics, /healthz, /readyz, /traces).
    #[arg(long, env = "AGENT_REACH_ADMIN_LISTEN", default_value = "127.0.0.1:7702")]
    admin_listen: SocketAddr,
    /// Sidecar A2A JSON-RPC address (agent cards at /agents/{agent}/.well-known/agent-card.json).
    #[arg(long, env = "AGENT_REACH_A2A_LISTEN", default_value = "127.0.0.1:7703")]
    a2a_listen: SocketAddr,
    /// Dashboard address (loopback only in dev mode; log in with the admin token).
    #[arg(long, env = "AGENT_REACH_DASHBOARD_LISTEN", default_value = "127.0.0.1:7802")]
    dashboard_listen: SocketAddr,
    /// Lease TTL of registrations.
    #[arg(long, env = "AGENT_REACH_LEASE_TTL", default_value = "20s", value_parser = agent_reach_support::duration::parse)]
    lease_ttl: Duration,
    /// Log format: "text" or "json".
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Show the mesh's own logs (they are hidden by default to keep the demo readable).
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match agent_reach_support::process::runtime(0) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agent-reach: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Up(args) => {
            agent_reach_support::process::init_logging(&args.log_format);
            runtime.block_on(up(args))
        }
        Command::Trace(args) => runtime.block_on(trace::run(&args.trace_id, &args.admins, args.output == "json")),
        Command::Demo(args) => {
            if args.verbose {
                agent_reach_support::process::init_logging("text");
            }
            runtime.block_on(demo::run())
        }
        Command::Ctl(args) => {
            let mut out = std::io::stdout().lock();
            return match runtime.block_on(ctl::run(args, &mut out)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("agent-reach ctl: {e}");
                    ExitCode::from(e.exit_code())
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-reach: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn up(args: UpArgs) -> Result<(), String> {
    let bind = |addr: SocketAddr, flag: &'static str| async move {
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("{flag} {addr}: {e}"))
    };
    let control_listener = bind(args.control_listen, "--control-listen").await?;
    let local = bind(args.listen, "--listen").await?;
    let mesh = bind(args.mesh_listen, "--mesh-listen").await?;
    let admin = bind(args.admin_listen, "--admin-listen").await?;
    agent_reach_control::dashboard::check_listen_address(args.dashboard_listen)?;
    let dashboard = bind(args.dashboard_listen, "--dashboard-listen").await?;
    let dashboard_addr = dashboard.local_addr().map_err(|e| e.to_string())?;
    let store: std::sync::Arc<dyn agent_reach_store::Store> = std::sync::Arc::new(EmbeddedStore::default());
    let (admin_token, admin_token_file) = dev::admin_token()?;
    // Secure by default: mutual TLS on the control port with a CA generated here, and the
    // sidecar buying its certificate with a join token made here.
    let control = ControlHandle::spawn_with_dashboard(
        store.clone(),
        ControlConfig {
            lease_ttl: args.lease_ttl,
            mtls: agent_reach_control::identity::Mtls::Required,
            admin_token: Some(admin_token),
            ..ControlConfig::default()
        },
        control_listener,
        dashboard,
    )
    .map_err(|e| e.to_string())?;
    let mut config = SidecarConfig::new(vec![control.endpoint()]);
    config.identity = Some(dev::identity(&store, &control, &config.tenant).await?);
    config.a2a_listen = Some(args.a2a_listen);
    let bundle = dev::write_bundle(&control)?;
    let sidecar = Sidecar::start_with_admin(config, local, mesh, Some(admin)).await.map_err(|e| e.to_string())?;
    println!("Agent-Reach dev mesh is up (embedded store: state lives in this process only).");
    println!("  control   {}   (Control API, grpc.health.v1)", control.addr());
    println!("  dashboard http://{dashboard_addr}/   (log in with the admin token below)");
    println!("  sidecar   {}   (local API: agents Register and Invoke here)", sidecar.local_addr());
    println!("            {}   (mesh API)", sidecar.mesh_addr());
    if let Some(admin) = sidecar.admin_addr() {
        println!("            {admin}   (admin: /metrics /healthz /readyz /traces/<trace-id>)");
    }
    if let Some(a2a) = sidecar.a2a_addr() {
        println!("            http://{a2a}/agents/<agent>   (A2A JSON-RPC; A2A gRPC on the local API port)");
    }
    println!();
    println!("  identity  mutual TLS on the control and mesh ports; development CA generated at start");
    println!("            trust bundle written to {}", bundle.display());
    println!("  admin     bootstrap admin token written to {}", admin_token_file.display());
    println!(
        "            agent-reach ctl --control {} --trust-bundle-file {} --token-file {} agents",
        control.addr(),
        bundle.display(),
        admin_token_file.display()
    );
    println!();
    println!("Point agents at it with AGENT_REACH_SIDECAR={} (the SDK's default). Ctrl-C stops.", sidecar.local_addr());
    agent_reach_support::process::shutdown_signal().await;
    println!("stopping");
    sidecar.shutdown().await;
    control.shutdown().await;
    Ok(())
}
