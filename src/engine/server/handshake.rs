//! The handshake (RPC) port: one framed JSON request per connection
//! (metadata, probe, notify, connection), answered under one deadline for
//! the whole exchange, its frame's bytes charged to the engine's handshake
//! budget as they arrive (see [`super::super::budget`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::budget::Ticket;
use super::super::deadline::BoundedStream;
use super::super::wire::{self, FrameType};
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
        match super::super::auth::server_handshake(&mut stream, secret, &body, read_next) {
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
    let (kind, json_text) = wire::split_frame_body(&body);
    let parsed = serde_json::from_slice::<Value>(json_text);
    drop(body);
    ticket.release_handshake();
    let Ok(request) = parsed else {
        log::debug!("handshake: malformed JSON, closing");
        return;
    };
    let reply = match kind {
        FrameType::Metadata => serving.dialer.own_descriptor(),
        FrameType::Probe => json!({"status": "success"}).to_string(),
        FrameType::Notify => {
            let name = request.get("name").and_then(Value::as_str);
            let msg = request.get("notify_msg").and_then(Value::as_str);
            let accepted = match (name, msg) {
                (Some(n), Some(m)) => serving.notifications.push(n, m),
                _ => false,
            };
            json!({"name": "", "notify_msg": if accepted { "success" } else { "" }}).to_string()
        }
        FrameType::Connection | FrameType::Old => empty_handshake_desc().to_string(),
    };
    if stream.write_all(&wire::encode_frame(kind, &reply)).is_err() {
        return;
    }
    Stats::bump(&serving.stats.handshakes);
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
