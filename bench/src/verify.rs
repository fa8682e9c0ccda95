//! Checks a path with a real gRPC client (tonic) before it is loaded: h2load counts HTTP
//! statuses only, so each path must first prove that it answers `grpc-status` 0 with the
//! echoed payload. [`wait_ready`] retries until the first success (a sidecar's table may
//! still be converging); [`verify`] then requires every call to succeed.

use std::time::{Duration, Instant};

use agent_reach::proto::agent_client::AgentClient;
use agent_reach::proto::sidecar_client::SidecarClient;
use tonic::transport::{Channel, Endpoint};

use crate::wire::{self, Kind};

/// A gRPC client of one path's first hop.
pub struct PathClient {
    kind: Kind,
    channel: Channel,
}

impl PathClient {
    pub async fn connect(kind: Kind, port: u16) -> Result<PathClient, String> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        Ok(PathClient { kind, channel })
    }

    /// One call with `payload_len` bytes; Ok when the reply echoes the payload.
    pub async fn call(&self, payload_len: usize) -> Result<(), String> {
        let payload = wire::payload(payload_len);
        let reply = match self.kind {
            Kind::Agent => {
                let mut c = AgentClient::new(self.channel.clone());
                c.handle(wire::handle_request(&payload)).await.map(|r| r.into_inner().payload)
            }
            Kind::Mesh => {
                let mut c = SidecarClient::new(self.channel.clone());
                match c.invoke(wire::invoke_request(&payload)).await {
                    Ok(r) if r.get_ref().instance_id.is_empty() => {
                        return Err("the mesh reply names no serving instance".into());
                    }
                    r => r.map(|r| r.into_inner().payload),
                }
            }
        };
        match reply {
            Ok(p) if p == payload => Ok(()),
            Ok(p) => Err(format!("reply payload of {} bytes does not echo the {} sent", p.len(), payload.len())),
            Err(status) => Err(format!("grpc-status {:?}: {}", status.code(), status.message())),
        }
    }
}

/// Retries one call until it succeeds or `timeout` passes.
pub async fn wait_ready(kind: Kind, port: u16, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < until {
        match PathClient::connect(kind, port).await {
            Ok(c) => match c.call(12).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            },
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("no successful call within {timeout:?}: {last}"))
}

/// `calls` calls with `payload_len` bytes; all must succeed.
pub async fn verify(kind: Kind, port: u16, payload_len: usize, calls: usize) -> Result<usize, String> {
    let client = PathClient::connect(kind, port).await?;
    for i in 0..calls {
        client.call(payload_len).await.map_err(|e| format!("verification call {} of {calls}: {e}", i + 1))?;
    }
    Ok(calls)
}
