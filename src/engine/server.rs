//! Serving the two listeners (bound in [`super::listen`]): the accept loop,
//! the handshake (RPC) port, one framed JSON request per connection, and the
//! data port, persistent connections carrying 24-byte requests. Everything a peer sends is bounded and checked;
//! a bad peer loses its connection, never the engine.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::conn::{Conn, MAX_IO_CHUNK};
use super::wire::{self, FrameType, RequestHeader, HEADER_LEN};
use super::Inner;
use crate::transfer::stats::Stats;
use crate::transfer::Direction;

/// How long a handshake client may take to send its request.
const HANDSHAKE_SERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts concurrent connections of one kind and refuses past a limit.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn take(counter: &'a AtomicUsize, limit: usize) -> Option<Slot<'a>> {
        if counter.fetch_add(1, Ordering::AcqRel) >= limit {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(counter))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

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
#[derive(Clone, Copy)]
pub enum Plane {
    Handshake,
    Data,
}

/// Accept connections until the engine stops; one thread per connection.
pub fn accept_loop(inner: Arc<Inner>, listener: TcpListener, plane: Plane) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if inner.registry.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                log::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (limit, name) = match plane {
            Plane::Handshake => (inner.settings.max_handshake_connections, "pdx-handshake"),
            Plane::Data => (inner.settings.max_data_connections, "pdx-data"),
        };
        if active.load(Ordering::Acquire) >= limit {
            log::warn!("refusing a connection: {limit} {name} connections already open");
            continue;
        }
        let inner2 = inner.clone();
        let active2 = active.clone();
        let spawned = inner.registry.spawn(name.to_owned(), move || {
            let Some(_slot) = Slot::take(&active2, limit) else { return };
            let Some(_tracked) = inner2.registry.track(&stream) else { return };
            let _open = OpenConnection::new(&inner2.stats);
            match plane {
                Plane::Handshake => serve_handshake(&inner2, stream),
                Plane::Data => serve_data(&inner2, stream),
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

fn serve_handshake(inner: &Inner, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(HANDSHAKE_SERVE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(HANDSHAKE_SERVE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut prefix = [0u8; 8];
    if stream.read_exact(&mut prefix).is_err() {
        return;
    }
    let Ok(length) = wire::check_frame_length(prefix, inner.settings.handshake_max_len) else {
        log::debug!("handshake: refused frame length {}", u64::from_le_bytes(prefix));
        return;
    };
    // Read incrementally: the allocation grows only with bytes really sent.
    let mut body = Vec::with_capacity(length.min(64 * 1024));
    if (&mut stream).take(length as u64).read_to_end(&mut body).is_err() || body.len() != length {
        return;
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
    Stats::bump(&inner.stats.handshakes);
    // Half-close, then let the client close first (bounded by the timeout).
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 64];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

fn serve_data(inner: &Inner, stream: TcpStream) {
    let t = inner.settings.progress_timeout;
    let Ok(mut conn) = Conn::new(stream, t, t) else { return };
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
        let Some(region) = inner.regions.lookup(header.addr, header.size) else {
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
        let revoked = || region.is_revoked() || inner.registry.stopping();
        if let Some(dev) = region.device.clone() {
            // Device memory: staged, never touched by the CPU.
            let served = super::staging::serve_device(inner, &mut conn, &dev, &header, &mut pending_acks, &revoked);
            drop(region);
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
                // (not unregistered) until `region` drops; `revoked` aborts if
                // unregistering starts.
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
        drop(region);
        if let Err(e) = served {
            log::debug!("data connection: {e}");
            break;
        }
        inner.stats.served(header.direction, header.size);
    }
}
