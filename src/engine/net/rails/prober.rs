//! The engine's one prober of down rails.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::super::registry::Registry;
use super::state::{Probing, Rail, RailSet, RailState};
use super::LOG_TARGET;

/// How often a down rail is probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Bound on one round's probe connects (all in flight together).
const PROBE_CONNECT: Duration = Duration::from_millis(500);
/// Most probe connects in flight at once (sockets held by a round); more
/// down rails than this take turns, round by round.
const PROBES_PER_ROUND: usize = 256;
/// The name of an engine's one rail-probe thread.
pub(crate) const PROBE_THREAD: &str = "pdx-rail-probe";

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

impl Probing for Prober {
    /// Probe `rail` of `set` from the next round; the thread starts if it
    /// is not running.
    fn add(self: Arc<Self>, set: &Arc<RailSet>, rail: &Arc<Rail>) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
