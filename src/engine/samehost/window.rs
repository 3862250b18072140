//! The initiator's side of the same-host link: a window of requests goes
//! out as 32-byte frames (the data header plus the initiator's address),
//! and the target answers each with a status once it has copied the bytes
//! itself. Local memory is driven group by group as over TCP
//! ([`LocalMemory`]): host memory is copied where it is, device memory
//! through the pinned buffers it is staged in; a group's buffers are not
//! reused before the target confirmed every request in it.
//!
//! Frames (little-endian): `u64 size`, `u64 target address`, `u8 opcode`
//! ([`OP_LOCAL_READ`] / [`OP_LOCAL_WRITE`]), 7 zero bytes, `u64 initiator
//! address`. Statuses are v2 status frames: OK, REJECTED (the range is not
//! the target's to serve; it closes the connection as over TCP), or
//! [`STATUS_COPY_FAILED`] with the errno in bits 8 and up (the mechanism
//! failed: the peer falls back to TCP).

use super::super::initiator::window::{io_error, LocalMemory, WindowOutcome};
use super::super::net::conn::Conn;
use super::super::protocol::wire::{self, RequestHeader, HEADER_LEN, STATUS_LEN};
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// Opcodes of same-host requests (pdx-only; sent only on a connection
/// whose hello accepted the link).
pub(crate) const OP_LOCAL_READ: u8 = 0x52;
pub(crate) const OP_LOCAL_WRITE: u8 = 0x53;
/// Length of a same-host request frame.
pub(crate) const FRAME_LEN: usize = HEADER_LEN + 8;
/// Status of a request whose cross-process copy failed (errno above).
pub(crate) const STATUS_COPY_FAILED: u32 = 2;

/// Requests shorter than this ride inline on a same-host connection, as
/// over TCP: for a few KiB the socket's own copies cost less than the
/// target's cross-process copy (about 1.5 us for 4 KiB here). They count
/// as same-host traffic all the same (the link chose how to carry them).
pub(crate) const INLINE_BELOW: usize = 16 << 10;

/// Whether a window goes inline: every request shorter than [`INLINE_BELOW`].
pub(crate) fn inline(reqs: &[Request]) -> bool {
    reqs.iter().all(|r| r.len < INLINE_BELOW)
}

/// The frame of one request.
pub(crate) fn encode(direction: Direction, r: &Request) -> [u8; FRAME_LEN] {
    let mut out = [0u8; FRAME_LEN];
    out[..HEADER_LEN].copy_from_slice(&header_of(direction, r, (OP_LOCAL_READ, OP_LOCAL_WRITE)));
    out[HEADER_LEN..].copy_from_slice(&(r.local as u64).to_le_bytes());
    out
}

/// The data header of `r` with the opcode of `direction` from `(read, write)`.
pub(crate) fn header_of(direction: Direction, r: &Request, (read, write): (u8, u8)) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..8].copy_from_slice(&(r.len as u64).to_le_bytes());
    out[8..16].copy_from_slice(&r.remote.to_le_bytes());
    out[16] = match direction {
        Direction::Read => read,
        Direction::Write => write,
    };
    out
}

/// A same-host request header (always acknowledged), `None` for any
/// other request.
pub(crate) fn decode_local(header: &[u8; HEADER_LEN]) -> Option<RequestHeader> {
    decode_with(header, OP_LOCAL_READ, OP_LOCAL_WRITE)
}

/// A header whose opcode is `read` or `write` (always acknowledged).
pub(crate) fn decode_with(header: &[u8; HEADER_LEN], read: u8, write: u8) -> Option<RequestHeader> {
    let direction = match header[16] {
        op if op == read => Direction::Read,
        op if op == write => Direction::Write,
        _ => return None,
    };
    Some(RequestHeader { direction, acknowledged: true, ..RequestHeader::decode(header) })
}

/// The status frame of a failed copy.
pub(crate) fn copy_failed_status(errno: i32) -> [u8; STATUS_LEN] {
    wire::encode_status(STATUS_COPY_FAILED | (errno.clamp(0, 0xff_ffff) as u32) << 8)
}

/// What a same-host window did, and whether the link itself failed (then
/// the reason, and the peer goes back to TCP).
pub(crate) struct Ran {
    pub outcome: WindowOutcome,
    pub link_failed: Option<String>,
}

enum End {
    Rejected,
    CopyFailed(String),
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
                return Err(End::CopyFailed(super::xmem::explain(&errno)));
            }
            _ => return Err(End::Broken(Error::protocol("the peer sent a malformed status on the same-host link"))),
        }
    }
    Ok(())
}

fn ended(confirmed: usize, end: End) -> Ran {
    let (rejected, e, link_failed) = match end {
        End::Rejected => (true, Error::new(ErrorKind::RemoteRejected, "rejected"), None),
        End::CopyFailed(why) => {
            let e = Error::new(ErrorKind::ConnectionLost, format!("the peer's cross-process copy failed: {why}"));
            (false, e, Some(format!("the same-host link failed ({why}); back to TCP")))
        }
        End::Broken(e) => (false, e, None),
    };
    Ran { outcome: WindowOutcome { confirmed, rejected, broken: Some(e) }, link_failed }
}

fn failed(confirmed: usize, e: Error) -> Ran {
    Ran { outcome: WindowOutcome { confirmed, rejected: false, broken: Some(e) }, link_failed: None }
}

fn frames(direction: Direction, view: &[Request]) -> Vec<u8> {
    view.iter().flat_map(|r| encode(direction, r)).collect()
}

/// Run `reqs` (all non-empty, grouped by `memory`) on `conn`.
///
/// # Safety
/// Every host view `memory` gives must be valid memory (readable for
/// writes, writable for reads) until the target confirmed it: the target
/// copies from or into it.
pub(crate) unsafe fn run_window(
    conn: &mut Conn,
    direction: Direction,
    reqs: &[Request],
    memory: &mut dyn LocalMemory,
) -> Ran {
    match direction {
        Direction::Write => write(conn, memory),
        Direction::Read => read(conn, reqs, memory),
    }
}

fn write(conn: &mut Conn, memory: &mut dyn LocalMemory) -> Ran {
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
        let (out, n) = match memory.ready_out(g) {
            Ok(view) => (frames(Direction::Write, &view), view.len()),
            Err(e) => return failed(acked, e),
        };
        if let Err(e) = conn.send_all(&out) {
            return failed(acked, io_error(e));
        }
        // The group's buffers stay untouched until the target has read them.
        if let Err(end) = take_statuses(conn, acked + n, &mut acked) {
            return ended(acked, end);
        }
        if !memory.ahead() && g + 1 < groups {
            if let Err(e) = memory.stage_out(g + 1) {
                return failed(acked, e);
            }
        }
    }
    Ran { outcome: WindowOutcome { confirmed: acked, rejected: false, broken: None }, link_failed: None }
}

fn read(conn: &mut Conn, reqs: &[Request], memory: &mut dyn LocalMemory) -> Ran {
    let groups = memory.groups().to_vec();
    for (g, range) in groups.into_iter().enumerate() {
        let staged = match memory.recv_view(g) {
            Ok(v) => v,
            Err(e) => return failed(memory.confirmed(), e),
        };
        let view = staged.as_deref().unwrap_or(&reqs[range]);
        let mut got = 0usize;
        let taken = conn
            .send_all(&frames(Direction::Read, view))
            .map_err(|e| End::Broken(io_error(e)))
            .and_then(|()| take_statuses(conn, view.len(), &mut got));
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
        Ok(()) => Ran {
            outcome: WindowOutcome { confirmed: memory.confirmed(), rejected: false, broken: None },
            link_failed: None,
        },
        Err(e) => failed(memory.confirmed(), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_not_other_requests() {
        let r = Request { local: 0x1000, remote: 0x7f00_0000_0000, len: 4096 };
        let f = encode(Direction::Write, &r);
        let header: [u8; HEADER_LEN] = f[..HEADER_LEN].try_into().unwrap();
        let h = decode_local(&header).unwrap();
        assert_eq!((h.direction, h.size, h.addr, h.acknowledged), (Direction::Write, 4096, 0x7f00_0000_0000, true));
        assert_eq!(u64::from_le_bytes(f[HEADER_LEN..].try_into().unwrap()), 0x1000);
        let read = decode_local(&encode(Direction::Read, &r)[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(read.direction, Direction::Read);
        for op in [
            wire::OP_READ_V1,
            wire::OP_WRITE_V1,
            wire::OP_READ_V2,
            wire::OP_WRITE_V2,
            super::super::super::protocol::hello::OP_HELLO,
        ] {
            let mut other = header;
            other[16] = op;
            assert_eq!(decode_local(&other), None);
        }
        let code = wire::decode_status(copy_failed_status(libc::EPERM)).unwrap();
        assert_eq!((code & 0xff, code >> 8), (STATUS_COPY_FAILED, libc::EPERM as u32));
    }
}
