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

use std::ffi::{c_char, c_void, CString};
use std::time::Duration;

use super::args::to_cstring;
use super::boundary::{
    c_slice, c_str, guard, guard_or, handle_tag, opt_c_str, opt_out_ptr, out_ptr, text_out, HandleTable,
};
use super::engine_options::{options_of, pdx_engine_options};
use super::status::{pdx_status, status_of, PDX_OK};
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::backend::check_entry_count;
use crate::transfer::{Direction, Request, TaskState, TransferBackend};

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

/// Opcode of `pdx_batch_submit`: read remote memory into local memory.
pub const PDX_OPCODE_READ: i32 = 0;
/// Opcode of `pdx_batch_submit`: write local memory into remote memory.
pub const PDX_OPCODE_WRITE: i32 = 1;

/// Task or batch state: still in flight.
pub const PDX_TASK_PENDING: i32 = 0;
/// Task or batch state: every byte confirmed at the target.
pub const PDX_TASK_COMPLETED: i32 = 1;
/// Task or batch state: failed (a batch: at least one task failed).
pub const PDX_TASK_FAILED: i32 = 2;

/// Summary of an asynchronous batch, filled by `pdx_batch_status`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct pdx_batch_summary {
    /// `PDX_TASK_PENDING` until every task is terminal, then
    /// `PDX_TASK_COMPLETED` or `PDX_TASK_FAILED`.
    pub state: i32,
    /// Number of tasks (entries) in the batch.
    pub total: usize,
    /// Tasks confirmed at the target.
    pub completed: usize,
    /// Tasks that failed.
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
static NOTIFICATIONS: HandleTable<Vec<(CString, CString)>> =
    HandleTable::new("pdx_notifications handle", handle_tag::NOTIFICATIONS);

/// Start a transfer engine on `hostname`: `pdx_engine_init_with` without
/// options (`gpu_id` 0, the shared-engine device rule, every setting from
/// the environment).
///
/// The transport is resolved exactly as `pdx_resolve_transport` does it
/// (explicit `protocol` > `MOONCAKE_PROTOCOL`, default `"rdma"`;
/// `MC_FORCE_TCP` present forces `"tcp"`). For `"tcp"` the native engine
/// starts: a handshake listener and a data listener on `hostname`'s address,
/// ports picked in `MC_MIN_RPC_PORT..MC_MAX_RPC_PORT`. Every other protocol
/// (and `"tcp"` with `PDX_TCP_ENGINE=mooncake`) runs on Mooncake's engine,
/// loaded from `PDX_MOONCAKE_LIB` (default `libtransfer_engine.so`); when it
/// cannot be loaded, or cannot install the protocol, the call fails with
/// `PDX_ERR_BACKEND_UNAVAILABLE` naming the protocol and the library.
///
/// `hostname` is required; `protocol` and `device` may be NULL. On success
/// `*out` receives an engine owned by the caller (release it with
/// `pdx_engine_free`); on error `*out` is untouched.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `hostname` is NULL or a NUL-terminated
/// string; `protocol` is NULL or a NUL-terminated string; `device` is NULL or a NUL-terminated
/// string; `out` is NULL or valid for writing one pointer. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_init(
    hostname: *const c_char,
    protocol: *const c_char,
    device: *const c_char,
    out: *mut *mut pdx_engine,
) -> pdx_status {
    guard("pdx_engine_init", || {
        // SAFETY: the caller's guarantees are this function's.
        unsafe { init_with(hostname, protocol, device, std::ptr::null(), out) }
    })
}

/// Start a transfer engine on `hostname` with `options` (NULL: none, the
/// same as `pdx_engine_init`). The options are read during the call; the
/// object may be changed or freed afterwards.
///
/// - `gpu_id` picks this GPU's entry when `device` is a per-GPU mapping
///   (inline JSON `{"0": "mlx5_0", ...}` or a `.json` file), exactly as
///   SGLang's `get_ib_devices_for_gpu`; a mapping without that GPU fails
///   with `PDX_ERR_VALUE_ERROR` and SGLang's text as the last error
///   (`No IB devices configured for GPU 3. Available GPUs: [0, 1]`). It is
///   also the Ascend `npu_N` suffix when `ASCEND_NPU_PHY_ID` is -1.
/// - `device_source` `remote_instance`: the device is `device` as given,
///   else `MOONCAKE_DEVICE`, as SGLang's remote-instance engine does.
/// - Every other option takes its variable's place in the engine's settings.
///
/// `pdx_engine_transport_reason` says afterwards which rule and which GPU
/// entry chose the device. Errors: those of `pdx_engine_init`, plus
/// `PDX_ERR_INVALID_HANDLE` for a stale `options`. `*out` is untouched on
/// error.
///
/// # Safety
/// As `pdx_engine_init`; `options` is NULL or a handle (checked by pdx).
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_init_with(
    hostname: *const c_char,
    protocol: *const c_char,
    device: *const c_char,
    options: *const pdx_engine_options,
    out: *mut *mut pdx_engine,
) -> pdx_status {
    guard("pdx_engine_init_with", || {
        // SAFETY: the caller's guarantees are this function's.
        unsafe { init_with(hostname, protocol, device, options, out) }
    })
}

/// # Safety
/// As `pdx_engine_init_with`.
unsafe fn init_with(
    hostname: *const c_char,
    protocol: *const c_char,
    device: *const c_char,
    options: *const pdx_engine_options,
    out: *mut *mut pdx_engine,
) -> Result<()> {
    let out = out_ptr(out, "out")?;
    // SAFETY: the caller passes NUL-terminated strings or NULL.
    let (hostname, protocol, device) =
        unsafe { (c_str(hostname, "hostname")?, opt_c_str(protocol, "protocol")?, opt_c_str(device, "device")?) };
    let options = options_of(options)?;
    let (engine, choice) = crate::backend::start_with(hostname, protocol, device, &options)?;
    let texts = (|| {
        Ok((
            to_cstring(engine.session_id(), "session id")?,
            to_cstring(engine.protocol(), "protocol")?,
            to_cstring(&choice.device, "device")?,
            to_cstring(&choice.reason, "reason")?,
        ))
    })();
    let (session_id, protocol, device, reason) = match texts {
        Ok(t) => t,
        Err(e) => {
            // A started engine that cannot be handed out is stopped, not leaked.
            engine.stop();
            return Err(e);
        }
    };
    let handle = ENGINES.insert(EngineHandle { engine, session_id, protocol, device, reason })?;
    // SAFETY: `out` checked non-NULL and aligned.
    unsafe { *out = handle };
    Ok(())
}

/// Stop and free an engine: listeners close, in-flight transfers fail,
/// every engine thread is joined before this returns. NULL (and an already
/// freed engine) is ignored. Other threads must not use the engine after
/// this call starts; calls already inside it finish with an error.
///
/// From the log callback running on one of this engine's own threads (see
/// `pdx_set_log_callback`), it cannot wait for that thread: the engine is
/// freed and stops at once as above (the handle is invalid when this
/// returns), and its threads end shortly after without being waited for
/// here, that thread once the callback has returned and it has left pdx.
/// All of them end within the engine's deadlines (seconds), joined by a
/// short-lived `pdx-reaper` thread. Nothing is reported as an error.
#[no_mangle]
pub extern "C" fn pdx_engine_free(engine: *mut pdx_engine) {
    guard_or("pdx_engine_free", (), || {
        if let Some(handle) = ENGINES.remove(engine) {
            handle.engine.stop();
        }
        Ok(())
    })
}

/// The engine's session id, `host:rpc_port` (IPv6 hosts bracketed): the name
/// peers pass as `session`. Owned by the engine, valid until
/// `pdx_engine_free`. NULL for an invalid engine (see the last error).
#[no_mangle]
pub extern "C" fn pdx_engine_session_id(engine: *const pdx_engine) -> *const c_char {
    guard_or("pdx_engine_session_id", std::ptr::null(), || Ok(ENGINES.get(engine)?.session_id.as_ptr()))
}

/// The engine's handshake (RPC) port; 0 for an invalid engine.
#[no_mangle]
pub extern "C" fn pdx_engine_rpc_port(engine: *const pdx_engine) -> u16 {
    guard_or("pdx_engine_rpc_port", 0, || Ok(ENGINES.get(engine)?.engine.rpc_port()))
}

/// The device filter the engine was started with (`""`: auto discovery or
/// TCP). Owned by the engine, valid until `pdx_engine_free`; NULL for an
/// invalid engine.
#[no_mangle]
pub extern "C" fn pdx_engine_device(engine: *const pdx_engine) -> *const c_char {
    guard_or("pdx_engine_device", std::ptr::null(), || Ok(ENGINES.get(engine)?.device.as_ptr()))
}

/// Why the engine runs this protocol and device: the transport choice's
/// reason (the protocol's source; the device rule, `gpu_id` and the mapping
/// entry used). Owned by the engine, valid until `pdx_engine_free`; NULL for
/// an invalid engine.
#[no_mangle]
pub extern "C" fn pdx_engine_transport_reason(engine: *const pdx_engine) -> *const c_char {
    guard_or("pdx_engine_transport_reason", std::ptr::null(), || Ok(ENGINES.get(engine)?.reason.as_ptr()))
}

/// The protocol really in use (`"tcp"` for the native engine). Owned by the
/// engine, valid until `pdx_engine_free`; NULL for an invalid engine.
#[no_mangle]
pub extern "C" fn pdx_engine_protocol(engine: *const pdx_engine) -> *const c_char {
    guard_or("pdx_engine_protocol", std::ptr::null(), || Ok(ENGINES.get(engine)?.protocol.as_ptr()))
}

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

fn region(addr: *const c_void, len: usize, i: Option<usize>) -> Result<(u64, u64)> {
    let at = i.map(|i| format!(" (entry {i})")).unwrap_or_default();
    if addr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("addr is NULL{at}")));
    }
    Ok((addr as u64, len as u64))
}

/// Let peers read and write `[addr, addr+len)`. The memory stays owned by
/// the caller and must stay valid until it is unregistered (or the engine
/// freed). Zero lengths and overlaps with registered regions fail with
/// `PDX_ERR_ADDRESS_OVERLAP`; NULL `addr` with `PDX_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub extern "C" fn pdx_register_memory(engine: *mut pdx_engine, addr: *mut c_void, len: usize) -> pdx_status {
    guard("pdx_register_memory", || {
        let h = ENGINES.get(engine)?;
        let r = region(addr, len, None)?;
        h.engine.register_batch(&[r])
    })
}

/// Register `[addr, addr+len)` at `location`, in Mooncake's syntax:
/// `"cpu:N"` (host memory), `"cuda:N"` (device memory of CUDA device N) or
/// `"*"` (detect; NULL means `"*"`, and so does `pdx_register_memory`).
/// Detection asks the CUDA driver (`PDX_CUDA_LIB`, default
/// `libcuda.so.1`) when one loads; otherwise the memory is host memory.
/// Device memory is staged through pinned host buffers and never touched
/// by the CPU. A `"cuda:N"` region with no loadable driver or no device N
/// fails with `PDX_ERR_DEVICE_UNAVAILABLE`, one the driver does not report
/// as device memory of N with `PDX_ERR_INVALID_ARGUMENT`, a failing driver
/// call with `PDX_ERR_DEVICE`; each message names the region and the cause.
/// Other errors as `pdx_register_memory`. The Mooncake backend passes the
/// location to `registerLocalMemory` unchanged.
///
/// # Safety
/// `location` is NULL or a NUL-terminated string; the memory stays valid
/// until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn pdx_register_memory_at(
    engine: *mut pdx_engine,
    addr: *mut c_void,
    len: usize,
    location: *const c_char,
) -> pdx_status {
    guard("pdx_register_memory_at", || {
        let h = ENGINES.get(engine)?;
        let r = region(addr, len, None)?;
        let location = match opt_c_str(location, "location")? {
            Some(text) => crate::transfer::location::Requested::parse(text)?,
            None => crate::transfer::location::Requested::Detect,
        };
        h.engine.register_batch_at(&[r], location)
    })
}

/// Withdraw the region that starts at `addr`. Returns once no inbound
/// request touches it any more (an inbound transfer into it is cut off).
/// `PDX_ERR_NOT_FOUND` if no region starts there.
#[no_mangle]
pub extern "C" fn pdx_unregister_memory(engine: *mut pdx_engine, addr: *mut c_void) -> pdx_status {
    guard("pdx_unregister_memory", || {
        let h = ENGINES.get(engine)?;
        let (a, _) = region(addr, 0, None)?;
        h.engine.unregister_batch(&[a])
    })
}

/// Register `n` regions (`addrs[i]`, `lens[i]`), all or none.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `addrs` is NULL (with `n` 0) or points to
/// `n` readable elements; `lens` is NULL (with `n` 0) or points to `n` readable elements. Handles
/// are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_register_memory(
    engine: *mut pdx_engine,
    addrs: *const *mut c_void,
    lens: *const usize,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_register_memory", || {
        let h = ENGINES.get(engine)?;
        let addrs = c_slice(addrs, n, "addrs")?;
        let lens = c_slice(lens, n, "lens")?;
        let regions = addrs
            .iter()
            .zip(lens)
            .enumerate()
            .map(|(i, (&a, &l))| region(a, l, Some(i)))
            .collect::<Result<Vec<_>>>()?;
        h.engine.register_batch(&regions)
    })
}

/// Unregister `n` regions by start address, all or none.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `addrs` is NULL (with `n` 0) or points to
/// `n` readable elements. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_unregister_memory(
    engine: *mut pdx_engine,
    addrs: *const *mut c_void,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_unregister_memory", || {
        let h = ENGINES.get(engine)?;
        let addrs = c_slice(addrs, n, "addrs")?;
        let starts =
            addrs.iter().enumerate().map(|(i, &a)| region(a, 0, Some(i)).map(|r| r.0)).collect::<Result<Vec<_>>>()?;
        h.engine.unregister_batch(&starts)
    })
}

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
/// none). Local memory must stay valid until the batch is finished. Poll
/// with `pdx_batch_status` / `pdx_task_status`, wait with `pdx_batch_wait`,
/// release with `pdx_batch_free`.
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
        let notify = match (opt_c_str(notify_name, "notify_name")?, opt_c_str(notify_msg, "notify_msg")?) {
            (Some(n), Some(m)) => Some((n.to_owned(), m.to_owned())),
            (None, None) => None,
            _ => return Err(Error::invalid_argument("notify_name and notify_msg must both be NULL or both be set")),
        };
        let id = h.engine.submit(session, dir, requests(&h, locals, remotes, lens, n)?, notify)?;
        *out = id;
        Ok(())
    })
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
        let t = ENGINES.get(engine)?.engine.task_summary(batch, task)?;
        if let Some(p) = state {
            *p = task_state(t.state);
        }
        if let Some(p) = bytes {
            *p = t.bytes;
        }
        if let Some(p) = error {
            *p = t.error.map_or(PDX_OK, |e| status_of(e.kind()));
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
/// is terminal, with the batch state (`PDX_TASK_COMPLETED` or
/// `PDX_TASK_FAILED`) in `*out_state` (may be NULL); `PDX_ERR_TIMEOUT` while
/// tasks are still in flight. Every task reaches a terminal state within the
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
/// tasks are in flight (nothing is freed then).
#[no_mangle]
pub extern "C" fn pdx_batch_free(engine: *mut pdx_engine, batch: u64) -> pdx_status {
    guard("pdx_batch_free", || ENGINES.get(engine)?.engine.batch_free(batch))
}

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

/// Send the notification (`name`, `msg`) to `session`, as Mooncake's notify.
/// `PDX_ERR_NOTIFY_REJECTED` if the peer refused it.
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
        h.engine.notify(c_str(session, "session")?, c_str(name, "name")?, c_str(msg, "msg")?)
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
        // A JSON string may carry `\u0000`; C strings cannot, so it is shown
        // escaped rather than dropping the notification.
        let list = h
            .engine
            .drain_notifications()
            .into_iter()
            .map(|(n, m)| {
                let c = |s: String| CString::new(s.replace('\0', "\\u0000")).unwrap_or_default();
                (c(n), c(m))
            })
            .collect();
        *out = NOTIFICATIONS.insert(list)?;
        Ok(())
    })
}

/// Number of notifications in the list; 0 for NULL or an invalid list.
#[no_mangle]
pub extern "C" fn pdx_notifications_count(list: *const pdx_notifications) -> usize {
    guard_or("pdx_notifications_count", 0, || Ok(NOTIFICATIONS.get(list)?.len()))
}

/// Entry `i` of the list: `*name` and `*msg` point to strings owned by the
/// list, valid until `pdx_notifications_free`. Either out-param may be NULL.
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
        let (n, m) = l.get(i).ok_or_else(|| {
            Error::new(
                ErrorKind::IndexOutOfRange,
                format!("notification index {i} out of range (list has {})", l.len()),
            )
        })?;
        if let Some(p) = name {
            *p = n.as_ptr();
        }
        if let Some(p) = msg {
            *p = m.as_ptr();
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_states_are_distinct_abi_integers() {
        let all = [TaskState::Pending, TaskState::Completed, TaskState::Failed].map(task_state);
        assert_eq!(all, [PDX_TASK_PENDING, PDX_TASK_COMPLETED, PDX_TASK_FAILED]);
        assert_eq!(all, [0, 1, 2], "the values are part of the ABI");
    }
}
