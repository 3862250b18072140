//! Notifications received from peers, kept until the application drains them.

use std::collections::VecDeque;

use parking_lot::Mutex;

/// A bounded queue of `(name, message)` pairs.
pub struct Notifications {
    queue: Mutex<VecDeque<(String, String)>>,
    limit: usize,
}

impl Notifications {
    pub fn new(limit: usize) -> Self {
        Notifications { queue: Mutex::new(VecDeque::new()), limit }
    }

    /// Queue a pair; false (the sender is told "rejected") when full.
    pub fn push(&self, name: &str, msg: &str) -> bool {
        let mut q = self.queue.lock();
        if q.len() >= self.limit {
            log::warn!("notification queue full ({} entries); rejecting a notification", self.limit);
            return false;
        }
        q.push_back((name.to_owned(), msg.to_owned()));
        true
    }

    /// Take every queued pair, oldest first.
    pub fn drain(&self) -> Vec<(String, String)> {
        self.queue.lock().drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_ordered() {
        let n = Notifications::new(2);
        assert!(n.push("a", "1"));
        assert!(n.push("b", "2"));
        assert!(!n.push("c", "3"));
        assert_eq!(n.drain(), vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert!(n.drain().is_empty());
    }
}
