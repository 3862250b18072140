//! Mooncake's two return conventions, produced from pdx's errors.
//!
//! Calls that forward one of Mooncake's `Status` values (`submitTransfer`,
//! `submitTransferWithNotify`, `getTransferStatus`, `freeBatchID`,
//! `getNicLoadStats` after its argument check) return the code as a positive
//! number; every other int-returning call returns the same error negated, as
//! Mooncake's `error.h` numbers it (not implemented is 999 positive, -303
//! negative; an unsupported transport has no negative form and reads -1).

use std::ffi::c_int;

use mooncake_sys::Code;
use pdx::ErrorKind;

/// Which convention a call returns its errors in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A positive `Status` code.
    Status,
    /// A negative `error.h` value.
    Negative,
}

/// One failure of a call: Mooncake's code for it and pdx's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McError {
    pub code: Code,
    pub message: String,
}

pub type McResult<T> = std::result::Result<T, McError>;

impl McError {
    pub fn new(code: Code, message: impl Into<String>) -> McError {
        McError { code, message: message.into() }
    }

    /// Mooncake's "invalid argument", the answer to every malformed call.
    pub fn invalid(message: impl Into<String>) -> McError {
        McError::new(Code::InvalidArgument, message)
    }

    /// The integer a call of `family` returns for this error.
    pub fn value(&self, family: Family) -> c_int {
        let magnitude = match self.code {
            Code::InvalidArgument | Code::Unknown(_) => 1,
            Code::TooManyRequests => 2,
            Code::AddressNotRegistered => 3,
            Code::BatchBusy => 4,
            Code::DeviceNotFound => 6,
            Code::AddressOverlapped => 7,
            Code::NotSupportedTransport => 8,
            Code::Dns => 101,
            Code::Socket => 102,
            Code::MalformedJson => 103,
            Code::RejectHandshake => 104,
            Code::Metadata => 200,
            Code::Endpoint => 201,
            Code::Context => 202,
            Code::Numa => 300,
            Code::Clock => 301,
            Code::Memory => 302,
            Code::NotImplemented => 999,
        };
        match (family, self.code) {
            (Family::Status, _) => magnitude,
            (Family::Negative, Code::NotImplemented) => -303,
            (Family::Negative, Code::NotSupportedTransport) => -1,
            (Family::Negative, _) => -magnitude,
        }
    }
}

/// Mooncake's code for a pdx error kind: misuse is "invalid argument";
/// the rest names what Mooncake's engine reports for the same failure.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::AddressNotRegistered | ErrorKind::RemoteRejected => Code::AddressNotRegistered,
        ErrorKind::AddressOverlap => Code::AddressOverlapped,
        ErrorKind::Busy => Code::BatchBusy,
        ErrorKind::BackendUnavailable => Code::NotSupportedTransport,
        ErrorKind::PeerUnreachable
        | ErrorKind::ConnectionLost
        | ErrorKind::Timeout
        | ErrorKind::Io
        | ErrorKind::Shutdown
        | ErrorKind::Canceled => Code::Socket,
        ErrorKind::Protocol => Code::MalformedJson,
        ErrorKind::NotifyRejected => Code::RejectHandshake,
        ErrorKind::NotFound => Code::Metadata,
        ErrorKind::DeviceUnavailable => Code::DeviceNotFound,
        ErrorKind::Device => Code::Context,
        ErrorKind::NullArgument
        | ErrorKind::InvalidUtf8
        | ErrorKind::InvalidArgument
        | ErrorKind::Panic
        | ErrorKind::UnknownKey
        | ErrorKind::InvalidValue
        | ErrorKind::ValueError
        | ErrorKind::AssertionError
        | ErrorKind::RuntimeError
        | ErrorKind::UnknownProtocol
        | ErrorKind::IndexOutOfRange
        | ErrorKind::InvalidHandle => Code::InvalidArgument,
    }
}

impl From<pdx::Error> for McError {
    fn from(e: pdx::Error) -> McError {
        McError::new(code_of(e.kind()), e.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of the spec's two tables, both conventions.
    #[test]
    fn both_conventions_number_as_mooncake() {
        for (code, pos, neg) in [
            (Code::InvalidArgument, 1, -1),
            (Code::TooManyRequests, 2, -2),
            (Code::AddressNotRegistered, 3, -3),
            (Code::BatchBusy, 4, -4),
            (Code::DeviceNotFound, 6, -6),
            (Code::AddressOverlapped, 7, -7),
            (Code::NotSupportedTransport, 8, -1),
            (Code::Dns, 101, -101),
            (Code::Socket, 102, -102),
            (Code::MalformedJson, 103, -103),
            (Code::RejectHandshake, 104, -104),
            (Code::Metadata, 200, -200),
            (Code::Endpoint, 201, -201),
            (Code::Context, 202, -202),
            (Code::Numa, 300, -300),
            (Code::Clock, 301, -301),
            (Code::Memory, 302, -302),
            (Code::NotImplemented, 999, -303),
        ] {
            let e = McError::new(code, "x");
            assert_eq!((e.value(Family::Status), e.value(Family::Negative)), (pos, neg), "{code:?}");
            // What mooncake-sys decodes from the value is the code again.
            if code != Code::NotSupportedTransport {
                assert_eq!(mooncake_sys::check(neg, mooncake_sys::Convention::NegativeErr).unwrap_err().code, code);
            }
            assert_eq!(mooncake_sys::check(pos, mooncake_sys::Convention::StatusCode).unwrap_err().code, code);
        }
    }

    #[test]
    fn every_kind_has_a_code_that_is_never_zero() {
        for kind in ErrorKind::ALL {
            let e = McError::from(pdx::Error::new(*kind, "m"));
            assert!(e.value(Family::Negative) < 0 && e.value(Family::Status) > 0, "{kind:?}");
            assert_eq!(e.message, "m");
        }
    }
}
