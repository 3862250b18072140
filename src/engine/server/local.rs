//! Serving same-host requests (the target side of the link in
//! [`super::super::samehost`]): each request is checked against the
//! registered regions exactly as over TCP, then this engine copies the
//! bytes itself between the initiator's memory (at the address of the
//! request in hand, never another) and its region: one cross-process copy
//! for host memory; for device memory, through one pinned buffer, the
//! device copy synchronized before the acknowledgement. Device memory of
//! the initiator arrives as CUDA IPC handles ([`serve_ipc`]): one copy from
//! or into it on a device of ours, synchronized before the acknowledgement.

use std::io;

use super::super::memory::ipc::{DeviceExport, Local, PeerImports};
use super::super::memory::regions::{Hold, Region, Regions};
use super::super::memory::staging::{Side, Staging};
use super::super::net::conn::Conn;
use super::super::protocol::wire::{RequestHeader, HEADER_LEN};
use super::super::samehost::device::{self, Unusable};
use super::super::samehost::window::{copy_failed_status, decode_local, FRAME_LEN};
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

/// Whether `header` opens a same-host request (host memory, or device
/// memory by CUDA IPC); its tail follows on the connection.
pub(crate) fn is_same_host_frame(header: &[u8; HEADER_LEN]) -> bool {
    decode_local(header).is_some() || device::decode_ipc(header).is_some()
}

/// Serve the same-host request `header` opens (see [`is_same_host_frame`]),
/// from the process `peer` (granted the link): its tail read here, then
/// [`serve_local`] or [`serve_ipc`] (the initiator's allocations opened
/// once per connection, closed with it). `false`: the connection closes.
pub(crate) fn serve_frame(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    peer: &PeerProcess,
    header: &[u8; HEADER_LEN],
) -> bool {
    if let Some(h) = decode_local(header) {
        let mut theirs = [0u8; 8];
        if let Err(e) = conn.recv_exact(&mut theirs) {
            log::debug!("same-host link: {e}");
            return false;
        }
        return serve_local(cx, conn, acks, peer, &h, u64::from_le_bytes(theirs));
    }
    let Some(h) = device::decode_ipc(header) else { return false };
    let mut tail = [0u8; device::TAIL_LEN];
    if let Err(e) = conn.recv_exact(&mut tail) {
        log::debug!("same-host link: {e}");
        return false;
    }
    // Device memory arrives as handles its exporter chose to hand out, but
    // only while the process granted the link still runs.
    if !peer.running() {
        log::debug!("same-host link: pid {} has exited; closing", peer.pid());
        return false;
    }
    let imports = conn.attachment(|| PeerImports::new(format!("pid {}", peer.pid())));
    serve_ipc(cx, conn, acks, &imports, &h, &device::decode_tail(&tail))
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

/// Serve one same-host request from process `peer` (`header` checked
/// here, the initiator's bytes at `theirs`). `false`: the connection closes.
fn serve_local(
    cx: &LocalServing<'_>,
    conn: &mut Conn,
    acks: &mut Acks,
    peer: &PeerProcess,
    header: &RequestHeader,
    theirs: u64,
) -> bool {
    let Some(hold) = hold_or_refuse(cx, conn, acks, header) else { return false };
    let region = hold.region();
    let stop = || region.is_revoked() || (cx.stopping)();
    let copied = match &region.device {
        None if (header.size as usize) < RUN_BYTES => {
            let more = gather(cx, conn, header);
            if !more.is_empty() {
                let mut run = vec![(*header, theirs, hold)];
                run.extend(more);
                return serve_run(cx, conn, acks, peer, run);
            }
            copy_host(peer, header, theirs, &stop)
        }
        None => copy_host(peer, header, theirs, &stop),
        Some(dev) => cx
            .staging
            .lease(Side::Inbound, dev, 1, &stop)
            .map_err(Failed::Device)
            .and_then(|lease| copy_device(&lease, cx.staging.chunk(), peer, header, theirs, &stop)),
    };
    drop(hold);
    answer(cx, conn, acks, header, copied)
}

/// Most requests one vectored copy serves together (within `IOV_MAX`), and
/// their bytes: a run of small pipelined requests costs one system call.
const RUN_REQUESTS: usize = 64;
const RUN_BYTES: usize = 4 << 20;

/// Requests pipelined right behind `first` that one vectored copy can serve
/// with it (same-host, the same direction, host regions, within the run's
/// bounds), each held and its frame consumed. Anything else is left for
/// the next turn of the connection's loop (a bad range is refused there).
fn gather(cx: &LocalServing<'_>, conn: &mut Conn, first: &RequestHeader) -> Vec<(RequestHeader, u64, Hold)> {
    let mut run = Vec::new();
    let mut bytes = first.size as usize;
    while run.len() + 1 < RUN_REQUESTS {
        let Some(frame) = conn.peek_buffered::<FRAME_LEN>() else { break };
        let Some(h) = frame[..HEADER_LEN].try_into().ok().and_then(|h| decode_local(&h)) else { break };
        if h.direction != first.direction || h.size == 0 || bytes + h.size as usize > RUN_BYTES {
            break;
        }
        let region = cx.regions.lookup(h.addr, h.size).filter(|r| r.device.is_none());
        let Some(hold) = region.and_then(|r| r.hold(conn.raw_fd())) else { break };
        let mut raw = [0u8; FRAME_LEN];
        if conn.recv_exact(&mut raw).is_err() {
            break; // it was buffered: cannot happen
        }
        let theirs = u64::from_le_bytes(raw[HEADER_LEN..].try_into().unwrap_or_default());
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
    // One send acknowledges the run (or more, if more is pipelined).
    match acks.flush_unless_pipelined(conn) {
        Ok(()) => true,
        Err(e) => {
            log::debug!("same-host link: {e}");
            false
        }
    }
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

/// Acknowledge a served request, or answer why not (`false`: the
/// connection closes).
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
        Err(Failed::Stopped) => false,
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
