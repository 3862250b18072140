//! Figures per peer: bytes and tasks each way, failures by kind, the last
//! error and when, tasks queued. Kept apart from the descriptor cache, which
//! forgets a peer about a second after its last lane closed: these figures
//! outlive that, for the [`MAX_PEERS_KEPT`] peers most recently active (the
//! least recently active one with nothing queued makes room for a new one),
//! so what an engine holds stays bounded however many peers it meets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;

use super::counter_index::{dir_index, kind_index, FAILURE_KINDS};
use super::Direction;
use crate::error::Error;

/// Most peers whose figures are kept.
pub const MAX_PEERS_KEPT: usize = 4096;

/// The counters of one peer (as initiator: this engine's tasks to it).
pub struct PeerCounters {
    /// Payload bytes of completed tasks, by direction (write, read).
    pub bytes: [AtomicU64; 2],
    /// Completed tasks, by direction.
    pub tasks: [AtomicU64; 2],
    /// Failed tasks by kind (as in [`super::stats::Stats::failed_by_kind`]).
    pub failed_by_kind: [AtomicU64; FAILURE_KINDS.len() + 1],
    /// Tasks submitted and not yet finished.
    pub queued: AtomicU64,
    /// Of `bytes`, what moved over the same-host link, by direction.
    pub same_host_bytes: [AtomicU64; 2],
    /// The path of the last data connection opened to it, and why.
    path: Mutex<Option<(&'static str, String)>>,
    last_error: Mutex<Option<(String, SystemTime)>>,
    /// When tasks were last submitted ([`now_ns`]; no lock, and nothing on
    /// the path of every finished task).
    last_active: AtomicU64,
}

/// Nanoseconds since the first call in this process (a monotonic clock).
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl PeerCounters {
    fn new() -> PeerCounters {
        PeerCounters {
            bytes: Default::default(),
            tasks: Default::default(),
            failed_by_kind: Default::default(),
            queued: AtomicU64::new(0),
            same_host_bytes: Default::default(),
            path: Mutex::new(None),
            last_error: Mutex::new(None),
            last_active: AtomicU64::new(now_ns()),
        }
    }

    fn touch(&self) {
        self.last_active.store(now_ns(), Relaxed);
    }

    /// A task to this peer finished: `Ok(bytes)` moved, or failed with the error.
    pub fn finished(&self, direction: Direction, outcome: std::result::Result<u64, &Error>) {
        match outcome {
            Ok(bytes) => {
                self.bytes[dir_index(direction)].fetch_add(bytes, Relaxed);
                self.tasks[dir_index(direction)].fetch_add(1, Relaxed);
            }
            Err(e) => {
                self.failed_by_kind[kind_index(e.kind())].fetch_add(1, Relaxed);
                *self.last_error.lock() = Some((e.to_string(), SystemTime::now()));
            }
        }
        // Every finished task was counted as submitted first.
        self.queued.fetch_sub(1, Relaxed);
    }

    /// The path to this peer and why (kept after the engine forgets the
    /// peer's connections).
    pub fn set_path(&self, path: (&'static str, String)) {
        let mut now = self.path.lock();
        if now.as_ref() != Some(&path) {
            *now = Some(path);
        }
    }

    /// The figures of a peer nothing was counted for yet.
    pub fn empty_snapshot(session: &str) -> PeerSnapshot {
        PeerCounters::new().snapshot(session)
    }

    /// The figures now, for `session`.
    pub fn snapshot(&self, session: &str) -> PeerSnapshot {
        let l = |c: &AtomicU64| c.load(Relaxed);
        PeerSnapshot {
            session: session.to_owned(),
            bytes: [l(&self.bytes[0]), l(&self.bytes[1])],
            tasks: [l(&self.tasks[0]), l(&self.tasks[1])],
            failed_by_kind: std::array::from_fn(|i| l(&self.failed_by_kind[i])),
            queued: l(&self.queued),
            same_host_bytes: [l(&self.same_host_bytes[0]), l(&self.same_host_bytes[1])],
            path: self.path.lock().clone(),
            last_error: self.last_error.lock().clone(),
        }
    }
}

/// One peer's figures at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSnapshot {
    pub session: String,
    /// By direction: write, read.
    pub bytes: [u64; 2],
    pub tasks: [u64; 2],
    pub failed_by_kind: [u64; FAILURE_KINDS.len() + 1],
    pub queued: u64,
    pub same_host_bytes: [u64; 2],
    /// The path of the last data connection and why, if one was opened.
    pub path: Option<(&'static str, String)>,
    /// The text of the last failure and when it happened.
    pub last_error: Option<(String, SystemTime)>,
}

impl PeerSnapshot {
    pub fn failed(&self) -> u64 {
        self.failed_by_kind.iter().sum()
    }

    /// How busy the peer has been: bytes moved, then tasks (the busiest
    /// peers get per-peer series).
    pub fn busyness(&self) -> (u64, u64) {
        (self.bytes[0].saturating_add(self.bytes[1]), self.tasks[0] + self.tasks[1] + self.failed())
    }
}

/// Every peer's counters, by session name, bounded by [`MAX_PEERS_KEPT`].
pub struct PeerTable {
    map: Mutex<HashMap<String, Arc<PeerCounters>>>,
    limit: usize,
}

impl Default for PeerTable {
    fn default() -> Self {
        PeerTable::with_limit(MAX_PEERS_KEPT)
    }
}

impl PeerTable {
    pub fn with_limit(limit: usize) -> PeerTable {
        PeerTable { map: Mutex::new(HashMap::new()), limit: limit.max(1) }
    }

    /// The counters of `session`, made on first use (making room by
    /// forgetting the least recently active peer with nothing queued).
    pub fn entry(&self, session: &str) -> Arc<PeerCounters> {
        let mut map = self.map.lock();
        if let Some(c) = map.get(session) {
            c.touch();
            return c.clone();
        }
        if map.len() >= self.limit {
            let victim = map
                .iter()
                .filter(|(_, c)| c.queued.load(Relaxed) == 0)
                .map(|(k, c)| (c.last_active.load(Relaxed), k.clone()))
                .min()
                .map(|(_, k)| k);
            if let Some(k) = victim {
                map.remove(&k);
            }
        }
        let c = Arc::new(PeerCounters::new());
        // Still full (every peer has work queued): counted, but not kept.
        if map.len() < self.limit {
            map.insert(session.to_owned(), c.clone());
        }
        c
    }

    /// The figures of `session`, if kept.
    pub fn get(&self, session: &str) -> Option<PeerSnapshot> {
        self.map.lock().get(session).map(|c| c.snapshot(session))
    }

    /// Every kept peer's figures (unordered).
    pub fn snapshots(&self) -> Vec<PeerSnapshot> {
        self.map.lock().iter().map(|(k, c)| c.snapshot(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn counts_per_peer_and_keeps_the_last_error() {
        let t = PeerTable::default();
        let a = t.entry("a:1");
        a.queued.store(2, Relaxed);
        a.finished(Direction::Write, Ok(100));
        a.finished(Direction::Read, Err(&Error::new(ErrorKind::Timeout, "slow")));
        let s = t.get("a:1").unwrap();
        assert_eq!((s.bytes, s.tasks, s.queued, s.failed()), ([100, 0], [1, 0], 0, 1));
        assert_eq!(s.failed_by_kind[0], 1);
        assert!(s.last_error.unwrap().0.contains("slow"));
        assert!(t.get("b:1").is_none());
    }

    #[test]
    fn the_least_recently_active_idle_peer_makes_room() {
        let t = PeerTable::with_limit(3);
        let busy = t.entry("busy");
        busy.queued.store(1, Relaxed);
        t.entry("old");
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.entry("new");
        t.entry("newer");
        assert!(t.get("old").is_none(), "forgotten first");
        assert!(t.get("busy").is_some(), "work queued: kept though least recently active");
        assert_eq!(t.snapshots().len(), 3);
    }
}
