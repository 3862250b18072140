//! Batches: many requests to one peer, run on up to `lanes_per_peer` lanes,
//! each request reaching exactly one terminal state. Asynchronous batches
//! are reached through a table of ids (index + generation, never a pointer),
//! so a stale or made-up id is an error, not a crash.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::super::memory::local::{HostMemory, WindowOutcome};
use super::super::net::deadline::Stall;
use super::super::Inner;
use super::cancel::{Ticket, Windows, CANCEL_BOUND};
use super::link::Link;
use super::peers::{recv_limit, stalled, Lane, Peer};
use super::plan::{Plan, PIECE_BYTES, WINDOW_BYTES};
use super::prepare::Prepared;
use super::task::Task;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::peer_stats::PeerCounters;
use crate::transfer::state::{self, BatchSummary, TaskState, TaskSummary};
use crate::transfer::{Direction, Notification, Request};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::batch";

/// Bytes of a window on a rail: one piece, so that the end of a batch is
/// shared between rails of different speeds in pieces, not in windows.
const RAIL_WINDOW_BYTES: usize = PIECE_BYTES;
/// With rails, the last bytes of a batch travel in pieces of
/// [`RAIL_TAIL_PIECE`] (and windows of one such piece): the rails finish
/// together instead of one idling while another moves the last large
/// pieces (two 1 Gbit/s links: 1.71 Gbit/s with 4 MiB pieces to the end,
/// 1.89 with this tail).
const RAIL_TAIL_BYTES: usize = 8 << 20;
const RAIL_TAIL_PIECE: usize = 512 << 10;

/// A running (or finished) batch.
pub struct BatchRun {
    session: String,
    direction: Direction,
    /// The longest request (checked against the peer's regions).
    longest: usize,
    /// What crosses the wire: every non-empty request, cut into pieces.
    plan: Plan,
    /// The devices of staged pieces.
    devices: Vec<Arc<super::super::memory::cuda::Device>>,
    tasks: Vec<Task>,
    remaining: AtomicUsize,
    abort: Mutex<Option<Error>>,
    peer: OnceLock<Result<Arc<Peer>>>,
    notify: Option<Notification>,
    notify_error: Mutex<Option<Error>>,
    done: Mutex<bool>,
    done_cv: Condvar,
    /// `done`, read without its lock by status polls (set under it).
    finished: AtomicBool,
    /// When the batch was made: task latencies and stall clocks count from here.
    started: Instant,
    /// A CUDA event the local bytes are read or written after (a `CUevent`).
    after: Option<usize>,
    /// Host memory waits for `after` once, before its first window.
    host_waited: OnceLock<Result<()>>,
    /// The statistics of the peer (see [`crate::transfer::peer_stats`]).
    peer_stats: Arc<PeerCounters>,
    /// Lane jobs of this batch still claiming windows (a slow rail's lane
    /// leaves the tail to the others only while another one claims).
    lanes_claiming: AtomicUsize,
    /// Its windows in flight, for a cancel to stop (see [`super::cancel`]).
    windows: Windows,
}

impl BatchRun {
    /// A batch of checked requests. Zero-length requests complete at once
    /// (nothing crosses the wire for them, as in Mooncake).
    pub fn new(
        inner: &Inner,
        session: &str,
        direction: Direction,
        prepared: Prepared,
        notify: Option<Notification>,
        after: Option<usize>,
    ) -> Arc<BatchRun> {
        // Device memory travels in pieces of one staging buffer (host-only
        // batches never ask the pool).
        let device_piece = if prepared.kinds.is_empty() { 0 } else { inner.staging.chunk() };
        let mut plan = Plan::new(&prepared.reqs, &prepared.kinds, device_piece);
        // Only to a peer already paired with rails (a peer without, such as
        // Mooncake, gets the pieces it always did; a peer's first batch
        // finds it not yet known, and keeps them too).
        let railed =
            inner.settings.tcp_rails.is_some() && inner.peers.cached(session).is_some_and(|p| p.rails().is_some());
        if railed {
            plan.split_tail(RAIL_TAIL_BYTES, RAIL_TAIL_PIECE);
        }
        let tasks =
            plan.task_pieces.iter().zip(&prepared.reqs).map(|(&count, r)| Task::new(count, r.len as u64)).collect();
        let pending = plan.task_pieces.iter().filter(|&&c| c > 0).count();
        Arc::new(BatchRun {
            session: session.to_owned(),
            direction,
            longest: prepared.reqs.iter().map(|r| r.len).max().unwrap_or(0),
            plan,
            devices: prepared.devices,
            tasks,
            remaining: AtomicUsize::new(pending),
            abort: Mutex::new(None),
            peer: OnceLock::new(),
            notify,
            notify_error: Mutex::new(None),
            done: Mutex::new(false),
            finished: AtomicBool::new(false),
            done_cv: Condvar::new(),
            started: Instant::now(),
            after,
            host_waited: OnceLock::new(),
            peer_stats: inner.stats.peers.entry(session),
            lanes_claiming: AtomicUsize::new(0),
            windows: Windows::default(),
        })
    }

    /// Start the batch: lane jobs on the workers and, when `on_caller`, one
    /// on the calling thread (which then keeps taking windows until none is
    /// left, so it never idles while work remains).
    pub fn start(self: &Arc<Self>, inner: &Arc<Inner>, on_caller: bool) {
        // Zero-length tasks completed when the batch was made.
        inner.stats.tasks_submitted(&self.peer_stats, self.tasks.len() as u64);
        for t in self.tasks.iter().filter(|t| t.pieces_left.load(Ordering::Acquire) == 0) {
            debug_assert_eq!(t.state(), TaskState::Completed);
            inner.stats.task_finished(&self.peer_stats, self.direction, 0, Duration::ZERO, Ok(0));
        }
        if self.remaining.load(Ordering::Acquire) == 0 {
            self.finish(inner);
            return;
        }
        let per_peer = inner.settings.lanes_per_peer;
        let mut lanes = self.plan.lanes(per_peer);
        // With rails, two lanes on each rail up (one sends while the other
        // waits for its acknowledgements), within the per-peer limit.
        let rails = match inner.settings.tcp_rails {
            Some(_) => self.peer(inner).ok().and_then(|p| p.rails().map(|set| set.up_indexes())),
            None => None,
        };
        let rails = rails.unwrap_or_default();
        if !rails.is_empty() {
            lanes = lanes.max(rails.len() * 2).min(per_peer.max(rails.len()));
        }
        let hint = |k: usize| (!rails.is_empty()).then(|| rails[k % rails.len()]);
        self.lanes_claiming.store(lanes, Ordering::Release);
        let on_workers = if on_caller { lanes - 1 } else { lanes };
        for k in 0..on_workers {
            let run = self.clone();
            let inner2 = inner.clone();
            let rail = hint(k + usize::from(on_caller));
            inner.workers.submit(&self.session, Box::new(move || run.lane_job(&inner2, rail)));
        }
        if on_caller {
            self.lane_job(inner, hint(0));
        }
    }

    fn peer(&self, inner: &Inner) -> Result<Arc<Peer>> {
        self.peer
            .get_or_init(|| {
                let peer = inner.peers.get(&self.session)?;
                peer.check_fits(self.longest)?;
                Ok(peer)
            })
            .clone()
    }

    fn set_abort(&self, e: &Error) {
        self.abort.lock().get_or_insert_with(|| e.clone());
    }

    /// Piece `i` is terminal. Its task is terminal once all its pieces are.
    fn complete(&self, inner: &Inner, i: usize, result: Result<()>) {
        let task = &self.tasks[self.plan.piece_task[i]];
        match result {
            Ok(()) => {
                task.bytes.fetch_add(self.plan.pieces[i].len as u64, Ordering::AcqRel);
            }
            Err(e) => {
                // Whatever broke while stopping, the cause is the stop.
                let e = if inner.registry.stopping() && e.kind() != ErrorKind::Shutdown {
                    Error::new(ErrorKind::Shutdown, format!("engine is shutting down ({e})"))
                } else {
                    e
                };
                task.error.lock().get_or_insert(e);
            }
        }
        if task.pieces_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let error = task.error.lock().clone();
        let state = if error.is_some() { TaskState::Failed } else { TaskState::Completed };
        // The one decision of how the task ends: a cancel that decided
        // first keeps it cancelled (and accounts for it itself).
        if !task.decide(state) {
            return;
        }
        let outcome = match &error {
            Some(e) => Err(e),
            None => Ok(task.bytes.load(Ordering::Acquire)),
        };
        inner.stats.task_finished(&self.peer_stats, self.direction, task.requested, self.started.elapsed(), outcome);
        if let (Ok(bytes), false) = (outcome, task.over_tcp.load(Ordering::Acquire)) {
            inner.stats.same_host_task(&self.peer_stats, self.direction, bytes);
        }
        self.task_done(inner);
    }

    /// A task left the count of unfinished ones; the last one finishes the batch.
    fn task_done(&self, inner: &Inner) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(inner);
        }
    }

    fn canceled(&self, task: usize) -> bool {
        self.tasks[task].state() == TaskState::Canceled
    }

    /// Cancel the tasks still in flight (`task`: that one only); returns
    /// how many this call cancelled. Once it returns `Ok`, nothing touches
    /// a cancelled task's local memory any more (see [`super::cancel`]);
    /// the other tasks carry on, those that shared a window with a
    /// cancelled one on a fresh lane. `Timeout` when a window stopped did
    /// not end within [`CANCEL_BOUND`] (the tasks stay cancelled, and the
    /// batch finishes once it ends).
    pub fn cancel(&self, inner: &Inner, task: Option<usize>) -> Result<usize> {
        let range = match task {
            Some(t) if t >= self.tasks.len() => return Err(state::no_such_task(t, self.tasks.len())),
            Some(t) => t..t + 1,
            None => 0..self.tasks.len(),
        };
        let won: Vec<usize> = range
            .filter(|&t| {
                let task = &self.tasks[t];
                let won = task.decide(TaskState::Canceled);
                if won {
                    *task.error.lock() = Some(state::canceled());
                }
                won
            })
            .collect();
        // Even with nothing won here (another cancel decided first), this
        // returns only once no window of a cancelled task runs.
        let by = Instant::now() + CANCEL_BOUND;
        let settle = |tasks: &[usize]| self.settle_canceled(inner, tasks);
        match self.windows.stop(&won, &|t| self.canceled(t), &settle, CANCEL_BOUND) {
            Ok(()) => {
                // Every task is terminal now; a completion that raced this
                // cancel may still be finishing the batch: a whole-batch
                // cancel returns with the batch finished (but for a
                // notification on its way, when all had completed first).
                let notifies = self.notify.is_some() && !(0..self.tasks.len()).any(|t| self.canceled(t));
                if task.is_none() && !notifies {
                    self.wait_until(Some(by));
                }
                Ok(won.len())
            }
            Err(running) => Err(Error::timeout(format!(
                "cancelling in batch to {}: {running} window(s) in flight did not end within {CANCEL_BOUND:?}; \
                 their tasks are cancelled and the batch finishes once they end",
                self.session
            ))),
        }
    }

    /// Account for cancelled tasks no window holds any more (under the
    /// windows' lock: nothing in it waits on the network, since a batch
    /// with a cancelled task sends no notification).
    fn settle_canceled(&self, inner: &Inner, tasks: &[usize]) {
        for _ in tasks {
            inner.stats.task_canceled(&self.peer_stats);
            self.task_done(inner);
        }
    }

    /// List the window `idx` about to run on `link` (see
    /// [`super::cancel`]), its cancelled tasks' pieces left out; `None`
    /// when none is left.
    fn enter(&self, idx: &mut Vec<usize>, link: &dyn Link) -> Option<Ticket<'_>> {
        let cutter = link.cutter(idx.iter().map(|&i| self.plan.pieces[i].len).max().unwrap_or(0));
        self.windows.enter(idx, &|i| self.plan.piece_task[i], &|t| self.canceled(t), cutter)
    }

    /// Take the window off the list; true if a cancel stopped it.
    fn leave(&self, inner: &Inner, ticket: Ticket<'_>) -> bool {
        self.windows.leave(ticket, &|t| self.canceled(t), &|tasks| self.settle_canceled(inner, tasks))
    }

    /// Close a lane whose window a cancel stopped: with a reset (no stale
    /// byte of it is ever read again, and what its socket still queues is
    /// not sent), and without a word against the peer or its rail.
    fn discard_cut(&self, peer: &Peer, lane: Lane) {
        let _ = socket2::SockRef::from(lane.conn.stream()).set_linger(Some(Duration::ZERO));
        peer.release(lane, false);
    }

    fn fail_all(&self, inner: &Inner, idx: &[usize], e: &Error) {
        for &i in idx {
            self.complete(inner, i, Err(e.clone()));
        }
    }

    fn finish(&self, inner: &Inner) {
        if let Some(note) = &self.notify {
            if self.tasks.iter().all(|t| t.state() == TaskState::Completed) {
                let sent = self.peer(inner).and_then(|p| p.notify(note));
                if let Err(e) = sent {
                    log::warn!(target: LOG_TARGET, "batch to {} completed but its notification failed: {e}", self.session);
                    *self.notify_error.lock() = Some(e);
                }
            }
        }
        let mut done = self.done.lock();
        *done = true;
        self.finished.store(true, Ordering::Release);
        drop(done);
        self.done_cv.notify_all();
        match self.outcome() {
            Err(e) if e.kind() != ErrorKind::Canceled => {
                log::warn!(target: LOG_TARGET, "{} to {} failed: {e}", self.direction.name(), self.session)
            }
            _ => {}
        }
    }

    /// The error of piece `i`, which the target rejected. The wire's reject
    /// says no more than that: Mooncake sends it for a range outside its
    /// registered memory, a pdx target also when serving failed on its side
    /// (a device copy, synchronize, pinned buffer or stream); it logs which
    /// and counts device faults in its statistics. The peer's advertised
    /// regions tell the two apart where they can.
    fn rejected(&self, i: usize) -> Error {
        let r = &self.plan.pieces[i];
        let (start, end) = (r.remote, r.remote.saturating_add(r.len as u64));
        let advertised = self.peer.get().and_then(|p| p.as_ref().ok()).map(|p| p.descriptor());
        let why = match advertised {
            Some(d) if d.buffers.iter().any(|b| b.addr <= start && end <= b.addr.saturating_add(b.length)) => {
                "the range lies inside a region it advertised, so serving it failed on its side (a device fault, or \
                 the region was being unregistered); its log says which"
            }
            Some(d) if !d.buffers.is_empty() => {
                "the range is not inside one region it advertised (as of its descriptor; a fault on its side is \
                 rejected the same way: see its log)"
            }
            _ => {
                "a range outside the memory it registered, or a fault on its side while serving it (the reject does \
                 not say which: see its log)"
            }
        };
        Error::new(
            ErrorKind::RemoteRejected,
            format!(
                "{} rejected {} of {} bytes at remote address {:#x}: {why}",
                self.session,
                self.direction.name(),
                r.len,
                r.remote
            ),
        )
    }

    /// Whether a lane on `rail` should leave the rest of the batch to the
    /// other lanes (see [`super::super::net::rails::RailSet::should_yield`]); it then
    /// stops claiming, and at least one lane always keeps claiming.
    fn yields(&self, peer: &Peer, lane: Option<&Lane>) -> bool {
        let Some((set, rail)) = lane.and_then(|l| peer.rails_of(l)) else { return false };
        let Some((window, unclaimed)) = self.plan.peek(self.rail_window()) else { return false };
        if !set.should_yield(&rail, window, unclaimed) {
            return false;
        }
        let mut n = self.lanes_claiming.load(Ordering::Acquire);
        while n > 1 {
            match self.lanes_claiming.compare_exchange(n, n - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
        false
    }

    /// The window a lane on a rail claims: one piece; in the batch's tail
    /// (see [`RAIL_TAIL_BYTES`]), one of its smaller pieces.
    fn rail_window(&self) -> usize {
        match self.plan.peek(RAIL_WINDOW_BYTES) {
            Some((_, unclaimed)) if unclaimed <= RAIL_TAIL_BYTES => RAIL_TAIL_PIECE,
            _ => RAIL_WINDOW_BYTES,
        }
    }

    fn lane_job(&self, inner: &Inner, rail: Option<usize>) {
        let peer = match self.peer(inner) {
            Ok(p) => p,
            Err(e) => {
                while let Some(w) = self.plan.claim() {
                    let idx: Vec<usize> = w.collect();
                    self.fail_all(inner, &idx, &e);
                }
                return;
            }
        };
        let stall = Stall::since(peer.progress.clone(), self.started);
        let mut lane: Option<Lane> = None;
        loop {
            if self.yields(&peer, lane.as_ref()) {
                break;
            }
            // Lanes on rails take smaller windows (see `RAIL_WINDOW_BYTES`).
            let on_rail = lane.as_ref().map_or(rail.is_some(), |l| l.rail.is_some());
            let Some(w) = self.plan.claim_within(if on_rail { self.rail_window() } else { WINDOW_BYTES }) else {
                break;
            };
            let mut idx: Vec<usize> = w.collect();
            // Cancelled tasks' pieces never go out (checked again, under the
            // cancel's lock, when the window is listed).
            idx.retain(|&i| !self.canceled(self.plan.piece_task[i]));
            if idx.is_empty() {
                continue;
            }
            let next = self.proceed(inner, &stall, None);
            let mut l = match next
                .and_then(|()| lane.take().map(Ok).unwrap_or_else(|| self.open_on(&peer, &stall, None, rail)))
            {
                Ok(l) => l,
                Err(e) => {
                    self.fail_all(inner, &idx, &e);
                    continue;
                }
            };
            let Some(ticket) = self.enter(&mut idx, &l) else {
                lane = Some(l);
                continue;
            };
            // SAFETY: the submitter guarantees local memory stays valid until
            // every task of the batch is terminal.
            let out = unsafe { self.run_lane(inner, &peer, &mut l, &idx, &ticket) };
            let cut = self.leave(inner, ticket);
            for &i in &idx[..out.confirmed] {
                self.complete(inner, i, Ok(()));
            }
            let mut next = out.confirmed;
            if cut {
                // A cancel stopped the window: the lane goes, and what it
                // held of other tasks runs again on fresh lanes.
                self.discard_cut(&peer, l);
                if out.rejected {
                    self.complete(inner, idx[next], Err(self.rejected(idx[next])));
                    next += 1;
                }
                self.retry_each(inner, &peer, &stall, &idx[next..], None);
                continue;
            }
            match out.broken {
                None => lane = Some(l),
                Some(e) => {
                    peer.release(l, false);
                    if !out.rejected && e.kind() == ErrorKind::ConnectionLost {
                        // The peer closed the lane (it may have restarted): its
                        // other pooled lanes are as stale, and the retry below
                        // runs on a fresh connection, the peer re-validated.
                        peer.discard_idle();
                    }
                    if out.rejected {
                        self.complete(inner, idx[next], Err(self.rejected(idx[next])));
                        next += 1;
                    }
                    self.retry_each(inner, &peer, &stall, &idx[next..], Some(e));
                }
            }
        }
        if let Some(l) = lane {
            peer.release(l, true);
        }
    }

    /// Whether the next window may go: not if the batch is aborted or its
    /// peer has been silent for the limit (then the batch aborts with that).
    /// `cause` is the failure a retry follows, added to the error.
    fn proceed(&self, inner: &Inner, stall: &Stall, cause: Option<&Error>) -> Result<()> {
        let limit = recv_limit(&inner.settings);
        if stall.expired(limit) {
            self.set_abort(&after(stalled(&self.session, limit), cause));
        }
        match self.abort.lock().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A lane for the next window; a failure aborts the batch.
    fn open(&self, peer: &Peer, stall: &Stall, cause: Option<&Error>) -> Result<Lane> {
        self.open_on(peer, stall, cause, None)
    }

    /// [`Self::open`] on rail `rail` while it is up (see [`Peer::acquire_on`]).
    fn open_on(&self, peer: &Peer, stall: &Stall, cause: Option<&Error>, rail: Option<usize>) -> Result<Lane> {
        let acquired = match rail {
            Some(_) => peer.acquire_on(stall, rail),
            None => peer.acquire(stall),
        };
        match acquired {
            Ok(mut l) => {
                l.conn.set_stall(stall.clone());
                self.peer_stats.set_path(peer.path.get());
                Ok(l)
            }
            Err(e) => {
                let e = after(e, cause);
                self.set_abort(&e);
                Err(e)
            }
        }
    }

    /// A window all of device memory on `dev`, moved by the link without
    /// staging where it can (after the transfer's CUDA event, waited for on
    /// the host); `None`: stage it.
    ///
    /// # Safety
    /// As for [`Link::run_device_window`].
    unsafe fn run_direct(
        &self,
        link: &mut dyn Link,
        idx: &[usize],
        reqs: &[Request],
        dev: &Arc<super::super::memory::cuda::Device>,
    ) -> Option<WindowOutcome> {
        if !link.moves_device_memory() || idx.iter().any(|&i| self.plan.kind(i).is_none()) {
            return None;
        }
        if let Some(event) = self.after {
            if let Err(e) = self.host_waited.get_or_init(|| super::super::memory::cuda::wait_on_host(event)).clone() {
                return Some(WindowOutcome { confirmed: 0, rejected: false, broken: Some(e) });
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { link.run_device_window(self.direction, reqs, dev) }
    }

    /// [`Self::run`] on a lane, counted on its rail: the bytes it confirms
    /// and how fast; a rail that broke the window (its own clock ran out,
    /// or its connection was lost) while another rail is up is marked down,
    /// and the caller retries the rest on the others.
    ///
    /// # Safety
    /// As for [`Self::run`].
    unsafe fn run_lane(
        &self,
        inner: &Inner,
        peer: &Peer,
        lane: &mut Lane,
        idx: &[usize],
        ticket: &Ticket<'_>,
    ) -> WindowOutcome {
        let Some(rail) = lane.rail.clone() else {
            // SAFETY: forwarded from the caller.
            return unsafe { self.run(inner, lane, idx, ticket) };
        };
        let t0 = Instant::now();
        rail.busy(true);
        // SAFETY: forwarded from the caller.
        let out = unsafe { self.run(inner, lane, idx, ticket) };
        let bytes: usize = idx[..out.confirmed].iter().map(|&i| self.plan.pieces[i].len).sum();
        rail.confirmed(bytes as u64, t0.elapsed());
        rail.busy(false);
        // A window a cancel cut says nothing of the rail.
        let failed = if ticket.is_cut() { None } else { out.broken.as_ref() };
        if let (Some(e), false, Some((set, _))) = (failed, out.rejected, peer.rails_of(lane)) {
            let lost = matches!(e.kind(), ErrorKind::Timeout | ErrorKind::ConnectionLost);
            if lost && set.rails.iter().any(|r| r.index != rail.index && r.is_up()) {
                // Its pieces are sent again on another rail: what this
                // connection still queues must never arrive after them
                // (over newer bytes), so it closes with a reset.
                let _ = socket2::SockRef::from(lane.conn.stream()).set_linger(Some(Duration::ZERO));
                set.mark_down(&rail, format!("{e}"));
            }
        }
        out
    }

    /// Run the pieces `idx` (one window, listed as `ticket`) on `link`: host
    /// memory as it is, device memory staged (or moved by the link itself
    /// where it can). Connection errors name the peer here, once.
    ///
    /// # Safety
    /// As for the batch: local memory stays valid until every task is terminal.
    unsafe fn run(&self, inner: &Inner, link: &mut dyn Link, idx: &[usize], ticket: &Ticket<'_>) -> WindowOutcome {
        let reqs: Vec<Request> = idx.iter().map(|&i| self.plan.pieces[i]).collect();
        let device = idx.iter().find_map(|&i| self.plan.kind(i));
        let mut out = match device.and_then(|d| self.devices.iter().find(|dev| dev.ordinal == d)) {
            None => {
                let waited = match self.after {
                    Some(event) => {
                        self.host_waited.get_or_init(|| super::super::memory::cuda::wait_on_host(event)).clone()
                    }
                    None => Ok(()),
                };
                match waited {
                    // SAFETY: forwarded from the caller.
                    Ok(()) => unsafe { link.run_window(self.direction, &reqs, &mut HostMemory::new(&reqs)) },
                    Err(e) => WindowOutcome { confirmed: 0, rejected: false, broken: Some(e) },
                }
            }
            // SAFETY: as above.
            Some(dev) => unsafe { self.run_direct(link, idx, &reqs, dev) }.unwrap_or_else(|| {
                let on_device = idx.iter().map(|&i| self.plan.kind(i).is_some()).collect();
                let stop = || inner.registry.stopping() || ticket.is_cut();
                match inner.staging.staged(&reqs, on_device, dev, self.after, &stop) {
                    // SAFETY: as above.
                    Ok(mut memory) => unsafe { link.run_window(self.direction, &reqs, &mut memory) },
                    Err(e) => WindowOutcome { confirmed: 0, rejected: false, broken: Some(e) },
                }
            }),
        };
        if link.path() != super::super::samehost::PATH {
            for &i in &idx[..out.confirmed] {
                self.tasks[self.plan.piece_task[i]].over_tcp.store(true, Ordering::Release);
            }
        }
        if let Some(e) = out.broken.take() {
            let named = matches!(e.kind(), ErrorKind::ConnectionLost | ErrorKind::Timeout | ErrorKind::Protocol);
            out.broken = Some(if named { e.context(format!("{} to {}", link.path(), self.session)) } else { e });
        }
        out
    }

    /// The slow path after a broken window: each unconfirmed request once
    /// more, alone, so one bad entry cannot fail its neighbours. A
    /// connection-level failure here means the peer is gone: the rest of the
    /// batch fails with that error instead of waiting on it again.
    /// Retries count against the task's stall clock: once the peer has
    /// been silent for the limit, what is left fails without another try.
    fn retry_each(&self, inner: &Inner, peer: &Peer, stall: &Stall, idx: &[usize], cause: Option<Error>) {
        for (k, &i) in idx.iter().enumerate() {
            if self.canceled(self.plan.piece_task[i]) {
                continue;
            }
            let next = self.proceed(inner, stall, cause.as_ref());
            let mut l = match next.and_then(|()| self.open(peer, stall, cause.as_ref())) {
                Ok(l) => l,
                Err(e) => {
                    self.fail_all(inner, &idx[k..], &e);
                    return;
                }
            };
            let v2 = l.v2;
            let mut one = vec![i];
            let Some(ticket) = self.enter(&mut one, &l) else {
                peer.release(l, true);
                continue;
            };
            // SAFETY: as in `lane_job`.
            let out = unsafe { self.run_lane(inner, peer, &mut l, &one, &ticket) };
            if self.leave(inner, ticket) {
                // Its task was cancelled meanwhile.
                if out.confirmed == 1 {
                    self.complete(inner, i, Ok(()));
                }
                self.discard_cut(peer, l);
                continue;
            }
            match out.broken {
                None => {
                    peer.release(l, true);
                    self.complete(inner, i, Ok(()));
                }
                Some(_) if out.rejected => {
                    peer.release(l, false);
                    self.complete(inner, i, Err(self.rejected(i)));
                }
                Some(e) if e.kind() == ErrorKind::Device => {
                    // A local driver call failed for this request alone: the
                    // connection is clean and the others carry on.
                    peer.release(l, true);
                    self.complete(inner, i, Err(e));
                }
                Some(e) if !v2 && e.kind() == ErrorKind::ConnectionLost => {
                    // A v1 target refuses a bad address by closing silently.
                    peer.release(l, false);
                    let e = Error::new(
                        ErrorKind::RemoteRejected,
                        format!(
                            "{} (a protocol-v1 peer closes the connection when the address is not registered)",
                            self.rejected(i)
                        ),
                    );
                    self.complete(inner, i, Err(e));
                }
                Some(e) => {
                    peer.release(l, false);
                    self.set_abort(&e);
                    self.complete(inner, i, Err(e.clone()));
                    self.fail_all(inner, &idx[k + 1..], &e);
                    return;
                }
            }
        }
    }

    /// Wait until every task is terminal or `deadline` passes; true if done.
    pub fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let mut done = self.done.lock();
        while !*done {
            match deadline {
                Some(d) => {
                    if self.done_cv.wait_until(&mut done, d).timed_out() {
                        return *done;
                    }
                }
                None => self.done_cv.wait(&mut done),
            }
        }
        true
    }

    /// True once every task is terminal (and any notification was sent).
    pub fn is_done(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    pub fn summary(&self) -> BatchSummary {
        let tasks = self.tasks.iter().map(Task::status);
        BatchSummary::tally(tasks, self.is_done())
    }

    /// A task's state and bytes confirmed, from its atomics alone (no lock
    /// a transfer thread takes, no allocation): what status polls read. A
    /// completed task's bytes are final (added before the state was decided).
    pub fn task_state(&self, i: usize) -> Result<(TaskState, u64)> {
        Ok(self.tasks.get(i).ok_or_else(|| state::no_such_task(i, self.tasks.len()))?.status())
    }

    pub fn task(&self, i: usize) -> Result<TaskSummary> {
        let t = self.tasks.get(i).ok_or_else(|| state::no_such_task(i, self.tasks.len()))?;
        Ok(TaskSummary { state: t.state(), bytes: t.bytes.load(Ordering::Acquire), error: t.error.lock().clone() })
    }

    /// The error of a finished batch: `Ok` if every task completed, else
    /// the first failure (or cancel) with a count.
    pub fn outcome(&self) -> Result<()> {
        // A failure is named before a cancel.
        let of = |s: TaskState| self.tasks.iter().filter(move |t| t.state() == s).map(|t| t.error.lock().clone());
        state::outcome(self.tasks.len(), of(TaskState::Failed).chain(of(TaskState::Canceled)))
    }

    /// The notification error, if the batch's notification failed.
    pub fn notify_error(&self) -> Option<Error> {
        self.notify_error.lock().clone()
    }
}

/// `e`, after the failure `cause` that led to it.
fn after(e: Error, cause: Option<&Error>) -> Error {
    match cause {
        Some(c) => e.context(format!("after \"{c}\"")),
        None => e,
    }
}
