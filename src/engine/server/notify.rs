//! Notifications received from peers: a bounded queue, kept until the
//! application drains it (sending one is `Peer::notify`).

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::transfer::notification::{shown, Notification};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::notify";

/// Bytes a queued notification is charged beyond its name and message
/// (the pair's two vectors and its slot in the queue).
const ENTRY_OVERHEAD: usize = 64;

/// A queue of notifications bounded in count and in bytes: a peer can make
/// us hold at most `max_bytes` until the application drains.
pub struct Notifications {
    queue: Mutex<Queued>,
    limit: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Queued {
    pairs: VecDeque<Notification>,
    bytes: usize,
}

fn cost(note: &Notification) -> usize {
    note.len().saturating_add(ENTRY_OVERHEAD)
}

impl Notifications {
    pub fn new(limit: usize, max_bytes: usize) -> Self {
        Notifications { queue: Mutex::new(Queued::default()), limit, max_bytes }
    }

    /// Queue a notification; false (the sender is told "rejected") when the
    /// queue is full in entries or in bytes. Every one accepted is drained.
    pub fn push(&self, note: Notification) -> bool {
        let c = cost(&note);
        let mut q = self.queue.lock();
        if q.pairs.len() >= self.limit || q.bytes.saturating_add(c) > self.max_bytes {
            let (len, bytes) = (q.pairs.len(), q.bytes);
            drop(q); // a log callback may drain the queue
            log::warn!(target: LOG_TARGET,
                "notification queue full ({len} of {} entries, {bytes} + {c} of {} bytes); rejecting notification {}",
                self.limit,
                self.max_bytes,
                shown(&note.name)
            );
            return false;
        }
        q.bytes += c;
        q.pairs.push_back(note);
        true
    }

    /// Bytes of names and messages waiting to be drained.
    pub fn queued_bytes(&self) -> usize {
        self.queue.lock().pairs.iter().map(Notification::len).sum()
    }

    /// Take every queued notification, oldest first.
    pub fn drain(&self) -> Vec<Notification> {
        let mut q = self.queue.lock();
        q.bytes = 0;
        q.pairs.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &str, msg: &[u8]) -> Notification {
        Notification::new(name, msg)
    }

    #[test]
    fn bounded_and_ordered() {
        let n = Notifications::new(2, 1 << 20);
        assert!(n.push(note("a", b"1")));
        assert!(n.push(note("b", b"\x8b\x00")));
        assert!(!n.push(note("c", b"3")));
        assert_eq!(n.drain(), vec![note("a", b"1"), note("b", b"\x8b\x00")]);
        assert!(n.drain().is_empty());
    }

    #[test]
    fn bounded_in_bytes_and_drain_frees_the_budget() {
        let n = Notifications::new(1000, 3 * (1000 + ENTRY_OVERHEAD + 1));
        let big = vec![0xffu8; 1000];
        assert!(n.push(note("a", &big)) && n.push(note("b", &big)) && n.push(note("c", &big)));
        assert_eq!(n.queued_bytes(), 3 * 1001);
        assert!(!n.push(note("d", &big)), "a fourth is over the byte budget");
        assert!(!n.push(note("e", b"small-but-over")), "nothing fits a full budget");
        assert_eq!(n.drain().len(), 3);
        assert!(n.push(note("f", &big)), "draining frees the budget");
    }
}
