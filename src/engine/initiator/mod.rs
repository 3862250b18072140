//! The initiator: everything on the side that starts a transfer. A batch is
//! checked ([`prepare`], [`limits`]), planned into pieces and windows
//! ([`plan`]) and run by the executor ([`batch`]) on lanes to the peer
//! ([`peers`], data connections opened through the handshake client
//! [`dialer`]), each window through a [`link`] with the window protocol
//! ([`window`]); [`workers`] run the lanes of multi-lane and asynchronous
//! batches; [`cancel`] stops the windows of cancelled tasks; [`task`] holds
//! a task's state word, which status polls read without a lock.
//!
//! May use: [`protocol`](super::protocol), [`net`](super::net),
//! [`memory`](super::memory), [`samehost`](super::samehost) (the same-host
//! link, a kind of [`link`]), [`directory`](super::directory) (where a peer's
//! descriptor comes from), and the engine's settings, registry and shared
//! state (`Inner`, taken whole only by [`batch`]). Not the server.

mod batch;
mod cancel;
pub(super) mod dialer;
mod limits;
mod link;
pub(super) mod peers;
pub(super) mod plan;
mod prepare;
mod task;
pub(super) mod window;
mod workers;

pub(super) use batch::BatchRun;
pub(super) use dialer::Dialer;
pub(super) use peers::Peers;
pub(super) use prepare::{prepare as prepare_batch, Prepared};
pub(super) use workers::Workers;
