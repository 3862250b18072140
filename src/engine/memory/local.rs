//! The local side of a window, whatever moves it: where a window's local
//! bytes live ([`LocalMemory`]: host memory as it is, [`HostMemory`]; device
//! memory through pinned buffers, `staging`), and what happened to a window
//! ([`WindowOutcome`]). The initiator's TCP window protocol and the
//! same-host link drive the same memories and report the same outcome.

use std::borrow::Cow;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::transfer::Request;

/// What happened to a window.
#[derive(Debug)]
pub struct WindowOutcome {
    /// The first `confirmed` requests completed at the target.
    pub confirmed: usize,
    /// The request right after them was refused by the target (v2 status 1).
    pub rejected: bool,
    /// The connection failed; requests after `confirmed` (+1 if rejected)
    /// are unconfirmed. `None` means the lane is clean and reusable.
    pub broken: Option<Error>,
}

impl WindowOutcome {
    pub fn done(confirmed: usize) -> WindowOutcome {
        WindowOutcome { confirmed, rejected: false, broken: None }
    }

    pub fn failed(confirmed: usize, e: Error) -> WindowOutcome {
        WindowOutcome { confirmed, rejected: false, broken: Some(e) }
    }
}

/// The local side of a window, group by group. Groups are consecutive,
/// cover every request, and are used in order; a memory may prepare the
/// next group while the current one is on the wire.
pub(crate) trait LocalMemory {
    /// The requests of each group.
    fn groups(&self) -> &[Range<usize>];
    /// Writes: start making group `g` readable from the host (queue copies).
    fn stage_out(&mut self, g: usize) -> Result<()>;
    /// Writes: group `g` as the host reads it, once readable. Groups are
    /// staged ahead of the one being sent only when [`ahead`](Self::ahead).
    fn ready_out(&mut self, g: usize) -> Result<Cow<'_, [Request]>>;
    /// Whether group `g + 1` may be staged before group `g` is sent.
    fn ahead(&self) -> bool;
    /// Reads: where group `g` is received (its buffer free to refill);
    /// `None`: into the requests' own local ranges.
    fn recv_view(&mut self, g: usize) -> Result<Option<Vec<Request>>>;
    /// Reads: the first `got` requests of group `g` arrived in its view;
    /// move them home (possibly queued).
    fn landed(&mut self, g: usize, got: usize) -> Result<()>;
    /// Reads: wait for every queued move, oldest first, stopping at the
    /// first that failed.
    fn settle(&mut self) -> Result<()>;
    /// Reads: requests home so far, in order.
    fn confirmed(&self) -> usize;
    /// Whether `inside` holds for every host range (address, length) that
    /// a view of this memory may name: what a peer that copies the bytes
    /// itself (the same-host link) would be asked to read or write here.
    fn host_ranges_all(&self, inside: &mut dyn FnMut(u64, usize) -> bool) -> bool;
}

/// Host memory: one group, sent from and received into where it is.
pub(crate) struct HostMemory<'a> {
    reqs: &'a [Request],
    /// Its one group: every request.
    whole: [Range<usize>; 1],
    landed: usize,
}

impl<'a> HostMemory<'a> {
    pub fn new(reqs: &'a [Request]) -> HostMemory<'a> {
        // One group covering the window, not a list of ranges.
        #[allow(clippy::single_range_in_vec_init)]
        let whole = [0..reqs.len()];
        HostMemory { reqs, whole, landed: 0 }
    }
}

impl LocalMemory for HostMemory<'_> {
    fn groups(&self) -> &[Range<usize>] {
        &self.whole
    }
    fn stage_out(&mut self, _: usize) -> Result<()> {
        Ok(())
    }
    fn ready_out(&mut self, _: usize) -> Result<Cow<'_, [Request]>> {
        Ok(Cow::Borrowed(self.reqs))
    }
    fn ahead(&self) -> bool {
        false
    }
    fn recv_view(&mut self, _: usize) -> Result<Option<Vec<Request>>> {
        Ok(None)
    }
    fn landed(&mut self, _: usize, got: usize) -> Result<()> {
        self.landed += got;
        Ok(())
    }
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }
    fn confirmed(&self) -> usize {
        self.landed
    }
    fn host_ranges_all(&self, inside: &mut dyn FnMut(u64, usize) -> bool) -> bool {
        self.reqs.iter().all(|r| inside(r.local as u64, r.len))
    }
}
