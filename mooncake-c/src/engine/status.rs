//! `getTransferStatus` and the notification a batch's last completed task
//! lets out. NIXL asks every task's status on every poll, so a task in
//! flight or completed is answered from the backend's state word
//! ([`pdx::transfer::TransferBackend::task_state`]) under read locks only (the engine
//! table, the batch map, the batch, the transport slot): no lock a
//! transfer thread takes, no allocation. The failure text is read, and
//! made the last error, only for a task that ended failed or cancelled.

use parking_lot::RwLock;
use pdx::transfer::notification::shown;
use pdx::transfer::TaskState;

use super::{no_transport, McEngine};
use crate::batches::{McBatch, Place};
use crate::codes::{McError, McResult};

impl McEngine {
    /// `getTransferStatus`: the task's state as Mooncake numbers it and the
    /// bytes it moved; a completed task whose batch is all completed sends
    /// the batch's notification if this layer holds it. A failed task's
    /// reason becomes the last error, although the call succeeds.
    pub fn task_status(&self, batch: u64, task: usize) -> McResult<(TaskState, u64)> {
        let b = self.batch(batch)?;
        let (state, bytes) = {
            let g = b.read();
            let place = g.task(task).map_err(|n| {
                McError::invalid(format!("task {task} is out of range (batch {batch:#x} has {n} tasks)"))
            })?;
            match place {
                Place::NotStarted => {
                    pdx::ffi::set_last_error(&format!(
                        "task {task} of batch {batch:#x} never started: its submit failed"
                    ));
                    return Ok((TaskState::Failed, 0));
                }
                Place::Settled { state, bytes } => {
                    if state == TaskState::Failed {
                        let why =
                            g.settled_failure(task).unwrap_or("it was in flight when its transport was uninstalled");
                        pdx::ffi::set_last_error(&format!("task {task} of batch {batch:#x} failed: {why}"));
                    }
                    (state, bytes)
                }
                Place::Running { id, index } => {
                    // Under the batch's lock, the transport installed is the
                    // one that runs `id` (see `McEngine::batches`).
                    let transport = self.transport.read();
                    let Some(t) = &*transport else { return Err(no_transport()) };
                    let (state, bytes) = t.backend.task_state(id, index)?;
                    if matches!(state, TaskState::Failed | TaskState::Canceled) {
                        if let Some(e) = t.backend.task_summary(id, index)?.error {
                            pdx::ffi::set_last_error(&format!(
                                "task {task} of batch {batch:#x} failed: {}",
                                e.message()
                            ));
                        }
                    }
                    (state, bytes)
                }
            }
        };
        if state == TaskState::Completed {
            self.send_deferred(&b);
        }
        Ok((state, bytes))
    }

    /// Send the batch's notification if this layer holds it and every task
    /// has completed (once; a failure is logged, the transfers stand).
    pub(super) fn send_deferred(&self, b: &RwLock<McBatch>) {
        // The common case (no notification held here) under the read lock.
        if b.read().deferred.is_none() {
            return;
        }
        let (deferred, backend) = {
            let mut g = b.write();
            if g.deferred.is_none() || g.has_unstarted() || !g.settled_all_completed() {
                return;
            }
            let Ok(backend) = self.backend() else { return };
            let all = g
                .subs()
                .iter()
                .all(|id| backend.batch_summary(*id).is_ok_and(|s| s.completed == s.total && s.failed == 0));
            if !all {
                return;
            }
            (g.deferred.take(), backend)
        };
        if let Some(d) = deferred {
            if let Err(e) = backend.notify(&d.session, &d.note) {
                log::error!("notification {} to {} failed: {}", shown(&d.note.name), d.session, e.message());
            }
        }
    }
}
