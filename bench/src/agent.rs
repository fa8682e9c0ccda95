//! The echo agent every path ends at: an agent written with the Rust SDK that answers each
//! call with its own payload, registered with a sidecar under the capability
//! [`crate::wire::CAPABILITY`]. It runs in its own process (`agent-reach-bench agent`) with
//! its own runtime, so its CPU is separate from the proxies'. The direct, nginx and Envoy
//! paths call its `Agent/Handle` on the listen address; the mesh path reaches it through
//! the sidecar it registered with.
//!
//! Streamed calls of the same capability (`Agent/HandleStream`, reached by the mesh's
//! `Sidecar/InvokeStream`) carry a chunk count as their payload
//! ([`crate::wire::stream_request_body`]); the answer is that many chunks of
//! [`STREAM_CHUNK`] bytes each, one buffer built at start and shared by every chunk, so
//! the agent's cost per chunk is the encoding and the write, the same on every path.
//!
//! The SDK sets TCP_NODELAY on every connection the agent accepts, so replies written in
//! pieces do not wait for the peer's delayed ACK.

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::{Agent, HandlerError, Reply};

use crate::wire::{self, CAPABILITY, STREAM_CHUNK};

/// Name the echo agent registers under.
pub const AGENT_NAME: &str = "bench-echo";

/// Serves until ctrl-c or SIGTERM, then deregisters.
pub async fn run(sidecar: String, listen: SocketAddr) -> Result<(), String> {
    let chunk = wire::payload(STREAM_CHUNK);
    let agent = Agent::builder(AGENT_NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .sidecar(sidecar)
        .listen(listen)
        .drain_timeout(Duration::from_secs(2))
        .handle(CAPABILITY, |call| async move { Ok(Reply::bytes(call.payload().clone())) })
        .handle_stream(CAPABILITY, move |call| {
            let (n, refused) = match wire::parse_stream_request(call.payload()) {
                Ok(n) => (n, None),
                Err(e) => (0, Some(Err(HandlerError::invalid_argument(e)))),
            };
            let chunk = chunk.clone();
            tokio_stream::iter(refused.into_iter().chain((0..n).map(move |_| Ok(Reply::bytes(chunk.clone())))))
        })
        .start()
        .await
        .map_err(|e| format!("echo agent: {e}"))?;
    println!("ready {} {}", agent.endpoint(), agent.instance_id());
    agent_reach_support::process::shutdown_signal().await;
    agent.shutdown().await;
    Ok(())
}
