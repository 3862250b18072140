//! The same-host link's frames and statuses, as pure codecs (no I/O, no
//! panics, whatever the bytes).
//!
//! A request names the target's range in the 24-byte data header and the
//! initiator's bytes after it. Requests never travel on the connection:
//! the initiator writes them into its ring ([`super::ring`]) and sends a
//! [`doorbell`] there; the target reads them from the initiator's memory.
//!
//! Frames (little-endian), as they lie in a ring message:
//! - host memory ([`HOST_FRAME_LEN`] bytes): `u64 size`, `u64 target
//!   address`, `u8 opcode` ([`OP_LOCAL_READ`] / [`OP_LOCAL_WRITE`]), 7 zero
//!   bytes, `u64 initiator address`;
//! - device memory by CUDA IPC ([`DEVICE_FRAME_LEN`] bytes): the same
//!   header with [`OP_IPC_READ`] / [`OP_IPC_WRITE`], the 64-byte
//!   `CUipcMemHandle`, `u64 offset` in that allocation.
//!
//! The doorbell on the connection: a 24-byte data header with `size` = the
//! message's length in the ring, `addr` = its sequence number, opcode
//! [`OP_DOORBELL`]. Statuses are v2 status frames: OK, REJECTED, or one of
//! the link's own codes with a detail in bits 8 and up
//! ([`STATUS_COPY_FAILED`], [`STATUS_IPC_UNUSABLE`], [`STATUS_NOT_REGISTERED`]).

use super::super::memory::ipc::{DeviceExport, HANDLE_LEN};
use super::super::protocol::wire::{self, RequestHeader, HEADER_LEN, STATUS_LEN};
use crate::transfer::{Direction, Request};

/// Opcodes of same-host requests (pdx-only). `0x52`..`0x55` once travelled
/// on the connection itself; a target now refuses them there.
pub(crate) const OP_LOCAL_READ: u8 = 0x52;
pub(crate) const OP_LOCAL_WRITE: u8 = 0x53;
pub(crate) const OP_IPC_READ: u8 = 0x54;
pub(crate) const OP_IPC_WRITE: u8 = 0x55;
/// Opcode of the doorbell: a message waits in the initiator's ring.
pub(crate) const OP_DOORBELL: u8 = 0x56;

/// Length of a host-memory frame.
pub(crate) const HOST_FRAME_LEN: usize = HEADER_LEN + 8;
/// What follows a device frame's header: the handle and the offset.
pub(crate) const DEVICE_TAIL_LEN: usize = HANDLE_LEN + 8;
/// Length of a device-memory frame.
pub(crate) const DEVICE_FRAME_LEN: usize = HEADER_LEN + DEVICE_TAIL_LEN;

/// Status of a request whose cross-process copy failed (errno above): the
/// mechanism failed, the initiator goes back to TCP.
pub(crate) const STATUS_COPY_FAILED: u32 = 2;
/// Status of a request the target could not serve through CUDA IPC (an
/// `Unusable` cause above): the initiator stages device memory.
pub(crate) const STATUS_IPC_UNUSABLE: u32 = 3;
/// Status of a request naming initiator memory outside what the initiator
/// listed as registered: nothing was copied, the initiator goes back to TCP.
pub(crate) const STATUS_NOT_REGISTERED: u32 = 4;

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

/// A header whose opcode is `read` or `write` (always acknowledged).
fn decode_with(header: &[u8; HEADER_LEN], read: u8, write: u8) -> Option<RequestHeader> {
    let direction = match header[16] {
        op if op == read => Direction::Read,
        op if op == write => Direction::Write,
        _ => return None,
    };
    Some(RequestHeader { direction, acknowledged: true, ..RequestHeader::decode(header) })
}

/// The host frame of one request.
pub(crate) fn encode_host(direction: Direction, r: &Request) -> [u8; HOST_FRAME_LEN] {
    let mut out = [0u8; HOST_FRAME_LEN];
    out[..HEADER_LEN].copy_from_slice(&header_of(direction, r, (OP_LOCAL_READ, OP_LOCAL_WRITE)));
    out[HEADER_LEN..].copy_from_slice(&(r.local as u64).to_le_bytes());
    out
}

/// A host frame: its header and the initiator's address; `None` for any
/// other bytes.
pub(crate) fn decode_host(frame: &[u8]) -> Option<(RequestHeader, u64)> {
    let header: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let theirs: [u8; 8] = frame.get(HEADER_LEN..HOST_FRAME_LEN)?.try_into().ok()?;
    Some((decode_with(header, OP_LOCAL_READ, OP_LOCAL_WRITE)?, u64::from_le_bytes(theirs)))
}

/// The device frame of one request whose local bytes are `export`.
pub(crate) fn encode_device(direction: Direction, r: &Request, export: &DeviceExport) -> [u8; DEVICE_FRAME_LEN] {
    let mut out = [0u8; DEVICE_FRAME_LEN];
    out[..HEADER_LEN].copy_from_slice(&header_of(direction, r, (OP_IPC_READ, OP_IPC_WRITE)));
    out[HEADER_LEN..HEADER_LEN + HANDLE_LEN].copy_from_slice(&export.handle);
    out[HEADER_LEN + HANDLE_LEN..].copy_from_slice(&export.offset.to_le_bytes());
    out
}

/// A device frame: its header and the initiator's bytes; `None` for any
/// other bytes.
pub(crate) fn decode_device(frame: &[u8]) -> Option<(RequestHeader, DeviceExport)> {
    let header: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let handle: [u8; HANDLE_LEN] = frame.get(HEADER_LEN..HEADER_LEN + HANDLE_LEN)?.try_into().ok()?;
    let offset: [u8; 8] = frame.get(HEADER_LEN + HANDLE_LEN..DEVICE_FRAME_LEN)?.try_into().ok()?;
    Some((decode_with(header, OP_IPC_READ, OP_IPC_WRITE)?, DeviceExport { handle, offset: u64::from_le_bytes(offset) }))
}

/// Whether `header` is one of the link's (a doorbell, or a request frame
/// of a pdx that sent them on the connection).
pub(crate) fn is_link_header(header: &[u8; HEADER_LEN]) -> bool {
    (OP_LOCAL_READ..=OP_DOORBELL).contains(&header[16])
}

/// A doorbell: a message of `len` bytes with sequence number `seq` waits in
/// the initiator's ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Doorbell {
    pub seq: u64,
    pub len: u64,
}

impl Doorbell {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16] = OP_DOORBELL;
        out
    }

    /// The doorbell `header` is, if it is one.
    pub fn decode(header: &[u8; HEADER_LEN]) -> Option<Doorbell> {
        (header[16] == OP_DOORBELL && header[17..].iter().all(|&b| b == 0)).then(|| {
            let h = RequestHeader::decode(header);
            Doorbell { seq: h.addr, len: h.size }
        })
    }
}

/// The status frame of one of the link's codes with `detail` above it.
pub(crate) fn link_status(code: u32, detail: u32) -> [u8; STATUS_LEN] {
    wire::encode_status(code | (detail.min(0xff_ffff)) << 8)
}

/// The status frame of a failed copy.
pub(crate) fn copy_failed_status(errno: i32) -> [u8; STATUS_LEN] {
    link_status(STATUS_COPY_FAILED, errno.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_not_other_requests() {
        let r = Request { local: 0x1000, remote: 0x7f00_0000_0000, len: 4096 };
        let f = encode_host(Direction::Write, &r);
        let (h, theirs) = decode_host(&f).unwrap();
        assert_eq!((h.direction, h.size, h.addr, h.acknowledged), (Direction::Write, 4096, 0x7f00_0000_0000, true));
        assert_eq!(theirs, 0x1000);
        assert_eq!(decode_host(&encode_host(Direction::Read, &r)).unwrap().0.direction, Direction::Read);
        assert_eq!(decode_host(&f[..HOST_FRAME_LEN - 1]), None);
        let export = DeviceExport { handle: std::array::from_fn(|i| i as u8), offset: 12_345 };
        let d = encode_device(Direction::Read, &r, &export);
        let (h, got) = decode_device(&d).unwrap();
        assert_eq!((h.direction, h.size, got), (Direction::Read, 4096, export));
        // Neither decodes as the other, nor as any other request.
        assert_eq!(decode_host(&d[..HOST_FRAME_LEN]), None);
        assert_eq!(decode_device(&[f.as_slice(), &[0u8; DEVICE_FRAME_LEN]].concat()), None);
        for op in [
            wire::OP_READ_V1,
            wire::OP_WRITE_V1,
            wire::OP_READ_V2,
            wire::OP_WRITE_V2,
            super::super::super::protocol::hello::OP_HELLO,
            OP_DOORBELL,
        ] {
            let mut other = f;
            other[16] = op;
            assert_eq!(decode_host(&other), None);
        }
        let code = wire::decode_status(copy_failed_status(libc::EPERM)).unwrap();
        assert_eq!((code & 0xff, code >> 8), (STATUS_COPY_FAILED, libc::EPERM as u32));
    }

    #[test]
    fn doorbells_round_trip_and_only_link_headers_are_the_links() {
        let bell = Doorbell { seq: 7, len: 4128 };
        let header = bell.encode();
        assert_eq!(Doorbell::decode(&header), Some(bell));
        assert!(is_link_header(&header));
        let mut padded = header;
        padded[20] = 1;
        assert_eq!(Doorbell::decode(&padded), None);
        let mut other = header;
        for op in [wire::OP_READ_V2, wire::OP_WRITE_V2, super::super::super::protocol::hello::OP_HELLO] {
            other[16] = op;
            assert!(!is_link_header(&other) && Doorbell::decode(&other).is_none());
        }
        for op in [OP_LOCAL_READ, OP_LOCAL_WRITE, OP_IPC_READ, OP_IPC_WRITE] {
            other[16] = op;
            assert!(is_link_header(&other) && Doorbell::decode(&other).is_none());
        }
    }
}
