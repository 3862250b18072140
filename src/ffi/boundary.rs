//! What every exported function stands on: the panic boundary, the
//! thread-local last error, checked pointer and string conversion, and the
//! handle tables that make a bogus or freed handle an error instead of a crash.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::status::{pdx_status, status_of, PDX_ERR_PANIC, PDX_OK};
use crate::error::{Error, ErrorKind, Result};
use crate::ids::IdTable;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // Interior NULs cannot be represented in a C string; show them visibly.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// Text of the last failure on the calling thread.
///
/// Never NULL: an empty string when no pdx call has failed on this thread.
/// The text is owned by pdx and stays valid until the next failing pdx call
/// on the same thread.
#[no_mangle]
pub extern "C" fn pdx_last_error_message() -> *const c_char {
    // Reading a thread-local cannot panic unless the thread is being torn
    // down; `try_with` covers that case.
    LAST_ERROR.try_with(|slot| slot.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Record `err` as the last error and return its status code.
pub(crate) fn fail(err: &Error) -> pdx_status {
    set_last_error(err.message());
    status_of(err.kind())
}

/// Run `body` behind the panic boundary and turn its result into a status.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> Result<()>) -> pdx_status {
    crate::logging::init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => PDX_OK,
        Ok(Err(err)) => fail(&err),
        Err(payload) => {
            let text = format!("{function}: internal panic: {}", panic_text(&*payload));
            log::error!("{text}");
            set_last_error(&text);
            PDX_ERR_PANIC
        }
    }
}

/// Run `body` behind the panic boundary for a function that does not return a
/// status; `fallback` is returned on error or panic (the error is recorded).
pub(crate) fn guard_or<T>(function: &str, fallback: T, body: impl FnOnce() -> Result<T>) -> T {
    crate::logging::init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(err)) => {
            fail(&err);
            fallback
        }
        Err(payload) => {
            let text = format!("{function}: internal panic: {}", panic_text(&*payload));
            log::error!("{text}");
            set_last_error(&text);
            fallback
        }
    }
}

/// A required NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `ptr` must be NULL or point to a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str> {
    opt_c_str(ptr, what)?.ok_or_else(|| Error::new(ErrorKind::NullArgument, format!("{what} is NULL")))
}

/// An optional string argument: NULL gives `None`.
///
/// # Safety
/// As for [`c_str`].
pub(crate) unsafe fn opt_c_str<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if ptr.is_null() {
        return Ok(None);
    }
    CStr::from_ptr(ptr)
        .to_str()
        .map(Some)
        .map_err(|_| Error::new(ErrorKind::InvalidUtf8, format!("{what} is not valid UTF-8")))
}

/// A required out-param: checked before any work so that nothing is done
/// for a call whose result could not be delivered.
pub(crate) fn out_ptr<T>(ptr: *mut T, what: &str) -> Result<*mut T> {
    if ptr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("{what} is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(Error::invalid_argument(format!("{what} is not aligned")));
    }
    Ok(ptr)
}

/// An optional out-param: NULL means "not wanted"; a misaligned pointer is
/// refused. Check every out-param before doing any work.
pub(crate) fn opt_out_ptr<T>(ptr: *mut T, what: &str) -> Result<Option<*mut T>> {
    if ptr.is_null() {
        return Ok(None);
    }
    out_ptr(ptr, what).map(Some)
}

/// A caller-owned text buffer (`buf`, `buf_len`) plus an optional length
/// out-param, checked before any work is done.
pub(crate) struct TextOut {
    buf: *mut c_char,
    buf_len: usize,
    out_len: Option<*mut usize>,
}

/// Check a text out-param triple. `buf` may be NULL only with `buf_len == 0`
/// (the caller asks for the length alone).
pub(crate) fn text_out(buf: *mut c_char, buf_len: usize, out_len: *mut usize) -> Result<TextOut> {
    if buf.is_null() && buf_len > 0 {
        return Err(Error::new(ErrorKind::NullArgument, "buf is NULL but buf_len is not 0"));
    }
    Ok(TextOut { buf, buf_len, out_len: opt_out_ptr(out_len, "out_len")? })
}

impl TextOut {
    /// Copy `text` (NUL-terminated, cut at a character boundary to fit) and
    /// store its full length in bytes, without the NUL.
    ///
    /// # Safety
    /// `buf` must be writable for `buf_len` bytes (checked shape only).
    pub(crate) unsafe fn write(&self, text: &str) {
        if self.buf_len > 0 {
            let mut n = text.len().min(self.buf_len - 1);
            while !text.is_char_boundary(n) {
                n -= 1;
            }
            std::ptr::copy_nonoverlapping(text.as_ptr(), self.buf.cast::<u8>(), n);
            *self.buf.add(n) = 0;
        }
        if let Some(p) = self.out_len {
            *p = text.len();
        }
    }
}

/// `IndexOutOfRange` for item `i` of a list of `len`.
pub(crate) fn index_out_of_range(i: usize, len: usize) -> Error {
    Error::new(ErrorKind::IndexOutOfRange, format!("index {i} is out of range ({len} items)"))
}

/// A C array argument of `len` elements. `len == 0` gives an empty slice
/// whatever the pointer.
///
/// # Safety
/// When `len > 0`, `ptr` must point to `len` readable elements valid for `'a`.
pub(crate) unsafe fn c_slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("{what} is NULL but its length is {len}")));
    }
    if !ptr.is_aligned() {
        return Err(Error::invalid_argument(format!("{what} is not aligned")));
    }
    if len.checked_mul(std::mem::size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(Error::invalid_argument(format!("{what} length {len} is too large")));
    }
    Ok(std::slice::from_raw_parts(ptr, len))
}

/// The tag of each handle table (distinct, nonzero: batch ids use 0), so a
/// handle of one type is never taken for another.
pub(crate) mod handle_tag {
    pub(crate) const ENGINE: u8 = 1;
    pub(crate) const ARGS: u8 = 2;
    pub(crate) const TRANSPORT_CHOICE: u8 = 3;
    pub(crate) const IB_DEVICE_CONFIG: u8 = 4;
    pub(crate) const IB_VALIDATION: u8 = 5;
    pub(crate) const NOTIFICATIONS: u8 = 6;
    pub(crate) const ENGINE_OPTIONS: u8 = 9;
    pub(crate) const KV_PLAN: u8 = 12;
}

/// Live handles of one type. The pointer C holds is a generational id of
/// [`IdTable`] (tag, generation, slot), never an address: a NULL, freed,
/// reused, foreign or garbage handle is refused with `PDX_ERR_INVALID_HANDLE`
/// and never dereferenced, however often slots are reused. The table holds
/// an `Arc`, so a handle freed by one thread while another thread is inside
/// a call stays alive until that call returns.
pub(crate) struct HandleTable<T> {
    ids: IdTable<T>,
}

impl<T> HandleTable<T> {
    /// `name` is the C type in messages; `tag` is distinct per table.
    pub(crate) const fn new(name: &'static str, tag: u8) -> Self {
        HandleTable { ids: IdTable::new(name, tag) }
    }

    /// Register `value` and return the opaque pointer for C.
    pub(crate) fn insert<C>(&self, value: T) -> Result<*mut C> {
        // Ids fit a pointer: the crate builds only for 64-bit targets.
        self.ids.insert(Arc::new(value)).map(|id| id as usize as *mut C)
    }

    /// The live object behind `ptr`.
    pub(crate) fn get<C>(&self, ptr: *const C) -> Result<Arc<T>> {
        if ptr.is_null() {
            return Err(Error::new(ErrorKind::NullArgument, format!("{} is NULL", self.ids_name())));
        }
        self.ids.get(ptr as usize as u64)
    }

    /// Remove `ptr`; returns the object if it was live. NULL and unknown
    /// pointers give `None`.
    pub(crate) fn remove<C>(&self, ptr: *const C) -> Option<Arc<T>> {
        if ptr.is_null() {
            return None;
        }
        self.ids.remove(ptr as usize as u64)
    }

    fn ids_name(&self) -> &'static str {
        self.ids.what()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::status::*;

    #[test]
    fn guard_maps_errors_and_panics() {
        assert_eq!(guard("t", || Ok(())), PDX_OK);
        assert_eq!(guard("t", || Err(Error::value_error("boom"))), PDX_ERR_VALUE_ERROR);
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let msg = unsafe { CStr::from_ptr(pdx_last_error_message()) };
        assert_eq!(msg.to_str().unwrap(), "boom");
        assert_eq!(guard("t", || panic!("kaboom")), PDX_ERR_PANIC);
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let msg = unsafe { CStr::from_ptr(pdx_last_error_message()) };
        assert!(msg.to_str().unwrap().contains("kaboom"));
        assert_eq!(guard_or("t", 7u16, || panic!("x")), 7);
    }

    #[test]
    fn last_error_is_per_thread_and_never_null() {
        set_last_error("main thread");
        std::thread::spawn(|| {
            // SAFETY: pdx returns NUL-terminated strings that outlive this use.
            let msg = unsafe { CStr::from_ptr(pdx_last_error_message()) };
            assert_eq!(msg.to_bytes(), b"");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn strings_and_slices_are_checked() {
        // SAFETY: every pointer is NULL, a live string, or refused before any read.
        unsafe {
            assert_eq!(c_str(std::ptr::null(), "key").unwrap_err().kind(), ErrorKind::NullArgument);
            assert_eq!(opt_c_str(std::ptr::null(), "v").unwrap(), None);
            let bad = b"\xff\xfe\0";
            assert_eq!(c_str(bad.as_ptr().cast(), "key").unwrap_err().kind(), ErrorKind::InvalidUtf8);
            assert_eq!(c_slice::<u64>(std::ptr::null(), 0, "a").unwrap().len(), 0);
            assert_eq!(c_slice::<u64>(std::ptr::null(), 3, "a").unwrap_err().kind(), ErrorKind::NullArgument);
            let misaligned = (8usize + 1) as *const u64;
            assert_eq!(c_slice(misaligned, 1, "a").unwrap_err().kind(), ErrorKind::InvalidArgument);
            assert_eq!(
                c_slice(std::ptr::dangling::<u64>(), usize::MAX / 4, "a").unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
        }
    }

    #[test]
    fn text_out_truncates_at_char_boundaries() {
        let mut buf = [0x55 as c_char; 4];
        let mut len = 0usize;
        let out = text_out(buf.as_mut_ptr(), buf.len(), &mut len).unwrap();
        // SAFETY: `buf` is writable for `buf_len` bytes (or NULL with length 0).
        unsafe { out.write("aé€") }; // 1 + 2 + 3 bytes
        assert_eq!(len, 6);
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(got.to_str().unwrap(), "aé");
        assert_eq!(
            text_out(std::ptr::null_mut(), 1, std::ptr::null_mut()).err().unwrap().kind(),
            ErrorKind::NullArgument
        );
        let out = text_out(std::ptr::null_mut(), 0, &mut len).unwrap();
        // SAFETY: `buf` is writable for `buf_len` bytes (or NULL with length 0).
        unsafe { out.write("xyz") };
        assert_eq!(len, 3);
    }

    #[test]
    fn handle_table_refuses_unknown_and_freed() {
        struct Opaque;
        static TABLE: HandleTable<u32> = HandleTable::new("test handle", 0x7f);
        let p: *mut Opaque = TABLE.insert(5).unwrap();
        assert_eq!(*TABLE.get(p).unwrap(), 5);
        assert_eq!(TABLE.get(0x1000 as *const Opaque).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(TABLE.get(std::ptr::null::<Opaque>()).unwrap_err().kind(), ErrorKind::NullArgument);
        assert!(TABLE.remove(p).is_some());
        assert!(TABLE.remove(p).is_none());
        assert_eq!(TABLE.get(p).unwrap_err().kind(), ErrorKind::InvalidHandle);
        let q: *mut Opaque = TABLE.insert(6).unwrap();
        assert_ne!(p, q, "a reused slot is a new handle");
        assert_eq!(TABLE.get(p).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(*TABLE.get(q).unwrap(), 6);
    }
}
