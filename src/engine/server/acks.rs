//! The target's v2 acknowledgements on one data connection, for host and
//! device memory alike: queued as requests are served and sent in as few
//! sends as the pipelining allows (a request's OK waits while more requests
//! are already buffered, so a run of small writes is acknowledged at once).

use std::io;

use super::super::net::conn::Conn;
use super::super::protocol::wire::{self, HEADER_LEN};

/// Acknowledgements not yet sent.
#[derive(Default)]
pub(crate) struct Acks(Vec<u8>);

/// Past this many queued bytes the acknowledgements go out anyway.
const FLUSH_BYTES: usize = 4096;

impl Acks {
    /// Queue an OK for a served request (only v2 requests are acknowledged).
    pub fn ok(&mut self, acknowledged: bool) {
        if acknowledged {
            self.0.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
        }
    }

    /// Whether what is queued should go out now: no more pipelined
    /// requests are already here (else they are acknowledged together,
    /// later), or enough is queued.
    pub fn due(&self, conn: &Conn) -> bool {
        conn.buffered() < HEADER_LEN || self.0.len() >= FLUSH_BYTES
    }

    /// What is queued, taken out to be sent by the caller.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }

    /// Send what is queued, unless more pipelined requests are already here
    /// (then they are acknowledged together, later).
    pub fn flush_unless_pipelined(&mut self, conn: &Conn) -> io::Result<()> {
        if self.due(conn) {
            conn.send_all(&self.0)?;
            self.0.clear();
        }
        Ok(())
    }

    /// Send what is queued now.
    pub fn flush(&mut self, conn: &Conn) -> io::Result<()> {
        if !self.0.is_empty() {
            conn.send_all(&self.0)?;
            self.0.clear();
        }
        Ok(())
    }

    /// Refuse a request: what is queued, then REJECTED for it (v2), go out
    /// now; the caller closes the connection (v1 has no other answer).
    pub fn reject(&mut self, conn: &Conn, acknowledged: bool) {
        if acknowledged {
            self.0.extend_from_slice(&wire::encode_status(wire::STATUS_REJECTED));
            let _ = conn.send_all(&self.0);
        }
        self.0.clear();
    }

    /// Send what is queued followed by `pieces` (a read's status and data)
    /// in one gathered send.
    ///
    /// # Safety
    /// Every piece must be readable for the duration of the call.
    pub unsafe fn send_with(&mut self, conn: &Conn, pieces: &[(*const u8, usize)]) -> io::Result<()> {
        let mut all = Vec::with_capacity(pieces.len() + 1);
        all.push((self.0.as_ptr(), self.0.len()));
        all.extend_from_slice(pieces);
        // SAFETY: our queue is readable; the caller vouches for the rest.
        let sent = unsafe { conn.send_vectored(&all) };
        self.0.clear();
        sent
    }
}
