//! At-most-once execution of calls that carry an idempotency key, in the target's sidecar.
//!
//! Per tenant, target agent and key (as control scopes its claims: one agent's answer never
//! answers a call to another agent of the sidecar), within a window (default 10 minutes): the first call runs; a
//! duplicate that arrives while it runs waits for it and gets the same answer; a duplicate
//! that arrives later gets the stored answer without running anything. Answers larger than
//! the size limit are not stored; a later duplicate is then refused with
//! IDEMPOTENT_REPLY_NOT_STORED rather than run again. The store holds at most
//! `max_entries` keys and `max_total_bytes` of answers; past either, the oldest answered
//! keys go first (a later duplicate of one then runs again). A first call that ends in an error
//! status hands that answer to its waiting duplicates but is not stored, so a later retry
//! runs. Unary calls only (streams are not replayed).
//!
//! A duplicate must ask what the first call asked: the same digest of capability, content
//! type and payload ([`crate::call::payload_digest`], made by the caller's sidecar). One
//! asking something else is refused with IDEMPOTENCY_KEY_REUSED, here when this sidecar
//! saw the key, else by control's claim; a call or entry without a digest (from a sidecar
//! that sends none) is not compared. Answers carry the instance that ran the key's call in
//! `ar-idempotency-owner`, so callers' sidecars send duplicates there ([`crate::outbound`]).
//!
//! This store is the first level; the layer using it is [`super::idempotent`]. With claims ([`super::claims`], the sidecar's default), a
//! call that finds neither an answer nor a call of its key in flight here claims the key
//! with the control service (scoped by tenant and target agent) before it is delivered, so
//! duplicates that reach other instances and sidecars replay the same answer instead of
//! running again; answers replayed from control are kept here too. Without claims (unit
//! tests) the store is per sidecar only. A brief `std::sync::Mutex` guards the map; never
//! held across an await (waiters park on a `watch` channel).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::call::PayloadDigest;
use crate::grpc::StoredResponse;

/// What the first call left for its duplicates.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The answer (successful and stored, or an error handed to the waiters only).
    Answer(Arc<StoredResponse>),
    /// The answer was too large to keep.
    TooLarge,
    /// The first call was abandoned (its caller went away) before answering.
    Abandoned,
    /// Control said the key's first call asked something else (learnt by the first call
    /// here, handed to the duplicates waiting for it, which asked the same as it).
    KeyReused,
}

#[derive(Debug)]
enum Entry {
    /// With the digest of the running call (`None`: its caller's sidecar sent none).
    Running(watch::Receiver<Option<Outcome>>, Option<PayloadDigest>),
    Done {
        outcome: Outcome,
        expires: Instant,
        digest: Option<PayloadDigest>,
    },
}

/// The result of claiming a key.
pub(crate) enum Claim {
    /// This call runs; report its answer through the guard.
    First(Completion),
    /// Another call with the key is running: wait for its outcome.
    Wait(watch::Receiver<Option<Outcome>>),
    /// The key was already answered within the window.
    Done(Outcome),
    /// The key's first call here asked something else: refused, IDEMPOTENCY_KEY_REUSED.
    Reused,
}

/// See the module documentation.
pub(crate) struct Store {
    entries: Mutex<HashMap<(String, String), Entry>>,
    order: Mutex<VecDeque<(Instant, (String, String))>>,
    window: Duration,
    max_reply_bytes: usize,
    max_entries: usize,
    /// Bytes of the answers stored, and their bound.
    stored_bytes: AtomicUsize,
    max_total_bytes: usize,
}

/// Bytes an entry's stored answer takes.
fn stored_size(entry: Option<&Entry>) -> usize {
    match entry {
        Some(Entry::Done { outcome: Outcome::Answer(a), .. }) => a.size(),
        _ => 0,
    }
}

impl Store {
    #[cfg(test)]
    pub(crate) fn new(window: Duration, max_reply_bytes: usize, max_entries: usize) -> Arc<Store> {
        Store::bounded(window, max_reply_bytes, max_entries, usize::MAX)
    }

    /// A store keeping at most `max_total_bytes` of answers in all.
    pub(crate) fn bounded(
        window: Duration,
        max_reply_bytes: usize,
        max_entries: usize,
        max_total_bytes: usize,
    ) -> Arc<Store> {
        Arc::new(Store {
            entries: Mutex::new(HashMap::new()),
            order: Mutex::new(VecDeque::new()),
            window,
            max_reply_bytes,
            max_entries,
            stored_bytes: AtomicUsize::new(0),
            max_total_bytes,
        })
    }

    /// Bytes of the answers stored.
    pub(crate) fn stored_bytes(&self) -> usize {
        self.stored_bytes.load(Ordering::Relaxed)
    }

    /// Keys kept now, running or answered (read by /metrics at scrape time).
    pub(crate) fn keys(&self) -> usize {
        self.entries().len()
    }

    /// Accounts for `entry` leaving the map.
    fn forget(&self, entry: Option<&Entry>) {
        let size = stored_size(entry);
        if size > 0 {
            self.stored_bytes.fetch_sub(size, Ordering::Relaxed);
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        // Poisoning only means a panic elsewhere; the map stays usable.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key` of `agent` in `tenant` for a call asking `digest` (`None`: not
    /// compared, as against an entry without one).
    pub(crate) fn claim(
        self: &Arc<Self>,
        tenant: &str,
        agent: &str,
        key: &str,
        digest: Option<PayloadDigest>,
    ) -> Claim {
        let now = Instant::now();
        self.expire(now);
        // Tenant names hold no '/', so "tenant/agent" names one scope.
        let id = (format!("{tenant}/{agent}"), key.to_string());
        let differs = |first: &Option<PayloadDigest>| matches!((first, &digest), (Some(a), Some(b)) if a != b);
        let mut entries = self.entries();
        match entries.get(&id) {
            Some(Entry::Running(_, first)) if differs(first) => return Claim::Reused,
            Some(Entry::Running(rx, _)) => return Claim::Wait(rx.clone()),
            Some(Entry::Done { expires, digest: first, .. }) if *expires > now && differs(first) => {
                return Claim::Reused;
            }
            Some(Entry::Done { outcome, expires, .. }) if *expires > now => return Claim::Done(outcome.clone()),
            _ => {}
        }
        let (tx, rx) = watch::channel(None);
        let replaced = entries.insert(id.clone(), Entry::Running(rx, digest));
        self.forget(replaced.as_ref());
        drop(entries);
        Claim::First(Completion { store: self.clone(), id: Some(id), tx, digest })
    }

    /// Drops entries past the window, and the oldest beyond the size bound.
    fn expire(&self, now: Instant) {
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((expires, id)) = order.front() {
            let over = order.len() > self.max_entries || self.stored_bytes() > self.max_total_bytes;
            if *expires > now && !over {
                break;
            }
            let mut entries = self.entries();
            if let Some(Entry::Done { expires: e, .. }) = entries.get(id)
                && (*e <= now || over)
            {
                let removed = entries.remove(id);
                self.forget(removed.as_ref());
            }
            drop(entries);
            order.pop_front();
        }
    }
}

/// The first call of a key; dropping it unanswered marks the key abandoned.
pub(crate) struct Completion {
    store: Arc<Store>,
    id: Option<(String, String)>,
    tx: watch::Sender<Option<Outcome>>,
    /// What the call asks, kept with its answer.
    digest: Option<PayloadDigest>,
}

impl Completion {
    /// Records the first call's answer and wakes its duplicates.
    pub(crate) fn finish(mut self, answer: StoredResponse) -> Outcome {
        let ok = answer.status_code() == Some(tonic::Code::Ok);
        let too_large = answer.size() > self.store.max_reply_bytes;
        let answer = Arc::new(answer);
        let (stored, shared) = match (ok, too_large) {
            (true, false) => (Some(Outcome::Answer(answer.clone())), Outcome::Answer(answer)),
            (true, true) => (Some(Outcome::TooLarge), Outcome::Answer(answer)),
            (false, _) => (None, Outcome::Answer(answer)),
        };
        if let Some(id) = self.id.take() {
            let mut entries = self.store.entries();
            match stored {
                Some(outcome) => {
                    let expires = Instant::now() + self.store.window;
                    let entry = Entry::Done { outcome, expires, digest: self.digest };
                    self.store.stored_bytes.fetch_add(stored_size(Some(&entry)), Ordering::Relaxed);
                    entries.insert(id.clone(), entry);
                    drop(entries);
                    self.store.order.lock().unwrap_or_else(|e| e.into_inner()).push_back((expires, id));
                }
                None => {
                    entries.remove(&id);
                }
            }
        }
        let _ = self.tx.send(Some(shared.clone()));
        shared
    }
}

impl Completion {
    /// Records that the key's answer was too large to keep (learnt from control).
    pub(crate) fn too_large(mut self) {
        if let Some(id) = self.id.take() {
            let expires = Instant::now() + self.store.window;
            let entry = Entry::Done { outcome: Outcome::TooLarge, expires, digest: self.digest };
            self.store.entries().insert(id.clone(), entry);
            self.store.order.lock().unwrap_or_else(|e| e.into_inner()).push_back((expires, id));
        }
        let _ = self.tx.send(Some(Outcome::TooLarge));
    }

    /// Frees the key here after control refused the call as asking something else than
    /// the key's first call; the duplicates waiting here (which asked the same) are refused
    /// too.
    pub(crate) fn reused(mut self) {
        if let Some(id) = self.id.take() {
            self.store.entries().remove(&id);
        }
        let _ = self.tx.send(Some(Outcome::KeyReused));
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.store.entries().remove(&id);
            let _ = self.tx.send(Some(Outcome::Abandoned));
        }
    }
}

/// Waits for the first call's outcome.
pub(crate) async fn wait(mut rx: watch::Receiver<Option<Outcome>>) -> Outcome {
    match rx.wait_for(Option::is_some).await {
        Ok(v) => v.clone().unwrap_or(Outcome::Abandoned),
        Err(_) => Outcome::Abandoned,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue};

    use super::*;

    fn answer(text: &str, status: &'static str) -> StoredResponse {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static(status));
        StoredResponse { headers: HeaderMap::new(), data: Bytes::from(text.to_string()), trailers: Some(trailers) }
    }

    /// Runs one call of `key` the way the sidecar does: claim, then run or wait or replay.
    async fn call(store: &Arc<Store>, tenant: &str, key: &str, runs: &AtomicU32) -> Result<Bytes, &'static str> {
        loop {
            match store.claim(tenant, "agent", key, None) {
                Claim::First(done) => {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return match done.finish(answer(&format!("run {n} of {key}"), "0")) {
                        Outcome::Answer(a) => Ok(a.data.clone()),
                        _ => Err("unexpected"),
                    };
                }
                Claim::Wait(rx) => match wait(rx).await {
                    Outcome::Answer(a) => return Ok(a.data.clone()),
                    Outcome::TooLarge => return Err("too large"),
                    Outcome::KeyReused => return Err("reused"),
                    Outcome::Abandoned => continue,
                },
                Claim::Done(Outcome::Answer(a)) => return Ok(a.data.clone()),
                Claim::Done(_) => return Err("not stored"),
                Claim::Reused => return Err("reused"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stored_answers_stay_within_their_total_bytes() {
        // Answers are 11 or 12 bytes ("run 1 of k0", "run 10 of k9"); 35 bytes hold three.
        let store = Store::bounded(Duration::from_secs(600), 1024, 10_000, 35);
        let runs = AtomicU32::new(0);
        for i in 0..10 {
            call(&store, "t", &format!("k{i}"), &runs).await.unwrap();
            // Bounded at the next claim: at most one answer over the bound in between.
            assert!(store.stored_bytes() <= 35 + 12, "{} bytes", store.stored_bytes());
        }
        store.expire(Instant::now());
        assert_eq!(store.stored_bytes(), 11 + 11 + 12, "k7, k8 and k9 are kept");
        // The newest keys replay; the oldest run again.
        assert_eq!(call(&store, "t", "k9", &runs).await.unwrap(), "run 10 of k9");
        assert_eq!(call(&store, "t", "k0", &runs).await.unwrap(), "run 11 of k0");
        // Expiry gives the bytes back.
        tokio::time::advance(Duration::from_secs(601)).await;
        store.expire(Instant::now());
        assert_eq!(store.stored_bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_scoped_by_tenant_and_target_agent() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let Claim::First(done) = store.claim("t", "payments", "order-1", None) else { panic!("first call of the key") };
        done.finish(answer("charged", "0"));
        assert!(matches!(store.claim("t", "payments", "order-1", None), Claim::Done(Outcome::Answer(_))));
        // The same key sent to another agent of the sidecar is that agent's own first call,
        // not a replay of the payments agent's answer.
        assert!(matches!(store.claim("t", "shipping", "order-1", None), Claim::First(_)));
        assert!(matches!(store.claim("u", "payments", "order-1", None), Claim::First(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn ten_callers_a_hundred_duplicates_one_execution() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let runs = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (store, runs) = (store.clone(), runs.clone());
            tasks.push(tokio::spawn(async move {
                let mut replies = Vec::new();
                for _ in 0..100 {
                    replies.push(call(&store, "default", "order-42", &runs).await.unwrap());
                }
                replies
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        assert_eq!(all.len(), 1000);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one execution");
        assert!(all.iter().all(|r| r == "run 1 of order-42"), "identical replies");
        // The same key in another tenant runs on its own.
        assert_eq!(call(&store, "other", "order-42", &runs).await.unwrap(), "run 2 of order-42");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_ends_and_large_answers_are_refused_not_rerun() {
        let store = Store::new(Duration::from_secs(600), 12, 10_000);
        let runs = AtomicU32::new(0);
        assert_eq!(call(&store, "t", "k", &runs).await.unwrap(), "run 1 of k");
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(call(&store, "t", "k", &runs).await.unwrap(), "run 1 of k");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(call(&store, "t", "k", &runs).await.unwrap(), "run 2 of k", "a new window runs again");
        // "run 3 of long-key" is over 12 bytes: answered once, refused after.
        assert_eq!(call(&store, "t", "long-key", &runs).await.unwrap(), "run 3 of long-key");
        assert_eq!(call(&store, "t", "long-key", &runs).await, Err("not stored"));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_shared_with_waiters_but_not_stored() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let Claim::First(first) = store.claim("t", "a", "k", None) else { panic!("first claim") };
        let Claim::Wait(rx) = store.claim("t", "a", "k", None) else { panic!("second claim waits") };
        first.finish(answer("boom", "14"));
        match wait(rx).await {
            Outcome::Answer(a) => assert_eq!(a.data, "boom"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(store.claim("t", "a", "k", None), Claim::First(_)), "an error is not replayed");
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_first_call_frees_the_key() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let Claim::First(first) = store.claim("t", "a", "k", None) else { panic!("first claim") };
        let Claim::Wait(rx) = store.claim("t", "a", "k", None) else { panic!("waits") };
        drop(first);
        assert!(matches!(wait(rx).await, Outcome::Abandoned));
        assert!(matches!(store.claim("t", "a", "k", None), Claim::First(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_duplicate_asking_something_else_is_refused_while_running_and_once_answered() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let (first, other) = (Some([1u8; 32]), Some([2u8; 32]));
        let Claim::First(done) = store.claim("t", "a", "k", first) else { panic!("first claim") };
        assert!(matches!(store.claim("t", "a", "k", other), Claim::Reused), "running, another payload");
        assert!(matches!(store.claim("t", "a", "k", first), Claim::Wait(_)), "running, the same payload");
        assert!(matches!(store.claim("t", "a", "k", None), Claim::Wait(_)), "no digest: not compared");
        done.finish(answer("charged", "0"));
        assert!(matches!(store.claim("t", "a", "k", other), Claim::Reused), "answered, another payload");
        assert!(matches!(store.claim("t", "a", "k", first), Claim::Done(Outcome::Answer(_))));
        assert!(matches!(store.claim("t", "a", "k", None), Claim::Done(Outcome::Answer(_))));
        // Past the window the key is new, whatever the payload.
        tokio::time::advance(Duration::from_secs(601)).await;
        assert!(matches!(store.claim("t", "a", "k", other), Claim::First(_)));
        // A first call without a digest accepts any payload.
        let Claim::First(done) = store.claim("t", "a", "old", None) else { panic!("first claim") };
        done.finish(answer("charged", "0"));
        assert!(matches!(store.claim("t", "a", "old", other), Claim::Done(Outcome::Answer(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_call_control_refused_as_reused_refuses_its_waiters_and_frees_the_key() {
        let store = Store::new(Duration::from_secs(600), 1024, 10_000);
        let d = Some([5u8; 32]);
        let Claim::First(done) = store.claim("t", "a", "k", d) else { panic!("first claim") };
        let Claim::Wait(rx) = store.claim("t", "a", "k", d) else { panic!("waits") };
        done.reused();
        assert!(matches!(wait(rx).await, Outcome::KeyReused));
        assert_eq!(store.keys(), 0, "nothing kept: the next call asks control again");
    }
}
