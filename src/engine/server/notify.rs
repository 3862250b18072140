//! Notifications received from peers: a bounded queue, kept until the
//! application drains it (sending one is `Peer::notify`).

use std::collections::VecDeque;

use parking_lot::Mutex;

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::notify";

/// Bytes a queued notification is charged beyond its name and message
/// (the pair's two `String`s and its slot in the queue).
const ENTRY_OVERHEAD: usize = 64;

/// A queue of `(name, message)` pairs bounded in count and in bytes: a
/// peer can make us hold at most `max_bytes` until the application drains.
pub struct Notifications {
    queue: Mutex<Queued>,
    limit: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Queued {
    pairs: VecDeque<(String, String)>,
    bytes: usize,
}

fn cost(name: &str, msg: &str) -> usize {
    name.len().saturating_add(msg.len()).saturating_add(ENTRY_OVERHEAD)
}

impl Notifications {
    pub fn new(limit: usize, max_bytes: usize) -> Self {
        Notifications { queue: Mutex::new(Queued::default()), limit, max_bytes }
    }

    /// Queue a pair; false (the sender is told "rejected") when the queue
    /// is full in entries or in bytes. Every pair accepted is drained.
    pub fn push(&self, name: &str, msg: &str) -> bool {
        let c = cost(name, msg);
        let mut q = self.queue.lock();
        if q.pairs.len() >= self.limit || q.bytes.saturating_add(c) > self.max_bytes {
            let (len, bytes) = (q.pairs.len(), q.bytes);
            drop(q); // a log callback may drain the queue
            log::warn!(target: LOG_TARGET,
                "notification queue full ({len} of {} entries, {bytes} + {c} of {} bytes); rejecting a notification",
                self.limit,
                self.max_bytes
            );
            return false;
        }
        q.bytes += c;
        q.pairs.push_back((name.to_owned(), msg.to_owned()));
        true
    }

    /// Bytes of names and messages waiting to be drained.
    pub fn queued_bytes(&self) -> usize {
        self.queue.lock().pairs.iter().map(|(n, m)| n.len() + m.len()).sum()
    }

    /// Take every queued pair, oldest first.
    pub fn drain(&self) -> Vec<(String, String)> {
        let mut q = self.queue.lock();
        q.bytes = 0;
        q.pairs.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_ordered() {
        let n = Notifications::new(2, 1 << 20);
        assert!(n.push("a", "1"));
        assert!(n.push("b", "2"));
        assert!(!n.push("c", "3"));
        assert_eq!(n.drain(), vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert!(n.drain().is_empty());
    }

    #[test]
    fn bounded_in_bytes_and_drain_frees_the_budget() {
        let n = Notifications::new(1000, 3 * (1000 + ENTRY_OVERHEAD + 1));
        let big = "x".repeat(1000);
        assert!(n.push("a", &big) && n.push("b", &big) && n.push("c", &big));
        assert!(!n.push("d", &big), "a fourth is over the byte budget");
        assert!(!n.push("e", "small-but-over"), "nothing fits a full budget");
        assert_eq!(n.drain().len(), 3);
        assert!(n.push("f", &big), "draining frees the budget");
    }
}
