//! The seam between the executor (`batch`) and a way of moving bytes to a
//! peer. A link runs one window of pieces with the window protocol over its
//! transport and reports what the target confirmed; the executor plans,
//! claims windows, retries and reports, whatever the link. TCP data
//! connections (`peers::Lane`) carry two: TCP, and the same-host link
//! ([`samehost`]) where the connection's hello negotiated it. A window of
//! device memory is offered to the link first ([`Link::run_device_window`]:
//! the same-host link moves it through CUDA IPC where negotiated) and
//! staged only where the link declines.
//!
//! The same-host link runs a window only for the process that made it (a
//! forked child never uses its parent's), and only over memory this
//! process registered: a window with local memory outside it rides TCP on
//! the same connection (the target copies nothing else of this process).
//!
//! A window can be stopped from another thread (a cancel, see
//! [`super::cancel`]): each link says, before a window runs, how with a
//! [`Cutter`].

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use super::super::memory::cuda::Device;
use super::super::memory::local::{LocalMemory, WindowOutcome};
use super::super::samehost;
use super::peers::Lane;
use super::window;
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::link";

pub(crate) trait Link {
    /// Which path the link's last window took ("tcp"), for logs and
    /// statistics.
    fn path(&self) -> &'static str;

    /// Run `reqs` (all non-empty) in `direction`, their local bytes in
    /// `memory`.
    ///
    /// # Safety
    /// Every host view `memory` gives must be valid memory (readable for
    /// writes, writable for reads) for the duration of the call.
    unsafe fn run_window(
        &mut self,
        direction: Direction,
        reqs: &[Request],
        memory: &mut dyn LocalMemory,
    ) -> WindowOutcome;

    /// Whether [`Link::run_device_window`] may move device memory without
    /// staging it (the executor then waits for a transfer's CUDA event on
    /// the host first).
    fn moves_device_memory(&self) -> bool;

    /// Run `reqs` (all non-empty, their local bytes device memory on
    /// `device`) without staging, if this link can; `None`: it cannot for
    /// this window (nothing was sent), stage it with [`Link::run_window`].
    ///
    /// # Safety
    /// The local device memory must stay allocated, and untouched by
    /// anything else, for the duration of the call.
    unsafe fn run_device_window(
        &mut self,
        dir: Direction,
        reqs: &[Request],
        dev: &Arc<Device>,
    ) -> Option<WindowOutcome>;

    /// How a cancel stops a window about to run on this link, whose
    /// longest request is `longest` bytes. The cutter is used only while
    /// the window runs, while this link is alive.
    fn cutter(&self, longest: usize) -> Cutter;
}

/// How another thread stops a window in flight on a link so that the
/// caller's memory is touched no more; the window's thread then returns
/// from [`Link::run_window`] (its outcome broken or short), and the
/// executor leaves the window, discards the link and retries what was not
/// cancelled elsewhere. A cancel returns only once the window is left.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cutter {
    /// The bytes of the window move through this socket, in this process
    /// (TCP, rails, and the same-host link's inline windows): shutting it
    /// down both ways wakes a send or receive blocked on it at once, on a
    /// frozen peer too, and what arrives after that is refused by the
    /// kernel (the peer's sends fail: a pdx target stops serving the
    /// connection). What the kernel had already queued for a receive is
    /// bounded by the socket's buffer and lands before the window's thread
    /// returns, so before the cancel does.
    Socket(RawFd),
    /// The target copies the bytes itself, into or out of this process's
    /// memory (the same-host link, host memory or CUDA IPC). Interim, until
    /// the link has a cancel message of its own: the connection is
    /// half-closed; the target serves the requests it has already read
    /// (they land), reads the end of the stream and closes, and the window
    /// ends when its thread reads that close: the target's word that it
    /// copies no more. A target that says nothing within
    /// [`Cutter::grace`] (frozen, or far behind) is cut off like a socket;
    /// the requests of the window it had already taken (at most
    /// [`super::plan::WINDOW_BYTES`]) may then still land when it runs again.
    ///
    /// What the link's own cancel is to provide in its place: `ask` tells
    /// the target to stop copying for this connection; the window's thread
    /// returns from the link only once the target answered that it copies
    /// no more (the executor waits for that thread, so for that answer);
    /// `force` stays the answer to a target that says nothing.
    TargetCopies(RawFd),
}

/// How long a target that copies itself may take to finish what it read
/// after a cancel asked it to stop (its copies run at memory speed: a
/// window of [`super::plan::WINDOW_BYTES`] takes milliseconds).
const TARGET_GRACE: Duration = Duration::from_secs(1);

impl Cutter {
    /// Ask the window to end (see the variants).
    pub fn ask(&self) {
        match *self {
            Cutter::Socket(fd) => shutdown(fd, libc::SHUT_RDWR),
            Cutter::TargetCopies(fd) => shutdown(fd, libc::SHUT_WR),
        }
    }

    /// End it now: the socket shut down both ways.
    pub fn force(&self) {
        let (Cutter::Socket(fd) | Cutter::TargetCopies(fd)) = *self;
        shutdown(fd, libc::SHUT_RDWR);
    }

    /// How long after [`Cutter::ask`] the window may take to end before it
    /// is forced.
    pub fn grace(&self) -> Duration {
        match self {
            Cutter::Socket(_) => Duration::ZERO,
            Cutter::TargetCopies(_) => TARGET_GRACE,
        }
    }
}

/// `shutdown(2)` on a socket that a window in flight owns (the caller
/// holds the lock under which that window is listed, so the descriptor is
/// still open and still that socket).
fn shutdown(fd: RawFd, how: libc::c_int) {
    // SAFETY: shutdown takes a descriptor and a flag; `fd` is the open
    // socket of a window in flight (see above), and shutting it down only
    // ends its connection.
    unsafe { libc::shutdown(fd, how) };
}

/// The error of a lane this process did not open (a forked child's
/// parent's): it must not run a window (nothing was sent).
fn not_ours(lane: &Lane) -> WindowOutcome {
    let e = format!(
        "a data connection of process {} (this process, {}, was forked from it): it opens its own",
        lane.opened_by,
        samehost::this_process()
    );
    WindowOutcome::failed(0, Error::new(ErrorKind::ConnectionLost, e))
}

/// A lane is the TCP link, or the same-host link where its hello
/// negotiated that (the doorbells and statuses still travel on its
/// connection).
impl Link for Lane {
    fn path(&self) -> &'static str {
        if self.link.is_some() && !self.rode_tcp {
            samehost::PATH
        } else {
            "tcp"
        }
    }

    unsafe fn run_window(
        &mut self,
        direction: Direction,
        reqs: &[Request],
        memory: &mut dyn LocalMemory,
    ) -> WindowOutcome {
        if !self.ours() {
            return not_ours(self);
        }
        self.rode_tcp = false;
        let Some(link) = self.link.as_mut().filter(|_| !samehost::window::inline(reqs)) else {
            // SAFETY: forwarded from the caller.
            return unsafe { window::run_window(&mut self.conn, direction, self.v2, reqs, memory) };
        };
        if let Err(ran) = samehost::window::list_registered(&mut self.conn, link, &self.registered) {
            if let Some(why) = ran.link_failed {
                self.path.fall_back(&self.session, why);
            }
            return ran.outcome;
        }
        if !memory.host_ranges_all(&mut |addr, len| link.covers(addr, len)) {
            // The target copies only memory this process registered.
            self.rode_tcp = true;
            self.path.note_unregistered(&self.session);
            // SAFETY: forwarded from the caller.
            return unsafe { window::run_window(&mut self.conn, direction, self.v2, reqs, memory) };
        }
        // SAFETY: forwarded from the caller (the views stay valid until
        // confirmed, which is before this call returns).
        let ran = unsafe { samehost::window::run_window(&mut self.conn, link, direction, reqs, memory) };
        if let Some(why) = ran.link_failed {
            self.path.fall_back(&self.session, why);
        }
        ran.outcome
    }

    /// Device memory through CUDA IPC where the hello negotiated it and it
    /// has not failed for this peer.
    fn moves_device_memory(&self) -> bool {
        self.link.is_some() && self.exports.is_some() && !self.path.ipc_has_failed() && self.ours()
    }

    unsafe fn run_device_window(
        &mut self,
        dir: Direction,
        reqs: &[Request],
        dev: &Arc<Device>,
    ) -> Option<WindowOutcome> {
        if !self.moves_device_memory() {
            return None;
        }
        self.rode_tcp = false;
        let exports = self.exports.clone()?;
        let link = self.link.as_mut()?;
        match samehost::device::run_window(&mut self.conn, link, dir, reqs, dev, &exports) {
            Ok(ran) => {
                if let Some(why) = ran.ipc_failed {
                    self.path.ipc_fall_back(&self.session, why);
                }
                if let Some(why) = ran.link_failed {
                    self.path.fall_back(&self.session, why);
                }
                Some(ran.outcome)
            }
            Err(e) => {
                // Memory the driver cannot export (a pool allocation, a
                // range across allocations): staged, this window only.
                log::debug!(target: LOG_TARGET, "{}: device memory staged for a window: {e}", self.session);
                None
            }
        }
    }

    /// On the same-host link the target copies (but for inline windows of
    /// host memory); see [`Cutter`]. A window whose memory turns out to be
    /// unregistered rides TCP instead: cut as the target's, it only waits
    /// longer.
    fn cutter(&self, longest: usize) -> Cutter {
        let fd = self.conn.raw_fd();
        let inline = longest < samehost::window::INLINE_BELOW;
        if self.link.is_some() && self.ours() && (self.moves_device_memory() || !inline) {
            Cutter::TargetCopies(fd)
        } else {
            Cutter::Socket(fd)
        }
    }
}
