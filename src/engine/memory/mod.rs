//! Memory: how bytes reach the memory a transfer names. The regions peers
//! may touch ([`regions`]), the CUDA driver as the engine uses it
//! ([`cuda`]), device memory staged through pinned host buffers
//! ([`staging`]), and device memory of another process on this host
//! through CUDA IPC ([`ipc`]).
//!
//! May use: [`protocol`](super::protocol) (a region as a descriptor
//! advertises it) and the initiator's window protocol, whose local memory
//! [`staging`] implements for device memory. Nothing that opens sockets.

pub mod cuda;
pub(super) mod ipc;
pub(super) mod regions;
pub(super) mod staging;

pub(super) use regions::Regions;
pub(super) use staging::Staging;
