//! C ABI for engine options (`pdx_engine_options`): what one engine of a
//! multi-GPU host is started with (`pdx_engine_init_with`).
//!
//! ```c
//! pdx_engine_options *o;
//! pdx_engine_options_new(&o);
//! pdx_engine_options_set(o, "gpu_id", "3");
//! pdx_engine_options_set(o, "tcp_lanes", "8");
//! pdx_engine *e;
//! if (pdx_engine_init_with(host, NULL, "{\"0\": \"mlx5_0\", \"3\": \"mlx5_3\"}", o, &e) != PDX_OK)
//!     die(pdx_last_error_message());
//! pdx_engine_options_free(o);   /* the engine keeps what it needs */
//! ```
//!
//! An options object may be used from several threads; calls on one object
//! are serialized by an internal lock.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Arc;

use parking_lot::Mutex;

use super::args::to_cstring;
use super::boundary::{c_str, guard, guard_or, handle_tag, opt_c_str, out_ptr, HandleTable};
use super::status::pdx_status;
use crate::config::engine_options::EngineOptions;
use crate::error::Result;

/// Opaque set of engine options. Made by `pdx_engine_options_new`, released
/// by `pdx_engine_options_free`.
#[allow(non_camel_case_types)]
pub struct pdx_engine_options {
    _private: [u8; 0],
}

struct OptionsState {
    options: EngineOptions,
    /// Strings handed out by `pdx_engine_options_get`, by key; cleared by
    /// every `pdx_engine_options_set`, which is what ends their validity.
    got: HashMap<String, Option<CString>>,
}

static OPTIONS: HandleTable<Mutex<OptionsState>> =
    HandleTable::new("pdx_engine_options handle", handle_tag::ENGINE_OPTIONS);

/// The options behind `ptr` (NULL: none, every default), copied.
pub(crate) fn options_of(ptr: *const pdx_engine_options) -> Result<EngineOptions> {
    if ptr.is_null() {
        return Ok(EngineOptions::new());
    }
    let handle: Arc<Mutex<OptionsState>> = OPTIONS.get(ptr)?;
    let options = handle.lock().options.clone();
    Ok(options)
}

/// Create an empty options object (every option at its default: the
/// environment's value or pdx's default).
///
/// On success `*out` receives a new object owned by the caller, released
/// with `pdx_engine_options_free`. Errors: `PDX_ERR_NULL_ARGUMENT` when
/// `out` is NULL (nothing is allocated).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_options_new(out: *mut *mut pdx_engine_options) -> pdx_status {
    guard("pdx_engine_options_new", || {
        let out = out_ptr(out, "out")?;
        let handle = OPTIONS.insert(Mutex::new(OptionsState { options: EngineOptions::new(), got: HashMap::new() }))?;
        // SAFETY: `out` is non-NULL and aligned (checked above); the caller
        // promises it points to writable storage for one pointer.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Release an options object and every string it handed out. Engines
/// started with it are not affected. NULL and pointers that are not live
/// options objects are ignored.
#[no_mangle]
pub extern "C" fn pdx_engine_options_free(options: *mut pdx_engine_options) {
    guard_or("pdx_engine_options_free", (), || {
        OPTIONS.remove(options);
        Ok(())
    })
}

/// Set one option from text; a NULL `value` unsets it (back to the
/// environment or the default).
///
/// Keys (see the README's table): `gpu_id` (`0`..`2147483647`),
/// `device_source` (`shared`, `remote_instance`), and one key per setting
/// the engine reads at start, named after its variable (`tcp_lanes` for
/// `PDX_TCP_LANES`, `transfer_timeout` for `MC_TRANSFER_TIMEOUT`, ...); such
/// an option takes its variable's place and wins over it, and takes exactly
/// the texts its variable takes (integers in decimal with an optional sign,
/// seconds in decimal notation without an exponent, surrounding whitespace
/// ignored), within the range the README's table gives; values below the
/// minimum of `cuda_staging_bytes` are raised to it when the engine starts,
/// with a warning, as for `PDX_CUDA_STAGING_BYTES`.
///
/// Errors (the object is unchanged): `PDX_ERR_NULL_ARGUMENT` (options or
/// key NULL), `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_UNKNOWN_KEY` (the message lists the keys),
/// `PDX_ERR_INVALID_VALUE` (the message names the key and its allowed
/// values). On success, strings returned by `pdx_engine_options_get` for
/// this object become invalid.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `key` is NULL or a NUL-terminated string;
/// `value` is NULL or a NUL-terminated string. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_options_set(
    options: *mut pdx_engine_options,
    key: *const c_char,
    value: *const c_char,
) -> pdx_status {
    guard("pdx_engine_options_set", || {
        let handle = OPTIONS.get(options)?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let key = unsafe { c_str(key, "key")? };
        // SAFETY: as for `key`.
        let value = unsafe { opt_c_str(value, "value")? };
        let mut state = handle.lock();
        state.options.set(key, value)?;
        state.got.clear();
        Ok(())
    })
}

/// Read one option as text (same keys as `pdx_engine_options_set`).
///
/// On success `*out` is NULL when the option is not set, else the value as
/// stored: in its normal spelling, which the engine reads as the same value
/// (`" +05 "` is kept as `"5"`, `"7.50"` as `"7.5"`), owned by `options` and
/// valid until the next successful
/// `pdx_engine_options_set` on it or `pdx_engine_options_free`.
///
/// Errors (`*out` untouched): `PDX_ERR_NULL_ARGUMENT`,
/// `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INVALID_UTF8`, `PDX_ERR_UNKNOWN_KEY`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `key` is NULL or a NUL-terminated string;
/// `out` is NULL or valid for writing one pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_options_get(
    options: *const pdx_engine_options,
    key: *const c_char,
    out: *mut *const c_char,
) -> pdx_status {
    guard("pdx_engine_options_get", || {
        let out = out_ptr(out, "out")?;
        let handle = OPTIONS.get(options)?;
        // SAFETY: the caller passes a NUL-terminated string or NULL.
        let key = unsafe { c_str(key, "key")? };
        let mut state = handle.lock();
        let value = state.options.get(key)?.map(str::to_owned);
        let ptr = match state.got.get(key) {
            Some(cached) => cached.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            None => {
                let c = value.as_deref().map(|v| to_cstring(v, key)).transpose()?;
                let ptr = c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                state.got.insert(key.to_owned(), c);
                ptr
            }
        };
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { *out = ptr };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use super::*;
    use crate::ffi::status::*;

    fn get(o: *const pdx_engine_options, key: &std::ffi::CStr) -> (pdx_status, Option<String>) {
        let mut out: *const c_char = c"untouched".as_ptr();
        // SAFETY: valid strings and out-param.
        let rc = unsafe { pdx_engine_options_get(o, key.as_ptr(), &mut out) };
        // SAFETY: pdx returns NULL or a live NUL-terminated string.
        let text = (!out.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(out) }.to_string_lossy().into_owned());
        (rc, text)
    }

    #[test]
    fn set_get_unset_and_errors() {
        let mut o: *mut pdx_engine_options = ptr::null_mut();
        // SAFETY: valid out-param and strings throughout.
        unsafe {
            assert_eq!(pdx_engine_options_new(&mut o), PDX_OK);
            assert_eq!(get(o, c"gpu_id"), (PDX_OK, None));
            assert_eq!(pdx_engine_options_set(o, c"gpu_id".as_ptr(), c" 5".as_ptr()), PDX_OK);
            assert_eq!(get(o, c"gpu_id"), (PDX_OK, Some("5".to_owned())));
            assert_eq!(pdx_engine_options_set(o, c"gpu_id".as_ptr(), c"x".as_ptr()), PDX_ERR_INVALID_VALUE);
            assert_eq!(pdx_engine_options_set(o, c"nope".as_ptr(), c"1".as_ptr()), PDX_ERR_UNKNOWN_KEY);
            assert_eq!(get(o, c"nope"), (PDX_ERR_UNKNOWN_KEY, Some("untouched".to_owned())));
            assert_eq!(get(o, c"gpu_id"), (PDX_OK, Some("5".to_owned())), "failed sets change nothing");
            assert_eq!(pdx_engine_options_set(o, c"gpu_id".as_ptr(), ptr::null()), PDX_OK);
            assert_eq!(get(o, c"gpu_id"), (PDX_OK, None));
            assert_eq!(pdx_engine_options_set(o, ptr::null(), c"1".as_ptr()), PDX_ERR_NULL_ARGUMENT);
            assert_eq!(pdx_engine_options_get(o, c"gpu_id".as_ptr(), ptr::null_mut()), PDX_ERR_NULL_ARGUMENT);
            assert_eq!(options_of(ptr::null()).unwrap(), EngineOptions::new());
            pdx_engine_options_free(o);
            assert_eq!(pdx_engine_options_set(o, c"gpu_id".as_ptr(), c"1".as_ptr()), PDX_ERR_INVALID_HANDLE);
            assert_eq!(options_of(o).unwrap_err().kind(), crate::ErrorKind::InvalidHandle);
            pdx_engine_options_free(o);
        }
    }
}
