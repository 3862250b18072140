//! Serving same-host requests (the target side of the link in
//! [`super::super::samehost`]): each request is checked against the
//! registered regions exactly as over TCP, then this engine copies the
//! bytes itself between the initiator's memory (at the address of the
//! request in hand, never another) and its region: one cross-process copy
//! for host memory; for device memory, through one pinned buffer, the
//! device copy synchronized before the acknowledgement.

use std::io;

use super::super::conn::Conn;
use super::super::regions::Regions;
use super::super::samehost::window::copy_failed_status;
use super::super::samehost::xmem;
use super::super::staging::{Side, Staging};
use super::super::wire::RequestHeader;
use super::acks::Acks;
use crate::error::Error;
use crate::transfer::stats::Stats;
use crate::transfer::Direction;

/// Bytes copied between two checks for the region being withdrawn.
const COPY_SLICE: usize = 4 << 20;

/// What serving a same-host request needs of the engine.
pub(crate) struct LocalServing<'a> {
    pub regions: &'a Regions,
    pub staging: &'a Staging,
    pub stats: &'a Stats,
    pub stopping: &'a dyn Fn() -> bool,
}

enum Failed {
    /// The copy itself failed: the initiator falls back to TCP.
    Copy(io::Error),
    /// A driver call failed (device memory): refused, as over TCP.
    Device(Error),
    /// The region was withdrawn or the engine is stopping.
    Stopped,
}

/// Serve one same-host request from process `pid` (`header` checked here,
/// the initiator's bytes at `theirs`). `false`: the connection closes.
pub(crate) fn serve_local(
    cx: &LocalServing<'_>,
    conn: &Conn,
    acks: &mut Acks,
    pid: u32,
    header: &RequestHeader,
    theirs: u64,
) -> bool {
    // Held (the connection listed with it) while the memory is touched, so
    // unregistering can shut this connection and wait.
    let Some(hold) = cx.regions.lookup(header.addr, header.size).and_then(|r| r.hold(conn.raw_fd())) else {
        log::debug!(
            "same-host link: rejecting {} of {} bytes at {:#x}: not inside one registered region",
            header.direction.name(),
            header.size,
            header.addr
        );
        Stats::bump(&cx.stats.requests_refused);
        acks.reject(conn, true);
        return false;
    };
    let region = hold.region();
    let stop = || region.is_revoked() || (cx.stopping)();
    let copied = match &region.device {
        None => copy_host(pid, header, theirs, &stop),
        Some(dev) => cx
            .staging
            .lease(Side::Inbound, dev, 1, &stop)
            .map_err(Failed::Device)
            .and_then(|lease| copy_device(&lease, cx.staging.chunk(), pid, header, theirs, &stop)),
    };
    drop(hold);
    match copied {
        Ok(()) => {
            cx.stats.served(header.direction, header.size);
            acks.ok(true);
            match acks.flush_unless_pipelined(conn) {
                Ok(()) => true,
                Err(e) => {
                    log::debug!("same-host link: {e}");
                    false
                }
            }
        }
        Err(Failed::Copy(e)) => {
            log::warn!(
                "same-host link: a peer's {} of {} bytes at {:#x} failed here: {}; it falls back to TCP",
                header.direction.name(),
                header.size,
                header.addr,
                xmem::explain(&e)
            );
            // The requests before it were served: their OKs go first.
            let status = copy_failed_status(e.raw_os_error().unwrap_or(libc::EIO));
            // SAFETY: a local array, readable for the call.
            let _ = unsafe { acks.send_with(conn, &[(status.as_ptr(), status.len())]) };
            false
        }
        Err(Failed::Device(e)) => {
            Stats::bump(&cx.stats.served_device_failures);
            log::warn!(
                "same-host link: a peer's request at {:#x} failed on this side and is rejected: {e}",
                header.addr
            );
            acks.reject(conn, true);
            false
        }
        Err(Failed::Stopped) => false,
    }
}

/// `(offset, length)` of each slice of a request of `size` bytes.
fn slices(size: usize, slice: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..size.div_ceil(slice)).map(move |k| (k * slice, (size - k * slice).min(slice)))
}

fn copy_host(pid: u32, h: &RequestHeader, theirs: u64, stop: &dyn Fn() -> bool) -> Result<(), Failed> {
    let ours = h.addr as *mut u8;
    for (off, n) in slices(h.size as usize, COPY_SLICE) {
        if stop() {
            return Err(Failed::Stopped);
        }
        let at = theirs.wrapping_add(off as u64);
        // SAFETY: `ours + off .. + n` lies in a registered region, held (not
        // unregistered) until the caller drops the hold.
        let r = unsafe {
            match h.direction {
                Direction::Write => xmem::read_from(pid, at, ours.add(off), n),
                Direction::Read => xmem::write_to(pid, at, ours.add(off), n),
            }
        };
        r.map_err(Failed::Copy)?;
    }
    Ok(())
}

fn copy_device(
    lease: &super::super::staging::Lease<'_>,
    chunk: usize,
    pid: u32,
    h: &RequestHeader,
    theirs: u64,
    stop: &dyn Fn() -> bool,
) -> Result<(), Failed> {
    let buf = lease.buf(0);
    for (off, n) in slices(h.size as usize, chunk) {
        if stop() {
            return Err(Failed::Stopped);
        }
        let (at, dptr) = (theirs.wrapping_add(off as u64), h.addr + off as u64);
        match h.direction {
            Direction::Write => {
                // SAFETY: our pinned buffer holds a chunk; no copy of it is queued.
                unsafe { xmem::read_from(pid, at, buf, n) }.map_err(Failed::Copy)?;
                lease.h2d(0, dptr, n).and_then(|()| lease.sync(0)).map_err(Failed::Device)?;
            }
            Direction::Read => {
                lease.d2h(0, dptr, n).and_then(|()| lease.sync(0)).map_err(Failed::Device)?;
                // SAFETY: our pinned buffer, synchronized.
                unsafe { xmem::write_to(pid, at, buf, n) }.map_err(Failed::Copy)?;
            }
        }
    }
    Ok(())
}
