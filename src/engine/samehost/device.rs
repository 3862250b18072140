//! Device memory over the same-host link, through CUDA IPC ([`ipc`]): the
//! initiator names each request's local bytes as (allocation handle,
//! offset) instead of staging them, and the target opens the handle once
//! per connection and copies device to device on a stream of its own,
//! synchronized before it acknowledges. A request into the target's host
//! memory is one device-to-host (or host-to-device) copy there.
//!
//! Negotiated with the link ([`super::Offer::device_ipc`],
//! [`super::Answer::device_ipc`]): offered when this process's driver can
//! export (it is loaded and has the IPC entry points) and the peer is
//! another process (the driver refuses to open a handle in the process that
//! exported it); accepted when the peer's driver can import.
//!
//! Frames (little-endian): the 24-byte data header (`u64 size`, `u64 target
//! address`, `u8 opcode` [`OP_IPC_READ`] / [`OP_IPC_WRITE`], 7 zero bytes),
//! the 64-byte `CUipcMemHandle`, `u64 offset` in that allocation. Statuses:
//! OK; REJECTED (the range is not the target's to serve, or its device copy
//! failed; the connection closes, as over TCP); [`STATUS_IPC_UNUSABLE`]
//! with an [`Unusable`] cause in bits 8 and up (the mechanism failed: the
//! connection closes, the initiator stages device memory for that peer
//! from then on and the executor retries what was not confirmed).

use std::sync::Arc;

use super::super::initiator::window::{io_error, WindowOutcome};
use super::super::memory::cuda::{self, Device};
use super::super::memory::ipc::{self, DeviceExport, Exports, HANDLE_LEN};
use super::super::net::conn::Conn;
use super::super::protocol::wire::{self, RequestHeader, HEADER_LEN, STATUS_LEN};
use super::HostIdentity;
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// Opcodes of device requests over the link (pdx-only; sent only on a
/// connection whose hello accepted device IPC).
pub(crate) const OP_IPC_READ: u8 = 0x54;
pub(crate) const OP_IPC_WRITE: u8 = 0x55;
/// What follows the header: the handle and the offset.
pub(crate) const TAIL_LEN: usize = HANDLE_LEN + 8;
/// Length of a device request frame.
pub(crate) const FRAME_LEN: usize = HEADER_LEN + TAIL_LEN;
/// Status of a request the target could not serve through CUDA IPC.
pub(crate) const STATUS_IPC_UNUSABLE: u32 = 3;

/// The reason an accepted answer gives.
pub(crate) const ACCEPTED: &str = "CUDA IPC (one device-to-device copy by the peer)";

/// Why the target could not use CUDA IPC for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unusable {
    /// Opening the initiator's handle failed (refused, mapping failed).
    Open = 1,
    /// Its driver has no IPC entry points.
    NoIpc = 2,
    /// Host memory, and no device of its own to copy it with.
    NoDevice = 3,
}

impl Unusable {
    fn from_code(code: u32) -> Option<Unusable> {
        [Unusable::Open, Unusable::NoIpc, Unusable::NoDevice].into_iter().find(|u| *u as u32 == code)
    }

    /// In plain words, for the initiator's reason.
    pub fn explain(self) -> &'static str {
        match self {
            Unusable::Open => {
                "CUDA IPC failed: the peer could not open this process's device memory handle \
                 (cuIpcOpenMemHandle; its log names the driver's error)"
            }
            Unusable::NoIpc => "CUDA IPC failed: the peer's CUDA driver cannot import device memory",
            Unusable::NoDevice => {
                "CUDA IPC failed: the peer has no device of its own to copy into its host memory with"
            }
        }
    }

    /// The status frame saying so.
    pub fn status(self) -> [u8; STATUS_LEN] {
        wire::encode_status(STATUS_IPC_UNUSABLE | (self as u32) << 8)
    }
}

const SAME_PROCESS: &str =
    "both engines are in one process, and CUDA IPC does not open a handle in the process that exported it";

/// The initiator's side: whether to offer device IPC to `peer`; an empty
/// reason when this process has no CUDA driver loaded (so no device memory
/// to move: nothing worth saying).
pub(crate) fn can_export(peer: &HostIdentity) -> Result<(), String> {
    let api = cuda::resident_driver().ok_or_else(String::new)?;
    if peer.pid == std::process::id() {
        return Err(SAME_PROCESS.to_owned());
    }
    ipc::check_usable(&api).map_err(|e| e.to_string())
}

/// The target's side: whether to import the device memory of `peer`
/// (worded for the initiator).
pub(crate) fn can_import(own: &HostIdentity, peer: &HostIdentity) -> Result<(), String> {
    if peer.pid == own.pid {
        return Err(SAME_PROCESS.to_owned());
    }
    let api = cuda::resident_driver()
        .ok_or("the peer has no CUDA driver loaded (no device memory registered there) to import device memory")?;
    ipc::check_usable(&api).map_err(|e| format!("the peer: {e}"))
}

/// The frame of one request whose local bytes are `export`.
pub(crate) fn encode(direction: Direction, r: &Request, export: &DeviceExport) -> [u8; FRAME_LEN] {
    let mut out = [0u8; FRAME_LEN];
    out[..HEADER_LEN].copy_from_slice(&super::window::header_of(direction, r, (OP_IPC_READ, OP_IPC_WRITE)));
    out[HEADER_LEN..HEADER_LEN + HANDLE_LEN].copy_from_slice(&export.handle);
    out[HEADER_LEN + HANDLE_LEN..].copy_from_slice(&export.offset.to_le_bytes());
    out
}

/// A device request header (always acknowledged), `None` for any other.
pub(crate) fn decode_ipc(header: &[u8; HEADER_LEN]) -> Option<RequestHeader> {
    super::window::decode_with(header, OP_IPC_READ, OP_IPC_WRITE)
}

/// The initiator's bytes a frame's tail names.
pub(crate) fn decode_tail(tail: &[u8; TAIL_LEN]) -> DeviceExport {
    let mut handle = [0u8; HANDLE_LEN];
    handle.copy_from_slice(&tail[..HANDLE_LEN]);
    let offset = u64::from_le_bytes(tail[HANDLE_LEN..].try_into().unwrap_or_default());
    DeviceExport { handle, offset }
}

/// What a device window did, and whether CUDA IPC failed (then why: the
/// peer's device memory is staged from then on).
pub(crate) struct IpcRan {
    pub outcome: WindowOutcome,
    pub ipc_failed: Option<String>,
}

fn broken(confirmed: usize, rejected: bool, e: Error, ipc_failed: Option<String>) -> IpcRan {
    IpcRan { outcome: WindowOutcome { confirmed, rejected, broken: Some(e) }, ipc_failed }
}

/// Run `reqs` (all non-empty, their local bytes device memory on
/// `device`) on `conn`; `Err` (why, nothing sent) when a local range
/// cannot be exported: the caller stages the window instead.
///
/// The local memory must stay allocated, and not be written (for writes)
/// or used (for reads) by anything else, until this returns: the target
/// copies from or into it before it confirms.
pub(crate) fn run_window(
    conn: &mut Conn,
    direction: Direction,
    reqs: &[Request],
    device: &Arc<Device>,
    exports: &Exports,
) -> Result<IpcRan, Error> {
    let mut frames = Vec::with_capacity(reqs.len() * FRAME_LEN);
    for r in reqs {
        let export = exports.export(device, r.local as u64, r.len as u64)?;
        frames.extend_from_slice(&encode(direction, r, &export));
    }
    if let Err(e) = conn.send_all(&frames) {
        return Ok(broken(0, false, io_error(e), None));
    }
    let mut ok = 0usize;
    while ok < reqs.len() {
        let mut frame = [0u8; STATUS_LEN];
        if let Err(e) = conn.recv_exact(&mut frame) {
            return Ok(broken(ok, false, io_error(e), None));
        }
        match wire::decode_status(frame) {
            Some(wire::STATUS_OK) => ok += 1,
            Some(wire::STATUS_REJECTED) => {
                return Ok(broken(ok, true, Error::new(ErrorKind::RemoteRejected, "rejected"), None));
            }
            Some(code) if code & 0xff == STATUS_IPC_UNUSABLE => {
                let why = Unusable::from_code(code >> 8)
                    .map_or("CUDA IPC failed at the peer (a cause this engine does not know)", Unusable::explain);
                let e = Error::new(ErrorKind::ConnectionLost, format!("{why}; retried staged"));
                return Ok(broken(ok, false, e, Some(why.to_owned())));
            }
            _ => {
                let e = Error::protocol("the peer sent a malformed status for a device request on the same-host link");
                return Ok(broken(ok, false, e, None));
            }
        }
    }
    Ok(IpcRan { outcome: WindowOutcome { confirmed: ok, rejected: false, broken: None }, ipc_failed: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_not_other_requests() {
        let r = Request { local: 0x1000, remote: 0x7f00_0000_0000, len: 4097 };
        let export = DeviceExport { handle: std::array::from_fn(|i| i as u8), offset: 12_345 };
        let f = encode(Direction::Write, &r, &export);
        let header: [u8; HEADER_LEN] = f[..HEADER_LEN].try_into().unwrap();
        let h = decode_ipc(&header).unwrap();
        assert_eq!((h.direction, h.size, h.addr, h.acknowledged), (Direction::Write, 4097, 0x7f00_0000_0000, true));
        assert_eq!(decode_tail(&f[HEADER_LEN..].try_into().unwrap()), export);
        let read = decode_ipc(&encode(Direction::Read, &r, &export)[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(read.direction, Direction::Read);
        for op in [
            wire::OP_READ_V2,
            wire::OP_WRITE_V2,
            super::super::window::OP_LOCAL_READ,
            super::super::window::OP_LOCAL_WRITE,
        ] {
            let mut other = header;
            other[16] = op;
            assert_eq!(decode_ipc(&other), None);
        }
        for cause in [Unusable::Open, Unusable::NoIpc, Unusable::NoDevice] {
            let code = wire::decode_status(cause.status()).unwrap();
            assert_eq!((code & 0xff, Unusable::from_code(code >> 8)), (STATUS_IPC_UNUSABLE, Some(cause)));
            assert!(cause.explain().contains("CUDA IPC"));
        }
    }

    #[test]
    fn one_process_never_offers_or_accepts_ipc_with_itself() {
        let own = HostIdentity::current().expect("/proc");
        // Without a driver loaded here there is nothing to say; with one, the reason.
        let why = can_export(&own).unwrap_err();
        assert!(why.is_empty() || why.contains("one process"), "{why}");
        assert!(can_import(&own, &own).unwrap_err().contains("one process"));
    }
}
