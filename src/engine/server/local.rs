//! Serving same-host requests (the target side of the link in
//! [`super::super::samehost`]). A doorbell on the connection announces a
//! message in the initiator's ring; the link reads it from the pinned
//! process and checks it ([`TargetLink::take`]) before anything is served,
//! so a process that merely holds the initiator's socket moves no byte.
//! Then each request is checked against the registered regions exactly as
//! over TCP, and the initiator's range against the memory the initiator
//! listed as registered (nothing else of it is ever copied); then this
//! engine copies the bytes itself between the initiator's memory (at the
//! address of the request in hand, never another) and its region: one
//! cross-process copy for host memory; for device memory, through one
//! pinned buffer, the device copy synchronized before the acknowledgement.
//! Device memory of the initiator arrives as CUDA IPC handles
//! ([`serve_ipc`]): one copy from or into it on a device of ours,
//! synchronized before the acknowledgement. A message's statuses go out
//! together once it is served.

use std::io;

use super::super::memory::ipc::{DeviceExport, Local, PeerImports};
use super::super::memory::regions::{Hold, Region, Regions};
use super::super::memory::staging::{Side, Staging};
use super::super::net::conn::Conn;
use super::super::protocol::wire::{RequestHeader, HEADER_LEN};
use super::super::samehost::device::Unusable;
use super::super::samehost::frames::{copy_failed_status, link_status, Doorbell, STATUS_NOT_REGISTERED};
use super::super::samehost::ring::{Message, Refusal, TargetLink};
use super::super::samehost::xmem::{self, PeerProcess};
use super::acks::Acks;
use crate::error::{Error, ErrorKind};
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
    /// CUDA IPC cannot serve it: the initiator stages device memory.
    Unusable(Unusable),
    /// The request names memory it may not (refused, as over TCP).
    Refused(Error),
    /// The region was withdrawn or the engine is stopping.
    Stopped,
}

/// Serve the doorbell `header` on the connection of `link`: the message it
/// announces, read from the initiator's ring, every request answered (the
/// statuses sent once all are served). `false`: the connection closes (a
/// doorbell that is not the pinned process's, a request refused, or a
/// request frame sent on the connection itself).
pub(crate) fn serve_doorbell(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    link: &TargetLink,
    header: &[u8; HEADER_LEN],
) -> bool {
    let pid = link.peer().pid();
    let Some(bell) = Doorbell::decode(header) else {
        log::warn!(
            "same-host link with pid {pid}: a request sent on the connection itself (an older pdx, or a process \
             other than the one granted the link that holds its socket); closing, nothing served"
        );
        return false;
    };
    let served = match link.take(bell) {
        Ok(Message::Listed) => {
            acks.ok(true);
            true
        }
        Ok(Message::Host(frames)) => serve_host(cx, conn, acks, link, &frames),
        Ok(Message::Device(frames)) => serve_device(cx, conn, acks, link.peer(), &frames),
        Err(Refusal::Violation(why)) => {
            log::warn!("same-host link with pid {pid}: {why}; closing, nothing served");
            return false;
        }
        Err(Refusal::Copy(e)) => {
            log::warn!(
                "same-host link: reading pid {pid}'s requests failed: {}; it falls back to TCP",
                xmem::explain(&e)
            );
            let status = copy_failed_status(e.raw_os_error().unwrap_or(libc::EIO));
            // SAFETY: a local array, readable for the call.
            let _ = unsafe { acks.send_with(conn, &[(status.as_ptr(), status.len())]) };
            return false;
        }
    };
    // The message's statuses, together (and those before a refusal are
    // already out).
    served && acks.flush(conn).map_err(|e| log::debug!("same-host link: {e}")).is_ok()
}

/// Refuse a request naming initiator memory the initiator did not list:
/// the statuses before it, then [`STATUS_NOT_REGISTERED`]; the connection
/// closes and the initiator goes back to TCP.
fn not_listed(cx: &LocalServing<'_>, conn: &Conn, acks: &mut Acks, pid: u32, header: &RequestHeader, theirs: u64) {
    Stats::bump(&cx.stats.requests_refused);
    log::warn!(
        "same-host link: pid {pid} asked for {} of {} bytes at its {theirs:#x}, outside the memory it listed as \
         registered; refused, nothing copied",
        header.direction.name(),
        header.size
    );
    let status = link_status(STATUS_NOT_REGISTERED, 0);
    // SAFETY: a local array, readable for the call.
    let _ = unsafe { acks.send_with(conn, &[(status.as_ptr(), status.len())]) };
}

/// Serve a message's host-memory requests in order (a run of small ones
/// with one vectored copy); `false`: the connection closes.
fn serve_host(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    link: &TargetLink,
    frames: &[(RequestHeader, u64)],
) -> bool {
    let peer = link.peer();
    let mut i = 0;
    while i < frames.len() {
        let (h, theirs) = frames[i];
        if !link.covers(theirs, h.size) {
            not_listed(cx, conn, acks, peer.pid(), &h, theirs);
            return false;
        }
        let Some(hold) = hold_or_refuse(cx, conn, acks, &h) else { return false };
        let region = hold.region();
        let stop = || region.is_revoked() || (cx.stopping)();
        let copied = match &region.device {
            None if (h.size as usize) < RUN_BYTES => {
                let more = gather(cx, conn, link, &h, &frames[i + 1..]);
                if !more.is_empty() {
                    let n = 1 + more.len();
                    let mut run = vec![(h, theirs, hold)];
                    run.extend(more);
                    if !serve_run(cx, conn, acks, peer, run) {
                        return false;
                    }
                    i += n;
                    continue;
                }
                copy_host(peer, &h, theirs, &stop)
            }
            None => copy_host(peer, &h, theirs, &stop),
            Some(dev) => cx
                .staging
                .lease(Side::Inbound, dev, 1, &stop)
                .map_err(Failed::Device)
                .and_then(|lease| copy_device(&lease, cx.staging.chunk(), peer, &h, theirs, &stop)),
        };
        drop(hold);
        if !answer(cx, conn, acks, &h, copied) {
            return false;
        }
        i += 1;
    }
    true
}

/// Serve a message's device-memory requests (CUDA IPC) in order, while the
/// process granted the link still runs; `false`: the connection closes.
fn serve_device(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    peer: &PeerProcess,
    frames: &[(RequestHeader, DeviceExport)],
) -> bool {
    // The initiator's allocations, opened once per connection, closed with it.
    let imports = conn.attachment(|| PeerImports::new(format!("pid {}", peer.pid())));
    for (h, theirs) in frames {
        // Device memory arrives as handles its exporter chose to hand out, but
        // only while the process granted the link still runs.
        if !peer.running() {
            log::debug!("same-host link: pid {} has exited; closing", peer.pid());
            let _ = acks.flush(conn);
            return false;
        }
        if !serve_ipc(cx, conn, acks, &imports, h, theirs) {
            return false;
        }
    }
    true
}

/// The region of `header`, held (the connection listed with it) while the
/// memory is touched, so unregistering can shut this connection and wait;
/// `None` after refusing a request outside every region (the connection
/// then closes, as over TCP).
fn hold_or_refuse(cx: &LocalServing<'_>, conn: &Conn, acks: &mut Acks, header: &RequestHeader) -> Option<Hold> {
    let hold = cx.regions.lookup(header.addr, header.size).and_then(|r| r.hold(conn.raw_fd()));
    if hold.is_none() {
        log::debug!(
            "same-host link: rejecting {} of {} bytes at {:#x}: not inside one registered region",
            header.direction.name(),
            header.size,
            header.addr
        );
        Stats::bump(&cx.stats.requests_refused);
        acks.reject(conn, true);
    }
    hold
}

/// Most requests one vectored copy serves together (within `IOV_MAX`), and
/// their bytes: a run of small requests costs one system call.
const RUN_REQUESTS: usize = 64;
const RUN_BYTES: usize = 4 << 20;

/// Requests of the message right behind `first` (`next`) that one vectored
/// copy can serve with it (the same direction, listed, on host regions,
/// within the run's bounds), each held. The first that cannot is left for
/// the next turn (a bad range is refused there).
fn gather(
    cx: &LocalServing<'_>,
    conn: &Conn,
    link: &TargetLink,
    first: &RequestHeader,
    next: &[(RequestHeader, u64)],
) -> Vec<(RequestHeader, u64, Hold)> {
    let mut run = Vec::new();
    let mut bytes = first.size as usize;
    for &(h, theirs) in next.iter().take(RUN_REQUESTS - 1) {
        if h.direction != first.direction || h.size == 0 || bytes + h.size as usize > RUN_BYTES {
            break;
        }
        if !link.covers(theirs, h.size) {
            break;
        }
        let region = cx.regions.lookup(h.addr, h.size).filter(|r| r.device.is_none());
        let Some(hold) = region.and_then(|r| r.hold(conn.raw_fd())) else { break };
        bytes += h.size as usize;
        run.push((h, theirs, hold));
    }
    run
}

/// Serve a run of small same-host requests on host regions (each held)
/// with one vectored copy; what the kernel leaves undone (it may stop at
/// an iovec boundary) is copied request by request. `false`: the
/// connection closes.
fn serve_run(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    peer: &PeerProcess,
    run: Vec<(RequestHeader, u64, Hold)>,
) -> bool {
    let stopped = || (cx.stopping)() || run.iter().any(|(_, _, hold)| hold.region().is_revoked());
    if stopped() {
        let _ = acks.flush(conn);
        return false;
    }
    let locals: Vec<(*mut u8, usize)> = run.iter().map(|(h, _, _)| (h.addr as *mut u8, h.size as usize)).collect();
    let remotes: Vec<(u64, usize)> = run.iter().map(|(h, theirs, _)| (*theirs, h.size as usize)).collect();
    let pull = run[0].0.direction == Direction::Write;
    // SAFETY: every local range lies in a registered region held (not
    // unregistered) until `run` drops.
    let mut copied = unsafe { peer.copy_vectored(&locals, &remotes, pull) }.unwrap_or(0);
    for (h, theirs, _) in &run {
        let whole = copied >= h.size as usize;
        copied = copied.saturating_sub(h.size as usize);
        // Not (wholly) copied by the vectored call: on its own, which also
        // reports a failure of the mechanism for it.
        match if whole { Ok(()) } else { copy_host(peer, h, *theirs, &stopped) } {
            Ok(()) => {
                cx.stats.served(h.direction, h.size);
                acks.ok(true);
            }
            failed => return answer(cx, conn, acks, h, failed),
        }
    }
    true
}

/// Serve one device request over the link (CUDA IPC: the initiator's
/// bytes are `theirs` of its device memory, opened in `imports`): checked
/// and held as any request, then one copy on a device of ours,
/// synchronized before the acknowledgement. `false`: the connection closes.
fn serve_ipc(
    cx: &LocalServing<'_>,
    conn: &Conn,
    acks: &mut Acks,
    imports: &PeerImports,
    header: &RequestHeader,
    theirs: &DeviceExport,
) -> bool {
    let Some(hold) = hold_or_refuse(cx, conn, acks, header) else { return false };
    let region = hold.region();
    let copied = if region.is_revoked() || (cx.stopping)() {
        Err(Failed::Stopped)
    } else {
        copy_ipc(cx, imports, region, header, theirs)
    };
    drop(hold);
    answer(cx, conn, acks, header, copied)
}

/// One copy between the initiator's device memory and our region: device
/// to device on the region's device; for host memory, device to host (or
/// back) on a device of ours that holds a region.
fn copy_ipc(
    cx: &LocalServing<'_>,
    imports: &PeerImports,
    region: &Region,
    h: &RequestHeader,
    theirs: &DeviceExport,
) -> Result<(), Failed> {
    let (device, ours) = match &region.device {
        Some(dev) => (dev.clone(), Local::Device(h.addr)),
        None => match cx.regions.device_overlapping(0, u64::MAX - 1).and_then(|r| r.device.clone()) {
            Some(dev) => (dev, Local::Host(h.addr as *mut u8)),
            None => return Err(Failed::Unusable(Unusable::NoDevice)),
        },
    };
    // Opening a handle follows the driver's own rules, with this thread's
    // full capabilities as the rest of the process has them (the copying
    // threads shed CAP_SYS_PTRACE, which a driver may need for an open).
    let opened = xmem::with_ptrace_capability(|| imports.open(&device, &theirs.handle)).map_err(|e| {
        log::warn!("same-host link: cannot set this thread's capabilities for CUDA IPC: {e}");
        Failed::Unusable(Unusable::Open)
    })?;
    opened.map_err(|e| {
        log::warn!("same-host link: CUDA IPC with {} failed on {device:?}: {e}", imports.peer());
        Failed::Unusable(if e.kind() == ErrorKind::DeviceUnavailable { Unusable::NoIpc } else { Unusable::Open })
    })?;
    // SAFETY: `ours` lies in a registered region, held (not unregistered)
    // until the caller drops the hold; device memory of a region is on its
    // device. The copy is synchronized before this returns.
    let copied = unsafe {
        match h.direction {
            Direction::Write => imports.pull(&device, ours, theirs, h.size),
            Direction::Read => imports.push(&device, ours, theirs, h.size),
        }
    };
    copied.map_err(|e| match e.kind() {
        // The initiator named bytes past the end of its allocation.
        ErrorKind::InvalidArgument => Failed::Refused(e),
        _ => Failed::Device(e),
    })
}

/// Acknowledge a served request (queued: the message's statuses go out
/// together), or answer why not (`false`: the connection closes).
fn answer(
    cx: &LocalServing<'_>,
    conn: &Conn,
    acks: &mut Acks,
    header: &RequestHeader,
    copied: Result<(), Failed>,
) -> bool {
    match copied {
        Ok(()) => {
            cx.stats.served(header.direction, header.size);
            acks.ok(true);
            true
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
        Err(Failed::Unusable(why)) => {
            let status = why.status();
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
        Err(Failed::Refused(e)) => {
            Stats::bump(&cx.stats.requests_refused);
            log::debug!("same-host link: rejecting a peer's request at {:#x}: {e}", header.addr);
            acks.reject(conn, true);
            false
        }
        Err(Failed::Stopped) => {
            // What was served before it is confirmed.
            let _ = acks.flush(conn);
            false
        }
    }
}

/// `(offset, length)` of each slice of a request of `size` bytes.
fn slices(size: usize, slice: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..size.div_ceil(slice)).map(move |k| (k * slice, (size - k * slice).min(slice)))
}

fn copy_host(peer: &PeerProcess, h: &RequestHeader, theirs: u64, stop: &dyn Fn() -> bool) -> Result<(), Failed> {
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
                Direction::Write => peer.read_from(at, ours.add(off), n),
                Direction::Read => peer.write_to(at, ours.add(off), n),
            }
        };
        r.map_err(Failed::Copy)?;
    }
    Ok(())
}

fn copy_device(
    lease: &super::super::memory::staging::Lease<'_>,
    chunk: usize,
    peer: &PeerProcess,
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
                unsafe { peer.read_from(at, buf, n) }.map_err(Failed::Copy)?;
                lease.h2d(0, dptr, n).and_then(|()| lease.sync(0)).map_err(Failed::Device)?;
            }
            Direction::Read => {
                lease.d2h(0, dptr, n).and_then(|()| lease.sync(0)).map_err(Failed::Device)?;
                // SAFETY: our pinned buffer, synchronized.
                unsafe { peer.write_to(at, buf, n) }.map_err(Failed::Copy)?;
            }
        }
    }
    Ok(())
}
