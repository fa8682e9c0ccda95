//! A served HTTP/2 connection whose stream tasks run in the connection's own task.
//!
//! hyper hands each new stream's task to the connection's executor
//! ([`crate::stall::StallExec`]), which would spawn it on tokio: a task cell allocated and
//! filled, entered in the runtime's task list, scheduled, run through the task harness,
//! and freed, for every call. On a current-thread runtime all of a connection's tasks run
//! on one thread anyway, so [`OwnStreams`] keeps them instead: while it polls the
//! connection, the executor hands new stream tasks to it ([`offer`]), and it polls those
//! whose wakers fired, in the same task, until neither the connection nor a stream has
//! more to do now. On a multi-thread runtime streams are spawned as before, so that one
//! connection's calls still run on every worker.
//!
//! The connection and each stream have wakers of their own, so a poll polls only what
//! was woken: a stream woken by an agent's answer is polled without the connection, and
//! the connection, woken because that stream queued its reply, without the other
//! streams. Wake-ups within a poll (h2 waking the connection for a reply queued, a stream
//! woken by a frame the connection read) only mark another round of it; they do not
//! schedule the task anew. Only a wake-up while the task is not polling (a socket
//! becoming readable, a timer, another task's answer) wakes the task. A poll runs at most
//! [`ROUNDS`] rounds, then the task yields to the others. A stream whose task panics ends
//! alone, as a spawned task would.
//!
//! Measured with `agent-reach-bench instructions --calls 2000 --no-nginx` (callgrind, six
//! runs each): about 700 instructions fewer per call at the caller's sidecar and 460 at
//! the target's than a spawned task per stream (BENCHMARKS.md, row 5d2e685).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// A stream's task, as the executor hands it on.
pub(crate) type StreamTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Rounds of a poll before the task yields to the runtime's other tasks.
const ROUNDS: usize = 8;

thread_local! {
    /// Whether an [`OwnStreams`] polls its connection on this thread now.
    static TAKING: Cell<bool> = const { Cell::new(false) };
    /// The stream tasks started during that poll.
    static STARTED: RefCell<Vec<StreamTask>> = const { RefCell::new(Vec::new()) };
}

/// Whether a connection polled by an [`OwnStreams`] on this thread takes new stream tasks
/// now, i.e. [`offer`] would keep them.
fn taking() -> bool {
    TAKING.with(Cell::get)
}

/// Hands a new stream's task to the [`OwnStreams`] polling its connection on this thread;
/// gives it back when there is none (it is then the caller's to spawn, unboxed).
pub(crate) fn offer<F: Future<Output = ()> + Send + 'static>(task: F) -> Result<(), F> {
    if !taking() {
        return Err(task);
    }
    STARTED.with(|s| s.borrow_mut().push(Box::pin(task)));
    Ok(())
}

/// Starts a new stream's task: in the connection's own task when [`offer`] keeps it, else
/// spawned.
pub(crate) fn start<F: Future<Output = ()> + Send + 'static>(task: F) {
    if let Err(task) = offer(task) {
        tokio::spawn(task);
    }
}

/// While alive, stream tasks started on this thread are collected (see [`offer`]); that
/// ends when it is dropped, also if the connection's poll panics.
struct Collecting;

impl Collecting {
    fn start() -> Collecting {
        TAKING.with(|t| t.set(true));
        Collecting
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        TAKING.with(|t| t.set(false));
    }
}

/// The task is in [`OwnStreams::poll`].
const POLLING: u8 = 1;
/// The connection is to be polled.
const CONN: u8 = 2;
/// A stream is to be polled (it is in [`Shared::ready`]).
const STREAMS: u8 = 4;

/// What the wakers of one [`OwnStreams`] share.
struct Shared {
    task: AtomicWaker,
    /// [`POLLING`], [`CONN`], [`STREAMS`].
    state: AtomicU8,
    /// The slots of the streams woken.
    ready: Mutex<Vec<usize>>,
}

impl Shared {
    /// Marks `what` to be polled; wakes the task unless it is polling (its round sees it).
    fn woke(&self, what: u8) {
        if self.state.fetch_or(what, Ordering::AcqRel) & POLLING == 0 {
            self.task.wake();
        }
    }
}

/// The waker handed to the connection.
struct ConnWake(Arc<Shared>);

impl Wake for ConnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.woke(CONN);
    }
}

/// The waker of one slot's stream. A slot keeps it for the streams it holds later: a
/// late wake-up of an ended stream only polls the next one once more, for nothing.
struct SlotWake {
    shared: Arc<Shared>,
    slot: usize,
    /// In [`Shared::ready`] already.
    queued: AtomicBool,
}

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.shared.ready.lock().unwrap_or_else(|e| e.into_inner()).push(self.slot);
        }
        self.shared.woke(STREAMS);
    }
}

struct Slot {
    task: Option<StreamTask>,
    wake: Arc<SlotWake>,
    waker: Waker,
}

/// A connection's stream tasks, run by the connection's task (see the module doc).
pub(crate) struct OwnStreams {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Streams not ended yet.
    live: usize,
    /// The slots to poll in this round (reused).
    due: Vec<usize>,
    shared: Arc<Shared>,
    conn_waker: Waker,
}

impl OwnStreams {
    /// `Some` on a current-thread runtime, where a connection's streams run on its thread
    /// anyway; `None` on a multi-thread one (streams are spawned).
    pub(crate) fn for_this_runtime() -> Option<OwnStreams> {
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        (flavor == tokio::runtime::RuntimeFlavor::CurrentThread).then(OwnStreams::new)
    }

    pub(crate) fn new() -> OwnStreams {
        // The connection is polled at the first poll.
        let shared = Arc::new(Shared { task: AtomicWaker::new(), state: AtomicU8::new(CONN), ready: Mutex::default() });
        OwnStreams {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            due: Vec::new(),
            conn_waker: Waker::from(Arc::new(ConnWake(shared.clone()))),
            shared,
        }
    }

    /// Has the connection polled at the next poll (e.g. after its graceful shutdown began).
    pub(crate) fn poll_conn_next(&self) {
        self.shared.state.fetch_or(CONN, Ordering::AcqRel);
    }

    /// Streams not ended yet.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.live
    }

    /// Places a new stream in a slot and has it polled in this round.
    fn start(&mut self, task: StreamTask) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot].task = Some(task);
                slot
            }
            None => {
                let slot = self.slots.len();
                let wake = Arc::new(SlotWake { shared: self.shared.clone(), slot, queued: AtomicBool::new(false) });
                let waker = Waker::from(wake.clone());
                self.slots.push(Slot { task: Some(task), wake, waker });
                slot
            }
        };
        self.live += 1;
        self.due.push(slot);
    }

    /// Polls the streams due (new ones and those woken); ends those that are done.
    fn run_due(&mut self) {
        for i in 0..self.due.len() {
            let slot = &mut self.slots[self.due[i]];
            slot.wake.queued.store(false, Ordering::Release);
            let Some(task) = slot.task.as_mut() else { continue };
            // A stream that panics ends alone, as a spawned task would: its stream is reset,
            // the connection and its other streams carry on.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                task.as_mut().poll(&mut Context::from_waker(&slot.waker))
            }));
            if polled.is_err() {
                tracing::error!("a stream's task panicked: its stream is reset");
            }
            if !matches!(polled, Ok(Poll::Pending)) {
                slot.task = None;
                self.live -= 1;
                self.free.push(self.due[i]);
            }
        }
        self.due.clear();
    }

    /// Polls `conn` (when it was woken, until it ended: then `ended` holds its output) and
    /// the streams that were woken. Ready once the connection and all its streams ended.
    pub(crate) fn poll<C: Future>(
        &mut self,
        mut conn: Pin<&mut C>,
        ended: &mut Option<C::Output>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        self.shared.task.register(cx.waker());
        let mut what = self.shared.state.swap(POLLING, Ordering::AcqRel);
        for _ in 0..ROUNDS {
            if what & CONN != 0 && ended.is_none() {
                let collecting = Collecting::start();
                let polled = conn.as_mut().poll(&mut Context::from_waker(&self.conn_waker));
                drop(collecting);
                STARTED.with(|s| {
                    let mut started = s.borrow_mut();
                    for task in started.drain(..) {
                        self.start(task);
                    }
                });
                if let Poll::Ready(out) = polled {
                    *ended = Some(out);
                }
            }
            if what & STREAMS != 0 {
                let mut ready = self.shared.ready.lock().unwrap_or_else(|e| e.into_inner());
                self.due.extend(ready.drain(..));
            }
            self.run_due();
            if ended.is_some() && self.live == 0 {
                self.shared.state.store(0, Ordering::Release);
                return Poll::Ready(());
            }
            // Leave unless something was woken meanwhile.
            match self.shared.state.compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Poll::Pending,
                Err(_) => what = self.shared.state.swap(POLLING, Ordering::AcqRel),
            }
        }
        // Still more to do: the other tasks first. The flags taken last are put back.
        self.shared.state.fetch_or(what & !POLLING, Ordering::AcqRel);
        self.shared.state.fetch_and(!POLLING, Ordering::AcqRel);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use tokio::sync::{mpsc, oneshot};

    /// A connection as hyper's looks to its task: each request it reads starts a stream
    /// task through the executor (`offer`); it ends when its requests end and every answer
    /// was taken.
    struct FakeConn {
        requests: mpsc::UnboundedReceiver<oneshot::Receiver<u32>>,
        answers: mpsc::UnboundedSender<u32>,
        /// Polls of the connection.
        polls: Arc<AtomicUsize>,
        /// Stream tasks it had to spawn because no one took them.
        spawned: Arc<AtomicUsize>,
    }

    impl Future for FakeConn {
        type Output = &'static str;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            loop {
                match self.requests.poll_recv(cx) {
                    Poll::Ready(Some(reply)) => {
                        let answers = self.answers.clone();
                        let task: StreamTask = Box::pin(async move {
                            if let Ok(v) = reply.await {
                                assert_ne!(v, 0, "a stream's task panics on 0");
                                let _ = answers.send(v);
                            }
                        });
                        if let Err(task) = offer(task) {
                            self.spawned.fetch_add(1, Ordering::SeqCst);
                            tokio::spawn(task);
                        }
                    }
                    Poll::Ready(None) => return Poll::Ready("closed"),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
    }

    struct Driven {
        requests: mpsc::UnboundedSender<oneshot::Receiver<u32>>,
        answers: mpsc::UnboundedReceiver<u32>,
        polls: Arc<AtomicUsize>,
        spawned: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<(Option<&'static str>, usize)>,
    }

    fn driven() -> Driven {
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let (answers_tx, answers) = mpsc::unbounded_channel();
        let (polls, spawned) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let conn =
            FakeConn { requests: requests_rx, answers: answers_tx, polls: polls.clone(), spawned: spawned.clone() };
        let task = tokio::spawn(async move {
            let mut own = OwnStreams::new();
            let mut ended = None;
            tokio::pin!(conn);
            std::future::poll_fn(|cx| own.poll(conn.as_mut(), &mut ended, cx)).await;
            (ended, own.live())
        });
        Driven { requests, answers, polls, spawned, task }
    }

    #[tokio::test]
    async fn streams_started_by_the_connection_run_in_its_task_and_outlive_its_end() {
        let Driven { requests, mut answers, spawned, task, .. } = driven();
        let (first, first_rx) = oneshot::channel();
        let (second, second_rx) = oneshot::channel();
        requests.send(first_rx).unwrap();
        requests.send(second_rx).unwrap();
        // The connection ends (no more requests) while both streams wait for their answer.
        drop(requests);
        tokio::task::yield_now().await;
        assert!(!task.is_finished(), "two streams are still running");
        second.send(2).unwrap();
        assert_eq!(answers.recv().await, Some(2));
        first.send(1).unwrap();
        assert_eq!(answers.recv().await, Some(1));
        let (ended, left) = task.await.unwrap();
        assert_eq!(ended, Some("closed"));
        assert_eq!(left, 0);
        assert_eq!(spawned.load(Ordering::SeqCst), 0, "no stream task was spawned");
        // Outside a poll of the connection, nothing takes a stream task.
        assert!(!taking());
        assert!(offer(Box::pin(async {})).is_err());
    }

    #[tokio::test]
    async fn a_stream_that_panics_ends_alone() {
        let Driven { requests, mut answers, spawned, task, .. } = driven();
        let (doomed, doomed_rx) = oneshot::channel::<u32>();
        let (fine, fine_rx) = oneshot::channel();
        requests.send(doomed_rx).unwrap();
        requests.send(fine_rx).unwrap();
        tokio::task::yield_now().await;
        // The answer 0 makes the first stream's task panic (see `FakeConn`).
        doomed.send(0).unwrap();
        tokio::task::yield_now().await;
        fine.send(5).unwrap();
        assert_eq!(answers.recv().await, Some(5));
        drop(requests);
        assert_eq!(task.await.unwrap(), (Some("closed"), 0));
        assert_eq!(spawned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_woken_while_idle_wakes_the_task_which_polls_only_the_stream() {
        let Driven { requests, mut answers, polls, task, .. } = driven();
        let (reply, reply_rx) = oneshot::channel();
        let delayed = async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            reply.send(7).unwrap();
        };
        requests.send(reply_rx).unwrap();
        tokio::task::yield_now().await;
        let before = polls.load(Ordering::SeqCst);
        tokio::spawn(delayed);
        assert_eq!(answers.recv().await, Some(7));
        // The answer woke the task, which polled the stream and not the connection.
        assert_eq!(polls.load(Ordering::SeqCst), before);
        drop(requests);
        assert_eq!(task.await.unwrap(), (Some("closed"), 0));
    }

    #[tokio::test]
    async fn a_busy_connection_yields_after_its_rounds() {
        // A connection that always has more to do: it wakes itself on every poll.
        struct Busy(Arc<AtomicUsize>);
        impl Future for Busy {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.0.fetch_add(1, Ordering::SeqCst) + 1 == ROUNDS * 3 {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
        let polls = Arc::new(AtomicUsize::new(0));
        let (other_ran, mut other) = oneshot::channel::<usize>();
        let counted = polls.clone();
        // Another task on the same thread gets to run between the busy task's polls.
        let busy = tokio::spawn(async move {
            let mut own = OwnStreams::new();
            let mut ended = None;
            let conn = Busy(counted);
            tokio::pin!(conn);
            std::future::poll_fn(|cx| own.poll(conn.as_mut(), &mut ended, cx)).await;
            ended
        });
        let watcher = polls.clone();
        tokio::spawn(async move {
            let _ = other_ran.send(watcher.load(Ordering::SeqCst));
        });
        assert_eq!(busy.await.unwrap(), Some(()));
        let seen = other.try_recv().unwrap();
        assert!(seen < ROUNDS * 3, "the other task ran while the connection was busy (it saw {seen} polls)");
        assert_eq!(polls.load(Ordering::SeqCst), ROUNDS * 3);
    }
}
