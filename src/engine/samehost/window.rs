//! The initiator's side of the same-host link: a window of requests is
//! written into the link's ring ([`super::ring`]), one message per group,
//! and announced with a doorbell on the connection; the target reads it
//! from this process's memory and answers each request with a status once
//! it has copied the bytes itself. Local memory is driven group by group as
//! over TCP ([`LocalMemory`]): host memory is copied where it is, device
//! memory through the pinned buffers it is staged in; a group's buffers are
//! not reused before the target confirmed every request in it.
//!
//! Before a window the target learns what this process registered
//! ([`list_registered`]: the engine's host regions and its outbound staging
//! buffers); it copies nothing of this process outside them. A window whose
//! local memory is not all listed does not take the link (the caller runs
//! it over TCP on the same connection).
//!
//! Statuses are v2 status frames: OK, REJECTED (the range is not the
//! target's to serve; it closes the connection as over TCP), or the link's
//! own codes ([`super::frames`]): a copy that failed (the mechanism: the
//! peer falls back to TCP) or memory this process did not list.

use std::sync::Arc;

use super::super::memory::local::{LocalMemory, WindowOutcome};
use super::super::memory::regions::Regions;
use super::super::memory::staging::{Side, Staging};
use super::super::net::conn::{io_error, Conn};
use super::super::protocol::wire::{self, STATUS_LEN};
use super::frames::{encode_host, STATUS_COPY_FAILED, STATUS_NOT_REGISTERED};
use super::ring::{encode_ranges, InitiatorLink, Kind, MAX_LISTED};
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// Requests shorter than this ride inline on a same-host connection, as
/// over TCP: for a few KiB the socket's own copies cost less than the
/// target's cross-process copy (about 1.5 us for 4 KiB here). They count
/// as same-host traffic all the same (the link chose how to carry them).
pub(crate) const INLINE_BELOW: usize = 16 << 10;

/// Whether a window goes inline: every request shorter than [`INLINE_BELOW`].
pub(crate) fn inline(reqs: &[Request]) -> bool {
    reqs.iter().all(|r| r.len < INLINE_BELOW)
}

/// The memory of this process a link lets the target copy from or into:
/// the engine's registered host regions and its outbound staging buffers
/// (where device memory is staged for the target).
pub(crate) struct Registered {
    regions: Arc<Regions>,
    staging: Arc<Staging>,
}

impl Registered {
    pub fn new(regions: Arc<Regions>, staging: Arc<Staging>) -> Registered {
        Registered { regions, staging }
    }

    /// Changes whenever the memory does.
    fn version(&self) -> (u64, usize) {
        (self.regions.epoch(), self.staging.buffers_allocated(Side::Outbound))
    }

    /// The memory, as (start, length), at most [`MAX_LISTED`] ranges (by
    /// address; memory past them rides TCP).
    fn ranges(&self) -> Vec<(u64, u64)> {
        let mut all = self.regions.host_ranges();
        let (buffers, chunk) = self.staging.buffers(Side::Outbound);
        all.extend(buffers.into_iter().map(|b| (b, chunk as u64)));
        all.sort_unstable();
        all.truncate(MAX_LISTED);
        all
    }
}

/// What a same-host window did, and whether the link itself failed (then
/// the reason, and the peer goes back to TCP).
pub(crate) struct Ran {
    pub outcome: WindowOutcome,
    pub link_failed: Option<String>,
}

enum End {
    Rejected,
    /// The link failed at the target (why): the peer goes back to TCP.
    LinkFailed(String),
    Broken(Error),
}

/// Read statuses until `got` reaches `want`.
fn take_statuses(conn: &mut Conn, want: usize, got: &mut usize) -> Result<(), End> {
    while *got < want {
        let mut frame = [0u8; STATUS_LEN];
        conn.recv_exact(&mut frame).map_err(|e| End::Broken(io_error(e)))?;
        match wire::decode_status(frame) {
            Some(wire::STATUS_OK) => *got += 1,
            Some(wire::STATUS_REJECTED) => return Err(End::Rejected),
            Some(code) if code & 0xff == STATUS_COPY_FAILED => {
                let errno = std::io::Error::from_raw_os_error((code >> 8) as i32);
                return Err(End::LinkFailed(format!(
                    "the peer's cross-process copy failed: {}",
                    super::xmem::explain(&errno)
                )));
            }
            Some(code) if code & 0xff == STATUS_NOT_REGISTERED => {
                return Err(End::LinkFailed(
                    "the peer found a request naming memory this process did not list as registered".to_owned(),
                ));
            }
            _ => return Err(End::Broken(Error::protocol("the peer sent a malformed status on the same-host link"))),
        }
    }
    Ok(())
}

fn ended(confirmed: usize, end: End) -> Ran {
    let (rejected, e, link_failed) = match end {
        End::Rejected => (true, Error::new(ErrorKind::RemoteRejected, "rejected"), None),
        End::LinkFailed(why) => {
            let e = Error::new(ErrorKind::ConnectionLost, why.clone());
            (false, e, Some(format!("the same-host link failed ({why}); back to TCP")))
        }
        End::Broken(e) => (false, e, None),
    };
    Ran { outcome: WindowOutcome { confirmed, rejected, broken: Some(e) }, link_failed }
}

fn failed(confirmed: usize, e: Error) -> Ran {
    Ran { outcome: WindowOutcome::failed(confirmed, e), link_failed: None }
}

/// Write one message of `kind` into the ring, ring the doorbell and wait
/// for `answers` more statuses (counted in `got`).
fn post(
    conn: &mut Conn,
    link: &mut InitiatorLink,
    kind: Kind,
    entries: &[u8],
    answers: usize,
    got: &mut usize,
) -> Result<(), End> {
    let Some(bell) = link.post(kind, entries) else {
        return Err(End::Broken(Error::new(
            ErrorKind::ConnectionLost,
            "the same-host link belongs to another process (this one was forked from it), or a message is larger \
             than its ring",
        )));
    };
    conn.send_all(&bell.encode()).map_err(|e| End::Broken(io_error(e)))?;
    let want = *got + answers;
    take_statuses(conn, want, got)
}

/// Tell the target the memory `registered` names, unless the link already
/// did for its current version: one message per [`Kind::max_entries`]
/// ranges, each answered with one status. `Err`: the connection or the
/// link failed (nothing of a window was sent).
pub(crate) fn list_registered(conn: &mut Conn, link: &mut InitiatorLink, registered: &Registered) -> Result<(), Ran> {
    let version = registered.version();
    if link.listed_version() == Some(version) {
        return Ok(());
    }
    let ranges = registered.ranges();
    let mut kind = Kind::Regions;
    // At least one message: an empty list replaces the last one too.
    for chunk in ranges.chunks(kind.max_entries()).chain(ranges.is_empty().then_some(&[][..])) {
        let mut got = 0;
        post(conn, link, kind, &encode_ranges(chunk), 1, &mut got).map_err(|end| ended(0, end))?;
        kind = Kind::MoreRegions;
    }
    link.set_listed(version, &ranges);
    Ok(())
}

/// Run `reqs` (all non-empty, grouped by `memory`, every host range of it
/// listed with the target) on `conn` through `link`.
///
/// # Safety
/// Every host view `memory` gives must be valid memory (readable for
/// writes, writable for reads) until the target confirmed it: the target
/// copies from or into it.
pub(crate) unsafe fn run_window(
    conn: &mut Conn,
    link: &mut InitiatorLink,
    direction: Direction,
    reqs: &[Request],
    memory: &mut dyn LocalMemory,
) -> Ran {
    match direction {
        Direction::Write => write(conn, link, memory),
        Direction::Read => read(conn, link, reqs, memory),
    }
}

/// Send `view`'s requests in `direction` (as many messages as the ring
/// needs), waiting for each message's statuses (counted in `got`).
fn send_view(
    conn: &mut Conn,
    link: &mut InitiatorLink,
    direction: Direction,
    view: &[Request],
    got: &mut usize,
) -> Result<(), End> {
    for chunk in view.chunks(Kind::Host.max_entries()) {
        let frames: Vec<u8> = chunk.iter().flat_map(|r| encode_host(direction, r)).collect();
        post(conn, link, Kind::Host, &frames, chunk.len(), got)?;
    }
    Ok(())
}

fn write(conn: &mut Conn, link: &mut InitiatorLink, memory: &mut dyn LocalMemory) -> Ran {
    let groups = memory.groups().len();
    let mut acked = 0usize;
    if let Err(e) = memory.stage_out(0) {
        return failed(0, e);
    }
    for g in 0..groups {
        if memory.ahead() && g + 1 < groups {
            if let Err(e) = memory.stage_out(g + 1) {
                return failed(acked, e);
            }
        }
        let view = match memory.ready_out(g) {
            Ok(view) => view.into_owned(),
            Err(e) => return failed(acked, e),
        };
        // The group's buffers stay untouched until the target has read them.
        if let Err(end) = send_view(conn, link, Direction::Write, &view, &mut acked) {
            return ended(acked, end);
        }
        if !memory.ahead() && g + 1 < groups {
            if let Err(e) = memory.stage_out(g + 1) {
                return failed(acked, e);
            }
        }
    }
    Ran { outcome: WindowOutcome::done(acked), link_failed: None }
}

fn read(conn: &mut Conn, link: &mut InitiatorLink, reqs: &[Request], memory: &mut dyn LocalMemory) -> Ran {
    let groups = memory.groups().to_vec();
    for (g, range) in groups.into_iter().enumerate() {
        let staged = match memory.recv_view(g) {
            Ok(v) => v,
            Err(e) => return failed(memory.confirmed(), e),
        };
        let view = staged.as_deref().unwrap_or(&reqs[range]);
        let mut got = 0usize;
        let taken = send_view(conn, link, Direction::Read, view, &mut got);
        let landed = memory.landed(g, got);
        let end = match (taken, landed) {
            (Ok(()), Ok(())) => continue,
            (Err(end), _) => end,
            (Ok(()), Err(e)) => End::Broken(e),
        };
        // What is queued settles first; the confirmed prefix stops at the
        // first move that failed.
        let settled = memory.settle().is_ok();
        let mut ran = ended(memory.confirmed(), end);
        ran.outcome.rejected &= settled;
        return ran;
    }
    match memory.settle() {
        Ok(()) => Ran { outcome: WindowOutcome::done(memory.confirmed()), link_failed: None },
        Err(e) => failed(memory.confirmed(), e),
    }
}
