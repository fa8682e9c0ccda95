//! The sidecar's side of the control service: a client over one or more control endpoints
//! (moving to the next one when a replica fails), and the watch loop that keeps the routing
//! table in step with the store.
//!
//! The watch loop applies a snapshot by replacing the whole table and deltas strictly in
//! revision order: a delta whose revision does not move forward is rejected and counted,
//! and one that does not follow the table's revision (its `prev_revision` is newer than
//! the table) is refused, counted, and the stream resumed from the table's revision. While
//! control is unreachable it keeps the last table and reconnects with capped, jittered
//! backoff, to the next control endpoint each time, resuming from the last applied
//! revision. After a reconnection the sidecar's own loop holds removals for a grace period
//! ([`crate::grace`]), so records lost to lease expiry during a long outage stay routable
//! until their sidecars register them again.
//!
//! Files: [`failover`] (the one failover loop every control call goes through), `watch.rs`
//! (the watch loop and snapshot parts), `apply.rs` (applying watch events to the table).

mod apply;
pub(crate) mod failover;
#[cfg(test)]
mod tests;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent_reach::proto;
use agent_reach::proto::control_client::ControlClient;
use agent_reach::proto::identity_client::IdentityClient;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

pub use apply::{Converted, Ready, apply, apply_batch, apply_batch_holding, apply_ready, convert_instance};
pub(crate) use failover::{Failover, Rules};
pub use watch::{Applied, SnapshotParts, WatchObserver, run_watch, run_watch_holding, run_watch_observed};

/// The largest message taken from control: a snapshot part (control sends a large tenant's
/// snapshot in parts of about 1 MiB; one instance larger than that travels alone), or a
/// delta of one revision.
pub const MAX_CONTROL_MESSAGE: usize = 16 * 1024 * 1024;

/// Clients of every configured control endpoint.
pub struct ControlClients {
    control: Failover<ControlClient<Channel>>,
    /// The identity service on the same channels, in the same order.
    identity: Failover<IdentityClient<Channel>>,
    /// The channels themselves (TLS when the sidecar has an identity), for the other
    /// services of control the sidecar calls (sessions, tasks).
    channels: Vec<(String, Channel)>,
}

impl ControlClients {
    /// Lazily connecting clients; nothing is dialled until the first call.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<ControlClients, String> {
        ControlClients::with_tls(endpoints, timeout, None)
    }

    /// [`ControlClients::new`], over TLS with `tls`'s current configuration when given.
    pub fn with_tls(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<Arc<crate::identity::ControlTls>>,
    ) -> Result<ControlClients, String> {
        let channels = endpoints
            .iter()
            .map(|e| {
                let uri = if e.contains("://") { e.clone() } else { format!("http://{e}") };
                let ep = Endpoint::from_shared(uri.clone())
                    .map_err(|err| format!("--control: bad endpoint {e:?}: {err}"))?
                    .tcp_nodelay(true)
                    .connect_timeout(timeout)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5));
                let channel = match &tls {
                    Some(tls) => ep.connect_with_connector_lazy(crate::identity::TlsConnector::control(tls.clone())),
                    None => ep.connect_lazy(),
                };
                Ok((uri, channel))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let identity = channels.iter().map(|(uri, c)| (uri.clone(), IdentityClient::new(c.clone()))).collect();
        let control = channels
            .iter()
            .map(|(uri, c)| (uri.clone(), ControlClient::new(c.clone()).max_decoding_message_size(MAX_CONTROL_MESSAGE)))
            .collect();
        Ok(ControlClients {
            control: Failover::new(control, timeout, Rules::Sidecar)?,
            identity: Failover::new(identity, timeout, Rules::Sidecar)?,
            channels,
        })
    }

    /// Every control endpoint with its (lazily connecting) channel, in order.
    pub(crate) fn channels(&self) -> Vec<(String, Channel)> {
        self.channels.clone()
    }

    /// Asks control's identity service for a certificate, trying each endpoint once while
    /// they answer UNAVAILABLE or time out.
    pub async fn issue_certificate(
        &self,
        request: proto::IssueCertificateRequest,
    ) -> Result<proto::IssueCertificateReply, Status> {
        self.identity
            .call(|mut client| {
                let request = request.clone();
                async move { client.issue_certificate(request).await }
            })
            .await
    }

    /// Calls control, trying each endpoint once (starting with the last one that worked)
    /// while they answer UNAVAILABLE or time out.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(ControlClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.control.call(f).await
    }

    /// The endpoint at `index` (modulo the number of endpoints).
    fn endpoint(&self, index: usize) -> (&str, ControlClient<Channel>) {
        self.control.endpoint(index)
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.control.len()
    }

    pub fn is_empty(&self) -> bool {
        self.control.len() == 0
    }
}

/// Called after each table swap, on the thread that built the table and again on the watch
/// loop's: the binary hands memory the swap freed back to the OS there (the sidecar binary
/// asks mimalloc to collect, see its `main.rs`). Every batch rebuilds the table whole and
/// frees the previous one; without this, an idle sidecar keeps those pages resident until
/// the allocator's next purge, which only allocation activity brings.
static AFTER_SWAP: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets the function called after each table swap (the first call wins).
pub fn set_after_swap(f: fn()) {
    let _ = AFTER_SWAP.set(f);
}

/// Runs the function set by [`set_after_swap`], if any, after a swap to a table of
/// `instances` instances: from [`COLLECT_MIN_INSTANCES`] on, where the swap freed a
/// previous table worth collecting (and its rebuild cost far more than the collection).
pub(crate) fn after_swap(instances: usize) {
    if instances >= COLLECT_MIN_INSTANCES
        && let Some(f) = AFTER_SWAP.get()
    {
        f();
    }
}

/// Tables smaller than this are swapped without [`after_swap`]'s collection.
pub const COLLECT_MIN_INSTANCES: usize = 1000;

/// Counters of the watch loop.
#[derive(Debug, Default)]
pub struct WatchStats {
    pub connected: AtomicBool,
    /// Watch streams opened (the first connection and every reconnection).
    pub connections: AtomicU64,
    pub snapshots: AtomicU64,
    /// Snapshots flagged `resync` (the sidecar's revision was compacted away).
    pub resyncs: AtomicU64,
    pub deltas: AtomicU64,
    /// Deltas whose revision did not move forward, rejected.
    pub rejected: AtomicU64,
    /// Unix milliseconds when the table was last known to match control (an event applied
    /// or a watch established); 0 = never.
    pub confirmed_at_ms: AtomicU64,
    /// Deltas that did not follow the table's revision (changes were missed): the stream
    /// is dropped and resumed from the table's revision.
    pub gaps: AtomicU64,
    /// Instances or policies from control that failed conversion and were skipped.
    pub invalid_instances: AtomicU64,
    /// Removals held after a reconnection ([`crate::grace`]).
    pub held_removals: AtomicU64,
    /// Held removals applied because their instance did not register again in time.
    pub held_expired: AtomicU64,
}

impl WatchStats {
    /// Records that the table matches control now.
    pub fn confirm(&self) {
        self.confirmed_at_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// Whether the table may be out of date (no live watch), and for how long it has not
    /// been confirmed.
    pub fn staleness(&self) -> (bool, Duration) {
        let stale = !self.connected.load(Ordering::Relaxed);
        let at = self.confirmed_at_ms.load(Ordering::Relaxed);
        let age = if at == 0 { Duration::ZERO } else { Duration::from_millis(unix_ms().saturating_sub(at)) };
        (stale, if stale { age } else { Duration::ZERO })
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
