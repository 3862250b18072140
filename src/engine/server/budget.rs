//! What strangers' connections can make an engine hold, bounded.
//!
//! Every inbound connection is admitted against caps: in total (derived from
//! `RLIMIT_NOFILE`, leaving most descriptors to the host), per listener, and
//! per peer address. When a cap is reached the engine makes room instead of
//! refusing the newcomer: a data connection evicts the least recently used
//! *idle* data connection (never one with a request in flight); a handshake
//! connection evicts only a handshake that is *stalled* (see
//! [`HANDSHAKE_IDLE`], [`HANDSHAKE_SLOW`]): already answered, or with
//! nothing waiting in its socket and no progress for a while; a new data
//! connection is likewise never shed while its first request arrives. A healthy
//! peer in a burst is never shed: while every handshake is making progress
//! the accept loop waits ([`Budget::wait_for_handshake_room`]) and new
//! connections wait in the kernel's backlog, which costs nothing. Eviction
//! shuts the socket down; its owner sees that and closes it. So a connected
//! peer's probe, notify or new lane is never refused because of strangers'
//! connections, and eviction happens only under pressure (an evicted
//! Mooncake initiator's next request on an idle lane fails once).
//!
//! Handshake frame bytes are charged to one engine-wide budget *after* they
//! arrive, never as announced, so a connection holds only what it really
//! sent. When a connection's new bytes do not fit, the budget is taken back
//! from the slowest holders (fewest bytes per second since they connected),
//! never from the connection asking: they are shut down, and the charge
//! waits (bounded by its handshake deadline) until their threads have given
//! their bytes back, so the bytes charged never pass the budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::super::protocol::wire::HEADER_LEN;

/// A handshake with nothing waiting in its socket and no progress (bytes
/// either way) for this long is stalled: a real peer sends its frame in one
/// write, so only a trickler, an idle connection, or a peer that stopped
/// answering waits this long with nothing queued.
pub const HANDSHAKE_IDLE: Duration = Duration::from_millis(100);

/// A handshake not answered this long after it was admitted is slow (an
/// exchange takes milliseconds), unless bytes wait in its socket (the
/// kernel's word that the peer sends and the engine is behind).
pub const HANDSHAKE_SLOW: Duration = Duration::from_secs(1);

/// Which listener a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Handshake,
    Data,
}

/// Descriptors a process has (`RLIMIT_NOFILE`, soft), or `None`.
pub fn fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into our local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Inbound connections allowed in total with `fds` descriptors: a quarter,
/// so the host and our own outbound lanes keep the rest (1024 gives 256).
pub fn total_for(fds: Option<u64>) -> usize {
    let fds = fds.unwrap_or(1 << 20);
    usize::try_from(fds / 4).unwrap_or(usize::MAX).max(16)
}

#[derive(Debug)]
struct Entry {
    fd: RawFd,
    ip: IpAddr,
    plane: Plane,
    opened: Instant,
    /// Last progress of a handshake: bytes in or out, or its admission.
    progress: Instant,
    /// A handshake answered (only draining its close): shed first, losing
    /// nothing. A data connection that had a request (or hello) served.
    settled: bool,
    /// Last use (a tick of `State::clock`), for least-recently-used order.
    used: u64,
    busy: bool,
    evicted: bool,
    /// Handshake frame bytes this connection has received and holds.
    charged: usize,
}

impl Entry {
    /// Bytes per second since the connection was admitted: how fast it sent
    /// what it holds.
    fn rate(&self, now: Instant) -> f64 {
        let age = now.saturating_duration_since(self.opened).max(Duration::from_millis(1));
        self.charged as f64 / age.as_secs_f64()
    }

    /// Whether this handshake may be shed to make room (see
    /// [`HANDSHAKE_IDLE`], [`HANDSHAKE_SLOW`]): answered, or idle or slow
    /// with nothing waiting in its socket.
    fn stalled(&self, now: Instant) -> bool {
        if self.settled {
            return true;
        }
        let idle = now.saturating_duration_since(self.progress) >= HANDSHAKE_IDLE;
        let slow = now.saturating_duration_since(self.opened) >= HANDSHAKE_SLOW;
        (idle || slow) && queued_bytes(self.fd) == 0
    }

    /// Whether this data connection may be shed to make room: served
    /// before (then idle, least recently used first), or new and, after
    /// [`HANDSHAKE_IDLE`], still without a whole request header in its
    /// socket (a lane opening in a burst has sent its hello at once).
    fn sheddable_data(&self, now: Instant) -> bool {
        self.settled
            || (now.saturating_duration_since(self.opened) >= HANDSHAKE_IDLE && queued_bytes(self.fd) < HEADER_LEN)
    }
}

/// Bytes waiting to be read on socket `fd` (`FIONREAD`; 0 on error).
fn queued_bytes(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: a listed descriptor is open (tickets drop, under the budget's
    // lock, before their socket closes); FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

#[derive(Default)]
struct State {
    next: u64,
    clock: u64,
    entries: HashMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
    /// Live (not evicted) entries per plane: handshake, data.
    live: [usize; 2],
    /// Handshake frame bytes charged, evicted holders' included until they
    /// give them back.
    handshake_bytes: usize,
    /// Evicted entries whose owners have not closed their sockets yet.
    closing: usize,
}

fn slot(plane: Plane) -> usize {
    match plane {
        Plane::Handshake => 0,
        Plane::Data => 1,
    }
}

impl State {
    fn live_total(&self) -> usize {
        self.live[0] + self.live[1]
    }

    /// Shut down the best victim on `want`'s plane (from `ip` only, if
    /// given): a stalled handshake (answered ones first, then the one
    /// without progress longest), or the least recently used idle data
    /// connection. Busy connections, and handshakes making progress, are
    /// never chosen.
    fn evict(&mut self, want: Plane, ip: Option<IpAddr>) -> bool {
        let victim = self.victim(want, ip, Instant::now());
        victim.is_some_and(|id| self.evict_id(id))
    }

    /// The connection [`State::evict`] would shut down.
    fn victim(&self, want: Plane, ip: Option<IpAddr>, now: Instant) -> Option<u64> {
        let candidates =
            self.entries.iter().filter(|(_, e)| !e.evicted && !e.busy && e.plane == want && ip.is_none_or_eq(e.ip));
        match want {
            Plane::Handshake => candidates
                .filter(|(_, e)| e.stalled(now))
                .min_by_key(|(_, e)| (!e.settled, e.progress))
                .map(|(id, _)| *id),
            // A new connection still sending its first request (a lane
            // opening in a burst) is never shed; one that sends nothing is
            // shed first, then the least recently used idle one.
            Plane::Data => candidates
                .filter(|(_, e)| e.sheddable_data(now))
                .min_by_key(|(_, e)| (e.settled, e.used))
                .map(|(id, _)| *id),
        }
    }

    /// Shut down the connection `id` (if listed and not evicted yet).
    fn evict_id(&mut self, id: u64) -> bool {
        let Some(e) = self.entries.get_mut(&id).filter(|e| !e.evicted) else { return false };
        e.evicted = true;
        let (plane, ip, fd) = (e.plane, e.ip, e.fd);
        self.live[slot(plane)] -= 1;
        self.closing += 1;
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
        }
        // SAFETY: a listed descriptor is open (tickets drop, under the
        // budget's lock, before their socket closes); shutdown only changes
        // the socket's state, its owner still closes it.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        true
    }

    /// The live holder of handshake bytes, other than `except`, that sent
    /// them slowest (ties: the oldest).
    fn slowest_holder(&self, except: u64, now: Instant) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(id, e)| **id != except && !e.evicted && e.charged > 0)
            .min_by(|(_, a), (_, b)| a.rate(now).total_cmp(&b.rate(now)).then(a.opened.cmp(&b.opened)))
            .map(|(id, _)| *id)
    }

    /// Handshake bytes held by evicted connections, coming back as their
    /// threads leave.
    fn reclaiming(&self) -> usize {
        self.entries.values().filter(|e| e.evicted).map(|e| e.charged).sum()
    }

    /// Give back what connection `id` holds; whether anything was held.
    fn release(&mut self, id: u64) -> bool {
        let Some(e) = self.entries.get_mut(&id) else { return false };
        let held = std::mem::take(&mut e.charged);
        self.handshake_bytes -= held;
        held > 0
    }
}

trait NoneOrEq {
    fn is_none_or_eq(&self, ip: IpAddr) -> bool;
}

impl NoneOrEq for Option<IpAddr> {
    fn is_none_or_eq(&self, ip: IpAddr) -> bool {
        match self {
            None => true,
            Some(x) => *x == ip,
        }
    }
}

/// The engine's connection and handshake-byte budget.
pub struct Budget {
    state: Mutex<State>,
    /// Signalled when handshake bytes are given back or a connection is
    /// evicted (a charge waiting for room re-checks).
    changed: Condvar,
    total: usize,
    per_plane: [usize; 2],
    per_ip: usize,
    max_handshake_bytes: usize,
    evictions: AtomicUsize,
}

/// The outcome of one try at charging handshake bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Charged,
    /// Evicted holders are giving bytes back: try again soon.
    Wait,
    /// This connection was evicted, or its bytes can never fit.
    Refused,
}

/// An admitted connection; dropping it releases its place. It must drop
/// before its socket closes.
pub struct Ticket {
    budget: Arc<Budget>,
    id: u64,
}

impl Budget {
    /// Caps: `total` in all, `handshakes` and `data` per listener, `per_ip`
    /// per peer address, `handshake_bytes` of handshake frames being read.
    pub fn new(total: usize, handshakes: usize, data: usize, per_ip: usize, handshake_bytes: usize) -> Budget {
        Budget {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            total: total.max(2),
            per_plane: [handshakes.max(1), data.max(1)],
            per_ip: per_ip.max(1),
            max_handshake_bytes: handshake_bytes,
            evictions: AtomicUsize::new(0),
        }
    }

    /// Admit a connection from `ip` on `plane`, making room by eviction if
    /// a cap is reached; `None` if no room can be made (all busy).
    pub fn admit(self: &Arc<Self>, plane: Plane, ip: IpAddr, fd: RawFd) -> Option<Ticket> {
        let mut st = self.state.lock();
        let p = slot(plane);
        let mut evicted = 0;
        if st.per_ip.get(&ip).copied().unwrap_or(0) >= self.per_ip {
            if !(st.evict(plane, Some(ip)) || st.evict(other(plane), Some(ip))) {
                return None;
            }
            evicted += 1;
        }
        if st.live[p] >= self.per_plane[p] {
            if !st.evict(plane, None) {
                return None;
            }
            evicted += 1;
        }
        if st.live_total() >= self.total {
            if !(st.evict(plane, None) || st.evict(other(plane), None)) {
                return None;
            }
            evicted += 1;
        }
        let id = st.next;
        st.next += 1;
        st.clock += 1;
        let used = st.clock;
        let opened = Instant::now();
        let entry = Entry {
            fd,
            ip,
            plane,
            opened,
            progress: opened,
            settled: false,
            used,
            busy: false,
            evicted: false,
            charged: 0,
        };
        st.entries.insert(id, entry);
        st.live[p] += 1;
        *st.per_ip.entry(ip).or_default() += 1;
        drop(st);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
            self.changed.notify_all(); // an evicted connection may be waiting to charge
        }
        Some(Ticket { budget: self.clone(), id })
    }

    /// Evicted connections not closed yet, at most: past it the accept
    /// loops wait ([`Budget::wait_for_closing`]).
    fn closing_cap(&self) -> usize {
        (self.total / 8).max(8)
    }

    /// Wait, until `deadline` at the latest, while evicted connections
    /// whose owners have not closed them yet are at their cap. An eviction
    /// only shuts a socket down; its owner (a readiness loop that may be
    /// behind) closes it. Without this wait a flood of connections, each
    /// evicting an older one, holds descriptors faster than they are closed
    /// (466 against a cap of 256 in a loaded run); while it waits, new
    /// connections queue in the kernel's backlog, which costs none.
    pub fn wait_for_closing(&self, deadline: Instant) {
        let mut st = self.state.lock();
        while st.closing >= self.closing_cap() {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return;
            }
        }
    }

    /// Wait, until `deadline` at the latest, while the handshake cap is
    /// reached and every handshake is making progress; true once one more
    /// can be admitted (a place is free, or a stalled handshake can be
    /// shed). Under a burst of healthy peers the accept loop waits here
    /// and new connections wait in the kernel's backlog instead of shedding
    /// a peer whose frame is on its way.
    pub fn wait_for_handshake_room(&self, deadline: Instant) -> bool {
        let p = slot(Plane::Handshake);
        let mut st = self.state.lock();
        loop {
            let now = Instant::now();
            if st.live[p] < self.per_plane[p] || st.victim(Plane::Handshake, None, now).is_some() {
                return true;
            }
            // A handshake becomes stalled with time, not only when one
            // leaves (which wakes us): look again soon.
            let until = deadline.min(now + HANDSHAKE_IDLE / 4);
            if self.changed.wait_until(&mut st, until).timed_out() && Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Handshake bytes charged now.
    #[cfg(test)]
    pub fn handshake_bytes_in_flight(&self) -> usize {
        self.state.lock().handshake_bytes
    }

    /// Connections evicted so far.
    #[cfg(test)]
    pub fn evictions(&self) -> usize {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The caps (total, handshake, data, per address).
    pub fn caps(&self) -> (usize, usize, usize, usize) {
        (self.total, self.per_plane[0], self.per_plane[1], self.per_ip)
    }
}

fn other(plane: Plane) -> Plane {
    match plane {
        Plane::Handshake => Plane::Data,
        Plane::Data => Plane::Handshake,
    }
}

impl Ticket {
    /// Charge `n` handshake frame bytes this connection has just received.
    /// When they do not fit, the slowest other holders are shut down until
    /// what they hold covers the shortfall, and this waits until their
    /// threads give it back. False (the connection should close) only if
    /// this connection was evicted meanwhile or `deadline` passed.
    pub fn charge_handshake(&self, n: usize, deadline: Instant) -> bool {
        let budget = &*self.budget;
        let mut st = budget.state.lock();
        loop {
            match self.charge_locked(&mut st, n) {
                Charge::Charged => return true,
                Charge::Refused => return false,
                Charge::Wait => {
                    if budget.changed.wait_until(&mut st, deadline).timed_out() {
                        return false;
                    }
                }
            }
        }
    }

    /// [`Ticket::charge_handshake`] without the wait: for a readiness loop,
    /// which charges bytes before it takes them from the socket and asks
    /// again (until its deadline) when told to wait.
    pub fn try_charge_handshake(&self, n: usize) -> Charge {
        self.charge_locked(&mut self.budget.state.lock(), n)
    }

    /// Give back `n` of the bytes charged (charged for, then not received).
    pub fn refund_handshake(&self, n: usize) {
        let mut st = self.budget.state.lock();
        let Some(me) = st.entries.get_mut(&self.id) else { return };
        let n = n.min(me.charged);
        me.charged -= n;
        st.handshake_bytes -= n;
        drop(st);
        self.budget.changed.notify_all();
    }

    /// One try at charging `n` bytes, evicting the slowest holders when they
    /// do not fit.
    fn charge_locked(&self, st: &mut State, n: usize) -> Charge {
        let budget = &*self.budget;
        match st.entries.get(&self.id) {
            Some(me) if !me.evicted => {}
            _ => return Charge::Refused,
        }
        let wanted = st.handshake_bytes.saturating_add(n);
        if wanted <= budget.max_handshake_bytes {
            st.handshake_bytes = wanted;
            if let Some(me) = st.entries.get_mut(&self.id) {
                me.charged += n;
                me.progress = Instant::now();
            }
            return Charge::Charged;
        }
        let short = wanted - budget.max_handshake_bytes;
        let (mut coming, now, mut evicted) = (st.reclaiming(), Instant::now(), 0);
        while coming < short {
            let Some(id) = st.slowest_holder(self.id, now) else { break };
            coming += st.entries.get(&id).map_or(0, |e| e.charged);
            st.evict_id(id);
            evicted += 1;
        }
        if evicted > 0 {
            budget.evictions.fetch_add(evicted, Ordering::Relaxed);
            budget.changed.notify_all(); // an evicted holder may be waiting to charge
        }
        if coming < short {
            // Nothing left to take but this connection's own bytes: it
            // would hold more than the whole budget, which one frame (at
            // most a quarter of it) never does.
            return Charge::Refused;
        }
        Charge::Wait
    }

    /// Give back the handshake bytes this connection holds (its frame was
    /// read and parsed, or it is closing).
    pub fn release_handshake(&self) {
        if self.budget.state.lock().release(self.id) {
            self.budget.changed.notify_all();
        }
    }

    /// A handshake moved bytes (either way): it is not stalled.
    pub fn note_progress(&self) {
        if let Some(e) = self.budget.state.lock().entries.get_mut(&self.id) {
            e.progress = Instant::now();
        }
    }

    /// A handshake was answered: shedding it loses nothing.
    pub fn settle(&self) {
        let mut st = self.budget.state.lock();
        if let Some(e) = st.entries.get_mut(&self.id) {
            e.settled = true;
        }
        drop(st);
        self.budget.changed.notify_all(); // an accept loop may wait for room
    }

    /// A request (or hello) is in flight (`true`) or done; busy connections
    /// are never evicted, and finishing one makes it the most recently used.
    pub fn set_busy(&self, busy: bool) {
        let mut st = self.budget.state.lock();
        st.clock += 1;
        let clock = st.clock;
        if let Some(e) = st.entries.get_mut(&self.id) {
            e.busy = busy;
            e.used = clock;
            e.settled = true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.budget.state.lock();
        if st.release(self.id) {
            self.budget.changed.notify_all();
        }
        if let Some(e) = st.entries.remove(&self.id) {
            if e.evicted {
                st.closing -= 1;
                self.budget.changed.notify_all(); // the accept loop may wait for it
            } else {
                st.live[slot(e.plane)] -= 1;
                if let Some(n) = st.per_ip.get_mut(&e.ip) {
                    *n -= 1;
                }
                if e.plane == Plane::Handshake {
                    self.budget.changed.notify_all(); // the accept loop may wait for room
                }
            }
            if st.per_ip.get(&e.ip) == Some(&0) {
                st.per_ip.remove(&e.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn full_caps_evict_a_stalled_handshake_and_the_lru_idle_data_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = Arc::new(Budget::new(100, 2, 3, 100, 1 << 20));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let conns: Vec<_> = (0..6).map(|_| pair(&l)).collect();
        let fd = |i: usize| conns[i].1.as_raw_fd();
        let h0 = b.admit(Plane::Handshake, ip, fd(0)).unwrap();
        let h1 = b.admit(Plane::Handshake, ip, fd(1)).unwrap();
        // Both make progress: a newcomer waits, nobody is shed.
        assert!(b.admit(Plane::Handshake, ip, fd(2)).is_none(), "a handshake making progress was shed");
        assert!(!b.wait_for_handshake_room(Instant::now() + Duration::from_millis(20)));
        std::thread::sleep(HANDSHAKE_IDLE + Duration::from_millis(20));
        h1.note_progress();
        // h0 is idle past the bound with nothing queued: it gives way.
        assert!(b.wait_for_handshake_room(Instant::now()));
        let _h2 = b.admit(Plane::Handshake, ip, fd(2)).unwrap(); // evicts h0
        let mut byte = [0u8; 1];
        assert_eq!((&conns[0].0).read(&mut byte).unwrap(), 0, "the stalled handshake was shut down");
        conns[1].0.set_nonblocking(true).unwrap();
        assert!((&conns[1].0).read(&mut byte).is_err(), "the one making progress is still open");
        drop(h0);
        let d3 = b.admit(Plane::Data, ip, fd(3)).unwrap();
        let d4 = b.admit(Plane::Data, ip, fd(4)).unwrap();
        d4.set_busy(false); // served once, idle now
        d3.set_busy(true);
        let d5 = b.admit(Plane::Data, ip, fd(5)).unwrap();
        d5.set_busy(false);
        // Full: the idle d4 goes, never the busy d3.
        let extra = pair(&l);
        let _d6 = b.admit(Plane::Data, ip, extra.1.as_raw_fd()).unwrap();
        assert_eq!((&conns[4].0).read(&mut byte).unwrap(), 0, "the idle data connection was evicted");
        conns[3].0.set_nonblocking(true).unwrap();
        assert!((&conns[3].0).read(&mut byte).is_err(), "the busy one is still open");
        assert_eq!(b.evictions(), 2);
        drop(d4);
    }

    /// Evicted connections whose owners have not closed them count against
    /// the accept loop: at the cap (8 here) it waits, until its deadline or
    /// until an owner closes one.
    #[test]
    fn accepts_wait_while_evicted_connections_are_not_closed_yet() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = Arc::new(Budget::new(16, 4, 4, 100, 1 << 20));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let conns: Vec<_> = (0..12).map(|_| pair(&l)).collect();
        // Four fill the data cap; each of the next eight evicts one.
        let tickets: Vec<Ticket> = conns
            .iter()
            .map(|c| {
                let t = b.admit(Plane::Data, ip, c.1.as_raw_fd()).unwrap();
                t.set_busy(false); // served once, idle now: may be evicted
                t
            })
            .collect();
        assert_eq!(b.state.lock().closing, 8);
        let t0 = Instant::now();
        b.wait_for_closing(t0 + Duration::from_millis(200));
        assert!(t0.elapsed() >= Duration::from_millis(200), "at the cap: waited to the deadline");
        // An owner closes one evicted connection: the wait ends at once.
        let mut tickets = tickets.into_iter();
        let first = tickets.next().unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(first);
        });
        let t0 = Instant::now();
        b.wait_for_closing(t0 + Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(10), "woken by the close, not the deadline");
        assert_eq!(b.state.lock().closing, 7);
        closer.join().unwrap();
    }

    /// Hold `ticket` until the server side of `conn` is shut down, as a
    /// handshake thread blocked in a read does; then leave.
    fn serve(conn: &(TcpStream, TcpStream), ticket: Ticket) -> std::thread::JoinHandle<()> {
        let s = conn.1.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            let _ = (&s).read(&mut byte);
            drop(ticket);
        })
    }

    fn closed(conn: &(TcpStream, TcpStream)) -> bool {
        conn.0.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        matches!((&conn.0).read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn a_short_handshake_budget_is_taken_back_from_the_slowest_holders() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = Arc::new(Budget::new(100, 8, 8, 100, 1000));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let soon = || Instant::now() + Duration::from_secs(5);
        let conns: Vec<_> = (0..4).map(|_| pair(&l)).collect();
        let admit = |i: usize| b.admit(Plane::Handshake, ip, conns[i].1.as_raw_fd()).unwrap();
        // Two slow holders (few bytes over 300 ms), then a fast one.
        let (slow1, slow2) = (admit(0), admit(1));
        assert!(slow1.charge_handshake(50, soon()) && slow2.charge_handshake(60, soon()));
        std::thread::sleep(Duration::from_millis(300));
        let fast = admit(2);
        assert!(fast.charge_handshake(500, soon()));
        let threads = [serve(&conns[0], slow1), serve(&conns[1], slow2)];
        // The newcomer's 500 bytes are 110 short: both slow holders (110
        // bytes together) are shut down, not the fast one, not the newcomer.
        let newcomer = admit(3);
        assert!(newcomer.charge_handshake(500, soon()), "the newcomer is charged once the slow holders left");
        assert_eq!(b.handshake_bytes_in_flight(), 1000);
        assert!(closed(&conns[0]) && closed(&conns[1]), "the slowest holders were shut down");
        conns[2].0.set_nonblocking(true).unwrap();
        assert!((&conns[2].0).read(&mut [0u8; 1]).is_err(), "the fast holder is still open");
        assert_eq!(b.evictions(), 2);
        for t in threads {
            t.join().unwrap();
        }
        newcomer.release_handshake();
        assert_eq!(b.handshake_bytes_in_flight(), 500);
        drop(fast);
        assert_eq!(b.handshake_bytes_in_flight(), 0, "a closing connection gives its bytes back");
    }

    #[test]
    fn a_charge_never_passes_the_budget_and_waits_at_most_until_its_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = Arc::new(Budget::new(100, 8, 8, 100, 1000));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let conns: Vec<_> = (0..2).map(|_| pair(&l)).collect();
        let stuck = b.admit(Plane::Handshake, ip, conns[0].1.as_raw_fd()).unwrap();
        let other = b.admit(Plane::Handshake, ip, conns[1].1.as_raw_fd()).unwrap();
        assert!(stuck.charge_handshake(900, Instant::now()));
        // The holder is shut down, but its bytes are not given back (nobody
        // drops its ticket): the charge waits until its deadline, then fails.
        let t0 = Instant::now();
        assert!(!other.charge_handshake(200, t0 + Duration::from_millis(100)));
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert!(closed(&conns[0]), "the holder was shut down");
        assert_eq!(b.handshake_bytes_in_flight(), 900, "nothing was charged past the budget");
        assert!(!stuck.charge_handshake(1, Instant::now() + Duration::from_secs(5)), "an evicted holder is done");
        drop(stuck);
        assert!(other.charge_handshake(200, Instant::now()));
        assert_eq!(b.handshake_bytes_in_flight(), 200);
    }
}
