//! The data port: persistent connections serving 24-byte requests in order,
//! each checked against the registered regions before memory is touched.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::super::memory::regions::Hold;
use super::super::net::conn::{Conn, Flow, Pace};
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

/// While its peer keeps pace, a request's payload keeps the pool thread
/// serving it: each time the socket has nothing to read (or no room to
/// send), the next [`FLOW_FLOOR`] bytes (the rest, if fewer) must move
/// within [`FLOW_WAIT`]. Past that the request is parked in the readiness
/// loop with what it holds ([`Pending`]) and the thread serves others; the
/// loop hands it back once that many bytes are queued (or there is room to
/// send). So a peer that trickles a payload (a byte every few seconds,
/// always inside the progress bound) holds a socket and a region, never a
/// thread, and one that streams never leaves its thread.
pub(super) const FLOW_WAIT: Duration = Duration::from_millis(20);

/// See [`FLOW_WAIT`].
pub(super) const FLOW_FLOOR: usize = 64 << 10;

/// A request its connection was parked in the middle of, waiting on its
/// peer (see [`FLOW_WAIT`]): where it stopped, the hold on its region (so
/// unregistering waits for it, and shuts its socket down to end it), and
/// the acknowledgements queued before it.
pub(super) struct Pending {
    acks: Acks,
    step: Step,
}

/// Where a request stopped.
enum Step {
    /// Receiving a write's payload into host memory: `done` bytes landed.
    Write { header: RequestHeader, hold: Hold, done: usize },
    /// Sending a read's answer: `head` (the acknowledgements queued before
    /// it, then its status), then its data; `sent` bytes of both went.
    Read { header: RequestHeader, hold: Hold, head: Vec<u8>, sent: usize },
    /// Sending acknowledgements: `sent` bytes of `out` went.
    Acks { out: Vec<u8>, sent: usize },
}

/// What a parked [`Pending`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaits {
    /// This many bytes queued to read (the socket's `SO_RCVLOWAT`).
    Bytes(usize),
    /// Room to send.
    Room,
}

impl Pending {
    /// What the connection waits for while parked.
    pub(super) fn awaits(&self) -> Awaits {
        match &self.step {
            Step::Write { header, done, .. } => Awaits::Bytes((header.size as usize - done).clamp(1, FLOW_FLOOR)),
            Step::Read { .. } | Step::Acks { .. } => Awaits::Room,
        }
    }
}

/// How a step of a request ended.
enum Stepped {
    /// The request is served (a write's acknowledgement queued in `acks`).
    Served,
    /// It goes on with another step (a write's acknowledgement to send).
    Then(Step),
    /// Its peer stopped keeping pace: it waits where it stopped.
    Stalled(Step),
}

/// Move the bytes of `step` while the peer keeps pace (from a readiness
/// loop; on a thread of its own, while it moves a byte per progress
/// timeout, as a blocking call would).
fn advance(inner: &Serving, conn: &mut Conn, acks: &mut Acks, step: Step) -> io::Result<Stepped> {
    let pace = if conn.parks_when_idle() {
        Pace { wait: FLOW_WAIT, floor: FLOW_FLOOR }
    } else {
        Pace { wait: inner.settings.progress_timeout.max(Duration::from_millis(1)), floor: 1 }
    };
    let stopping = || inner.registry.stopping();
    let stepped = match step {
        Step::Write { header, hold, mut done } => {
            let region = hold.region();
            let revoked = || region.is_revoked() || stopping();
            // SAFETY: [addr, addr+size) lies in a registered region, held
            // (not unregistered) until `hold` drops, parked or not;
            // unregistering shuts this connection down, which ends the
            // receive (or wakes the parked connection to end here), and waits.
            let flow =
                unsafe { conn.recv_flowing(header.addr as *mut u8, header.size as usize, &mut done, &revoked, pace) }?;
            if flow == Flow::Stalled {
                Stepped::Stalled(Step::Write { header, hold, done })
            } else {
                drop(hold);
                inner.stats.served(Direction::Write, header.size);
                // The data has landed: acknowledged now, or with the
                // pipelined requests already here.
                acks.ok(header.acknowledged);
                if acks.due(conn) {
                    Stepped::Then(Step::Acks { out: acks.take(), sent: 0 })
                } else {
                    Stepped::Served
                }
            }
        }
        Step::Read { header, hold, head, mut sent } => {
            let region = hold.region();
            let revoked = || region.is_revoked() || stopping();
            // SAFETY: as above, for reading.
            let flow = unsafe {
                conn.send_flowing(&head, header.addr as *const u8, header.size as usize, &mut sent, &revoked, pace)
            }?;
            if flow == Flow::Stalled {
                Stepped::Stalled(Step::Read { header, hold, head, sent })
            } else {
                drop(hold);
                inner.stats.served(Direction::Read, header.size);
                Stepped::Served
            }
        }
        Step::Acks { out, mut sent } => {
            // SAFETY: no data beyond `out` (an empty range).
            let flow = unsafe { conn.send_flowing(&out, out.as_ptr(), 0, &mut sent, &|| false, pace) }?;
            if flow == Flow::Stalled {
                Stepped::Stalled(Step::Acks { out, sent })
            } else {
                Stepped::Served
            }
        }
    };
    Ok(stepped)
}

/// Serve `step` to its end, or to where its peer stalls it (`Ok(Some)`:
/// from a readiness loop, the connection is parked with it).
fn finish(inner: &Serving, conn: &mut Conn, acks: &mut Acks, step: Step) -> io::Result<Option<Step>> {
    let mut step = step;
    loop {
        match advance(inner, conn, acks, step)? {
            Stepped::Served => return Ok(None),
            Stepped::Then(next) => step = next,
            Stepped::Stalled(_) if !conn.parks_when_idle() => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no progress before the deadline"));
            }
            Stepped::Stalled(at) => return Ok(Some(at)),
        }
    }
}

/// What a connection's next request is expected to bring, after `header`
/// (`buffered`: its payload bytes already read with it), for a thread that
/// waits for it (see `pool::EXPECT_WINDOW`): a small write whose header
/// came ahead of its payload (an initiator that writes them apart, one
/// request at a time: Mooncake's) is expected again, whole, as long as
/// the writes keep that size; anything else expects a header only.
fn next_expected(expected: usize, header: &RequestHeader, buffered: usize) -> usize {
    let size = header.size as usize;
    if header.direction != Direction::Write || size > FLOW_FLOOR {
        return HEADER_LEN;
    }
    if buffered < size || expected == HEADER_LEN + size {
        HEADER_LEN + size
    } else {
        HEADER_LEN
    }
}

/// Serve a data connection's requests in order, from where `resume` left
/// off if it was parked in the middle of one. Returns that request where
/// its peer stopped keeping pace (the pool parks the connection with it);
/// `None` when the connection is idle ([`Conn::parked`]) or done. `held`
/// is told when the thread is inside work that cannot be parked and whose
/// wait a remote peer can stretch (a hello awaiting the proof of the peer
/// secret, a device request), and when it is out again. Same-host requests
/// and the same-host challenge are not told: only a process on this host
/// that the kernel says holds the connection gets that far. `expect`:
/// what the next request likely brings, kept up to date ([`next_expected`]).
pub(super) fn serve_data(
    inner: &Serving,
    conn: &mut Conn,
    ticket: &super::budget::Ticket,
    resume: Option<Pending>,
    held: &dyn Fn(bool),
    expect: &mut usize,
) -> Option<Pending> {
    conn.set_spin(inner.settings.spin);
    conn.set_idle_timeout(inner.settings.idle_timeout);
    let stopping = || inner.registry.stopping();
    // Only a connection's first request may be a hello (a connection served
    // from the readiness loop may have been parked after it).
    let mut first = resume.is_none() && !conn.resumed();
    let mut acks = Acks::default();
    if let Some(p) = resume {
        acks = p.acks;
        match finish(inner, conn, &mut acks, p.step) {
            Ok(None) => ticket.set_busy(false),
            Ok(Some(step)) => return Some(Pending { acks, step }),
            Err(e) => {
                log::debug!("data connection: {e}");
                return None;
            }
        }
    }
    // The same-host link, once accepted.
    let mut same_host = conn.extension::<TargetLink>();
    loop {
        let header = match conn.recv_header_idle::<HEADER_LEN>(&stopping) {
            // Only a connection's first request may be a hello.
            Ok(Some(h)) if first && hello::is_hello(&h) => {
                first = false;
                // In flight, then served: never evicted as a stranger again.
                ticket.set_busy(true);
                // With a peer secret the initiator's proof is awaited here
                // (for a short bound): a wait any stranger can stretch.
                let proving = inner.access.secret.is_some();
                held(proving);
                let hello = answer_hello(inner, conn, &h);
                held(false);
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
                *expect = HEADER_LEN;
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
        *expect = next_expected(*expect, &header, conn.buffered());
        // In flight: never evicted until served (parked in the middle of
        // it, too).
        ticket.set_busy(true);
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
        if let Some(dev) = hold.region().device.clone() {
            // Device memory: staged, never touched by the CPU.
            let _idle_again = IdleAgain(ticket);
            let region = hold.region();
            let revoked = || region.is_revoked() || inner.registry.stopping();
            let io = super::device::Inbound { conn: &mut *conn, acks: &mut acks, revoked: &revoked };
            held(true);
            let served = super::device::serve_device(inner, &dev, &header, io);
            held(false);
            drop(hold);
            if !served {
                break;
            }
            continue;
        }
        let step = match header.direction {
            Direction::Write => Step::Write { header, hold, done: 0 },
            Direction::Read => {
                // Its status (and the acknowledgements before it) go out
                // with its data.
                acks.ok(header.acknowledged);
                Step::Read { header, hold, head: acks.take(), sent: 0 }
            }
        };
        match finish(inner, conn, &mut acks, step) {
            Ok(None) => ticket.set_busy(false),
            Ok(Some(step)) => return Some(Pending { acks, step }),
            Err(e) => {
                log::debug!("data connection: {e}");
                break;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(direction: Direction, size: usize) -> RequestHeader {
        RequestHeader { size: size as u64, addr: 0x1000, direction, acknowledged: true }
    }

    /// A small write whose payload came after its header is expected again
    /// whole, while the writes keep that size; whatever else comes expects
    /// a header only.
    #[test]
    fn a_small_write_ahead_of_its_payload_is_expected_again() {
        let w = header(Direction::Write, 64 << 10);
        let whole = HEADER_LEN + (64 << 10);
        assert_eq!(next_expected(HEADER_LEN, &w, 0), whole, "the header came alone");
        assert_eq!(next_expected(whole, &w, 64 << 10), whole, "it came whole, as expected");
        assert_eq!(next_expected(HEADER_LEN, &w, 64 << 10), HEADER_LEN, "written together: nothing to wait for");
        assert_eq!(next_expected(whole, &header(Direction::Write, 4096), 4096), HEADER_LEN, "another size");
        assert_eq!(next_expected(whole, &header(Direction::Read, 64 << 10), 0), HEADER_LEN, "a read");
        assert_eq!(next_expected(HEADER_LEN, &header(Direction::Write, FLOW_FLOOR + 1), 0), HEADER_LEN, "not small");
    }
}
