//! What strangers' connections can make an engine hold, bounded.
//!
//! Every inbound connection is admitted against caps: in total (derived from
//! `RLIMIT_NOFILE`, leaving most descriptors to the host), per listener, and
//! per peer address. When a cap is reached the engine makes room instead of
//! refusing the newcomer: a handshake connection evicts the oldest handshake
//! connection (a real exchange takes milliseconds; the oldest one is the
//! slowest), a data connection evicts the least recently used *idle* data
//! connection (never one with a request in flight). Eviction shuts the
//! socket down; its thread sees that and leaves. So a connected peer's probe,
//! notify or new lane is never refused because of strangers' connections,
//! and eviction happens only under pressure (an evicted Mooncake initiator's
//! next request on it fails once). Handshake bytes being read are charged to
//! one engine-wide budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::server::Plane;

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
    /// Last use (a tick of `State::clock`), for least-recently-used order.
    used: u64,
    busy: bool,
    evicted: bool,
}

#[derive(Default)]
struct State {
    next: u64,
    clock: u64,
    entries: HashMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
    /// Live (not evicted) entries per plane: handshake, data.
    live: [usize; 2],
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
    /// given): the oldest handshake, or the least recently used idle data
    /// connection. Busy connections are never chosen.
    fn evict(&mut self, want: Plane, ip: Option<IpAddr>) -> bool {
        let candidates =
            self.entries.iter().filter(|(_, e)| !e.evicted && !e.busy && e.plane == want && ip.is_none_or_eq(e.ip));
        let victim = match want {
            Plane::Handshake => candidates.min_by_key(|(_, e)| e.opened).map(|(id, _)| *id),
            Plane::Data => candidates.min_by_key(|(_, e)| e.used).map(|(id, _)| *id),
        };
        let Some(e) = victim.and_then(|id| self.entries.get_mut(&id)) else { return false };
        e.evicted = true;
        let (plane, ip, fd) = (e.plane, e.ip, e.fd);
        self.live[slot(plane)] -= 1;
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
        }
        // SAFETY: a listed descriptor is open (tickets drop, under the
        // budget's lock, before their socket closes); shutdown only changes
        // the socket's state, its owner still closes it.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        true
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
    total: usize,
    per_plane: [usize; 2],
    per_ip: usize,
    handshake_bytes: AtomicUsize,
    max_handshake_bytes: usize,
    evictions: AtomicUsize,
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
            total: total.max(2),
            per_plane: [handshakes.max(1), data.max(1)],
            per_ip: per_ip.max(1),
            handshake_bytes: AtomicUsize::new(0),
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
        if st.live_total() >= self.total && !(st.evict(plane, None) || st.evict(other(plane), None)) {
            return None;
        }
        let id = st.next;
        st.next += 1;
        st.clock += 1;
        let used = st.clock;
        st.entries.insert(id, Entry { fd, ip, plane, opened: Instant::now(), used, busy: false, evicted: false });
        st.live[p] += 1;
        *st.per_ip.entry(ip).or_default() += 1;
        drop(st);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        Some(Ticket { budget: self.clone(), id })
    }

    /// Charge `n` bytes of a handshake frame being read; false if the
    /// engine-wide budget is spent (the connection should close).
    pub fn charge_handshake(&self, n: usize) -> bool {
        let mut cur = self.handshake_bytes.load(Ordering::Acquire);
        loop {
            if cur.saturating_add(n) > self.max_handshake_bytes {
                return false;
            }
            match self.handshake_bytes.compare_exchange(cur, cur + n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Give back `n` charged handshake bytes.
    pub fn refund_handshake(&self, n: usize) {
        self.handshake_bytes.fetch_sub(n, Ordering::AcqRel);
    }

    /// Handshake bytes charged now.
    #[cfg(test)]
    pub fn handshake_bytes_in_flight(&self) -> usize {
        self.handshake_bytes.load(Ordering::Acquire)
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
    /// A request is in flight (`true`) or done; busy connections are never
    /// evicted, and finishing one makes it the most recently used.
    pub fn set_busy(&self, busy: bool) {
        let mut st = self.budget.state.lock();
        st.clock += 1;
        let clock = st.clock;
        if let Some(e) = st.entries.get_mut(&self.id) {
            e.busy = busy;
            e.used = clock;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.budget.state.lock();
        if let Some(e) = st.entries.remove(&self.id) {
            if !e.evicted {
                st.live[slot(e.plane)] -= 1;
                if let Some(n) = st.per_ip.get_mut(&e.ip) {
                    *n -= 1;
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
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn full_caps_evict_the_oldest_handshake_and_the_lru_idle_data_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = Arc::new(Budget::new(100, 2, 3, 100, 1 << 20));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let conns: Vec<_> = (0..6).map(|_| pair(&l)).collect();
        let fd = |i: usize| conns[i].1.as_raw_fd();
        let h0 = b.admit(Plane::Handshake, ip, fd(0)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let _h1 = b.admit(Plane::Handshake, ip, fd(1)).unwrap();
        let _h2 = b.admit(Plane::Handshake, ip, fd(2)).unwrap(); // evicts h0
        let mut byte = [0u8; 1];
        use std::io::Read;
        assert_eq!((&conns[0].0).read(&mut byte).unwrap(), 0, "the oldest handshake was shut down");
        drop(h0);
        let d3 = b.admit(Plane::Data, ip, fd(3)).unwrap();
        let d4 = b.admit(Plane::Data, ip, fd(4)).unwrap();
        d3.set_busy(true);
        let _d5 = b.admit(Plane::Data, ip, fd(5)).unwrap();
        // Full: the idle d4 goes, never the busy d3.
        let extra = pair(&l);
        let _d6 = b.admit(Plane::Data, ip, extra.1.as_raw_fd()).unwrap();
        assert_eq!((&conns[4].0).read(&mut byte).unwrap(), 0, "the idle data connection was evicted");
        conns[3].0.set_nonblocking(true).unwrap();
        assert!((&conns[3].0).read(&mut byte).is_err(), "the busy one is still open");
        assert_eq!(b.evictions(), 2);
        drop(d4);
        assert!(b.charge_handshake(1 << 20) && !b.charge_handshake(1));
        b.refund_handshake(1 << 20);
        assert!(b.charge_handshake(1));
    }
}
