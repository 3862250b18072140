//! Cancelling tasks of a running batch so that their local memory is
//! touched no more.
//!
//! The executor lists every window here before it touches the window's
//! memory, with the tasks its pieces belong to and how to stop it (the
//! link's [`Cutter`]), and takes it off once nothing of it runs any more
//! (device copies synchronized, the link's thread back). A cancel:
//! 1. decides, task by task, that the task ends cancelled: one
//!    compare-and-swap on the task's state, which a completion racing it
//!    does too, so exactly one of the two wins (the executor's part);
//! 2. stops every listed window that holds a cancelled task
//!    ([`Cutter::ask`], then [`Cutter::force`] after the cutter's grace)
//!    and waits until none is listed, at most [`CANCEL_BOUND`]. A window
//!    listed after step 1 leaves the cancelled tasks' pieces out: the
//!    decision and the listing are ordered by this module's lock, so a
//!    piece is either in a listed window that the cancel stops and waits
//!    for, or never sent.
//!
//! Cancelled tasks leave the batch's count of unfinished tasks only once
//! no window holds one ([`Windows::stop`], or the [`Windows::leave`] of
//! the last such window), under this module's lock: a finished batch
//! (which its caller may free, and whose memory it may reuse) never has a
//! window in flight, and a cancel that returns `Ok` has accounted for its
//! tasks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::link::Cutter;

/// The longest a cancel waits for the windows it stopped to end. A socket
/// shut down ends its window at once (the thread's send or receive
/// returns); a target that copies itself is given its
/// [`Cutter::grace`] first. What is left is a device copy being
/// synchronized, or a loaded machine.
pub(crate) const CANCEL_BOUND: Duration = Duration::from_secs(10);

/// The windows of one batch in flight.
#[derive(Default)]
pub(crate) struct Windows {
    state: Mutex<State>,
    left: Condvar,
}

#[derive(Default)]
struct State {
    open: Vec<Open>,
    next: u64,
    /// Tasks cancelled whose accounting waits until no window holds a
    /// cancelled task.
    unsettled: Vec<usize>,
}

struct Open {
    id: u64,
    /// The tasks its pieces belong to.
    tasks: Vec<usize>,
    cutter: Cutter,
    cut: Arc<AtomicBool>,
    /// When a cancel asked it to stop.
    asked: Option<Instant>,
    forced: bool,
}

/// A listed window; [`Windows::leave`] takes it off (dropped without that,
/// by a panic, it is taken off all the same).
pub(crate) struct Ticket<'a> {
    windows: &'a Windows,
    id: u64,
    cut: Arc<AtomicBool>,
    left: bool,
}

impl Ticket<'_> {
    /// Whether a cancel stopped this window: its link is then discarded,
    /// and its broken outcome says nothing of the peer or the rail.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.windows.remove(self.id);
        }
    }
}

impl Windows {
    /// List a window of pieces `idx` (`task_of` maps a piece to its task)
    /// about to run, stopped by `cutter`; the pieces of cancelled tasks
    /// are taken out of `idx` first. `None`: nothing is left to run.
    pub fn enter(
        &self,
        idx: &mut Vec<usize>,
        task_of: &dyn Fn(usize) -> usize,
        canceled: &dyn Fn(usize) -> bool,
        cutter: Cutter,
    ) -> Option<Ticket<'_>> {
        let mut st = self.state.lock();
        idx.retain(|&i| !canceled(task_of(i)));
        if idx.is_empty() {
            return None;
        }
        let mut tasks: Vec<usize> = idx.iter().map(|&i| task_of(i)).collect();
        tasks.dedup();
        let (id, cut) = (st.next, Arc::new(AtomicBool::new(false)));
        st.next += 1;
        st.open.push(Open { id, tasks, cutter, cut: cut.clone(), asked: None, forced: false });
        Some(Ticket { windows: self, id, cut, left: false })
    }

    /// Take the window off the list once nothing of it runs any more;
    /// when it was the last window holding a cancelled task, `settle` the
    /// cancelled tasks not yet accounted for (under the lock). Returns
    /// whether a cancel stopped it.
    pub fn leave(&self, mut ticket: Ticket<'_>, canceled: &dyn Fn(usize) -> bool, settle: &dyn Fn(&[usize])) -> bool {
        ticket.left = true;
        let mut st = self.state.lock();
        if let Some(k) = st.open.iter().position(|w| w.id == ticket.id) {
            st.open.swap_remove(k);
        }
        if !st.unsettled.is_empty() && !holds_canceled(&st.open, canceled) {
            settle(&std::mem::take(&mut st.unsettled));
        }
        drop(st);
        self.left.notify_all();
        ticket.is_cut()
    }

    fn remove(&self, id: u64) {
        self.state.lock().open.retain(|w| w.id != id);
        self.left.notify_all();
    }

    /// Stop every listed window that holds a cancelled task (`canceled`
    /// already says so for the tasks `won`, which this cancel decided) and
    /// wait until none is listed, at most `bound`; then `settle` the
    /// cancelled tasks not yet accounted for (under the lock). `Err(n)`:
    /// `n` windows were still running at the bound; the last of them to
    /// leave settles the tasks.
    pub fn stop(
        &self,
        won: &[usize],
        canceled: &dyn Fn(usize) -> bool,
        settle: &dyn Fn(&[usize]),
        bound: Duration,
    ) -> Result<(), usize> {
        let deadline = Instant::now() + bound;
        let mut st = self.state.lock();
        st.unsettled.extend_from_slice(won);
        loop {
            let now = Instant::now();
            let mut wake = deadline;
            let mut running = 0usize;
            for w in st.open.iter_mut().filter(|w| w.tasks.iter().any(|&t| canceled(t))) {
                running += 1;
                let grace = w.cutter.grace();
                match w.asked {
                    None => {
                        // Marked before the socket is shut down: the thread
                        // woken by it sees why.
                        w.cut.store(true, Ordering::Release);
                        w.cutter.ask();
                        w.asked = Some(now);
                        if !grace.is_zero() {
                            wake = wake.min(now + grace);
                        }
                    }
                    Some(at) if !w.forced && now >= at + grace => {
                        w.cutter.force();
                        w.forced = true;
                    }
                    Some(at) if !w.forced => wake = wake.min(at + grace),
                    Some(_) => {}
                }
            }
            if running == 0 {
                if !st.unsettled.is_empty() {
                    settle(&std::mem::take(&mut st.unsettled));
                }
                return Ok(());
            }
            if now >= deadline {
                return Err(running);
            }
            self.left.wait_until(&mut st, wake);
        }
    }
}

fn holds_canceled(open: &[Open], canceled: &dyn Fn(usize) -> bool) -> bool {
    open.iter().any(|w| w.tasks.iter().any(|&t| canceled(t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn socket() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// A window listed after the decision leaves the cancelled pieces out;
    /// one listed before is cut, and the cancel returns only once it left.
    #[test]
    fn a_cancel_cuts_the_windows_that_hold_its_tasks_and_waits_for_them() {
        let w = Windows::default();
        let settled = Mutex::new(Vec::new());
        let settle = |t: &[usize]| settled.lock().extend_from_slice(t);
        let canceled = [AtomicBool::new(false), AtomicBool::new(false)];
        let is_canceled = |t: usize| canceled[t].load(Ordering::Acquire);
        let task_of = |piece: usize| piece / 10;
        let (a, _b) = socket();
        let mut idx = vec![1, 2, 11];
        let ticket = w.enter(&mut idx, &task_of, &is_canceled, Cutter::Socket(a.as_raw_fd())).unwrap();
        let (c, _d) = socket();
        let mut other = vec![12];
        let untouched = w.enter(&mut other, &task_of, &is_canceled, Cutter::Socket(c.as_raw_fd())).unwrap();
        canceled[0].store(true, Ordering::Release);
        std::thread::scope(|s| {
            let lane = s.spawn(|| {
                // The lane's receive wakes when the cancel shuts its socket down.
                let mut byte = [0u8; 1];
                assert_eq!(std::io::Read::read(&mut &a, &mut byte).unwrap(), 0);
                assert!(ticket.is_cut());
                assert!(w.leave(ticket, &is_canceled, &settle));
            });
            w.stop(&[0], &is_canceled, &settle, Duration::from_secs(10)).expect("the window left");
            assert_eq!(*settled.lock(), vec![0], "accounted for once (by the cancel or the window's leave)");
            lane.join().unwrap();
        });
        assert!(!untouched.is_cut(), "a window without a cancelled task runs on");
        let mut later = vec![3, 4, 13];
        let t = w.enter(&mut later, &task_of, &is_canceled, Cutter::Socket(c.as_raw_fd())).unwrap();
        assert_eq!(later, vec![13], "pieces of a cancelled task are never sent");
        let mut none = vec![5];
        assert!(w.enter(&mut none, &task_of, &is_canceled, Cutter::Socket(c.as_raw_fd())).is_none());
        drop(t);
        assert!(!w.leave(untouched, &is_canceled, &settle));
        assert_eq!(*settled.lock(), vec![0]);
    }

    /// A window that does not leave within the bound: the cancel says how
    /// many run on, and the last of them to leave accounts for the tasks.
    #[test]
    fn past_the_bound_the_last_window_to_leave_settles() {
        let w = Windows::default();
        let settled = Mutex::new(Vec::new());
        let settle = |t: &[usize]| settled.lock().extend_from_slice(t);
        let canceled = |t: usize| t == 0;
        let (a, _b) = socket();
        let mut idx = vec![0];
        let ticket = w.enter(&mut idx, &|p| p, &|_| false, Cutter::TargetCopies(a.as_raw_fd())).unwrap();
        let t0 = Instant::now();
        assert_eq!(w.stop(&[0], &canceled, &settle, Duration::from_millis(50)), Err(1));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(ticket.is_cut() && settled.lock().is_empty());
        assert!(w.leave(ticket, &canceled, &settle));
        assert_eq!(*settled.lock(), vec![0]);
    }
}
