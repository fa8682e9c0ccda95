//! One sidecar's routing-state stream: a snapshot of its tenant at revision R, then one
//! delta per later revision that changed the tenant's routing state, strictly in order,
//! each naming the revision before it, with no gaps and no duplicates.
//!
//! A sidecar that reconnects with its last revision X gets only what came after X:
//! - from its tenant feed's memory ([`crate::feed`]) when the feed still holds it;
//! - otherwise from the store's history (a temporary store watch from X+1, until the
//!   store's history reaches past the feed's memory, which then takes over; an empty delta
//!   at the hand-over revision tells the sidecar that nothing happened in between). For a
//!   tenant that changes rarely, that temporary watch stays open until its next change;
//!   nothing is sent meanwhile because nothing happened;
//! - and if the store has compacted past X, or X is ahead of the store (the store was
//!   replaced), as a fresh snapshot flagged `resync`, never a silent gap.
//!
//! The stream is polled by the sidecar's connection and reads the shared history only
//! when woken by the feed's head revision: it holds no queue of its own beyond the deltas
//! of one wake-up. What it sends is already encoded and shared with every other stream of
//! the tenant ([`crate::wire`]): the feed's deltas and snapshot parts are encoded once. It ends when the service shuts down, or with UNAVAILABLE when the store
//! fails while catching up.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::proto;
use agent_reach_store::{Revision, Store, StoreError, WatchStream};
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::Status;

use crate::error::ControlError;
use crate::feed::{Feed, deltas_from_events};
use crate::stats::{ControlStats, GaugeGuard};
use crate::wire::{SharedDelta, WireEvent};

/// Deltas taken from the feed per wake-up.
const BATCH: usize = 256;
/// How long a sidecar ahead of this replica's feed waits for the feed to catch up before
/// it is sent a snapshot instead.
const AHEAD_WAIT: Duration = Duration::from_secs(10);

/// The stream type the generated Control service returns (events as messages).
pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;
/// The stream of encoded events the control port sends ([`crate::routes`]).
pub type WireStream = Pin<Box<dyn Stream<Item = Result<WireEvent, Status>> + Send>>;

enum Phase {
    /// Nothing sent yet; the sidecar asked to resume after this revision (0: snapshot).
    Start(Revision),
    /// Following the feed.
    Live,
    /// Reading the store's history until the feed's memory covers the sidecar.
    CatchUp(WatchStream),
    Done,
}

/// One sidecar's stream (see the module documentation).
pub struct Subscription {
    feed: Arc<Feed>,
    store: Arc<dyn Store>,
    stats: Arc<ControlStats>,
    head: watch::Receiver<Revision>,
    shutdown: watch::Receiver<bool>,
    phase: Phase,
    /// The revision the sidecar's table is at, once this stream has sent something.
    sent: Revision,
    /// Deltas of one wake-up (from the feed) or one batch of the store's history, not
    /// sent yet.
    pending: VecDeque<Arc<SharedDelta>>,
    /// The remaining parts of a snapshot being sent; they go before anything else.
    parts: VecDeque<WireEvent>,
    _gauge: GaugeGuard,
}

impl Subscription {
    pub fn new(
        feed: Arc<Feed>,
        store: Arc<dyn Store>,
        stats: Arc<ControlStats>,
        from_revision: Revision,
        shutdown: watch::Receiver<bool>,
    ) -> Subscription {
        let head = feed.subscribe();
        let gauge = GaugeGuard::new(stats.clone(), |s| &s.watch_streams);
        Subscription {
            feed,
            store,
            stats,
            head,
            shutdown,
            phase: Phase::Start(from_revision),
            sent: 0,
            pending: VecDeque::new(),
            parts: VecDeque::new(),
            _gauge: gauge,
        }
    }

    /// The stream of events, ending after an error.
    pub fn into_stream(self) -> WireStream {
        Box::pin(futures_util::stream::unfold(self, |mut sub| async move {
            let item = sub.next().await?;
            Some((item, sub))
        }))
    }

    /// The next event, `None` when the stream is over.
    pub async fn next(&mut self) -> Option<Result<WireEvent, Status>> {
        let mut shutdown = self.shutdown.clone();
        let step = tokio::select! {
            biased;
            _ = agent_reach_support::process::stopped(&mut shutdown) => None,
            step = self.step() => Some(step),
        };
        match step {
            None => {
                self.phase = Phase::Done;
                None
            }
            Some(Ok(Some(event))) => Some(Ok(event)),
            Some(Ok(None)) => None,
            Some(Err(e)) => {
                self.phase = Phase::Done;
                Some(Err(e.into()))
            }
        }
    }

    async fn step(&mut self) -> Result<Option<WireEvent>, ControlError> {
        if let Some(part) = self.parts.pop_front() {
            return Ok(Some(part));
        }
        loop {
            if matches!(self.phase, Phase::Live | Phase::CatchUp(_))
                && let Some(delta) = self.pending.pop_front()
            {
                return Ok(Some(self.send_delta(&delta)));
            }
            match &mut self.phase {
                Phase::Done => return Ok(None),
                Phase::Start(from) => {
                    let from = *from;
                    if let Some(event) = self.start(from).await? {
                        return Ok(Some(event));
                    }
                }
                Phase::Live => {
                    // Marks the current head as seen before reading, so a change that lands
                    // after the read wakes the wait below.
                    self.head.borrow_and_update();
                    match self.feed.deltas_after(self.sent, BATCH) {
                        Ok(deltas) if !deltas.is_empty() => self.pending.extend(deltas),
                        Ok(_) => {
                            if self.head.changed().await.is_err() {
                                return Err(StoreError::Unavailable("the tenant feed stopped".into()).into());
                            }
                        }
                        Err(_) => {
                            if let Some(snapshot) = self.catch_up().await? {
                                return Ok(Some(snapshot));
                            }
                        }
                    }
                }
                Phase::CatchUp(watch) => {
                    if self.sent >= self.feed.positions().floor {
                        self.phase = Phase::Live;
                        continue;
                    }
                    let batch = match watch.next().await {
                        Some(Ok(batch)) => batch,
                        Some(Err(StoreError::Compacted { .. })) => return Ok(Some(self.snapshot(true))),
                        Some(Err(e)) => return Err(e.into()),
                        None => return Err(StoreError::Unavailable("the store's watch ended".into()).into()),
                    };
                    self.catch_up_batch(batch.events);
                }
            }
        }
    }

    /// Queues the deltas of a batch of the store's history. Once the history reaches past
    /// the feed's floor, hands over to the feed's memory, if it still holds everything
    /// after that floor; otherwise keeps reading the store's history.
    fn catch_up_batch(&mut self, events: Vec<agent_reach_store::Event>) {
        let floor = self.feed.positions().floor;
        let prefixes = self.feed.prefixes().clone();
        let last_queued = |pending: &VecDeque<Arc<SharedDelta>>, sent| pending.back().map_or(sent, |d| d.revision());
        if events.last().is_some_and(|e| e.kv.mod_revision > floor) {
            let (old, _covered): (Vec<_>, Vec<_>) = events.iter().cloned().partition(|e| e.kv.mod_revision <= floor);
            // Under one look at the feed: everything after `floor` is still in memory.
            if let Ok(ring) = self.feed.deltas_after(floor, BATCH) {
                let prev = last_queued(&self.pending, self.sent);
                let deltas = deltas_from_events(&prefixes, &old, prev);
                self.pending.extend(deltas.into_iter().map(|d| Arc::new(SharedDelta::new(d))));
                let prev = last_queued(&self.pending, self.sent);
                if prev < floor {
                    // The store's history had nothing more up to `floor`: say so, so the
                    // feed's next delta (which follows `floor`) applies.
                    self.pending.push_back(Arc::new(SharedDelta::new(proto::Delta {
                        revision: floor,
                        prev_revision: prev,
                        ..Default::default()
                    })));
                }
                self.pending.extend(ring);
                self.phase = Phase::Live;
                return;
            }
        }
        let prev = last_queued(&self.pending, self.sent);
        let deltas = deltas_from_events(&prefixes, &events, prev);
        self.pending.extend(deltas.into_iter().map(|d| Arc::new(SharedDelta::new(d))));
    }

    /// The first event: a snapshot, or nothing (and a phase to continue in).
    async fn start(&mut self, from: Revision) -> Result<Option<WireEvent>, ControlError> {
        if from == 0 {
            return Ok(Some(self.snapshot(false)));
        }
        self.sent = from;
        let positions = self.feed.positions();
        if from > positions.head {
            // The sidecar was served by a replica ahead of this one, or by a store that has
            // since been replaced.
            if from > self.store.current_revision().await? {
                return Ok(Some(self.snapshot(true)));
            }
            let caught_up = tokio::time::timeout(AHEAD_WAIT, self.head.wait_for(|head| *head >= from))
                .await
                .is_ok_and(|r| r.is_ok());
            if !caught_up {
                return Ok(Some(self.snapshot(true)));
            }
            self.phase = Phase::Live;
        } else if from >= positions.floor {
            self.phase = Phase::Live;
        } else if let Some(snapshot) = self.catch_up().await? {
            return Ok(Some(snapshot));
        }
        Ok(None)
    }

    /// Starts reading the store's history after the sidecar's revision; a resync snapshot
    /// when the store no longer has it.
    async fn catch_up(&mut self) -> Result<Option<WireEvent>, ControlError> {
        ControlStats::inc(&self.stats.catch_ups);
        self.pending.clear();
        match self.store.watch_prefix(&self.feed.prefixes().all, self.sent + 1).await {
            Ok(watch) => {
                self.phase = Phase::CatchUp(watch);
                Ok(None)
            }
            Err(StoreError::Compacted { .. }) => Ok(Some(self.snapshot(true))),
            Err(e) => Err(e.into()),
        }
    }

    fn snapshot(&mut self, resync: bool) -> WireEvent {
        let (revision, snapshot) = self.feed.snapshot();
        self.sent = revision;
        self.pending.clear();
        self.phase = Phase::Live;
        ControlStats::inc(&self.stats.snapshots_sent);
        if resync {
            ControlStats::inc(&self.stats.resyncs_sent);
        }
        let mut parts: VecDeque<WireEvent> = snapshot.events(revision, resync).into();
        let first = parts.pop_front().unwrap_or_default();
        self.parts = parts;
        first
    }

    fn send_delta(&mut self, delta: &SharedDelta) -> WireEvent {
        self.sent = delta.revision();
        ControlStats::inc(&self.stats.deltas_sent);
        delta.wire()
    }
}

#[cfg(test)]
mod tests {
    use agent_reach::model::fixture;
    use agent_reach_store::EmbeddedStore;

    use super::*;
    use crate::feed::Feeds;
    use crate::keys;
    use crate::record::{StoredInstance, encode};

    struct Setup {
        store: Arc<dyn Store>,
        stats: Arc<ControlStats>,
        feeds: Feeds,
        _stop: watch::Sender<bool>,
        shutdown: watch::Receiver<bool>,
    }

    fn setup(store: Arc<dyn Store>, capacity: usize) -> Setup {
        let stats = Arc::new(ControlStats::default());
        let feeds = Feeds::new(store.clone(), stats.clone(), capacity);
        let (stop, shutdown) = watch::channel(false);
        Setup { store, stats, feeds, _stop: stop, shutdown }
    }

    impl Setup {
        async fn subscribe(&self, tenant: &str, from: Revision) -> Subscription {
            let feed = self.feeds.get(tenant).await.unwrap();
            Subscription::new(feed, self.store.clone(), self.stats.clone(), from, self.shutdown.clone())
        }
    }

    async fn put(store: &Arc<dyn Store>, tenant: &str, id: &str) -> Revision {
        let stored = StoredInstance {
            record: fixture::instance(id).tenant(tenant).agent("a").capability("c", &[]).record(),
            instance_hold: None,
            agent_hold: None,
            generation: 1,
        };
        store.put(&keys::instance_key(tenant, "a", id), encode(&stored), None).await.unwrap()
    }

    async fn delete(store: &Arc<dyn Store>, tenant: &str, id: &str) -> Revision {
        store.delete(&keys::instance_key(tenant, "a", id)).await.unwrap().0
    }

    async fn next(sub: &mut Subscription) -> proto::watch_event::Event {
        let event = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.expect("an event in time");
        let wire = event.expect("the stream goes on").expect("no error");
        wire.decode().expect("a valid WatchEvent").event.expect("an event")
    }

    fn delta(event: proto::watch_event::Event) -> proto::Delta {
        match event {
            proto::watch_event::Event::Delta(d) => d,
            other => panic!("expected a delta, got {other:?}"),
        }
    }

    async fn wait_for_head(feeds: &Feeds, tenant: &str, revision: Revision) {
        let feed = feeds.get(tenant).await.unwrap();
        let mut head = feed.subscribe();
        tokio::time::timeout(Duration::from_secs(5), head.wait_for(|h| *h >= revision)).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_subscriber_behind_the_feeds_memory_gets_every_revision_once() {
        let s = setup(Arc::new(EmbeddedStore::default()), 4);
        for i in 0..3 {
            put(&s.store, "t", &format!("i{i}")).await;
        }
        let mut sub = s.subscribe("t", 0).await;
        let proto::watch_event::Event::Snapshot(snapshot) = next(&mut sub).await else { panic!("no snapshot") };
        assert_eq!((snapshot.instances.len(), snapshot.resync), (3, false));
        // 20 changes while the subscriber does not read: the feed keeps only 4.
        let mut expected = Vec::new();
        for i in 0..20 {
            let revision = if i % 3 == 2 {
                delete(&s.store, "t", &format!("i{}", i - 2)).await
            } else {
                put(&s.store, "t", &format!("i{i}")).await
            };
            expected.push(revision);
        }
        wait_for_head(&s.feeds, "t", *expected.last().unwrap()).await;
        let mut prev = snapshot.revision;
        for revision in &expected {
            let d = delta(next(&mut sub).await);
            assert_eq!((d.prev_revision, d.revision), (prev, *revision));
            prev = d.revision;
        }
        assert_eq!(ControlStats::get(&s.stats.catch_ups), 1);
        // Then live again, from the feed.
        let revision = put(&s.store, "t", "late").await;
        let d = delta(next(&mut sub).await);
        assert_eq!((d.prev_revision, d.revision, d.upserted.len()), (prev, revision, 1));
    }

    #[tokio::test]
    async fn a_new_replica_resumes_a_sidecar_from_the_stores_history() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let first = setup(store.clone(), 16);
        put(&store, "t", "i0").await;
        let mut sub = first.subscribe("t", 0).await;
        let proto::watch_event::Event::Snapshot(snapshot) = next(&mut sub).await else { panic!("no snapshot") };
        let a = put(&store, "t", "i1").await;
        assert_eq!(delta(next(&mut sub).await).revision, a);
        drop(sub);
        // While the sidecar is away: a change of its tenant, then only other tenants'.
        let b = delete(&store, "t", "i0").await;
        for i in 0..5 {
            put(&store, "other", &format!("o{i}")).await;
        }
        // Another replica, whose feed starts after all that.
        let second = setup(store.clone(), 16);
        let loaded = second.feeds.get("t").await.unwrap().positions().floor;
        assert!(loaded > b);
        let mut sub = second.subscribe("t", a).await;
        let d = delta(next(&mut sub).await);
        assert_eq!((d.prev_revision, d.revision, d.removed_instance_ids.clone()), (a, b, vec!["i0".to_string()]));
        // Nothing more of the tenant happened up to the feed's start: the next change comes
        // after a marker that moves the sidecar to that start.
        let c = put(&store, "t", "i2").await;
        let marker = delta(next(&mut sub).await);
        assert_eq!((marker.prev_revision, marker.revision, marker.upserted.len()), (b, loaded, 0));
        let d = delta(next(&mut sub).await);
        assert_eq!((d.prev_revision, d.revision), (loaded, c));
        assert_eq!(ControlStats::get(&second.stats.snapshots_sent), 0);
        assert!(snapshot.revision < a);
    }

    #[tokio::test]
    async fn revisions_the_store_no_longer_has_get_a_resync_snapshot() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::default());
        let first = put(&store, "t", "i0").await;
        put(&store, "t", "i1").await;
        delete(&store, "t", "i0").await;
        store.compact(store.current_revision().await.unwrap()).await.unwrap();
        let s = setup(store.clone(), 16);
        let mut sub = s.subscribe("t", first).await;
        let proto::watch_event::Event::Snapshot(snapshot) = next(&mut sub).await else { panic!("no snapshot") };
        assert!(snapshot.resync);
        assert_eq!(snapshot.instances.iter().map(|i| i.instance_id.as_str()).collect::<Vec<_>>(), ["i1"]);
        // A revision ahead of the store (the store was replaced) resyncs too.
        let mut sub = s.subscribe("t", 1_000_000).await;
        let proto::watch_event::Event::Snapshot(snapshot) = next(&mut sub).await else { panic!("no snapshot") };
        assert!(snapshot.resync);
        assert_eq!(ControlStats::get(&s.stats.resyncs_sent), 2);
    }

    #[tokio::test]
    async fn streams_end_on_shutdown() {
        let s = setup(Arc::new(EmbeddedStore::default()), 4);
        let mut sub = s.subscribe("t", 0).await;
        next(&mut sub).await;
        assert_eq!(s.stats.watch_streams.load(std::sync::atomic::Ordering::Relaxed), 1);
        s._stop.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().is_none());
        drop(sub);
        assert_eq!(s.stats.watch_streams.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
