//! Engine statistics: counters every backend keeps since it started, cheap
//! enough to leave on (relaxed atomics, no lock, no allocation), a
//! latency histogram of completed tasks for the quantiles of `pdx_stats`,
//! the fixed-bucket histograms of task latency and size the Prometheus
//! exposition shows ([`super::metrics`]), and figures per peer
//! ([`super::peer_stats`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

// Handed on so that readers of a snapshot's failed-by-kind array find the
// slots' meaning next to it.
pub use super::counter_index::{dir_index, kind_index, kind_label, FAILURE_KINDS};
use super::peer_stats::{PeerCounters, PeerTable};
use super::Direction;
use crate::error::{Error, ErrorKind};

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

/// Upper bounds (inclusive, µs) of the task latency histogram's buckets.
pub const LATENCY_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000, 30_000_000,
];
/// Upper bounds (inclusive, bytes) of the task size histogram's buckets.
pub const SIZE_BOUNDS_BYTES: &[u64] =
    &[1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30];

/// A histogram of fixed buckets (`value <= bound`, one more for the rest)
/// with the sum of what it counted.
pub struct Histogram {
    bounds: &'static [u64],
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0) }
    }

    pub fn record(&self, value: u64) {
        let b = self.bounds.partition_point(|&bound| bound < value);
        self.counts[b].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum: self.sum.load(Relaxed),
        }
    }
}

/// A [`Histogram`] read at one moment: `counts[i]` values fell at or below
/// `bounds[i]` (and above the bound before); the last count is the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub bounds: &'static [u64],
    pub counts: Vec<u64>,
    pub sum: u64,
}

impl HistogramSnapshot {
    /// Values counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Latency and size of every finished task (completed or failed, at its
/// requested size), by direction ([`dir_index`]).
pub struct TaskHistograms {
    pub latency_us: [Histogram; 2],
    pub size_bytes: [Histogram; 2],
}

impl Default for TaskHistograms {
    fn default() -> Self {
        TaskHistograms {
            latency_us: std::array::from_fn(|_| Histogram::new(LATENCY_BOUNDS_US)),
            size_bytes: std::array::from_fn(|_| Histogram::new(SIZE_BOUNDS_BYTES)),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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
    /// Tasks the caller cancelled (neither completed nor failed).
    pub tasks_canceled: AtomicU64,
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
    /// Inbound connections closed unread because the peer's address is not
    /// allowed (`PDX_ALLOWED_PEERS`).
    pub connections_refused_address: AtomicU64,
    /// Inbound connections closed because the peer did not authenticate
    /// (`PDX_PEER_SECRET_FILE`).
    pub connections_refused_auth: AtomicU64,
    /// Tasks submitted and not yet finished.
    pub tasks_queued: AtomicU64,
    pub latency: Latency,
    pub histograms: TaskHistograms,
    /// Figures per peer (native engine).
    pub peers: PeerTable,
    /// Of the completed tasks: bytes and tasks that moved entirely over
    /// the same-host link, by direction (native engine).
    pub same_host_bytes: [AtomicU64; 2],
    pub same_host_tasks: [AtomicU64; 2],
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
        self.histograms.latency_us[dir_index(direction)].record(micros(elapsed));
        self.histograms.size_bytes[dir_index(direction)].record(bytes);
    }

    /// A task of `requested` bytes in `direction` failed with `kind`,
    /// `elapsed` after it started.
    pub fn failed(&self, direction: Direction, kind: ErrorKind, requested: u64, elapsed: Duration) {
        self.tasks_failed.fetch_add(1, Relaxed);
        self.failed_by_kind[kind_index(kind)].fetch_add(1, Relaxed);
        self.histograms.latency_us[dir_index(direction)].record(micros(elapsed));
        self.histograms.size_bytes[dir_index(direction)].record(requested);
    }

    /// `n` tasks for `peer` were submitted (counted as queued until each
    /// finishes through [`Stats::task_finished`]).
    pub fn tasks_submitted(&self, peer: &PeerCounters, n: u64) {
        self.tasks_queued.fetch_add(n, Relaxed);
        peer.queued.fetch_add(n, Relaxed);
    }

    /// A task submitted through [`Stats::tasks_submitted`] finished: counted
    /// here and for its peer. `outcome` is the bytes moved, or the error.
    pub fn task_finished(
        &self,
        peer: &PeerCounters,
        direction: Direction,
        requested: u64,
        elapsed: Duration,
        outcome: std::result::Result<u64, &Error>,
    ) {
        match outcome {
            Ok(bytes) => self.completed(direction, bytes, elapsed),
            Err(e) => self.failed(direction, e.kind(), requested, elapsed),
        }
        peer.finished(direction, outcome);
        // Every finished task was counted as submitted first.
        self.tasks_queued.fetch_sub(1, Relaxed);
    }

    /// A task submitted through [`Stats::tasks_submitted`] was cancelled by
    /// the caller (and is no longer queued).
    pub fn task_canceled(&self, peer: &PeerCounters) {
        self.tasks_canceled.fetch_add(1, Relaxed);
        self.tasks_queued.fetch_sub(1, Relaxed);
        peer.queued.fetch_sub(1, Relaxed);
    }

    /// A completed task of `bytes` in `direction` (already counted by
    /// [`Stats::task_finished`]) moved entirely over the same-host link.
    pub fn same_host_task(&self, peer: &PeerCounters, direction: Direction, bytes: u64) {
        let d = dir_index(direction);
        self.same_host_bytes[d].fetch_add(bytes, Relaxed);
        self.same_host_tasks[d].fetch_add(1, Relaxed);
        peer.same_host_bytes[d].fetch_add(bytes, Relaxed);
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
            tasks_canceled: l(&self.tasks_canceled),
            served_bytes_written: l(&self.served_bytes_written),
            served_bytes_read: l(&self.served_bytes_read),
            served_writes: l(&self.served_writes),
            served_reads: l(&self.served_reads),
            requests_refused: l(&self.requests_refused),
            served_device_failures: l(&self.served_device_failures),
            same_host_bytes_written: l(&self.same_host_bytes[0]),
            same_host_bytes_read: l(&self.same_host_bytes[1]),
            same_host_tasks_written: l(&self.same_host_tasks[0]),
            same_host_tasks_read: l(&self.same_host_tasks[1]),
            handshakes: l(&self.handshakes),
            inbound_connections: l(&self.inbound_connections),
            latency_p50_us: self.latency.quantile_us(0.50),
            latency_p99_us: self.latency.quantile_us(0.99),
            gauges,
        }
    }

    /// The histograms read now, by direction.
    pub fn histogram_snapshots(&self) -> ([HistogramSnapshot; 2], [HistogramSnapshot; 2]) {
        let h = &self.histograms;
        (std::array::from_fn(|i| h.latency_us[i].snapshot()), std::array::from_fn(|i| h.size_bytes[i].snapshot()))
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
    pub tasks_canceled: u64,
    pub served_bytes_written: u64,
    pub served_bytes_read: u64,
    pub served_writes: u64,
    pub served_reads: u64,
    pub requests_refused: u64,
    pub served_device_failures: u64,
    /// Of the completed tasks, what moved over the same-host link.
    pub same_host_bytes_written: u64,
    pub same_host_bytes_read: u64,
    pub same_host_tasks_written: u64,
    pub same_host_tasks_read: u64,
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
        s.failed(Direction::Write, ErrorKind::Timeout, 9, Duration::from_millis(2));
        s.failed(Direction::Read, ErrorKind::Io, 4096, Duration::from_secs(100));
        s.served(Direction::Write, 5);
        let snap = s.snapshot(Gauges { peers_connected: 1, ..Gauges::default() });
        assert_eq!((snap.bytes_written, snap.bytes_read, snap.tasks_written, snap.tasks_read), (100, 7, 1, 1));
        assert_eq!((snap.tasks_failed, snap.failed_by_kind[0], snap.failed_by_kind[6]), (2, 1, 1));
        assert_eq!((snap.served_writes, snap.served_bytes_written, snap.gauges.peers_connected), (1, 5, 1));
        assert_eq!(snap.latency_p50_us, 3);
        let (latency, size) = s.histogram_snapshots();
        assert_eq!((latency[0].count(), latency[1].count()), (2, 2), "failed tasks count too");
        assert_eq!((size[0].sum, size[1].sum), (109, 4103), "at their requested size");
        assert_eq!(latency[1].counts[LATENCY_BOUNDS_US.len()], 1, "100 s lies past the last bound");
        assert_eq!(size[1].counts[1], 1, "4096 bytes lie in the 4 KiB bucket (bounds are inclusive)");
    }

    #[test]
    fn queued_tasks_rise_and_fall_with_their_peer() {
        let s = Stats::default();
        let peer = s.peers.entry("10.0.0.1:15000");
        s.tasks_submitted(&peer, 3);
        assert_eq!((s.tasks_queued.load(Relaxed), peer.queued.load(Relaxed)), (3, 3));
        s.task_finished(&peer, Direction::Read, 10, Duration::ZERO, Ok(10));
        let e = Error::new(ErrorKind::ConnectionLost, "gone");
        s.task_finished(&peer, Direction::Read, 10, Duration::ZERO, Err(&e));
        assert_eq!((s.tasks_queued.load(Relaxed), peer.queued.load(Relaxed)), (1, 1));
        assert_eq!((s.tasks_read.load(Relaxed), s.tasks_failed.load(Relaxed)), (1, 1));
        s.task_canceled(&peer);
        assert_eq!((s.tasks_queued.load(Relaxed), peer.queued.load(Relaxed)), (0, 0));
        let snap = s.snapshot(Gauges::default());
        assert_eq!((snap.tasks_canceled, snap.tasks_failed), (1, 1), "a cancel is no failure");
    }
}
