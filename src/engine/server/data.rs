//! The data port: persistent connections serving 24-byte requests in order,
//! each checked against the registered regions before memory is touched.

use std::io;

use super::super::conn::{Conn, MAX_IO_CHUNK};
use super::super::hello;
use super::super::wire::{self, RequestHeader, HEADER_LEN};
use super::super::Inner;
use crate::transfer::stats::Stats;
use crate::transfer::Direction;

/// Marks a data connection idle again when its request is done.
struct IdleAgain<'a>(&'a super::super::budget::Ticket);

impl Drop for IdleAgain<'_> {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

/// Answer a hello with our instance; true if the initiator expects us
/// (the connection then serves requests), false to close it.
fn answer_hello(inner: &Inner, conn: &mut Conn, header: &[u8; HEADER_LEN]) -> bool {
    let Some(len) = hello::request_body_len(header) else {
        log::debug!("data connection: hello with a body length out of bounds; closing");
        return false;
    };
    let mut body = vec![0u8; len];
    if let Err(e) = conn.recv_exact(&mut body) {
        log::debug!("data connection: hello: {e}");
        return false;
    }
    let own = &inner.identity.instance;
    let expected = hello::decode_body(&body);
    if let Err(e) = conn.send_all(&hello::encode_reply(own)) {
        log::debug!("data connection: hello reply: {e}");
        return false;
    }
    match expected {
        Some(e) if e == *own => true,
        Some(e) => {
            log::info!("data connection: a peer expected engine instance {e} at this port (we are {own}); closing");
            false
        }
        None => {
            log::debug!("data connection: malformed hello body; closing");
            false
        }
    }
}

pub(super) fn serve_data(inner: &Inner, conn: &mut Conn, ticket: &super::super::budget::Ticket) {
    conn.set_spin(inner.settings.spin);
    conn.set_idle_timeout(inner.settings.idle_timeout);
    let mut pending_acks: Vec<u8> = Vec::with_capacity(256);
    let stopping = || inner.registry.stopping();
    // Only a connection's first request may be a hello (a connection served
    // from the readiness loop may have been parked after it).
    let mut first = !conn.resumed();
    loop {
        let header = match conn.recv_header_idle::<HEADER_LEN>(&stopping) {
            // Only a connection's first request may be a hello.
            Ok(Some(h)) if first && hello::is_hello(&h) => {
                first = false;
                if answer_hello(inner, conn, &h) {
                    continue;
                }
                break;
            }
            Ok(Some(h)) => RequestHeader::decode(&h),
            Ok(None) => break,
            Err(e) => {
                log::debug!("data connection: {e}");
                break;
            }
        };
        first = false;
        // In flight: never evicted until served.
        ticket.set_busy(true);
        let _idle_again = IdleAgain(ticket);
        // Held (and the connection listed with it) while the memory is
        // touched, so unregistering can shut this connection and wait.
        let hold = inner.regions.lookup(header.addr, header.size).and_then(|r| r.hold(conn.raw_fd()));
        let Some(hold) = hold else {
            log::debug!(
                "data connection: rejecting {:?} of {} bytes at {:#x}: not inside one registered region",
                header.direction,
                header.size,
                header.addr
            );
            Stats::bump(&inner.stats.requests_refused);
            if header.acknowledged {
                pending_acks.extend_from_slice(&wire::encode_status(wire::STATUS_REJECTED));
                let _ = conn.send_all(&pending_acks);
            }
            break;
        };
        let region = hold.region();
        let revoked = || region.is_revoked() || inner.registry.stopping();
        if let Some(dev) = region.device.clone() {
            // Device memory: staged, never touched by the CPU.
            let served = super::super::staging::serve_device(inner, conn, &dev, &header, &mut pending_acks, &revoked);
            drop(hold);
            if !served {
                break;
            }
            continue;
        }
        let size = header.size as usize;
        let ptr = header.addr as *mut u8;
        let served = match header.direction {
            Direction::Write => {
                // SAFETY: [addr, addr+size) lies in a registered region, held
                // (not unregistered) until `hold` drops; unregistering shuts
                // this connection down, which ends the call, and waits.
                unsafe { conn.recv_raw(ptr, size, &revoked) }.and_then(|()| {
                    if header.acknowledged {
                        pending_acks.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
                    }
                    // More pipelined requests already here: acknowledge later,
                    // in one send. The data has landed either way.
                    if conn.buffered() < HEADER_LEN || pending_acks.len() >= 4096 {
                        conn.send_all(&pending_acks)?;
                        pending_acks.clear();
                    }
                    Ok(())
                })
            }
            Direction::Read => {
                if header.acknowledged {
                    pending_acks.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
                }
                let first = size.min(MAX_IO_CHUNK);
                // SAFETY: as above, for reading.
                let mut result =
                    unsafe { conn.send_vectored(&[(pending_acks.as_ptr(), pending_acks.len()), (ptr, first)]) };
                pending_acks.clear();
                let mut done = first;
                while result.is_ok() && done < size {
                    if revoked() {
                        result = Err(io::Error::new(io::ErrorKind::Interrupted, "source region was unregistered"));
                        break;
                    }
                    let n = (size - done).min(MAX_IO_CHUNK);
                    // SAFETY: as above.
                    result = unsafe { conn.send_raw(ptr.add(done), n) };
                    done += n;
                }
                result
            }
        };
        drop(hold);
        if let Err(e) = served {
            log::debug!("data connection: {e}");
            break;
        }
        inner.stats.served(header.direction, header.size);
    }
}
