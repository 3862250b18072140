//! Moving data and messages: synchronous transfers, asynchronous batches
//! (their task states, errors, waits and release), probes, notifications sent
//! to a peer and the lists of notifications received.

use std::ffi::{c_char, c_void, CString};
use std::time::Duration;

use super::{
    notification_from, notification_from_c, pdx_batch_summary, pdx_engine, pdx_notifications, pdx_notify_bytes,
    task_state, EngineHandle, ENGINES, PDX_OPCODE_READ, PDX_OPCODE_WRITE,
};
use crate::error::{Error, ErrorKind, Result};
use crate::ffi::boundary::{c_slice, c_str, guard, guard_or, handle_tag, opt_out_ptr, out_ptr, text_out, HandleTable};
use crate::ffi::status::{pdx_status, status_of, PDX_OK};
use crate::transfer::backend::check_entry_count;
use crate::transfer::{Direction, Notification, Request, TaskState};

/// The entries of a batch call, copied from C once the entry bound holds
/// (nothing proportional to `n` is read or allocated before).
unsafe fn requests(
    h: &EngineHandle,
    locals: *const *mut c_void,
    remotes: *const u64,
    lens: *const usize,
    n: usize,
) -> Result<Vec<Request>> {
    check_entry_count(n, h.engine.max_batch_entries())?;
    let locals = c_slice(locals, n, "locals")?;
    let remotes = c_slice(remotes, n, "remotes")?;
    let lens = c_slice(lens, n, "lens")?;
    Ok((0..n).map(|i| Request { local: locals[i] as usize, remote: remotes[i], len: lens[i] }).collect())
}

/// A synchronous call: the handle looked up once, then the session, then
/// the requests `reqs` makes from it.
unsafe fn sync(
    engine: *mut pdx_engine,
    session: *const c_char,
    dir: Direction,
    reqs: impl FnOnce(&EngineHandle) -> Result<Vec<Request>>,
) -> Result<()> {
    let h = ENGINES.get(engine)?;
    let session = c_str(session, "session")?;
    let reqs = reqs(&h)?;
    h.engine.transfer_sync(session, dir, reqs)
}

/// Write `len` bytes from `local` to `remote_addr` in the peer `session`
/// (`host:rpc_port`). Returns `PDX_OK` only when every byte is confirmed at
/// the target; `PDX_ERR_REMOTE_REJECTED` when the peer has not registered
/// that range; connection and timeout errors as named. `len == 0` succeeds
/// at once without touching memory or the network (`local` may be NULL).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `local` is readable for `len` bytes until the call returns. Handles are checked by pdx,
/// never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_transfer_sync_write(
    engine: *mut pdx_engine,
    session: *const c_char,
    local: *const c_void,
    remote_addr: u64,
    len: usize,
) -> pdx_status {
    guard("pdx_transfer_sync_write", || {
        let r = Request { local: local as usize, remote: remote_addr, len };
        sync(engine, session, Direction::Write, |_| Ok(vec![r]))
    })
}

/// Read `len` bytes at `remote_addr` in the peer `session` into `local`
/// (the destination). `PDX_OK` only when every byte has arrived.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `local` is writable for `len` bytes until the call returns. Handles are checked by pdx,
/// never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_transfer_sync_read(
    engine: *mut pdx_engine,
    session: *const c_char,
    local: *mut c_void,
    remote_addr: u64,
    len: usize,
) -> pdx_status {
    guard("pdx_transfer_sync_read", || {
        let r = Request { local: local as usize, remote: remote_addr, len };
        sync(engine, session, Direction::Read, |_| Ok(vec![r]))
    })
}

/// Write `n` entries (`locals[i]` → `remotes[i]`, `lens[i]` bytes) to one
/// peer. `PDX_OK` only when every entry is confirmed; otherwise the status
/// of the first failed entry, and the message counts the failures. Entries
/// may complete in any order; a failed entry does not stop the others.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `locals` is NULL (with `n` 0) or points to `n` readable elements; `remotes` is NULL
/// (with `n` 0) or points to `n` readable elements; `lens` is NULL (with `n` 0) or points to `n`
/// readable elements; each `locals[i]` is valid for `lens[i]` bytes (readable for writes, writable
/// for reads) until the call returns. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_transfer_sync_write(
    engine: *mut pdx_engine,
    session: *const c_char,
    locals: *const *mut c_void,
    remotes: *const u64,
    lens: *const usize,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_transfer_sync_write", || {
        sync(engine, session, Direction::Write, |h| requests(h, locals, remotes, lens, n))
    })
}

/// Read `n` entries (`remotes[i]` → `locals[i]`, `lens[i]` bytes) from one
/// peer; as `pdx_batch_transfer_sync_write`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `locals` is NULL (with `n` 0) or points to `n` readable elements; `remotes` is NULL
/// (with `n` 0) or points to `n` readable elements; `lens` is NULL (with `n` 0) or points to `n`
/// readable elements; each `locals[i]` is valid for `lens[i]` bytes (readable for writes, writable
/// for reads) until the call returns. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_transfer_sync_read(
    engine: *mut pdx_engine,
    session: *const c_char,
    locals: *const *mut c_void,
    remotes: *const u64,
    lens: *const usize,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_transfer_sync_read", || {
        sync(engine, session, Direction::Read, |h| requests(h, locals, remotes, lens, n))
    })
}

/// Start an asynchronous batch of `n` entries to `session` and write its id
/// (never 0) to `*out_batch`. `opcode` is `PDX_OPCODE_READ` or
/// `PDX_OPCODE_WRITE`. With `notify_name` and `notify_msg` both non-NULL, a
/// notification is sent to the peer after every entry completed (both NULL:
/// none); their bytes up to the NUL are sent as they are, UTF-8 or not
/// (`pdx_batch_submit_notify_bytes` takes any bytes). A notification whose
/// handshake frame would be over the peer's limit (`MC_HANDSHAKE_MAX_LENGTH`,
/// 1 MiB by default) is refused (`PDX_ERR_INVALID_ARGUMENT`) before
/// anything starts. Local memory must stay valid until the batch is
/// finished. Poll with `pdx_batch_status` / `pdx_task_status`, wait with
/// `pdx_batch_wait`, release with `pdx_batch_free`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `locals` is NULL (with `n` 0) or points to `n` readable elements; `remotes` is NULL
/// (with `n` 0) or points to `n` readable elements; `lens` is NULL (with `n` 0) or points to `n`
/// readable elements; `notify_name` is NULL or a NUL-terminated string; `notify_msg` is NULL or a
/// NUL-terminated string; `out_batch` is NULL or valid for writing one `u64`; each `locals[i]` is
/// valid for `lens[i]` bytes (readable for writes, writable for reads) until the batch is finished.
/// Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_submit(
    engine: *mut pdx_engine,
    session: *const c_char,
    opcode: i32,
    locals: *const *mut c_void,
    remotes: *const u64,
    lens: *const usize,
    n: usize,
    notify_name: *const c_char,
    notify_msg: *const c_char,
    out_batch: *mut u64,
) -> pdx_status {
    guard("pdx_batch_submit", || {
        let out = out_ptr(out_batch, "out_batch")?;
        let notify = notification_from_c(notify_name, notify_msg)?;
        submit(engine, session, opcode, (locals, remotes, lens, n), notify, out)
    })
}

/// `pdx_batch_submit` with the notification as bytes: `notify` NULL for
/// none, else its name and message, any bytes (NUL and bytes that are not
/// UTF-8 included), delivered intact to a pdx peer (what a Mooncake peer
/// receives: docs/wire.md).
///
/// # Safety
/// As `pdx_batch_submit`; `notify` is NULL or points to a readable `pdx_notify_bytes` whose
/// `name` and `msg` are readable for `name_len` and `msg_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_submit_notify_bytes(
    engine: *mut pdx_engine,
    session: *const c_char,
    opcode: i32,
    locals: *const *mut c_void,
    remotes: *const u64,
    lens: *const usize,
    n: usize,
    notify: *const pdx_notify_bytes,
    out_batch: *mut u64,
) -> pdx_status {
    guard("pdx_batch_submit_notify_bytes", || {
        let out = out_ptr(out_batch, "out_batch")?;
        let notify = notification_from(notify)?;
        submit(engine, session, opcode, (locals, remotes, lens, n), notify, out)
    })
}

/// The entry arrays of a batch call: locals, remotes, lens and their count.
type Entries = (*const *mut c_void, *const u64, *const usize, usize);

/// What both submits do once their notification is read.
unsafe fn submit(
    engine: *mut pdx_engine,
    session: *const c_char,
    opcode: i32,
    (locals, remotes, lens, n): Entries,
    notify: Option<Notification>,
    out: *mut u64,
) -> Result<()> {
    let h = ENGINES.get(engine)?;
    let session = c_str(session, "session")?;
    let dir = match opcode {
        PDX_OPCODE_READ => Direction::Read,
        PDX_OPCODE_WRITE => Direction::Write,
        other => {
            return Err(Error::invalid_argument(format!(
                "opcode {other} is neither PDX_OPCODE_READ (0) nor PDX_OPCODE_WRITE (1)"
            )))
        }
    };
    let id = h.engine.submit(session, dir, requests(&h, locals, remotes, lens, n)?, notify)?;
    *out = id;
    Ok(())
}

/// Fill `*out` with the batch's summary (state, counts, bytes). A stale,
/// freed or made-up id gives `PDX_ERR_INVALID_HANDLE`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out` is NULL or valid for writing one
/// `pdx_batch_summary`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_status(
    engine: *mut pdx_engine,
    batch: u64,
    out: *mut pdx_batch_summary,
) -> pdx_status {
    guard("pdx_batch_status", || {
        let out = out_ptr(out, "out")?;
        let s = ENGINES.get(engine)?.engine.batch_summary(batch)?;
        *out = pdx_batch_summary {
            state: task_state(s.state),
            total: s.total,
            completed: s.completed,
            failed: s.failed,
            bytes: s.bytes,
        };
        Ok(())
    })
}

/// One task's state (`PDX_TASK_*`), bytes confirmed, and the status code of
/// its failure (`PDX_OK` when it has none). Any out-param may be NULL.
/// `PDX_ERR_INDEX_OUT_OF_RANGE` for `task >= total`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `state` is NULL or valid for writing one
/// `i32`; `bytes` is NULL or valid for writing one `u64`; `error` is NULL or valid for writing one
/// `pdx_status`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_task_status(
    engine: *mut pdx_engine,
    batch: u64,
    task: usize,
    state: *mut i32,
    bytes: *mut u64,
    error: *mut pdx_status,
) -> pdx_status {
    guard("pdx_task_status", || {
        let state = opt_out_ptr(state, "state")?;
        let bytes = opt_out_ptr(bytes, "bytes")?;
        let error = opt_out_ptr(error, "error")?;
        let h = ENGINES.get(engine)?;
        // The state word alone (no lock the engine's threads take, no
        // allocation); the error is read only for a task that failed.
        let (s, n) = h.engine.task_state(batch, task)?;
        let status = match s {
            TaskState::Pending | TaskState::Completed => PDX_OK,
            TaskState::Canceled => status_of(ErrorKind::Canceled),
            TaskState::Failed => h.engine.task_summary(batch, task)?.error.map_or(PDX_OK, |e| status_of(e.kind())),
        };
        if let Some(p) = state {
            *p = task_state(s);
        }
        if let Some(p) = bytes {
            *p = n;
        }
        if let Some(p) = error {
            *p = status;
        }
        Ok(())
    })
}

/// Copy the failure text of one task into `buf` (`buf_len` bytes,
/// NUL-terminated, truncated if needed) and its full length (without the
/// NUL) into `*out_len` (may be NULL). An empty string when the task has not
/// failed. `buf` may be NULL when `buf_len` is 0 (to ask for the length).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `buf` is NULL (with `buf_len` 0) or
/// writable for `buf_len` bytes; `out_len` is NULL or valid for writing one `usize`. Handles are
/// checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_task_error_message(
    engine: *mut pdx_engine,
    batch: u64,
    task: usize,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_task_error_message", || {
        let out = text_out(buf, buf_len, out_len)?;
        let t = ENGINES.get(engine)?.engine.task_summary(batch, task)?;
        out.write(&t.error.map(|e| e.message().to_owned()).unwrap_or_default());
        Ok(())
    })
}

/// The outcome of a batch's notification (`pdx_batch_submit` with
/// `notify_name`/`notify_msg`): `*out_error` is `PDX_OK` when none was
/// requested, it was delivered, or the batch is not finished yet, and the
/// notification's status otherwise (`PDX_ERR_NOTIFY_REJECTED` when the peer
/// refused it, e.g. its queue was full); the transfers themselves still
/// count as completed. Its text goes to `buf` as in `pdx_task_error_message`
/// (empty when there is none). Any out-param may be NULL.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out_error` is NULL or valid for writing
/// one `pdx_status`; `buf` is NULL (with `buf_len` 0) or writable for `buf_len` bytes; `out_len` is
/// NULL or valid for writing one `usize`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_notify_error(
    engine: *mut pdx_engine,
    batch: u64,
    out_error: *mut pdx_status,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_batch_notify_error", || {
        let out_error = opt_out_ptr(out_error, "out_error")?;
        let text = text_out(buf, buf_len, out_len)?;
        let e = ENGINES.get(engine)?.engine.batch_notify_error(batch)?;
        if let Some(p) = out_error {
            *p = e.as_ref().map_or(PDX_OK, |e| status_of(e.kind()));
        }
        text.write(e.as_ref().map_or("", |e| e.message()));
        Ok(())
    })
}

/// Wait up to `timeout_ms` for the batch to finish. `PDX_OK` once every task
/// is terminal, with the batch state (`PDX_TASK_COMPLETED`, `PDX_TASK_FAILED`
/// or `PDX_TASK_CANCELED`) in `*out_state` (may be NULL); `PDX_ERR_TIMEOUT`
/// while tasks are still in flight. Every task reaches a terminal state within the
/// engine's deadlines, so waiting again always ends.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out_state` is NULL or valid for writing
/// one `i32`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_wait(
    engine: *mut pdx_engine,
    batch: u64,
    timeout_ms: u32,
    out_state: *mut i32,
) -> pdx_status {
    guard("pdx_batch_wait", || {
        let out_state = opt_out_ptr(out_state, "out_state")?;
        let h = ENGINES.get(engine)?;
        let s = h.engine.batch_wait(batch, Duration::from_millis(u64::from(timeout_ms)))?;
        if let Some(p) = out_state {
            *p = task_state(s.state);
        }
        Ok(())
    })
}

/// Release a finished batch; its id becomes invalid. `PDX_ERR_BUSY` while
/// tasks are in flight (nothing is freed then): to release a batch in
/// flight, `pdx_batch_cancel` it first.
#[no_mangle]
pub extern "C" fn pdx_batch_free(engine: *mut pdx_engine, batch: u64) -> pdx_status {
    guard("pdx_batch_free", || ENGINES.get(engine)?.engine.batch_free(batch))
}

/// Cancel every task of the batch still in flight; `*out_canceled` (may be
/// NULL) is how many this call cancelled. When it returns `PDX_OK`, pdx
/// reads no byte of their local sources and writes no byte into their local
/// destinations again (data of a read that arrives later is dropped), so
/// the caller may reuse that memory at once; bytes a cancelled write had
/// already sent may still land in the peer's memory. Cancelled tasks end
/// `PDX_TASK_CANCELED` (their error `PDX_ERR_CANCELED`, their bytes what
/// was confirmed before); tasks already finished keep their state (a cancel
/// racing a completion ends in exactly one of the two). The batch is then
/// finished (free it with `pdx_batch_free`), unless every task had completed
/// first and its notification is still being sent. Returns within seconds
/// whatever the peer does; `PDX_ERR_TIMEOUT` when it could not make sure
/// of the above within its bound (the tasks stay cancelled and the batch
/// finishes once it can); `PDX_ERR_INVALID_ARGUMENT` on a backend that
/// cannot cancel (Mooncake's own library). `*out_canceled` is untouched on
/// error.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out_canceled` is NULL or valid for
/// writing one `size_t`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_cancel(engine: *mut pdx_engine, batch: u64, out_canceled: *mut usize) -> pdx_status {
    guard("pdx_batch_cancel", || {
        let out = opt_out_ptr(out_canceled, "out_canceled")?;
        let n = ENGINES.get(engine)?.engine.cancel(batch, None)?;
        if let Some(p) = out {
            *p = n;
        }
        Ok(())
    })
}

/// Cancel task `task` of the batch if it is still in flight, as
/// `pdx_batch_cancel` does for all of them; the batch's other tasks carry
/// on. `*out_state` (may be NULL) is the task's state afterwards:
/// `PDX_TASK_CANCELED`, or `PDX_TASK_COMPLETED` / `PDX_TASK_FAILED` when it
/// had finished first. `PDX_ERR_INDEX_OUT_OF_RANGE` for `task >= total`.
/// `*out_state` is untouched on error.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out_state` is NULL or valid for writing
/// one `i32`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_task_cancel(
    engine: *mut pdx_engine,
    batch: u64,
    task: usize,
    out_state: *mut i32,
) -> pdx_status {
    guard("pdx_task_cancel", || {
        let out = opt_out_ptr(out_state, "out_state")?;
        let h = ENGINES.get(engine)?;
        h.engine.cancel(batch, Some(task))?;
        let (state, _) = h.engine.task_state(batch, task)?;
        if let Some(p) = out {
            *p = task_state(state);
        }
        Ok(())
    })
}

/// A drained notification: its bytes, and its C-string form for
/// `pdx_notification_get` (a NUL byte shown as `\u0000`).
struct Drained {
    note: Notification,
    name: CString,
    msg: CString,
}

impl Drained {
    fn new(note: Notification) -> Drained {
        // C strings cannot hold a NUL: the C-string view shows it escaped
        // rather than cutting the text there (the bytes view has it whole).
        let c = |b: &[u8]| {
            let mut out = Vec::with_capacity(b.len());
            for &byte in b {
                match byte {
                    0 => out.extend_from_slice(b"\\u0000"),
                    _ => out.push(byte),
                }
            }
            CString::new(out).unwrap_or_default()
        };
        Drained { name: c(&note.name), msg: c(&note.msg), note }
    }
}

static NOTIFICATIONS: HandleTable<Vec<Drained>> =
    HandleTable::new("pdx_notifications handle", handle_tag::NOTIFICATIONS);

/// Ask `session` whether it is alive. `PDX_OK` when it answered.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_send_probe(engine: *mut pdx_engine, session: *const c_char) -> pdx_status {
    guard("pdx_send_probe", || {
        let h = ENGINES.get(engine)?;
        h.engine.probe(c_str(session, "session")?)
    })
}

/// The address of the first buffer `segment` advertises, as Mooncake's
/// `getFirstBufferAddress`: this engine's own when `segment` is its session
/// name, else read afresh from the metadata directory (in P2P mode the
/// peer's descriptor). `*out_addr` is 0 when the segment advertises no
/// buffer. An unknown or unreachable segment is an error
/// (`PDX_ERR_PEER_UNREACHABLE`, ...); so is a Mooncake-backed engine
/// (`PDX_ERR_INVALID_ARGUMENT`). `*out_addr` is untouched on error.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `segment` is NULL or a NUL-terminated
/// string; `out_addr` is NULL or valid for writing one `uint64_t`. Handles are checked by pdx,
/// never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_first_buffer_address(
    engine: *mut pdx_engine,
    segment: *const c_char,
    out_addr: *mut u64,
) -> pdx_status {
    guard("pdx_first_buffer_address", || {
        let out = out_ptr(out_addr, "out_addr")?;
        let h = ENGINES.get(engine)?;
        let addr = h.engine.first_buffer_address(c_str(segment, "segment")?)?;
        // SAFETY: checked non-NULL and aligned; the caller guarantees it is writable.
        unsafe { *out = addr };
        Ok(())
    })
}

/// Send the notification (`name`, `msg`) to `session`, as Mooncake's notify:
/// the bytes of each string up to its NUL, UTF-8 or not
/// (`pdx_send_notify_bytes` takes any bytes). `PDX_ERR_NOTIFY_REJECTED` if
/// the peer refused it; `PDX_ERR_INVALID_ARGUMENT`, before sending, when
/// its handshake frame would be over the peer's limit
/// (`MC_HANDSHAKE_MAX_LENGTH`, 1 MiB by default, which a peer enforces by
/// closing the connection).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `name` is NULL or a NUL-terminated string; `msg` is NULL or a NUL-terminated string.
/// Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_send_notify(
    engine: *mut pdx_engine,
    session: *const c_char,
    name: *const c_char,
    msg: *const c_char,
) -> pdx_status {
    guard("pdx_send_notify", || {
        let h = ENGINES.get(engine)?;
        let session = c_str(session, "session")?;
        for (p, what) in [(name, "name"), (msg, "msg")] {
            if p.is_null() {
                return Err(Error::new(ErrorKind::NullArgument, format!("{what} is NULL")));
            }
        }
        let note = notification_from_c(name, msg)?.unwrap_or_default();
        h.engine.notify(session, &note)
    })
}

/// `pdx_send_notify` with the notification as bytes (any bytes, NUL and
/// bytes that are not UTF-8 included; intact to a pdx peer, to a Mooncake
/// peer as docs/wire.md says). `notify` must not be NULL.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; `notify` is NULL or points to a readable `pdx_notify_bytes` whose `name` and `msg` are
/// readable for `name_len` and `msg_len` bytes. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_send_notify_bytes(
    engine: *mut pdx_engine,
    session: *const c_char,
    notify: *const pdx_notify_bytes,
) -> pdx_status {
    guard("pdx_send_notify_bytes", || {
        let h = ENGINES.get(engine)?;
        let session = c_str(session, "session")?;
        let note = notification_from(notify)?.ok_or_else(|| Error::new(ErrorKind::NullArgument, "notify is NULL"))?;
        h.engine.notify(session, &note)
    })
}

/// Take every notification received so far (oldest first) into a new list
/// owned by the caller (`*out`; release with `pdx_notifications_free`).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_notifications_drain(
    engine: *mut pdx_engine,
    out: *mut *mut pdx_notifications,
) -> pdx_status {
    guard("pdx_notifications_drain", || {
        let out = out_ptr(out, "out")?;
        let h = ENGINES.get(engine)?;
        let list = h.engine.drain_notifications().into_iter().map(Drained::new).collect();
        *out = NOTIFICATIONS.insert(list)?;
        Ok(())
    })
}

/// Number of notifications in the list; 0 for NULL or an invalid list.
#[no_mangle]
pub extern "C" fn pdx_notifications_count(list: *const pdx_notifications) -> usize {
    guard_or("pdx_notifications_count", 0, || Ok(NOTIFICATIONS.get(list)?.len()))
}

/// Entry `i` of the list as C strings: `*name` and `*msg` point to strings
/// owned by the list, valid until `pdx_notifications_free`. Either
/// out-param may be NULL. The bytes arrive as the peer sent them, UTF-8 or
/// not, except a NUL byte, which reads as the six characters `\u0000`
/// here (`pdx_notification_get_bytes` gives the bytes exactly).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `name` is NULL or valid for writing one
/// pointer; `msg` is NULL or valid for writing one pointer. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_notification_get(
    list: *const pdx_notifications,
    i: usize,
    name: *mut *const c_char,
    msg: *mut *const c_char,
) -> pdx_status {
    guard("pdx_notification_get", || {
        let name = opt_out_ptr(name, "name")?;
        let msg = opt_out_ptr(msg, "msg")?;
        let l = NOTIFICATIONS.get(list)?;
        let d = entry(&l, i)?;
        if let Some(p) = name {
            *p = d.name.as_ptr();
        }
        if let Some(p) = msg {
            *p = d.msg.as_ptr();
        }
        Ok(())
    })
}

/// Entry `i` of the list as bytes, exactly as they arrived: `*out`'s
/// pointers are owned by the list, valid until `pdx_notifications_free`
/// (a pointer to an empty name or message is not NULL).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out` is NULL or valid for writing one
/// `pdx_notify_bytes`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_notification_get_bytes(
    list: *const pdx_notifications,
    i: usize,
    out: *mut pdx_notify_bytes,
) -> pdx_status {
    guard("pdx_notification_get_bytes", || {
        let out = out_ptr(out, "out")?;
        let l = NOTIFICATIONS.get(list)?;
        let n = &entry(&l, i)?.note;
        let bytes = |v: &Vec<u8>| if v.is_empty() { c"".as_ptr().cast::<u8>() } else { v.as_ptr() };
        *out =
            pdx_notify_bytes { name: bytes(&n.name), name_len: n.name.len(), msg: bytes(&n.msg), msg_len: n.msg.len() };
        Ok(())
    })
}

/// Entry `i` of a drained list.
fn entry(l: &[Drained], i: usize) -> Result<&Drained> {
    l.get(i).ok_or_else(|| {
        Error::new(ErrorKind::IndexOutOfRange, format!("notification index {i} out of range (list has {})", l.len()))
    })
}

/// Release a notification list; NULL is ignored.
#[no_mangle]
pub extern "C" fn pdx_notifications_free(list: *mut pdx_notifications) {
    guard_or("pdx_notifications_free", (), || {
        NOTIFICATIONS.remove(list);
        Ok(())
    })
}
