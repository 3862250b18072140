//! The handshake (RPC) port: one framed JSON request per connection
//! (metadata, probe, notify, connection), answered under one deadline for
//! the whole exchange, its frame's bytes charged to the engine's handshake
//! budget as they arrive (see [`super::budget`]).

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use polling::{Event, Events, Poller};
use serde_json::{json, Value};

use super::super::net::deadline::BoundedStream;
use super::super::protocol::auth::{AuthStep, ServerAuth};
use super::super::protocol::notify;
use super::super::protocol::wire::{self, FrameType};
use super::super::registry::OwnedSocketGuard;
use super::budget::{Charge, Ticket};
use super::pool::OpenData;
use super::Serving;
use crate::transfer::stats::Stats;

/// How long a handshake client may take for its whole exchange.
const HANDSHAKE_SERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The reply a TCP-only engine gives to an RDMA-style connection request.
fn empty_handshake_desc() -> Value {
    json!({"local_gid": "", "local_lid": 0, "local_nic_path": "", "payload": "",
           "peer_nic_path": "", "qp_num": [], "reply_msg": ""})
}

/// The most a single read of a handshake frame takes in (a buffer on the
/// serving thread's stack; the frame's own buffer grows with what arrived).
const READ_CHUNK: usize = 16 * 1024;

pub(super) fn serve_handshake(serving: &Serving, stream: &mut TcpStream, ticket: &Ticket) {
    let _ = stream.set_nodelay(true);
    // One deadline for the whole exchange: trickled bytes do not extend it.
    let deadline = Instant::now() + HANDSHAKE_SERVE_TIMEOUT;
    let mut stream = BoundedStream::new(stream, deadline);
    let Some(mut body) = read_frame(serving, &mut stream, ticket, deadline) else { return };
    if let Some(secret) = &serving.access.secret {
        // One frame charged at a time: the one before is done with.
        let read_next = |s: &mut BoundedStream<'_>| {
            ticket.release_handshake();
            read_frame(serving, s, ticket, deadline)
        };
        match super::super::protocol::auth::server_handshake(&mut stream, secret, &body, read_next) {
            Ok(request) => body = request,
            Err(why) => {
                Stats::bump(&serving.stats.connections_refused_auth);
                if let Ok(peer) = stream.inner().peer_addr() {
                    serving.access.log_refusal(peer.ip(), why);
                }
                return;
            }
        }
    }
    let reply = reply_to(serving, &body);
    drop(body);
    ticket.release_handshake();
    let Some(reply) = reply else { return };
    if stream.write_all(&reply).is_err() {
        return;
    }
    Stats::bump(&serving.stats.handshakes);
    ticket.settle();
    // Half-close, then let the client close first (bounded by the deadline).
    let _ = stream.inner().shutdown(Shutdown::Write);
    let mut sink = [0u8; 64];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// Read one frame: its length prefix, then its body, charged to the
/// handshake budget until the caller releases it.
fn read_frame(serving: &Serving, stream: &mut impl Read, ticket: &Ticket, deadline: Instant) -> Option<Vec<u8>> {
    let mut prefix = [0u8; 8];
    stream.read_exact(&mut prefix).ok()?;
    let Ok(length) = wire::check_frame_length(prefix, serving.settings.handshake_max_len) else {
        log::debug!("handshake: refused frame length {}", u64::from_le_bytes(prefix));
        return None;
    };
    read_frame_body(stream, length, ticket, deadline)
}

/// Read a frame body of `length` bytes as they come, each read's bytes
/// charged to the engine-wide budget once they have arrived (never the
/// announced length): the buffer grows with them (at most doubling, never
/// past `length`). `None` if the peer stops, the deadline passes, or this
/// connection lost its place in the budget to a faster one.
fn read_frame_body(stream: &mut impl Read, length: usize, ticket: &Ticket, deadline: Instant) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut chunk = [0u8; READ_CHUNK];
    while body.len() < length {
        let want = (length - body.len()).min(READ_CHUNK);
        let n = match stream.read(&mut chunk[..want]) {
            Ok(0) => return None,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        if !ticket.charge_handshake(n, deadline) {
            log::debug!("handshake: closed to keep the handshake byte budget (evicted or past its deadline)");
            return None;
        }
        if body.capacity() - body.len() < n {
            let grown = (body.capacity() * 2).max(body.len() + n).max(1024).min(length);
            body.reserve_exact(grown - body.len());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(body)
}

/// How often the loop closes connections past their deadline, and retries
/// charges told to wait.
const LOOP_TICK: Duration = Duration::from_millis(20);

/// Handshake connections served by one thread over a readiness loop: each
/// frame is assembled from what has arrived (its bytes charged to the
/// handshake budget before they are taken from the socket), and a complete
/// frame is answered there, so the threads serving handshakes are one
/// however many peers connect or trickle bytes at once.
pub(super) struct HandshakePlane {
    serving: Arc<Serving>,
    poller: Poller,
    incoming: Mutex<Vec<Shake>>,
    next_key: AtomicUsize,
}

/// Where a connection is in its exchange.
enum Stage {
    /// Reading a frame's length prefix (not charged: 8 bytes).
    Prefix { prefix: [u8; 8], got: usize },
    /// Reading a frame's body of `length` bytes, charged as taken.
    Body { length: usize, body: Vec<u8> },
    /// Sending `out`; then `then`.
    Send { out: Vec<u8>, sent: usize, then: AfterSend },
    /// Replied and half-closed: reading until the client closes.
    Drain,
}

/// What follows a send.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterSend {
    /// The next frame of an authenticated exchange.
    NextFrame,
    /// The reply: half-close and drain.
    Replied,
    Close,
}

/// Authentication state of a connection.
enum Auth {
    /// No peer secret: the first frame is the request.
    Off,
    /// The first frame opens the authentication.
    First,
    Started(ServerAuth),
}

/// A handshake connection on the loop. Fields drop in order: the ticket
/// and the registry entry (both name the descriptor) before the socket
/// closes.
pub(super) struct Shake {
    ticket: Ticket,
    _tracked: OwnedSocketGuard,
    _open: OpenData,
    stream: TcpStream,
    deadline: Instant,
    stage: Stage,
    auth: Auth,
}

/// What the loop does with a connection after serving what it could.
enum Next {
    Read,
    Write,
    /// Charge told to wait: asked again next tick.
    Wait,
    Close,
}

impl HandshakePlane {
    /// The loop, on a thread of its own.
    pub(super) fn start(serving: &Arc<Serving>) -> io::Result<Arc<HandshakePlane>> {
        let plane = Arc::new(HandshakePlane {
            serving: serving.clone(),
            poller: Poller::new()?,
            incoming: Mutex::new(Vec::new()),
            next_key: AtomicUsize::new(1),
        });
        let me = plane.clone();
        serving.registry.spawn("pdx-handshake".to_owned(), move || me.run())?;
        Ok(plane)
    }

    /// Wake the loop (a connection came, or the engine stops).
    pub(super) fn wake(&self) {
        let _ = self.poller.notify();
    }

    /// Hand an admitted connection to the loop.
    pub(super) fn admit(&self, ticket: Ticket, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let Some(tracked) = self.serving.registry.track_owned(&stream) else { return };
        let auth = if self.serving.access.secret.is_some() { Auth::First } else { Auth::Off };
        let shake = Shake {
            ticket,
            _tracked: tracked,
            _open: OpenData::new(&self.serving.stats),
            stream,
            // One deadline for the whole exchange: trickled bytes do not extend it.
            deadline: Instant::now() + HANDSHAKE_SERVE_TIMEOUT,
            stage: Stage::Prefix { prefix: [0; 8], got: 0 },
            auth,
        };
        self.incoming.lock().push(shake);
        self.wake();
    }

    fn run(self: Arc<Self>) {
        let mut conns: HashMap<usize, Shake> = HashMap::new();
        let mut waiting: Vec<usize> = Vec::new();
        let mut events = Events::new();
        let mut next_tick = Instant::now() + LOOP_TICK;
        loop {
            if self.serving.registry.stopping() {
                for (_, c) in conns.drain() {
                    self.close(c);
                }
                self.incoming.lock().clear();
                return;
            }
            let arrived: Vec<Shake> = std::mem::take(&mut *self.incoming.lock());
            for c in arrived {
                let key = self.next_key.fetch_add(1, Ordering::Relaxed);
                // SAFETY: the descriptor stays open until `close` deletes it
                // from the poller (every connection leaves through `close`).
                match unsafe { self.poller.add(&c.stream, Event::readable(key)) } {
                    Ok(()) => {
                        conns.insert(key, c);
                    }
                    Err(e) => log::warn!("handshake connection: cannot register with the readiness loop: {e}"),
                }
            }
            let now = Instant::now();
            let mut ready: Vec<usize> = Vec::new();
            if now >= next_tick {
                next_tick = now + LOOP_TICK;
                let late: Vec<usize> = conns.iter().filter(|(_, c)| now >= c.deadline).map(|(k, _)| *k).collect();
                for key in late {
                    if let Some(c) = conns.remove(&key) {
                        log::debug!("handshake: closed at its deadline");
                        self.close(c);
                    }
                }
                waiting.retain(|k| conns.contains_key(k));
                ready.append(&mut waiting);
            }
            events.clear();
            let timeout = if ready.is_empty() { next_tick.saturating_duration_since(now) } else { Duration::ZERO };
            if let Err(e) = self.poller.wait(&mut events, Some(timeout)) {
                log::warn!("handshake connections: readiness wait failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            ready.extend(events.iter().map(|e| e.key));
            for key in ready {
                let Some(c) = conns.get_mut(&key) else { continue };
                let interest = match self.advance(c) {
                    Next::Read => Event::readable(key),
                    Next::Write => Event::writable(key),
                    Next::Wait => {
                        waiting.push(key);
                        continue;
                    }
                    Next::Close => {
                        if let Some(c) = conns.remove(&key) {
                            self.close(c);
                        }
                        continue;
                    }
                };
                if let Err(e) = self.poller.modify(&c.stream, interest) {
                    log::debug!("handshake connection: cannot re-arm: {e}");
                    if let Some(c) = conns.remove(&key) {
                        self.close(c);
                    }
                }
            }
        }
    }

    /// Close a connection (deleted from the poller first); its ticket gives
    /// back what it held.
    fn close(&self, c: Shake) {
        let _ = self.poller.delete(&c.stream);
        if let Auth::Started(auth) = &c.auth {
            // It left (or ran out of time) in the middle of authenticating.
            self.refused(&c, auth.missing());
        }
        drop(c);
    }

    /// Count and log a connection refused for not proving the secret.
    fn refused(&self, c: &Shake, why: &str) {
        Stats::bump(&self.serving.stats.connections_refused_auth);
        if let Ok(peer) = c.stream.peer_addr() {
            self.serving.access.log_refusal(peer.ip(), why);
        }
    }

    /// Serve what has arrived and send what is due, until the socket would
    /// block or the exchange ends.
    fn advance(&self, c: &mut Shake) -> Next {
        loop {
            if Instant::now() >= c.deadline {
                return Next::Close;
            }
            match &mut c.stage {
                Stage::Prefix { prefix, got } => match recv(&c.stream, &mut prefix[*got..]) {
                    Ok(0) => return Next::Close,
                    Ok(n) => {
                        *got += n;
                        c.ticket.note_progress();
                        if *got == prefix.len() {
                            let Ok(length) = wire::check_frame_length(*prefix, self.serving.settings.handshake_max_len)
                            else {
                                log::debug!("handshake: refused frame length {}", u64::from_le_bytes(*prefix));
                                return Next::Close;
                            };
                            c.stage = Stage::Body { length, body: Vec::new() };
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Read,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return Next::Close,
                },
                Stage::Body { length, body } => {
                    if body.len() < *length {
                        let arrived = match readable_bytes(&c.stream) {
                            Ok(0) => {
                                // Nothing queued: the end of the stream, an
                                // error, or not yet (a peek tells which).
                                match recv_peek(&c.stream) {
                                    Ok(0) => return Next::Close,
                                    Ok(_) => continue,
                                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Read,
                                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                                    Err(_) => return Next::Close,
                                }
                            }
                            Ok(n) => n,
                            Err(_) => return Next::Close,
                        };
                        let want = arrived.min(*length - body.len()).min(READ_CHUNK);
                        // Charged before they leave the socket: what this
                        // engine holds of a frame is always charged.
                        match c.ticket.try_charge_handshake(want) {
                            Charge::Charged => {}
                            Charge::Wait => return Next::Wait,
                            Charge::Refused => {
                                log::debug!("handshake: closed to keep the handshake byte budget (evicted)");
                                return Next::Close;
                            }
                        }
                        if body.capacity() - body.len() < want {
                            let grown = (body.capacity() * 2).max(body.len() + want).max(1024).min(*length);
                            body.reserve_exact(grown - body.len());
                        }
                        let start = body.len();
                        body.resize(start + want, 0);
                        let got = loop {
                            match recv(&c.stream, &mut body[start..]) {
                                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                                other => break other,
                            }
                        };
                        let got = got.unwrap_or(0);
                        body.truncate(start + got);
                        if got < want {
                            c.ticket.refund_handshake(want - got);
                        }
                        if got == 0 {
                            return Next::Close;
                        }
                        continue;
                    }
                    let body = std::mem::take(body);
                    c.stage = self.on_frame(c, body);
                }
                Stage::Send { out, sent, then } => {
                    match c.stream.write(&out[*sent..]) {
                        Ok(n) => {
                            *sent += n;
                            c.ticket.note_progress();
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Write,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => return Next::Close,
                    }
                    if *sent == out.len() {
                        match *then {
                            AfterSend::NextFrame => c.stage = Stage::Prefix { prefix: [0; 8], got: 0 },
                            AfterSend::Replied => {
                                Stats::bump(&self.serving.stats.handshakes);
                                // Half-close, then let the client close first
                                // (bounded by the deadline).
                                let _ = c.stream.shutdown(Shutdown::Write);
                                c.ticket.settle();
                                c.stage = Stage::Drain;
                            }
                            AfterSend::Close => return Next::Close,
                        }
                    }
                }
                Stage::Drain => {
                    let mut sink = [0u8; 64];
                    match recv(&c.stream, &mut sink) {
                        Ok(0) => return Next::Close,
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Read,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => return Next::Close,
                    }
                }
            }
        }
    }

    /// A complete frame: the next stage (a send of the challenge or reply).
    fn on_frame(&self, c: &mut Shake, body: Vec<u8>) -> Stage {
        let send = |out: Vec<u8>, then: AfterSend| Stage::Send { out, sent: 0, then };
        let secret = self.serving.access.secret.as_deref().unwrap_or_default();
        // One frame charged at a time: this one is done with.
        let request = match std::mem::replace(&mut c.auth, Auth::Off) {
            Auth::Off => body,
            Auth::First => {
                let started = ServerAuth::start(secret, &body);
                drop(body);
                c.ticket.release_handshake();
                return match started {
                    Ok((auth, challenge)) => {
                        c.auth = Auth::Started(auth);
                        send(challenge, AfterSend::NextFrame)
                    }
                    Err((error, why)) => {
                        self.refused(c, why);
                        send(error.unwrap_or_default(), AfterSend::Close)
                    }
                };
            }
            Auth::Started(auth) => match auth.on_frame(secret, body) {
                Ok(AuthStep::More(next)) => {
                    c.ticket.release_handshake();
                    c.auth = Auth::Started(next);
                    return Stage::Prefix { prefix: [0; 8], got: 0 };
                }
                Ok(AuthStep::Request(request)) => request,
                Err(why) => {
                    c.ticket.release_handshake();
                    self.refused(c, why);
                    return send(Vec::new(), AfterSend::Close);
                }
            },
        };
        let reply = reply_to(self.serving.as_ref(), &request);
        drop(request);
        c.ticket.release_handshake();
        match reply {
            Some(frame) => send(frame, AfterSend::Replied),
            None => send(Vec::new(), AfterSend::Close),
        }
    }
}

/// The reply frame to a request frame's body (`None`: malformed, close).
fn reply_to(serving: &Serving, body: &[u8]) -> Option<Vec<u8>> {
    let (kind, json_text) = wire::split_frame_body(body);
    let malformed = || {
        log::debug!("handshake: malformed JSON, closing");
        None
    };
    let reply = match kind {
        // A notification's strings are bytes, not always UTF-8: its own reader.
        FrameType::Notify => {
            let accepted = match notify::decode(json_text) {
                notify::Decoded::Note(note) => serving.notifications.push(note),
                notify::Decoded::Refused => false,
                notify::Decoded::Malformed => return malformed(),
            };
            json!({"name": "", "notify_msg": if accepted { "success" } else { "" }}).to_string()
        }
        _ if serde_json::from_slice::<Value>(json_text).is_err() => return malformed(),
        FrameType::Metadata => serving.dialer.own_descriptor(),
        FrameType::Probe => json!({"status": "success"}).to_string(),
        FrameType::Connection | FrameType::Old => empty_handshake_desc().to_string(),
    };
    Some(wire::encode_frame(kind, &reply))
}

/// One non-blocking receive.
fn recv(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut s = stream;
    s.read(buf)
}

/// Whether the stream has ended (`Ok(0)`), has a byte (`Ok(1)`), or would block.
fn recv_peek(stream: &TcpStream) -> io::Result<usize> {
    let mut byte = [0u8; 1];
    stream.peek(&mut byte)
}

/// Bytes queued to be read on the socket (`FIONREAD`).
fn readable_bytes(stream: &TcpStream) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: the fd is our open socket; FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        Ok(usize::try_from(n).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}
