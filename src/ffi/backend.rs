//! Which transfer backends this process can run, and why not.
//!
//! ```c
//! if (!pdx_backend_available("mooncake")) {
//!   char why[512];
//!   pdx_backend_unavailable_reason("mooncake", why, sizeof why, NULL);
//!   fprintf(stderr, "no Mooncake: %s\n", why);
//! }
//! ```

use std::ffi::c_char;

use super::boundary::{c_str, guard, guard_or, text_out};
use super::status::pdx_status;
use crate::backend::unavailable_reason;

/// 1 when the backend `name` can run in this process, else 0.
///
/// Names: `"tcp"` (alias `"native"`): the native TCP engine, always 1.
/// `"mooncake"`: Mooncake's Transfer Engine, 1 when the library that
/// `PDX_MOONCAKE_LIB` names (default `libtransfer_engine.so`) loads and
/// exports its whole C API. Whether that build supports a given protocol
/// shows only when `pdx_engine_init` installs it. Unknown names and NULL
/// give 0. The library is loaded once and stays loaded.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `name` is NULL or a NUL-terminated string.
/// Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_backend_available(name: *const c_char) -> i32 {
    guard_or("pdx_backend_available", 0, || {
        let name = c_str(name, "name")?;
        Ok(i32::from(unavailable_reason(name).is_none()))
    })
}

/// Why the backend `name` is not available: the text is copied into `buf`
/// (`buf_len` bytes, NUL-terminated, truncated if needed) and its full length
/// (without the NUL) into `*out_len` (may be NULL). Empty when the backend is
/// available. `buf` may be NULL when `buf_len` is 0 (to ask for the length).
/// The caller owns `buf`; pdx keeps no pointer to it.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT` (`name` NULL, or `buf` NULL with
/// `buf_len` > 0), `PDX_ERR_INVALID_UTF8`. Nothing is written on error.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `name` is NULL or a NUL-terminated string;
/// `buf` is NULL (with `buf_len` 0) or writable for `buf_len` bytes; `out_len` is NULL or valid for
/// writing one `usize`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_backend_unavailable_reason(
    name: *const c_char,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_backend_unavailable_reason", || {
        let out = text_out(buf, buf_len, out_len)?;
        let name = c_str(name, "name")?;
        out.write(&unavailable_reason(name).unwrap_or_default().replace('\0', "\\0"));
        Ok(())
    })
}

/// What this build and this machine can serve, as one JSON object:
/// `{"version", "backends": [{"name", "aliases", "engine", "available",
/// "reason", "library", "protocols"}], "memory": [{"kind", "available",
/// "reason"?}]}` (the native `tcp` engine, Mooncake's engine and whether its
/// library loads; `reason` and `library` are null when they do not apply;
/// host memory and whether device memory can be staged). The backends are
/// the ones `pdx_backend_available` knows, in the same order. Fields are
/// only ever added. Copied into `buf` (`buf_len` bytes, NUL-terminated,
/// truncated if needed); the full length without the NUL goes to
/// `*out_len` (may be NULL); `buf` may be NULL with `buf_len` 0 to ask for
/// the length. Probes run on every call.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT` (`buf` NULL with `buf_len` > 0).
///
/// # Safety
/// `buf` is NULL (with `buf_len` 0) or writable for `buf_len` bytes;
/// `out_len` is NULL or valid for writing one `usize`.
#[no_mangle]
pub unsafe extern "C" fn pdx_capabilities(buf: *mut c_char, buf_len: usize, out_len: *mut usize) -> pdx_status {
    guard("pdx_capabilities", || {
        let out = text_out(buf, buf_len, out_len)?;
        // SAFETY: checked shape; the caller provides `buf_len` writable bytes.
        unsafe { out.write(&crate::backend::capabilities().to_string()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::status::*;
    use std::ffi::CString;

    #[test]
    fn tcp_is_always_available_and_unknown_names_are_not() {
        let tcp = CString::new("tcp").unwrap();
        let bogus = CString::new("infiniband").unwrap();
        // SAFETY: the strings are live CStrings or NULL; `len` is a live local.
        unsafe {
            assert_eq!(pdx_backend_available(tcp.as_ptr()), 1);
            assert_eq!(pdx_backend_available(bogus.as_ptr()), 0);
            assert_eq!(pdx_backend_available(std::ptr::null()), 0);
            let mut len = 99usize;
            assert_eq!(pdx_backend_unavailable_reason(tcp.as_ptr(), std::ptr::null_mut(), 0, &mut len), PDX_OK);
            assert_eq!(len, 0);
            let mut buf = [0 as c_char; 8];
            assert_eq!(pdx_backend_unavailable_reason(bogus.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut len), PDX_OK);
            assert!(len > 8);
            assert_eq!(std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "no back");
            assert_eq!(
                pdx_backend_unavailable_reason(bogus.as_ptr(), std::ptr::null_mut(), 4, &mut len),
                PDX_ERR_NULL_ARGUMENT
            );
            assert_eq!(
                pdx_backend_unavailable_reason(std::ptr::null(), buf.as_mut_ptr(), 8, &mut len),
                PDX_ERR_NULL_ARGUMENT
            );
        }
    }
}
