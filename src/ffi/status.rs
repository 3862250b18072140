//! Status codes and their texts.
//!
//! Codes are negative, documented, and never reused: a retired code stays
//! listed as reserved. C reads them as plain `int32_t`, never as a Rust enum.
//!
//! Each code's value is written once, in its constant below (cbindgen copies
//! the constants into `include/pdx.h`); [`TABLE`] joins each to its
//! [`ErrorKind`] and text. Python's constants (`python/pdx/binding.py`) are
//! checked against the table by a test here, which fails on any difference.

use std::ffi::c_char;

use crate::error::ErrorKind;

/// Result of every fallible pdx call: `PDX_OK` (0) or a negative error code.
#[allow(non_camel_case_types)]
pub type pdx_status = i32;

/// Success.
pub const PDX_OK: pdx_status = 0;
/// A required pointer argument was NULL.
pub const PDX_ERR_NULL_ARGUMENT: pdx_status = -1;
/// A string argument was not valid UTF-8.
pub const PDX_ERR_INVALID_UTF8: pdx_status = -2;
/// An argument is malformed or out of range.
pub const PDX_ERR_INVALID_ARGUMENT: pdx_status = -3;
/// pdx caught an internal panic; the call had no effect that can be relied on.
pub const PDX_ERR_PANIC: pdx_status = -4;
/// The key names no known argument.
pub const PDX_ERR_UNKNOWN_KEY: pdx_status = -5;
/// The value does not parse for its argument or is not an allowed choice.
pub const PDX_ERR_INVALID_VALUE: pdx_status = -6;
/// A normalization rule failed where SGLang raises `ValueError`.
pub const PDX_ERR_VALUE_ERROR: pdx_status = -7;
/// A normalization rule failed where SGLang fails an `assert` (`AssertionError`).
pub const PDX_ERR_ASSERTION: pdx_status = -8;
/// A check failed where SGLang raises `RuntimeError` (missing file, no sysfs).
pub const PDX_ERR_RUNTIME: pdx_status = -9;
/// The transport protocol is not one pdx knows.
pub const PDX_ERR_UNKNOWN_PROTOCOL: pdx_status = -10;
/// The backend needed for the request is not available in this process.
pub const PDX_ERR_BACKEND_UNAVAILABLE: pdx_status = -11;
/// An index is past the end of a list.
pub const PDX_ERR_INDEX_OUT_OF_RANGE: pdx_status = -12;
/// A local operating-system call failed.
pub const PDX_ERR_IO: pdx_status = -13;
/// A handle is stale, already freed, or was never issued.
pub const PDX_ERR_INVALID_HANDLE: pdx_status = -14;
/// A local address range is not inside one registered region.
pub const PDX_ERR_ADDRESS_NOT_REGISTERED: pdx_status = -15;
/// The peer refused the request: its address range is not registered there.
pub const PDX_ERR_REMOTE_REJECTED: pdx_status = -16;
/// A region to register overlaps a registered one (or has length zero).
pub const PDX_ERR_ADDRESS_OVERLAP: pdx_status = -17;
/// A deadline passed before the operation finished.
pub const PDX_ERR_TIMEOUT: pdx_status = -18;
/// The peer could not be reached (connect or handshake failed).
pub const PDX_ERR_PEER_UNREACHABLE: pdx_status = -19;
/// The connection broke during a transfer; the affected bytes are not confirmed.
pub const PDX_ERR_CONNECTION_LOST: pdx_status = -20;
/// The peer sent bytes that violate the wire protocol.
pub const PDX_ERR_PROTOCOL: pdx_status = -21;
/// The operation cannot run now (work in flight, queue full); retry later.
pub const PDX_ERR_BUSY: pdx_status = -22;
/// The named thing (region, session, ...) does not exist.
pub const PDX_ERR_NOT_FOUND: pdx_status = -23;
/// The engine is shutting down.
pub const PDX_ERR_SHUTDOWN: pdx_status = -24;
/// The peer rejected a notification.
pub const PDX_ERR_NOTIFY_REJECTED: pdx_status = -25;
/// Device memory was asked for, but no usable CUDA driver (`PDX_CUDA_LIB`)
/// or no such device is there.
pub const PDX_ERR_DEVICE_UNAVAILABLE: pdx_status = -26;
/// A CUDA driver call failed (the message names the driver's error).
pub const PDX_ERR_DEVICE: pdx_status = -27;
/// The caller cancelled the task (`pdx_batch_cancel`, `pdx_task_cancel`):
/// no byte of its local memory is read or written any more.
pub const PDX_ERR_CANCELED: pdx_status = -28;

/// One status: its code, the constant's name (as C and Python spell it),
/// the error kind it reports (none for `PDX_OK`) and its fixed text.
struct Status {
    code: pdx_status,
    // Read by the tests that hold the header and Python to this table.
    #[cfg_attr(not(test), allow(dead_code))]
    name: &'static str,
    kind: Option<ErrorKind>,
    text: &'static str,
}

/// A [`Status`] row from the constant (its name taken from the identifier),
/// the kind and the NUL-terminated text.
macro_rules! row {
    ($code:ident, $kind:expr, $text:literal) => {
        Status { code: $code, name: stringify!($code), kind: $kind, text: $text }
    };
}

/// Every code with its fixed text, in one table so code, kind and text cannot
/// drift apart.
const TABLE: &[Status] = &[
    row!(PDX_OK, None, "ok\0"),
    row!(PDX_ERR_NULL_ARGUMENT, Some(ErrorKind::NullArgument), "a required pointer argument was NULL\0"),
    row!(PDX_ERR_INVALID_UTF8, Some(ErrorKind::InvalidUtf8), "a string argument was not valid UTF-8\0"),
    row!(PDX_ERR_INVALID_ARGUMENT, Some(ErrorKind::InvalidArgument), "invalid argument\0"),
    row!(PDX_ERR_PANIC, Some(ErrorKind::Panic), "internal error (panic caught at the ABI boundary)\0"),
    row!(PDX_ERR_UNKNOWN_KEY, Some(ErrorKind::UnknownKey), "unknown argument key\0"),
    row!(PDX_ERR_INVALID_VALUE, Some(ErrorKind::InvalidValue), "invalid value for argument\0"),
    row!(PDX_ERR_VALUE_ERROR, Some(ErrorKind::ValueError), "configuration rejected (ValueError)\0"),
    row!(PDX_ERR_ASSERTION, Some(ErrorKind::AssertionError), "configuration rejected (AssertionError)\0"),
    row!(PDX_ERR_RUNTIME, Some(ErrorKind::RuntimeError), "environment check failed (RuntimeError)\0"),
    row!(PDX_ERR_UNKNOWN_PROTOCOL, Some(ErrorKind::UnknownProtocol), "unknown transport protocol\0"),
    row!(PDX_ERR_BACKEND_UNAVAILABLE, Some(ErrorKind::BackendUnavailable), "backend unavailable\0"),
    row!(PDX_ERR_INDEX_OUT_OF_RANGE, Some(ErrorKind::IndexOutOfRange), "index out of range\0"),
    row!(PDX_ERR_IO, Some(ErrorKind::Io), "operating-system call failed\0"),
    row!(PDX_ERR_INVALID_HANDLE, Some(ErrorKind::InvalidHandle), "invalid or stale handle\0"),
    row!(PDX_ERR_ADDRESS_NOT_REGISTERED, Some(ErrorKind::AddressNotRegistered), "address range not registered\0"),
    row!(PDX_ERR_REMOTE_REJECTED, Some(ErrorKind::RemoteRejected), "peer rejected the address range\0"),
    row!(PDX_ERR_ADDRESS_OVERLAP, Some(ErrorKind::AddressOverlap), "region overlaps a registered region\0"),
    row!(PDX_ERR_TIMEOUT, Some(ErrorKind::Timeout), "deadline exceeded\0"),
    row!(PDX_ERR_PEER_UNREACHABLE, Some(ErrorKind::PeerUnreachable), "peer unreachable\0"),
    row!(PDX_ERR_CONNECTION_LOST, Some(ErrorKind::ConnectionLost), "connection to peer lost\0"),
    row!(PDX_ERR_PROTOCOL, Some(ErrorKind::Protocol), "wire protocol violation\0"),
    row!(PDX_ERR_BUSY, Some(ErrorKind::Busy), "busy, retry later\0"),
    row!(PDX_ERR_NOT_FOUND, Some(ErrorKind::NotFound), "not found\0"),
    row!(PDX_ERR_SHUTDOWN, Some(ErrorKind::Shutdown), "engine is shutting down\0"),
    row!(PDX_ERR_NOTIFY_REJECTED, Some(ErrorKind::NotifyRejected), "peer rejected the notification\0"),
    row!(PDX_ERR_DEVICE_UNAVAILABLE, Some(ErrorKind::DeviceUnavailable), "CUDA driver or device unavailable\0"),
    row!(PDX_ERR_DEVICE, Some(ErrorKind::Device), "CUDA driver call failed\0"),
    row!(PDX_ERR_CANCELED, Some(ErrorKind::Canceled), "canceled by the caller\0"),
];

/// The status code for an error kind.
pub(crate) fn status_of(kind: ErrorKind) -> pdx_status {
    TABLE.iter().find(|s| s.kind == Some(kind)).map(|s| s.code).unwrap_or(PDX_ERR_PANIC)
}

/// A static, NUL-terminated description of `status`.
///
/// Never NULL; the string is owned by pdx and lives for the whole process.
/// An unknown code gives "unknown status code".
#[no_mangle]
pub extern "C" fn pdx_status_str(status: pdx_status) -> *const c_char {
    // No guard needed: a table lookup on a plain integer cannot panic.
    TABLE.iter().find(|s| s.code == status).map(|s| s.text.as_ptr().cast()).unwrap_or(c"unknown status code".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::ffi::CStr;

    #[test]
    fn codes_and_kinds_are_unique_and_texts_terminated() {
        let mut codes = HashSet::new();
        let mut kinds = HashSet::new();
        for Status { code, name, kind, text } in TABLE {
            assert!(codes.insert(*code), "code {code} listed twice");
            if let Some(k) = kind {
                assert!(kinds.insert(*k), "kind {k:?} listed twice");
                assert_eq!(status_of(*k), *code);
            }
            assert!(text.ends_with('\0') && !text[..text.len() - 1].contains('\0'));
            assert!(*code <= 0);
            assert!(*name == "PDX_OK" || name.starts_with("PDX_ERR_"), "{name}");
        }
    }

    /// Every kind has its own row (none falls back to `PDX_ERR_PANIC`
    /// unlisted), and the codes run 0, -1, -2, ... in table order: a new code
    /// is appended, none is renumbered or reused.
    #[test]
    fn every_kind_has_a_row_and_codes_are_appended() {
        for kind in ErrorKind::ALL {
            assert!(TABLE.iter().any(|s| s.kind == Some(*kind)), "{kind:?} has no status");
        }
        assert_eq!(TABLE.len(), ErrorKind::ALL.len() + 1, "one row per kind, and PDX_OK");
        for (i, s) in TABLE.iter().enumerate() {
            assert_eq!(i64::from(s.code), -(i as i64), "{} is out of order", s.name);
        }
    }

    /// `NAME = value` / `#define NAME value` pairs in `text`, for names
    /// `PDX_OK` and `PDX_ERR_*`, in file order.
    fn declared(text: &str, line: impl Fn(&str) -> Option<(&str, &str)>) -> Vec<(String, pdx_status)> {
        text.lines()
            .filter_map(|l| line(l.trim_end()))
            .filter(|(name, _)| *name == "PDX_OK" || name.starts_with("PDX_ERR_"))
            .map(|(name, value)| (name.to_owned(), value.trim().parse().unwrap_or_else(|_| panic!("{name} = {value}"))))
            .collect()
    }

    fn table() -> Vec<(String, pdx_status)> {
        TABLE.iter().map(|s| (s.name.to_owned(), s.code)).collect()
    }

    fn repo_file(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Python's two tables are the Rust table, name for name and value for
    /// value: its constants (`PDX_ERR_X = -N`) and `STATUS_NAMES`
    /// (`PDX_ERR_X: "PDX_ERR_X",`, whose values `pdx.PdxError` shows).
    #[test]
    fn python_constants_match_the_table() {
        let source = repo_file("python/pdx/binding.py");
        let constants = declared(&source, |l| l.split_once(" = "));
        assert_eq!(constants, table(), "python/pdx/binding.py's status constants differ from src/ffi/status.rs");
        let names: Vec<(&str, &str)> = source
            .lines()
            .filter_map(|l| l.trim().strip_suffix("\",")?.split_once(": \""))
            .filter(|(key, _)| *key == "PDX_OK" || key.starts_with("PDX_ERR_"))
            .collect();
        let expected: Vec<(&str, &str)> = TABLE.iter().map(|s| (s.name, s.name)).collect();
        assert_eq!(names, expected, "python/pdx/binding.py's STATUS_NAMES differs from src/ffi/status.rs");
    }

    /// The header's macros are the table's (cbindgen writes them from the
    /// constants; `tests/header.rs` checks the header is fresh).
    #[test]
    fn header_macros_match_the_table() {
        let header = declared(&repo_file("include/pdx.h"), |l| l.strip_prefix("#define ")?.split_once(' '));
        assert_eq!(header, table(), "include/pdx.h's status macros differ from src/ffi/status.rs");
    }

    #[test]
    fn status_str_of_unknown_code_is_static_text() {
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let s = unsafe { CStr::from_ptr(pdx_status_str(12345)) };
        assert_eq!(s.to_str().unwrap(), "unknown status code");
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let s = unsafe { CStr::from_ptr(pdx_status_str(PDX_ERR_TIMEOUT)) };
        assert_eq!(s.to_str().unwrap(), "deadline exceeded");
    }
}
