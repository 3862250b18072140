//! Where a task's figures go in the per-direction and per-failure-kind
//! counter arrays that [`super::stats`] (per engine) and
//! [`super::peer_stats`] (per peer) both keep, and the labels of those
//! slots: shared here so that neither of the two imports the other for it.

use super::Direction;
use crate::error::ErrorKind;

/// Why failed tasks failed, as counted (the rest count as `other`).
pub const FAILURE_KINDS: [ErrorKind; 6] = [
    ErrorKind::Timeout,
    ErrorKind::ConnectionLost,
    ErrorKind::PeerUnreachable,
    ErrorKind::RemoteRejected,
    ErrorKind::Shutdown,
    ErrorKind::Protocol,
];

/// The index of a direction in per-direction arrays: write 0, read 1.
pub fn dir_index(direction: Direction) -> usize {
    match direction {
        Direction::Write => 0,
        Direction::Read => 1,
    }
}

/// The index of an error kind in failed-by-kind arrays ([`FAILURE_KINDS`], then other).
pub fn kind_index(kind: ErrorKind) -> usize {
    FAILURE_KINDS.iter().position(|k| *k == kind).unwrap_or(FAILURE_KINDS.len())
}

/// The label of a failed-by-kind index.
pub fn kind_label(i: usize) -> &'static str {
    ["timeout", "connection_lost", "peer_unreachable", "remote_rejected", "shutdown", "protocol", "other"]
        .get(i)
        .copied()
        .unwrap_or("other")
}
