//! C ABI for arguments, normalization and its messages.
//!
//! A `pdx_args` holds the PD-related subset of SGLang's ServerArgs (see
//! `pdx_args_set` for the keys). Typical use:
//!
//! ```c
//! pdx_args *a;
//! pdx_args_new(&a);
//! pdx_args_parse_argv(a, argc, (const char *const *)argv);
//! if (pdx_normalize_args(a) != PDX_OK) fprintf(stderr, "%s\n", pdx_last_error_message());
//! for (size_t i = 0; i < pdx_args_message_count(a); i++) { /* also after a refusal */
//!   int32_t level;
//!   const char *text = pdx_args_message(a, i, &level);
//! }
//! pdx_args_free(a);
//! ```
//!
//! A `pdx_args` may be used from several threads; calls on one object are
//! serialized by an internal lock.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};

use parking_lot::Mutex;

use super::boundary::{c_slice, c_str, guard, guard_or, handle_tag, opt_c_str, out_ptr, HandleTable};
use super::status::pdx_status;
use crate::config::{self, Level, Message, ProcessEnv, ServerArgs};
use crate::error::{Error, ErrorKind, Result};

/// Opaque set of PD server arguments. Made by `pdx_args_new`, released by
/// `pdx_args_free`.
#[allow(non_camel_case_types)]
pub struct pdx_args {
    _private: [u8; 0],
}

/// Message level INFO (Python's `logging.INFO`).
pub const PDX_LOG_INFO: i32 = 20;
/// Message level WARNING (Python's `logging.WARNING`).
pub const PDX_LOG_WARNING: i32 = 30;

pub(crate) fn level_code(level: Level) -> i32 {
    match level {
        Level::Info => PDX_LOG_INFO,
        Level::Warning => PDX_LOG_WARNING,
    }
}

/// A Rust string as a C string; an interior NUL is an `InvalidValue`.
pub(crate) fn to_cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid_value(format!("{what} contains a NUL byte and cannot be returned to C")))
}

pub(crate) fn messages_to_c(messages: &[Message]) -> Result<Vec<(i32, CString)>> {
    messages.iter().map(|m| Ok((level_code(m.level), to_cstring(&m.text, "message")?))).collect()
}

struct ArgsState {
    args: ServerArgs,
    /// Messages of the last `pdx_normalize_args`: its lines on success, the
    /// lines SGLang logged before its refusal on failure.
    messages: Vec<(i32, CString)>,
    /// Strings handed out by `pdx_args_get`, by field name; cleared by every
    /// mutation, which is what ends their validity.
    got: HashMap<&'static str, Option<CString>>,
}

impl ArgsState {
    fn mutated(&mut self) {
        self.got.clear();
    }
}

static ARGS: HandleTable<Mutex<ArgsState>> = HandleTable::new("pdx_args handle", handle_tag::ARGS);

/// Create an argument set holding SGLang's defaults (mode `null`, backend
/// `mooncake`, rule set `default`).
///
/// On success `*out` receives a new object owned by the caller, to be
/// released with `pdx_args_free`. Errors: `PDX_ERR_NULL_ARGUMENT` when `out`
/// is NULL (nothing is allocated).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `out` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_args_new(out: *mut *mut pdx_args) -> pdx_status {
    guard("pdx_args_new", || {
        let out = out_ptr(out, "out")?;
        let state = ArgsState { args: ServerArgs::default(), messages: Vec::new(), got: HashMap::new() };
        let handle = ARGS.insert(Mutex::new(state))?;
        // SAFETY: `out` is non-NULL and aligned (checked above); the caller
        // promises it points to writable storage for one pointer.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Release an argument set and every string it handed out.
///
/// NULL is ignored, and so are pointers that are not live `pdx_args`
/// (already freed or never made by pdx): they are not touched.
#[no_mangle]
pub extern "C" fn pdx_args_free(args: *mut pdx_args) {
    guard_or("pdx_args_free", (), || {
        ARGS.remove(args);
        Ok(())
    })
}

/// Set one argument from text.
///
/// `key` is a ServerArgs field name (`"disaggregation_transfer_backend"`) or
/// one of its CLI flags (`"--disaggregation-transfer-backend"`, and the
/// aliases `--data-parallel-size`, `--decode-context-parallel-size`). The
/// extra key `"pdx_rules"` (`"default"`, `"2026-07"`, `"2026-09"`,
/// `"2026-10"`, or `"latest"` for the newest) picks the rule set of
/// `pdx_normalize_args` (docs/sglang-rules.md lists each set's fields). The `2026-09` rules also read
/// `dcp_size` (`--dcp-size`, `--decode-context-parallel-size`, default 1),
/// `enable_hierarchical_cache` (default false),
/// `disaggregation_bootstrap_port` (default 8998) and `port` (default 30000).
///
/// `value` is the text of the value; NULL means Python's `None` and is
/// accepted only by optional fields (`disaggregation_ib_device`,
/// `disaggregation_decode_extra_slots`, `speculative_algorithm`,
/// `max_running_requests`, `mooncake_ib_device`). Booleans accept
/// `true 1 yes y false 0 no n` in any case; integers are decimal.
///
/// Errors (the object is unchanged): `PDX_ERR_NULL_ARGUMENT` (args or key
/// NULL), `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_UNKNOWN_KEY`, `PDX_ERR_INVALID_VALUE` (the message names the
/// key and lists the allowed values). On success, strings previously
/// returned by `pdx_args_get` for this object become invalid.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `key` is NULL or a NUL-terminated string;
/// `value` is NULL or a NUL-terminated string. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_args_set(args: *mut pdx_args, key: *const c_char, value: *const c_char) -> pdx_status {
    guard("pdx_args_set", || {
        let handle = ARGS.get(args)?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let key = unsafe { c_str(key, "key")? };
        // SAFETY: as for `key`.
        let value = unsafe { opt_c_str(value, "value")? };
        let mut state = handle.lock();
        state.args.set(key, value)?;
        state.mutated();
        Ok(())
    })
}

/// Read one argument as text (same keys as `pdx_args_set`, plus the
/// read-only `"shared_engine_ib_device"`: SGLang's shared-engine device
/// choice `disaggregation_ib_device or mooncake_ib_device`, ready to pass to
/// `pdx_engine_init_with`).
///
/// On success `*out` is NULL for `None`, else a NUL-terminated string owned
/// by `args`, valid until the next successful mutation of `args`
/// (`pdx_args_set`, `pdx_args_parse_argv`, `pdx_normalize_args`) or
/// `pdx_args_free`. Booleans read back as `"true"`/`"false"`.
///
/// Errors (`*out` untouched): `PDX_ERR_NULL_ARGUMENT`,
/// `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INVALID_UTF8`, `PDX_ERR_UNKNOWN_KEY`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `key` is NULL or a NUL-terminated string;
/// `out` is NULL or valid for writing one pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_args_get(
    args: *const pdx_args,
    key: *const c_char,
    out: *mut *const c_char,
) -> pdx_status {
    guard("pdx_args_get", || {
        let out = out_ptr(out, "out")?;
        let handle = ARGS.get(args)?;
        // SAFETY: the caller passes a NUL-terminated string or NULL.
        let key = unsafe { c_str(key, "key")? };
        let mut state = handle.lock();
        let value = state.args.get(key)?;
        // `get` succeeded, so the key names a field; an error, not a panic, if not.
        let Some(name) = config::args::read_name(key) else {
            return Err(Error::new(ErrorKind::UnknownKey, format!("unknown argument key {key:?}")));
        };
        let ptr = match state.got.get(name) {
            Some(cached) => cached.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            None => {
                let c = value.as_deref().map(|v| to_cstring(v, name)).transpose()?;
                let ptr = c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                state.got.insert(name, c);
                ptr
            }
        };
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { *out = ptr };
        Ok(())
    })
}

/// Read the PD-related SGLang flags from a command line.
///
/// Reads `argc` strings from `argv` (a trailing NULL is not required and
/// not read). Recognized: `--flag value`, `--flag=value` and bare boolean
/// flags, for every key of `pdx_args_set` in flag form, and argparse's
/// unique-prefix abbreviations of them, resolved against SGLang's whole
/// option list of the rule set in effect (`--disaggregation-transfer` is
/// `--disaggregation-transfer-backend`). Everything else (the program name,
/// other options and their values, positionals, anything after `--`) is
/// left alone. A repeated flag: the last one wins.
///
/// All-or-nothing: on error the object is unchanged. Errors:
/// `PDX_ERR_NULL_ARGUMENT` (args, or argv with argc > 0, or an element),
/// `PDX_ERR_INVALID_ARGUMENT` (argc < 0), `PDX_ERR_INVALID_HANDLE`,
/// `PDX_ERR_INVALID_UTF8`, `PDX_ERR_INVALID_VALUE` (a recognized flag with a
/// bad or missing value: `argument --flag: expected one argument`; a prefix
/// of several options: `ambiguous option: --x could match --x-a, --x-b`).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `argv` is NULL or points to `argc` readable
/// pointers, each NULL or a NUL-terminated string. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_args_parse_argv(
    args: *mut pdx_args,
    argc: c_int,
    argv: *const *const c_char,
) -> pdx_status {
    guard("pdx_args_parse_argv", || {
        let handle = ARGS.get(args)?;
        let len = usize::try_from(argc).map_err(|_| Error::invalid_argument(format!("argc is negative ({argc})")))?;
        // SAFETY: the caller promises `argv` holds `argc` readable pointers.
        let ptrs = unsafe { c_slice(argv, len, "argv")? };
        let mut words = Vec::with_capacity(len);
        for (i, p) in ptrs.iter().enumerate() {
            // SAFETY: each element is a NUL-terminated string or NULL.
            words.push(unsafe { c_str(*p, &format!("argv[{i}]"))? });
        }
        let mut state = handle.lock();
        config::parse_argv(&mut state.args, &words)?;
        state.mutated();
        Ok(())
    })
}

/// Apply SGLang's PD rules to `args` (`handle_pd_disaggregation` plus
/// load-balance defaulting) under the rule set chosen by `pdx_rules`.
///
/// On success the arguments are rewritten (e.g. backend `mooncake_tcp` →
/// `mooncake`, `disaggregation_ib_device` → None; under `2026-09` with
/// `SGLANG_RUST_SERVER` true, a prefill's `disaggregation_bootstrap_port` →
/// `port`) and the INFO/WARNING lines
/// are logged (`RUST_LOG`) and kept: read them with `pdx_args_message_count`
/// / `pdx_args_message`. Strings from `pdx_args_get` and earlier messages
/// of this object become invalid.
///
/// On failure the arguments and the environment do not change, and the
/// exact SGLang message is in `pdx_last_error_message()`:
/// `PDX_ERR_VALUE_ERROR` where SGLang raises `ValueError`,
/// `PDX_ERR_ASSERTION` where it fails an `assert`; also
/// `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_HANDLE`. Where SGLang refuses,
/// the messages become the lines SGLang logs before raising (its texts, its
/// order, logged here too; none where it logs none): e.g. the `mooncake_tcp`
/// rewrite's line before a staging-buffer refusal. Earlier messages of this
/// object become invalid; strings from `pdx_args_get` stay valid.
///
/// Environment write: when the `mooncake_tcp` alias applies and every rule
/// passes, and only then,
/// this call sets `MC_FORCE_TCP=1` in the process environment if the
/// variable is absent (an existing value, even `0` or empty, is kept). The
/// write happens under a lock that pdx's own environment reads share, but
/// other code calling `getenv`/`setenv` concurrently is not protected (a
/// data race in the C library). Normalize before starting threads that read
/// the environment. What happened is reported as the first message.
#[no_mangle]
pub extern "C" fn pdx_normalize_args(args: *mut pdx_args) -> pdx_status {
    guard("pdx_normalize_args", || {
        let handle = ARGS.get(args)?;
        // normalize logs its messages; a log callback may read `args`.
        let _logs = crate::logging::defer_callbacks();
        let mut state = handle.lock();
        let mut work = state.args.clone();
        match config::normalize(&mut work, &ProcessEnv) {
            Ok(messages) => {
                let messages = messages_to_c(&messages)?;
                state.args = work;
                state.messages = messages;
                state.mutated();
                Ok(())
            }
            Err(refusal) => {
                // SGLang's error wins over a message C cannot hold (texts
                // come from C strings and pdx's own literals: none has a NUL).
                state.messages = messages_to_c(&refusal.messages).unwrap_or_default();
                Err(refusal.error)
            }
        }
    })
}

/// Number of messages kept by the last `pdx_normalize_args` on `args` that
/// succeeded or that SGLang's rules refused (then: the lines logged before
/// the refusal); 0 before any. Returns 0 for NULL or a stale handle (the
/// error is recorded for `pdx_last_error_message`).
#[no_mangle]
pub extern "C" fn pdx_args_message_count(args: *const pdx_args) -> usize {
    guard_or("pdx_args_message_count", 0, || Ok(ARGS.get(args)?.lock().messages.len()))
}

/// Message `i` (0-based, in emission order) of the last normalization (as
/// `pdx_args_message_count` counts them), and its level (`PDX_LOG_INFO` or
/// `PDX_LOG_WARNING`) in `*level` when `level` is not NULL.
///
/// The text is owned by `args` and valid until the next
/// `pdx_normalize_args` on it that succeeds or is refused by SGLang's
/// rules, or `pdx_args_free`. Returns NULL (and leaves
/// `*level` untouched) on error: stale handle, or `i` out of range
/// (`PDX_ERR_INDEX_OUT_OF_RANGE` in the recorded error).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `level` is NULL or valid for writing one
/// `i32`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_args_message(args: *const pdx_args, i: usize, level: *mut i32) -> *const c_char {
    guard_or("pdx_args_message", std::ptr::null(), || {
        if !level.is_null() {
            out_ptr(level, "level")?;
        }
        let handle = ARGS.get(args)?;
        let state = handle.lock();
        let (lvl, text) = state.messages.get(i).ok_or_else(|| {
            Error::new(
                ErrorKind::IndexOutOfRange,
                format!("message index {i} is out of range ({} messages)", state.messages.len()),
            )
        })?;
        if !level.is_null() {
            // SAFETY: non-NULL and aligned (checked above).
            unsafe { *level = *lvl };
        }
        Ok(text.as_ptr())
    })
}

/// Append a transfer-backend name to the accepted choices, process-wide
/// (SGLang's `add_disagg_transfer_backend_choices`, for plugins). Adding a
/// name that is already accepted does nothing.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_INVALID_VALUE` (empty name).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `name` is NULL or a NUL-terminated string.
/// Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_add_transfer_backend_choice(name: *const c_char) -> pdx_status {
    guard("pdx_add_transfer_backend_choice", || {
        // SAFETY: the caller passes a NUL-terminated string or NULL.
        let name = unsafe { c_str(name, "name")? };
        if name.is_empty() {
            return Err(Error::invalid_value("a transfer backend name must not be empty"));
        }
        config::choices::add_transfer_backend_choices(&[name]);
        Ok(())
    })
}

/// sglang 0.5.23's EFA allocator guard (`_validate_efa_allocator_compatibility`
/// as its Mooncake KV manager runs it), against the process environment:
/// when `protocol` (NULL: `MOONCAKE_PROTOCOL`, default `rdma`) is `efa` in
/// any case, a custom memory pool `SGLANG_MOONCAKE_CUSTOM_MEM_POOL` of type
/// NVLINK or BAREX (`true` means NVLINK), then `expandable_segments:True` in
/// `PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF`, are refused. Engines
/// initialized with protocol `efa` run the same check.
///
/// Errors: `PDX_ERR_VALUE_ERROR` with SGLang's text; `PDX_ERR_INVALID_UTF8`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `protocol` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pdx_check_efa_allocator(protocol: *const c_char) -> pdx_status {
    guard("pdx_check_efa_allocator", || {
        // SAFETY: the caller passes a NUL-terminated string or NULL.
        let protocol = unsafe { opt_c_str(protocol, "protocol")? };
        match protocol {
            Some(p) => config::efa::check_allocator_for(&ProcessEnv, p),
            None => config::efa::validate_efa_allocator_compatibility(&ProcessEnv),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::status::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> Option<String> {
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned())
    }

    #[test]
    fn lifecycle_set_get_and_stale_handles() {
        // SAFETY: every pointer passed is NULL, a live C string or array, or deliberately stale.
        unsafe {
            let mut a: *mut pdx_args = std::ptr::null_mut();
            assert_eq!(pdx_args_new(&mut a), PDX_OK);
            assert_eq!(pdx_args_set(a, c"--disaggregation-mode".as_ptr(), c"decode".as_ptr()), PDX_OK);
            let mut out: *const c_char = std::ptr::null();
            assert_eq!(pdx_args_get(a, c"disaggregation_mode".as_ptr(), &mut out), PDX_OK);
            assert_eq!(s(out).as_deref(), Some("decode"));
            assert_eq!(pdx_args_get(a, c"disaggregation_ib_device".as_ptr(), &mut out), PDX_OK);
            assert!(out.is_null());
            let sentinel = 0x10 as *const c_char;
            out = sentinel;
            assert_eq!(pdx_args_get(a, c"nope".as_ptr(), &mut out), PDX_ERR_UNKNOWN_KEY);
            assert_eq!(out, sentinel, "out untouched on error");
            assert_eq!(pdx_args_message(a, 0, std::ptr::null_mut()), std::ptr::null());
            pdx_args_free(a);
            assert_eq!(pdx_args_set(a, c"port".as_ptr(), c"1".as_ptr()), PDX_ERR_INVALID_HANDLE);
            assert_eq!(pdx_args_message_count(a), 0);
            pdx_args_free(a);
            pdx_args_free(std::ptr::null_mut());
            assert_eq!(pdx_args_new(std::ptr::null_mut()), PDX_ERR_NULL_ARGUMENT);
        }
    }

    #[test]
    fn parse_argv_checks_its_arrays() {
        // SAFETY: every pointer passed is NULL, a live C string or array, or deliberately stale.
        unsafe {
            let mut a: *mut pdx_args = std::ptr::null_mut();
            assert_eq!(pdx_args_new(&mut a), PDX_OK);
            let argv = [c"prog".as_ptr(), c"--disaggregation-transfer-backend=nixl".as_ptr()];
            assert_eq!(pdx_args_parse_argv(a, 2, argv.as_ptr()), PDX_OK);
            assert_eq!(pdx_args_parse_argv(a, -1, argv.as_ptr()), PDX_ERR_INVALID_ARGUMENT);
            assert_eq!(pdx_args_parse_argv(a, 1, std::ptr::null()), PDX_ERR_NULL_ARGUMENT);
            assert_eq!(pdx_args_parse_argv(a, 0, std::ptr::null()), PDX_OK);
            let with_null = [c"x".as_ptr(), std::ptr::null()];
            assert_eq!(pdx_args_parse_argv(a, 2, with_null.as_ptr()), PDX_ERR_NULL_ARGUMENT);
            let mut out: *const c_char = std::ptr::null();
            assert_eq!(pdx_args_get(a, c"--disaggregation-transfer-backend".as_ptr(), &mut out), PDX_OK);
            assert_eq!(s(out).as_deref(), Some("nixl"));
            pdx_args_free(a);
        }
    }
}
