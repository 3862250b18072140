//! The initiator's window protocol, written once for every kind of local
//! memory. A window of requests is pipelined (headers and payloads sent
//! back to back, acknowledgements read as they come); the target serves
//! them in order, so the outcome of a window is always a prefix of
//! confirmed requests, at most one rejected request, and a tail that is
//! unconfirmed because the connection broke.
//!
//! Where the local bytes live is a [`LocalMemory`]: host memory is sent
//! from and received into directly, in one group; staged (device) memory
//! moves through pinned buffers group by group (see `staging`). The
//! protocol only asks the memory for a group's host view and tells it what
//! arrived; it never knows which kind it drives.

use super::super::memory::local::{LocalMemory, WindowOutcome};
use super::super::net::conn::{io_error, Conn};
use super::super::protocol::wire::{self, RequestHeader, HEADER_LEN, STATUS_LEN};
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// Bytes gathered into one `sendmsg` for small pipelined writes.
const SEND_GATHER_BYTES: usize = 256 * 1024;

fn header(r: &Request, direction: Direction, acknowledged: bool) -> [u8; HEADER_LEN] {
    RequestHeader { size: r.len as u64, addr: r.remote, direction, acknowledged }.encode()
}

/// Run `reqs` (all non-empty, grouped by `memory`) on `conn`, with
/// protocol v2 when `v2`.
///
/// # Safety
/// Every host view `memory` gives must be valid memory (readable for
/// writes, writable for reads) for the duration of the call.
pub unsafe fn run_window(
    conn: &mut Conn,
    direction: Direction,
    v2: bool,
    reqs: &[Request],
    memory: &mut dyn LocalMemory,
) -> WindowOutcome {
    match direction {
        Direction::Write => write(conn, v2, reqs.len(), memory),
        Direction::Read => read(conn, v2, reqs, memory),
    }
}

/// The target refused a request (`rejected`) or the connection ended while
/// acknowledgements were awaited.
fn ended(confirmed: usize, (rejected, err): AckEnd) -> WindowOutcome {
    let broken = Some(err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected")));
    WindowOutcome { confirmed, rejected, broken }
}

/// How waiting for acknowledgements ended early: (rejected, error).
type AckEnd = (bool, Option<Error>);

/// Parse acknowledgements (all buffered ones, or until `want` when
/// `blocking`); `Err` ends the window.
fn take_acks(conn: &mut Conn, want: usize, got: &mut usize, blocking: bool) -> std::result::Result<(), AckEnd> {
    while *got < want && (blocking || conn.buffered() >= STATUS_LEN) {
        let mut frame = [0u8; STATUS_LEN];
        if let Err(e) = conn.recv_exact(&mut frame) {
            return Err((false, Some(io_error(e))));
        }
        match wire::decode_status(frame) {
            Some(wire::STATUS_OK) => *got += 1,
            Some(wire::STATUS_REJECTED) => return Err((true, None)),
            Some(code) => {
                return Err((false, Some(Error::protocol(format!("the peer sent unknown status code {code}")))))
            }
            None => {
                let e = Error::protocol("the peer sent a malformed status frame (it likely speaks only protocol v1)");
                return Err((false, Some(e)));
            }
        }
    }
    Ok(())
}

/// Writes, group by group: a group is staged (the next one ahead when the
/// memory allows), then its headers and payloads go out in gathered sends.
/// v2 takes acknowledgements as they come and waits for all at the end; v1
/// has none, so a 1-byte read of the last byte written, served only after
/// every earlier request on this connection, confirms them all (a v1
/// target closes on a bad address).
unsafe fn write(conn: &mut Conn, v2: bool, total: usize, memory: &mut dyn LocalMemory) -> WindowOutcome {
    let groups = memory.groups().to_vec();
    let (mut acked, mut sent) = (0usize, 0usize);
    let mut last: Option<Request> = None;
    // A local failure after `sent` requests went out: report what the
    // target confirmed of those.
    let local_failure = |conn: &mut Conn, acked: &mut usize, sent: usize, e: Error| {
        if !v2 {
            return WindowOutcome::failed(0, e);
        }
        match take_acks(conn, sent, acked, true) {
            Ok(()) => WindowOutcome::failed(*acked, e),
            Err(end) => ended(*acked, end),
        }
    };
    if let Err(e) = memory.stage_out(0) {
        return WindowOutcome::failed(0, e);
    }
    for g in 0..groups.len() {
        if memory.ahead() && g + 1 < groups.len() {
            if let Err(e) = memory.stage_out(g + 1) {
                return local_failure(conn, &mut acked, sent, e);
            }
        }
        let view = match memory.ready_out(g) {
            Ok(v) => v,
            Err(e) => return local_failure(conn, &mut acked, sent, e),
        };
        let headers: Vec<[u8; HEADER_LEN]> = view.iter().map(|r| header(r, Direction::Write, v2)).collect();
        let mut j = 0;
        while j < view.len() {
            // Gather several small requests into one sendmsg.
            let mut pieces = Vec::with_capacity(16);
            let mut bytes = 0usize;
            let start = j;
            while j < view.len() && (j == start || bytes + view[j].len <= SEND_GATHER_BYTES) {
                pieces.push((headers[j].as_ptr(), HEADER_LEN));
                pieces.push((view[j].local as *const u8, view[j].len));
                bytes += view[j].len + HEADER_LEN;
                j += 1;
            }
            if let Err(e) = conn.send_vectored(&pieces) {
                if !v2 {
                    return WindowOutcome::failed(0, io_error(e));
                }
                // The target may have refused an earlier request and
                // closed: collect what it acknowledged before reporting.
                let e = io_error(e);
                let _ = conn.fill_nonblocking();
                return match take_acks(conn, total, &mut acked, false) {
                    Err(end) => ended(acked, end),
                    Ok(()) => WindowOutcome::failed(acked, e),
                };
            }
            sent += j - start;
            if v2 && conn.fill_nonblocking().is_ok() {
                if let Err(end) = take_acks(conn, sent, &mut acked, false) {
                    return ended(acked, end);
                }
            }
        }
        last = view.last().copied();
        drop(view);
        if !memory.ahead() && g + 1 < groups.len() {
            if let Err(e) = memory.stage_out(g + 1) {
                return local_failure(conn, &mut acked, sent, e);
            }
        }
    }
    if v2 {
        return match take_acks(conn, total, &mut acked, true) {
            Ok(()) => WindowOutcome::done(acked),
            Err(end) => ended(acked, end),
        };
    }
    let Some(last) = last else { return WindowOutcome::done(0) };
    let fence = Request { local: 0, remote: last.remote + last.len as u64 - 1, len: 1 };
    let mut byte = [0u8; 1];
    match conn.send_all(&header(&fence, Direction::Read, false)).and_then(|()| conn.recv_exact(&mut byte)) {
        Ok(()) => WindowOutcome::done(total),
        Err(e) => WindowOutcome::failed(0, io_error(e)),
    }
}

/// Reads: every header first (a full window of headers fits any socket
/// buffer, so this cannot deadlock against the target's replies), then
/// group after group is received into its view and moved home. A request
/// is confirmed once the memory says it is home (in order).
unsafe fn read(conn: &mut Conn, v2: bool, reqs: &[Request], memory: &mut dyn LocalMemory) -> WindowOutcome {
    let mut wire_headers = Vec::with_capacity(reqs.len() * HEADER_LEN);
    for r in reqs {
        wire_headers.extend_from_slice(&header(r, Direction::Read, v2));
    }
    if let Err(e) = conn.send_all(&wire_headers) {
        return WindowOutcome::failed(0, io_error(e));
    }
    let groups = memory.groups().to_vec();
    for g in 0..groups.len() {
        let mut failure: Option<(bool, Error)> = None;
        let staged = match memory.recv_view(g) {
            Ok(v) => v,
            Err(e) => return WindowOutcome::failed(memory.confirmed(), e),
        };
        let view = staged.as_deref().unwrap_or(&reqs[groups[g].clone()]);
        let mut got = 0usize;
        for r in view {
            if v2 {
                let mut one = 0;
                if let Err((rejected, err)) = take_acks(conn, 1, &mut one, true) {
                    failure =
                        Some((rejected, err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected"))));
                    break;
                }
            }
            if let Err(e) = conn.recv_raw(r.local as *mut u8, r.len, &|| false) {
                failure = Some((false, io_error(e)));
                break;
            }
            got += 1;
        }
        if let Err(e) = memory.landed(g, got) {
            failure = Some((false, e));
        }
        if let Some((rejected, e)) = failure {
            // What is queued settles first; the confirmed prefix stops at
            // the first move that failed.
            let rejected = memory.settle().is_ok() && rejected;
            return WindowOutcome { confirmed: memory.confirmed(), rejected, broken: Some(e) };
        }
    }
    match memory.settle() {
        Ok(()) => WindowOutcome::done(memory.confirmed()),
        Err(e) => WindowOutcome::failed(memory.confirmed(), e),
    }
}
