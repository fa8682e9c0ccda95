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
//! of one wake-up. It ends when the service shuts down, or with UNAVAILABLE when the store
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

/// Deltas taken from the feed per wake-up.
const BATCH: usize = 256;
/// A snapshot larger than this (encoded) is sent in parts of at most this size each (a
/// single instance or policy larger than it travels alone), so a tenant of any size loads
/// through the sidecars' message size limit.
pub const SNAPSHOT_PART_BYTES: usize = 1024 * 1024;
/// How long a sidecar ahead of this replica's feed waits for the feed to catch up before
/// it is sent a snapshot instead.
const AHEAD_WAIT: Duration = Duration::from_secs(10);

/// The stream type the Control service returns.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

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
    pending: VecDeque<Arc<proto::Delta>>,
    /// The remaining parts of a snapshot being sent; they go before anything else.
    parts: VecDeque<proto::Snapshot>,
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
    pub fn into_stream(self) -> EventStream {
        Box::pin(futures_util::stream::unfold(self, |mut sub| async move {
            let item = sub.next().await?;
            Some((item, sub))
        }))
    }

    /// The next event, `None` when the stream is over.
    pub async fn next(&mut self) -> Option<Result<proto::WatchEvent, Status>> {
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

    async fn step(&mut self) -> Result<Option<proto::WatchEvent>, ControlError> {
        if let Some(part) = self.parts.pop_front() {
            return Ok(Some(proto::WatchEvent { event: Some(proto::watch_event::Event::Snapshot(part)) }));
        }
        loop {
            if matches!(self.phase, Phase::Live | Phase::CatchUp(_))
                && let Some(delta) = self.pending.pop_front()
            {
                return Ok(Some(self.send_delta(Arc::unwrap_or_clone(delta))));
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
        let last_queued = |pending: &VecDeque<Arc<proto::Delta>>, sent| pending.back().map_or(sent, |d| d.revision);
        if events.last().is_some_and(|e| e.kv.mod_revision > floor) {
            let (old, _covered): (Vec<_>, Vec<_>) = events.iter().cloned().partition(|e| e.kv.mod_revision <= floor);
            // Under one look at the feed: everything after `floor` is still in memory.
            if let Ok(ring) = self.feed.deltas_after(floor, BATCH) {
                let prev = last_queued(&self.pending, self.sent);
                let deltas = deltas_from_events(&prefixes, &old, prev);
                self.pending.extend(deltas.into_iter().map(Arc::new));
                let prev = last_queued(&self.pending, self.sent);
                if prev < floor {
                    // The store's history had nothing more up to `floor`: say so, so the
                    // feed's next delta (which follows `floor`) applies.
                    self.pending.push_back(Arc::new(proto::Delta {
                        revision: floor,
                        prev_revision: prev,
                        ..Default::default()
                    }));
                }
                self.pending.extend(ring);
                self.phase = Phase::Live;
                return;
            }
        }
        let prev = last_queued(&self.pending, self.sent);
        let deltas = deltas_from_events(&prefixes, &events, prev);
        self.pending.extend(deltas.into_iter().map(Arc::new));
    }

    /// The first event: a snapshot, or nothing (and a phase to continue in).
    async fn start(&mut self, from: Revision) -> Result<Option<proto::WatchEvent>, ControlError> {
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
    async fn catch_up(&mut self) -> Result<Option<proto::WatchEvent>, ControlError> {
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

    fn snapshot(&mut self, resync: bool) -> proto::WatchEvent {
        let snapshot = self.feed.snapshot(resync);
        self.sent = snapshot.revision;
        self.pending.clear();
        self.phase = Phase::Live;
        ControlStats::inc(&self.stats.snapshots_sent);
        if resync {
            ControlStats::inc(&self.stats.resyncs_sent);
        }
        let mut parts: VecDeque<proto::Snapshot> = split_snapshot(snapshot, SNAPSHOT_PART_BYTES).into();
        let first = parts.pop_front().unwrap_or_default();
        self.parts = parts;
        proto::WatchEvent { event: Some(proto::watch_event::Event::Snapshot(first)) }
    }

    fn send_delta(&mut self, delta: proto::Delta) -> proto::WatchEvent {
        self.sent = delta.revision;
        ControlStats::inc(&self.stats.deltas_sent);
        proto::WatchEvent { event: Some(proto::watch_event::Event::Delta(delta)) }
    }
}

/// Splits `snapshot` into parts whose instances and policies encode to at most `bound`
/// bytes each (one larger item travels alone); every part but the last has `more` set.
/// A small snapshot stays one part.
pub fn split_snapshot(snapshot: proto::Snapshot, bound: usize) -> Vec<proto::Snapshot> {
    use prost::Message;
    let proto::Snapshot { revision, instances, resync, policies, more: _ } = snapshot;
    let empty = || proto::Snapshot { revision, resync, ..Default::default() };
    let mut parts = vec![empty()];
    let mut size = 0usize;
    let mut room = |len: usize, parts: &mut Vec<proto::Snapshot>| {
        // Field tag and length prefix of a repeated message: at most 1 + 10 bytes.
        let len = len + 11;
        if size > 0 && size + len > bound {
            parts.push(empty());
            size = 0;
        }
        size += len;
    };
    for i in instances {
        room(i.encoded_len(), &mut parts);
        if let Some(part) = parts.last_mut() {
            part.instances.push(i);
        }
    }
    for p in policies {
        room(p.encoded_len(), &mut parts);
        if let Some(part) = parts.last_mut() {
            part.policies.push(p);
        }
    }
    let n = parts.len();
    for part in &mut parts[..n - 1] {
        part.more = true;
    }
    parts
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
        event.expect("the stream goes on").expect("no error").event.expect("an event")
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

    #[test]
    fn a_large_snapshot_is_split_into_bounded_parts() {
        use prost::Message;
        let instance = |i: usize| proto::Instance {
            instance_id: format!("a-{i}"),
            registration: Some(proto::AgentRegistration {
                agent: "a".into(),
                metadata: [("blob".to_string(), "x".repeat(4096))].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let whole = proto::Snapshot {
            revision: 9,
            resync: true,
            instances: (0..1000).map(instance).collect(),
            policies: vec![proto::Policy { name: "p".into(), ..Default::default() }],
            more: false,
        };
        let parts = split_snapshot(whole.clone(), 64 * 1024);
        assert!(parts.len() >= 60, "{} parts", parts.len());
        for (i, part) in parts.iter().enumerate() {
            assert!(part.encoded_len() <= 64 * 1024, "part {i}: {} bytes", part.encoded_len());
            assert_eq!((part.revision, part.resync, part.more), (9, true, i + 1 < parts.len()));
        }
        let ids: Vec<String> = parts.iter().flat_map(|p| p.instances.iter()).map(|i| i.instance_id.clone()).collect();
        assert_eq!(ids, (0..1000).map(|i| format!("a-{i}")).collect::<Vec<_>>());
        assert_eq!(parts.iter().map(|p| p.policies.len()).sum::<usize>(), 1);
        // A small snapshot is one part; one item above the bound travels alone.
        assert_eq!(split_snapshot(whole.clone(), usize::MAX).len(), 1);
        let alone = split_snapshot(whole, 100);
        assert_eq!(alone.len(), 1001);
        assert!(!alone.last().unwrap().more);
    }
}
