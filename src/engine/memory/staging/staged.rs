//! Device memory as the initiator's window sees it: requests are grouped so
//! that each group's device bytes fit one pinned buffer; for a write a group
//! is copied device → buffer and synchronized before it is sent, for a read
//! it is received into the buffer and copied buffer → device, confirmed
//! once that copy was synchronized. A lease holds up to two buffers, so
//! group g+1 is copied while group g is on the wire. Host requests of the
//! window ride along where they are.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use super::super::cuda::Device;
use super::super::local::LocalMemory;
use super::pool::{Lease, Side, Staging};
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::Request;

/// One window's local memory on device `dev` (and the host).
pub(crate) struct StagedMemory<'a> {
    lease: Lease<'a>,
    reqs: &'a [Request],
    on_device: Vec<bool>,
    groups: Vec<Range<usize>>,
    /// The staged host view of the group each buffer holds (writes).
    views: Vec<Option<Vec<Request>>>,
    /// Requests received into each buffer whose copies are queued (reads).
    pending: Vec<usize>,
    /// The next group to settle, and the end of those landed (reads).
    next_settle: usize,
    landed_end: usize,
    confirmed: usize,
}

impl Staging {
    /// The local memory of a window whose device requests (`on_device`) all
    /// live on `dev`, each at most one buffer long; waits for a buffer up to
    /// the pool's deadline or `stop`. With `after` (a `CUevent`), every copy
    /// of the window waits for it on the device.
    pub(crate) fn staged<'a>(
        &'a self,
        reqs: &'a [Request],
        on_device: Vec<bool>,
        dev: &Arc<Device>,
        after: Option<usize>,
        stop: &dyn Fn() -> bool,
    ) -> Result<StagedMemory<'a>> {
        if let Some(r) = reqs.iter().zip(&on_device).find(|(r, &d)| d && r.len > self.chunk()).map(|(r, _)| r) {
            return Err(Error::new(
                ErrorKind::Panic,
                format!("device piece {:#x}+{} is larger than a staging buffer", r.local, r.len),
            ));
        }
        let groups = groups(reqs, &on_device, self.chunk());
        let lease = self.lease(Side::Outbound, dev, groups.len(), stop)?;
        let n = lease.len();
        if let Some(event) = after {
            for i in 0..n {
                lease.wait_event(i, event)?;
            }
        }
        Ok(StagedMemory {
            lease,
            reqs,
            on_device,
            groups,
            views: (0..n).map(|_| None).collect(),
            pending: vec![0; n],
            next_settle: 0,
            landed_end: 0,
            confirmed: 0,
        })
    }
}

/// Cut a window into groups whose device bytes fit one buffer of `chunk`.
fn groups(reqs: &[Request], on_device: &[bool], chunk: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut bytes = 0usize;
    for (i, (r, &d)) in reqs.iter().zip(on_device).enumerate() {
        let need = if d { r.len } else { 0 };
        if i > start && bytes + need > chunk {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += need;
    }
    if start < reqs.len() {
        out.push(start..reqs.len());
    }
    out
}

impl StagedMemory<'_> {
    fn buffer_of(&self, g: usize) -> usize {
        g % self.lease.len()
    }

    /// Group `g` with its device requests placed back to back in its buffer.
    fn host_view(&self, g: usize) -> Vec<Request> {
        let base = self.lease.buf(self.buffer_of(g)) as usize;
        let mut off = 0usize;
        self.groups[g]
            .clone()
            .map(|i| {
                if !self.on_device[i] {
                    return self.reqs[i];
                }
                let r = Request { local: base + off, ..self.reqs[i] };
                off += self.reqs[i].len;
                r
            })
            .collect()
    }

    /// Synchronize the oldest landed group and confirm its requests.
    fn settle_one(&mut self) -> Result<()> {
        let b = self.buffer_of(self.next_settle);
        self.lease.sync(b)?;
        self.confirmed += std::mem::take(&mut self.pending[b]);
        self.next_settle += 1;
        Ok(())
    }
}

impl LocalMemory for StagedMemory<'_> {
    fn groups(&self) -> &[Range<usize>] {
        &self.groups
    }

    fn stage_out(&mut self, g: usize) -> Result<()> {
        let (b, view) = (self.buffer_of(g), self.host_view(g));
        let base = self.lease.buf(b) as usize;
        for (k, i) in self.groups[g].clone().enumerate() {
            if self.on_device[i] {
                self.lease.d2h_at(b, view[k].local - base, self.reqs[i].local as u64, self.reqs[i].len)?;
            }
        }
        self.views[b] = Some(view);
        Ok(())
    }

    fn ready_out(&mut self, g: usize) -> Result<Cow<'_, [Request]>> {
        let b = self.buffer_of(g);
        let view =
            self.views[b].take().ok_or_else(|| Error::new(ErrorKind::Panic, "staging group was not prepared"))?;
        self.lease.sync(b)?;
        Ok(Cow::Owned(view))
    }

    fn ahead(&self) -> bool {
        self.lease.len() > 1
    }

    fn recv_view(&mut self, g: usize) -> Result<Option<Vec<Request>>> {
        // The buffer's previous group must be home before it is refilled.
        while self.next_settle + self.lease.len() <= g {
            self.settle_one()?;
        }
        Ok(Some(self.host_view(g)))
    }

    fn landed(&mut self, g: usize, got: usize) -> Result<()> {
        let (b, view) = (self.buffer_of(g), self.host_view(g));
        self.landed_end = g + 1;
        let mut queued = 0usize;
        let mut result = Ok(());
        for (k, i) in self.groups[g].clone().enumerate().take(got) {
            if self.on_device[i] {
                result =
                    self.lease.h2d_from(b, self.reqs[i].local as u64, view[k].local as *const u8, self.reqs[i].len);
                if result.is_err() {
                    break;
                }
            }
            queued += 1;
        }
        self.pending[b] = queued;
        result
    }

    fn settle(&mut self) -> Result<()> {
        while self.next_settle < self.landed_end {
            self.settle_one()?;
        }
        Ok(())
    }

    fn confirmed(&self) -> usize {
        self.confirmed
    }

    /// The lease's buffers, and the window's host requests where they are.
    fn host_ranges_all(&self, inside: &mut dyn FnMut(u64, usize) -> bool) -> bool {
        let chunk = self.lease.chunk();
        (0..self.lease.len()).all(|b| inside(self.lease.buf(b) as u64, chunk))
            && self.reqs.iter().zip(&self.on_device).all(|(r, &d)| d || inside(r.local as u64, r.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_fit_a_buffer_and_host_requests_ride_along() {
        let c = 8192;
        let req = |len| Request { local: 0x1000, remote: 0x2000, len };
        let reqs = [req(c / 2), req(c / 2), req(1), req(c / 2 + 1), req(c), req(100)];
        let g = groups(&reqs, &[true, true, false, true, true, false], c);
        assert_eq!(g, vec![0..3, 3..4, 4..6]);
        assert_eq!(groups(&[req(5), req(7)], &[false, false], c), vec![0..2]);
        assert!(groups(&[], &[], c).is_empty());
    }
}
