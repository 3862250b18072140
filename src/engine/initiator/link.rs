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

use std::sync::Arc;

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
}
