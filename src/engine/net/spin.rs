//! When a receive polls before it sleeps, and for how long.
//!
//! Polling saves a sleep and a wake-up when the reply comes within the
//! window, but on a loaded machine it takes the CPU the peer needs to send
//! that reply, and a peer trickling tiny segments can make every wake-up
//! cost a full window. So the window adapts per connection: a poll that
//! catches the data doubles it (up to the setting), one that misses halves
//! it; a wake-up that delivers less than the receive wanted (a fragmented
//! or trickled message) turns polling off for the next receive; and with
//! polling off, every 32nd blocking receive tries the full window again, so
//! a connection that turns fast again gets it back.

use std::time::Duration;

/// Blocking receives between two tries of the full window while it is off.
const RETRY_EVERY: u32 = 32;

/// Below this a window is not worth a poll.
const MIN_WINDOW: Duration = Duration::from_micros(2);

/// One connection's polling window.
#[derive(Debug, Clone, Copy)]
pub struct Spin {
    max: Duration,
    now: Duration,
    blocked: u32,
}

impl Spin {
    /// A policy with windows of up to `max` (zero: never poll).
    pub fn new(max: Duration) -> Spin {
        Spin { max, now: max, blocked: 0 }
    }

    /// How long the next receive may poll.
    pub fn window(&self) -> Duration {
        self.now
    }

    /// The poll caught data.
    pub fn hit(&mut self) {
        self.now = (self.now * 2).min(self.max);
    }

    /// The poll ran out and the receive blocked.
    pub fn miss(&mut self) {
        self.now /= 2;
        if self.now < MIN_WINDOW {
            self.now = Duration::ZERO;
        }
    }

    /// A receive took `got` bytes when `want` would complete what it waits
    /// for, after `blocked` (it slept first).
    pub fn delivered(&mut self, got: usize, want: usize, blocked: bool) {
        if got < want {
            self.now = Duration::ZERO;
            self.blocked = 0;
            return;
        }
        if blocked && self.now.is_zero() {
            self.blocked += 1;
            if self.blocked >= RETRY_EVERY {
                self.blocked = 0;
                self.now = self.max;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_and_trickles_turn_polling_off_and_hits_bring_it_back() {
        let max = Duration::from_micros(50);
        let mut s = Spin::new(max);
        s.miss();
        assert_eq!(s.window(), Duration::from_micros(25));
        s.hit();
        assert_eq!(s.window(), max);
        s.delivered(1, 24, false);
        assert_eq!(s.window(), Duration::ZERO, "a trickled byte: no poll next time");
        for _ in 0..RETRY_EVERY - 1 {
            s.delivered(24, 24, true);
            assert_eq!(s.window(), Duration::ZERO);
        }
        s.delivered(24, 24, true);
        assert_eq!(s.window(), max, "retried after whole messages again");
        for _ in 0..10 {
            s.miss();
        }
        assert_eq!(s.window(), Duration::ZERO);
        assert_eq!(Spin::new(Duration::ZERO).window(), Duration::ZERO);
    }
}
