//! C ABI for routing pdx's log records into the host's logger.
//!
//! ```c
//! static void on_log(void *ud, int32_t level, const char *module, size_t module_len,
//!                    const char *msg, size_t msg_len) {
//!   host_log(ud, level, "%.*s: %.*s", (int)module_len, module, (int)msg_len, msg);
//! }
//! pdx_set_log_callback(on_log, my_logger, PDX_LOG_INFO);   /* info and above */
//! pdx_set_log_callback(NULL, NULL, 0);                     /* back to stderr */
//! ```

use std::ffi::{c_char, c_void};

use super::boundary::guard;
use super::status::pdx_status;

// Literal values so cbindgen can write them; a test ties them to the logger.
// PDX_LOG_INFO (20) and PDX_LOG_WARNING (30) complete the scale.
/// Log level: the most verbose records (per-request detail).
pub const PDX_LOG_TRACE: i32 = 5;
/// Log level: diagnostics (refused frames, closed connections).
pub const PDX_LOG_DEBUG: i32 = 10;
/// Log level: errors (an internal panic caught at the ABI boundary).
pub const PDX_LOG_ERROR: i32 = 40;

/// A log callback. `level` is one of the `PDX_LOG_*` values. `module` is
/// the module path of the pdx code that logged (e.g. `"pdx::engine::batch"`;
/// the configuration rules log as `"pdx::config"`), the name `RUST_LOG`
/// filters on. `message` is the text. Both are UTF-8 of the given length in
/// bytes, NUL-terminated as well, and valid only during the call.
/// `userdata` is the pointer given to `pdx_set_log_callback`.
#[allow(non_camel_case_types)]
pub type pdx_log_callback = Option<
    unsafe extern "C" fn(
        userdata: *mut c_void,
        level: i32,
        module: *const c_char,
        module_len: usize,
        message: *const c_char,
        message_len: usize,
    ),
>;

/// Send pdx's log records to `callback` instead of stderr, or back to
/// stderr (`env_logger`, filtered by `RUST_LOG`) when `callback` is NULL.
///
/// `max_level` is the most verbose level delivered: a record reaches the
/// callback when its level is at least `max_level` (Python's logger rule).
/// `PDX_LOG_INFO` passes info, warnings and errors; `PDX_LOG_TRACE` or less
/// passes everything; above `PDX_LOG_ERROR`, nothing. While a callback is
/// set, `RUST_LOG` does not apply and nothing goes to stderr.
///
/// The callback runs on the thread that logged: the caller's thread or one
/// of pdx's own (listeners, connections, workers), possibly on several at
/// once. pdx holds none of its locks while it runs, so it may call any pdx
/// function; records that pdx logs on that thread during such a call are
/// dropped (a callback never recurses into itself). It must return normally
/// (no C++ exception or longjmp across pdx). `pdx_engine_free` of the engine
/// whose thread runs the callback returns without waiting for that thread
/// (see there).
///
/// Replacing or removing takes effect at once. Unless called from inside the
/// callback, this returns only after every call of the previous callback
/// has returned, so the previous `userdata` may be released then.
///
/// Fails with `PDX_ERR_RUNTIME` only in a process whose Rust code installed
/// a different `log` logger before pdx (not possible through the C ABI).
///
/// # Safety
/// `callback` must be NULL or a function of this type that is safe to call
/// from any thread with `userdata` until it is replaced or removed.
#[no_mangle]
pub unsafe extern "C" fn pdx_set_log_callback(
    callback: pdx_log_callback,
    userdata: *mut c_void,
    max_level: i32,
) -> pdx_status {
    guard("pdx_set_log_callback", || crate::logging::set_callback(callback, userdata, max_level))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::args::{PDX_LOG_INFO, PDX_LOG_WARNING};
    use crate::logging;

    #[test]
    fn constants_match_the_logger() {
        assert_eq!(PDX_LOG_TRACE, logging::LEVEL_TRACE);
        assert_eq!(PDX_LOG_DEBUG, logging::LEVEL_DEBUG);
        assert_eq!(PDX_LOG_INFO, logging::LEVEL_INFO);
        assert_eq!(PDX_LOG_WARNING, logging::LEVEL_WARNING);
        assert_eq!(PDX_LOG_ERROR, logging::LEVEL_ERROR);
    }
}
