//! Serving inbound requests on device memory (the target side): bytes go
//! socket → pinned buffer → device, or device → pinned buffer → socket, on
//! the region's device, and nothing is acknowledged or sent before the copy
//! was synchronized.

use std::io;
use std::sync::Arc;

use super::super::memory::cuda::Device;
use super::super::memory::regions::{Hold, Regions};
use super::super::memory::staging::{Lease, Side, Staging};
use super::super::net::conn::Conn;
use super::super::protocol::wire::{self, RequestHeader, HEADER_LEN};
use super::acks::Acks;
use super::Serving;
use crate::error::{Error, ErrorKind};
use crate::transfer::Direction;

/// The connection a device request arrived on, its acknowledgements, and
/// when to stop (the region withdrawn, or the engine stopping).
pub(crate) struct Inbound<'a> {
    pub conn: &'a mut Conn,
    pub acks: &'a mut Acks,
    pub revoked: &'a dyn Fn() -> bool,
}

/// Why a staged request on a server connection stopped.
pub enum Failure {
    /// The socket failed or the region was withdrawn: close the connection.
    Io(io::Error),
    /// A driver call failed; nothing was confirmed for this request.
    Device(Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Device(e)
    }
}

/// Serve inbound requests on a device region (the target side). An inbound
/// write is received into staging, copied to the device and acknowledged
/// (v2) only after the copy was synchronized, so a v1 fence read behind it
/// also passes only then; an inbound read is copied to staging,
/// synchronized and sent. Small requests already pipelined behind this one
/// (same direction, same device, fitting one buffer) are served together:
/// one synchronize, one send. A failed driver call answers REJECTED for the
/// request it concerns where requests are acknowledged, after confirming
/// the ones before it, and closes the connection (`false`).
pub(crate) fn serve_device(serving: &Serving, dev: &Arc<Device>, header: &RequestHeader, io: Inbound<'_>) -> bool {
    let Inbound { conn, acks, revoked } = io;
    let size = header.size as usize;
    let staging = &serving.staging;
    let result = match header.direction {
        // One request larger than a staging buffer, pipelined in chunks.
        Direction::Write if size > staging.chunk() => {
            match recv_to_device(staging, conn, dev, header.addr, size, revoked) {
                Ok(()) => {
                    acks.ok(header.acknowledged);
                    acks.flush_unless_pipelined(conn).map_err(Failure::Io)
                }
                Err(Failure::Device(e)) => Err(reject(conn, acks, header.acknowledged, e)),
                Err(f) => Err(f),
            }
        }
        Direction::Read if size > staging.chunk() => {
            send_from_device(staging, conn, dev, header.addr, size, acks, header.acknowledged, revoked)
        }
        _ => small_run(serving, dev, header, Inbound { conn, acks, revoked }),
    };
    if size > staging.chunk() && result.is_ok() {
        serving.stats.served(header.direction, header.size);
    }
    match result {
        Ok(()) => true,
        Err(Failure::Io(e)) => {
            log::debug!("data connection: {e}");
            false
        }
        Err(Failure::Device(e)) => {
            // The wire can only reject: the peer cannot tell this from a bad
            // range, so it is logged and, for a driver fault, counted here.
            if e.kind() == ErrorKind::Device {
                crate::transfer::stats::Stats::bump(&serving.stats.served_device_failures);
            }
            if !serving.registry.stopping() {
                log::warn!(
                    "data connection: a peer's {} of {} bytes at {:#x} ({dev:?}) failed on this side and is rejected: {e}",
                    header.direction.name(),
                    header.size,
                    header.addr
                );
            }
            false
        }
    }
}

fn reject(conn: &Conn, acks: &mut Acks, acknowledged: bool, e: Error) -> Failure {
    acks.reject(conn, acknowledged);
    Failure::Device(e)
}

/// The next pipelined request, if it can join a run of small requests in
/// direction `d` on `dev` with `room` bytes left in the buffer.
fn next_small(
    regions: &Regions,
    conn: &Conn,
    d: Direction,
    dev: &Device,
    room: usize,
) -> Option<(RequestHeader, Hold)> {
    let h = RequestHeader::decode(&conn.peek_buffered::<HEADER_LEN>()?);
    if h.direction != d || h.size == 0 || h.size as usize > room {
        return None;
    }
    let r = regions.lookup(h.addr, h.size)?;
    if r.device.as_ref()?.ordinal != dev.ordinal {
        return None;
    }
    // Held with this connection listed, so unregistering can end it.
    r.hold(conn.raw_fd()).map(|hold| (h, hold))
}

/// A run of small requests staged in one buffer with one synchronize.
fn small_run(
    serving: &Serving,
    dev: &Arc<Device>,
    first: &RequestHeader,
    io: Inbound<'_>,
) -> std::result::Result<(), Failure> {
    let Inbound { conn, acks, revoked } = io;
    let staging = &serving.staging;
    let lease = match staging.lease(Side::Inbound, dev, 1, revoked) {
        Ok(l) => l,
        // A driver call failed (pinned buffer, stream): refuse this request.
        Err(e) if e.kind() == ErrorKind::Device => return Err(reject(conn, acks, first.acknowledged, e)),
        // No buffer in time (or stopping): close, the initiator retries.
        Err(e) => return Err(Failure::Io(io::Error::new(io::ErrorKind::TimedOut, e.to_string()))),
    };
    let base = lease.buf(0);
    // Regions of the requests after the first (the caller holds the first's)
    // stay held until their copies are synchronized.
    let mut held: Vec<Hold> = Vec::new();
    let mut run: Vec<(RequestHeader, usize)> = Vec::new();
    let mut header = *first;
    let mut off = 0usize;
    loop {
        let size = header.size as usize;
        let stop = || revoked() || held.iter().any(|r| r.region().is_revoked());
        // `base+off .. +size` lies in our pinned buffer (size fits the room
        // left); the device range is in a held region.
        let queued = match header.direction {
            Direction::Write => {
                // SAFETY: see above; the buffer is ours until the lease drops.
                let dst = unsafe { base.add(off) };
                // SAFETY: `dst..dst+size` is writable (see above).
                unsafe { conn.recv_raw(dst, size, &stop) }?;
                lease.h2d_from(0, header.addr, dst, size)
            }
            Direction::Read => lease.d2h_at(0, off, header.addr, size),
        };
        if let Err(e) = queued {
            // This request alone failed: confirm the ones before it.
            let done = lease.sync(0).map(|()| run.len()).unwrap_or(0);
            let e = finish_run(conn, &lease, &run[..done], acks).err().map(Failure::Io).unwrap_or(Failure::Device(e));
            return Err(match e {
                Failure::Device(e) => reject(conn, acks, header.acknowledged, e),
                f => f,
            });
        }
        run.push((header, off));
        off += size;
        match next_small(&serving.regions, conn, header.direction, dev, staging.chunk() - off) {
            Some((h, r)) => {
                let mut raw = [0u8; HEADER_LEN];
                conn.recv_exact(&mut raw)?; // the header peeked at, now consumed
                held.push(r);
                header = h;
            }
            None => break,
        }
    }
    if let Err(e) = lease.sync(0) {
        // Which copy failed is unknown: the first request of the run is
        // refused and the connection closes; the initiator retries the rest.
        return Err(reject(conn, acks, run[0].0.acknowledged, e));
    }
    finish_run(conn, &lease, &run, acks)?;
    drop(held);
    for (h, _) in &run {
        serving.stats.served(h.direction, h.size);
    }
    Ok(())
}

/// Acknowledge a synchronized run of writes, or send a run of reads (each
/// with its status frame in v2) in one gathered send.
fn finish_run(conn: &Conn, lease: &Lease<'_>, run: &[(RequestHeader, usize)], acks: &mut Acks) -> io::Result<()> {
    let Some((first, _)) = run.first() else { return Ok(()) };
    if first.direction == Direction::Write {
        for (h, _) in run {
            acks.ok(h.acknowledged);
        }
        return acks.flush_unless_pipelined(conn);
    }
    let ok = wire::encode_status(wire::STATUS_OK);
    let mut pieces: Vec<(*const u8, usize)> = Vec::with_capacity(2 * run.len());
    for (h, off) in run {
        if h.acknowledged {
            pieces.push((ok.as_ptr(), ok.len()));
        }
        // SAFETY: inside our pinned buffer, synchronized.
        pieces.push((unsafe { lease.buf(0).add(*off) }.cast_const(), h.size as usize));
    }
    // SAFETY: every piece is readable: a local array or our buffer.
    unsafe { acks.send_with(conn, &pieces) }
}

fn recv_to_device(
    staging: &Staging,
    conn: &mut Conn,
    dev: &Arc<Device>,
    dptr: u64,
    size: usize,
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(), Failure> {
    let chunks = size.div_ceil(staging.chunk());
    let lease = staging.lease(Side::Inbound, dev, chunks, stop)?;
    let n = lease.len();
    for k in 0..chunks {
        let (off, len) = (k * staging.chunk(), (size - k * staging.chunk()).min(staging.chunk()));
        let i = k % n;
        if k >= n {
            // The buffer's previous copy must be done before it is refilled.
            lease.sync(i)?;
        }
        // SAFETY: the buffer is ours and `chunk` bytes long.
        unsafe { conn.recv_raw(lease.buf(i), len, stop) }?;
        lease.h2d(i, dptr + off as u64, len)?;
    }
    lease.sync_all()?;
    Ok(())
}

/// Send `size` bytes of device memory at `dptr` for an inbound read,
/// after `acks` (and this request's status when `acknowledged`: OK, or
/// REJECTED if the first copy failed, before any payload byte).
#[allow(clippy::too_many_arguments)]
fn send_from_device(
    staging: &Staging,
    conn: &Conn,
    dev: &Arc<Device>,
    dptr: u64,
    size: usize,
    acks: &mut Acks,
    acknowledged: bool,
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(), Failure> {
    let chunks = size.div_ceil(staging.chunk());
    let first = staging.lease(Side::Inbound, dev, chunks, stop).and_then(|lease| {
        let len0 = size.min(staging.chunk());
        lease.d2h(0, dptr, len0)?;
        if lease.len() > 1 && chunks > 1 {
            lease.d2h(1, dptr + staging.chunk() as u64, (size - staging.chunk()).min(staging.chunk()))?;
        }
        lease.sync(0)?;
        Ok((lease, len0))
    });
    let (lease, len0) = match first {
        Ok(v) => v,
        Err(e) => {
            acks.reject(conn, acknowledged);
            return Err(Failure::Device(e));
        }
    };
    acks.ok(acknowledged);
    // SAFETY: our pinned buffer, synchronized.
    unsafe { acks.send_with(conn, &[(lease.buf(0).cast_const(), len0)]) }?;
    let n = lease.len();
    for k in 1..chunks {
        if stop() {
            return Err(Failure::Io(io::Error::new(io::ErrorKind::Interrupted, "source region was unregistered")));
        }
        let i = k % n;
        if n == 1 {
            lease.d2h(0, dptr + (k * staging.chunk()) as u64, (size - k * staging.chunk()).min(staging.chunk()))?;
        } else if k + 1 < chunks {
            // Queue chunk k+1 into the buffer chunk k-1 was sent from
            // before waiting for chunk k.
            let next = (k + 1) * staging.chunk();
            lease.d2h((k + 1) % n, dptr + next as u64, (size - next).min(staging.chunk()))?;
        }
        lease.sync(i)?;
        // SAFETY: our pinned buffer, synchronized.
        unsafe { conn.send_raw(lease.buf(i), (size - k * staging.chunk()).min(staging.chunk())) }?;
    }
    Ok(())
}
