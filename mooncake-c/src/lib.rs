//! Mooncake's C API (`transfer_engine_c.h`) served by pdx: this crate builds
//! `libtransfer_engine.so`, which a program written against Mooncake's C API
//! (NIXL's Mooncake backend plugin, Mooncake's Rust and Go bindings) links
//! or loads unchanged, and which runs pdx's native TCP engine underneath.
//!
//! Like pdx's own `ffi`, this layer only checks, converts and guards:
//! every export runs behind a panic boundary ([`boundary::guard`]), checks
//! its pointers, turns pdx's errors into Mooncake's return conventions
//! ([`codes`]), logs each failure and leaves its reason in pdx's last error
//! (`pdx_last_error_message`, exported here too). Mooncake's state above
//! its transports (segment ids, task ids across submits, registrations,
//! received notifications) lives in [`engine`], [`batches`] and
//! [`memory`]; everything
//! that moves bytes is pdx's backend, reached through
//! `pdx::transfer::TransferBackend`. pdx itself knows nothing of these types.
//!
//! The header is `include/transfer_engine_c.h` (pdx's own words, Mooncake's
//! layouts); `docs/mooncake-c-api.md` says what is served and what is not.

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![allow(non_snake_case)]

pub mod batches;
pub mod boundary;
pub mod codes;
pub mod engine;
pub mod memory;
pub mod transport;
pub mod types;

use std::ffi::{c_char, c_int, c_void};

use boundary::{c_bytes, c_slice, c_str, guard, insert_engine, live, remove_engine};
use codes::{Family, McError, McResult};
use engine::McEngine;
use pdx::transfer::{Notification, TaskState};
use types::*;

/// `transfer_engine_t`.
pub type Engine = *mut c_void;

/// The value a negative-family call returns for `e`.
fn neg(e: &McError) -> c_int {
    e.value(Family::Negative)
}

/// The value a status-family call returns for `e`.
fn pos(e: &McError) -> c_int {
    e.value(Family::Status)
}

/// `snprintf(buf, len, "%s", text)`: as much of `text` as fits, always
/// NUL-terminated when `len > 0`.
///
/// # Safety
/// `buf` is writable for `len` bytes (checked non-NULL when `len > 0`).
unsafe fn write_text(buf: *mut c_char, len: usize, text: &str) -> McResult<()> {
    if len == 0 {
        return Ok(());
    }
    if buf.is_null() {
        return Err(McError::invalid(format!("buf_out is NULL but buf_len is {len}")));
    }
    let n = text.len().min(len - 1);
    // SAFETY: `buf` is writable for `len > n` bytes by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

// ------------------------------------------------------------------ engine

/// Create an engine. `metadata_conn_string` is `P2PHANDSHAKE`, Mooncake's
/// HTTP metadata server (`http://host:port/metadata`) or etcd
/// (`etcd://h:p`); the engine runs on the host of `local_server_name` (else
/// `ip_or_host_name`), its ports picked as Mooncake picks them. With
/// `auto_discover` non-zero the transport is installed now (`tcp` unless an
/// RDMA device and Mooncake's library are both there and `MC_FORCE_TCP` is
/// unset). NULL on failure (see `pdx_last_error_message`).
///
/// # Safety
/// Each string is NULL or NUL-terminated, read during the call only.
#[no_mangle]
pub unsafe extern "C" fn createTransferEngine(
    metadata_conn_string: *const c_char,
    local_server_name: *const c_char,
    ip_or_host_name: *const c_char,
    rpc_port: u64,
    auto_discover: c_int,
) -> Engine {
    guard(
        "createTransferEngine",
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the caller's contract.
            let (metadata, name) = unsafe {
                (c_str(metadata_conn_string, "metadata_conn_string")?, c_str(local_server_name, "local_server_name")?)
            };
            let ip = if ip_or_host_name.is_null() {
                ""
            } else {
                // SAFETY: the caller's contract.
                unsafe { c_str(ip_or_host_name, "ip_or_host_name")? }
            };
            insert_engine(McEngine::create(metadata, name, ip, rpc_port, auto_discover != 0)?)
        },
    )
}

/// Destroy an engine: its transport stops (after in-flight batches finish,
/// when `enableGracefulShutdown` was called). NULL or an unknown engine is
/// ignored.
#[no_mangle]
pub extern "C" fn destroyTransferEngine(engine: Engine) {
    guard(
        "destroyTransferEngine",
        |_| (),
        || {
            if let Some(e) = remove_engine(engine) {
                e.shutdown();
            }
            Ok(())
        },
    )
}

/// Topology discovery: nothing to discover for pdx's TCP engine; 0 for a
/// live engine.
#[no_mangle]
pub extern "C" fn discoverTopology(engine: Engine) -> c_int {
    guard("discoverTopology", neg, || live(engine).map(|_| 0))
}

/// Write `"ip:rpc_port"`, the name peers open this engine's segment by,
/// into `buf_out` as `snprintf` would; 0.
///
/// # Safety
/// `buf_out` is writable for `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn getLocalIpAndPort(engine: Engine, buf_out: *mut c_char, buf_len: usize) -> c_int {
    guard("getLocalIpAndPort", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        unsafe { write_text(buf_out, buf_len, &e.local_name())? };
        Ok(0)
    })
}

/// Install the transport `proto`: `"tcp"` is pdx's native engine; other
/// protocols run on Mooncake's own library named by `PDX_MOONCAKE_LIB` (a
/// path), or fail saying so. `args` is not used. An opaque non-NULL value
/// on success (nothing takes it back), NULL on failure.
///
/// # Safety
/// `proto` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn installTransport(engine: Engine, proto: *const c_char, args: *mut *mut c_void) -> *mut c_void {
    let _ = args;
    guard(
        "installTransport",
        |_| std::ptr::null_mut(),
        || {
            let e = live(engine)?;
            // SAFETY: the caller's contract.
            let proto = unsafe { c_str(proto, "proto")? };
            e.install(proto)?;
            Ok((engine as usize | 0x100) as *mut c_void)
        },
    )
}

/// Stop the transport `proto`; 0.
///
/// # Safety
/// `proto` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn uninstallTransport(engine: Engine, proto: *const c_char) -> c_int {
    guard("uninstallTransport", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        e.uninstall(unsafe { c_str(proto, "proto")? })?;
        Ok(0)
    })
}

// ---------------------------------------------------------------- segments

/// The id of the peer segment `segment_name` (`"host:rpc_port"`), reached
/// once and then cached (0 for this engine's own name); negative on failure.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn openSegment(engine: Engine, segment_name: *const c_char) -> SegmentId {
    guard("openSegment", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        e.open_segment(unsafe { c_str(segment_name, "segment_name")? }, false)
    })
}

/// `openSegment`, reaching the peer again even when the segment is open.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn openSegmentNoCache(engine: Engine, segment_name: *const c_char) -> SegmentId {
    guard("openSegmentNoCache", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        e.open_segment(unsafe { c_str(segment_name, "segment_name")? }, true)
    })
}

/// Forget an open segment; its id is unknown afterwards. 0.
#[no_mangle]
pub extern "C" fn closeSegment(engine: Engine, segment_id: SegmentId) -> c_int {
    guard("closeSegment", neg, || {
        live(engine)?.close_segment(segment_id)?;
        Ok(0)
    })
}

/// EFA pre-connection: pdx has no EFA transport, so there is nothing to
/// warm up; 0 for a live engine.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn warmupEfaSegment(engine: Engine, segment_name: *const c_char) -> c_int {
    let _ = segment_name;
    guard("warmupEfaSegment", neg, || live(engine).map(|_| 0))
}

/// Mooncake withdraws its own segment's metadata here. pdx keeps serving
/// its descriptor until the engine is destroyed (P2P mode has nothing
/// published elsewhere; in HTTP and etcd modes destroy withdraws it). 0.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn removeLocalSegment(engine: Engine, segment_name: *const c_char) -> c_int {
    guard("removeLocalSegment", neg, || {
        live(engine)?;
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(segment_name, "segment_name")? };
        log::info!("removeLocalSegment({name:?}): the descriptor is withdrawn when the engine is destroyed");
        Ok(0)
    })
}

/// Reach every open segment again; 0, or the first failure.
#[no_mangle]
pub extern "C" fn syncSegmentCache(engine: Engine) -> c_int {
    guard("syncSegmentCache", neg, || {
        live(engine)?.sync_segments()?;
        Ok(0)
    })
}

// ------------------------------------------------------------------ memory

/// Register `[addr, addr+length)` at `location` (`"*"`: find out,
/// `"cpu:N"`, `"cuda:N"`); peers may then read and write it. 0.
///
/// # Safety
/// `location` is NULL or NUL-terminated; the memory stays valid until unregistered.
#[no_mangle]
pub unsafe extern "C" fn registerLocalMemory(
    engine: Engine,
    addr: *mut c_void,
    length: usize,
    location: *const c_char,
    remote_accessible: c_int,
) -> c_int {
    let _ = remote_accessible;
    guard("registerLocalMemory", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        let location = unsafe { c_str(location, "location")? };
        e.register(&[(addr as u64, length as u64)], location)?;
        Ok(0)
    })
}

/// Unregister the region starting at `addr`; 0.
#[no_mangle]
pub extern "C" fn unregisterLocalMemory(engine: Engine, addr: *mut c_void) -> c_int {
    guard("unregisterLocalMemory", neg, || {
        let e = live(engine)?;
        if addr.is_null() {
            return Err(McError::invalid("addr is NULL"));
        }
        e.unregister(&[addr as u64])?;
        Ok(0)
    })
}

/// Register every buffer of the list (all or none); 0.
///
/// # Safety
/// `buffer_list` holds `buffer_len` entries; `location` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn registerLocalMemoryBatch(
    engine: Engine,
    buffer_list: *mut BufferEntry,
    buffer_len: usize,
    location: *const c_char,
) -> c_int {
    guard("registerLocalMemoryBatch", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        let (list, location) =
            unsafe { (c_slice(buffer_list, buffer_len, "buffer_list")?, c_str(location, "location")?) };
        let regions: Vec<(u64, u64)> = list.iter().map(|b| (b.addr as u64, b.length as u64)).collect();
        e.register(&regions, location)?;
        Ok(0)
    })
}

/// Unregister every region of the list (all or none); 0.
///
/// # Safety
/// `addr_list` holds `addr_len` entries.
#[no_mangle]
pub unsafe extern "C" fn unregisterLocalMemoryBatch(
    engine: Engine,
    addr_list: *mut *mut c_void,
    addr_len: usize,
) -> c_int {
    guard("unregisterLocalMemoryBatch", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        let list = unsafe { c_slice(addr_list, addr_len, "addr_list")? };
        e.unregister(&list.iter().map(|a| *a as u64).collect::<Vec<_>>())?;
        Ok(0)
    })
}

// ----------------------------------------------------------------- batches

/// A batch for up to `batch_size` tasks; `INVALID_BATCH` on failure.
#[no_mangle]
pub extern "C" fn allocateBatchID(engine: Engine, batch_size: usize) -> BatchId {
    guard("allocateBatchID", |_| INVALID_BATCH, || live(engine)?.allocate_batch(batch_size))
}

/// A notification from C: the bytes of each string up to its NUL, UTF-8 or
/// not (NIXL's plugin hands over C strings, so bytes after a NUL never
/// reach pdx).
///
/// # Safety
/// `n`'s strings are NULL or NUL-terminated.
unsafe fn notification(n: &NotifyMsg) -> McResult<Notification> {
    // SAFETY: the caller's contract.
    let (name, msg) = unsafe { (c_bytes(n.name, "notify_msg.name")?, c_bytes(n.msg, "notify_msg.msg")?) };
    Notification::check_size(name.len(), msg.len())?;
    Ok(Notification::new(name, msg))
}

/// # Safety
/// As `submitTransfer`; `notify`'s strings are NUL-terminated.
unsafe fn submit(
    engine: Engine,
    batch_id: BatchId,
    entries: *const TransferRequest,
    count: usize,
    notify: Option<NotifyMsg>,
) -> McResult<c_int> {
    let e = live(engine)?;
    // SAFETY: the caller's contract.
    let reqs = unsafe { c_slice(entries, count, "entries")? };
    // SAFETY: the caller's contract.
    let notify = notify.map(|n| unsafe { notification(&n) }).transpose()?;
    // SAFETY: the caller keeps the local memory valid until the tasks finish.
    unsafe { e.submit(batch_id, reqs, notify)? };
    Ok(0)
}

/// Queue `count` requests on the batch; their task ids follow the tasks
/// already submitted to it. `target_offset` is the peer's address. 0, or a
/// positive Mooncake status code.
///
/// # Safety
/// `entries` holds `count` requests; each `source` stays valid until its task is finished.
#[no_mangle]
pub unsafe extern "C" fn submitTransfer(
    engine: Engine,
    batch_id: BatchId,
    entries: *mut TransferRequest,
    count: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    guard("submitTransfer", pos, || unsafe { submit(engine, batch_id, entries, count, None) })
}

/// `submitTransfer`; once the whole batch has completed, one notification
/// `{name, msg}` reaches the target of the first entry.
///
/// # Safety
/// As `submitTransfer`; `notify_msg`'s strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn submitTransferWithNotify(
    engine: Engine,
    batch_id: BatchId,
    entries: *mut TransferRequest,
    count: usize,
    notify_msg: NotifyMsg,
) -> c_int {
    // SAFETY: the caller's contract.
    guard("submitTransferWithNotify", pos, || unsafe { submit(engine, batch_id, entries, count, Some(notify_msg)) })
}

/// The state of task `task_id`: `STATUS_WAITING` in flight,
/// `STATUS_COMPLETED` confirmed at the target, `STATUS_FAILED`,
/// `STATUS_CANCELED` (cancelled by `freeBatchID` while another thread
/// polls it); `*status` is written only when 0 is returned.
///
/// # Safety
/// `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn getTransferStatus(
    engine: Engine,
    batch_id: BatchId,
    task_id: usize,
    status: *mut TransferStatus,
) -> c_int {
    guard("getTransferStatus", pos, || {
        let e = live(engine)?;
        if status.is_null() || !status.is_aligned() {
            return Err(McError::invalid("status is NULL or misaligned"));
        }
        let (state, bytes) = e.task_status(batch_id, task_id)?;
        let code = match state {
            TaskState::Pending => STATUS_WAITING,
            TaskState::Completed => STATUS_COMPLETED,
            TaskState::Failed => STATUS_FAILED,
            TaskState::Canceled => STATUS_CANCELED,
        };
        // SAFETY: checked non-NULL and aligned; writable by the caller's contract.
        unsafe { *status = TransferStatus { status: code, transferred_bytes: bytes } };
        Ok(0)
    })
}

/// Free a batch. Tasks still in flight are cancelled first: when this
/// returns 0, nothing reads or writes their local memory any more (data a
/// read receives later is dropped). Mooncake instead answers 4 ("batch
/// busy") and keeps the batch, as this does with
/// `PDX_FREE_BATCH_IN_FLIGHT=busy` or when a cancel cannot be made sure of.
#[no_mangle]
pub extern "C" fn freeBatchID(engine: Engine, batch_id: BatchId) -> c_int {
    guard("freeBatchID", pos, || {
        live(engine)?.free_batch(batch_id)?;
        Ok(0)
    })
}

// ----------------------------------------------------------- notifications

/// Every notification received since the last call, oldest first, as a
/// `malloc`ed array of `*size` entries with `malloc`ed strings (release it
/// with `freeNotifsMsgBuf`); NULL when there is none (`*size` 0).
///
/// # Safety
/// `size` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn getNotifsFromEngine(engine: Engine, size: *mut c_int) -> *mut NotifyMsg {
    guard(
        "getNotifsFromEngine",
        |_| std::ptr::null_mut(),
        || {
            if size.is_null() || !size.is_aligned() {
                return Err(McError::invalid("size is NULL or misaligned"));
            }
            // SAFETY: checked; writable by the caller's contract.
            unsafe { *size = 0 };
            let e = live(engine)?;
            let mut notes = e.take_notifications()?;
            if notes.is_empty() {
                return Ok(std::ptr::null_mut());
            }
            let n = notes.len().min(c_int::MAX as usize);
            let rest = notes.split_off(n);
            match malloc_notes(&notes) {
                Some(array) => {
                    e.put_back(rest);
                    // SAFETY: as above.
                    unsafe { *size = n as c_int };
                    Ok(array)
                }
                None => {
                    notes.extend(rest);
                    e.put_back(notes);
                    Err(McError::new(
                        mooncake_sys::Code::Memory,
                        "out of memory for the notifications (kept for the next call)",
                    ))
                }
            }
        },
    )
}

/// `notes` as a `malloc`ed array of `malloc`ed C strings (each cut at its
/// first NUL, as Mooncake's `strcpy` copies; every other byte as it
/// arrived); `None` (nothing left allocated) when memory runs out.
fn malloc_notes(notes: &std::collections::VecDeque<Notification>) -> Option<*mut NotifyMsg> {
    fn c_string(bytes: &[u8]) -> *mut c_char {
        let n = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        // SAFETY: plain allocation of n + 1 bytes.
        let p = unsafe { libc::malloc(n + 1) }.cast::<u8>();
        if !p.is_null() {
            // SAFETY: `p` has room for n + 1 bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, n);
                *p.add(n) = 0;
            }
        }
        p.cast()
    }
    let count = notes.len();
    // SAFETY: plain zeroed allocation of `count` entries.
    let array = unsafe { libc::calloc(count, size_of::<NotifyMsg>()) }.cast::<NotifyMsg>();
    if array.is_null() {
        return None;
    }
    for (i, note) in notes.iter().enumerate() {
        let entry = NotifyMsg { name: c_string(&note.name), msg: c_string(&note.msg) };
        // SAFETY: `i < count`, inside the allocation.
        unsafe { array.add(i).write(entry) };
        if entry.name.is_null() || entry.msg.is_null() {
            // SAFETY: the array and the strings written so far came from malloc/calloc.
            unsafe { free_notes(array, count) };
            return None;
        }
    }
    Some(array)
}

/// # Safety
/// `msgs` is a calloc'ed array of `size` entries whose non-NULL strings were malloc'ed.
unsafe fn free_notes(msgs: *mut NotifyMsg, size: usize) {
    for i in 0..size {
        // SAFETY: `i < size`, inside the array.
        let m = unsafe { msgs.add(i).read() };
        // SAFETY: malloc'ed or NULL (free(NULL) is a no-op).
        unsafe {
            libc::free(m.name.cast());
            libc::free(m.msg.cast());
        }
    }
    // SAFETY: calloc'ed.
    unsafe { libc::free(msgs.cast()) };
}

/// Release what `getNotifsFromEngine` returned (NULL with size 0 is fine); 0.
///
/// # Safety
/// `msg` is NULL or an array `getNotifsFromEngine` returned with `size` entries, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn freeNotifsMsgBuf(msg: *mut NotifyMsg, size: c_int) -> c_int {
    guard("freeNotifsMsgBuf", neg, || {
        let size = usize::try_from(size).map_err(|_| McError::invalid(format!("size {size} is negative")))?;
        if msg.is_null() {
            if size > 0 {
                return Err(McError::invalid(format!("msg is NULL but size is {size}")));
            }
            return Ok(0);
        }
        // SAFETY: the caller's contract.
        unsafe { free_notes(msg, size) };
        Ok(0)
    })
}

/// Send `{name, msg}` to the open segment `target_id` with no transfer; 0.
///
/// # Safety
/// `notify_msg`'s strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn genNotifyInEngine(engine: Engine, target_id: u64, notify_msg: NotifyMsg) -> c_int {
    guard("genNotifyInEngine", neg, || {
        let e = live(engine)?;
        // SAFETY: the caller's contract.
        e.notify(target_id, &unsafe { notification(&notify_msg) }?)?;
        Ok(0)
    })
}

// --------------------------------------------------------------- reporting

/// Copy up to `*count` NIC entries into `stats`, then set `*count` to how
/// many there are: the rails of multi-rail TCP (`PDX_TCP_RAILS`) that are
/// up, with no in-flight figure and no bandwidth estimate; none without
/// rails. -1 for a NULL argument, else 0.
///
/// # Safety
/// `stats` is writable for `*count` entries; `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn getNicLoadStats(engine: Engine, stats: *mut NicLoadStat, count: *mut usize) -> c_int {
    guard(
        "getNicLoadStats",
        |e| if e.code == mooncake_sys::Code::InvalidArgument { -1 } else { pos(e) },
        || {
            if engine.is_null() || stats.is_null() || count.is_null() || !stats.is_aligned() || !count.is_aligned() {
                return Err(McError::invalid("engine, stats or count is NULL or misaligned"));
            }
            let e = live(engine)?;
            let rails = e.nic_rails()?;
            // SAFETY: checked; the caller's contract.
            let room = unsafe { *count };
            for (i, (name, _bytes)) in rails.iter().take(room).enumerate() {
                let mut entry = NicLoadStat { device_name: [0; 64], inflight_bytes: 0, ewma_bandwidth_bps: 0.0 };
                for (d, s) in entry.device_name.iter_mut().zip(name.bytes().take(63)) {
                    *d = s as c_char;
                }
                // SAFETY: `i < *count`, writable by the caller's contract.
                unsafe { stats.add(i).write(entry) };
            }
            // SAFETY: as above.
            unsafe { *count = rails.len() };
            Ok(0)
        },
    )
}

/// Make `destroyTransferEngine` wait (30 s at most) for in-flight batches.
#[no_mangle]
pub extern "C" fn enableGracefulShutdown(engine: Engine) {
    guard(
        "enableGracefulShutdown",
        |_| (),
        || {
            live(engine)?.enable_graceful_shutdown();
            Ok(())
        },
    )
}

/// This engine and its open segments with pdx's figures for each peer, as
/// text or (`json` non-zero) JSON, written as `snprintf` would; -1 for a
/// NULL argument or zero length, else 0.
///
/// # Safety
/// `buf_out` is writable for `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn showLinks(engine: Engine, buf_out: *mut c_char, buf_len: usize, json: c_int) -> c_int {
    guard("showLinks", neg, || {
        if engine.is_null() || buf_out.is_null() || buf_len == 0 {
            return Err(McError::invalid("engine or buf_out is NULL, or buf_len is 0"));
        }
        let text = live(engine)?.links(json != 0)?;
        // SAFETY: the caller's contract.
        unsafe { write_text(buf_out, buf_len, &text)? };
        Ok(0)
    })
}

#[cfg(test)]
mod status_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// What `getNotifsFromEngine` hands out: every byte as it arrived, each
    /// string cut at its first NUL (as Mooncake's `strcpy` cuts it).
    #[test]
    fn notes_are_bytes_cut_at_the_first_nul() {
        let notes: std::collections::VecDeque<Notification> =
            [Notification::new(b"n\xff".to_vec(), b"PUSH_REG:\x8b\xa1\x00after".to_vec()), Notification::new("", "")]
                .into();
        let array = malloc_notes(&notes).unwrap();
        // SAFETY: malloc_notes gave an array of two entries with NUL-terminated strings.
        unsafe {
            let m = std::slice::from_raw_parts(array, 2);
            assert_eq!(std::ffi::CStr::from_ptr(m[0].name).to_bytes(), b"n\xff");
            assert_eq!(std::ffi::CStr::from_ptr(m[0].msg).to_bytes(), b"PUSH_REG:\x8b\xa1");
            assert_eq!(std::ffi::CStr::from_ptr(m[1].msg).to_bytes(), b"");
            free_notes(array, 2);
        }
    }

    /// A C string's bytes, UTF-8 or not, are the notification; NULL is refused.
    #[test]
    fn notifications_from_c_take_any_bytes() {
        let (name, msg) = (c"n\xc3", c"\x80\xff msgpack");
        let n = NotifyMsg { name: name.as_ptr().cast_mut(), msg: msg.as_ptr().cast_mut() };
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let note = unsafe { notification(&n) }.unwrap();
        assert_eq!(note, Notification::new(b"n\xc3".to_vec(), b"\x80\xff msgpack".to_vec()));
        let no_name = NotifyMsg { name: std::ptr::null_mut(), msg: msg.as_ptr().cast_mut() };
        // SAFETY: NULL is refused before any read.
        let e = unsafe { notification(&no_name) }.unwrap_err();
        assert!(e.message.contains("notify_msg.name is NULL"), "{e:?}");
    }
}
