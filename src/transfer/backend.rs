//! What every transfer backend offers the C ABI: the native TCP engine and,
//! for other protocols, Mooncake's own engine loaded at run time. Semantics
//! and error kinds are the same for all backends, so the ABI maps statuses
//! one way whatever runs underneath.

use std::time::Duration;

use super::location::Requested;
use super::{BatchSummary, Direction, Notification, Request, TaskState, TaskSummary};
use crate::error::{Error, Result};

/// The default bound on entries per batch (`PDX_MAX_BATCH_ENTRIES`).
pub(crate) const DEFAULT_MAX_BATCH_ENTRIES: usize = 1 << 20;

/// Refuse a batch with more entries than the backend allows (`max`).
pub fn check_entry_count(n: usize, max: usize) -> crate::error::Result<()> {
    if n > max {
        return Err(crate::error::Error::invalid_argument(format!(
            "a batch of {n} entries is over the limit of {max} (PDX_MAX_BATCH_ENTRIES); split it"
        )));
    }
    Ok(())
}

/// A running transfer engine.
pub trait TransferBackend: Send + Sync {
    /// `host:rpc_port`, the name peers use for this engine.
    fn session_id(&self) -> &str;
    /// The handshake (RPC) port.
    fn rpc_port(&self) -> u16;
    /// The protocol really in use (`"tcp"`, `"rdma"`, ...).
    fn protocol(&self) -> &str;
    /// Register regions `(addr, len)`, all or none; overlaps and zero
    /// lengths are `AddressOverlap`.
    fn register_batch(&self, regions: &[(u64, u64)]) -> Result<()>;
    /// As `register_batch`, at an explicit location (`"cpu:N"`, `"cuda:N"`)
    /// or `"*"` to detect it.
    fn register_batch_at(&self, regions: &[(u64, u64)], location: Requested) -> Result<()>;
    /// Unregister regions by start address, all or none; unknown is `NotFound`.
    fn unregister_batch(&self, addrs: &[u64]) -> Result<()>;
    /// Move every request; `Ok` only when each is confirmed at the target.
    ///
    /// # Safety
    /// Local ranges must be valid until this returns.
    unsafe fn transfer_sync(&self, session: &str, direction: Direction, reqs: Vec<Request>) -> Result<()>;
    /// Start a batch; the id is never 0. `notify` is sent to the peer once
    /// every request completed; one the backend could never send (see
    /// [`check_notification`](Self::check_notification)) is refused here,
    /// before anything starts.
    ///
    /// # Safety
    /// Local ranges must stay valid until the batch is finished.
    unsafe fn submit(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<Notification>,
    ) -> Result<u64>;
    /// As [`submit`](Self::submit), with the local bytes read or written
    /// only after the CUDA event `after` (a `CUevent`, valid until the batch
    /// is finished) has completed. The default refuses an event: a backend
    /// that cannot order a transfer after one says so.
    ///
    /// # Safety
    /// As [`submit`](Self::submit).
    unsafe fn submit_after(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<Notification>,
        after: Option<usize>,
    ) -> Result<u64> {
        match after {
            // SAFETY: forwarded from the caller.
            None => unsafe { self.submit(session, direction, reqs, notify) },
            Some(event) => Err(crate::error::Error::invalid_argument(format!(
                "wait_event {event:#x}: the {} backend cannot order a transfer after a CUDA event; synchronize \
                 the producing stream and pass NULL",
                self.protocol()
            ))),
        }
    }
    /// Most entries one batch may have; the C ABI refuses more before it
    /// copies the arrays.
    fn max_batch_entries(&self) -> usize {
        DEFAULT_MAX_BATCH_ENTRIES
    }
    /// The error of a batch's notification when it was requested and
    /// failed (the transfers still count as completed, as in Mooncake).
    fn batch_notify_error(&self, id: u64) -> Result<Option<Error>> {
        self.batch_summary(id).map(|_| None)
    }
    fn batch_summary(&self, id: u64) -> Result<BatchSummary>;
    fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary>;
    /// A task's state and bytes confirmed, for status polls (NIXL asks
    /// every task on every poll): a backend that can reads them without
    /// taking a lock its transfer threads need and without allocating. The
    /// reason of a failure is [`task_summary`](Self::task_summary)'s.
    fn task_state(&self, id: u64, task: usize) -> Result<(TaskState, u64)> {
        self.task_summary(id, task).map(|t| (t.state, t.bytes))
    }
    /// Wait for the batch to finish; `Timeout` while tasks are in flight.
    fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary>;
    /// Free a finished batch; `Busy` while tasks are in flight.
    fn batch_free(&self, id: u64) -> Result<()>;
    /// Cancel the tasks of batch `id` still in flight (`task`: that one
    /// only); returns how many this call cancelled. They end `Canceled`.
    /// Once this returns `Ok`, pdx reads and writes none of their local
    /// memory again (their remote memory may still receive what was
    /// already sent); tasks that had ended keep their state, so a cancel
    /// racing a completion ends in exactly one of the two. The batch
    /// finishes once its other tasks do, and is freed as usual.
    /// `Timeout` when the cancel could not make sure of that within its
    /// bound; the default: this backend cannot cancel.
    fn cancel(&self, id: u64, task: Option<usize>) -> Result<usize> {
        let _ = (id, task);
        Err(Error::invalid_argument(format!(
            "the {} backend cannot cancel a transfer; wait for the batch to finish",
            self.protocol()
        )))
    }
    fn probe(&self, session: &str) -> Result<()>;
    /// Send a notification to the peer; `NotifyRejected` when it refuses it.
    fn notify(&self, session: &str, note: &Notification) -> Result<()>;
    /// Whether `note` could be sent at all: `InvalidArgument` saying why
    /// not (over the frame limit the peer enforces, bytes the backend
    /// cannot carry), so that a caller refuses it before starting the
    /// transfers it rides on.
    fn check_notification(&self, note: &Notification) -> Result<()> {
        Notification::check_size(note.name.len(), note.msg.len())
    }
    /// Every notification received so far, oldest first.
    fn drain_notifications(&self) -> Vec<Notification>;
    /// Counters since the engine started (see [`super::stats`]).
    fn stats(&self) -> super::stats::StatsSnapshot;
    /// What a metrics scrape shows (see [`super::metrics`]); a backend that
    /// keeps nothing more gives its counters alone.
    fn metrics(&self) -> super::metrics::MetricsSnapshot {
        super::metrics::MetricsSnapshot::from_stats(self.protocol(), self.stats())
    }
    /// The first buffer `segment` advertises (0: none); see
    /// `pdx_first_buffer_address`.
    fn first_buffer_address(&self, segment: &str) -> Result<u64> {
        Err(Error::invalid_argument(format!(
            "{segment}: this backend ({}) cannot read a segment's buffers",
            self.protocol()
        )))
    }
    /// One peer's figures as a JSON object (see [`super::peer_stats::peer_info_json`]);
    /// `InvalidArgument` for a peer this engine keeps nothing of.
    fn peer_info(&self, session: &str) -> Result<serde_json::Value> {
        Err(Error::invalid_argument(format!("{session}: this backend ({}) keeps no figures per peer", self.protocol())))
    }
    /// Stop: fail in-flight work, release resources. Idempotent.
    fn stop(&self);
}

/// The error for a protocol no loaded backend can serve.
pub fn unavailable(protocol: &str, why: &str) -> Error {
    Error::new(crate::ErrorKind::BackendUnavailable, format!("protocol '{protocol}': {why}"))
}
