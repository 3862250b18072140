//! Mooncake's return values and task states as pdx errors and states.

use mooncake_sys::{Code, Convention, McError};

use crate::error::{Error, ErrorKind};
use crate::transfer::TaskState;

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
}
