//! C ABI for the transfer engine.
//!
//! A `pdx_engine` is safe to use from many threads at once. Memory passed as
//! `local` must stay valid until the call returns (sync calls) or until the
//! batch is finished (asynchronous batches). Remote addresses are absolute
//! addresses in the peer's process, inside memory the peer registered.
//!
//! ```c
//! pdx_engine *e;
//! if (pdx_engine_init("10.0.0.2", "tcp", NULL, &e) != PDX_OK) die(pdx_last_error_message());
//! pdx_register_memory(e, kv_pool, kv_pool_bytes);
//! pdx_transfer_sync_write(e, "10.0.0.3:15123", src, remote_addr, len);
//! pdx_engine_free(e);
//! ```

use std::ffi::{c_char, CStr, CString};

use crate::error::{Error, Result};
use crate::ffi::boundary::{c_slice, handle_tag, HandleTable};
use crate::transfer::{Notification, TaskState, TransferBackend};

// Each file's functions appear in include/pdx.h in the order of the files'
// names (cbindgen reads child modules in that order), which is also the
// order of the header's sections: lifecycle, memory, transfers.
mod lifecycle;
mod memory;
mod transfer;

pub use lifecycle::{
    pdx_engine_device, pdx_engine_free, pdx_engine_init, pdx_engine_init_with, pdx_engine_protocol,
    pdx_engine_rpc_port, pdx_engine_session_id, pdx_engine_transport_reason,
};
pub use memory::{
    pdx_batch_register_memory, pdx_batch_unregister_memory, pdx_register_memory, pdx_register_memory_at,
    pdx_unregister_memory,
};
pub use transfer::{
    pdx_batch_cancel, pdx_batch_free, pdx_batch_notify_error, pdx_batch_status, pdx_batch_submit,
    pdx_batch_submit_notify_bytes, pdx_batch_transfer_sync_read, pdx_batch_transfer_sync_write, pdx_batch_wait,
    pdx_notification_get, pdx_notification_get_bytes, pdx_notifications_count, pdx_notifications_drain,
    pdx_notifications_free, pdx_send_notify, pdx_send_notify_bytes, pdx_send_probe, pdx_task_cancel,
    pdx_task_error_message, pdx_task_status, pdx_transfer_sync_read, pdx_transfer_sync_write,
};

/// Opaque transfer engine. Made by `pdx_engine_init`, released by
/// `pdx_engine_free`.
#[allow(non_camel_case_types)]
pub struct pdx_engine {
    _private: [u8; 0],
}

/// Opaque list of received notifications. Made by `pdx_notifications_drain`,
/// released by `pdx_notifications_free`.
#[allow(non_camel_case_types)]
pub struct pdx_notifications {
    _private: [u8; 0],
}

/// A notification's name and message as bytes: any bytes, NUL and bytes
/// that are not UTF-8 included (the `*_bytes` calls take and give it).
/// `name` may be NULL only when `name_len` is 0, `msg` only when `msg_len`
/// is 0. Passed in, it is read during the call only; filled by
/// `pdx_notification_get_bytes`, its pointers are owned by the list.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct pdx_notify_bytes {
    pub name: *const u8,
    pub name_len: usize,
    pub msg: *const u8,
    pub msg_len: usize,
}

/// The notification a `*_bytes` call was given: `None` for NULL; its
/// lengths are checked before anything is copied.
///
/// # Safety
/// `note` is NULL or points to a readable `pdx_notify_bytes` whose `name`
/// and `msg` are readable for `name_len` and `msg_len` bytes.
pub(crate) unsafe fn notification_from(note: *const pdx_notify_bytes) -> Result<Option<Notification>> {
    if note.is_null() {
        return Ok(None);
    }
    if !note.is_aligned() {
        return Err(Error::invalid_argument("notify is not aligned"));
    }
    // SAFETY: checked non-NULL and aligned; readable by the caller's contract.
    let n = unsafe { note.read() };
    Notification::check_size(n.name_len, n.msg_len)?;
    // SAFETY: the caller's contract; NULL with a length is refused.
    let (name, msg) =
        unsafe { (c_slice(n.name, n.name_len, "notify->name")?, c_slice(n.msg, n.msg_len, "notify->msg")?) };
    Ok(Some(Notification::new(name, msg)))
}

/// A notification given as two C strings (any bytes up to the NUL, UTF-8 or
/// not): both NULL is none, one NULL is an error.
///
/// # Safety
/// `name` and `msg` are NULL or NUL-terminated.
pub(crate) unsafe fn notification_from_c(name: *const c_char, msg: *const c_char) -> Result<Option<Notification>> {
    match (name.is_null(), msg.is_null()) {
        (true, true) => Ok(None),
        // SAFETY: non-NULL and NUL-terminated by the caller's contract.
        (false, false) => unsafe {
            Ok(Some(Notification::new(CStr::from_ptr(name).to_bytes(), CStr::from_ptr(msg).to_bytes())))
        },
        _ => Err(Error::invalid_argument("notify_name and notify_msg must both be NULL or both be set")),
    }
}

/// Opcode of `pdx_batch_submit`: read remote memory into local memory.
pub const PDX_OPCODE_READ: i32 = 0;
/// Opcode of `pdx_batch_submit`: write local memory into remote memory.
pub const PDX_OPCODE_WRITE: i32 = 1;

/// Task or batch state: still in flight.
pub const PDX_TASK_PENDING: i32 = 0;
/// Task or batch state: every byte confirmed at the target.
pub const PDX_TASK_COMPLETED: i32 = 1;
/// Task or batch state: failed (a batch: at least one task failed). Also a
/// task pdx gave up on by itself (a deadline, a lost peer, the engine
/// stopping).
pub const PDX_TASK_FAILED: i32 = 2;
/// Task or batch state: cancelled by the caller (`pdx_batch_cancel`,
/// `pdx_task_cancel`) and only then; no byte of its local memory is read or
/// written any more (a batch: none failed and at least one was cancelled).
pub const PDX_TASK_CANCELED: i32 = 3;

/// Summary of an asynchronous batch, filled by `pdx_batch_status`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct pdx_batch_summary {
    /// `PDX_TASK_PENDING` until every task is terminal, then
    /// `PDX_TASK_COMPLETED`, `PDX_TASK_FAILED` (a task failed) or
    /// `PDX_TASK_CANCELED` (none failed, one was cancelled).
    pub state: i32,
    /// Number of tasks (entries) in the batch.
    pub total: usize,
    /// Tasks confirmed at the target.
    pub completed: usize,
    /// Tasks that failed. (Tasks cancelled by the caller count as neither
    /// completed nor failed: `pdx_batch_cancel` says how many it cancelled.)
    pub failed: usize,
    /// Bytes confirmed at the target so far.
    pub bytes: u64,
}

/// The `PDX_TASK_*` integer of a state.
fn task_state(state: TaskState) -> i32 {
    match state {
        TaskState::Pending => PDX_TASK_PENDING,
        TaskState::Completed => PDX_TASK_COMPLETED,
        TaskState::Failed => PDX_TASK_FAILED,
        TaskState::Canceled => PDX_TASK_CANCELED,
    }
}

struct EngineHandle {
    engine: Box<dyn TransferBackend>,
    session_id: CString,
    protocol: CString,
    /// The device filter the transport was resolved to.
    device: CString,
    /// Why that protocol and device (the transport choice's reason).
    reason: CString,
}

static ENGINES: HandleTable<EngineHandle> = HandleTable::new("pdx_engine handle", handle_tag::ENGINE);

/// Run `f` on the backend behind a live engine handle (for the other ffi
/// modules); the engine stays alive for the call even if another thread
/// frees the handle meanwhile.
pub(crate) fn with_engine<T>(
    engine: *const pdx_engine,
    f: impl FnOnce(&dyn TransferBackend) -> Result<T>,
) -> Result<T> {
    f(&*ENGINES.get(engine)?.engine)
}

/// A live engine's backend that stays alive past the call, for work that
/// finishes later (a KV submit's deferred notification).
pub(crate) struct BackendRef(std::sync::Arc<EngineHandle>);

impl std::ops::Deref for BackendRef {
    type Target = dyn TransferBackend;
    fn deref(&self) -> &Self::Target {
        &*self.0.engine
    }
}

/// The backend behind a live engine handle; see [`BackendRef`].
pub(crate) fn backend_ref(engine: *const pdx_engine) -> Result<BackendRef> {
    Ok(BackendRef(ENGINES.get(engine)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_states_are_distinct_abi_integers() {
        let all = [TaskState::Pending, TaskState::Completed, TaskState::Failed, TaskState::Canceled].map(task_state);
        assert_eq!(all, [PDX_TASK_PENDING, PDX_TASK_COMPLETED, PDX_TASK_FAILED, PDX_TASK_CANCELED]);
        assert_eq!(all, [0, 1, 2, 3], "the values are part of the ABI (3 is Mooncake's STATUS_CANCELED too)");
    }
}
