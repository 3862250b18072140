//! Notifications: the bounded queue of those received from peers, kept
//! until the application drains them, and the client that sends one.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde_json::{json, Value};

use super::peers::{self, Peer};
use super::wire::FrameType;
use super::Inner;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::host::parse_session;

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
            drop(q); // a log callback may drain the queue
            log::warn!("notification queue full ({} entries); rejecting a notification", self.limit);
            return false;
        }
        q.push_back((name.to_owned(), msg.to_owned()));
        true
    }

    /// Bytes of names and messages waiting to be drained.
    pub fn queued_bytes(&self) -> usize {
        self.queue.lock().iter().map(|(n, m)| n.len() + m.len()).sum()
    }

    /// Take every queued pair, oldest first.
    pub fn drain(&self) -> Vec<(String, String)> {
        self.queue.lock().drain(..).collect()
    }
}

/// Send one notification to `peer`'s descriptor name.
pub(crate) fn send_to(inner: &Inner, peer: &Peer, name: &str, msg: &str) -> Result<()> {
    let target = parse_session(&peer.descriptor().notify_name, inner.settings.default_handshake_port)?;
    let body = json!({"name": name, "notify_msg": msg}).to_string();
    let reply = peers::exchange_json(inner, &target, FrameType::Notify, &body)?;
    match reply.get("notify_msg").and_then(Value::as_str) {
        Some(m) if !m.is_empty() => Ok(()),
        _ => Err(Error::new(ErrorKind::NotifyRejected, format!("{} rejected the notification", peer.session))),
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
