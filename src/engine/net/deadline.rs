//! Stall deadlines per task, not per system call.
//!
//! A peer's [`Progress`] is the last time any byte moved between us and it
//! (on any lane, or a handshake reply). A task's [`Stall`] clock runs from
//! the later of its start and that instant: a task fails once its peer has
//! made no progress for the configured timeout, however many pieces, lanes
//! or retries it has (a retry never resets the clock; only bytes do), and a
//! transfer that keeps moving bytes is never cut off by a fixed deadline.
//! Blocking socket calls wait in short slices and consult the clock between
//! them, so the failure comes within one slice of the deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The longest a blocking call waits before it looks at the clock again.
pub const SLICE: Duration = Duration::from_millis(100);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn to_nanos(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

/// The last instant bytes moved to or from one peer.
#[derive(Debug)]
pub struct Progress(AtomicU64);

impl Default for Progress {
    fn default() -> Self {
        Progress(AtomicU64::new(to_nanos(Instant::now())))
    }
}

impl Progress {
    /// Bytes moved just now.
    pub fn mark(&self) {
        self.mark_at(Instant::now());
    }

    /// Bytes moved at `t` (progress never moves back).
    pub fn mark_at(&self, t: Instant) {
        self.0.fetch_max(to_nanos(t), Ordering::AcqRel);
    }

    /// When bytes last moved.
    pub fn last(&self) -> Instant {
        epoch() + Duration::from_nanos(self.0.load(Ordering::Acquire))
    }
}

/// One task's stall clock: its start, and its peer's progress.
#[derive(Debug, Clone)]
pub struct Stall {
    progress: Arc<Progress>,
    started: Instant,
}

impl Stall {
    /// A clock for a task starting now.
    pub fn new(progress: Arc<Progress>) -> Stall {
        Stall { progress, started: Instant::now() }
    }

    /// A clock for a task that started at `started`.
    pub fn since(progress: Arc<Progress>, started: Instant) -> Stall {
        Stall { progress, started }
    }

    /// Bytes moved just now.
    pub fn mark(&self) {
        self.progress.mark();
    }

    /// When the task fails if nothing moves before: `limit` after the later
    /// of its start and the peer's last progress.
    pub fn deadline(&self, limit: Duration) -> Instant {
        let base = self.started.max(self.progress.last());
        base.checked_add(limit).unwrap_or(base + Duration::from_secs(86400 * 365))
    }

    /// True once `limit` passed without progress.
    pub fn expired(&self, limit: Duration) -> bool {
        self.expired_at(limit, Instant::now())
    }

    /// True when, at `now`, `limit` has passed without progress.
    fn expired_at(&self, limit: Duration, now: Instant) -> bool {
        now >= self.deadline(limit)
    }
}

/// A stream whose every read and write shares one deadline: each call's
/// socket timeout is what is left, so a peer trickling bytes cannot stretch
/// an exchange past it.
pub struct BoundedStream<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
}

impl<'a> BoundedStream<'a> {
    pub fn new(stream: &'a mut TcpStream, deadline: Instant) -> Self {
        BoundedStream { stream, deadline }
    }

    /// The stream itself.
    pub fn inner(&mut self) -> &mut TcpStream {
        self.stream
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

impl Read for BoundedStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for BoundedStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stall clock on a synthetic clock: instants after `t0`, set by the
    /// test, nothing slept.
    #[test]
    fn progress_moves_the_deadline_and_retries_do_not() {
        let p = Arc::new(Progress::default());
        let t0 = Instant::now(); // not before the peer's first progress
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let limit = Duration::from_millis(200);
        let stall = Stall::since(p.clone(), t0);
        assert_eq!(stall.deadline(limit), at(200), "no progress since the start: the start counts");
        assert!(!stall.expired_at(limit, at(199)) && stall.expired_at(limit, at(200)));
        // A second clock for a retry of the same task keeps the start.
        let retry = Stall::since(p.clone(), stall.started);
        assert_eq!(retry.deadline(limit), at(200));
        // Bytes moved at 50 ms: both clocks slide to 250 ms.
        p.mark_at(at(50));
        assert_eq!((stall.deadline(limit), retry.deadline(limit)), (at(250), at(250)));
        assert!(!stall.expired_at(limit, at(249)) && stall.expired_at(limit, at(250)));
        // An older mark (another lane's, reported late) does not move it back.
        p.mark_at(at(10));
        assert_eq!(stall.deadline(limit), at(250));
        // A task that starts after the peer went quiet gets its own full limit.
        let late = Stall::since(p.clone(), at(400));
        assert!(!late.expired_at(limit, at(599)) && late.expired_at(limit, at(600)));
        assert!(stall.expired_at(limit, at(400)) && retry.expired_at(limit, at(400)));
        // A limit past what an Instant holds is a year, not an overflow.
        assert_eq!(stall.deadline(Duration::MAX), at(50) + Duration::from_secs(86400 * 365));
    }

    /// The real clock is the synthetic one read at `Instant::now()`.
    #[test]
    fn mark_and_expired_read_the_real_clock() {
        let p = Arc::new(Progress::default());
        let stall = Stall::new(p.clone());
        assert!(!stall.expired(Duration::from_secs(3600)));
        assert!(stall.expired(Duration::ZERO));
        let before = Instant::now();
        stall.mark();
        assert!(p.last() >= before && p.last() <= Instant::now());
    }
}
