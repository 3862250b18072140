//! Engine statistics: counters every backend keeps since it started, cheap
//! enough to leave on (relaxed atomics, no lock, no allocation), and a
//! latency histogram of completed tasks.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::Direction;
use crate::error::ErrorKind;

/// Why failed tasks failed, as counted (the rest count as `other`).
pub const FAILURE_KINDS: [ErrorKind; 6] = [
    ErrorKind::Timeout,
    ErrorKind::ConnectionLost,
    ErrorKind::PeerUnreachable,
    ErrorKind::RemoteRejected,
    ErrorKind::Shutdown,
    ErrorKind::Protocol,
];

/// Histogram buckets: four per power of two of microseconds, up to ~2^31 µs.
const BUCKETS: usize = 128;

/// Latencies in microseconds on a log scale (at most 19% wide buckets).
pub struct Latency {
    buckets: [AtomicU64; BUCKETS],
}

fn bucket_of(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let log2 = 63 - us.leading_zeros() as usize; // >= 2
    let quarter = ((us >> (log2 - 2)) & 3) as usize;
    (4 * (log2 - 1) + quarter).min(BUCKETS - 1)
}

/// The smallest latency (µs) that falls in bucket `b`.
fn bucket_floor(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let log2 = b / 4 + 1;
    (4 + (b % 4) as u64) << (log2 - 2)
}

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl Latency {
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)].fetch_add(1, Relaxed);
    }

    /// The `q` quantile (0..=1) in µs: the upper edge of the bucket that
    /// holds it (0 when nothing was recorded).
    pub fn quantile_us(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_floor(b + 1).saturating_sub(1).max(bucket_floor(b));
            }
        }
        bucket_floor(BUCKETS - 1)
    }
}

/// The counters of one engine. Initiator-side counters come from every
/// backend; target-side ones (`served_*`, handshakes, inbound connections)
/// only from engines that serve peers themselves (the native one).
#[derive(Default)]
pub struct Stats {
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub tasks_written: AtomicU64,
    pub tasks_read: AtomicU64,
    pub tasks_failed: AtomicU64,
    /// Failed tasks by [`FAILURE_KINDS`], then everything else.
    pub failed_by_kind: [AtomicU64; FAILURE_KINDS.len() + 1],
    pub served_bytes_written: AtomicU64,
    pub served_bytes_read: AtomicU64,
    pub served_writes: AtomicU64,
    pub served_reads: AtomicU64,
    pub requests_refused: AtomicU64,
    /// Requests of peers that failed on a device (CUDA) call while being
    /// served: rejected on the wire like a bad range, counted apart here.
    pub served_device_failures: AtomicU64,
    pub handshakes: AtomicU64,
    pub inbound_connections: AtomicU64,
    /// Inbound connections open now.
    pub inbound_open: AtomicU64,
    pub latency: Latency,
}

impl Stats {
    /// A task of `bytes` in `direction` completed, `elapsed` after it started.
    pub fn completed(&self, direction: Direction, bytes: u64, elapsed: Duration) {
        let (b, n) = match direction {
            Direction::Write => (&self.bytes_written, &self.tasks_written),
            Direction::Read => (&self.bytes_read, &self.tasks_read),
        };
        b.fetch_add(bytes, Relaxed);
        n.fetch_add(1, Relaxed);
        self.latency.record(elapsed);
    }

    /// A task failed with `kind`.
    pub fn failed(&self, kind: ErrorKind) {
        self.tasks_failed.fetch_add(1, Relaxed);
        let i = FAILURE_KINDS.iter().position(|k| *k == kind).unwrap_or(FAILURE_KINDS.len());
        self.failed_by_kind[i].fetch_add(1, Relaxed);
    }

    /// An inbound request of `bytes` in `direction` was served.
    pub fn served(&self, direction: Direction, bytes: u64) {
        let (b, n) = match direction {
            Direction::Write => (&self.served_bytes_written, &self.served_writes),
            Direction::Read => (&self.served_bytes_read, &self.served_reads),
        };
        b.fetch_add(bytes, Relaxed);
        n.fetch_add(1, Relaxed);
    }

    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// A consistent-enough copy (each counter read once, relaxed).
    pub fn snapshot(&self, gauges: Gauges) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Relaxed);
        StatsSnapshot {
            bytes_written: l(&self.bytes_written),
            bytes_read: l(&self.bytes_read),
            tasks_written: l(&self.tasks_written),
            tasks_read: l(&self.tasks_read),
            tasks_failed: l(&self.tasks_failed),
            failed_by_kind: std::array::from_fn(|i| l(&self.failed_by_kind[i])),
            served_bytes_written: l(&self.served_bytes_written),
            served_bytes_read: l(&self.served_bytes_read),
            served_writes: l(&self.served_writes),
            served_reads: l(&self.served_reads),
            requests_refused: l(&self.requests_refused),
            served_device_failures: l(&self.served_device_failures),
            handshakes: l(&self.handshakes),
            inbound_connections: l(&self.inbound_connections),
            latency_p50_us: self.latency.quantile_us(0.50),
            latency_p99_us: self.latency.quantile_us(0.99),
            gauges,
        }
    }
}

/// Values of the moment, which the backend reads when asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub peers_connected: u64,
    pub inbound_connections_open: u64,
    pub notification_bytes_queued: u64,
}

/// [`Stats`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub tasks_written: u64,
    pub tasks_read: u64,
    pub tasks_failed: u64,
    pub failed_by_kind: [u64; FAILURE_KINDS.len() + 1],
    pub served_bytes_written: u64,
    pub served_bytes_read: u64,
    pub served_writes: u64,
    pub served_reads: u64,
    pub requests_refused: u64,
    pub served_device_failures: u64,
    pub handshakes: u64,
    pub inbound_connections: u64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub gauges: Gauges,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_floors_invert_them() {
        let mut last = 0;
        for us in [0u64, 1, 3, 4, 5, 7, 8, 9, 15, 16, 100, 1000, 1 << 20, u64::MAX] {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            assert!(bucket_floor(b) <= us, "{us}: floor {}", bucket_floor(b));
            last = b;
        }
        for b in 0..BUCKETS - 1 {
            assert_eq!(bucket_of(bucket_floor(b)), b, "bucket {b}");
        }
    }

    #[test]
    fn quantiles_of_a_known_workload() {
        let l = Latency::default();
        assert_eq!(l.quantile_us(0.5), 0);
        for _ in 0..98 {
            l.record(Duration::from_micros(10));
        }
        l.record(Duration::from_millis(5));
        l.record(Duration::from_millis(5));
        let p50 = l.quantile_us(0.5);
        assert!((10..=11).contains(&p50), "{p50}");
        let p99 = l.quantile_us(0.99);
        assert!((5000..=6000).contains(&p99), "{p99}");
    }

    #[test]
    fn counters_add_up() {
        let s = Stats::default();
        s.completed(Direction::Write, 100, Duration::from_micros(3));
        s.completed(Direction::Read, 7, Duration::from_micros(3));
        s.failed(ErrorKind::Timeout);
        s.failed(ErrorKind::Io);
        s.served(Direction::Write, 5);
        let snap = s.snapshot(Gauges { peers_connected: 1, ..Gauges::default() });
        assert_eq!((snap.bytes_written, snap.bytes_read, snap.tasks_written, snap.tasks_read), (100, 7, 1, 1));
        assert_eq!((snap.tasks_failed, snap.failed_by_kind[0], snap.failed_by_kind[6]), (2, 1, 1));
        assert_eq!((snap.served_writes, snap.served_bytes_written, snap.gauges.peers_connected), (1, 5, 1));
        assert_eq!(snap.latency_p50_us, 3);
    }
}
