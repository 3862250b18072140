//! A peer's rails: each one's state (up, down, dropped) and why, the
//! bytes it confirmed and its rate, and which rail a lane should take.

use std::fmt;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::super::registry::Registry;
use super::super::deadline::Progress;
use super::discovery::LocalRail;
use super::subnets::pair;
use super::{LOG_TARGET, RAIL_CONNECT, RAIL_LAGGING};

/// Bound on the connect that checks a lagging rail: a refusal or an
/// unreachable network comes at once; a timeout says nothing (and a
/// stopping engine waits for no longer than this).
const CHECK_CONNECT: Duration = Duration::from_millis(500);

/// Whoever probes down rails (the engine's [`super::Prober`]): told of a
/// rail that went down.
pub trait Probing: Send + Sync {
    /// Probe `rail` of `set` until it answers (or is let go).
    fn add(self: Arc<Self>, set: &Arc<RailSet>, rail: &Arc<Rail>);
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

pub(super) struct Status {
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
    pub(super) status: Mutex<Status>,
    /// Bytes confirmed over it.
    pub bytes: AtomicU64,
    /// When it last moved a byte.
    pub(super) progress: Progress,
    /// Lanes on it running a window.
    pub(super) busy: AtomicUsize,
    /// When `busy` last went from none to some: the rail's clock counts
    /// from the later of this and its last byte.
    pub(super) busy_since: Progress,
    /// Confirmed bytes per second, smoothed (0: not measured yet).
    pub(super) rate: AtomicU64,
    pub(super) probing: AtomicBool,
    /// The start of the quiet spell a connect was last tried for (see
    /// [`RailSet::check_lagging`]).
    pub(super) checked: Mutex<Option<Instant>>,
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
    pub(super) fn quiet_since(&self) -> Option<Instant> {
        if self.busy.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.progress.last().max(self.busy_since.last()))
    }

    /// How long it has been quiet at `now` (see [`Rail::quiet_since`]).
    pub(super) fn quiet_at(&self, now: Instant) -> Option<Duration> {
        self.quiet_since().map(|since| now.saturating_duration_since(since))
    }

    pub(super) fn set(&self, state: RailState, reason: String, session: &str) -> bool {
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
    pub(super) port: u16,
    /// Round-robin start for lanes with no rail asked for.
    next: AtomicUsize,
    /// The engine's threads (for the checks of lagging rails; `None` in
    /// unit tests: no check).
    pub(super) registry: Option<Arc<Registry>>,
    /// The engine's rail prober (`None` in unit tests: a down rail stays
    /// down).
    pub(super) prober: Option<Arc<dyn Probing>>,
    /// Replaced by a pairing with a newer descriptor of the peer: its
    /// probes stop.
    pub(super) retired: AtomicBool,
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
    pub fn checked_on(mut self, registry: Arc<Registry>, prober: Arc<dyn Probing>) -> RailSet {
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
    pub(super) fn check_lagging(self: &Arc<Self>, rail: &Arc<Rail>, now: Instant) {
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

    pub(super) fn choose_at(&self, hint: Option<usize>, now: Instant) -> Option<Arc<Rail>> {
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
    pub(super) fn lagging_at(&self, rail: &Rail, now: Instant) -> bool {
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
            Some(prober) => prober.clone().add(self, rail),
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

/// A rail's name in metrics and `pdx_peer_info`: `local->remote`.
pub fn rail_label(r: &Rail) -> String {
    match &r.local {
        Some(l) => format!("{}->{}", l.addr, r.remote),
        None => format!("routed->{}", r.remote),
    }
}

#[cfg(test)]
mod tests {
    use super::super::RAIL_CLOCK;
    use super::*;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
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
