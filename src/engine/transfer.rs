//! Running requests on one lane. A window of requests is pipelined (headers
//! and payloads sent back to back, acknowledgements read as they come); the
//! target serves them in order, so the outcome of a window is always a
//! prefix of confirmed requests, at most one rejected request, and a tail
//! that is unconfirmed because the connection broke.

use std::io;

use super::conn::Conn;
use super::wire::{self, RequestHeader, HEADER_LEN, STATUS_LEN};
use crate::error::{Error, ErrorKind};
use crate::transfer::{Direction, Request};

/// Requests per window, and bytes per window for writes (more pipelining
/// buys nothing once a window covers several socket buffers).
pub(crate) const WINDOW_REQUESTS: usize = 256;
pub(crate) const WINDOW_BYTES: usize = 8 << 20;
/// Bytes gathered into one `sendmsg` for small pipelined writes.
const SEND_GATHER_BYTES: usize = 256 * 1024;

/// What happened to a window.
#[derive(Debug)]
pub struct WindowOutcome {
    /// The first `confirmed` requests completed at the target.
    pub confirmed: usize,
    /// The request right after them was refused by the target (v2 status 1).
    pub rejected: bool,
    /// The connection failed; requests after `confirmed` (+1 if rejected)
    /// are unconfirmed. `None` means the lane is clean and reusable.
    pub broken: Option<Error>,
}

/// Map an I/O error on a data connection to a core error.
pub fn io_error(e: io::Error, session: &str) -> Error {
    let kind = match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ErrorKind::Timeout,
        _ => ErrorKind::ConnectionLost,
    };
    Error::new(kind, format!("data connection to {session}: {e}"))
}

pub(crate) fn header(r: &Request, direction: Direction, acknowledged: bool) -> [u8; HEADER_LEN] {
    RequestHeader { size: r.len as u64, addr: r.remote, direction, acknowledged }.encode()
}

/// Run `reqs` (all non-empty) on `conn` with protocol v2 when `v2`.
///
/// # Safety
/// Every request's local range must be valid memory (readable for writes,
/// writable for reads) for the duration of the call.
pub unsafe fn run_window(
    conn: &mut Conn,
    session: &str,
    direction: Direction,
    v2: bool,
    reqs: &[Request],
) -> WindowOutcome {
    match (direction, v2) {
        (Direction::Write, true) => write_v2(conn, session, reqs),
        (Direction::Write, false) => write_v1(conn, session, reqs),
        (Direction::Read, _) => read(conn, session, v2, reqs),
    }
}

/// Parse acknowledgements already buffered; `Err` ends the window.
pub(crate) fn take_acks(
    conn: &mut Conn,
    session: &str,
    want: usize,
    got: &mut usize,
    blocking: bool,
) -> Result<(), (bool, Option<Error>)> {
    while *got < want && (blocking || conn.buffered() >= STATUS_LEN) {
        let mut frame = [0u8; STATUS_LEN];
        if let Err(e) = conn.recv_exact(&mut frame) {
            return Err((false, Some(io_error(e, session))));
        }
        match wire::decode_status(frame) {
            Some(wire::STATUS_OK) => *got += 1,
            Some(code) => {
                let e = if code == wire::STATUS_REJECTED {
                    None
                } else {
                    Some(Error::protocol(format!("{session} sent unknown status code {code}")))
                };
                return Err((code == wire::STATUS_REJECTED, e));
            }
            None => {
                return Err((
                    false,
                    Some(Error::protocol(format!(
                        "{session} sent a malformed status frame (peer likely speaks only protocol v1)"
                    ))),
                ))
            }
        }
    }
    Ok(())
}

unsafe fn write_v2(conn: &mut Conn, session: &str, reqs: &[Request]) -> WindowOutcome {
    let headers: Vec<[u8; HEADER_LEN]> = reqs.iter().map(|r| header(r, Direction::Write, true)).collect();
    let mut acked = 0usize;
    let mut sent = 0usize;
    let end_window = |acked: usize, (rejected, err): (bool, Option<Error>)| {
        let broken = Some(err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected")));
        WindowOutcome { confirmed: acked, rejected, broken }
    };
    while sent < reqs.len() {
        // Gather several small requests into one sendmsg.
        let mut pieces = Vec::with_capacity(16);
        let mut bytes = 0usize;
        let mut j = sent;
        while j < reqs.len() && (j == sent || bytes + reqs[j].len <= SEND_GATHER_BYTES) {
            pieces.push((headers[j].as_ptr(), HEADER_LEN));
            pieces.push((reqs[j].local as *const u8, reqs[j].len));
            bytes += reqs[j].len + HEADER_LEN;
            j += 1;
        }
        if let Err(e) = conn.send_vectored(&pieces) {
            // The target may have refused an earlier request and closed:
            // collect what it acknowledged before reporting.
            let e = io_error(e, session);
            let _ = conn.fill_nonblocking();
            return match take_acks(conn, session, reqs.len(), &mut acked, false) {
                Err(end) => end_window(acked, end),
                Ok(()) => WindowOutcome { confirmed: acked, rejected: false, broken: Some(e) },
            };
        }
        sent = j;
        if conn.fill_nonblocking().is_ok() {
            if let Err(end) = take_acks(conn, session, sent, &mut acked, false) {
                return end_window(acked, end);
            }
        }
    }
    match take_acks(conn, session, reqs.len(), &mut acked, true) {
        Ok(()) => WindowOutcome { confirmed: acked, rejected: false, broken: None },
        Err(end) => end_window(acked, end),
    }
}

unsafe fn write_v1(conn: &mut Conn, session: &str, reqs: &[Request]) -> WindowOutcome {
    // v1 has no acknowledgement. A 1-byte READ of the last byte written,
    // served only after every earlier request on this connection, confirms
    // that all of them were applied (a v1 target closes on a bad address).
    let mut pieces = Vec::with_capacity(reqs.len() * 2 + 1);
    let headers: Vec<[u8; HEADER_LEN]> = reqs.iter().map(|r| header(r, Direction::Write, false)).collect();
    for (h, r) in headers.iter().zip(reqs) {
        pieces.push((h.as_ptr(), HEADER_LEN));
        pieces.push((r.local as *const u8, r.len));
    }
    let last = reqs[reqs.len() - 1];
    let fence = Request { local: 0, remote: last.remote + last.len as u64 - 1, len: 1 };
    let fence_header = header(&fence, Direction::Read, false);
    pieces.push((fence_header.as_ptr(), HEADER_LEN));
    let mut byte = [0u8; 1];
    let result = conn.send_vectored(&pieces).and_then(|()| conn.recv_exact(&mut byte));
    match result {
        Ok(()) => WindowOutcome { confirmed: reqs.len(), rejected: false, broken: None },
        Err(e) => WindowOutcome { confirmed: 0, rejected: false, broken: Some(io_error(e, session)) },
    }
}

unsafe fn read(conn: &mut Conn, session: &str, v2: bool, reqs: &[Request]) -> WindowOutcome {
    // Headers are small (a full window fits any socket buffer), so sending
    // them all before reading cannot deadlock against the target's replies.
    let mut wire_headers = Vec::with_capacity(reqs.len() * HEADER_LEN);
    for r in reqs {
        wire_headers.extend_from_slice(&header(r, Direction::Read, v2));
    }
    if let Err(e) = conn.send_all(&wire_headers) {
        return WindowOutcome { confirmed: 0, rejected: false, broken: Some(io_error(e, session)) };
    }
    for (i, r) in reqs.iter().enumerate() {
        if v2 {
            let mut acked = 0;
            if let Err((rejected, err)) = take_acks(conn, session, 1, &mut acked, true) {
                let broken = Some(err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected")));
                return WindowOutcome { confirmed: i, rejected, broken };
            }
        }
        if let Err(e) = conn.recv_raw(r.local as *mut u8, r.len, &|| false) {
            return WindowOutcome { confirmed: i, rejected: false, broken: Some(io_error(e, session)) };
        }
    }
    WindowOutcome { confirmed: reqs.len(), rejected: false, broken: None }
}
