//! Starting and stopping an engine (`pdx_engine_init`, `pdx_engine_init_with`,
//! `pdx_engine_free`), and what a started engine is: its session id,
//! handshake port, device, protocol and why that transport was chosen.
//! (Counters and metrics are `ffi::stats` and `ffi::metrics`.)

use std::ffi::c_char;

use super::{pdx_engine, EngineHandle, ENGINES};
use crate::error::Result;
use crate::ffi::args::to_cstring;
use crate::ffi::boundary::{c_str, guard, guard_or, opt_c_str, out_ptr};
use crate::ffi::engine_options::{options_of, pdx_engine_options};
use crate::ffi::status::pdx_status;

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
