//! A guard against HTTP/2 control-frame floods on a server connection: [`FrameGuard`]
//! wraps the connection's I/O below the HTTP/2 server, reads the frame headers the client
//! sends, and closes the connection when the client sends more than its budget of frames
//! that ask the server for work but carry no request: PING and SETTINGS (not their ACKs),
//! PRIORITY, and DATA frames with no payload and no END_STREAM. The close is a GOAWAY
//! `ENHANCE_YOUR_CALM` with debug data naming the flood (`ping_flood`, `settings_flood`,
//! `priority_flood`, `empty_frame_flood`), written at a frame boundary of the server's own
//! output, then the end of the connection.
//!
//! Why: h2 answers each PING and SETTINGS before reading the next frame, so a flood costs
//! no memory, but a client that reads the answers keeps a server core busy for as long as
//! it likes. Other floods h2 closes on its own: CONTINUATION (`too_many_continuations`),
//! empty DATA frames (`too_many_data_frames`, after 100 on a connection, before this
//! budget), rapid reset and streams reset for protocol errors (ENHANCE_YOUR_CALM); the
//! guard counts empty DATA frames too, in case a future h2 stops doing so.
//!
//! The budget is per connection and per second of the tokio clock ([`FloodLimit`]).
//!
//! A guard may also enforce [`Timeouts`] (control's gRPC port, whose HTTP/2 server tonic
//! drives): the time a new connection has to send its first complete request header block
//! (a client that trickles a HEADERS frame, or sends the preface and nothing more), and
//! how long a connection may have no stream in flight (streams opened by the client's
//! HEADERS, ended by the server's END_STREAM or a RST_STREAM either way). Past either the
//! connection gets GOAWAY NO_ERROR with debug data `header_read_timeout` or
//! `idle_timeout`, then ends.
//!
//! The same timeouts hold the send-stall timeout: the guard follows the client's
//! flow-control windows (the server's send windows) from the frames it sees: the client's
//! SETTINGS_INITIAL_WINDOW_SIZE (65,535 until it sends one), its WINDOW_UPDATE increments
//! and the length of each DATA frame the server writes (padding included). An open stream
//! whose window stays <= 0 for the send-stall timeout, or the connection's window while a
//! stream is open, gets the connection GOAWAY NO_ERROR `send_stall_timeout`. A
//! WINDOW_UPDATE restarts its window's time. The payloads of the client's SETTINGS and
//! WINDOW_UPDATE frames are read as they pass, an entry (6 or 4 bytes) at a time, so a
//! frame split across reads costs at most one partial entry.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header.
const HEAD_LEN: usize = 9;
/// ENHANCE_YOUR_CALM (RFC 9113 §7).
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// NO_ERROR (RFC 9113 §7).
const NO_ERROR: u32 = 0x0;
/// Frame types and flags the guard reads.
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS_FRAME: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const ACK_FLAG: u8 = 0x1;
/// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.5.2).
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
/// The initial stream and connection windows (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest window (RFC 9113 §6.9.1).
const MAX_WINDOW: i64 = (1 << 31) - 1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// Streams the idle timeout tracks at most (h2 refuses streams far before this).
const MAX_TRACKED_STREAMS: usize = 1 << 16;

/// Timeouts a guard enforces on its connection, and the counters of the connections
/// each closed.
#[derive(Clone, Debug)]
pub struct Timeouts {
    /// Time a new connection has to send its first complete request header block.
    pub header_read: Duration,
    /// A connection with no stream in flight for this long is closed.
    pub idle: Duration,
    /// An open stream's send window, or the connection's, <= 0 for this long closes the
    /// connection.
    pub send_stall: Duration,
    /// Connections closed for the header-read timeout.
    pub header_read_closed: Arc<AtomicU64>,
    /// Connections closed for the idle timeout.
    pub idle_closed: Arc<AtomicU64>,
    /// Connections closed for the send-stall timeout.
    pub send_stall_closed: Arc<AtomicU64>,
}

/// A send window the guard follows: the client's flow-control window.
#[derive(Clone, Copy, Debug)]
struct Window {
    left: i64,
    /// Since when it has been <= 0 (or since its last WINDOW_UPDATE, if that left it <= 0).
    stalled_since: Option<Instant>,
}

impl Window {
    fn new(left: i64, now: Instant) -> Window {
        Window { left, stalled_since: (left <= 0).then_some(now) }
    }

    /// Adds `delta`; a WINDOW_UPDATE (`update`) restarts the stall time.
    fn add(&mut self, delta: i64, update: bool, now: Instant) {
        self.left = self.left.saturating_add(delta);
        if self.left > 0 {
            self.stalled_since = None;
        } else if update || self.stalled_since.is_none() {
            self.stalled_since = Some(now);
        }
    }
}

/// A connection's progress against its [`Timeouts`].
#[derive(Debug)]
struct Clock {
    timeouts: Timeouts,
    /// A complete request header block arrived.
    headers_done: bool,
    /// The frame being read ends a header block (END_HEADERS).
    block_ending: bool,
    /// Streams the client opened that the server has not ended, with their send windows.
    open: HashMap<u32, Window>,
    /// The header-read deadline, then the next idle check.
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE.
    initial_window: i64,
    /// The connection's send window.
    conn_window: Window,
    /// The next send-stall check.
    stall_check: Pin<Box<tokio::time::Sleep>>,
}

impl Clock {
    fn new(timeouts: Timeouts) -> Clock {
        let deadline = Box::pin(tokio::time::sleep(timeouts.header_read));
        let stall_check = Box::pin(tokio::time::sleep(timeouts.send_stall));
        let now = Instant::now();
        Clock {
            timeouts,
            headers_done: false,
            block_ending: false,
            open: HashMap::new(),
            deadline,
            initial_window: DEFAULT_WINDOW,
            conn_window: Window::new(DEFAULT_WINDOW, now),
            stall_check,
        }
    }

    /// How many payload bytes of a client frame make one entry to read: 6 for a SETTINGS
    /// entry, 4 for a WINDOW_UPDATE increment, 0 to read none.
    fn entry_len(head: &Head) -> usize {
        match head.kind {
            SETTINGS_FRAME if head.flags & ACK_FLAG == 0 && head.len.is_multiple_of(6) => 6,
            WINDOW_UPDATE if head.len == 4 => 4,
            _ => 0,
        }
    }

    /// An entry of a client frame's payload (see [`Clock::entry_len`]).
    fn client_entry(&mut self, head: &Head, entry: &[u8]) {
        let now = Instant::now();
        match head.kind {
            SETTINGS_FRAME => {
                let id = u16::from_be_bytes([entry[0], entry[1]]);
                let value = i64::from(u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]));
                // (A value over the largest window is h2's protocol error.)
                if id == SETTINGS_INITIAL_WINDOW_SIZE && value <= MAX_WINDOW {
                    let delta = value - self.initial_window;
                    self.initial_window = value;
                    if delta != 0 {
                        for w in self.open.values_mut() {
                            w.add(delta, false, now);
                        }
                    }
                }
            }
            WINDOW_UPDATE => {
                let increment = i64::from(u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]) & 0x7fff_ffff);
                // (An increment of 0 is h2's protocol error.)
                if increment > 0 {
                    if head.stream == 0 {
                        self.conn_window.add(increment, true, now);
                    } else if let Some(w) = self.open.get_mut(&head.stream) {
                        w.add(increment, true, now);
                    }
                }
            }
            _ => {}
        }
    }

    /// A frame the client sent; `opened` is whether a HEADERS frame opened a new stream.
    fn client_frame(&mut self, head: &Head, opened: bool) {
        if self.block_ending {
            // The frame that ended a header block was read whole.
            self.block_ending = false;
            self.headers_done = true;
        }
        match head.kind {
            HEADERS if opened && self.open.len() < MAX_TRACKED_STREAMS => {
                let now = Instant::now();
                if self.open.is_empty() && self.conn_window.left <= 0 {
                    // The connection's window counts only while a stream is open.
                    self.conn_window.stalled_since = Some(now);
                }
                self.open.insert(head.stream, Window::new(self.initial_window, now));
            }
            RST_STREAM => self.end(head.stream),
            _ => {}
        }
        if matches!(head.kind, HEADERS | CONTINUATION) && head.flags & END_HEADERS != 0 {
            self.block_ending = true;
        }
    }

    /// The client's bytes so far end in the middle of a frame's payload or not.
    fn read_done(&mut self, in_payload: bool) {
        if self.block_ending && !in_payload {
            self.block_ending = false;
            self.headers_done = true;
        }
    }

    /// A frame the server wrote.
    fn server_frame(&mut self, head: &Head) {
        if head.kind == DATA && head.len > 0 {
            let now = Instant::now();
            let len = i64::try_from(head.len).unwrap_or(MAX_WINDOW);
            self.conn_window.add(-len, false, now);
            if let Some(w) = self.open.get_mut(&head.stream) {
                w.add(-len, false, now);
            }
        }
        let ends = match head.kind {
            DATA | HEADERS => head.flags & END_STREAM != 0,
            RST_STREAM => true,
            _ => false,
        };
        if ends {
            self.end(head.stream);
        }
    }

    fn end(&mut self, stream: u32) {
        if self.open.remove(&stream).is_some() && self.open.is_empty() && self.headers_done {
            self.deadline.as_mut().reset(Instant::now() + self.timeouts.idle);
        }
    }

    /// Since when the longest stalled window has been stalled: an open stream's, or the
    /// connection's while a stream is open.
    fn stalled_since(&self) -> Option<Instant> {
        let conn = if self.open.is_empty() { None } else { self.conn_window.stalled_since };
        self.open.values().filter_map(|w| w.stalled_since).chain(conn).min()
    }

    /// Whether the send-stall timeout has closed the connection. Checked every send-stall
    /// timeout, and at the moment the longest stall reaches it.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        while self.stall_check.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let next = match self.stalled_since() {
                Some(since) if now >= since + self.timeouts.send_stall => {
                    self.timeouts.send_stall_closed.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Some(since) => since + self.timeouts.send_stall,
                None => now + self.timeouts.send_stall,
            };
            self.stall_check.as_mut().reset(next);
        }
        false
    }

    /// Whether a timeout has closed the connection: the debug data naming it.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        if self.poll_stalled(cx) {
            return Some("send_stall_timeout");
        }
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return None;
            }
            if !self.headers_done {
                self.timeouts.header_read_closed.fetch_add(1, Ordering::Relaxed);
                return Some("header_read_timeout");
            }
            if self.open.is_empty() {
                self.timeouts.idle_closed.fetch_add(1, Ordering::Relaxed);
                return Some("idle_timeout");
            }
            // Streams in flight: check again one idle timeout later (the last to end
            // restarts it).
            self.deadline.as_mut().reset(Instant::now() + self.timeouts.idle);
        }
    }
}

/// How many control frames a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloodLimit {
    /// PING, SETTINGS, PRIORITY and empty DATA frames a connection may send within one
    /// second; one more closes it.
    pub max_control_frames_per_second: u32,
}

impl Default for FloodLimit {
    fn default() -> Self {
        FloodLimit { max_control_frames_per_second: 1000 }
    }
}

/// The kinds of flood a connection is closed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flood {
    Ping,
    Settings,
    Priority,
    EmptyFrames,
}

impl Flood {
    /// The GOAWAY debug data naming the flood.
    pub fn debug_data(self) -> &'static str {
        match self {
            Flood::Ping => "ping_flood",
            Flood::Settings => "settings_flood",
            Flood::Priority => "priority_flood",
            Flood::EmptyFrames => "empty_frame_flood",
        }
    }
}

/// Walks the frames of one direction of a connection.
#[derive(Debug, Default)]
struct Frames {
    /// Bytes of the client preface still to skip.
    preface_left: usize,
    head: [u8; HEAD_LEN],
    head_len: usize,
    payload_left: usize,
    /// The frame whose payload is being walked.
    current: Option<Head>,
    /// Bytes of the payload's entries to read (0: none), the entry so far and its length.
    entry_len: usize,
    entry: [u8; 6],
    entry_have: usize,
}

/// What [`Frames::feed_entries`] found.
enum Seen<'a> {
    /// A frame header.
    Head(Head),
    /// An entry of the current frame's payload.
    Entry(Head, &'a [u8]),
}

/// A frame header.
#[derive(Clone, Copy, Debug)]
struct Head {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Frames {
    fn with_preface() -> Frames {
        Frames { preface_left: PREFACE_LEN, ..Frames::default() }
    }

    /// Whether the bytes so far end on a frame boundary.
    fn at_boundary(&self) -> bool {
        self.preface_left == 0 && self.head_len == 0 && self.payload_left == 0
    }

    /// Walks `bytes`, calling `on_head` for each frame header completed.
    fn feed(&mut self, bytes: &[u8], mut on_head: impl FnMut(Head)) {
        self.feed_entries(bytes, |seen| {
            if let Seen::Head(head) = seen {
                on_head(head);
            }
            0
        });
    }

    /// Walks `bytes`, calling `on` for each frame header completed (it answers how many
    /// bytes make an entry of that frame's payload, 0 for none) and for each entry of the
    /// payload completed (a trailing partial entry is never passed on).
    fn feed_entries(&mut self, mut bytes: &[u8], mut on: impl FnMut(Seen<'_>) -> usize) {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
            } else if self.payload_left > 0 {
                let mut n = self.payload_left.min(bytes.len());
                if self.entry_len > 0 {
                    n = n.min(self.entry_len - self.entry_have);
                    self.entry[self.entry_have..self.entry_have + n].copy_from_slice(&bytes[..n]);
                    self.entry_have += n;
                    if self.entry_have == self.entry_len {
                        self.entry_have = 0;
                        if let Some(head) = self.current {
                            on(Seen::Entry(head, &self.entry[..self.entry_len]));
                        }
                    }
                }
                self.payload_left -= n;
                bytes = &bytes[n..];
            } else {
                let n = (HEAD_LEN - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len == HEAD_LEN {
                    let h = self.head;
                    self.head_len = 0;
                    let head = Head {
                        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                    };
                    self.payload_left = head.len;
                    self.current = Some(head);
                    self.entry_have = 0;
                    self.entry_len = on(Seen::Head(head)).min(self.entry.len());
                }
            }
        }
    }
}

/// Which flood a frame counts toward, if any.
fn control_frame(head: &Head) -> Option<Flood> {
    const DATA: u8 = 0x0;
    const PRIORITY: u8 = 0x2;
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const ACK: u8 = 0x1;
    const END_STREAM: u8 = 0x1;
    match head.kind {
        PING if head.flags & ACK == 0 => Some(Flood::Ping),
        SETTINGS if head.flags & ACK == 0 => Some(Flood::Settings),
        PRIORITY => Some(Flood::Priority),
        DATA if head.len == 0 && head.flags & END_STREAM == 0 => Some(Flood::EmptyFrames),
        _ => None,
    }
}

/// The control frames of one connection within the current second.
#[derive(Debug)]
struct Budget {
    limit: u32,
    window_start: Instant,
    count: u32,
}

impl Budget {
    /// Counts one frame; false when it is over the budget.
    fn take(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        self.count <= self.limit
    }
}

/// Where the guard is with closing the connection.
#[derive(Debug)]
enum Closing {
    /// Not closing.
    No,
    /// Writing the GOAWAY (the bytes left), then shutting down the write side.
    GoAway(Vec<u8>),
    /// Shutting down the write side.
    Shutdown,
    /// Done: every read and write fails.
    Closed,
}

/// A server connection's I/O that closes the connection on a control-frame flood.
#[derive(Debug)]
pub struct FrameGuard<IO> {
    io: IO,
    budget: Budget,
    read: Frames,
    write: Frames,
    /// The highest stream the client opened (the GOAWAY's last stream id).
    last_stream: u32,
    flood: Option<Flood>,
    closing: Closing,
    /// Why the guard closed the connection (the GOAWAY's debug data).
    closed_for: &'static str,
    /// Connections closed for a flood, shared by the port.
    closed: Arc<AtomicU64>,
    /// The header-read and idle timeouts, if enforced.
    clock: Option<Clock>,
}

impl<IO> FrameGuard<IO> {
    /// Guards `io` with `limit`; `closed` counts the connections closed for a flood.
    pub fn new(io: IO, limit: FloodLimit, closed: Arc<AtomicU64>) -> FrameGuard<IO> {
        FrameGuard {
            io,
            budget: Budget { limit: limit.max_control_frames_per_second, window_start: Instant::now(), count: 0 },
            read: Frames::with_preface(),
            write: Frames::default(),
            last_stream: 0,
            flood: None,
            closing: Closing::No,
            closed_for: "",
            closed,
            clock: None,
        }
    }

    /// Also closes the connection for `timeouts` (see the module doc).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> FrameGuard<IO> {
        self.clock = Some(Clock::new(timeouts));
        self
    }

    /// The guarded I/O.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The flood the connection was closed for, if it was.
    pub fn flood(&self) -> Option<Flood> {
        self.flood
    }

    fn inspect(&mut self, bytes: &[u8]) {
        if self.flood.is_some() {
            return;
        }
        // The clock is read only when a control frame is counted, not on every read.
        let mut now = None;
        let (budget, last_stream, mut flood) = (&mut self.budget, &mut self.last_stream, None);
        let clock = &mut self.clock;
        self.read.feed_entries(bytes, |seen| {
            let head = match seen {
                Seen::Head(head) => head,
                Seen::Entry(head, entry) => {
                    if let Some(clock) = clock.as_mut() {
                        clock.client_entry(&head, entry);
                    }
                    return 0;
                }
            };
            let opened = head.kind == HEADERS && head.stream % 2 == 1 && head.stream > *last_stream;
            if opened {
                *last_stream = head.stream;
            }
            if let Some(kind) = control_frame(&head)
                && flood.is_none()
                && !budget.take(*now.get_or_insert_with(Instant::now))
            {
                flood = Some(kind);
            }
            match clock.as_mut() {
                Some(clock) => {
                    clock.client_frame(&head, opened);
                    Clock::entry_len(&head)
                }
                None => 0,
            }
        });
        if let Some(clock) = self.clock.as_mut() {
            clock.read_done(self.read.payload_left > 0);
        }
        if let Some(kind) = flood {
            self.flood = Some(kind);
            self.closed.fetch_add(1, Ordering::Relaxed);
            self.close(ENHANCE_YOUR_CALM, kind.debug_data());
        }
    }

    /// Starts closing the connection with GOAWAY `code` and `debug`.
    fn close(&mut self, code: u32, debug: &'static str) {
        self.closed_for = debug;
        // The GOAWAY can only go in between the server's own frames.
        self.closing = if self.write.at_boundary() {
            Closing::GoAway(goaway(self.last_stream, code, debug))
        } else {
            Closing::Shutdown
        };
    }

    /// Walks what the server wrote.
    fn wrote(&mut self, bytes: &[u8]) {
        let clock = &mut self.clock;
        self.write.feed(bytes, |head| {
            if let Some(clock) = clock.as_mut() {
                clock.server_frame(&head);
            }
        });
    }
}

/// A GOAWAY frame with error `code` and `debug` as its debug data.
fn goaway(last_stream: u32, code: u32, debug: &str) -> Vec<u8> {
    const GOAWAY: u8 = 0x7;
    let len = 8 + debug.len();
    let mut frame = Vec::with_capacity(HEAD_LEN + len);
    frame.extend_from_slice(&u32::try_from(len).unwrap_or(8).to_be_bytes()[1..]);
    frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frame.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    frame.extend_from_slice(&code.to_be_bytes());
    frame.extend_from_slice(debug.as_bytes());
    frame
}

fn closed_error(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, format!("HTTP/2 connection closed by the guard: {why}"))
}

impl<IO: AsyncWrite + Unpin> FrameGuard<IO> {
    /// Writes the GOAWAY and shuts the write side down; then fails.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            match &mut self.closing {
                Closing::No => unreachable!("poll_close is called only when closing"),
                Closing::GoAway(left) => match Pin::new(&mut self.io).poll_write(cx, left) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        left.drain(..n);
                        if left.is_empty() {
                            self.closing = Closing::Shutdown;
                        }
                    }
                    Poll::Ready(_) => self.closing = Closing::Closed,
                    Poll::Pending => return Poll::Pending,
                },
                Closing::Shutdown => {
                    let _ = ready!(Pin::new(&mut self.io).poll_shutdown(cx));
                    self.closing = Closing::Closed;
                }
                Closing::Closed => return Poll::Ready(closed_error(self.closed_for)),
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FrameGuard<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !matches!(this.closing, Closing::No) {
            return this.poll_close(cx).map(Err);
        }
        if let Some(why) = this.clock.as_mut().and_then(|c| c.poll_expired(cx)) {
            this.close(NO_ERROR, why);
            return this.poll_close(cx).map(Err);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        this.inspect(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for FrameGuard<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if !matches!(this.closing, Closing::No) {
            return this.poll_close(cx).map(Err);
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.wrote(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if !matches!(this.closing, Closing::No) {
            return this.poll_close(cx).map(Err);
        }
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(b.len());
            this.wrote(&b[..take]);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !matches!(this.closing, Closing::No) {
            return this.poll_close(cx).map(Err);
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !matches!(this.closing, Closing::No) {
            return this.poll_close(cx).map(Err);
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn ping() -> Vec<u8> {
        frame(6, 0, 0, &[7; 8])
    }

    /// A guarded server end and the client end of an in-memory connection.
    fn pair(limit: u32) -> (FrameGuard<tokio::io::DuplexStream>, tokio::io::DuplexStream, Arc<AtomicU64>) {
        let (server, client) = tokio::io::duplex(1 << 20);
        let closed = Arc::new(AtomicU64::new(0));
        let guard = FrameGuard::new(server, FloodLimit { max_control_frames_per_second: limit }, closed.clone());
        (guard, client, closed)
    }

    /// Reads everything the server side lets through until it fails: (bytes, error).
    async fn drain(server: &mut FrameGuard<tokio::io::DuplexStream>) -> (usize, Option<io::Error>) {
        let mut total = 0;
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(50), server.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) => return (total, None),
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => return (total, Some(e)),
            }
        }
    }

    proptest::proptest! {
        /// Any bytes, cut anywhere: the walker never panics and sees the same frames.
        #[test]
        fn any_bytes_in_any_split_walk_the_same_frames(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            split in 1usize..100,
        ) {
            let walk = |parts: &mut dyn Iterator<Item = &[u8]>| {
                let mut frames = Frames::with_preface();
                let mut seen = Vec::new();
                for part in parts {
                    frames.feed(part, |h| seen.push((h.kind, h.flags, h.stream, h.len, control_frame(&h))));
                }
                (seen, frames.at_boundary())
            };
            let whole = walk(&mut std::iter::once(bytes.as_slice()));
            proptest::prop_assert_eq!(walk(&mut bytes.chunks(split)), whole);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn frames_are_walked_across_any_split() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(4, 0, 0, &[0, 3, 0, 0, 0, 100]));
        bytes.extend(frame(1, 4, 1, &[0x82; 40]));
        bytes.extend(frame(0, 1, 1, &[]));
        bytes.extend(ping());
        for split in 1..bytes.len() {
            let mut frames = Frames::with_preface();
            let mut seen = Vec::new();
            for part in bytes.chunks(split) {
                frames.feed(part, |h| seen.push((h.kind, h.flags, h.stream, h.len)));
            }
            assert_eq!(seen, vec![(4, 0, 0, 6), (1, 4, 1, 40), (0, 1, 1, 0), (6, 0, 0, 8)], "split {split}");
            assert!(frames.at_boundary());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_flood_gets_goaway_enhance_your_calm() {
        let (mut server, mut client, closed) = pair(10);
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        out.extend(frame(1, 5, 3, &[0x82]));
        for _ in 0..11 {
            out.extend(ping());
        }
        client.write_all(&out).await.unwrap();
        let (read, err) = drain(&mut server).await;
        assert_eq!(read, out.len(), "what was read is passed on");
        assert_eq!(err.unwrap().kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(server.flood(), Some(Flood::Ping));
        assert_eq!(closed.load(Ordering::Relaxed), 1);
        // Writes fail too; the client reads the GOAWAY, then the end.
        assert!(server.write_all(&ping()).await.is_err());
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let mut want = frame(7, 0, 0, &[0, 0, 0, 3, 0, 0, 0, 0xb]);
        want.extend_from_slice(b"ping_flood");
        want[2] = 8 + 10;
        assert_eq!(got, want);
    }

    #[tokio::test(start_paused = true)]
    async fn acks_end_stream_and_frames_with_payload_are_free() {
        let (mut server, mut client, closed) = pair(3);
        let mut out = PREFACE.to_vec();
        for _ in 0..100 {
            out.extend(frame(6, 1, 0, &[0; 8]));
            out.extend(frame(4, 1, 0, &[]));
            out.extend(frame(0, 1, 1, &[]));
            out.extend(frame(0, 0, 1, &[1, 2, 3]));
            out.extend(frame(8, 0, 0, &[0, 0, 1, 0]));
        }
        client.write_all(&out).await.unwrap();
        let (read, err) = drain(&mut server).await;
        assert_eq!(read, out.len());
        assert!(err.is_none());
        assert_eq!(closed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_per_second() {
        let (mut server, mut client, closed) = pair(5);
        client.write_all(PREFACE).await.unwrap();
        for _ in 0..4 {
            // Five SETTINGS every 1.1 s: never more than the budget within one second.
            for _ in 0..5 {
                client.write_all(&frame(4, 0, 0, &[])).await.unwrap();
            }
            assert!(drain(&mut server).await.1.is_none());
            tokio::time::advance(Duration::from_millis(1100)).await;
        }
        assert_eq!(closed.load(Ordering::Relaxed), 0);
        // Kinds share the budget: three empty DATA frames and three PRIORITY are six.
        for _ in 0..3 {
            client.write_all(&frame(0, 0, 1, &[])).await.unwrap();
        }
        for _ in 0..3 {
            client.write_all(&frame(2, 0, 1, &[0, 0, 0, 0, 1])).await.unwrap();
        }
        assert_eq!(drain(&mut server).await.1.unwrap().kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(server.flood(), Some(Flood::Priority));
        assert_eq!(closed.load(Ordering::Relaxed), 1);
    }

    /// A guarded pair with a header-read timeout of 10 s and an idle timeout of 30 s.
    fn timed_pair() -> (FrameGuard<tokio::io::DuplexStream>, tokio::io::DuplexStream, [Arc<AtomicU64>; 2]) {
        let (server, client, _) = pair(1000);
        let counters = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
        let timeouts = Timeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            send_stall: Duration::from_secs(30),
            header_read_closed: counters[0].clone(),
            idle_closed: counters[1].clone(),
            send_stall_closed: Arc::new(AtomicU64::new(0)),
        };
        (server.with_timeouts(timeouts), client, counters)
    }

    /// The GOAWAY NO_ERROR with `debug` the client reads, then the end.
    async fn assert_goaway(client: &mut tokio::io::DuplexStream, last_stream: u8, debug: &str) {
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let mut payload = vec![0, 0, 0, last_stream, 0, 0, 0, 0];
        payload.extend_from_slice(debug.as_bytes());
        assert_eq!(got, frame(7, 0, 0, &payload));
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_block_trickled_past_the_header_read_timeout_closes_the_connection() {
        let (mut server, mut client, [header_read, idle]) = timed_pair();
        let headers = frame(1, 5, 1, &[0x82; 40]);
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        out.extend_from_slice(&headers[..30]);
        client.write_all(&out).await.unwrap();
        // A byte every second: the frame is still incomplete at 10 s.
        for i in 0..9 {
            client.write_all(&headers[30 + i..31 + i]).await.unwrap();
            assert!(drain(&mut server).await.1.is_none());
            tokio::time::advance(Duration::from_millis(950)).await;
        }
        // (Each drain waits 50 ms: 9.05 s have passed.)
        assert!(drain(&mut server).await.1.is_none(), "open before 10 s");
        tokio::time::advance(Duration::from_secs(1)).await;
        let (_, err) = drain(&mut server).await;
        assert_eq!(err.unwrap().kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!((header_read.load(Ordering::Relaxed), idle.load(Ordering::Relaxed)), (1, 0));
        assert!(server.write_all(&ping()).await.is_err());
        // (The GOAWAY names stream 1, whose frame header arrived.)
        assert_goaway(&mut client, 1, "header_read_timeout").await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idles_out_only_with_no_stream_in_flight() {
        let (mut server, mut client, [header_read, idle]) = timed_pair();
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        out.extend(frame(1, 5, 1, &[0x82; 40]));
        client.write_all(&out).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        // Stream 1 in flight for far longer than both timeouts: the connection stays.
        tokio::time::advance(Duration::from_secs(100)).await;
        assert!(drain(&mut server).await.1.is_none());
        // The server ends it (trailers with END_STREAM): idle from now.
        server.write_all(&frame(1, 5, 1, &[0x88])).await.unwrap();
        tokio::time::advance(Duration::from_millis(29_900)).await;
        assert!(drain(&mut server).await.1.is_none(), "open before the idle timeout");
        // A client reset of a stream it never opened changes nothing.
        client.write_all(&frame(3, 0, 7, &[0, 0, 0, 8])).await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(drain(&mut server).await.1.unwrap().kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!((header_read.load(Ordering::Relaxed), idle.load(Ordering::Relaxed)), (0, 1));
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        // The server's own frame first, then the GOAWAY.
        let mut want = frame(1, 5, 1, &[0x88]);
        let mut payload = vec![0, 0, 0, 1, 0, 0, 0, 0];
        payload.extend_from_slice(b"idle_timeout");
        want.extend(frame(7, 0, 0, &payload));
        assert_eq!(got, want);
    }

    const STALL: Duration = Duration::from_secs(30);

    /// A guarded pair with timeouts (header read 10 s, idle 30 s, send stall 30 s) whose
    /// client sent the preface, a SETTINGS frame with `settings` and stream 1's request
    /// (HEADERS with END_STREAM), all read by the server; its send-stall counter.
    async fn stall_pair(
        settings: &[u8],
    ) -> (FrameGuard<tokio::io::DuplexStream>, tokio::io::DuplexStream, Arc<AtomicU64>) {
        let (server, client, _) = pair(1000);
        let stalls = Arc::new(AtomicU64::new(0));
        let timeouts = Timeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            send_stall: STALL,
            header_read_closed: Arc::new(AtomicU64::new(0)),
            idle_closed: Arc::new(AtomicU64::new(0)),
            send_stall_closed: stalls.clone(),
        };
        let (mut server, mut client) = (server.with_timeouts(timeouts), client);
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, settings));
        out.extend(frame(1, 5, 1, &[0x82; 40]));
        client.write_all(&out).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        (server, client, stalls)
    }

    /// The server writes `len` bytes of DATA on `stream`, in frames of at most 16 KiB.
    async fn server_data(server: &mut FrameGuard<tokio::io::DuplexStream>, stream: u32, mut len: usize) {
        while len > 0 {
            let n = len.min(16_384);
            server.write_all(&frame(0, 0, stream, &vec![7; n])).await.unwrap();
            len -= n;
        }
    }

    fn window_update(stream: u32, increment: u32) -> Vec<u8> {
        frame(8, 0, stream, &increment.to_be_bytes())
    }

    /// Reads (the paused clock running on to the next timer) until the guard closes the
    /// connection: when it did.
    async fn closed_at(server: &mut FrameGuard<tokio::io::DuplexStream>) -> Instant {
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(1000), server.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(Err(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
                    return Instant::now();
                }
                other => panic!("not closed by the guard: {other:?}"),
            }
        }
    }

    /// What the client reads ends with the GOAWAY NO_ERROR `send_stall_timeout` naming
    /// `last_stream`.
    async fn assert_stall_goaway(client: &mut tokio::io::DuplexStream, last_stream: u8) {
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let mut payload = vec![0, 0, 0, last_stream, 0, 0, 0, 0];
        payload.extend_from_slice(b"send_stall_timeout");
        let goaway = frame(7, 0, 0, &payload);
        assert!(got.ends_with(&goaway), "{} bytes end with the GOAWAY", got.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_window_exhausted_by_server_data_closes_the_connection_exactly_at_the_send_stall_timeout() {
        let (mut server, mut client, stalls) = stall_pair(&[]).await;
        // Sparse data (a Watch) leaves the window positive: open however long.
        server_data(&mut server, 1, 1000).await;
        tokio::time::advance(Duration::from_secs(100)).await;
        assert!(drain(&mut server).await.1.is_none());
        // The rest of the 65,535 bytes: the window is 0 from now.
        server_data(&mut server, 1, 64_535).await;
        let stalled = Instant::now();
        assert_eq!(closed_at(&mut server).await - stalled, STALL);
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
        assert!(server.write_all(&ping()).await.is_err());
        assert_stall_goaway(&mut client, 1).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_update_a_second_before_the_timeout_restarts_it() {
        let (mut server, mut client, stalls) = stall_pair(&[]).await;
        server_data(&mut server, 1, 65_535).await;
        tokio::time::advance(STALL - Duration::from_secs(1)).await;
        // 100 bytes more, at once used up: stalled again from now.
        client.write_all(&window_update(1, 100)).await.unwrap();
        client.write_all(&window_update(0, 100)).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        server_data(&mut server, 1, 100).await;
        let stalled = Instant::now();
        assert_eq!(closed_at(&mut server).await - stalled, STALL);
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
        assert_stall_goaway(&mut client, 1).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_window_exhausted_across_streams_closes_the_connection() {
        // Stream windows of 1 MiB: only the connection's 65,535 runs out.
        let (mut server, mut client, stalls) = stall_pair(&[0, 4, 0, 0x10, 0, 0]).await;
        client.write_all(&frame(1, 5, 3, &[0x82; 40])).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        server_data(&mut server, 1, 40_000).await;
        server_data(&mut server, 3, 25_535).await;
        // Replenished 20 s in (a connection WINDOW_UPDATE): not closed at 30 s.
        tokio::time::advance(Duration::from_secs(20)).await;
        client.write_all(&window_update(0, 65_535)).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(drain(&mut server).await.1.is_none());
        assert_eq!(stalls.load(Ordering::Relaxed), 0);
        server_data(&mut server, 3, 65_535).await;
        let stalled = Instant::now();
        assert_eq!(closed_at(&mut server).await - stalled, STALL);
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
        assert_stall_goaway(&mut client, 3).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_clients_initial_window_setting_applies_to_open_streams() {
        // An initial window of 0 (with another setting first): stalled from the request.
        let opened = Instant::now();
        let (mut server, mut client, stalls) = stall_pair(&[0, 3, 0, 0, 0, 100, 0, 4, 0, 0, 0, 0]).await;
        // 20 s in, a window of 1,000: open past 30 s.
        tokio::time::advance(Duration::from_secs(20)).await;
        client.write_all(&frame(4, 0, 0, &[0, 4, 0, 0, 0x03, 0xe8])).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(drain(&mut server).await.1.is_none());
        assert_eq!(stalls.load(Ordering::Relaxed), 0);
        // Lowered to 400 after 1,000 bytes were sent: -600, stalled from the DATA.
        server_data(&mut server, 1, 1000).await;
        let stalled = Instant::now();
        client.write_all(&frame(4, 0, 0, &[0, 4, 0, 0, 0x01, 0x90])).await.unwrap();
        assert_eq!(closed_at(&mut server).await - stalled, STALL);
        assert!(stalled - opened >= Duration::from_secs(40));
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
        assert_stall_goaway(&mut client, 1).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_update_split_across_reads_counts() {
        let (mut server, mut client, stalls) = stall_pair(&[]).await;
        server_data(&mut server, 1, 65_535).await;
        let update = window_update(1, 70_000);
        // The frame header and half the increment, then the rest.
        client.write_all(&update[..11]).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        client.write_all(&update[11..]).await.unwrap();
        client.write_all(&window_update(0, 70_000)).await.unwrap();
        assert!(drain(&mut server).await.1.is_none());
        tokio::time::advance(STALL * 3).await;
        assert!(drain(&mut server).await.1.is_none(), "stream 1 has a window of 70,000 - 65,535");
        assert_eq!(stalls.load(Ordering::Relaxed), 0);
        // The stream ends, the connection's window used up: it no longer counts, and the
        // connection idles out 30 s later.
        server_data(&mut server, 1, 4465).await;
        server.write_all(&frame(1, 5, 1, &[0x88])).await.unwrap();
        let ended = Instant::now();
        assert_eq!(closed_at(&mut server).await - ended, Duration::from_secs(30));
        assert_eq!(stalls.load(Ordering::Relaxed), 0);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got.ends_with(b"idle_timeout"));
    }

    #[test]
    fn payload_entries_are_read_the_same_across_any_split() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0, 9, 0, 3, 0, 0, 1, 0]));
        bytes.extend(frame(0, 0, 1, &[1; 10]));
        bytes.extend(window_update(1, 70_000));
        for split in 1..bytes.len() {
            let mut frames = Frames::with_preface();
            let mut entries = Vec::new();
            for part in bytes.chunks(split) {
                frames.feed_entries(part, |seen| match seen {
                    Seen::Head(head) => Clock::entry_len(&head),
                    Seen::Entry(head, entry) => {
                        entries.push((head.kind, entry.to_vec()));
                        0
                    }
                });
            }
            let want =
                vec![(4, vec![0, 4, 0, 0, 0, 9]), (4, vec![0, 3, 0, 0, 1, 0]), (8, 70_000u32.to_be_bytes().to_vec())];
            assert_eq!(entries, want, "split {split}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_goaway_in_the_middle_of_a_server_frame() {
        let (mut server, mut client, _) = pair(1);
        // The server wrote half a frame (as after a short write).
        let half = &frame(0, 0, 1, &[9; 20])[..15];
        server.write_all(half).await.unwrap();
        let mut out = PREFACE.to_vec();
        out.extend(ping());
        out.extend(ping());
        client.write_all(&out).await.unwrap();
        assert!(drain(&mut server).await.1.is_some());
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, half, "no GOAWAY inside the server's frame");
    }
}
