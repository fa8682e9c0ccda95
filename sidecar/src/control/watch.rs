//! The watch loop: one control endpoint at a time, resuming from the table's revision,
//! batching the events already received into one table build ([`super::apply`]), and
//! gathering the parts of a large snapshot ([`SnapshotParts`]) before it applies.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_routing::TableHandle;
use tokio::sync::watch;
use tonic::Status;

use super::apply::{Converted, Ready, apply_ready, release_held};
use super::{ControlClients, WatchStats};
use crate::grace::Held;

/// What one watch event did to the table (for observers such as tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The table was replaced by a snapshot.
    Snapshot { revision: i64, resync: bool },
    /// A delta moved the table from `from` to `revision` with `changes` upserts and
    /// removals (0 for a delta that only moves the revision on).
    Delta { from: i64, revision: i64, changes: usize },
    /// A delta was refused: `Backwards` (its revision does not move forward) or `Gap` (it
    /// does not follow the table's revision).
    Refused { revision: i64, table: i64, gap: bool },
}

/// Called after every watch event, with what it did.
pub type WatchObserver = Arc<dyn Fn(&Applied) + Send + Sync>;

/// Keeps `table` in step with control until `shutdown` turns true.
pub async fn run_watch(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    shutdown: watch::Receiver<bool>,
) {
    run_watch_observed(control, request, table, revision_tx, stats, None, shutdown).await
}

/// [`run_watch`], telling `observer` what every event did.
///
/// It watches one control endpoint at a time and moves to the next one whenever its stream
/// fails or ends, after a jittered backoff that grows with consecutive failures (capped at
/// 5 s). Each connection resumes from the table's revision.
pub async fn run_watch_observed(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    observer: Option<WatchObserver>,
    shutdown: watch::Receiver<bool>,
) {
    run_watch_holding(control, request, table, revision_tx, stats, observer, Duration::ZERO, shutdown).await
}

/// [`run_watch_observed`], holding the removals that arrive within `removal_grace` after
/// a reconnection (see [`crate::grace`]); zero applies every removal at once.
#[allow(clippy::too_many_arguments)]
pub async fn run_watch_holding(
    control: Arc<ControlClients>,
    request: proto::WatchRequest,
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    observer: Option<WatchObserver>,
    removal_grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let held = Some(Held::new(removal_grace));
    let mut watcher = Watcher { table, revision_tx, stats, observer, removal_grace, held, failures: 0 };
    let mut endpoint = 0usize;
    loop {
        let (uri, mut client) = control.endpoint(endpoint);
        let uri = uri.to_string();
        let mut req = request.clone();
        req.from_revision = watcher.table.load().revision;
        let outcome = tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            r = client.watch(req) => r,
        };
        match outcome {
            Ok(resp) => {
                if watcher.follow(&uri, resp.into_inner(), &mut shutdown).await.is_none() {
                    return;
                }
                watcher.stats.connected.store(false, Ordering::Relaxed);
            }
            Err(status) => tracing::warn!(control = %uri, "cannot watch: {}", status.message()),
        }
        // The next attempt goes to the next replica.
        endpoint = endpoint.wrapping_add(1);
        let wait = agent_reach_support::backoff::jittered(
            watcher.failures,
            Duration::from_millis(100),
            Duration::from_secs(5),
        );
        watcher.failures = watcher.failures.saturating_add(1);
        tokio::select! {
            _ = agent_reach_support::process::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What the watch loop keeps from one connection to the next.
struct Watcher {
    table: TableHandle,
    revision_tx: watch::Sender<i64>,
    stats: Arc<WatchStats>,
    observer: Option<WatchObserver>,
    removal_grace: Duration,
    /// Removals held after a reconnection (taken while a batch applies off the runtime).
    held: Option<Held>,
    /// Consecutive connections that ended without an event (for the backoff).
    failures: u32,
}

/// How a watch stream ended: `Err` with the stream's error, `Ok(None)` at its end.
type StreamEnd = Result<Option<proto::WatchEvent>, Status>;

impl Watcher {
    /// Applies the events of one watch stream until it fails, ends, or leaves a gap.
    /// None when `shutdown` turned true.
    async fn follow(
        &mut self,
        uri: &str,
        mut stream: tonic::Streaming<proto::WatchEvent>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<()> {
        self.stats.connected.store(true, Ordering::Relaxed);
        self.stats.confirm();
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = self.held.as_mut() {
            h.connected(tokio::time::Instant::now());
        }
        tracing::info!(control = %uri, revision = self.table.load().revision, "watching routing state");
        let mut parts = SnapshotParts::default();
        loop {
            let next_release = self.held.as_ref().and_then(Held::next_deadline);
            let msg = tokio::select! {
                _ = agent_reach_support::process::stopped(shutdown) => return None,
                m = stream.message() => m,
                _ = sleep_until_some(next_release) => {
                    if let Some(h) = self.held.as_mut() {
                        release_held(&self.table, h, &self.stats, tokio::time::Instant::now());
                        self.revision_tx.send_replace(self.table.load().revision);
                        super::after_swap(self.table.load().len());
                    }
                    continue;
                }
            };
            let ended = match msg {
                Ok(Some(event)) => {
                    self.failures = 0;
                    let (events, ended) = take_ready(&mut stream, &mut parts, event, &self.stats);
                    if events.is_empty() && ended.is_none() {
                        continue;
                    }
                    if !self.apply(uri, events).await {
                        return Some(());
                    }
                    match ended {
                        None | Some(Ok(Some(_))) => continue,
                        Some(end) => end,
                    }
                }
                end => end,
            };
            match ended {
                Err(status) => tracing::warn!(control = %uri, "watch stream failed: {}", status.message()),
                _ => tracing::warn!(control = %uri, "watch stream ended"),
            }
            return Some(());
        }
    }

    /// Applies `events` in one table build, off the runtime's thread, and tells the
    /// observer and the revision channel. False when the stream must be resumed (a gap:
    /// changes were missed; or the build failed).
    async fn apply(&mut self, uri: &str, events: Vec<Ready>) -> bool {
        let (t, st) = (self.table.clone(), self.stats.clone());
        let mut h = self.held.take().unwrap_or_else(|| Held::new(self.removal_grace));
        h.live();
        let now = tokio::time::Instant::now();
        // A snapshot's parts were decoded and converted on this (the runtime's) thread;
        // deltas are small, and collecting after each batch of them would put the
        // allocator's walk on the call path.
        let converted_here = events.iter().any(|e| matches!(e, Ready::Snapshot(_)));
        let applied = match tokio::task::spawn_blocking(move || {
            let applied = apply_ready(&t, events, &st, &mut h, now);
            super::after_swap(t.load().len());
            (applied, h)
        })
        .await
        {
            Ok((a, h)) => {
                self.held = Some(h);
                a
            }
            Err(e) => {
                tracing::error!("applying watch events failed: {e}");
                return false;
            }
        };
        if converted_here {
            super::after_swap(self.table.load().len());
        }
        self.stats.confirm();
        if let Some(observer) = &self.observer {
            applied.iter().for_each(|a| observer(a));
        }
        self.revision_tx.send_replace(self.table.load().revision);
        if applied.iter().any(|a| matches!(a, Applied::Refused { gap: true, .. })) {
            tracing::warn!(control = %uri, "missed changes; resuming from revision {}", self.table.load().revision);
            return false;
        }
        true
    }
}

/// Takes `first` and every event already received (without waiting), up to [`MAX_BATCH`]
/// whole events: a burst of changes (thousands of registrations) costs one table build,
/// not one each. The parts of a snapshot are gathered (converted) first. Also returns how
/// the stream ended, when it did meanwhile.
fn take_ready(
    stream: &mut tonic::Streaming<proto::WatchEvent>,
    parts: &mut SnapshotParts,
    first: proto::WatchEvent,
    stats: &WatchStats,
) -> (Vec<Ready>, Option<StreamEnd>) {
    let mut events = Vec::new();
    let mut ended = None;
    let mut next = Some(first);
    while let Some(e) = next.take() {
        match parts.gather(e, stats) {
            Ok(Some(whole)) => events.push(whole),
            Ok(None) => {}
            Err(why) => {
                ended = Some(Err(Status::internal(why)));
                break;
            }
        }
        if events.len() >= MAX_BATCH {
            break;
        }
        match futures_util::FutureExt::now_or_never(stream.message()) {
            Some(Ok(Some(e))) => next = Some(e),
            Some(other) => ended = Some(other),
            None => {}
        }
    }
    (events, ended)
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The parts of a snapshot received so far (see `Snapshot.more`), converted as each part
/// arrives: a large snapshot is never held whole as protobuf messages next to its records.
#[derive(Default)]
pub struct SnapshotParts {
    gathered: Option<Converted>,
}

impl SnapshotParts {
    /// Takes one event: a whole event to apply, nothing while a snapshot's parts are still
    /// arriving, or why the stream is broken (a part of another revision, or a delta in the
    /// middle of a snapshot). Records that fail conversion are counted in `stats`.
    pub fn gather(&mut self, event: proto::WatchEvent, stats: &WatchStats) -> Result<Option<Ready>, String> {
        let part = match event.event {
            Some(proto::watch_event::Event::Snapshot(part)) => part,
            other => {
                if self.gathered.is_some() {
                    return Err("control sent a delta in the middle of a snapshot".into());
                }
                return Ok(Some(match other {
                    Some(proto::watch_event::Event::Delta(d)) => Ready::Delta(d),
                    _ => Ready::Empty,
                }));
            }
        };
        let more = part.more;
        let whole = match self.gathered.take() {
            None => Converted::of(part, stats),
            Some(mut whole) => {
                if whole.revision != part.revision || whole.resync != part.resync {
                    return Err(format!(
                        "a snapshot part at revision {} follows parts at revision {}",
                        part.revision, whole.revision
                    ));
                }
                whole.extend(part, stats);
                whole
            }
        };
        if more {
            self.gathered = Some(whole);
            return Ok(None);
        }
        Ok(Some(Ready::Snapshot(whole)))
    }
}

/// Watch events applied in one table build at most.
const MAX_BATCH: usize = 4096;
