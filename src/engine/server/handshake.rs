//! The handshake (RPC) port: one framed JSON request per connection
//! (metadata, probe, notify, connection), answered under one deadline for
//! the whole exchange, its bytes charged to the engine's handshake budget.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::deadline::BoundedStream;
use super::super::wire::{self, FrameType};
use super::super::Inner;
use crate::transfer::stats::Stats;

/// How long a handshake client may take for its whole exchange.
const HANDSHAKE_SERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The reply a TCP-only engine gives to an RDMA-style connection request.
fn empty_handshake_desc() -> Value {
    json!({"local_gid": "", "local_lid": 0, "local_nic_path": "", "payload": "",
           "peer_nic_path": "", "qp_num": [], "reply_msg": ""})
}

pub(super) fn serve_handshake(inner: &Inner, stream: &mut TcpStream) {
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
        FrameType::Metadata => super::super::descriptor::own(inner),
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
    budget: &'a super::super::budget::Budget,
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
