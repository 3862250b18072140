//! What every exported function stands on: the panic boundary, the log line
//! and pdx's thread-local last error for every failure, and the table that
//! turns an engine pointer from C into a live engine (a NULL, freed or
//! made-up pointer is an error, never dereferenced).

use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use mooncake_sys::Code;
use parking_lot::RwLock;

use crate::codes::{McError, McResult};
use crate::engine::McEngine;

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Record a failure of `function`: one log line, and the reason as pdx's
/// last error (`pdx_last_error_message`).
pub fn report(function: &str, e: &McError) {
    let text = format!("{function}: {}", e.message);
    log::error!("{text}");
    pdx::ffi::set_last_error(&text);
}

/// Run `body` behind the panic boundary. A failure (an error, or a panic,
/// which is a bug of this library and reads as Mooncake's "invalid
/// argument") is reported and turned into the call's return value by
/// `on_error`.
pub fn guard<T>(function: &str, on_error: impl FnOnce(&McError) -> T, body: impl FnOnce() -> McResult<T>) -> T {
    pdx::logging::init();
    let e = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => e,
        Err(payload) => McError::invalid(format!("internal panic: {}", panic_text(&*payload))),
    };
    report(function, &e);
    on_error(&e)
}

/// A required string argument, read during the call only.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid for `'a`.
pub unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> McResult<&'a str> {
    if ptr.is_null() {
        return Err(McError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().map_err(|_| McError::invalid(format!("{what} is not valid UTF-8")))
}

/// A required C string argument as bytes: any bytes up to its NUL, UTF-8
/// or not (a notification's name and message), read during the call only.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid for `'a`.
pub unsafe fn c_bytes<'a>(ptr: *const c_char, what: &str) -> McResult<&'a [u8]> {
    if ptr.is_null() {
        return Err(McError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    Ok(unsafe { CStr::from_ptr(ptr) }.to_bytes())
}

/// A C array of `len` elements; `len == 0` is empty whatever the pointer.
///
/// # Safety
/// When `len > 0` and `ptr` is not NULL, `ptr` points to `len` readable elements valid for `'a`.
pub unsafe fn c_slice<'a, T>(ptr: *const T, len: usize, what: &str) -> McResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(McError::invalid(format!("{what} is NULL but its length is {len}")));
    }
    if !ptr.is_aligned() {
        return Err(McError::invalid(format!("{what} is not aligned")));
    }
    if len.checked_mul(size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(McError::invalid(format!("{what}: {len} entries is too many")));
    }
    // SAFETY: checked non-NULL and aligned; readable for `len` by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Live engines by the value C holds. Values are never reused, and never
/// look like an address (the low byte is a tag), so a stale or made-up
/// pointer finds nothing.
struct Engines {
    next: u64,
    live: BTreeMap<usize, Arc<McEngine>>,
}

/// Read-locked by every call that names an engine (status polls among them).
static ENGINES: RwLock<Engines> = parking_lot::const_rwlock(Engines { next: 1, live: BTreeMap::new() });
const ENGINE_TAG: u64 = 0x4d;

/// Hand out `engine` as an opaque pointer.
pub fn insert_engine(engine: McEngine) -> McResult<*mut c_void> {
    let mut t = ENGINES.write();
    let n = t.next;
    if n >= 1 << 48 {
        return Err(McError::new(Code::TooManyRequests, "no engine handles left in this process"));
    }
    t.next += 1;
    let key = ((n << 8) | ENGINE_TAG) as usize;
    t.live.insert(key, Arc::new(engine));
    Ok(key as *mut c_void)
}

/// The engine behind `ptr`; it stays alive for the caller even if another
/// thread destroys it meanwhile.
pub fn live(ptr: *mut c_void) -> McResult<Arc<McEngine>> {
    if ptr.is_null() {
        return Err(McError::invalid("engine is NULL"));
    }
    ENGINES.read().live.get(&(ptr as usize)).cloned().ok_or_else(|| {
        McError::invalid(format!("engine {ptr:p} is not a live engine of this library (destroyed, or never created)"))
    })
}

/// Take the engine behind `ptr` out of the table (`None`: NULL or unknown).
pub fn remove_engine(ptr: *mut c_void) -> Option<Arc<McEngine>> {
    ENGINES.write().live.remove(&(ptr as usize))
}
