//! The data port: persistent connections serving 24-byte requests in order,
//! each checked against the registered regions before memory is touched.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::super::net::conn::{Conn, MAX_IO_CHUNK};
use super::super::protocol::hello;
use super::super::protocol::wire::{RequestHeader, HEADER_LEN};
use super::super::samehost::frames::is_link_header;
use super::super::samehost::negotiate;
use super::super::samehost::ring::TargetLink;
use super::acks::Acks;
use super::local::{serve_doorbell, LocalServing};
use super::Serving;
use crate::transfer::stats::Stats;
use crate::transfer::Direction;

/// How long a data connection's hello may wait for the initiator's proof
/// of the peer secret (an initiator sends it as soon as it has our reply).
const PROOF_WAIT: Duration = Duration::from_secs(2);

/// Marks a data connection idle again when its request is done.
struct IdleAgain<'a>(&'a super::budget::Ticket);

impl Drop for IdleAgain<'_> {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

/// How a connection goes on after its hello.
enum AfterHello {
    Close,
    /// Serve requests; with the same-host link when accepted.
    Serve(Option<Arc<TargetLink>>),
}

/// Answer a hello with our instance (and, to a same-host offer, our
/// answer); the connection serves requests if the initiator expects us.
fn answer_hello(inner: &Serving, conn: &mut Conn, header: &[u8; HEADER_LEN]) -> AfterHello {
    let Some(len) = hello::request_body_len(header) else {
        log::debug!("data connection: hello with a body length out of bounds; closing");
        return AfterHello::Close;
    };
    let mut body = vec![0u8; len];
    if let Err(e) = conn.recv_exact(&mut body) {
        log::debug!("data connection: hello: {e}");
        return AfterHello::Close;
    }
    let own = &inner.identity.instance;
    let mut request = hello::decode(&body).unwrap_or_default();
    // A hello for another instance (a reused port) is answered as without
    // a secret: the initiator learns its descriptor is stale.
    let for_us = request.instance.as_deref() == Some(own.as_str());
    if !for_us {
        request.same_host = None;
    }
    // The link granted, once an offer is checked.
    let mut link = None;
    let stream = conn.stream();
    let addrs = stream.peer_addr().and_then(|from| Ok((from, stream.local_addr()?))).map_err(|e| e.to_string());
    let enabled = inner.settings.same_host;
    let mut check = |offer: &Value, conn: Option<&mut Conn>| {
        let (answer, granted) = match conn {
            Some(conn) => {
                let challenge = &mut |nonce: &str| hello::challenge(conn, own, nonce);
                negotiate::answer(enabled, offer, addrs.clone(), Some(challenge))
            }
            None => negotiate::answer(enabled, offer, addrs.clone(), None),
        };
        link = granted.map(Arc::new);
        answer
    };
    if let (Some(secret), true) = (&inner.access.secret, for_us) {
        // Nothing of an offer is checked before the peer proves the secret,
        // which it sends at once: a stranger that does not holds this
        // thread for a short bound only.
        let _ = conn.stream().set_read_timeout(Some(PROOF_WAIT));
        let proven = hello::serve_data_hello(conn, secret, own, request, &mut check);
        let t = inner.settings.progress_timeout.max(Duration::from_millis(1));
        let _ = conn.stream().set_read_timeout(Some(t));
        return match proven {
            Ok(()) => AfterHello::Serve(link),
            Err(why) => {
                refused_unauthenticated(inner, conn, why);
                AfterHello::Close
            }
        };
    }
    let answer = request.same_host.take().map(|offer| check(&offer, Some(conn)));
    let reply = hello::Body { instance: Some(own.clone()), same_host_answer: answer, ..hello::Body::default() };
    if let Err(e) = conn.send_all(&hello::encode_reply_body(&reply)) {
        log::debug!("data connection: hello reply: {e}");
        return AfterHello::Close;
    }
    match request.instance {
        Some(e) if e == *own => AfterHello::Serve(link),
        Some(e) => {
            log::info!("data connection: a peer expected engine instance {e} at this port (we are {own}); closing");
            AfterHello::Close
        }
        None => {
            log::debug!("data connection: malformed hello body; closing");
            AfterHello::Close
        }
    }
}

/// Count and log (at most once a second per address) a data connection
/// closed because it did not prove the peer secret.
fn refused_unauthenticated(inner: &Serving, conn: &Conn, why: &str) {
    Stats::bump(&inner.stats.connections_refused_auth);
    if let Ok(peer) = conn.stream().peer_addr() {
        inner.access.log_refusal(peer.ip(), &format!("data port: {why}"));
    }
}

pub(super) fn serve_data(inner: &Serving, conn: &mut Conn, ticket: &super::budget::Ticket) {
    conn.set_spin(inner.settings.spin);
    conn.set_idle_timeout(inner.settings.idle_timeout);
    let mut acks = Acks::default();
    let stopping = || inner.registry.stopping();
    // Only a connection's first request may be a hello (a connection served
    // from the readiness loop may have been parked after it).
    let mut first = !conn.resumed();
    // The same-host link, once accepted.
    let mut same_host = conn.extension::<TargetLink>();
    loop {
        let header = match conn.recv_header_idle::<HEADER_LEN>(&stopping) {
            // Only a connection's first request may be a hello.
            Ok(Some(h)) if first && hello::is_hello(&h) => {
                first = false;
                // In flight, then served: never evicted as a stranger again.
                ticket.set_busy(true);
                let hello = answer_hello(inner, conn, &h);
                ticket.set_busy(false);
                match hello {
                    AfterHello::Serve(link) => {
                        same_host = link.clone();
                        conn.set_extension(link.map(|l| l as Arc<dyn Any + Send + Sync>));
                        continue;
                    }
                    AfterHello::Close => break,
                }
            }
            Ok(Some(h)) if is_link_header(&h) => {
                let Some(link) = same_host.as_deref() else {
                    log::debug!("data connection: a same-host request on a connection without the link; closing");
                    break;
                };
                ticket.set_busy(true);
                let _idle_again = IdleAgain(ticket);
                let cx = LocalServing {
                    regions: &inner.regions,
                    staging: &inner.staging,
                    stats: &inner.stats,
                    stopping: &stopping,
                };
                if serve_doorbell(&cx, conn, &mut acks, link, &h) {
                    continue;
                }
                break;
            }
            Ok(Some(_)) if first && inner.access.secret.is_some() => {
                refused_unauthenticated(inner, conn, "it sent a request without the pdx hello (a Mooncake peer)");
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
            acks.reject(conn, header.acknowledged);
            break;
        };
        let region = hold.region();
        let revoked = || region.is_revoked() || inner.registry.stopping();
        if let Some(dev) = region.device.clone() {
            // Device memory: staged, never touched by the CPU.
            let io = super::device::Inbound { conn: &mut *conn, acks: &mut acks, revoked: &revoked };
            let served = super::device::serve_device(inner, &dev, &header, io);
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
                    // The data has landed: acknowledged now, or with the
                    // pipelined requests already here.
                    acks.ok(header.acknowledged);
                    acks.flush_unless_pipelined(conn)
                })
            }
            Direction::Read => {
                acks.ok(header.acknowledged);
                let first = size.min(MAX_IO_CHUNK);
                // SAFETY: as above, for reading.
                let mut result = unsafe { acks.send_with(conn, &[(ptr.cast_const(), first)]) };
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
