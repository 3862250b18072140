//! Mooncake's return values and task states as pdx errors and states, and
//! a notification as its C API takes it.

use std::ffi::CString;

use mooncake_sys::{Code, Convention, McError};

use crate::error::{Error, ErrorKind};
use crate::transfer::{Notification, TaskState};

/// The pdx kind for a Mooncake error code.
pub fn kind_of(code: Code) -> ErrorKind {
    match code {
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::TooManyRequests | Code::BatchBusy => ErrorKind::Busy,
        Code::AddressNotRegistered => ErrorKind::AddressNotRegistered,
        Code::AddressOverlapped => ErrorKind::AddressOverlap,
        Code::DeviceNotFound | Code::NotSupportedTransport | Code::NotImplemented => ErrorKind::BackendUnavailable,
        Code::Dns | Code::Socket | Code::RejectHandshake | Code::Metadata => ErrorKind::PeerUnreachable,
        Code::Endpoint => ErrorKind::ConnectionLost,
        Code::MalformedJson => ErrorKind::Protocol,
        Code::Context | Code::Numa | Code::Clock | Code::Memory | Code::Unknown(_) => ErrorKind::Io,
    }
}

/// Decode `raw` returned by Mooncake's `call`: `Ok` for 0, else an error
/// whose message names the call and the code.
pub fn check(raw: i32, convention: Convention, call: &str) -> crate::Result<()> {
    mooncake_sys::check(raw, convention).map_err(|e| to_error(e, call))
}

/// A decoded Mooncake error as a pdx error.
pub fn to_error(e: McError, call: &str) -> Error {
    Error::new(kind_of(e.code), format!("{call}: {e}"))
}

/// A task state read from `getTransferStatus`: the pdx state, and the
/// failure (kind and text) of a failed task.
pub fn task_state(status: i32) -> (TaskState, Option<(ErrorKind, &'static str)>) {
    use mooncake_sys::*;
    match status {
        STATUS_WAITING | STATUS_PENDING => (TaskState::Pending, None),
        STATUS_COMPLETED => (TaskState::Completed, None),
        STATUS_TIMEOUT => (TaskState::Failed, Some((ErrorKind::Timeout, "Mooncake reported the task TIMEOUT"))),
        STATUS_FAILED => (
            TaskState::Failed,
            Some((
                ErrorKind::ConnectionLost,
                "Mooncake reported the task FAILED (the peer refused the range, or the connection or device failed; \
                 Mooncake's log names the cause)",
            )),
        ),
        STATUS_CANCELED => {
            (TaskState::Failed, Some((ErrorKind::ConnectionLost, "Mooncake reported the task CANCELED")))
        }
        STATUS_INVALID => (TaskState::Failed, Some((ErrorKind::InvalidArgument, "Mooncake reported the task INVALID"))),
        _ => {
            (TaskState::Failed, Some((ErrorKind::Protocol, "Mooncake reported a task status value it does not define")))
        }
    }
}

/// A notification as Mooncake's C API takes it: two C strings, so a NUL
/// byte cannot pass (refused, never cut short).
pub fn notify_cstrings(note: &Notification) -> crate::Result<(CString, CString)> {
    let nul = |what: &str| {
        Error::invalid_argument(format!(
            "the notification's {what} has a NUL byte, which Mooncake's C API cannot carry (its strings end at the \
             first NUL); the tcp engine carries any bytes"
        ))
    };
    let name = CString::new(note.name.clone()).map_err(|_| nul("name"))?;
    let msg = CString::new(note.msg.clone()).map_err(|_| nul("message"))?;
    Ok((name, msg))
}

/// Refuse `note` when the frame Mooncake would write for it cannot fit
/// `limit` (`MC_HANDSHAKE_MAX_LENGTH`, which the peer enforces by closing
/// the connection): `{"name":"...","notify_msg":"..."}` and its newline,
/// every byte at least once. Its writer escapes bytes above 0x7f as
/// `\uXXXX`, so a frame near the limit may still be too long.
pub fn check_notify_frame(note: &Notification, limit: usize) -> crate::Result<()> {
    const FRAME_TEXT: usize = r#"{"name":"","notify_msg":""}"#.len() + 2;
    let least = note.len().saturating_add(FRAME_TEXT);
    if least <= limit {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "a notification of {} bytes (name and message; a handshake frame of at least {least} bytes) is over the \
         peer's handshake frame limit of {limit} bytes: a peer closes a longer frame unread \
         (MC_HANDSHAKE_MAX_LENGTH, 1 MiB by default). Raise it on both sides, or send less",
        note.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds_with_the_call_named() {
        let e = check(-7, Convention::NegativeErr, "registerLocalMemory").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddressOverlap);
        assert_eq!(e.message(), "registerLocalMemory: Mooncake returned -7 (AddressOverlapped)");
        let e = check(4, Convention::StatusCode, "freeBatchID").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert_eq!(check(2, Convention::StatusCode, "submitTransfer").unwrap_err().kind(), ErrorKind::Busy);
        assert_eq!(
            check(3, Convention::StatusCode, "submitTransfer").unwrap_err().kind(),
            ErrorKind::AddressNotRegistered
        );
        assert_eq!(check(-104, Convention::NegativeErr, "x").unwrap_err().kind(), ErrorKind::PeerUnreachable);
        assert_eq!(check(999, Convention::StatusCode, "x").unwrap_err().kind(), ErrorKind::BackendUnavailable);
        let e = check(-12345, Convention::NegativeErr, "openSegment").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.message(), "openSegment: Mooncake returned unknown code -12345");
        assert!(check(0, Convention::NegativeErr, "x").is_ok());
    }

    #[test]
    fn task_states_are_total() {
        use mooncake_sys::*;
        assert_eq!(task_state(STATUS_WAITING).0, TaskState::Pending);
        assert_eq!(task_state(STATUS_PENDING).0, TaskState::Pending);
        assert_eq!(task_state(STATUS_COMPLETED), (TaskState::Completed, None));
        assert_eq!(task_state(STATUS_TIMEOUT).1.unwrap().0, ErrorKind::Timeout);
        assert_eq!(task_state(STATUS_FAILED).1.unwrap().0, ErrorKind::ConnectionLost);
        assert_eq!(task_state(STATUS_INVALID).1.unwrap().0, ErrorKind::InvalidArgument);
        for odd in [-1, 7, 1000] {
            assert_eq!(task_state(odd).0, TaskState::Failed);
            assert_eq!(task_state(odd).1.unwrap().0, ErrorKind::Protocol);
        }
    }

    #[test]
    fn notifications_as_c_strings_and_their_frame() {
        let (n, m) = notify_cstrings(&Notification::new(b"n\xff".to_vec(), b"\x8b msgpack".to_vec())).unwrap();
        assert_eq!((n.as_bytes(), m.as_bytes()), (&b"n\xff"[..], &b"\x8b msgpack"[..]));
        let e = notify_cstrings(&Notification::new("n", b"a\x00b".to_vec())).unwrap_err();
        assert!(e.message().contains("message has a NUL byte"), "{e}");
        check_notify_frame(&Notification::new("n", vec![b'x'; 1000]), 1 << 20).unwrap();
        let e = check_notify_frame(&Notification::new("kv", vec![b'x'; 8 << 20]), 1 << 20).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("limit of 1048576 bytes") && e.message().contains("MC_HANDSHAKE_MAX_LENGTH"));
    }
}
