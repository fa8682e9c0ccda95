//! The control service in a process of its own, for tests that measure its memory (RSS)
//! while hostile clients hit it: `control-proc [agent-reach-control flags...]`, the same
//! flags and start as `agent-reach-control` (built from the current source with the tests,
//! unlike `target/debug/agent-reach-control`, which the test command does not rebuild),
//! its store the etcd of `--etcd-endpoints`. Prints `READY grpc=ADDR` on stdout once its
//! gRPC port listens (pass `--listen 127.0.0.1:0` to have the port chosen), then runs
//! until SIGTERM. Keep in step with `agent_reach_control::run` (`control/src/lib.rs`);
//! unlike it, no admin HTTP port (`--admin-listen` must be "off").

use std::io::Write;
use std::sync::Arc;

use agent_reach_control::{ControlArgs, ControlConfig, ControlStats, EtcdTlsFiles};
use clap::Parser;

fn main() -> Result<(), String> {
    let args = ControlArgs::parse();
    let config = ControlConfig::try_from(&args)?;
    if args.admin_listen != "off" {
        return Err("control-proc serves no admin HTTP port: pass --admin-listen off".into());
    }
    agent_reach_support::process::init_logging(&args.log_format);
    let runtime = agent_reach_support::process::runtime(args.worker_threads).map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let tls = EtcdTlsFiles {
            ca: args.etcd_ca_file.clone(),
            cert: args.etcd_cert_file.clone(),
            key: args.etcd_key_file.clone(),
            username: args.etcd_username.clone(),
            password_file: args.etcd_password_file.clone(),
        };
        let store = agent_reach_control::open_store(&args.etcd_endpoints, args.etcd_timeout, &tls).await?;
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
        let dashboard = match args.dashboard_listen.as_str() {
            "off" => None,
            addr => {
                Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--dashboard-listen {addr}: {e}"))?)
            }
        };
        let ready = format!("READY grpc={}", listener.local_addr().map_err(|e| e.to_string())?);
        let mut out = std::io::stdout();
        writeln!(out, "{ready}").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
        let stats = Arc::new(ControlStats::default());
        agent_reach_control::serve_parts(
            store,
            config,
            stats,
            listener,
            dashboard,
            agent_reach_support::process::shutdown_signal(),
        )
        .await
        .map_err(|e| e.to_string())
    })
}
