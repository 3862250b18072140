//! A rail's own clock, as its lanes see it while a call blocks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{Rail, RailSet};
use super::{RAIL_CLOCK, RAIL_LAGGING};

/// A lane's view of its rail, consulted while a call blocks: the rail's
/// own clock (see the module's documentation).
#[derive(Clone)]
pub struct RailClock {
    pub rail: Arc<Rail>,
    pub set: Arc<RailSet>,
}

impl RailClock {
    pub fn new(rail: Arc<Rail>, set: Arc<RailSet>) -> RailClock {
        RailClock { rail, set }
    }

    /// Bytes moved on this rail just now.
    pub fn mark(&self) {
        self.rail.progress.mark();
    }

    /// True when the rail has had work in flight and moved nothing for
    /// [`RAIL_CLOCK`] (counted from the later of its last byte and the
    /// moment it last went from idle to busy: a window started later, while
    /// the rail's others wait, gets no clock of its own) while another rail
    /// up to the same peer moved no longer than that before this rail's
    /// last byte, or since (it was working when this one stopped; it may
    /// have finished its share and idle, waiting on this one): the lane
    /// should give up. A rail whose
    /// siblings have been idle for longer, or are down, waits for the
    /// task's stall clock. Should the whole peer have died, one rail is
    /// marked down for nothing (and probed back); the retry on the others
    /// then meets the task's stall clock, as without rails.
    ///
    /// A rail marked down (by another lane's clock, or because it cannot
    /// connect) while another is up: its lanes give up at once.
    pub fn silent(&self) -> bool {
        let now = Instant::now();
        let other_up = || self.set.rails.iter().any(|r| r.index != self.rail.index && r.is_up());
        if !self.rail.is_up() && other_up() {
            return true;
        }
        match self.quiet_at(now) {
            Some(q) if q >= RAIL_CLOCK => true,
            Some(q) if q >= RAIL_LAGGING => {
                self.set.check_lagging(&self.rail, now);
                false
            }
            _ => false,
        }
    }

    #[cfg(test)]
    fn silent_at(&self, now: Instant) -> bool {
        self.quiet_at(now).is_some_and(|q| q >= RAIL_CLOCK)
    }

    /// How long the rail has had work in flight and moved nothing, when
    /// another rail up was working no longer than [`RAIL_CLOCK`] before
    /// this one's last byte, or since; else `None` (no word on the peer).
    fn quiet_at(&self, now: Instant) -> Option<Duration> {
        let own = self.rail.progress.last();
        let quiet = self.rail.quiet_at(now)?;
        let others_working = self
            .set
            .rails
            .iter()
            .any(|r| r.index != self.rail.index && r.is_up() && r.progress.last() + RAIL_CLOCK > own);
        others_working.then_some(quiet)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::super::discovery::LocalRail;
    use super::super::state::RailState;
    use super::*;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
    }

    #[test]
    fn a_rail_clock_fires_only_while_another_rail_was_working() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> = ["10.231.1.2", "10.231.2.2"].iter().map(|s| s.parse().unwrap()).collect();
        let set = Arc::new(RailSet::new("peer", &locals, &remotes, 1));
        let clock = RailClock::new(set.rails[0].clone(), set.clone());
        let (dying, other) = (&set.rails[0], &set.rails[1]);
        let t0 = Instant::now() + Duration::from_secs(5);
        let later = t0 + RAIL_CLOCK + Duration::from_millis(50);
        dying.progress.mark_at(t0);
        dying.busy(true);
        assert!(!clock.silent_at(later), "the other rail has been idle since long before: no word on the peer");
        // The other rail moved shortly before this one's last byte, then
        // finished its share and idled.
        other.progress.mark_at(t0 + Duration::from_millis(100) - RAIL_CLOCK);
        dying.busy(false);
        assert!(!clock.silent_at(later), "nothing in flight on it: no clock");
        dying.busy(true);
        assert!(!clock.silent_at(t0 + RAIL_CLOCK - Duration::from_millis(1)), "within its own clock");
        assert!(clock.silent_at(later), "quiet for the clock while another rail was working");
        other.set(RailState::Down, "test".into(), "peer");
        assert!(!clock.silent_at(later), "a down rail does not count");
        other.set(RailState::Up, "test".into(), "peer");
        // A second window started on the quiet rail gets no clock of its own.
        dying.busy(true);
        assert!(clock.silent_at(later));
        dying.busy(false);
        dying.busy(false);
        assert!(!clock.silent_at(later), "nothing in flight");
        // Busy again after idling: the clock counts from then.
        dying.busy(true);
        dying.busy_since.mark_at(t0 + Duration::from_secs(1));
        assert!(!clock.silent_at(later) && clock.silent_at(later + Duration::from_secs(1)));
        dying.progress.mark_at(later + Duration::from_secs(1));
        assert!(!clock.silent_at(later + Duration::from_secs(1)), "its own bytes reset its clock");
    }
}
