//! Multi-rail TCP: every link between two hosts carries lanes.
//!
//! With `PDX_TCP_RAILS` set (`auto`, or a list of interface names or local
//! addresses), an engine finds its rails (interfaces that are up, not
//! loopback, with an address), listens for data on all of them and
//! advertises their addresses in its descriptor (`pdx_rails`, a field
//! Mooncake ignores). An initiator with rails pairs its own with a pdx
//! peer's: for each advertised address a local rail on the same subnet,
//! else whatever the kernel routes. Lanes are opened on every pair; the
//! executor's lanes claim windows as they finish the last, so a rail that
//! confirms bytes faster takes more of a batch, and a slow rail stops
//! claiming once the others would finish the rest before it finishes a
//! window ([`RailSet::should_yield`]).
//!
//! A rail has its own clock: while it has work in flight and confirms no
//! bytes for [`RAIL_CLOCK`] while another rail to the same peer does, its
//! lanes give up ([`RailClock::silent`]), the rail is marked down and the
//! unconfirmed pieces are retried on the others. Quiet for [`RAIL_LAGGING`]
//! it gets no new windows, and one connect from its address checks it: a
//! link that is down (no route) marks it down then, without waiting out the
//! clock. A down rail is probed in the background (a TCP connect to the
//! peer's data port from the rail's address every [`PROBE_EVERY`]) and
//! used again as soon as it answers. One thread per engine probes every
//! peer's down rails, their connects in flight together ([`Prober`]): the
//! threads do not grow with the peers, and a peer forgotten, evicted or
//! closed is probed no more from the next round on. A rail that never connected is dropped
//! for that peer, with the reason. A pairing belongs to the descriptor it
//! was made from ([`Pairing`]): a peer that restarts is paired afresh.

use std::fmt;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::registry::Registry;
use super::deadline::Progress;
use crate::error::{Error, Result};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::rails";

/// A rail with work in flight that confirms nothing for this long, while
/// another rail to the same peer does, is down.
pub(crate) const RAIL_CLOCK: Duration = Duration::from_secs(2);
/// A rail with work in flight that has confirmed nothing for this long,
/// while another rail has since, is lagging: new windows go to the others
/// (its own wait for [`RAIL_CLOCK`] goes on).
pub(crate) const RAIL_LAGGING: Duration = Duration::from_millis(500);
/// How often a down rail is probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Bound on one rail's connect, and on the pdx hello over it (a rail that
/// cannot connect and answer in this long is dropped; the task's own
/// clocks are far longer).
pub(crate) const RAIL_CONNECT: Duration = Duration::from_secs(2);
/// Bound on one round's probe connects (all in flight together).
const PROBE_CONNECT: Duration = Duration::from_millis(500);
/// Most probe connects in flight at once (sockets held by a round); more
/// down rails than this take turns, round by round.
const PROBES_PER_ROUND: usize = 256;
/// The name of an engine's one rail-probe thread.
pub(crate) const PROBE_THREAD: &str = "pdx-rail-probe";
/// Bound on the connect that checks a lagging rail: a refusal or an
/// unreachable network comes at once; a timeout says nothing (and a
/// stopping engine waits for no longer than this).
const CHECK_CONNECT: Duration = Duration::from_millis(500);
/// Most rails an engine uses or accepts from a peer's descriptor.
pub(crate) const MAX_RAILS: usize = 16;

/// One local interface address that carries lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRail {
    /// The interface's name (`eth1`).
    pub name: String,
    pub addr: IpAddr,
    /// The subnet's prefix length.
    pub prefix: u8,
}

/// Every address of an interface that is up, not loopback, and not an IPv6
/// link-local address (those need a scope to be reached), as (interface,
/// address, prefix length).
pub fn interfaces() -> std::io::Result<Vec<LocalRail>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags as libc::c_int;
        if flags & libc::IFF_UP == 0 || flags & libc::IFF_LOOPBACK != 0 || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: the address and mask point at sockaddrs of their family
        // (or are null), as getifaddrs documents.
        let (Some(addr), mask) = (unsafe { sockaddr_ip(ifa.ifa_addr) }, unsafe { sockaddr_ip(ifa.ifa_netmask) }) else {
            continue;
        };
        if matches!(addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80) {
            continue;
        }
        let prefix = match mask {
            Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
            Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
            None => {
                if addr.is_ipv4() {
                    32
                } else {
                    128
                }
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        found.push(LocalRail { name, addr, prefix });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// The IP address in `sa`, for the IPv4 and IPv6 families.
///
/// # Safety
/// `sa` is null or points at a valid sockaddr of the size its family says.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per the caller; the family decides the type.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let v6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(IpAddr::from(v6.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

/// This engine's rails for `spec` (`PDX_TCP_RAILS`): `None` or empty: none
/// (one address, as before); `auto`: every address [`interfaces`] finds;
/// else a comma list of interface names (all their addresses) or local
/// addresses, each of which must exist.
pub fn discover(spec: Option<&str>) -> Result<Vec<LocalRail>> {
    discover_from(spec, interfaces)
}

fn discover_from(spec: Option<&str>, list: impl FnOnce() -> std::io::Result<Vec<LocalRail>>) -> Result<Vec<LocalRail>> {
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else { return Ok(Vec::new()) };
    let all = list().map_err(|e| Error::io(format!("PDX_TCP_RAILS: cannot list the interfaces: {e}")))?;
    let mut rails: Vec<LocalRail> = Vec::new();
    if spec == "auto" {
        rails = all;
        if rails.is_empty() {
            log::warn!(target: LOG_TARGET, "PDX_TCP_RAILS=auto: no interface is up with an address; one address, as without rails");
        }
    } else {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let matched: Vec<LocalRail> = match item.parse::<IpAddr>() {
                Ok(ip) => all.iter().filter(|r| r.addr == ip).cloned().collect(),
                Err(_) => all.iter().filter(|r| r.name == item).cloned().collect(),
            };
            if matched.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "PDX_TCP_RAILS: {item:?} is neither an interface that is up with an address nor one of its \
                     addresses (found: {})",
                    all.iter().map(|r| format!("{} {}", r.name, r.addr)).collect::<Vec<_>>().join(", ")
                )));
            }
            for r in matched {
                if !rails.contains(&r) {
                    rails.push(r);
                }
            }
        }
    }
    if rails.len() > MAX_RAILS {
        log::warn!(target: LOG_TARGET, "PDX_TCP_RAILS: {} rails found; using the first {MAX_RAILS}", rails.len());
        rails.truncate(MAX_RAILS);
    }
    Ok(rails)
}

/// Whether `a` and `b` are on one subnet of `prefix` bits.
fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// A peer's advertised rails, read leniently from its descriptor: at most
/// [`MAX_RAILS`] IP addresses; anything else is skipped.
pub fn parse_advertised(value: Option<&serde_json::Value>) -> Vec<IpAddr> {
    let Some(list) = value.and_then(serde_json::Value::as_array) else { return Vec::new() };
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in list.iter().filter_map(|v| v.as_str()?.parse::<IpAddr>().ok()) {
        if out.len() < MAX_RAILS && !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// Pair our rails with a peer's addresses: each remote address gets a
/// local rail on its subnet (the one fewest pairs use so far), else none
/// (the kernel routes it, from whichever address it picks).
pub fn pair(locals: &[LocalRail], remotes: &[IpAddr]) -> Vec<(Option<LocalRail>, IpAddr)> {
    let mut uses = vec![0usize; locals.len()];
    remotes
        .iter()
        .map(|&remote| {
            let best = (0..locals.len())
                .filter(|&i| same_subnet(locals[i].addr, remote, locals[i].prefix))
                .min_by_key(|&i| uses[i]);
            match best {
                Some(i) => {
                    uses[i] += 1;
                    (Some(locals[i].clone()), remote)
                }
                None => (None, remote),
            }
        })
        .collect()
}

/// What a rail to a peer is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailState {
    /// Carrying lanes (or ready to).
    Up,
    /// Failed after it worked; probed in the background.
    Down,
    /// Never connected: not used for this peer.
    Dropped,
}

impl RailState {
    pub fn name(self) -> &'static str {
        match self {
            RailState::Up => "up",
            RailState::Down => "down",
            RailState::Dropped => "dropped",
        }
    }
}

struct Status {
    state: RailState,
    reason: String,
    /// A lane on it connected once.
    connected: bool,
}

/// One pair of a local rail and a peer's address.
pub struct Rail {
    pub index: usize,
    pub local: Option<LocalRail>,
    pub remote: IpAddr,
    status: Mutex<Status>,
    /// Bytes confirmed over it.
    pub bytes: AtomicU64,
    /// When it last moved a byte.
    progress: Progress,
    /// Lanes on it running a window.
    busy: AtomicUsize,
    /// When `busy` last went from none to some: the rail's clock counts
    /// from the later of this and its last byte.
    busy_since: Progress,
    /// Confirmed bytes per second, smoothed (0: not measured yet).
    rate: AtomicU64,
    probing: AtomicBool,
    /// The start of the quiet spell a connect was last tried for (see
    /// [`RailSet::check_lagging`]).
    checked: Mutex<Option<Instant>>,
}

impl fmt::Display for Rail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.local {
            Some(l) => write!(f, "{} ({}) -> {}", l.addr, l.name, self.remote),
            None => write!(f, "routed -> {}", self.remote),
        }
    }
}

impl Rail {
    pub fn state(&self) -> RailState {
        self.status.lock().state
    }

    pub fn is_up(&self) -> bool {
        self.state() == RailState::Up
    }

    pub fn reason(&self) -> String {
        self.status.lock().reason.clone()
    }

    /// Connect to the peer's data `port` over this rail (from its local
    /// address), by `by` and within [`RAIL_CONNECT`].
    pub fn connect(&self, port: u16, by: Instant) -> std::io::Result<TcpStream> {
        let limit = RAIL_CONNECT.min(by.saturating_duration_since(Instant::now()));
        if limit.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the connect bound passed"));
        }
        let target = SocketAddr::new(self.remote, port);
        let socket = socket2::Socket::new(socket2::Domain::for_address(target), socket2::Type::STREAM, None)?;
        if let Some(l) = &self.local {
            socket.bind(&SocketAddr::new(l.addr, 0).into())?;
        }
        socket.connect_timeout(&target.into(), limit)?;
        Ok(socket.into())
    }

    /// A window of `bytes` confirmed over it in `took`, by a lane that
    /// shared the rail with the other busy lanes (the rail's rate is the
    /// lane's times the lanes busy on it; call before [`Rail::busy`]
    /// `(false)`).
    pub fn confirmed(&self, bytes: u64, took: Duration) {
        if bytes == 0 {
            return;
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.progress.mark();
        let sharing = self.busy.load(Ordering::Acquire).max(1) as f64;
        let now = (bytes as f64 * sharing / took.as_secs_f64().max(1e-6)) as u64;
        let before = self.rate.load(Ordering::Relaxed);
        let smoothed = if before == 0 { now } else { (before * 3 + now) / 4 };
        self.rate.store(smoothed.max(1), Ordering::Relaxed);
    }

    /// Lane on it starts (`true`) or ends a window.
    pub fn busy(&self, running: bool) {
        if running {
            if self.busy.fetch_add(1, Ordering::AcqRel) == 0 {
                self.busy_since.mark();
            }
        } else {
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Since when it has had work in flight and moved nothing (`None`: no
    /// work in flight): the later of its last byte and when it last went
    /// from idle to busy. A window started while the rail's other windows
    /// wait does not move it.
    fn quiet_since(&self) -> Option<Instant> {
        if self.busy.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.progress.last().max(self.busy_since.last()))
    }

    /// How long it has been quiet at `now` (see [`Rail::quiet_since`]).
    fn quiet_at(&self, now: Instant) -> Option<Duration> {
        self.quiet_since().map(|since| now.saturating_duration_since(since))
    }

    fn set(&self, state: RailState, reason: String, session: &str) -> bool {
        let mut st = self.status.lock();
        if st.state == state {
            return false;
        }
        log::info!(target: LOG_TARGET, "{session}: rail {self} {} -> {}: {reason}", st.state.name(), state.name());
        st.state = state;
        st.reason = reason;
        true
    }
}

/// A peer's rails.
pub struct RailSet {
    pub session: String,
    pub rails: Vec<Arc<Rail>>,
    /// The peer's data port (the probe's target).
    port: u16,
    /// Round-robin start for lanes with no rail asked for.
    next: AtomicUsize,
    /// The engine's threads (for the checks of lagging rails; `None` in
    /// unit tests: no check).
    registry: Option<Arc<Registry>>,
    /// The engine's rail prober (`None` in unit tests: a down rail stays
    /// down).
    prober: Option<Arc<Prober>>,
    /// Replaced by a pairing with a newer descriptor of the peer: its
    /// probes stop.
    retired: AtomicBool,
}

impl RailSet {
    /// The pairs of `locals` and `remotes`, all up.
    pub fn new(session: &str, locals: &[LocalRail], remotes: &[IpAddr], port: u16) -> RailSet {
        let rails = pair(locals, remotes)
            .into_iter()
            .enumerate()
            .map(|(index, (local, remote))| {
                let reason = match &local {
                    Some(l) => format!("same subnet as {} ({}/{})", l.addr, l.name, l.prefix),
                    None => "no local rail on its subnet: routed by the kernel".to_owned(),
                };
                Arc::new(Rail {
                    index,
                    local,
                    remote,
                    status: Mutex::new(Status { state: RailState::Up, reason, connected: false }),
                    bytes: AtomicU64::new(0),
                    progress: Progress::default(),
                    busy: AtomicUsize::new(0),
                    busy_since: Progress::default(),
                    rate: AtomicU64::new(0),
                    probing: AtomicBool::new(false),
                    checked: Mutex::new(None),
                })
            })
            .collect::<Vec<_>>();
        for r in &rails {
            log::info!(target: LOG_TARGET, "{session}: rail {r}: {}", r.reason());
        }
        RailSet {
            session: session.to_owned(),
            rails,
            port,
            next: AtomicUsize::new(0),
            registry: None,
            prober: None,
            retired: AtomicBool::new(false),
        }
    }

    /// Checks of lagging rails run on `registry`'s threads; down rails are
    /// probed by `prober`.
    pub fn checked_on(mut self, registry: Arc<Registry>, prober: Arc<Prober>) -> RailSet {
        self.registry = Some(registry);
        self.prober = Some(prober);
        self
    }

    /// A rail quiet for [`RAIL_LAGGING`] with work in flight while another
    /// was working (see [`RailClock::silent`]): once per quiet spell, try a
    /// connect from its address in the background, bounded by
    /// [`CHECK_CONNECT`]. One that fails other than by timing out (no
    /// route: the link is down) marks the rail down at once, and its lanes
    /// give up without waiting for [`RAIL_CLOCK`]; one that connects or
    /// times out changes nothing.
    fn check_lagging(self: &Arc<Self>, rail: &Arc<Rail>, now: Instant) {
        let Some(registry) = &self.registry else { return };
        let Some(spell) = rail.quiet_since() else { return };
        let quiet = now.saturating_duration_since(spell);
        {
            let mut checked = rail.checked.lock();
            if *checked == Some(spell) {
                return;
            }
            *checked = Some(spell);
        }
        log::debug!(target: LOG_TARGET, "{}: rail {rail} quiet for {quiet:?} with work in flight: a connect checks it", self.session);
        let (set, rail2) = (self.clone(), rail.clone());
        let spawned = registry.spawn(format!("pdx-rail-check-{}", rail.index), move || {
            match rail2.connect(set.port, Instant::now() + CHECK_CONNECT) {
                Err(e) if !matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
                    let why =
                        format!("quiet for {:.1} s with work in flight, and cannot connect: {e}", quiet.as_secs_f64());
                    set.mark_down(&rail2, why);
                }
                Err(e) => log::debug!(target: LOG_TARGET, "{}: rail {rail2} lags; check: {e}", set.session),
                Ok(stream) => {
                    log::debug!(target: LOG_TARGET, "{}: rail {rail2} lags; check: it connects", set.session);
                    drop(stream);
                }
            }
        });
        if let Err(e) = spawned {
            log::debug!(target: LOG_TARGET, "{}: cannot start the check of rail {rail} ({e})", self.session);
        }
    }

    /// The rail a lane should use: `hint` while it is up and not lagging,
    /// else the up rail with the fewest busy lanes (taking turns among
    /// equals; one that lags only when all up rails do); `None` when no
    /// rail is up.
    pub fn choose(&self, hint: Option<usize>) -> Option<Arc<Rail>> {
        self.choose_at(hint, Instant::now())
    }

    fn choose_at(&self, hint: Option<usize>, now: Instant) -> Option<Arc<Rail>> {
        if let Some(r) = hint.and_then(|h| self.rails.get(h)).filter(|r| r.is_up() && !self.lagging_at(r, now)) {
            return Some(r.clone());
        }
        let n = self.rails.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| &self.rails[(start + k) % n.max(1)])
            .filter(|r| r.is_up())
            .min_by_key(|r| (self.lagging_at(r, now), r.busy.load(Ordering::Acquire)))
            .cloned()
    }

    /// Whether `rail` has had work in flight and moved nothing for
    /// [`RAIL_LAGGING`] while another rail up has moved bytes since it
    /// went quiet: new windows are better sent elsewhere.
    fn lagging_at(&self, rail: &Rail, now: Instant) -> bool {
        let Some(since) = rail.quiet_since().filter(|&t| now.saturating_duration_since(t) >= RAIL_LAGGING) else {
            return false;
        };
        self.rails.iter().any(|r| r.index != rail.index && r.is_up() && r.progress.last() > since)
    }

    /// Whether `rail` is one of this pairing's (not of an older one).
    pub fn holds(&self, rail: &Arc<Rail>) -> bool {
        self.rails.get(rail.index).is_some_and(|r| Arc::ptr_eq(r, rail))
    }

    /// After a lane could not open on a rail: an up rail that has carried a
    /// lane, else `None` (the descriptor's one address). A lane never waits
    /// out a second untried rail, so a rail that is silent or dead costs it
    /// at most one [`RAIL_CONNECT`].
    pub fn choose_proven(&self) -> Option<Arc<Rail>> {
        let proven = |r: &&Arc<Rail>| r.is_up() && r.status.lock().connected;
        self.rails.iter().filter(proven).min_by_key(|r| r.busy.load(Ordering::Acquire)).cloned()
    }

    /// The up rails' indexes, for spreading a batch's lanes.
    pub fn up_indexes(&self) -> Vec<usize> {
        self.rails.iter().filter(|r| r.is_up()).map(|r| r.index).collect()
    }

    /// A lane on `rail` connected.
    pub fn connected(&self, rail: &Rail) {
        rail.status.lock().connected = true;
        rail.progress.mark();
    }

    /// A lane on `rail` could not connect (`why`): a rail that never
    /// connected is dropped for this peer; one that did is down (probed).
    pub fn connect_failed(self: &Arc<Self>, rail: &Arc<Rail>, why: &str) {
        let connected = rail.status.lock().connected;
        if connected {
            self.mark_down(rail, format!("cannot connect again: {why}"));
        } else {
            rail.set(RailState::Dropped, format!("cannot connect: {why}"), &self.session);
        }
    }

    /// `rail` failed (`why`) while others may live: down, probed in the
    /// background (by the engine's [`Prober`]) until it answers.
    pub fn mark_down(self: &Arc<Self>, rail: &Arc<Rail>, why: String) {
        if !rail.set(RailState::Down, why, &self.session) || rail.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        match &self.prober {
            Some(prober) => prober.add(self, rail),
            None => rail.probing.store(false, Ordering::Release),
        }
    }

    /// Whether a lane on `rail` should stop claiming windows of a batch
    /// with `unclaimed` bytes left, the next window `window` bytes: yes
    /// when the other rails, at their measured rates, would move all of it
    /// before this lane (sharing its rail with the lanes busy on it) moves
    /// the window; then the batch ends sooner without it.
    pub fn should_yield(&self, rail: &Rail, window: usize, unclaimed: usize) -> bool {
        let sharing = (rail.busy.load(Ordering::Acquire) + 1) as u64;
        let own = rail.rate.load(Ordering::Relaxed) / sharing;
        // A lagging rail's rate is of before it went quiet.
        let now = Instant::now();
        let others: u64 = self
            .rails
            .iter()
            .filter(|r| r.index != rail.index && r.is_up() && !self.lagging_at(r, now))
            .map(|r| r.rate.load(Ordering::Relaxed))
            .sum();
        if own == 0 || others == 0 {
            return false;
        }
        window as f64 / own as f64 > unclaimed as f64 / others as f64
    }

    /// The rails as `pdx_peer_info` shows them.
    pub fn info(&self) -> serde_json::Value {
        let rails: Vec<serde_json::Value> = self
            .rails
            .iter()
            .map(|r| {
                serde_json::json!({
                    "rail": rail_label(r),
                    "local": r.local.as_ref().map(|l| l.addr.to_string()),
                    "interface": r.local.as_ref().map(|l| l.name.clone()),
                    "remote": r.remote.to_string(),
                    "state": r.state().name(),
                    "reason": r.reason(),
                    "bytes": r.bytes.load(Ordering::Relaxed),
                })
            })
            .collect();
        serde_json::Value::Array(rails)
    }
}

/// An engine's probes of down rails: one thread, started when a rail goes
/// down and ended when none is left to probe, connects to every down
/// rail's peer at once each [`PROBE_EVERY`] (the connects in flight
/// together, bounded by [`PROBE_CONNECT`]). A rail that answers is up
/// again. A rail whose pairing was retired (the peer forgotten, evicted,
/// closed, or paired afresh) or dropped is let go at the next round, so
/// nothing connects for a peer that is gone, and the threads never grow
/// with the peers.
pub struct Prober {
    registry: Arc<Registry>,
    state: Mutex<ProberState>,
}

/// A rail in a round of probes: its pairing, itself, and since when it
/// has been down.
type Probed = (Arc<RailSet>, Arc<Rail>, Instant);

#[derive(Default)]
struct ProberState {
    /// The rails to probe: their pairing (weak: a pairing dropped is let
    /// go), the rail's index in it, and since when it has been down.
    due: Vec<(Weak<RailSet>, usize, Instant)>,
    /// The thread runs (set and cleared under this lock).
    running: bool,
}

impl Prober {
    pub fn new(registry: Arc<Registry>) -> Arc<Prober> {
        Arc::new(Prober { registry, state: Mutex::new(ProberState::default()) })
    }

    /// Probe `rail` of `set` from the next round; the thread starts if it
    /// is not running.
    fn add(self: &Arc<Self>, set: &Arc<RailSet>, rail: &Arc<Rail>) {
        let mut st = self.state.lock();
        st.due.push((Arc::downgrade(set), rail.index, Instant::now()));
        if st.running {
            return;
        }
        st.running = true;
        drop(st);
        let me = self.clone();
        if let Err(e) = self.registry.spawn(PROBE_THREAD.to_owned(), move || me.run()) {
            let mut st = self.state.lock();
            st.running = false;
            for (set, index, _) in st.due.drain(..) {
                if let Some(r) = set.upgrade().and_then(|s| s.rails.get(index).cloned()) {
                    r.probing.store(false, Ordering::Release);
                }
            }
            log::warn!(target: LOG_TARGET, "{}: cannot start the rail prober ({e}); down rails stay down", set.session);
        }
    }

    /// The rails still worth probing; `None` (and the thread's end, under
    /// the same lock as [`Prober::add`]'s start) when there are none.
    fn round(&self) -> Option<Vec<Probed>> {
        let mut st = self.state.lock();
        let stopping = self.registry.stopping();
        let mut live = Vec::new();
        st.due.retain(|(set, index, since)| {
            let Some(set) = set.upgrade() else { return false };
            let Some(rail) = set.rails.get(*index).cloned() else { return false };
            if stopping || set.retired.load(Ordering::Acquire) || rail.state() != RailState::Down {
                rail.probing.store(false, Ordering::Release);
                return false;
            }
            live.push((set, rail, *since));
            true
        });
        if live.is_empty() {
            st.running = false;
            return None;
        }
        // At most PROBES_PER_ROUND sockets at once; the rest take turns.
        if live.len() > PROBES_PER_ROUND {
            live.truncate(PROBES_PER_ROUND);
            st.due.rotate_left(PROBES_PER_ROUND);
        }
        Some(live)
    }

    fn run(&self) {
        while let Some(live) = self.round() {
            let started = Instant::now();
            let targets: Vec<(Option<IpAddr>, SocketAddr)> = live
                .iter()
                .map(|(set, rail, _)| (rail.local.as_ref().map(|l| l.addr), SocketAddr::new(rail.remote, set.port)))
                .collect();
            let answered = connect_all(&targets, started + PROBE_CONNECT);
            for ((set, rail, since), ok) in live.iter().zip(answered) {
                if !ok {
                    continue;
                }
                rail.progress.mark();
                let why = format!("answered a probe after {:.1} s down", since.elapsed().as_secs_f64());
                rail.set(RailState::Up, why, &set.session);
                // Let go of it at the next round (it is no longer down).
            }
            // In short naps: a stopping engine joins this thread.
            while started.elapsed() < PROBE_EVERY && !self.registry.stopping() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Connect to every target (from its local address, when it has one) at
/// once, by `by`: whether each connected. The sockets close on return.
fn connect_all(targets: &[(Option<IpAddr>, SocketAddr)], by: Instant) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let mut ok = vec![false; targets.len()];
    let mut pending: Vec<(usize, socket2::Socket)> = Vec::new();
    for (i, (local, target)) in targets.iter().enumerate() {
        let started = (|| -> std::io::Result<Option<socket2::Socket>> {
            let socket = socket2::Socket::new(socket2::Domain::for_address(*target), socket2::Type::STREAM, None)?;
            if let Some(l) = local {
                socket.bind(&SocketAddr::new(*l, 0).into())?;
            }
            socket.set_nonblocking(true)?;
            match socket.connect(&(*target).into()) {
                Ok(()) => Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(Some(socket)),
                Err(e) => Err(e),
            }
        })();
        match started {
            Ok(None) => ok[i] = true,
            Ok(Some(socket)) => pending.push((i, socket)),
            Err(e) => log::debug!(target: LOG_TARGET, "rail probe of {target}: {e}"),
        }
    }
    while !pending.is_empty() {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut fds: Vec<libc::pollfd> = pending
            .iter()
            .map(|(_, s)| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 })
            .collect();
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of `fds.len()` pollfds whose fds
        // belong to the sockets in `pending`, open for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::debug!(target: LOG_TARGET, "rail probes: poll: {e}");
            break;
        }
        let mut k = 0;
        pending.retain(|(i, socket)| {
            let ready = fds[k].revents != 0;
            k += 1;
            if ready {
                match socket.take_error() {
                    Ok(None) => ok[*i] = true,
                    Ok(Some(e)) | Err(e) => log::debug!(target: LOG_TARGET, "rail probe of {}: {e}", targets[*i].1),
                }
            }
            !ready
        });
    }
    ok
}

/// A peer's rails as paired with the descriptor `D` they came from. A peer
/// that restarts (a new `pdx_instance`), moves its data port or advertises
/// other rails is paired afresh from its new descriptor, the first time the
/// rails are asked for after the cached descriptor changed; the old
/// pairing's probes stop. A descriptor fetched again unchanged keeps the
/// pairing (and what it learned: rates, rails down or dropped). Generic in
/// the descriptor, which is the protocol's: this module only pairs.
pub struct Pairing<D> {
    cached: Mutex<Option<Paired<D>>>,
}

/// A descriptor and the rails paired from it (`None`: none).
type Paired<D> = (Arc<D>, Option<Arc<RailSet>>);

impl<D> Default for Pairing<D> {
    fn default() -> Self {
        Pairing { cached: Mutex::new(None) }
    }
}

impl<D> Pairing<D> {
    /// The rails for `desc`, made by `make` unless the pairing in hand was
    /// made from `desc` or from a descriptor with the same `key` (what
    /// pairing reads of it).
    pub fn get<K: PartialEq + std::fmt::Debug>(
        &self,
        desc: &Arc<D>,
        key: impl Fn(&D) -> K,
        make: impl FnOnce(&D) -> Option<Arc<RailSet>>,
    ) -> Option<Arc<RailSet>> {
        let mut cached = self.cached.lock();
        if let Some((from, set)) = cached.as_mut() {
            if Arc::ptr_eq(from, desc) {
                return set.clone();
            }
            let (was, now) = (key(from), key(desc));
            if was == now {
                *from = desc.clone();
                return set.clone();
            }
            if let Some(old) = set {
                log::info!(
                    target: LOG_TARGET,
                    "{}: the peer's descriptor changed ({was:?} -> {now:?}): rails paired afresh",
                    old.session
                );
                old.retired.store(true, Ordering::Release);
            }
        }
        let set = make(desc);
        *cached = Some((desc.clone(), set.clone()));
        set
    }

    /// The pairing in hand, without looking at the descriptor.
    pub fn current(&self) -> Option<Arc<RailSet>> {
        self.cached.lock().as_ref().and_then(|(_, set)| set.clone())
    }
}

/// A peer forgotten, evicted or closed drops its pairing: the rails' probes
/// stop (within one nap) and connect no more; the peer's lanes, its rail
/// sockets, close with it.
impl<D> Drop for Pairing<D> {
    fn drop(&mut self) {
        if let Some(set) = self.current() {
            set.retired.store(true, Ordering::Release);
        }
    }
}

/// A rail's name in metrics and `pdx_peer_info`: `local->remote`.
pub fn rail_label(r: &Rail) -> String {
    match &r.local {
        Some(l) => format!("{}->{}", l.addr, r.remote),
        None => format!("routed->{}", r.remote),
    }
}

/// A lane's view of its rail, consulted while a call blocks: the rail's
/// own clock (see the module's documentation).
#[derive(Clone)]
pub struct RailClock {
    pub rail: Arc<Rail>,
    pub set: Arc<RailSet>,
}

impl RailClock {
    pub fn new(rail: Arc<Rail>, set: Arc<RailSet>) -> RailClock {
        RailClock { rail, set }
    }

    /// Bytes moved on this rail just now.
    pub fn mark(&self) {
        self.rail.progress.mark();
    }

    /// True when the rail has had work in flight and moved nothing for
    /// [`RAIL_CLOCK`] (counted from the later of its last byte and the
    /// moment it last went from idle to busy: a window started later, while
    /// the rail's others wait, gets no clock of its own) while another rail
    /// up to the same peer moved no longer than that before this rail's
    /// last byte, or since (it was working when this one stopped; it may
    /// have finished its share and idle, waiting on this one): the lane
    /// should give up. A rail whose
    /// siblings have been idle for longer, or are down, waits for the
    /// task's stall clock. Should the whole peer have died, one rail is
    /// marked down for nothing (and probed back); the retry on the others
    /// then meets the task's stall clock, as without rails.
    ///
    /// A rail marked down (by another lane's clock, or because it cannot
    /// connect) while another is up: its lanes give up at once.
    pub fn silent(&self) -> bool {
        let now = Instant::now();
        let other_up = || self.set.rails.iter().any(|r| r.index != self.rail.index && r.is_up());
        if !self.rail.is_up() && other_up() {
            return true;
        }
        match self.quiet_at(now) {
            Some(q) if q >= RAIL_CLOCK => true,
            Some(q) if q >= RAIL_LAGGING => {
                self.set.check_lagging(&self.rail, now);
                false
            }
            _ => false,
        }
    }

    #[cfg(test)]
    fn silent_at(&self, now: Instant) -> bool {
        self.quiet_at(now).is_some_and(|q| q >= RAIL_CLOCK)
    }

    /// How long the rail has had work in flight and moved nothing, when
    /// another rail up was working no longer than [`RAIL_CLOCK`] before
    /// this one's last byte, or since; else `None` (no word on the peer).
    fn quiet_at(&self, now: Instant) -> Option<Duration> {
        let own = self.rail.progress.last();
        let quiet = self.rail.quiet_at(now)?;
        let others_working = self
            .set
            .rails
            .iter()
            .any(|r| r.index != self.rail.index && r.is_up() && r.progress.last() + RAIL_CLOCK > own);
        others_working.then_some(quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::descriptor::PeerDescriptor;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
    }

    #[test]
    fn rails_are_found_by_auto_by_name_and_by_address() {
        let list = || Ok(vec![rail("eth0", "10.0.1.2", 24), rail("eth1", "10.0.2.2", 24), rail("eth1", "fd00::2", 64)]);
        assert!(discover_from(None, list).unwrap().is_empty());
        assert!(discover_from(Some(" "), list).unwrap().is_empty());
        assert_eq!(discover_from(Some("auto"), list).unwrap().len(), 3);
        let named = discover_from(Some("eth1"), list).unwrap();
        assert_eq!(named.iter().map(|r| r.addr.to_string()).collect::<Vec<_>>(), ["10.0.2.2", "fd00::2"]);
        let by_addr = discover_from(Some("10.0.1.2, eth0"), list).unwrap();
        assert_eq!(by_addr, vec![rail("eth0", "10.0.1.2", 24)], "one rail once");
        let e = discover_from(Some("eth9"), list).unwrap_err();
        assert!(e.message().contains("\"eth9\"") && e.message().contains("eth0 10.0.1.2"), "{e}");
    }

    #[test]
    fn the_real_interface_list_has_no_loopback() {
        let found = interfaces().unwrap();
        assert!(found.iter().all(|r| !r.addr.is_loopback()), "{found:?}");
    }

    #[test]
    fn pairs_take_the_same_subnet_first_then_the_route() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> =
            ["10.231.2.2", "10.231.1.2", "10.9.9.9"].iter().map(|s| s.parse().unwrap()).collect();
        let pairs = pair(&locals, &remotes);
        assert_eq!(pairs[0].0.as_ref().map(|l| l.name.as_str()), Some("b"));
        assert_eq!(pairs[1].0.as_ref().map(|l| l.name.as_str()), Some("a"));
        assert_eq!(pairs[2].0, None, "no subnet in common: routed");
        assert!(same_subnet("10.1.2.3".parse().unwrap(), "10.1.200.1".parse().unwrap(), 16));
        assert!(!same_subnet("10.1.2.3".parse().unwrap(), "10.2.2.3".parse().unwrap(), 16));
        assert!(same_subnet("1.2.3.4".parse().unwrap(), "9.9.9.9".parse().unwrap(), 0));
        assert!(!same_subnet("10.1.2.3".parse().unwrap(), "fd00::1".parse().unwrap(), 0));
    }

    #[test]
    fn advertised_rails_are_read_leniently_and_bounded() {
        let v = serde_json::json!(["10.0.0.1", 7, "not an ip", "10.0.0.1", "fd00::1"]);
        assert_eq!(parse_advertised(Some(&v)).len(), 2);
        assert!(parse_advertised(Some(&serde_json::json!("10.0.0.1"))).is_empty());
        let many: Vec<String> = (0..40).map(|i| format!("10.0.0.{i}")).collect();
        assert_eq!(parse_advertised(Some(&serde_json::json!(many))).len(), MAX_RAILS);
    }

    #[test]
    fn a_rail_clock_fires_only_while_another_rail_was_working() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> = ["10.231.1.2", "10.231.2.2"].iter().map(|s| s.parse().unwrap()).collect();
        let set = Arc::new(RailSet::new("peer", &locals, &remotes, 1));
        let clock = RailClock::new(set.rails[0].clone(), set.clone());
        let (dying, other) = (&set.rails[0], &set.rails[1]);
        let t0 = Instant::now() + Duration::from_secs(5);
        let later = t0 + RAIL_CLOCK + Duration::from_millis(50);
        dying.progress.mark_at(t0);
        dying.busy(true);
        assert!(!clock.silent_at(later), "the other rail has been idle since long before: no word on the peer");
        // The other rail moved shortly before this one's last byte, then
        // finished its share and idled.
        other.progress.mark_at(t0 + Duration::from_millis(100) - RAIL_CLOCK);
        dying.busy(false);
        assert!(!clock.silent_at(later), "nothing in flight on it: no clock");
        dying.busy(true);
        assert!(!clock.silent_at(t0 + RAIL_CLOCK - Duration::from_millis(1)), "within its own clock");
        assert!(clock.silent_at(later), "quiet for the clock while another rail was working");
        other.set(RailState::Down, "test".into(), "peer");
        assert!(!clock.silent_at(later), "a down rail does not count");
        other.set(RailState::Up, "test".into(), "peer");
        // A second window started on the quiet rail gets no clock of its own.
        dying.busy(true);
        assert!(clock.silent_at(later));
        dying.busy(false);
        dying.busy(false);
        assert!(!clock.silent_at(later), "nothing in flight");
        // Busy again after idling: the clock counts from then.
        dying.busy(true);
        dying.busy_since.mark_at(t0 + Duration::from_secs(1));
        assert!(!clock.silent_at(later) && clock.silent_at(later + Duration::from_secs(1)));
        dying.progress.mark_at(later + Duration::from_secs(1));
        assert!(!clock.silent_at(later + Duration::from_secs(1)), "its own bytes reset its clock");
    }

    #[test]
    fn a_peer_with_a_new_descriptor_is_paired_afresh() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let desc = |instance: &str, rails: &[&str]| {
            Arc::new(PeerDescriptor {
                data_host: "10.231.1.2".into(),
                data_port: 7000,
                proto_version: 2,
                notify_name: "peer".into(),
                buffers: Vec::new(),
                instance: Some(instance.into()),
                host: None,
                rails: rails.iter().map(|s| s.parse().unwrap()).collect(),
            })
        };
        let made = std::cell::Cell::new(0);
        let make = |d: &PeerDescriptor| {
            made.set(made.get() + 1);
            Some(Arc::new(RailSet::new("peer", &locals, &d.rails, d.data_port)))
        };
        let pairing = Pairing::default();
        let key = |d: &PeerDescriptor| (d.instance.clone(), d.rails.clone(), d.data_port);
        let first = desc("0a", &["10.231.1.2", "10.231.2.2"]);
        let a = pairing.get(&first, key, make).unwrap();
        a.rails[1].set(RailState::Dropped, "test".into(), "peer");
        assert!(Arc::ptr_eq(&a, &pairing.get(&first, key, make).unwrap()));
        // Fetched again, unchanged: the same pairing (rail 1 stays dropped).
        let again = desc("0a", &["10.231.1.2", "10.231.2.2"]);
        assert!(Arc::ptr_eq(&a, &pairing.get(&again, key, make).unwrap()) && made.get() == 1);
        // Restarted with the same rails: paired afresh, every rail up again.
        let restarted = desc("0b", &["10.231.1.2", "10.231.2.2"]);
        let b = pairing.get(&restarted, key, make).unwrap();
        assert!(!Arc::ptr_eq(&a, &b) && made.get() == 2);
        assert!(a.retired.load(Ordering::Acquire) && !b.retired.load(Ordering::Acquire));
        assert!(b.rails.iter().all(|r| r.is_up()) && !b.holds(&a.rails[0]) && b.holds(&b.rails[0]));
        // Restarted with other rails: those.
        let moved = desc("0c", &["10.231.2.9"]);
        let c = pairing.get(&moved, key, make).unwrap();
        assert_eq!(c.rails.iter().map(|r| r.remote.to_string()).collect::<Vec<_>>(), ["10.231.2.9"]);
        assert!(Arc::ptr_eq(&c, &pairing.current().unwrap()));
        // Restarted without rails (an older pdx, or rails unset): none.
        let plain = desc("0d", &[]);
        assert!(pairing.get(&plain, key, |_| None).is_none() && pairing.current().is_none());
    }

    /// The engine's one prober: a rail whose peer answers is up again and
    /// the thread ends; a rail of a retired pairing, or of one dropped, is
    /// let go at the next round and nothing is left probing.
    #[test]
    fn the_prober_brings_a_rail_back_and_lets_go_of_a_gone_peer() {
        let registry = Arc::new(Registry::default());
        let prober = Prober::new(registry.clone());
        let threads = || registry.live_threads_named(PROBE_THREAD);
        let wait = |what: &str, done: &dyn Fn() -> bool| {
            let by = Instant::now() + Duration::from_secs(5);
            while !done() {
                assert!(Instant::now() < by, "{what}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let local: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap()];
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let live_port = listener.local_addr().unwrap().port();
        let dead_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let set = |port| Arc::new(RailSet::new("peer", &[], &local, port).checked_on(registry.clone(), prober.clone()));
        let (back, gone, dropped) = (set(live_port), set(dead_port), set(dead_port));
        for s in [&back, &gone, &dropped] {
            s.mark_down(&s.rails[0], "test".into());
        }
        wait("the rail answering is up again", &|| back.rails[0].is_up());
        assert!(back.rails[0].reason().contains("answered a probe"), "{}", back.rails[0].reason());
        assert_eq!(threads(), 1, "one thread probes every peer");
        assert!(!gone.rails[0].is_up() && !dropped.rails[0].is_up());
        gone.retired.store(true, Ordering::Release);
        drop(dropped);
        wait("nothing left to probe: the thread ends", &|| threads() == 0);
        assert!(!gone.rails[0].probing.load(Ordering::Acquire));
        // Down again: probed again, by a new thread.
        back.mark_down(&back.rails[0], "test again".into());
        wait("up again", &|| back.rails[0].is_up());
        wait("and the thread ends", &|| threads() == 0);
        drop(listener);
    }

    #[test]
    fn a_lagging_rail_gets_no_new_windows_and_no_share_of_the_tail() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> = ["10.231.1.2", "10.231.2.2"].iter().map(|s| s.parse().unwrap()).collect();
        let set = RailSet::new("peer", &locals, &remotes, 1);
        let (dying, other) = (&set.rails[0], &set.rails[1]);
        let t0 = Instant::now() + Duration::from_secs(5);
        dying.busy(true);
        dying.progress.mark_at(t0);
        other.progress.mark_at(t0 + Duration::from_millis(100));
        let soon = t0 + RAIL_LAGGING - Duration::from_millis(1);
        let lagging = t0 + RAIL_LAGGING;
        assert!(!set.lagging_at(dying, soon) && set.lagging_at(dying, lagging));
        assert!(!set.lagging_at(other, lagging), "nothing in flight on it");
        assert_eq!(set.choose_at(Some(0), soon).unwrap().index, 0);
        assert_eq!(set.choose_at(Some(0), lagging).unwrap().index, 1, "the hint lags: another rail");
        assert_eq!(set.choose_at(None, lagging).unwrap().index, 1);
        other.set(RailState::Down, "test".into(), "peer");
        assert_eq!(set.choose_at(Some(0), lagging).unwrap().index, 0, "lagging beats down");
        other.set(RailState::Up, "test".into(), "peer");
        // The other rail idle since before this one went quiet: no word on it.
        let quiet_set = RailSet::new("peer", &locals, &remotes, 1);
        quiet_set.rails[0].busy(true);
        quiet_set.rails[0].progress.mark_at(t0);
        assert!(!quiet_set.lagging_at(&quiet_set.rails[0], t0 + RAIL_CLOCK * 2));
    }

    #[test]
    fn a_slow_rail_yields_the_tail_and_lanes_spread() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> = ["10.231.1.2", "10.231.2.2"].iter().map(|s| s.parse().unwrap()).collect();
        let set = RailSet::new("peer", &locals, &remotes, 1);
        let (slow, fast) = (&set.rails[0], &set.rails[1]);
        assert!(!set.should_yield(slow, 8 << 20, 8 << 20), "no rate measured yet");
        slow.confirmed(125 << 20, Duration::from_secs(1));
        fast.busy(true);
        fast.busy(true);
        fast.confirmed(250 << 20, Duration::from_secs(1)); // one of two lanes: the rail moves 500 MiB/s
        fast.busy(false);
        fast.busy(false);
        assert_eq!(fast.rate.load(Ordering::Relaxed), 500 << 20);
        assert!(
            !set.should_yield(slow, 4 << 20, 40 << 20),
            "40 MiB left: the fast rail needs longer than a slow piece"
        );
        assert!(set.should_yield(slow, 4 << 20, 12 << 20), "12 MiB: the fast rail is done first");
        slow.busy(true);
        assert!(set.should_yield(slow, 4 << 20, 24 << 20), "a second lane on the slow rail gets half of it");
        slow.busy(false);
        assert!(!set.should_yield(fast, 4 << 20, 4 << 20));
        assert_eq!(slow.bytes.load(Ordering::Relaxed), 125 << 20);
        assert_eq!(set.choose(Some(1)).unwrap().index, 1);
        slow.busy(true);
        assert_eq!(set.choose(None).unwrap().index, 1, "the rail with fewer busy lanes");
        fast.set(RailState::Down, "test".into(), "peer");
        assert_eq!(set.choose(Some(1)).unwrap().index, 0, "a down rail is not chosen");
        assert_eq!(set.up_indexes(), vec![0]);
    }
}
