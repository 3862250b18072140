//! The data port's connections, served by a bounded pool of threads.
//!
//! A connection with no request in flight is *parked*: registered with a
//! readiness loop (epoll through the `polling` crate, one-shot), holding no
//! receive buffer and no thread. Pool threads take turns as the loop's
//! waiter (leader/follower: whoever holds the lead waits for readiness, the
//! others wait for it, and it passes to the most recently idle one); the one
//! that sees a connection ready serves it itself with
//! [`super::data::serve_data`], lending it the thread's own receive buffer,
//! until no request is buffered or arrives within the spin window (polled
//! only while another thread is free) and the linger after it ([`LINGER`],
//! asleep on the socket, while another thread is free), then parks it again.
//! A request whose peer stops keeping pace in the middle of its payload
//! (see [`super::data::FLOW_WAIT`]) is parked too, with its place in the
//! payload and its hold on the region, until the kernel says the payload
//! flows again (bytes queued, or room to send). So the threads serving N
//! connections are bounded by [`max_threads`] however large N is and
//! however their peers trickle (requests beyond them wait in their
//! sockets), and a parked connection costs its socket and one map entry
//! (one parked in the middle of a request also the bytes it had buffered
//! past it, and its hold on the region).
//! At the cap one thread keeps waiting for readiness; only when every busy
//! one has been held for [`STUCK`] inside work that cannot be parked and
//! whose wait a remote peer can stretch (a hello awaiting the proof of the
//! peer secret, a device request) is another added, up to
//! [`HARD_MAX_THREADS`]; in a burst of host-memory transfers the pool
//! stays within its cap.
//!
//! The waiter also closes connections parked longer than the idle timeout
//! (`PDX_IDLE_TIMEOUT_MS`), and those parked in the middle of a request
//! whose peer has moved no byte for the progress timeout (the kernel's
//! count of queued or unsent bytes, looked at on each scan); an initiator
//! sees the close at its next use of the lane and opens another.

use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use polling::{Event, Events, Poller};

use super::super::net::conn::{Conn, RecvBuf};
use super::super::protocol::hello;
use super::super::protocol::wire::HEADER_LEN;
use super::super::registry::OwnedSocketGuard;
use super::budget::Ticket;
use super::data::{serve_data, Awaits, Pending};
use super::Serving;
use crate::transfer::stats::Stats;

/// How long a pool thread above the base count may go without a connection
/// to serve before it leaves (its own last work counts, whatever the other
/// threads do).
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// Pool threads kept when idle.
const BASE_THREADS: usize = 2;

/// Past [`max_threads`], a thread is added only when every busy one has
/// been held this long inside work that cannot be parked, up to
/// [`HARD_MAX_THREADS`].
const STUCK: Duration = Duration::from_millis(200);

/// How long a thread that served a request waits for the connection's next
/// one before it parks the connection (see [`DataPlane::linger`]). A lane
/// moving large windows leaves gaps of a few milliseconds between them (the
/// initiator drains the socket before it asks again); served by the same
/// thread, woken by its own socket, it runs as on a thread of its own
/// instead of through the readiness loop and a second thread every window.
const LINGER: Duration = Duration::from_millis(20);

/// A lingering thread looks at whether it is wanted elsewhere this often.
const LINGER_SLICE: Duration = Duration::from_millis(2);

/// After a small write, how long a lingering thread first waits for a whole
/// request like it (header and payload queued: `SO_RCVLOWAT`) before it
/// wakes for any byte again. An initiator that sends one request at a time
/// on a lane (Mooncake's) writes the header, then the payload: woken at the
/// header, the thread would sleep again for the payload, two wake-ups a
/// request; this makes them one (256 x 64 KiB from Mooncake's initiator:
/// 8 k instead of 14 k context switches in the target). A request of
/// another size or a read (a header alone) waits this long once more.
const EXPECT_WINDOW: Duration = Duration::from_micros(500);

/// The most pool threads, however many hellos or device requests hold
/// them.
const HARD_MAX_THREADS: usize = 256;

/// How long a new data connection may take to send its first complete
/// request (a pdx hello with its body, or a Mooncake peer's first request)
/// before it is closed. Until then its bytes wait in its socket, held by
/// no thread: see [`DataPlane::take_ready`].
pub(crate) const FIRST_REQUEST_BOUND: Duration = Duration::from_secs(5);

/// Bytes queued to be read on `fd` (`FIONREAD`; 0 on error).
fn queued_bytes(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is an open socket owned by the caller; FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// Bytes sent on `fd` and not yet taken by the peer (`SIOCOUTQ`; 0 on error).
fn unsent_bytes(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is an open socket owned by the caller; SIOCOUTQ writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// Whether the peer of `fd` has closed its side, or the socket has an error.
fn peer_closed(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd for the call; the socket is open (owned by the caller).
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// What a parked connection that the readiness loop saw ready needs next.
enum Readiness {
    /// A complete request (or hello with its body), or the end of the
    /// stream: a thread serves it.
    Serve,
    /// Not enough yet: parked again, waiting for this many bytes.
    Wait(usize),
}

/// The pool's cap: twice the cores, at least 8, at most 32 (past it, see
/// [`STUCK`]).
pub(super) fn max_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (2 * cores).clamp(8, 32)
}

/// Counts an inbound data connection as open while it lives.
pub(super) struct OpenData(Arc<Stats>);

impl OpenData {
    pub(super) fn new(stats: &Arc<Stats>) -> OpenData {
        Stats::bump(&stats.inbound_connections);
        stats.inbound_open.fetch_add(1, Ordering::Relaxed);
        OpenData(stats.clone())
    }
}

impl Drop for OpenData {
    fn drop(&mut self) {
        self.0.inbound_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An admitted data connection. Fields drop in order: the ticket and the
/// registry entry (both name the descriptor) before the socket closes.
pub(super) struct Served {
    ticket: Ticket,
    _tracked: OwnedSocketGuard,
    _open: OpenData,
    conn: Conn,
    /// Registered with the poller (then it must be deleted before closing).
    registered: bool,
    /// When it was last parked.
    since: Instant,
    /// When it was admitted.
    opened: Instant,
    /// No thread has served it yet: its first request (maybe a hello) is
    /// still coming (bounded by [`FIRST_REQUEST_BOUND`]).
    first: bool,
    /// The `SO_RCVLOWAT` it is parked with between requests.
    want_lowat: usize,
    /// The request it was parked in the middle of, waiting on its peer.
    pending: Option<Pending>,
    /// Parked with a request: the kernel's count of bytes queued to read
    /// (or unsent) when last looked at, and since when it has not changed.
    progress: (usize, Instant),
}

/// The waiter's state (held by the thread waiting for readiness).
struct Lead {
    events: Events,
    /// Connections seen ready and not yet taken by a thread.
    ready: VecDeque<Served>,
    next_scan: Instant,
}

/// Who holds the lead, and the threads waiting for it (the most recently
/// idle last).
#[derive(Default)]
struct LeadQueue {
    held: bool,
    waiting: Vec<Arc<Waiter>>,
}

/// A thread waiting for the lead.
struct Waiter {
    thread: std::thread::Thread,
    /// Set (then the thread unparked) when the lead is handed to it.
    handed: AtomicBool,
}

#[derive(Default)]
struct Counts {
    threads: usize,
    busy: usize,
    /// Busy threads (by id) inside work that cannot be parked, and since when.
    held: HashMap<usize, Instant>,
}

/// The data port's readiness loop and its pool.
pub(super) struct DataPlane {
    serving: Arc<Serving>,
    poller: Poller,
    parked: Mutex<HashMap<usize, Served>>,
    next_key: AtomicUsize,
    /// The leader's state (locked only by the thread holding the lead).
    lead: Mutex<Lead>,
    queue: Mutex<LeadQueue>,
    counts: Mutex<Counts>,
    /// The leader holds ready connections at the cap: lingering threads
    /// give theirs back (see [`LINGER`]).
    wanted: AtomicBool,
    /// How long a thread above the base count may go without a connection
    /// to serve before it leaves ([`IDLE_EXIT`]; shorter in tests).
    idle_exit: Duration,
    /// The name of its threads.
    thread_name: &'static str,
    /// Connections parked after serving (a lane's window gaps should not
    /// cross the loop: see [`LINGER`]).
    parked_after_serving: AtomicUsize,
    /// Pool threads not serving a connection (connections poll for their
    /// next request only while one is free).
    free: Arc<AtomicUsize>,
    next_thread: AtomicUsize,
    max_threads: usize,
}

impl DataPlane {
    /// A data plane with its base threads started.
    pub(super) fn start(serving: &Arc<Serving>) -> std::io::Result<Arc<DataPlane>> {
        Self::start_with(serving, IDLE_EXIT, "pdx-data")
    }

    /// [`DataPlane::start`] with another idle exit and thread name (tests
    /// count a plane's threads by name and do not wait 5 s for them).
    fn start_with(
        serving: &Arc<Serving>,
        idle_exit: Duration,
        thread_name: &'static str,
    ) -> std::io::Result<Arc<DataPlane>> {
        let plane = Arc::new(DataPlane {
            serving: serving.clone(),
            poller: Poller::new()?,
            parked: Mutex::new(HashMap::new()),
            next_key: AtomicUsize::new(1),
            lead: Mutex::new(Lead { events: Events::new(), ready: VecDeque::new(), next_scan: Instant::now() }),
            queue: Mutex::new(LeadQueue::default()),
            counts: Mutex::new(Counts::default()),
            wanted: AtomicBool::new(false),
            idle_exit,
            thread_name,
            parked_after_serving: AtomicUsize::new(0),
            free: Arc::new(AtomicUsize::new(0)),
            next_thread: AtomicUsize::new(0),
            max_threads: max_threads(),
        });
        for _ in 0..BASE_THREADS {
            plane.add_thread()?;
        }
        Ok(plane)
    }

    fn add_thread(self: &Arc<Self>) -> std::io::Result<()> {
        self.count(|c| c.threads += 1);
        let me = self.clone();
        let spawned = self.serving.registry.spawn(self.thread_name.to_owned(), move || me.run());
        if spawned.is_err() {
            self.count(|c| c.threads -= 1);
        }
        spawned
    }

    /// Change the counts (and the free threads with them); returns them.
    fn count(&self, change: impl FnOnce(&mut Counts)) -> (usize, usize) {
        let mut c = self.counts.lock();
        change(&mut c);
        self.free.store(c.threads.saturating_sub(c.busy), Ordering::Relaxed);
        (c.threads, c.busy)
    }

    /// Wake the waiter (the engine is stopping).
    pub(super) fn wake(&self) {
        let _ = self.poller.notify();
    }

    /// Admit a new connection: parked until its first request arrives.
    pub(super) fn admit(&self, conn: Conn, ticket: Ticket, tracked: OwnedSocketGuard) {
        let mut conn = conn;
        conn.set_park_when_idle(true);
        conn.set_spin_while(self.free.clone());
        drop(conn.take_buffer());
        let served = Served {
            ticket,
            _tracked: tracked,
            _open: OpenData::new(&self.serving.stats),
            conn,
            registered: false,
            since: Instant::now(),
            opened: Instant::now(),
            first: true,
            want_lowat: HEADER_LEN,
            pending: None,
            progress: (0, Instant::now()),
        };
        self.park(served);
    }

    /// Register `s` for its next request (one readiness event).
    fn park(&self, mut s: Served) {
        if self.serving.registry.stopping() {
            self.close(s);
            return;
        }
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let fd = s.conn.raw_fd();
        // Parked, it wakes for a whole header (or hello), or for the next
        // part of a payload, only: bytes that trickle in wait in the socket,
        // held by no thread.
        let awaits = s.pending.as_ref().map_or(Awaits::Bytes(s.want_lowat), Pending::awaits);
        let (interest, level) = match awaits {
            Awaits::Bytes(lowat) => {
                if let Err(e) = s.conn.set_rcvlowat(lowat) {
                    log::debug!("data connection: SO_RCVLOWAT: {e}");
                }
                (Event::readable(key), queued_bytes(fd))
            }
            Awaits::Room => (Event::writable(key), unsent_bytes(fd)),
        };
        s.since = Instant::now();
        s.progress = (level, s.since);
        let was_registered = s.registered;
        s.registered = true;
        // Armed under the map's lock: the waiter cannot close it (and the
        // descriptor be reused) between the insert and the registration.
        let mut parked = self.parked.lock();
        let armed = if was_registered {
            // SAFETY: the socket is open (owned by `s`, in the map) for the call.
            self.poller.modify(unsafe { BorrowedFd::borrow_raw(fd) }, interest)
        } else {
            // SAFETY: the descriptor stays open until `close` deletes it
            // from the poller (every `Served` leaves through `close`).
            unsafe { self.poller.add(fd, interest) }
        };
        match armed {
            Ok(()) => {
                parked.insert(key, s);
            }
            Err(e) => {
                drop(parked);
                log::warn!("data connection: cannot register with the readiness loop: {e}");
                s.registered = was_registered;
                self.close(s);
            }
        }
    }

    /// Close a connection (deleted from the poller first).
    fn close(&self, s: Served) {
        if s.registered {
            // SAFETY: the socket is still open (owned by `s`).
            let _ = self.poller.delete(unsafe { BorrowedFd::borrow_raw(s.conn.raw_fd()) });
        }
        drop(s);
    }

    /// Wait for the lead until `until`: true once this thread holds it.
    /// Waiting threads are handed the lead most recently idle first, so
    /// under light traffic the same few threads take turns and the others
    /// reach their idle exit.
    fn take_lead(&self, until: Instant) -> bool {
        let me = {
            let mut queue = self.queue.lock();
            if !queue.held {
                queue.held = true;
                return true;
            }
            let me = Arc::new(Waiter { thread: std::thread::current(), handed: AtomicBool::new(false) });
            queue.waiting.push(me.clone());
            me
        };
        loop {
            if me.handed.load(Ordering::Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                let mut queue = self.queue.lock();
                // Handed over while the deadline passed: it is ours.
                if me.handed.load(Ordering::Acquire) {
                    return true;
                }
                queue.waiting.retain(|w| !Arc::ptr_eq(w, &me));
                return false;
            }
            std::thread::park_timeout(until - now);
        }
    }

    /// Pass the lead to the most recently idle waiting thread (or leave it
    /// free for the next that asks).
    fn pass_lead(&self) {
        let mut queue = self.queue.lock();
        match queue.waiting.pop() {
            Some(next) => {
                next.handed.store(true, Ordering::Release);
                next.thread.unpark();
            }
            None => queue.held = false,
        }
    }

    /// One pool thread above the base leaves (true), or none may.
    fn retire(&self) -> bool {
        let mut leaving = false;
        self.count(|c| {
            leaving = c.threads > BASE_THREADS;
            if leaving {
                c.threads -= 1;
            }
        });
        leaving
    }

    /// The next connection to serve, waiting for readiness as the leader;
    /// `None` when the engine stops or this thread should leave (it has had
    /// no connection to serve since `idle_since` plus the idle exit, and is
    /// above the base count).
    fn next(self: &Arc<Self>, mut idle_since: Instant) -> Option<Served> {
        loop {
            if self.take_lead(idle_since + self.idle_exit) {
                let next = self.lead(&mut idle_since);
                self.pass_lead();
                return next;
            }
            if self.serving.registry.stopping() || self.retire() {
                return None;
            }
            idle_since = Instant::now();
        }
    }

    /// Lead the readiness loop (the caller holds the lead) until a
    /// connection is there for this thread, or (`None`) the engine stops or
    /// this thread's idle exit comes.
    fn lead(self: &Arc<Self>, idle_since: &mut Instant) -> Option<Served> {
        let mut lead = self.lead.lock();
        loop {
            if self.serving.registry.stopping() {
                let parked: Vec<Served> = self.parked.lock().drain().map(|(_, s)| s).collect();
                let ready: Vec<Served> = lead.ready.drain(..).collect();
                drop(lead);
                for s in parked.into_iter().chain(ready) {
                    self.close(s);
                }
                return None; // the lead passes on, and the next sees the stop too
            }
            if !lead.ready.is_empty() {
                match self.may_serve() {
                    Some(true) => {
                        self.wanted.store(false, Ordering::Relaxed);
                        return lead.ready.pop_front();
                    }
                    Some(false) => {
                        // At the cap: keep waiting for readiness (and for a
                        // busy thread to finish, which wakes us; lingering
                        // ones give their connections back) rather than
                        // leave nobody waiting.
                        self.wanted.store(true, Ordering::Relaxed);
                        lead.events.clear();
                        let _ = self.poller.wait_deadline(&mut lead.events, Instant::now() + STUCK / 2);
                        self.take_ready(&mut lead);
                        *idle_since = Instant::now();
                        continue;
                    }
                    None => {
                        // Every busy thread is held by one connection: one more.
                        self.wanted.store(false, Ordering::Relaxed);
                        if let Err(e) = self.add_thread() {
                            log::warn!("cannot start another data connection thread ({e})");
                        }
                        return lead.ready.pop_front();
                    }
                }
            }
            let now = Instant::now();
            if now >= lead.next_scan {
                self.close_idle(now);
                lead.next_scan = now + scan_interval(self.serving.settings.idle_timeout);
            }
            if now >= *idle_since + self.idle_exit {
                if self.retire() {
                    return None;
                }
                *idle_since = now;
            }
            let deadline = lead.next_scan.min(*idle_since + self.idle_exit);
            lead.events.clear();
            if let Err(e) = self.poller.wait_deadline(&mut lead.events, deadline) {
                log::warn!("data connections: readiness wait failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            self.take_ready(&mut lead);
        }
    }

    /// Move the connections the last wait reported from the map to the
    /// ready queue (those with a whole request or hello to serve; the
    /// others are parked again to wait for the rest); true if there were any.
    fn take_ready(&self, lead: &mut Lead) -> bool {
        let keys: Vec<usize> = lead.events.iter().map(|e| e.key).collect();
        if keys.is_empty() {
            return false;
        }
        let mut parked = self.parked.lock();
        let woken: Vec<Served> = keys.iter().filter_map(|key| parked.remove(key)).collect();
        drop(parked);
        for mut s in woken {
            if s.pending.is_some() {
                // The payload goes on (or the peer left): served where it
                // stopped.
                lead.ready.push_back(s);
                continue;
            }
            match readiness(&s) {
                Readiness::Serve => {
                    // Served: a receive waits for what it asks, not a header.
                    if let Err(e) = s.conn.set_rcvlowat(1) {
                        log::debug!("data connection: SO_RCVLOWAT: {e}");
                        self.close(s);
                        continue;
                    }
                    s.first = false;
                    s.want_lowat = HEADER_LEN;
                    lead.ready.push_back(s);
                }
                Readiness::Wait(bytes) => {
                    s.want_lowat = bytes;
                    self.park(s);
                }
            }
        }
        true
    }

    /// Whether the waiter may take a ready connection itself: yes below the
    /// cap or while another thread is free to wait; no at the cap (`None`
    /// when a thread should be added: every busy one is held, see [`STUCK`]).
    fn may_serve(&self) -> Option<bool> {
        let c = self.counts.lock();
        if c.busy + 1 < c.threads || c.threads < self.max_threads {
            return Some(true);
        }
        let now = Instant::now();
        let stuck = c.held.len() >= c.busy && c.held.values().all(|t| now.saturating_duration_since(*t) >= STUCK);
        if stuck && c.threads < HARD_MAX_THREADS {
            None
        } else {
            Some(false)
        }
    }

    /// Close the connections parked longer than the idle timeout, new ones
    /// that have not sent their first request within
    /// [`FIRST_REQUEST_BOUND`], and those parked in the middle of a request
    /// whose peer has moved no byte (the kernel's count of bytes queued, or
    /// unsent, has not changed) for the progress timeout.
    fn close_idle(&self, now: Instant) {
        let idle = self.serving.settings.idle_timeout;
        let progress = self.serving.settings.progress_timeout;
        let mut parked = self.parked.lock();
        let late = |s: &mut Served| match &s.pending {
            Some(p) => {
                let fd = s.conn.raw_fd();
                let level = if p.awaits() == Awaits::Room { unsent_bytes(fd) } else { queued_bytes(fd) };
                if level != s.progress.0 {
                    s.progress = (level, now);
                }
                now.saturating_duration_since(s.progress.1) >= progress
            }
            None => {
                now.saturating_duration_since(s.since) >= idle
                    || (s.first && now.saturating_duration_since(s.opened) >= FIRST_REQUEST_BOUND)
            }
        };
        let old: Vec<usize> = parked.iter_mut().filter_map(|(k, s)| late(s).then_some(*k)).collect();
        let closing: Vec<Served> = old.iter().filter_map(|k| parked.remove(k)).collect();
        drop(parked);
        if !closing.is_empty() {
            log::debug!("closing {} data connections idle for {idle:?}", closing.len());
        }
        for s in closing {
            self.close(s);
        }
    }

    fn run(self: Arc<Self>) {
        // This thread's receive buffer, lent to the connection it serves.
        let mut buf: Option<RecvBuf> = None;
        let id = self.next_thread.fetch_add(1, Ordering::Relaxed);
        let mut idle_since = Instant::now();
        // Told by the requests served when they are inside work that
        // cannot be parked (see [`STUCK`]).
        let held = |inside: bool| {
            self.count(|c| {
                if inside {
                    c.held.insert(id, Instant::now());
                } else {
                    c.held.remove(&id);
                }
            });
        };
        while let Some(mut s) = self.next(idle_since) {
            let (threads, busy) = self.count(|c| c.busy += 1);
            let grow = busy == threads && threads < self.max_threads;
            if grow {
                // Every thread is serving: one more waits for the others.
                if let Err(e) = self.add_thread() {
                    log::warn!("cannot start another data connection thread ({e}); requests wait for a free one");
                }
            }
            s.conn.lend_buffer(buf.take());
            // What its next request likely brings.
            let mut expect = HEADER_LEN;
            loop {
                s.pending = serve_data(&self.serving, &mut s.conn, &s.ticket, s.pending.take(), &held, &mut expect);
                // Idle: its next request, if it comes within the linger, is
                // served here, as a thread of its own would serve it.
                if s.pending.is_some() || !s.conn.parked() || !self.linger(&mut s, &mut expect) {
                    break;
                }
            }
            let (threads, _) = self.count(|c| {
                c.busy -= 1;
                c.held.remove(&id);
            });
            if threads >= self.max_threads {
                self.wake(); // a waiter holding ready connections at the cap
            }
            // Parked, it keeps only the bytes it has buffered (a request
            // parked in the middle may have more behind it).
            buf = s.conn.take_buffer();
            if s.pending.is_some() {
                self.park(s);
            } else if s.conn.parked() {
                self.parked_after_serving.fetch_add(1, Ordering::Relaxed);
                self.park(s);
            } else {
                self.close(s);
            }
            idle_since = Instant::now();
        }
    }

    /// After a request, wait (asleep, for at most [`LINGER`]) for the
    /// connection's next one on this thread: true if it came. Only while
    /// another thread is free to lead, and given up as soon as the leader
    /// holds connections it has no thread for. `expect`: the bytes the
    /// next request likely brings, waited for whole at first (see
    /// [`EXPECT_WINDOW`]); not expected again once that wait runs out.
    fn linger(&self, s: &mut Served, expect: &mut usize) -> bool {
        let now = Instant::now();
        let until = now + LINGER;
        let mut whole_by = (*expect > HEADER_LEN).then_some(now + EXPECT_WINDOW);
        let came = loop {
            if self.free.load(Ordering::Relaxed) == 0
                || self.wanted.load(Ordering::Relaxed)
                || self.serving.registry.stopping()
            {
                break false;
            }
            let now = Instant::now();
            let left = until.saturating_duration_since(now);
            if left.is_zero() {
                break false;
            }
            let (lowat, slice) = match whole_by {
                Some(by) if by > now => (*expect, by - now),
                Some(_) => {
                    // Not it (a read, another size) or a slow peer: a header is awaited.
                    whole_by = None;
                    *expect = HEADER_LEN;
                    (1, left.min(LINGER_SLICE))
                }
                None => (1, left.min(LINGER_SLICE)),
            };
            if s.conn.set_rcvlowat(lowat).is_err() {
                break false;
            }
            let mut fds = libc::pollfd { fd: s.conn.raw_fd(), events: libc::POLLIN, revents: 0 };
            let ts = libc::timespec { tv_sec: slice.as_secs() as libc::time_t, tv_nsec: slice.subsec_nanos().into() };
            // SAFETY: one valid pollfd and timespec for the call; the socket is open (owned by `s`).
            match unsafe { libc::ppoll(&mut fds, 1, &ts, std::ptr::null()) } {
                n if n > 0 => break true,
                0 => {}
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                _ => break false,
            }
        };
        // Receives wait for what they ask again.
        let restored = s.conn.set_rcvlowat(1).is_ok();
        came && restored
    }
}

/// What a parked connection seen ready needs: a thread only for a whole
/// request header, or a whole hello with its body (the socket's
/// `SO_RCVLOWAT` makes readiness wait for them; the kernel holds the
/// bytes meanwhile), or the end of the stream.
fn readiness(s: &Served) -> Readiness {
    let fd = s.conn.raw_fd();
    let mut head = [0u8; HEADER_LEN];
    // SAFETY: `head` is writable for its length; the socket is open (owned by `s`).
    let n = unsafe { libc::recv(fd, head.as_mut_ptr().cast(), HEADER_LEN, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    let Ok(n) = usize::try_from(n) else {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Readiness::Wait(s.want_lowat),
            _ => Readiness::Serve, // its thread sees the error and closes it
        };
    };
    if n < HEADER_LEN {
        // Woken with less than a header: only the end of the stream (or
        // an error) does that; a thread sees it and closes the connection.
        return if n == 0 || peer_closed(fd) { Readiness::Serve } else { Readiness::Wait(HEADER_LEN) };
    }
    if s.first && hello::is_hello(&head) {
        if let Some(len) = hello::request_body_len(&head) {
            if queued_bytes(fd) < HEADER_LEN + len && !peer_closed(fd) {
                return Readiness::Wait(HEADER_LEN + len);
            }
        }
    }
    Readiness::Serve
}

/// How often the waiter looks for idle connections: a quarter of the idle
/// timeout, at most a second.
fn scan_interval(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::super::super::protocol::wire::{self, RequestHeader, STATUS_LEN};
    use super::super::super::{Engine, Settings};
    use super::*;
    use crate::transfer::Direction;

    /// A client connected to `listener`, its server side admitted to `plane`.
    fn admitted(serving: &Serving, plane: &DataPlane, listener: &TcpListener) -> TcpStream {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_nodelay(true).unwrap();
        let (stream, from) = listener.accept().unwrap();
        let t = Duration::from_secs(10);
        let conn = Conn::new(stream, t, t).unwrap();
        let ticket = serving.budget.admit(super::super::Plane::Data, from.ip(), conn.raw_fd()).unwrap();
        let tracked = serving.registry.track_owned(conn.stream()).unwrap();
        plane.admit(conn, ticket, tracked);
        client
    }

    /// An engine whose connection caps leave room for every connection a
    /// test opens (`adjust` may change more), and the `Serving` a test's
    /// own data plane is built from.
    fn roomy_engine(adjust: impl FnOnce(&mut Settings)) -> (Engine, Arc<Serving>) {
        let mut s = Settings::from_env();
        s.max_data_connections = 4096;
        s.max_connections_per_address = 4096;
        adjust(&mut s);
        let engine = Engine::start_with("127.0.0.1", s).unwrap();
        let serving = Arc::new(Serving::of(&engine.inner));
        (engine, serving)
    }

    /// 300 connections, each writing verified data in turns, are served by
    /// at most `max_threads()` pool threads; parked, none holds a receive
    /// buffer; idle past the timeout, all are closed.
    #[test]
    fn many_connections_few_threads_no_idle_buffers() {
        const CONNS: usize = 300;
        let (engine, serving) = roomy_engine(|s| s.idle_timeout = Duration::from_millis(800));
        let region = vec![0u8; CONNS * 64];
        engine.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients: Vec<TcpStream> = (0..CONNS).map(|_| admitted(&serving, &plane, &listener)).collect();
        let peak = AtomicUsize::new(0);
        for round in 0..3u8 {
            std::thread::scope(|sc| {
                for (k, chunk) in clients.chunks_mut(CONNS / 6).enumerate() {
                    let (region, plane, peak) = (&region, &plane, &peak);
                    sc.spawn(move || {
                        for (j, c) in chunk.iter_mut().enumerate() {
                            let i = k * (CONNS / 6) + j;
                            let h = RequestHeader {
                                size: 64,
                                addr: region.as_ptr() as u64 + (i * 64) as u64,
                                direction: Direction::Write,
                                acknowledged: true,
                            };
                            let mut request = h.encode().to_vec();
                            request.extend_from_slice(&[round.wrapping_add(i as u8); 64]);
                            c.write_all(&request).unwrap();
                            let mut status = [0u8; STATUS_LEN];
                            c.read_exact(&mut status).unwrap();
                            assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
                            peak.fetch_max(plane.counts.lock().threads, Ordering::Relaxed);
                        }
                    });
                }
            });
            for (i, chunk) in region.chunks(64).enumerate() {
                assert!(chunk.iter().all(|&b| b == round.wrapping_add(i as u8)), "connection {i}, round {round}");
            }
        }
        let peak = peak.load(Ordering::Relaxed);
        assert!(peak <= max_threads(), "{peak} pool threads for {CONNS} connections");
        // Parked again (each within the spin window after its request).
        let deadline = Instant::now() + Duration::from_secs(5);
        while plane.parked.lock().len() < CONNS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut parked = plane.parked.lock();
        assert_eq!(parked.len(), CONNS);
        assert!(parked.values_mut().all(|s| s.conn.take_buffer().is_none()), "a parked connection holds a buffer");
        drop(parked);
        // Idle past 800 ms: all closed (the clients see the end of stream).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !plane.parked.lock().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(plane.parked.lock().is_empty(), "idle connections left parked");
        let mut byte = [0u8; 1];
        assert_eq!(clients[0].read(&mut byte).unwrap(), 0, "closed by the target");
        eprintln!("{CONNS} connections: at most {peak} pool threads (cap {})", max_threads());
    }

    /// As many requests as the pool has threads, each trickling its payload
    /// (a byte every 50 ms), do not keep another connection's request
    /// waiting, nor make the pool grow: each is parked in the middle of its
    /// payload.
    #[test]
    fn trickling_requests_do_not_hold_every_thread() {
        let (engine, serving) = roomy_engine(|_| {});
        let region = vec![0u8; 4 << 20];
        engine.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || admitted(&serving, &plane, &listener);
        let write = |c: &mut TcpStream, size: u64, payload: &[u8]| {
            let h =
                RequestHeader { size, addr: region.as_ptr() as u64, direction: Direction::Write, acknowledged: true };
            let mut request = h.encode().to_vec();
            request.extend_from_slice(payload);
            c.write_all(&request).unwrap();
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for _ in 0..max_threads() {
                let mut c = connect();
                write(&mut c, 1 << 20, &[1]);
                let stop = &stop;
                sc.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                        if c.write_all(&[1]).is_err() {
                            return;
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(300));
            let mut c = connect();
            let t0 = Instant::now();
            write(&mut c, 64, &[2; 64]);
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut status = [0u8; STATUS_LEN];
            let answered = c.read_exact(&mut status);
            let took = t0.elapsed();
            stop.store(true, Ordering::Relaxed);
            answered.expect("the request was answered");
            assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
            assert!(took < Duration::from_secs(3), "served after {took:?} behind {} trickling requests", max_threads());
            let threads = plane.counts.lock().threads;
            assert!(threads <= max_threads(), "{threads} threads for trickling payloads (cap {})", max_threads());
        });
        drop(engine);
    }

    /// Connections parked in the middle of a request, and busy threads.
    fn parked_pending_and_busy(plane: &DataPlane) -> (usize, usize) {
        let pending = plane.parked.lock().values().filter(|s| s.pending.is_some()).count();
        (pending, plane.counts.lock().busy)
    }

    /// Wait (bounded) until `plane` has `pending` connections parked in the
    /// middle of a request and no busy thread.
    fn wait_parked(plane: &DataPlane, pending: usize) -> (usize, usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = parked_pending_and_busy(plane);
            if now == (pending, 0) || Instant::now() >= deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A WRITE whose payload pauses mid-way is parked with its place in
    /// the payload (no thread waits for it), and lands byte for byte when
    /// the rest comes, in pieces with pauses between them, followed by a
    /// pipelined request on the same connection.
    #[test]
    fn a_payload_that_pauses_is_parked_and_lands_whole_when_it_goes_on() {
        const SIZE: usize = 3 << 20;
        let (engine, serving) = roomy_engine(|_| {});
        let region = vec![0u8; SIZE + 4096];
        let base = region.as_ptr() as u64;
        engine.register(base, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = admitted(&serving, &plane, &listener);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let payload: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        let h = RequestHeader { size: SIZE as u64, addr: base, direction: Direction::Write, acknowledged: true };
        c.write_all(&h.encode()).unwrap();
        // Pieces of every size around the floor and a buffer, with pauses
        // long past the flow's wait between them.
        let mut at = 0;
        for piece in [1000, 70_000, 1, 200_000, 65_536, 1_500_000] {
            c.write_all(&payload[at..at + piece]).unwrap();
            at += piece;
            assert_eq!(wait_parked(&plane, 1), (1, 0), "parked mid-payload after {at} bytes, no thread held");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The rest, and a pipelined small write behind it.
        let mut rest = payload[at..].to_vec();
        let h2 =
            RequestHeader { size: 4096, addr: base + SIZE as u64, direction: Direction::Write, acknowledged: true };
        rest.extend_from_slice(&h2.encode());
        rest.extend_from_slice(&[9u8; 4096]);
        c.write_all(&rest).unwrap();
        for _ in 0..2 {
            let mut status = [0u8; STATUS_LEN];
            c.read_exact(&mut status).unwrap();
            assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
        }
        assert!(region[..SIZE] == payload[..], "the paused payload landed byte for byte");
        assert!(region[SIZE..].iter().all(|&b| b == 9), "the pipelined write landed");
        assert_eq!(wait_parked(&plane, 0), (0, 0), "idle again");
        assert_eq!(plane.parked.lock().len(), 1, "parked between requests, not closed");
    }

    /// A READ whose initiator does not take the answer is parked until it
    /// does (no thread waits for room to send), and every byte arrives in
    /// order when it reads, status first.
    #[test]
    fn a_read_whose_peer_stops_reading_is_parked_and_finishes_when_it_reads() {
        const SIZE: usize = 16 << 20;
        let (engine, serving) = roomy_engine(|_| {});
        let region: Vec<u8> = (0..SIZE).map(|i| (i % 253) as u8).collect();
        let base = region.as_ptr() as u64;
        engine.register(base, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = admitted(&serving, &plane, &listener);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // A small write first: its acknowledgement rides ahead of the read's status.
        let w = RequestHeader { size: 16, addr: base, direction: Direction::Write, acknowledged: true };
        let r = RequestHeader { size: SIZE as u64, addr: base, direction: Direction::Read, acknowledged: true };
        let mut requests = w.encode().to_vec();
        requests.extend_from_slice(&region[..16]);
        requests.extend_from_slice(&r.encode());
        c.write_all(&requests).unwrap();
        assert_eq!(wait_parked(&plane, 1), (1, 0), "parked waiting for room to send, no thread held");
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..2 {
            let mut status = [0u8; STATUS_LEN];
            c.read_exact(&mut status).unwrap();
            assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
        }
        let mut got = vec![0u8; SIZE];
        let mut at = 0;
        while at < SIZE {
            // Slowly at first: a piece, a pause.
            let n = if at < (1 << 20) { 64 << 10 } else { SIZE - at };
            c.read_exact(&mut got[at..at + n]).unwrap();
            at += n;
            if at < (1 << 20) {
                std::thread::sleep(Duration::from_millis(30));
            }
        }
        assert!(got == region, "the read arrived whole and in order");
        assert_eq!(wait_parked(&plane, 0), (0, 0), "idle again");
    }

    /// A payload parked in the middle whose peer moves no more bytes is
    /// closed after the progress timeout, one that trickles is not; and
    /// unregistering the region ends a parked payload at once (its socket
    /// is shut down, which wakes it to let go of the region).
    #[test]
    fn a_parked_payload_ends_without_progress_or_at_unregistering() {
        let (engine, serving) = roomy_engine(|s| s.progress_timeout = Duration::from_millis(1500));
        let region = vec![0u8; 1 << 20];
        let base = region.as_ptr() as u64;
        engine.register(base, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = RequestHeader { size: 1 << 20, addr: base, direction: Direction::Write, acknowledged: true };
        let mut opening = h.encode().to_vec();
        opening.extend_from_slice(&[1u8; 1000]);
        let (mut silent, mut trickling) =
            (admitted(&serving, &plane, &listener), admitted(&serving, &plane, &listener));
        silent.write_all(&opening).unwrap();
        trickling.write_all(&opening).unwrap();
        assert_eq!(wait_parked(&plane, 2), (2, 0));
        let t0 = Instant::now();
        silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        trickling.set_nonblocking(true).unwrap();
        // The trickler sends a byte every 300 ms while the silent one is
        // waited for (its close: end of stream, or a reset).
        let closed = std::thread::scope(|sc| {
            let silent = sc.spawn(move || {
                let mut byte = [0u8; 1];
                let closed = matches!(silent.read(&mut byte), Ok(0) | Err(_));
                (closed, t0.elapsed())
            });
            while t0.elapsed() < Duration::from_millis(3500) {
                trickling.write_all(&[2]).unwrap();
                std::thread::sleep(Duration::from_millis(300));
            }
            silent.join().unwrap()
        });
        let (was_closed, after) = closed;
        assert!(was_closed, "the silent payload was closed");
        // The progress timeout, and a scan (a second) and a margin past it.
        assert!(after >= Duration::from_millis(1400) && after < Duration::from_secs(4), "closed after {after:?}");
        let mut byte = [0u8; 1];
        assert!(
            matches!(trickling.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the trickling payload is still open"
        );
        assert_eq!(wait_parked(&plane, 1), (1, 0));
        // Unregistering shuts it down and does not wait for the timeout.
        let t1 = Instant::now();
        engine.unregister(base).expect("the region unregisters");
        assert!(t1.elapsed() < Duration::from_secs(2), "unregistering took {:?}", t1.elapsed());
        trickling.set_nonblocking(false).unwrap();
        trickling.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(trickling.read(&mut byte), Ok(0) | Err(_)), "the parked payload was ended");
        assert_eq!(wait_parked(&plane, 0), (0, 0));
    }

    /// The threads named `name` in this process, as `/proc` lists them.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    /// A peer secret in a file of a test's own, and its bytes.
    fn secret_file(dir: &tempfile::TempDir) -> (String, Vec<u8>) {
        let path = dir.path().join("secret");
        std::fs::write(&path, [7u8; 40]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        (path.to_str().unwrap().to_owned(), vec![7u8; 40])
    }

    /// Threads added for work that cannot be parked (here hellos whose
    /// initiator never sends its proof of the peer secret: each holds its
    /// thread for the proof's bound) leave within the idle exit of their
    /// last work once that work is gone, while light traffic goes on
    /// (counted in `/proc`).
    #[test]
    fn threads_added_for_held_hellos_leave_under_light_traffic() {
        const NAME: &str = "pdx-data-shrink";
        const HELD: usize = 16;
        const IDLE: Duration = Duration::from_millis(500);
        let dir = tempfile::tempdir().unwrap();
        let (path, secret) = secret_file(&dir);
        let (engine, serving) = roomy_engine(|s| s.peer_secret_file = Some(path));
        let region = vec![0u8; 4 << 20];
        engine.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let plane = DataPlane::start_with(&serving, IDLE, NAME).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        // Each thread names itself once it runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        while threads_named(NAME) < BASE_THREADS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let idle = threads_named(NAME);
        assert_eq!(idle, BASE_THREADS);
        let instance = serving.identity.instance.clone();
        let request = |size: u64, payload: &[u8]| {
            let h =
                RequestHeader { size, addr: region.as_ptr() as u64, direction: Direction::Write, acknowledged: true };
            let mut r = h.encode().to_vec();
            r.extend_from_slice(payload);
            r
        };
        let stop = AtomicBool::new(false);
        let served = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|sc| {
            // Light traffic throughout: a 4 KiB write every 100 ms, on a
            // connection that proved the secret.
            let mut light = admitted(&serving, &plane, &listener);
            let deadline = Instant::now() + Duration::from_secs(10);
            hello::confirm(&mut light, &instance, deadline, "light", Some(&secret), None).unwrap();
            let (stop, served, request) = (&stop, &served, &request);
            light.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let traffic = sc.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut status = [0u8; STATUS_LEN];
                    let answered =
                        light.write_all(&request(4096, &[3; 4096])).and_then(|()| light.read_exact(&mut status));
                    if answered.is_err() || wire::decode_status(status) != Some(wire::STATUS_OK) {
                        return false;
                    }
                    served.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
                true
            });
            // The traffic stops whatever the assertions below find.
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = StopOnDrop(stop);
            let body =
                hello::Body { instance: Some(instance.clone()), nonce: Some("n".repeat(32)), ..hello::Body::default() };
            let held: Vec<TcpStream> = (0..HELD)
                .map(|_| {
                    let mut c = admitted(&serving, &plane, &listener);
                    c.write_all(&hello::encode_request_body(&body)).unwrap();
                    c
                })
                .collect();
            // The pool grows past its cap for them, a thread per STUCK.
            let deadline = Instant::now() + Duration::from_secs(60);
            while threads_named(NAME) <= max_threads() + 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let peak = threads_named(NAME);
            assert!(peak > max_threads(), "{peak} threads for {HELD} held hellos (cap {})", max_threads());
            drop(held);
            let closed = Instant::now();
            let served_at_close = served.load(Ordering::Relaxed);
            // Gone within the proof's bound (the hellos end there), the idle
            // exit and a few seconds more for a loaded machine.
            while threads_named(NAME) > idle + 2 && closed.elapsed() < IDLE + Duration::from_secs(8) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let took = closed.elapsed();
            let shrunk = threads_named(NAME);
            // The traffic goes on a while longer: the pool stays small under it.
            while served.load(Ordering::Relaxed) < served_at_close + 5 && closed.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let after = threads_named(NAME);
            let during = served.load(Ordering::Relaxed) - served_at_close;
            stop.store(true, Ordering::Relaxed);
            assert!(traffic.join().unwrap(), "every light request was answered");
            assert!(during >= 5, "the light traffic went on after the close: {during} requests served");
            assert!(shrunk <= idle + 2, "{shrunk} threads {took:?} after the held hellos closed (idle: {idle})");
            assert!(after <= idle + 2, "{after} threads once the traffic went on (idle: {idle})");
            eprintln!("{HELD} held hellos: {peak} threads, {after} {took:?} after they closed (idle {idle})");
        });
        drop(engine);
    }

    /// A lane reading 64 MiB as the initiator does (pieces of 4 MiB in
    /// windows of two, each window asked for once the one before has been
    /// received) keeps its thread between windows: the connection is not
    /// parked to the readiness loop and taken by another thread every
    /// window (issue 31: that cost large reads a third of their speed).
    #[test]
    fn a_lane_reading_windows_keeps_its_thread_between_them() {
        const PIECE: usize = 4 << 20;
        const WINDOWS: usize = 8;
        let (engine, serving) = roomy_engine(|_| {});
        let region: Vec<u8> = (0..2 * PIECE).map(|i| (i % 251) as u8).collect();
        engine.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = admitted(&serving, &plane, &listener);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut piece = vec![0u8; PIECE];
        for _ in 0..WINDOWS {
            let mut window = Vec::new();
            for k in 0..2 {
                let addr = region.as_ptr() as u64 + (k * PIECE) as u64;
                let h = RequestHeader { size: PIECE as u64, addr, direction: Direction::Read, acknowledged: true };
                window.extend_from_slice(&h.encode());
            }
            c.write_all(&window).unwrap();
            for k in 0..2 {
                let mut status = [0u8; STATUS_LEN];
                c.read_exact(&mut status).unwrap();
                assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
                c.read_exact(&mut piece).unwrap();
                assert!(piece == region[k * PIECE..(k + 1) * PIECE], "piece {k}");
            }
        }
        let parked = plane.parked_after_serving.load(Ordering::Relaxed);
        eprintln!("{WINDOWS} windows of 2 x 4 MiB reads: parked {parked} times between them");
        assert!(parked <= WINDOWS / 2, "parked {parked} times in {WINDOWS} windows");
    }

    /// A lane sending one request at a time, each header ahead of its
    /// payload (as Mooncake's initiator writes them), keeps its thread:
    /// every write lands whole, and a read or a smaller write after them
    /// (not the request the lingering thread waited for whole) is served
    /// too, within the linger.
    #[test]
    fn a_lane_of_single_requests_is_served_whole_whatever_comes_next() {
        const LEN: usize = 64 << 10;
        let (engine, serving) = roomy_engine(|_| {});
        let mut region = vec![0u8; 2 * LEN];
        engine.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let base = region.as_mut_ptr() as u64;
        let plane = DataPlane::start(&serving).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = admitted(&serving, &plane, &listener);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let status = |c: &mut TcpStream| {
            let mut status = [0u8; STATUS_LEN];
            c.read_exact(&mut status).unwrap();
            assert_eq!(wire::decode_status(status), Some(wire::STATUS_OK));
        };
        for round in 0..20u8 {
            let h = RequestHeader { size: LEN as u64, addr: base, direction: Direction::Write, acknowledged: true };
            c.write_all(&h.encode()).unwrap();
            std::thread::sleep(Duration::from_micros(200));
            c.write_all(&vec![round; LEN]).unwrap();
            status(&mut c);
            // SAFETY: the region is alive; the write was confirmed.
            let landed = unsafe { std::slice::from_raw_parts(base as *const u8, LEN) };
            assert!(landed.iter().all(|&b| b == round), "round {round}");
            let small =
                RequestHeader { size: 100, addr: base + LEN as u64, direction: Direction::Write, acknowledged: true };
            let read = RequestHeader { size: 100, addr: base, direction: Direction::Read, acknowledged: true };
            if round % 2 == 0 {
                c.write_all(&read.encode()).unwrap();
                status(&mut c);
                let mut back = [0u8; 100];
                c.read_exact(&mut back).unwrap();
                assert_eq!(back, [round; 100]);
            } else {
                let mut request = small.encode().to_vec();
                request.extend_from_slice(&[round; 100]);
                c.write_all(&request).unwrap();
                status(&mut c);
            }
        }
        let parked = plane.parked_after_serving.load(Ordering::Relaxed);
        eprintln!("40 single requests: parked {parked} times between them");
        assert!(parked <= 4, "parked {parked} times");
        drop(region);
    }
}
