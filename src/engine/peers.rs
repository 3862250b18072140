//! Peers we initiate to: the handshake client, the
//! per-session descriptor cache (refreshed when a peer restarts under the
//! same name) and the pool of data connections ("lanes") per peer.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Connect to `host:port` within the connect timeout, trying each address,
/// and by `by` when given (name lookup included).
pub fn connect_by(settings: &Settings, host: &str, port: u16, by: Option<Instant>) -> Result<TcpStream> {
    let bound = || match by {
        Some(by) => settings.connect_timeout.min(by.saturating_duration_since(Instant::now())),
        None => settings.connect_timeout,
    };
    let mut last = String::new();
    for addr in resolve(host, port, bound())? {
        let left = bound();
        if left.is_zero() {
            last = format!("{addr}: the connect bound passed");
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
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
    // A target closes the oldest handshake connections when more arrive
    // than it serves at once (hundreds of peers starting together): a
    // request that may be repeated (metadata, probe) whose connection was
    // closed before the reply is sent again, up to 3 more times, after
    // random pauses growing from tens to hundreds of milliseconds, all
    // within the exchange's bound.
    let repeatable = matches!(kind, FrameType::Metadata | FrameType::Probe);
    let bound = Instant::now() + inner.settings.handshake_timeout;
    let bound = by.map_or(bound, |by| by.min(bound));
    let mut pause_ms = 20;
    for _ in 0..3 {
        match exchange_once(inner, addr, kind, json, by) {
            Err((e, true)) if repeatable && !inner.registry.stopping() => {
                let pause = Duration::from_millis(fastrand::u64(pause_ms / 4..=pause_ms));
                if Instant::now() + pause >= bound {
                    return Err(e);
                }
                log::debug!("{e}; asking again in {pause:?}");
                std::thread::sleep(pause);
                pause_ms *= 4;
            }
            other => return other.map_err(|(e, _)| e),
        }
    }
    exchange_once(inner, addr, kind, json, by).map_err(|(e, _)| e)
}

/// One [`exchange_by`]; the error says whether the connection was closed
/// under the exchange (end of stream or reset before the whole reply).
fn exchange_once(
    inner: &Inner,
    addr: &SessionAddr,
    kind: FrameType,
    json: &str,
    by: Option<Instant>,
) -> std::result::Result<Vec<u8>, (Error, bool)> {
    let settings = &inner.settings;
    let mut stream = connect_by(settings, &addr.host, addr.port, by).map_err(|e| (e, false))?;
    // Tracked so that stopping the engine interrupts a peer that never answers.
    let _tracked = inner
        .registry
        .track(&stream)
        .ok_or_else(|| (Error::new(ErrorKind::Shutdown, "engine is shutting down"), false))?;
    let where_ = format!("handshake with {}:{}", addr.host, addr.port);
    let mut deadline = Instant::now() + settings.handshake_timeout;
    if let Some(by) = by {
        deadline = deadline.min(by);
    }
    let io_err = |e: std::io::Error| {
        use std::io::ErrorKind as Io;
        if inner.registry.stopping() {
            return (Error::new(ErrorKind::Shutdown, format!("{where_}: engine is shutting down")), false);
        }
        if matches!(e.kind(), Io::WouldBlock | Io::TimedOut) {
            return (
                Error::timeout(format!("{where_}: no complete reply within {:?}", settings.handshake_timeout)),
                false,
            );
        }
        let closed = matches!(e.kind(), Io::UnexpectedEof | Io::ConnectionReset | Io::BrokenPipe);
        (Error::new(ErrorKind::PeerUnreachable, format!("{where_}: {e}")), closed)
    };
    stream.set_nodelay(true).map_err(io_err)?;
    let mut bounded = BoundedStream::new(&mut stream, deadline);
    bounded.write_all(&wire::encode_frame(kind, json)).map_err(io_err)?;
    let mut prefix = [0u8; 8];
    bounded.read_exact(&mut prefix).map_err(io_err)?;
    let length = wire::check_frame_length(prefix, settings.handshake_max_len)
        .map_err(|e| (Error::protocol(format!("{where_}: reply length refused ({e:?})")), false))?;
    let mut body = Vec::with_capacity(length.min(64 * 1024));
    (&mut bounded).take(length as u64).read_to_end(&mut body).map_err(io_err)?;
    if body.len() != length {
        return Err((Error::new(ErrorKind::ConnectionLost, format!("{where_}: reply truncated")), true));
    }
    let (got, json) = wire::split_frame_body(&body);
    if got != kind {
        return Err((Error::protocol(format!("{where_}: reply type {got:?} does not match request {kind:?}")), false));
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
    /// A descriptor fetched outside [`Peer::open_lane`] and not yet used for
    /// a lane: the next lane to a Mooncake peer (which cannot confirm who
    /// it is on a data connection) uses it instead of fetching again.
    unused_fetch: AtomicBool,
    /// When bytes last moved to or from this peer (the tasks' stall clock).
    pub progress: Arc<Progress>,
    lanes: Mutex<LaneState>,
    lane_freed: Condvar,
}

struct LaneState {
    idle: Vec<Lane>,
    /// Lanes idle or in use.
    open: usize,
    /// When a lane was last asked for (evicting unused peers).
    last_used: Instant,
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

    fn fetch(inner: &Inner, addr: &SessionAddr, session: &str, by: Option<Instant>) -> Result<PeerDescriptor> {
        let body = exchange_by(inner, addr, FrameType::Metadata, &super::descriptor::own(inner), by)
            .map_err(|e| e.context(format!("cannot open session {session}")))?;
        parse_descriptor(&body, session, &addr.host)
    }

    /// Fetch the descriptor again (by `by`) and cache it.
    fn fetch_and_cache(&self, inner: &Inner, by: Option<Instant>) -> Result<Arc<PeerDescriptor>> {
        let fresh = Arc::new(Self::fetch(inner, &self.addr, &self.session, by)?);
        *self.descriptor.write() = fresh.clone();
        Ok(fresh)
    }

    /// Fetch the descriptor again (the peer may have restarted with new ports).
    pub fn refresh(&self, inner: &Inner) -> Result<Arc<PeerDescriptor>> {
        let fresh = self.fetch_and_cache(inner, None)?;
        self.unused_fetch.store(true, Ordering::Release);
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

    /// Connect to the data port `desc` names and, for a pdx peer, have the
    /// engine there confirm it is the instance `desc` names (see
    /// [`super::hello`]), all by `by`.
    fn connect_to(&self, inner: &Inner, desc: &PeerDescriptor, by: Instant) -> Result<TcpStream> {
        let mut stream = connect_by(&inner.settings, &desc.data_host, desc.data_port, Some(by))
            .map_err(|e| e.context(format!("data connection to {} (as its descriptor advertises)", self.session)))?;
        if let Some(instance) = &desc.instance {
            let what = format!("data port {}:{} of {}", desc.data_host, desc.data_port, self.session);
            let by = by.min(Instant::now() + inner.settings.handshake_timeout);
            super::hello::confirm(&mut stream, instance, by, &what)?;
        }
        Ok(stream)
    }

    /// A new data connection to the engine this peer's descriptor names.
    ///
    /// A transfer never lands in another engine: a pdx peer confirms its
    /// instance on the connection; a Mooncake peer's descriptor is fetched
    /// again first (unless fetched since the last lane was opened). When
    /// the cached descriptor turns out stale (nothing listens at its data
    /// port, or another engine does), it is fetched once more and the
    /// connection tried again; a peer that is merely slow to answer (a
    /// timeout) is not. All of it runs under one bound, the longer of the
    /// connect and handshake timeouts, however many steps it takes.
    fn open_lane(&self, inner: &Inner) -> Result<Lane> {
        let s = &inner.settings;
        let by = Instant::now() + s.connect_timeout.max(s.handshake_timeout);
        let mut desc = self.descriptor();
        let trusted = self.unused_fetch.swap(false, Ordering::AcqRel);
        let fetched_here = desc.instance.is_none() && !trusted;
        if fetched_here {
            desc = self.fetch_and_cache(inner, Some(by))?;
        }
        let stream = match self.connect_to(inner, &desc, by) {
            Ok(stream) => stream,
            Err(first) if fetched_here || first.kind() == ErrorKind::Timeout => return Err(first),
            Err(first) => {
                // A peer that restarted under the same name has new ports.
                let fresh = self
                    .fetch_and_cache(inner, Some(by))
                    .map_err(|e| first.clone().context(format!("re-fetching the descriptor failed too ({e})")))?;
                if (&fresh.data_host, fresh.data_port, &fresh.instance)
                    == (&desc.data_host, desc.data_port, &desc.instance)
                {
                    return Err(first);
                }
                log::info!(
                    "{}: the cached descriptor was stale ({first}); now at data port {}:{}",
                    self.session,
                    fresh.data_host,
                    fresh.data_port
                );
                desc = fresh;
                self.connect_to(inner, &desc, by)?
            }
        };
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

    /// Close the idle lanes: after one broke with a connection error, the
    /// others to the same engine are likely dead too, and the next lane is
    /// opened (and the peer re-validated) afresh.
    pub fn discard_idle(&self) {
        let mut state = self.lanes.lock();
        let idle = std::mem::take(&mut state.idle);
        state.open -= idle.len();
        drop(state);
        drop(idle);
        self.lane_freed.notify_all();
    }

    /// A lane to this peer: an idle live one, a new one while under the
    /// per-peer limit, or the next one released (bounded wait: the lane
    /// wait timeout, and the task's stall clock while the peer is silent).
    pub fn acquire(&self, inner: &Inner, stall: &Stall) -> Result<Lane> {
        let deadline = Instant::now() + inner.settings.lane_wait_timeout;
        let limit = recv_limit(&inner.settings);
        let mut state = self.lanes.lock();
        state.last_used = Instant::now();
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

/// Most peers cached at once. Past it, the least recently used peer with no
/// lane in use is forgotten (its idle lanes closed) to make room.
pub(crate) const MAX_PEERS: usize = 1024;
/// How often the sweeper looks at the cache.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_millis(500);
/// A peer with no lane open and no use for this long is forgotten.
pub(crate) const PEER_IDLE: Duration = Duration::from_secs(1);

/// The descriptor cache: one [`Peer`] per session name, bounded by
/// [`MAX_PEERS`], swept of closed lanes and unused peers (see
/// [`Peers::sweep`]) so that what an engine holds does not grow with the
/// number of peers it has talked to over its life.
#[derive(Default)]
pub struct Peers {
    map: Mutex<HashMap<String, Arc<Peer>>>,
    /// Wakes the sweeper when the engine stops.
    sweeper: (Mutex<()>, Condvar),
}

impl Peers {
    /// Peers with a known descriptor.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Wake every thread waiting for a lane, and the sweeper (they see the
    /// stop and leave).
    pub fn wake_all(&self) {
        for p in self.map.lock().values() {
            let _guard = p.lanes.lock();
            p.lane_freed.notify_all();
        }
        let _guard = self.sweeper.0.lock();
        self.sweeper.1.notify_all();
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
        let desc = Peer::fetch(inner, &addr, session, None)?;
        let peer = Arc::new(Peer {
            session: session.to_owned(),
            addr,
            descriptor: RwLock::new(Arc::new(desc)),
            unused_fetch: AtomicBool::new(true),
            progress: Arc::new(Progress::default()),
            lanes: Mutex::new(LaneState { idle: Vec::new(), open: 0, last_used: Instant::now() }),
            lane_freed: Condvar::new(),
        });
        let mut map = self.map.lock();
        if map.len() >= MAX_PEERS && !map.contains_key(session) {
            Self::evict_least_recent(&mut map);
        }
        Ok(map.entry(session.to_owned()).or_insert(peer).clone())
    }

    /// Forget the least recently used peer that no task holds and that has
    /// no lane in use, closing its idle lanes.
    fn evict_least_recent(map: &mut HashMap<String, Arc<Peer>>) {
        let victim = map
            .iter()
            .filter(|(_, p)| Arc::strong_count(p) == 1)
            .filter_map(|(k, p)| {
                let st = p.lanes.lock();
                (st.open == st.idle.len()).then(|| (st.last_used, k.clone()))
            })
            .min()
            .map(|(_, k)| k);
        if let Some(k) = victim {
            log::debug!("peer cache full ({MAX_PEERS}); forgetting {k}");
            map.remove(&k);
        }
    }

    /// Close idle lanes the peer has closed (or broken), and forget peers
    /// that no task holds, with no lane open, unused for `idle`.
    pub fn sweep(&self, idle: Duration) {
        let now = Instant::now();
        let mut closed = Vec::new();
        let mut map = self.map.lock();
        let before = map.len();
        map.retain(|_, p| {
            let mut st = p.lanes.lock();
            let mut k = 0;
            while k < st.idle.len() {
                if st.idle[k].conn.idle_and_alive() {
                    k += 1;
                } else {
                    closed.push(st.idle.swap_remove(k));
                    st.open -= 1;
                }
            }
            st.open > 0 || now.saturating_duration_since(st.last_used) < idle || Arc::strong_count(p) > 1
        });
        let forgotten = before - map.len();
        drop(map);
        if !closed.is_empty() || forgotten > 0 {
            log::debug!(
                "peer sweep: dropped {} lanes their peers closed; forgot {forgotten} unused peers",
                closed.len()
            );
        }
        drop(closed); // closed outside the cache's lock
    }

    /// The sweeper's loop: every [`SWEEP_INTERVAL`] until the engine stops.
    pub fn sweep_until_stopped(&self, registry: &super::registry::Registry) {
        loop {
            {
                let mut guard = self.sweeper.0.lock();
                if registry.stopping() {
                    return;
                }
                self.sweeper.1.wait_for(&mut guard, SWEEP_INTERVAL);
                if registry.stopping() {
                    return;
                }
            }
            self.sweep(PEER_IDLE);
        }
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
