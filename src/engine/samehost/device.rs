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
//! Requests travel as every request of the link does: written into the
//! initiator's ring ([`super::ring`], device frames of [`super::frames`]),
//! announced with a doorbell. A handle is a capability its exporter chose to
//! hand out; the target opens only handles it read from the pinned
//! process's ring. Statuses: OK; REJECTED (the range is not the target's to
//! serve, or its device copy failed; the connection closes, as over TCP);
//! `STATUS_IPC_UNUSABLE` with an [`Unusable`] cause in bits 8 and up (the
//! mechanism failed: the connection closes, the initiator stages device
//! memory for that peer from then on and the executor retries what was not
//! confirmed); `STATUS_COPY_FAILED` (the target could not read the ring:
//! the link failed, TCP from then on).

use std::sync::Arc;

use super::super::memory::cuda::{self, Device};
use super::super::memory::ipc::{self, Exports};
use super::super::memory::local::WindowOutcome;
use super::super::net::conn::{io_error, Conn};
use super::super::protocol::wire::{self, STATUS_LEN};
use super::frames::{encode_device, link_status, STATUS_COPY_FAILED, STATUS_IPC_UNUSABLE};
use super::ring::{InitiatorLink, Kind};
use super::HostIdentity;
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

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
        link_status(STATUS_IPC_UNUSABLE, self as u32)
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

/// What a device window did, and whether CUDA IPC failed (then why: the
/// peer's device memory is staged from then on) or the link itself did
/// (then why: TCP from then on).
pub(crate) struct IpcRan {
    pub outcome: WindowOutcome,
    pub ipc_failed: Option<String>,
    pub link_failed: Option<String>,
}

fn broken(confirmed: usize, rejected: bool, e: Error, ipc_failed: Option<String>) -> IpcRan {
    IpcRan { outcome: WindowOutcome { confirmed, rejected, broken: Some(e) }, ipc_failed, link_failed: None }
}

/// Run `reqs` (all non-empty, their local bytes device memory on
/// `device`) through `link` on `conn`; `Err` (why, nothing sent) when a
/// local range cannot be exported: the caller stages the window instead.
///
/// The local memory must stay allocated, and not be written (for writes)
/// or used (for reads) by anything else, until this returns: the target
/// copies from or into it before it confirms.
pub(crate) fn run_window(
    conn: &mut Conn,
    link: &mut InitiatorLink,
    direction: Direction,
    reqs: &[Request],
    device: &Arc<Device>,
    exports: &Exports,
) -> Result<IpcRan, Error> {
    let mut frames = Vec::with_capacity(reqs.len());
    for r in reqs {
        let export = exports.export(device, r.local as u64, r.len as u64)?;
        frames.push(encode_device(direction, r, &export));
    }
    let mut ok = 0usize;
    for chunk in frames.chunks(Kind::Device.max_entries()) {
        let Some(bell) = link.post(Kind::Device, chunk.as_flattened()) else {
            let e = "the same-host link belongs to another process (this one was forked from it), or a message is \
                     larger than its ring";
            return Ok(broken(ok, false, Error::new(ErrorKind::ConnectionLost, e), None));
        };
        if let Err(e) = conn.send_all(&bell.encode()) {
            return Ok(broken(ok, false, io_error(e), None));
        }
        let want = ok + chunk.len();
        while ok < want {
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
                Some(code) if code & 0xff == STATUS_COPY_FAILED => {
                    let errno = std::io::Error::from_raw_os_error((code >> 8) as i32);
                    let why =
                        format!("the peer could not read this process's requests: {}", super::xmem::explain(&errno));
                    let e = Error::new(ErrorKind::ConnectionLost, why.clone());
                    let mut ran = broken(ok, false, e, None);
                    ran.link_failed = Some(format!("the same-host link failed ({why}); back to TCP"));
                    return Ok(ran);
                }
                _ => {
                    let e =
                        Error::protocol("the peer sent a malformed status for a device request on the same-host link");
                    return Ok(broken(ok, false, e, None));
                }
            }
        }
    }
    Ok(IpcRan { outcome: WindowOutcome::done(ok), ipc_failed: None, link_failed: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_round_trip_in_their_status() {
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
