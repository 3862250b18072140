//! The seam between the executor (`batch`) and a way of moving bytes to a
//! peer. A link runs one window of pieces with the window protocol over its
//! transport and reports what the target confirmed; the executor plans,
//! claims windows, retries and reports, whatever the link. TCP data
//! connections (`peers::Lane`) are the one link today; another (a same-host
//! link) is one more implementation, chosen where lanes are opened.

use super::peers::Lane;
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

impl Link for Lane {
    fn path(&self) -> &'static str {
        "tcp"
    }

    unsafe fn run_window(
        &mut self,
        direction: Direction,
        reqs: &[Request],
        memory: &mut dyn LocalMemory,
    ) -> WindowOutcome {
        // SAFETY: forwarded from the caller.
        unsafe { window::run_window(&mut self.conn, direction, self.v2, reqs, memory) }
    }
}
