//! The echo agent every path ends at: an agent written with the Rust SDK that answers each
//! call with its own payload, registered with a sidecar under the capability
//! [`crate::wire::CAPABILITY`]. It runs in its own process (`agent-reach-bench agent`) with
//! its own runtime, so its CPU is separate from the proxies'. The direct, nginx and Envoy
//! paths call its `Agent/Handle` on the listen address; the mesh path reaches it through
//! the sidecar it registered with.
//!
//! TCP_NODELAY: the SDK now sets it on every connection it accepts. An earlier SDK did
//! not (tonic's `serve_with_incoming_shutdown` ignores `Server::tcp_nodelay`), and replies
//! written in two pieces waited for the peer's delayed ACK (~40 ms stalls with 1 KiB
//! payloads), so this agent also sets it on its listening socket (accepted sockets inherit
//! it on Linux; [`set_listener_nodelay`]). That is redundant now (measured alike both
//! ways); `--no-nodelay-workaround` measures the SDK alone.

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::{Agent, Reply};

use crate::wire::CAPABILITY;

/// Name the echo agent registers under.
pub const AGENT_NAME: &str = "bench-echo";

/// Serves until ctrl-c or SIGTERM, then deregisters.
pub async fn run(sidecar: String, listen: SocketAddr, nodelay_workaround: bool) -> Result<(), String> {
    let agent = Agent::builder(AGENT_NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .sidecar(sidecar)
        .listen(listen)
        .drain_timeout(Duration::from_secs(2))
        .handle(CAPABILITY, |call| async move { Ok(Reply::bytes(call.payload().clone())) })
        .start()
        .await
        .map_err(|e| format!("echo agent: {e}"))?;
    // Only on a single-threaded runtime: see `set_listener_nodelay`.
    let single_threaded =
        tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
    if nodelay_workaround && !single_threaded {
        eprintln!("echo agent: TCP_NODELAY workaround skipped (it needs a single-threaded runtime)");
    }
    if nodelay_workaround && single_threaded {
        let port = agent.endpoint().rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).unwrap_or(0);
        let set = set_listener_nodelay(port);
        if set == 0 {
            eprintln!("echo agent: found no listening socket on port {port} to set TCP_NODELAY on");
        }
    }
    println!("ready {} {}", agent.endpoint(), agent.instance_id());
    agent_reach::process::shutdown_signal().await;
    agent.shutdown().await;
    Ok(())
}

/// Sets TCP_NODELAY on this process's sockets bound to `port` (the SDK's listener, and any
/// connection it already accepted); returns how many listening sockets it found. Call it
/// from a single-threaded runtime's task, before any traffic: nothing else can close a
/// descriptor while it runs.
pub fn set_listener_nodelay(port: u16) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    let fds: Vec<i32> = dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect();
    let mut listeners = 0;
    for raw in fds {
        // SAFETY: `raw` was listed in /proc/self/fd just above and this process closes no
        // descriptor while this loop runs (see the doc comment); the borrow is used only for
        // the syscalls below. A descriptor that is not a socket makes them fail harmlessly.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
        let bound = rustix::net::getsockname(fd).ok().and_then(|a| SocketAddr::try_from(a).ok());
        if bound.is_some_and(|a| a.port() == port) && rustix::net::sockopt::set_tcp_nodelay(fd, true).is_ok() {
            listeners += usize::from(rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false));
        }
    }
    listeners
}
