//! The seam between the executor (`batch`) and a way of moving bytes to a
//! peer. A link runs one window of pieces with the window protocol over its
//! transport and reports what the target confirmed; the executor plans,
//! claims windows, retries and reports, whatever the link. TCP data
//! connections (`peers::Lane`) carry two: TCP, and the same-host link
//! ([`samehost`]) where the connection's hello negotiated it.

use super::peers::Lane;
use super::samehost;
use super::window::{self, LocalMemory, WindowOutcome};
use crate::transfer::{Direction, Request};

pub(crate) trait Link {
    /// Which path this link is ("tcp"), for logs and statistics.
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
}

/// A lane is the TCP link, or the same-host link where its hello
/// negotiated that (the requests still travel on its connection).
impl Link for Lane {
    fn path(&self) -> &'static str {
        if self.same_host {
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
        if !self.same_host {
            // SAFETY: forwarded from the caller.
            return unsafe { window::run_window(&mut self.conn, direction, self.v2, reqs, memory) };
        }
        // SAFETY: forwarded from the caller (the views stay valid until
        // confirmed, which is before this call returns).
        let ran = unsafe { samehost::window::run_window(&mut self.conn, direction, reqs, memory) };
        if let Some(why) = ran.link_failed {
            self.path.fall_back(&self.session, why);
        }
        ran.outcome
    }
}
