//! Multi-rail TCP: every link between two hosts carries lanes.
//!
//! With `PDX_TCP_RAILS` set (`auto`, or a list of interface names or local
//! addresses), an engine finds its rails (interfaces that are up, not
//! loopback, with an address), listens for data on all of them and
//! advertises their addresses in its descriptor (`pdx_rails`, a field
//! Mooncake ignores). An initiator with rails pairs its own with a pdx
//! peer's: for each advertised address a local rail on the same subnet,
//! else whatever the kernel routes. Lanes are opened on every pair; the
//! executor's lanes claim windows as they finish the last, so a rail that
//! confirms bytes faster takes more of a batch, and a slow rail stops
//! claiming once the others would finish the rest before it finishes a
//! window ([`RailSet::should_yield`]).
//!
//! A rail has its own clock: while it has work in flight and confirms no
//! bytes for [`RAIL_CLOCK`] while another rail to the same peer does, its
//! lanes give up ([`RailClock::silent`]), the rail is marked down and the
//! unconfirmed pieces are retried on the others. Quiet for [`RAIL_LAGGING`]
//! it gets no new windows, and one connect from its address checks it: a
//! link that is down (no route) marks it down then, without waiting out the
//! clock. A down rail is probed in the background (a TCP connect to the
//! peer's data port from the rail's address every
//! [`PROBE_EVERY`](prober::PROBE_EVERY)) and used again as soon as it
//! answers. One thread per engine probes every peer's down rails, their
//! connects in flight together ([`Prober`]): the threads do not grow with
//! the peers, and a peer forgotten, evicted or closed is probed no more
//! from the next round on. A rail that never connected is dropped for that
//! peer, with the reason. A pairing belongs to the descriptor it
//! was made from ([`Pairing`]): a peer that restarts is paired afresh.
//!
//! The roles, one file each: [`discovery`] (this engine's rails),
//! [`subnets`] (ours paired with a peer's by subnet), [`state`] (each
//! rail's state and rate, and the choice of a rail for a lane), [`clock`]
//! (a rail's own clock, seen by its lanes), [`prober`] (the engine's one
//! prober of down rails) and [`pairing`] (a peer's rails, kept per
//! descriptor).

mod clock;
mod discovery;
mod pairing;
mod prober;
mod state;
mod subnets;

use std::time::Duration;

pub use clock::RailClock;
#[cfg(test)]
pub(crate) use discovery::interfaces;
pub use discovery::{discover, LocalRail};
pub use pairing::Pairing;
pub use prober::Prober;
#[cfg(test)]
pub(crate) use prober::PROBE_THREAD;
pub use state::{rail_label, Rail, RailSet};
pub use subnets::parse_advertised;

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::rails";

/// A rail with work in flight that confirms nothing for this long, while
/// another rail to the same peer does, is down.
pub(crate) const RAIL_CLOCK: Duration = Duration::from_secs(2);
/// A rail with work in flight that has confirmed nothing for this long,
/// while another rail has since, is lagging: new windows go to the others
/// (its own wait for [`RAIL_CLOCK`] goes on).
pub(crate) const RAIL_LAGGING: Duration = Duration::from_millis(500);
/// Bound on one rail's connect, and on the pdx hello over it (a rail that
/// cannot connect and answer in this long is dropped; the task's own
/// clocks are far longer).
pub(crate) const RAIL_CONNECT: Duration = Duration::from_secs(2);
/// Most rails an engine uses or accepts from a peer's descriptor.
pub(crate) const MAX_RAILS: usize = 16;
