//! Peers we initiate to: the per-session descriptor cache (refreshed when a
//! peer restarts under the same name, bounded and swept of dead peers), the
//! pool of data connections ("lanes") per peer, and notifications to them.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use super::super::memory::ipc::Exports;
use super::super::net::conn::Conn;
use super::super::net::deadline::{Progress, Stall};
use super::super::net::rails::{Pairing, Rail, RailClock, RailSet};
use super::super::protocol::descriptor::PeerDescriptor;
use super::super::protocol::notify;
use super::super::protocol::wire::FrameType;
use super::super::registry::OwnedSocketGuard;
use super::super::samehost::{self, PathChoice};
use super::super::settings::Settings;
use super::dialer::Dialer;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::Notification;

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::peers";

/// A peer we send to, by session name.
pub struct Peer {
    pub session: String,
    dialer: Arc<Dialer>,
    descriptor: RwLock<Arc<PeerDescriptor>>,
    /// A descriptor fetched outside [`Peer::open_lane`] and not yet used for
    /// a lane: the next lane to a Mooncake peer (which cannot confirm who
    /// it is on a data connection) uses it instead of fetching again.
    unused_fetch: AtomicBool,
    /// When bytes last moved to or from this peer (the tasks' stall clock).
    pub progress: Arc<Progress>,
    lanes: Mutex<LaneState>,
    lane_freed: Condvar,
    /// The path its data connections take, and why.
    pub path: Arc<PathChoice>,
    /// Its rails, paired on first use and again when its descriptor
    /// changes (`None`: one address, as before).
    rails: Pairing<PeerDescriptor>,
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
    /// Whether requests on this lane use data protocol v2 (decided when the
    /// lane opens: the peer's descriptor, unless v1 is forced).
    pub v2: bool,
    /// Whether the target copies the payload itself (the same-host link,
    /// negotiated in the hello when the lane opened).
    pub same_host: bool,
    /// Where device memory is exported from, when the same-host link
    /// moves it through CUDA IPC (negotiated with the link).
    pub exports: Option<Arc<Exports>>,
    /// [`Exports::epoch`] when the lane opened.
    pub exports_epoch: u64,
    /// The peer's path, told when the same-host link fails.
    pub path: Arc<PathChoice>,
    pub session: Arc<str>,
    /// The rail it rides, when the peer has rails.
    pub rail: Option<Arc<Rail>>,
}

/// What a data connection's hello settled.
#[derive(Default)]
struct Negotiated {
    same_host: bool,
    device_ipc: bool,
}

impl Lane {
    /// A lane with CUDA IPC opened before a device region of this engine
    /// was unregistered: the peer may still map that memory through it.
    pub fn retired(&self) -> bool {
        self.exports.as_ref().is_some_and(|e| e.epoch() != self.exports_epoch)
    }
}

impl Peer {
    /// The descriptor currently cached.
    pub fn descriptor(&self) -> Arc<PeerDescriptor> {
        self.descriptor.read().clone()
    }

    /// The peer's rails, paired with ours from its descriptor (again
    /// whenever the descriptor changes: see [`super::super::net::rails::Pairing`]):
    /// only when both sides have rails and the peer is no candidate for the
    /// same-host link (which keeps its one copy).
    pub fn rails(&self) -> Option<Arc<RailSet>> {
        let desc = self.descriptor();
        // What pairing reads of a descriptor: a change in any is a new pairing.
        let key = |d: &PeerDescriptor| (d.instance.clone(), d.rails.clone(), d.data_port, d.data_host.clone());
        self.rails.get(&desc, key, |desc| {
            let locals = self.dialer.local_rails();
            if locals.is_empty() || desc.rails.is_empty() || desc.instance.is_none() {
                return None;
            }
            if samehost::offer_or_why_not(self.dialer.settings.same_host, desc.host.as_ref()).is_ok() {
                log::info!(target: LOG_TARGET, "{}: on this host: rails do not apply (the same-host link)", self.session);
                return None;
            }
            let set = RailSet::new(&self.session, locals, &desc.rails, desc.data_port);
            Some(Arc::new(set.checked_on(self.dialer.registry.clone(), self.dialer.rail_prober.clone())))
        })
    }

    /// The rails `lane` rides, while they are the peer's current pairing
    /// (a lane of an older pairing has no say in the new one).
    pub fn rails_of(&self, lane: &Lane) -> Option<(Arc<RailSet>, Arc<Rail>)> {
        let rail = lane.rail.clone()?;
        self.rails().filter(|set| set.holds(&rail)).map(|set| (set, rail))
    }

    /// Fetch the descriptor again (by `by`) and cache it.
    fn fetch_and_cache(&self, by: Option<Instant>) -> Result<Arc<PeerDescriptor>> {
        let fresh = Arc::new(self.dialer.fetch_descriptor(&self.session, by)?);
        *self.descriptor.write() = fresh.clone();
        Ok(fresh)
    }

    /// Fetch the descriptor again (the peer may have restarted with new ports).
    pub fn refresh(&self) -> Result<Arc<PeerDescriptor>> {
        let fresh = self.fetch_and_cache(None)?;
        self.unused_fetch.store(true, Ordering::Release);
        Ok(fresh)
    }

    /// Refuse a request of `longest` bytes when it is longer than every
    /// region the peer advertised (after one refresh: the cached
    /// descriptor may predate a larger registration).
    pub fn check_fits(&self, longest: usize) -> Result<()> {
        let desc = self.descriptor();
        match super::limits::largest_advertised(&desc) {
            Some(largest) if longest as u64 > largest => {}
            _ => return Ok(()),
        }
        let fresh = self.refresh()?;
        match super::limits::largest_advertised(&fresh) {
            Some(largest) if longest as u64 > largest => {
                Err(super::limits::over_peer_region_error(&self.session, longest, largest))
            }
            _ => Ok(()),
        }
    }

    /// Connect to the data port `desc` names and, for a pdx peer, have the
    /// engine there confirm it is the instance `desc` names (see
    /// [`super::super::protocol::hello`]), all by `by`; offer it the same-host link where
    /// that may work. True if the link was accepted; the path and its
    /// reason are recorded either way.
    fn connect_to(&self, desc: &PeerDescriptor, by: Instant, rail: Option<&Rail>) -> Result<(TcpStream, Negotiated)> {
        let mut stream = match rail {
            Some(rail) => rail.connect(desc.data_port, by).map_err(|e| {
                Error::new(
                    ErrorKind::PeerUnreachable,
                    format!("data connection to {} on rail {rail}: {e}", self.session),
                )
            })?,
            None => super::dialer::connect_by(&self.dialer.settings, &desc.data_host, desc.data_port, Some(by))
                .map_err(|e| {
                    e.context(format!("data connection to {} (as its descriptor advertises)", self.session))
                })?,
        };
        let Some(instance) = &desc.instance else {
            if self.dialer.secret.is_some() {
                return Err(Error::new(
                    ErrorKind::PeerUnreachable,
                    format!("{}: a Mooncake peer cannot authenticate, and this engine has a peer secret", self.session),
                ));
            }
            self.path.decided(&self.session, false, "a Mooncake peer (TCP is its only path)".to_owned());
            return Ok((stream, Negotiated::default()));
        };
        let mut offer = match self.path.failed() {
            Some(why) => Err(why),
            None => samehost::offer_or_why_not(self.dialer.settings.same_host, desc.host.as_ref()),
        };
        // Device memory through CUDA IPC, unless it failed for this peer.
        let export = match (&mut offer, self.path.ipc_failed()) {
            (Err(_), _) => Err(String::new()),
            (Ok(_), Some(why)) => Err(why),
            (Ok(_), None) => desc.host.as_ref().map_or(Err(String::new()), samehost::device::can_export),
        };
        if let Ok(o) = &mut offer {
            o.device_ipc = export.is_ok();
        }
        // On a rail, name the rail: the hello's error is then its reason.
        let what = match rail {
            Some(r) => format!("data port {} of {} on rail {r}", desc.data_port, self.session),
            None => format!("data port {}:{} of {}", desc.data_host, desc.data_port, self.session),
        };
        let by = by.min(Instant::now() + self.dialer.settings.handshake_timeout);
        // A rail's hello is bounded like its connect: a silent rail costs at most that.
        let by = if rail.is_some() { by.min(Instant::now() + super::super::net::rails::RAIL_CONNECT) } else { by };
        let secret = self.dialer.secret.as_deref();
        let answer =
            super::super::protocol::hello::confirm(&mut stream, instance, by, &what, secret, offer.clone().ok())?;
        let (same_host, device_ipc, reason) = match (offer, answer) {
            (Err(why), _) => (false, false, why),
            (Ok(_), Some(a)) if a.accepted => {
                let device_ipc = a.device_ipc && export.is_ok();
                // A process without device memory has nothing to say about it.
                let device = match (export, a.device_ipc) {
                    (Err(why), _) if why.is_empty() => String::new(),
                    (Err(why), _) => format!("; device memory staged: {why}"),
                    (Ok(()), true) => format!("; device memory: {}", samehost::device::ACCEPTED),
                    (Ok(()), false) if a.device_reason.is_empty() => {
                        "; device memory staged: the peer did not answer the CUDA IPC offer (an older pdx)".to_owned()
                    }
                    (Ok(()), false) => format!("; device memory staged: {}", a.device_reason),
                };
                (true, device_ipc, format!("{}{device}", a.reason))
            }
            (Ok(_), Some(a)) => (false, false, a.reason),
            (Ok(_), None) => (false, false, "the peer did not answer the same-host offer (an older pdx)".to_owned()),
        };
        self.path.decided(&self.session, same_host, reason);
        Ok((stream, Negotiated { same_host, device_ipc }))
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
    fn open_lane(&self, rail: Option<&Arc<Rail>>) -> Result<Lane> {
        let s = &self.dialer.settings;
        let by = Instant::now() + s.connect_timeout.max(s.handshake_timeout);
        let mut desc = self.descriptor();
        let trusted = self.unused_fetch.swap(false, Ordering::AcqRel);
        let fetched_here = desc.instance.is_none() && !trusted;
        if fetched_here {
            desc = self.fetch_and_cache(Some(by))?;
        }
        let (stream, negotiated) = match self.connect_to(&desc, by, rail.map(|r| &**r)) {
            Ok(opened) => opened,
            // A rail that does not connect is the rail's failure, not a stale descriptor.
            Err(first) if fetched_here || first.kind() == ErrorKind::Timeout || rail.is_some() => return Err(first),
            Err(first) => {
                // A peer that restarted under the same name has new ports.
                let fresh = self
                    .fetch_and_cache(Some(by))
                    .map_err(|e| first.clone().context(format!("re-fetching the descriptor failed too ({e})")))?;
                if (&fresh.data_host, fresh.data_port, &fresh.instance)
                    == (&desc.data_host, desc.data_port, &desc.instance)
                {
                    return Err(first);
                }
                log::info!(target: LOG_TARGET,
                    "{}: the cached descriptor was stale ({first}); now at data port {}:{}",
                    self.session,
                    fresh.data_host,
                    fresh.data_port
                );
                desc = fresh;
                self.connect_to(&desc, by, None)?
            }
        };
        let stall = Stall::new(self.progress.clone());
        let mut conn = Conn::paced(stream, stall, s.progress_timeout, recv_limit(s))
            .map_err(|e| Error::io(format!("configuring a data connection: {e}")))?;
        conn.set_spin(s.spin);
        if let (Some(rail), Some(set)) = (rail, self.rails().filter(|set| rail.is_some_and(|r| set.holds(r)))) {
            conn.set_rail(RailClock::new(rail.clone(), set.clone()));
            set.connected(rail);
        }
        let tracked = self
            .dialer
            .registry
            .track_owned(conn.stream())
            .ok_or_else(|| Error::new(ErrorKind::Shutdown, "engine is shutting down"))?;
        let v2 = desc.proto_version >= 2 && !s.force_v1;
        let (path, session) = (self.path.clone(), self.session.as_str().into());
        let Negotiated { same_host, device_ipc } = negotiated;
        let exports = device_ipc.then(|| self.dialer.exports.clone());
        let exports_epoch = self.dialer.exports.epoch();
        let rail = rail.cloned();
        Ok(Lane { conn, v2, same_host, exports, exports_epoch, path, session, rail, _tracked: tracked })
    }

    /// Send one notification to the name in the peer's descriptor (refused
    /// before sending when its frame is over the handshake frame limit).
    pub fn notify(&self, note: &Notification) -> Result<()> {
        notify::check_frame(note, self.dialer.settings.handshake_max_len)?;
        let target = self.dialer.rpc_address(&self.descriptor().notify_name)?;
        let reply = self.dialer.exchange_json(&target, FrameType::Notify, &notify::encode(note))?;
        match reply.get("notify_msg").and_then(serde_json::Value::as_str) {
            Some(m) if !m.is_empty() => Ok(()),
            _ => Err(Error::new(ErrorKind::NotifyRejected, format!("{} rejected the notification", self.session))),
        }
    }

    /// Close the idle lanes through which the peer may hold device memory
    /// this engine has since unregistered (see [`Lane::retired`]).
    fn discard_retired(&self) {
        let mut state = self.lanes.lock();
        let (retired, kept): (Vec<Lane>, Vec<Lane>) =
            std::mem::take(&mut state.idle).into_iter().partition(Lane::retired);
        state.idle = kept;
        state.open -= retired.len();
        drop(state);
        drop(retired);
        self.lane_freed.notify_all();
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
    pub fn acquire(&self, stall: &Stall) -> Result<Lane> {
        self.acquire_on(stall, None)
    }

    /// [`Peer::acquire`] on a rail: rail `hint` while it is up, else the
    /// least busy rail up (a rail that cannot connect is dropped or marked
    /// down, and the next one tried); with no rail up, or none at all, the
    /// one address of the descriptor.
    pub fn acquire_on(&self, stall: &Stall, hint: Option<usize>) -> Result<Lane> {
        let deadline = Instant::now() + self.dialer.settings.lane_wait_timeout;
        let limit = recv_limit(&self.dialer.settings);
        let rails = self.rails();
        let mut rail = rails.as_ref().and_then(|set| set.choose(hint));
        let mut state = self.lanes.lock();
        state.last_used = Instant::now();
        loop {
            if stall.expired(limit) {
                return Err(stalled(&self.session, limit));
            }
            if self.dialer.registry.stopping() {
                return Err(Error::new(ErrorKind::Shutdown, "engine is shutting down"));
            }
            let mut k = state.idle.len();
            while k > 0 {
                k -= 1;
                let lane = &state.idle[k];
                // Not a same-host lane once that link failed for this peer,
                // nor one on a rail that is down.
                let rail_down = lane.rail.as_ref().is_some_and(|r| !r.is_up());
                if !lane.conn.idle_and_alive()
                    || (lane.same_host && self.path.has_failed())
                    || lane.retired()
                    || rail_down
                {
                    drop(state.idle.swap_remove(k));
                    state.open -= 1; // closed by the peer while idle, or of a failed link
                    continue;
                }
                let same_rail = match (&lane.rail, &rail) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (a, b) => a.is_none() && b.is_none(),
                };
                if same_rail {
                    return Ok(state.idle.swap_remove(k));
                }
            }
            let full = state.open >= self.dialer.settings.lanes_per_peer;
            if full && rail.is_some() && !state.idle.is_empty() {
                // Every lane is open and idle ones ride other rails: close one for ours.
                drop(state.idle.remove(0));
                state.open -= 1;
            }
            if state.open < self.dialer.settings.lanes_per_peer {
                state.open += 1;
                drop(state);
                let lane = self.open_lane(rail.as_ref());
                if lane.is_err() {
                    self.lanes.lock().open -= 1;
                    self.lane_freed.notify_one();
                }
                match (lane, rails.as_ref(), &rail) {
                    (Err(e), Some(set), Some(r)) if e.kind() != ErrorKind::Shutdown => {
                        set.connect_failed(r, e.message());
                        rail = set.choose_proven();
                        state = self.lanes.lock();
                        continue;
                    }
                    (lane, _, _) => return lane,
                }
            }
            let wake = deadline.min(Instant::now() + super::super::net::deadline::SLICE);
            if self.lane_freed.wait_until(&mut state, wake).timed_out() && Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "no free connection to {} within {:?}",
                    self.session, self.dialer.settings.lane_wait_timeout
                )));
            }
        }
    }

    /// Give a lane back: pooled if it ended cleanly, closed otherwise.
    pub fn release(&self, lane: Lane, clean: bool) {
        let mut state = self.lanes.lock();
        if clean && !lane.retired() {
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
pub struct Peers {
    dialer: Arc<Dialer>,
    map: Mutex<HashMap<String, Arc<Peer>>>,
    /// Wakes the sweeper when the engine stops.
    sweeper: (Mutex<()>, Condvar),
}

impl Peers {
    pub fn new(dialer: Arc<Dialer>) -> Peers {
        Peers { dialer, map: Mutex::default(), sweeper: Default::default() }
    }

    /// The handshake client the peers use.
    pub fn dialer(&self) -> &Arc<Dialer> {
        &self.dialer
    }

    /// Peers with a known descriptor.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Device memory was unregistered: close the lanes through which a peer
    /// may still map it (CUDA IPC), idle ones now, busy ones when released;
    /// the peer closes its mappings with the connection.
    pub fn retire_device_lanes(&self) {
        let peers: Vec<Arc<Peer>> = self.map.lock().values().cloned().collect();
        for p in peers {
            p.discard_retired();
        }
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
    pub fn get(&self, session: &str) -> Result<Arc<Peer>> {
        if let Some(p) = self.map.lock().get(session) {
            return Ok(p.clone());
        }
        // A miss is not remembered: a segment published later is found on the next use.
        let desc = self.dialer.fetch_descriptor(session, None)?;
        let peer = Arc::new(Peer {
            session: session.to_owned(),
            dialer: self.dialer.clone(),
            descriptor: RwLock::new(Arc::new(desc)),
            unused_fetch: AtomicBool::new(true),
            progress: Arc::new(Progress::default()),
            lanes: Mutex::new(LaneState { idle: Vec::new(), open: 0, last_used: Instant::now() }),
            lane_freed: Condvar::new(),
            path: Arc::default(),
            rails: Pairing::default(),
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
            log::debug!(target: LOG_TARGET, "peer cache full ({MAX_PEERS}); forgetting {k}");
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
            log::debug!(target: LOG_TARGET,
                "peer sweep: dropped {} lanes their peers closed; forgot {forgotten} unused peers",
                closed.len()
            );
        }
        drop(closed); // closed outside the cache's lock
    }

    /// Wait `timeout`, or less if the engine stops (woken by
    /// [`Peers::wake_all`]); true when it is stopping.
    pub fn wait_unless_stopping(&self, timeout: Duration) -> bool {
        let mut guard = self.sweeper.0.lock();
        if !self.dialer.registry.stopping() {
            self.sweeper.1.wait_for(&mut guard, timeout);
        }
        self.dialer.registry.stopping()
    }

    /// The sweeper's loop: every [`SWEEP_INTERVAL`] until the engine stops.
    pub fn sweep_until_stopped(&self) {
        let registry = &self.dialer.registry;
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

/// Lanes open, for the engine's statistics and metrics.
impl Peers {
    /// Lanes open (idle or in use) to every peer.
    pub fn lanes_open(&self) -> u64 {
        self.map.lock().values().map(|p| p.lanes.lock().open as u64).sum()
    }

    /// Every paired rail of every cached peer, as the metrics name them:
    /// (`local->remote`, up, bytes confirmed).
    pub fn rail_samples(&self) -> Vec<(String, bool, u64)> {
        let peers: Vec<Arc<Peer>> = self.map.lock().values().cloned().collect();
        let mut out = Vec::new();
        for set in peers.iter().filter_map(|p| p.rails.current()) {
            for r in &set.rails {
                out.push((super::super::net::rails::rail_label(r), r.is_up(), r.bytes.load(Ordering::Relaxed)));
            }
        }
        out
    }

    /// Lanes open to `session`, if it is cached.
    pub fn lanes_open_to(&self, session: &str) -> Option<u64> {
        self.map.lock().get(session).map(|p| p.lanes.lock().open as u64)
    }
}
