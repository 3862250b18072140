//! The server: everything on the side that serves a transfer. The two
//! listening sockets ([`listen`]), who may connect ([`access`]), what
//! strangers' connections may make the engine hold ([`budget`]), the accept
//! loop here, the handshake port in [`handshake`] (one framed JSON request
//! per connection, all connections assembled and answered on one readiness
//! loop), the data port in [`data`] (persistent connections carrying
//! 24-byte requests, served by the bounded pool of [`pool`]) and the
//! notifications peers sent ([`notify`]). Everything a peer sends is bounded
//! and checked; a bad peer loses its connection, never the engine.
//!
//! May use: [`protocol`](super::protocol), [`net`](super::net),
//! [`memory`](super::memory), [`samehost`](super::samehost) (serving the
//! same-host link), the initiator's handshake client only for the engine's
//! own descriptor, and the engine's settings, registry and shared state
//! (through a [`Serving`], never `Inner` whole).

pub(super) mod access;
mod acks;
mod budget;
mod data;
mod device;
mod handshake;
mod listen;
mod local;
mod notify;
mod pool;

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::initiator::dialer::Dialer;
use super::memory::regions::Regions;
use super::memory::staging::Staging;
use super::net::conn::Conn;
use super::protocol::Identity;
use super::registry::Registry;
use super::settings::Settings;
use super::Inner;
use crate::transfer::stats::Stats;
pub(super) use access::Access;
pub(super) use budget::{fd_limit, total_for, Budget, Plane};
pub(super) use listen::{bind_in_range, wake_listener};
pub(super) use notify::Notifications;
#[cfg(test)]
pub(super) use pool::FIRST_REQUEST_BOUND;

/// How long an accept loop waits at most for evicted connections to be
/// closed before it takes the next one anyway (see
/// [`Budget::wait_for_closing`]): a slow owner delays accepts, never stops them.
const CLOSING_WAIT: Duration = Duration::from_millis(100);

/// The parts of the engine's state that serving inbound connections uses
/// (shared with the engine, or copies of what never changes), so that the
/// modules serving them never see the rest.
pub(super) struct Serving {
    settings: Settings,
    identity: Identity,
    registry: Arc<Registry>,
    regions: Arc<Regions>,
    stats: Arc<Stats>,
    access: Arc<Access>,
    budget: Arc<Budget>,
    /// Pinned buffers for inbound requests on device memory.
    staging: Arc<Staging>,
    /// Answers metadata requests with our descriptor.
    dialer: Arc<Dialer>,
    /// Where inbound notifications are queued.
    notifications: Arc<Notifications>,
}

impl Serving {
    pub(super) fn of(inner: &Inner) -> Serving {
        Serving {
            settings: inner.settings.clone(),
            identity: inner.identity.clone(),
            registry: inner.registry.clone(),
            regions: inner.regions.clone(),
            stats: inner.stats.clone(),
            access: inner.access.clone(),
            budget: inner.budget.clone(),
            staging: inner.staging.clone(),
            dialer: inner.peers.dialer().clone(),
            notifications: inner.notifications.clone(),
        }
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

/// Logs accept failures at most once a second and backs off between them
/// (10 ms doubling to 1 s; reset by the next success).
#[derive(Default)]
struct AcceptBackoff {
    delay_ms: u64,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    fn failed(&mut self, e: &io::Error) {
        let (log_now, delay) = self.next(Instant::now());
        if let Some(suppressed) = log_now {
            log::warn!("accept failed: {e} ({suppressed} more failures not logged)");
        }
        std::thread::sleep(delay);
    }

    /// What a failure at `now` does: whether to log it (with the count of
    /// failures not logged since the last line), and how long to back off.
    fn next(&mut self, now: Instant) -> (Option<u64>, Duration) {
        let log_now = match self.last_log {
            Some(t) if now.saturating_duration_since(t) < Duration::from_secs(1) => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_log = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        };
        self.delay_ms = (self.delay_ms * 2).clamp(10, 1000);
        (log_now, Duration::from_millis(self.delay_ms))
    }

    fn succeeded(&mut self) {
        self.delay_ms = 0;
    }
}

/// A handshake connection with its place in the budget. Fields drop in
/// order: the ticket (it names the descriptor) before the socket closes.
struct AdmittedHandshake {
    ticket: budget::Ticket,
    stream: std::net::TcpStream,
}

/// How long an accepted connection waits at most for a place when none can
/// be made at once (every connection on its plane is making progress).
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// Admit a connection on `plane`, waiting (bounded) for room rather than
/// shedding a connection that makes progress (a handshake answering, a
/// new lane sending its hello); `None` (it is closed) only if no room
/// came in time.
fn admit_with_room(serving: &Serving, plane: Plane, ip: std::net::IpAddr, fd: RawFd) -> Option<budget::Ticket> {
    let until = Instant::now() + ROOM_WAIT;
    loop {
        if let Some(ticket) = serving.budget.admit(plane, ip, fd) {
            return Some(ticket);
        }
        if serving.registry.stopping() || Instant::now() >= until {
            log::debug!("{plane:?} connection from {ip} closed: no room for it");
            return None;
        }
        if plane == Plane::Handshake && !serving.budget.wait_for_handshake_room(until) {
            continue;
        }
        // A place frees as a connection ends or becomes stalled, soon.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Accept connections until the engine stops (see [`budget`] for
/// the caps and eviction): a handshake connection goes to the readiness
/// loop of [`handshake`], a data connection to the pool of [`pool`] (either,
/// if its loop could not start, to a thread of its own).
pub fn accept_loop(serving: Arc<Serving>, listener: TcpListener, plane: Plane) {
    let mut backoff = AcceptBackoff::default();
    let name = match plane {
        Plane::Handshake => "pdx-handshake",
        Plane::Data => "pdx-data",
    };
    let pool = match plane {
        Plane::Handshake => None,
        Plane::Data => pool::DataPlane::start(&serving)
            .map_err(|e| log::warn!("data connections get a thread each: the readiness loop cannot start ({e})"))
            .ok(),
    };
    let shakes = match plane {
        Plane::Handshake => handshake::HandshakePlane::start(&serving)
            .map_err(|e| log::warn!("handshake connections get a thread each: the readiness loop cannot start ({e})"))
            .ok(),
        Plane::Data => None,
    };
    loop {
        // Evicted connections are closed by their owners: accept no faster.
        serving.budget.wait_for_closing(Instant::now() + CLOSING_WAIT);
        if plane == Plane::Handshake {
            // At the cap, only a stalled handshake may give way: until one
            // does, peers wait in the backlog (see [`budget`]).
            while !serving.budget.wait_for_handshake_room(Instant::now() + CLOSING_WAIT) {
                if serving.registry.stopping() {
                    break;
                }
            }
        }
        let accepted = listener.accept();
        if serving.registry.stopping() {
            if let Some(pool) = &pool {
                pool.wake();
            }
            if let Some(shakes) = &shakes {
                shakes.wake();
            }
            return;
        }
        let (stream, from) = match accepted {
            Ok(pair) => pair,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                backoff.failed(&e);
                continue;
            }
        };
        backoff.succeeded();
        if !serving.access.allowlist.admits(from.ip()) {
            // Closed before a byte is read (PDX_ALLOWED_PEERS); counted first,
            // so that whoever sees the close sees the count.
            Stats::bump(&serving.stats.connections_refused_address);
            drop(stream);
            serving.access.log_refusal(from.ip(), &format!("not in the allowed peers ({plane:?} port)"));
            continue;
        }
        if let (Some(pool), Plane::Data) = (&pool, plane) {
            let t = serving.settings.progress_timeout;
            let Ok(conn) = Conn::new(stream, t, t) else { continue };
            let Some(ticket) = admit_with_room(&serving, plane, from.ip(), conn.raw_fd()) else { continue };
            let Some(tracked) = serving.registry.track_owned(conn.stream()) else { continue };
            pool.admit(conn, ticket, tracked);
            continue;
        }
        if let (Some(shakes), Plane::Handshake) = (&shakes, plane) {
            // Admitted here (the oldest evicted at the cap), then assembled
            // and answered on the loop: no thread per connection.
            let Some(ticket) = admit_with_room(&serving, plane, from.ip(), stream.as_raw_fd()) else { continue };
            shakes.admit(ticket, stream);
            continue;
        }
        let serving2 = serving.clone();
        let spawned = match plane {
            Plane::Handshake => {
                // Admitted before its thread starts, so that the handshake
                // threads alive at once are bounded by the cap
                // (`PDX_MAX_HANDSHAKE_CONNECTIONS`: the oldest is evicted and
                // its thread leaves) however many peers connect at once.
                let Some(ticket) = admit_with_room(&serving, plane, from.ip(), stream.as_raw_fd()) else { continue };
                let admitted = AdmittedHandshake { ticket, stream };
                serving.registry.spawn(name.to_owned(), move || {
                    let _open = OpenConnection::new(&serving2.stats);
                    let mut admitted = admitted;
                    let Some(_tracked) = serving2.registry.track(&admitted.stream) else { return };
                    handshake::serve_handshake(&serving2, &mut admitted.stream, &admitted.ticket);
                })
            }
            Plane::Data => serving.registry.spawn(name.to_owned(), move || {
                let _open = OpenConnection::new(&serving2.stats);
                let t = serving2.settings.progress_timeout;
                let Ok(mut conn) = Conn::new(stream, t, t) else { return };
                let Some(ticket) = serving2.budget.admit(plane, from.ip(), conn.raw_fd()) else { return };
                let Some(_tracked) = serving2.registry.track(conn.stream()) else { return };
                data::serve_data(&serving2, &mut conn, &ticket, None, &|_| {}, &mut 0);
            }),
        };
        if let Err(e) = spawned {
            log::warn!("could not start a connection thread: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_to_a_second_and_log_at_most_once_a_second() {
        let mut b = AcceptBackoff::default();
        let start = Instant::now();
        let (mut now, mut lines, mut counted) = (start, 0u64, 0u64);
        let mut delays = Vec::new();
        // 10 s of back-to-back failures, each after the delay the last one asked for.
        while now < start + Duration::from_secs(10) {
            let (log_now, delay) = b.next(now);
            if let Some(suppressed) = log_now {
                lines += 1;
                counted += suppressed + 1;
            }
            delays.push(delay);
            now += delay;
        }
        assert_eq!(delays[..4], [10, 20, 40, 80].map(Duration::from_millis));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(lines <= 11, "{lines} log lines in 10 s");
        assert_eq!(counted + b.suppressed, delays.len() as u64, "every failure is logged or counted");
        b.succeeded();
        assert_eq!(b.next(now + Duration::from_secs(2)).1, Duration::from_millis(10), "success resets the delay");
    }
}
