//! Serving the two listeners (bound in [`super::listen`]): the accept loop,
//! the handshake (RPC) port, one framed JSON request per connection, and the
//! data port, persistent connections carrying 24-byte requests. Everything a peer sends is bounded and checked;
//! a bad peer loses its connection, never the engine.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::conn::{Conn, MAX_IO_CHUNK};
use super::deadline::BoundedStream;
use super::wire::{self, FrameType, RequestHeader, HEADER_LEN};
use super::Inner;
use crate::transfer::stats::Stats;
use crate::transfer::Direction;

/// How long a handshake client may take to send its request.
const HANDSHAKE_SERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts an inbound connection as open while it lives.
struct OpenConnection<'a>(&'a Stats);

impl<'a> OpenConnection<'a> {
    fn new(stats: &'a Stats) -> Self {
        Stats::bump(&stats.inbound_connections);
        stats.inbound_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(stats)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.inbound_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which listener an accept loop serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Handshake,
    Data,
}

/// Logs accept failures at most once a second and backs off between them
/// (10 ms doubling to 1 s; reset by the next success).
#[derive(Default)]
struct AcceptBackoff {
    delay_ms: u64,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    fn failed(&mut self, e: &io::Error) {
        if self.last_log.is_none_or_elapsed(Duration::from_secs(1)) {
            log::warn!("accept failed: {e} ({} more failures not logged)", self.suppressed);
            self.last_log = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        self.delay_ms = (self.delay_ms * 2).clamp(10, 1000);
        std::thread::sleep(Duration::from_millis(self.delay_ms));
    }

    fn succeeded(&mut self) {
        self.delay_ms = 0;
    }
}

trait Elapsed {
    fn is_none_or_elapsed(&self, d: Duration) -> bool;
}

impl Elapsed for Option<Instant> {
    fn is_none_or_elapsed(&self, d: Duration) -> bool {
        self.map_or(true, |t| t.elapsed() >= d)
    }
}

/// Accept connections until the engine stops; one thread per admitted
/// connection (see [`super::budget`] for the caps and eviction).
pub fn accept_loop(inner: Arc<Inner>, listener: TcpListener, plane: Plane) {
    let mut backoff = AcceptBackoff::default();
    let name = match plane {
        Plane::Handshake => "pdx-handshake",
        Plane::Data => "pdx-data",
    };
    loop {
        let accepted = listener.accept();
        if inner.registry.stopping() {
            return;
        }
        let (stream, from) = match accepted {
            Ok(pair) => pair,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                backoff.failed(&e);
                continue;
            }
        };
        backoff.succeeded();
        let inner2 = inner.clone();
        let spawned = inner.registry.spawn(name.to_owned(), move || {
            let ip = from.ip();
            let _open = OpenConnection::new(&inner2.stats);
            match plane {
                Plane::Handshake => {
                    let mut stream = stream;
                    // Declared after the stream: dropped (unlisted) before it closes.
                    let Some(_ticket) = inner2.budget.admit(plane, ip, stream.as_raw_fd()) else { return };
                    let Some(_tracked) = inner2.registry.track(&stream) else { return };
                    serve_handshake(&inner2, &mut stream);
                }
                Plane::Data => {
                    let t = inner2.settings.progress_timeout;
                    let Ok(mut conn) = Conn::new(stream, t, t) else { return };
                    let Some(ticket) = inner2.budget.admit(plane, ip, conn.raw_fd()) else { return };
                    let Some(_tracked) = inner2.registry.track(conn.stream()) else { return };
                    serve_data(&inner2, &mut conn, &ticket);
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("could not start a connection thread: {e}");
        }
    }
}

/// The reply a TCP-only engine gives to an RDMA-style connection request.
fn empty_handshake_desc() -> Value {
    json!({"local_gid": "", "local_lid": 0, "local_nic_path": "", "payload": "",
           "peer_nic_path": "", "qp_num": [], "reply_msg": ""})
}

fn serve_handshake(inner: &Inner, stream: &mut TcpStream) {
    let _ = stream.set_nodelay(true);
    // One deadline for the whole exchange: trickled bytes do not extend it.
    let mut stream = BoundedStream::new(stream, Instant::now() + HANDSHAKE_SERVE_TIMEOUT);
    let mut prefix = [0u8; 8];
    if stream.read_exact(&mut prefix).is_err() {
        return;
    }
    let Ok(length) = wire::check_frame_length(prefix, inner.settings.handshake_max_len) else {
        log::debug!("handshake: refused frame length {}", u64::from_le_bytes(prefix));
        return;
    };
    // Read incrementally, each chunk charged to the engine-wide budget of
    // handshake bytes in flight: memory grows only with bytes really sent.
    let charged = Charged { budget: &inner.budget, bytes: std::cell::Cell::new(0) };
    let mut body = Vec::with_capacity(length.min(64 * 1024));
    while body.len() < length {
        let chunk = (length - body.len()).min(64 * 1024);
        if !charged.charge(chunk) {
            log::debug!("handshake: the budget of handshake bytes in flight is spent; closing");
            return;
        }
        let start = body.len();
        body.resize(start + chunk, 0);
        if stream.read_exact(&mut body[start..]).is_err() {
            return;
        }
    }
    let (kind, json_text) = wire::split_frame_body(&body);
    let Ok(request) = serde_json::from_slice::<Value>(json_text) else {
        log::debug!("handshake: malformed JSON, closing");
        return;
    };
    let reply = match kind {
        FrameType::Metadata => super::descriptor::own(inner),
        FrameType::Probe => json!({"status": "success"}).to_string(),
        FrameType::Notify => {
            let name = request.get("name").and_then(Value::as_str);
            let msg = request.get("notify_msg").and_then(Value::as_str);
            let accepted = match (name, msg) {
                (Some(n), Some(m)) => inner.notifications.push(n, m),
                _ => false,
            };
            json!({"name": "", "notify_msg": if accepted { "success" } else { "" }}).to_string()
        }
        FrameType::Connection | FrameType::Old => empty_handshake_desc().to_string(),
    };
    if stream.write_all(&wire::encode_frame(kind, &reply)).is_err() {
        return;
    }
    drop(charged);
    Stats::bump(&inner.stats.handshakes);
    // Half-close, then let the client close first (bounded by the deadline).
    let _ = stream.inner().shutdown(Shutdown::Write);
    let mut sink = [0u8; 64];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// Handshake bytes charged to the budget, refunded when dropped.
struct Charged<'a> {
    budget: &'a super::budget::Budget,
    bytes: std::cell::Cell<usize>,
}

impl Charged<'_> {
    fn charge(&self, n: usize) -> bool {
        let ok = self.budget.charge_handshake(n);
        if ok {
            self.bytes.set(self.bytes.get() + n);
        }
        ok
    }
}

impl Drop for Charged<'_> {
    fn drop(&mut self) {
        self.budget.refund_handshake(self.bytes.get());
    }
}

/// Marks a data connection idle again when its request is done.
struct IdleAgain<'a>(&'a super::budget::Ticket);

impl Drop for IdleAgain<'_> {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

fn serve_data(inner: &Inner, conn: &mut Conn, ticket: &super::budget::Ticket) {
    conn.set_spin(inner.settings.spin);
    let mut pending_acks: Vec<u8> = Vec::with_capacity(256);
    let stopping = || inner.registry.stopping();
    loop {
        let header = match conn.recv_header_idle::<HEADER_LEN>(&stopping) {
            Ok(Some(h)) => RequestHeader::decode(&h),
            Ok(None) => break,
            Err(e) => {
                log::debug!("data connection: {e}");
                break;
            }
        };
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
            let served = super::staging::serve_device(inner, conn, &dev, &header, &mut pending_acks, &revoked);
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
