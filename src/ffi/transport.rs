//! C ABI for transport resolution (`pdx_transport_choice`) and session ids.
//!
//! A choice is immutable once made; its strings are owned by it and stay
//! valid until it is freed. It may be read from several threads at once.

use std::ffi::{c_char, CString};

use super::args::to_cstring;
use super::boundary::{
    c_str, guard, guard_or, handle_tag, index_out_of_range, opt_c_str, out_ptr, text_out, HandleTable,
};
use super::engine_options::{options_of, pdx_engine_options};
use super::status::pdx_status;
use crate::config::env::ProcessEnv;
use crate::config::transport::{resolve_transport_from_process_env, TransportChoice};
use crate::error::{Error, Result};

/// Opaque result of `pdx_resolve_transport`; released by
/// `pdx_transport_choice_free`.
#[allow(non_camel_case_types)]
pub struct pdx_transport_choice {
    _private: [u8; 0],
}

struct ChoiceC {
    protocol: CString,
    hostname: CString,
    device: CString,
    reason: CString,
    warnings: Vec<CString>,
}

static CHOICES: HandleTable<ChoiceC> = HandleTable::new("pdx_transport_choice handle", handle_tag::TRANSPORT_CHOICE);

/// Decide which Mooncake protocol, hostname and device an engine on
/// `hostname` should use, reading the process environment.
///
/// - Protocol: `protocol` when not NULL, else `"ascend"` when
///   `ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE` is true, else `MOONCAKE_PROTOCOL`
///   (default `"rdma"`). Known: rdma, efa, tcp, ascend, nvlink, nvlink_intra,
///   nvmeof, cxl, barex, hip.
/// - `MC_FORCE_TCP` present (any value) forces `"tcp"` with device `""` and
///   the plain hostname, as Mooncake does; a false-looking value (`0`,
///   `false`, empty) adds a warning.
/// - Device: `device` (NULL = none) resolved for `gpu_id` like SGLang's
///   `get_ib_devices_for_gpu` (comma list, inline JSON mapping, or `.json`
///   file); `""` when none.
/// - Ascend: hostname becomes `host:{free_port}:npu_{ASCEND_NPU_PHY_ID, or
///   gpu_id when that is -1}`.
///
/// A negative `gpu_id` means "not given" and counts as 0. The reason says
/// the protocol's source, then the device's: the rule (SGLang's shared
/// engine), the `gpu_id`, and which entry of a per-GPU mapping (inline or
/// which file) was used.
///
/// On success `*out` receives a new object owned by the caller (free with
/// `pdx_transport_choice_free`). Errors (`*out` untouched):
/// `PDX_ERR_NULL_ARGUMENT` (hostname or out NULL), `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_UNKNOWN_PROTOCOL` (the message lists the known ones), the IB
/// configuration errors (`PDX_ERR_VALUE_ERROR`, `PDX_ERR_RUNTIME`), and
/// `PDX_ERR_IO` when no free port is found for Ascend.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `hostname` is NULL or a NUL-terminated
/// string; `protocol` is NULL or a NUL-terminated string; `device` is NULL or a NUL-terminated
/// string; `out` is NULL or valid for writing one pointer. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_resolve_transport(
    hostname: *const c_char,
    protocol: *const c_char,
    device: *const c_char,
    gpu_id: i32,
    out: *mut *mut pdx_transport_choice,
) -> pdx_status {
    guard("pdx_resolve_transport", || {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (hostname, protocol, device) =
            unsafe { (c_str(hostname, "hostname")?, opt_c_str(protocol, "protocol")?, opt_c_str(device, "device")?) };
        let choice = resolve_transport_from_process_env(hostname, protocol, device, gpu_id)?;
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { deliver(&choice, out) }
    })
}

/// # Safety
/// `out` is non-NULL, aligned and writable.
unsafe fn deliver(choice: &TransportChoice, out: *mut *mut pdx_transport_choice) -> Result<()> {
    let c = ChoiceC {
        protocol: to_cstring(&choice.protocol, "protocol")?,
        hostname: to_cstring(&choice.hostname, "hostname")?,
        device: to_cstring(&choice.device, "device")?,
        reason: to_cstring(&choice.reason, "reason")?,
        warnings: choice.warnings.iter().map(|w| to_cstring(w, "warning")).collect::<Result<_>>()?,
    };
    let handle = CHOICES.insert(c)?;
    // SAFETY: the caller guarantees `out`.
    unsafe { *out = handle };
    Ok(())
}

/// The transport `pdx_engine_init_with` would choose with `options` (NULL:
/// none), without starting an engine: `gpu_id` picks the mapping entry,
/// `device_source` the rule (`remote_instance`: `device`, else
/// `MOONCAKE_DEVICE`, verbatim), and `ascend_npu_phy_id` takes its
/// variable's place. The reason names the rule, the `gpu_id` and the entry.
///
/// Errors as `pdx_resolve_transport`, plus `PDX_ERR_INVALID_HANDLE` for a
/// stale `options`; `*out` untouched on error.
///
/// # Safety
/// As `pdx_resolve_transport`; `options` is NULL or a handle (checked by pdx).
#[no_mangle]
pub unsafe extern "C" fn pdx_resolve_transport_with(
    hostname: *const c_char,
    protocol: *const c_char,
    device: *const c_char,
    options: *const pdx_engine_options,
    out: *mut *mut pdx_transport_choice,
) -> pdx_status {
    guard("pdx_resolve_transport_with", || {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (hostname, protocol, device) =
            unsafe { (c_str(hostname, "hostname")?, opt_c_str(protocol, "protocol")?, opt_c_str(device, "device")?) };
        let options = options_of(options)?;
        let choice = crate::backend::choose(&ProcessEnv, hostname, protocol, device, &options)?;
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { deliver(&choice, out) }
    })
}

fn choice_str(function: &str, choice: *const pdx_transport_choice, pick: fn(&ChoiceC) -> &CString) -> *const c_char {
    guard_or(function, std::ptr::null(), || Ok(pick(&*CHOICES.get(choice)?).as_ptr()))
}

/// The protocol to initialize with (`"rdma"`, `"tcp"`, `"ascend"`, ...).
/// Owned by `choice`; NULL for NULL or a stale handle (error recorded).
#[no_mangle]
pub extern "C" fn pdx_transport_choice_protocol(choice: *const pdx_transport_choice) -> *const c_char {
    choice_str("pdx_transport_choice_protocol", choice, |c| &c.protocol)
}

/// The hostname to initialize with (Ascend: with `:port:npu_N`; the session
/// id still uses the plain host). Owned by `choice`; NULL on a bad handle.
#[no_mangle]
pub extern "C" fn pdx_transport_choice_hostname(choice: *const pdx_transport_choice) -> *const c_char {
    choice_str("pdx_transport_choice_hostname", choice, |c| &c.hostname)
}

/// The device filter (`""` = auto discovery, or TCP forced). Owned by
/// `choice`; NULL on a bad handle.
#[no_mangle]
pub extern "C" fn pdx_transport_choice_device(choice: *const pdx_transport_choice) -> *const c_char {
    choice_str("pdx_transport_choice_device", choice, |c| &c.device)
}

/// One sentence saying why this protocol was chosen. Owned by `choice`;
/// NULL on a bad handle.
#[no_mangle]
pub extern "C" fn pdx_transport_choice_reason(choice: *const pdx_transport_choice) -> *const c_char {
    choice_str("pdx_transport_choice_reason", choice, |c| &c.reason)
}

/// Number of warnings about the environment (0 on a bad handle).
#[no_mangle]
pub extern "C" fn pdx_transport_choice_warning_count(choice: *const pdx_transport_choice) -> usize {
    guard_or("pdx_transport_choice_warning_count", 0, || Ok(CHOICES.get(choice)?.warnings.len()))
}

/// Warning `i`, owned by `choice`. NULL on a bad handle or when `i` is out
/// of range (`PDX_ERR_INDEX_OUT_OF_RANGE` recorded).
#[no_mangle]
pub extern "C" fn pdx_transport_choice_warning(choice: *const pdx_transport_choice, i: usize) -> *const c_char {
    guard_or("pdx_transport_choice_warning", std::ptr::null(), || {
        let c = CHOICES.get(choice)?;
        c.warnings.get(i).map(|w| w.as_ptr()).ok_or_else(|| index_out_of_range(i, c.warnings.len()))
    })
}

/// Release a transport choice and its strings. NULL and stale pointers are
/// ignored.
#[no_mangle]
pub extern "C" fn pdx_transport_choice_free(choice: *mut pdx_transport_choice) {
    guard_or("pdx_transport_choice_free", (), || {
        CHOICES.remove(choice);
        Ok(())
    })
}

/// The session id of an engine listening on `port` at `host`: `"host:port"`,
/// with an IPv6 literal bracketed (`"[::1]:15000"`; input brackets are
/// stripped first), as Mooncake names segments and SGLang passes them.
/// Copied into `buf` (`buf_len` bytes, NUL-terminated, truncated to fit);
/// the full length without the NUL goes to `*out_len` (may be NULL). `buf`
/// may be NULL when `buf_len` is 0, to ask for the length.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_INVALID_ARGUMENT` (empty host). Nothing is written on error.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `host` is NULL or a NUL-terminated string;
/// `buf` is NULL (with `buf_len` 0) or writable for `buf_len` bytes; `out_len` is NULL or valid for
/// writing one `usize`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_session_id(
    host: *const c_char,
    port: u16,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_session_id", || {
        let out = text_out(buf, buf_len, out_len)?;
        let host = c_str(host, "host")?;
        if crate::config::net::strip_brackets(host).is_empty() {
            return Err(Error::invalid_argument("host is empty"));
        }
        out.write(&crate::config::net::session_id(host, port));
        Ok(())
    })
}
