//! Memory: how bytes reach the memory a transfer names. The regions peers
//! may touch ([`regions`]), the CUDA driver as the engine uses it
//! ([`cuda`]), a window's local memory as every way of moving it sees it
//! ([`local`]), device memory staged through pinned host buffers
//! ([`staging`]), and device memory of another process on this host
//! through CUDA IPC ([`ipc`]).
//!
//! May use: [`protocol`](super::protocol) (a region as a descriptor
//! advertises it). Nothing that opens sockets, and none of the roles that
//! move bytes (the initiator, the server, the same-host link): they build
//! on this.

pub mod cuda;
pub(super) mod ipc;
pub(super) mod local;
pub(super) mod regions;
pub(super) mod staging;

pub(super) use regions::Regions;
pub(super) use staging::Staging;
