//! The rails paired with a peer's descriptor, kept while it is unchanged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::state::RailSet;
use super::LOG_TARGET;

/// A peer's rails as paired with the descriptor `D` they came from. A peer
/// that restarts (a new `pdx_instance`), moves its data port or advertises
/// other rails is paired afresh from its new descriptor, the first time the
/// rails are asked for after the cached descriptor changed; the old
/// pairing's probes stop. A descriptor fetched again unchanged keeps the
/// pairing (and what it learned: rates, rails down or dropped). Generic in
/// the descriptor, which is the protocol's: this module only pairs.
pub struct Pairing<D> {
    cached: Mutex<Option<Paired<D>>>,
}

/// A descriptor and the rails paired from it (`None`: none).
type Paired<D> = (Arc<D>, Option<Arc<RailSet>>);

impl<D> Default for Pairing<D> {
    fn default() -> Self {
        Pairing { cached: Mutex::new(None) }
    }
}

impl<D> Pairing<D> {
    /// The rails for `desc`, made by `make` unless the pairing in hand was
    /// made from `desc` or from a descriptor with the same `key` (what
    /// pairing reads of it).
    pub fn get<K: PartialEq + std::fmt::Debug>(
        &self,
        desc: &Arc<D>,
        key: impl Fn(&D) -> K,
        make: impl FnOnce(&D) -> Option<Arc<RailSet>>,
    ) -> Option<Arc<RailSet>> {
        let mut cached = self.cached.lock();
        if let Some((from, set)) = cached.as_mut() {
            if Arc::ptr_eq(from, desc) {
                return set.clone();
            }
            let (was, now) = (key(from), key(desc));
            if was == now {
                *from = desc.clone();
                return set.clone();
            }
            if let Some(old) = set {
                log::info!(
                    target: LOG_TARGET,
                    "{}: the peer's descriptor changed ({was:?} -> {now:?}): rails paired afresh",
                    old.session
                );
                old.retired.store(true, Ordering::Release);
            }
        }
        let set = make(desc);
        *cached = Some((desc.clone(), set.clone()));
        set
    }

    /// The pairing in hand, without looking at the descriptor.
    pub fn current(&self) -> Option<Arc<RailSet>> {
        self.cached.lock().as_ref().and_then(|(_, set)| set.clone())
    }
}

/// A peer forgotten, evicted or closed drops its pairing: the rails' probes
/// stop (within one nap) and connect no more; the peer's lanes, its rail
/// sockets, close with it.
impl<D> Drop for Pairing<D> {
    fn drop(&mut self) {
        if let Some(set) = self.current() {
            set.retired.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::discovery::LocalRail;
    use super::super::state::RailState;
    use super::*;
    use crate::engine::protocol::descriptor::PeerDescriptor;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
    }

    #[test]
    fn a_peer_with_a_new_descriptor_is_paired_afresh() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let desc = |instance: &str, rails: &[&str]| {
            Arc::new(PeerDescriptor {
                data_host: "10.231.1.2".into(),
                data_port: 7000,
                proto_version: 2,
                notify_name: "peer".into(),
                buffers: Vec::new(),
                instance: Some(instance.into()),
                host: None,
                rails: rails.iter().map(|s| s.parse().unwrap()).collect(),
            })
        };
        let made = std::cell::Cell::new(0);
        let make = |d: &PeerDescriptor| {
            made.set(made.get() + 1);
            Some(Arc::new(RailSet::new("peer", &locals, &d.rails, d.data_port)))
        };
        let pairing = Pairing::default();
        let key = |d: &PeerDescriptor| (d.instance.clone(), d.rails.clone(), d.data_port);
        let first = desc("0a", &["10.231.1.2", "10.231.2.2"]);
        let a = pairing.get(&first, key, make).unwrap();
        a.rails[1].set(RailState::Dropped, "test".into(), "peer");
        assert!(Arc::ptr_eq(&a, &pairing.get(&first, key, make).unwrap()));
        // Fetched again, unchanged: the same pairing (rail 1 stays dropped).
        let again = desc("0a", &["10.231.1.2", "10.231.2.2"]);
        assert!(Arc::ptr_eq(&a, &pairing.get(&again, key, make).unwrap()) && made.get() == 1);
        // Restarted with the same rails: paired afresh, every rail up again.
        let restarted = desc("0b", &["10.231.1.2", "10.231.2.2"]);
        let b = pairing.get(&restarted, key, make).unwrap();
        assert!(!Arc::ptr_eq(&a, &b) && made.get() == 2);
        assert!(a.retired.load(Ordering::Acquire) && !b.retired.load(Ordering::Acquire));
        assert!(b.rails.iter().all(|r| r.is_up()) && !b.holds(&a.rails[0]) && b.holds(&b.rails[0]));
        // Restarted with other rails: those.
        let moved = desc("0c", &["10.231.2.9"]);
        let c = pairing.get(&moved, key, make).unwrap();
        assert_eq!(c.rails.iter().map(|r| r.remote.to_string()).collect::<Vec<_>>(), ["10.231.2.9"]);
        assert!(Arc::ptr_eq(&c, &pairing.current().unwrap()));
        // Restarted without rails (an older pdx, or rails unset): none.
        let plain = desc("0d", &[]);
        assert!(pairing.get(&plain, key, |_| None).is_none() && pairing.current().is_none());
    }
}
