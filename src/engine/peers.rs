//! Peers we initiate to: the handshake client, the
//! per-session descriptor cache (refreshed when a peer restarts under the
//! same name) and the pool of data connections ("lanes") per peer.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};
use serde_json::Value;

use super::conn::Conn;
use super::deadline::{BoundedStream, Progress, Stall};
use super::descriptor::{parse_descriptor, PeerDescriptor};
use super::registry::OwnedSocketGuard;
use super::settings::Settings;
use super::wire::{self, FrameType};
use super::Inner;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::host::{parse_session, SessionAddr};

/// Resolve `host:port` within `timeout`. An IP literal needs no lookup; a
/// name is looked up on a helper thread we stop waiting for at the
/// timeout (a silent resolver cannot hold a transfer past it; the helper
/// ends when the system resolver gives up).
fn resolve(host: &str, port: u16, timeout: std::time::Duration) -> Result<Vec<SocketAddr>> {
    resolve_with(host, port, timeout, |name, port| (name.as_str(), port).to_socket_addrs().map(Iterator::collect))
}

/// [`resolve`] with the name lookup given (the system resolver in pdx; a
/// silent one in the tests).
fn resolve_with(
    host: &str,
    port: u16,
    timeout: std::time::Duration,
    lookup: impl FnOnce(String, u16) -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_owned();
    let spawned =
        std::thread::Builder::new().name("pdx-resolve".into()).spawn(move || drop(tx.send(lookup(name, port))));
    if let Err(e) = spawned {
        return Err(Error::new(ErrorKind::PeerUnreachable, format!("cannot resolve {host}: {e}")));
    }
    let addrs = match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => return Err(Error::new(ErrorKind::PeerUnreachable, format!("cannot resolve {host}: {e}"))),
        Err(_) => {
            return Err(Error::new(
                ErrorKind::PeerUnreachable,
                format!("cannot resolve {host}: no answer within the connect timeout ({timeout:?})"),
            ))
        }
    };
    if addrs.is_empty() {
        return Err(Error::new(ErrorKind::PeerUnreachable, format!("{host} resolves to no address")));
    }
    Ok(addrs)
}

/// Connect to `host:port` within the connect timeout, trying each address.
pub fn connect(settings: &Settings, host: &str, port: u16) -> Result<TcpStream> {
    let mut last = String::new();
    for addr in resolve(host, port, settings.connect_timeout)? {
        match TcpStream::connect_timeout(&addr, settings.connect_timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let e = Error::new(ErrorKind::PeerUnreachable, format!("cannot connect to {host}:{port} ({last})"));
    log::debug!("{e}");
    Err(e)
}

/// One handshake exchange: send `json` as a `kind` frame, return the reply
/// body. The whole exchange (connect excluded) has one deadline, the
/// handshake timeout or `by` if sooner. The connection is closed at once
/// (Mooncake serves handshakes one at a time, so lingering would stall its
/// other clients).
pub fn exchange_by(
    inner: &Inner,
    addr: &SessionAddr,
    kind: FrameType,
    json: &str,
    by: Option<Instant>,
) -> Result<Vec<u8>> {
    let settings = &inner.settings;
    let mut stream = connect(settings, &addr.host, addr.port)?;
    // Tracked so that stopping the engine interrupts a peer that never answers.
    let _tracked =
        inner.registry.track(&stream).ok_or_else(|| Error::new(ErrorKind::Shutdown, "engine is shutting down"))?;
    let where_ = format!("handshake with {}:{}", addr.host, addr.port);
    let mut deadline = Instant::now() + settings.handshake_timeout;
    if let Some(by) = by {
        deadline = deadline.min(by);
    }
    let io_err = |e: std::io::Error| {
        if inner.registry.stopping() {
            return Error::new(ErrorKind::Shutdown, format!("{where_}: engine is shutting down"));
        }
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            return Error::timeout(format!("{where_}: no complete reply within {:?}", settings.handshake_timeout));
        }
        Error::new(ErrorKind::PeerUnreachable, format!("{where_}: {e}"))
    };
    stream.set_nodelay(true).map_err(io_err)?;
    let mut bounded = BoundedStream::new(&mut stream, deadline);
    bounded.write_all(&wire::encode_frame(kind, json)).map_err(io_err)?;
    let mut prefix = [0u8; 8];
    bounded.read_exact(&mut prefix).map_err(io_err)?;
    let length = wire::check_frame_length(prefix, settings.handshake_max_len)
        .map_err(|e| Error::protocol(format!("{where_}: reply length refused ({e:?})")))?;
    let mut body = Vec::with_capacity(length.min(64 * 1024));
    (&mut bounded).take(length as u64).read_to_end(&mut body).map_err(io_err)?;
    if body.len() != length {
        return Err(Error::new(ErrorKind::ConnectionLost, format!("{where_}: reply truncated")));
    }
    let (got, json) = wire::split_frame_body(&body);
    if got != kind {
        return Err(Error::protocol(format!("{where_}: reply type {got:?} does not match request {kind:?}")));
    }
    Ok(json.to_vec())
}

/// [`exchange_by`] bounded by the handshake timeout alone.
pub fn exchange(inner: &Inner, addr: &SessionAddr, kind: FrameType, json: &str) -> Result<Vec<u8>> {
    exchange_by(inner, addr, kind, json, None)
}

/// Send a JSON request and parse the JSON reply.
pub fn exchange_json(inner: &Inner, addr: &SessionAddr, kind: FrameType, json: &str) -> Result<Value> {
    let body = exchange(inner, addr, kind, json)?;
    serde_json::from_slice(&body)
        .map_err(|e| Error::protocol(format!("malformed JSON reply from {}:{}: {e}", addr.host, addr.port)))
}

/// A peer we send to, by session name.
pub struct Peer {
    pub session: String,
    addr: SessionAddr,
    descriptor: RwLock<Arc<PeerDescriptor>>,
    /// When bytes last moved to or from this peer (the tasks' stall clock).
    pub progress: Arc<Progress>,
    lanes: Mutex<LaneState>,
    lane_freed: Condvar,
}

#[derive(Default)]
struct LaneState {
    idle: Vec<Lane>,
    open: usize,
}

/// A data connection to a peer, tracked for shutdown.
pub struct Lane {
    /// Declared first: dropped (unlisted) before `conn` closes the socket.
    _tracked: OwnedSocketGuard,
    pub conn: Conn,
    /// Protocol version of the descriptor the lane was opened under.
    pub proto_version: u64,
}

impl Peer {
    /// The descriptor currently cached.
    pub fn descriptor(&self) -> Arc<PeerDescriptor> {
        self.descriptor.read().clone()
    }

    fn fetch(inner: &Inner, addr: &SessionAddr, session: &str) -> Result<PeerDescriptor> {
        let body = exchange(inner, addr, FrameType::Metadata, &super::descriptor::own(inner))
            .map_err(|e| e.context(format!("cannot open session {session}")))?;
        parse_descriptor(&body, session, &addr.host)
    }

    /// Fetch the descriptor again (the peer may have restarted with new ports).
    pub fn refresh(&self, inner: &Inner) -> Result<Arc<PeerDescriptor>> {
        let fresh = Arc::new(Self::fetch(inner, &self.addr, &self.session)?);
        *self.descriptor.write() = fresh.clone();
        Ok(fresh)
    }

    /// Refuse a request of `longest` bytes when it is longer than every
    /// region the peer advertised (after one refresh: the cached
    /// descriptor may predate a larger registration).
    pub fn check_fits(&self, inner: &Inner, longest: usize) -> Result<()> {
        let desc = self.descriptor();
        match super::limits::largest_advertised(&desc) {
            Some(largest) if longest as u64 > largest => {}
            _ => return Ok(()),
        }
        let fresh = self.refresh(inner)?;
        match super::limits::largest_advertised(&fresh) {
            Some(largest) if longest as u64 > largest => {
                Err(super::limits::over_peer_region_error(&self.session, longest, largest))
            }
            _ => Ok(()),
        }
    }

    fn open_lane(&self, inner: &Inner) -> Result<Lane> {
        let mut desc = self.descriptor();
        let stream = match connect(&inner.settings, &desc.data_host, desc.data_port) {
            Ok(s) => s,
            Err(first) => {
                // A peer that restarted under the same name has new ports.
                let fresh = self.refresh(inner).map_err(|_| first.clone())?;
                if (fresh.data_host.as_str(), fresh.data_port) == (desc.data_host.as_str(), desc.data_port) {
                    return Err(first);
                }
                desc = fresh;
                connect(&inner.settings, &desc.data_host, desc.data_port)?
            }
        };
        let s = &inner.settings;
        let stall = Stall::new(self.progress.clone());
        let mut conn = Conn::paced(stream, stall, s.progress_timeout, recv_limit(s))
            .map_err(|e| Error::io(format!("configuring a data connection: {e}")))?;
        conn.set_spin(s.spin);
        let tracked = inner
            .registry
            .track_owned(conn.stream())
            .ok_or_else(|| Error::new(ErrorKind::Shutdown, "engine is shutting down"))?;
        // The protocol version of the descriptor this lane was opened from.
        Ok(Lane { conn, proto_version: desc.proto_version, _tracked: tracked })
    }

    /// A lane to this peer: an idle live one, a new one while under the
    /// per-peer limit, or the next one released (bounded wait: the lane
    /// wait timeout, and the task's stall clock while the peer is silent).
    pub fn acquire(&self, inner: &Inner, stall: &Stall) -> Result<Lane> {
        let deadline = Instant::now() + inner.settings.lane_wait_timeout;
        let limit = recv_limit(&inner.settings);
        let mut state = self.lanes.lock();
        loop {
            if stall.expired(limit) {
                return Err(stalled(&self.session, limit));
            }
            if inner.registry.stopping() {
                return Err(Error::new(ErrorKind::Shutdown, "engine is shutting down"));
            }
            while let Some(lane) = state.idle.pop() {
                if lane.conn.idle_and_alive() {
                    return Ok(lane);
                }
                state.open -= 1; // closed by the peer while idle
            }
            if state.open < inner.settings.lanes_per_peer {
                state.open += 1;
                drop(state);
                let lane = self.open_lane(inner);
                if lane.is_err() {
                    self.lanes.lock().open -= 1;
                    self.lane_freed.notify_one();
                }
                return lane;
            }
            let wake = deadline.min(Instant::now() + super::deadline::SLICE);
            if self.lane_freed.wait_until(&mut state, wake).timed_out() && Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "no free connection to {} within {:?}",
                    self.session, inner.settings.lane_wait_timeout
                )));
            }
        }
    }

    /// Give a lane back: pooled if it ended cleanly, closed otherwise.
    pub fn release(&self, lane: Lane, clean: bool) {
        let mut state = self.lanes.lock();
        if clean {
            state.idle.push(lane);
        } else {
            state.open -= 1;
            lane.conn.shutdown();
        }
        drop(state);
        self.lane_freed.notify_one();
    }
}

/// How long a task may wait for any byte from its peer: the progress
/// bound, or the acknowledgement bound if shorter.
pub fn recv_limit(s: &Settings) -> std::time::Duration {
    s.progress_timeout.min(s.status_timeout)
}

/// The error of a task whose peer made no progress for `limit`.
pub fn stalled(session: &str, limit: std::time::Duration) -> Error {
    Error::timeout(format!("{session} made no progress for {limit:?}"))
}

/// The descriptor cache: one [`Peer`] per session name.
#[derive(Default)]
pub struct Peers {
    map: Mutex<HashMap<String, Arc<Peer>>>,
}

impl Peers {
    /// Wake every thread waiting for a lane (they see the stop and leave).
    /// Peers with a known descriptor.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn wake_all(&self) {
        for p in self.map.lock().values() {
            let _guard = p.lanes.lock();
            p.lane_freed.notify_all();
        }
    }

    /// The peer for `session` if its descriptor is cached.
    pub fn cached(&self, session: &str) -> Option<Arc<Peer>> {
        self.map.lock().get(session).cloned()
    }

    /// The peer for `session`, opening it (one Metadata exchange) on first use.
    pub fn get(&self, inner: &Inner, session: &str) -> Result<Arc<Peer>> {
        if let Some(p) = self.map.lock().get(session) {
            return Ok(p.clone());
        }
        let addr = parse_session(session, inner.settings.default_handshake_port)?;
        let desc = Peer::fetch(inner, &addr, session)?;
        let peer = Arc::new(Peer {
            session: session.to_owned(),
            addr,
            descriptor: RwLock::new(Arc::new(desc)),
            progress: Arc::new(Progress::default()),
            lanes: Mutex::new(LaneState::default()),
            lane_freed: Condvar::new(),
        });
        Ok(self.map.lock().entry(session.to_owned()).or_insert(peer).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_silent_resolver_is_cut_off_at_the_connect_timeout() {
        let t0 = Instant::now();
        let silent = |_: String, _: u16| {
            std::thread::sleep(Duration::from_secs(3));
            Ok(vec![])
        };
        let e = resolve_with("kv-node.example", 15000, Duration::from_millis(200), silent).unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), ErrorKind::PeerUnreachable);
        assert!(e.message().contains("no answer within the connect timeout"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        let answered = resolve_with("kv-node.example", 7, Duration::from_secs(5), |_, p| {
            Ok(vec![SocketAddr::from(([127, 0, 0, 1], p))])
        });
        assert_eq!(answered.unwrap(), vec![SocketAddr::from(([127, 0, 0, 1], 7))]);
        let literal = resolve_with("[::1]", 9, Duration::ZERO, |_, _| unreachable!("literals need no lookup"));
        assert_eq!(literal.unwrap(), vec![SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 9))]);
    }
}
