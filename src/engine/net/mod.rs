//! Sockets and time: a data connection and its operations ([`conn`]),
//! deadlines that run per task rather than per system call ([`deadline`]),
//! when a receive polls before it sleeps ([`spin`]), and the rails
//! (interfaces and addresses) data connections ride ([`rails`]).
//!
//! May use: the engine's [`registry`](super::registry) (a down rail's probe
//! runs on a registered thread). No other role: the others build on this (a
//! server connection keeps what its hello added, the same-host link, as an
//! opaque extension).

pub(super) mod conn;
pub(super) mod deadline;
pub(super) mod rails;
mod spin;

pub(super) use rails::discover as discover_rails;
