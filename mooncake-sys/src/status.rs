//! Mooncake's two return conventions, decoded into one value.
//!
//! `submitTransfer`, `submitTransferWithNotify`, `getTransferStatus` and
//! `freeBatchID` return the *positive* `Status::Code` number
//! (`include/common/base/status.h`). The older int-returning calls
//! (registration, segments, notifications) return the *negative* `ERR_*`
//! values of `include/error.h`, or a bare `-1`. The two tables mirror each
//! other (`Status` code n is `ERR_` -n), except `NotImplemented`: 999 vs -303.

use std::fmt;

/// One Mooncake error, whatever convention produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    TooManyRequests,
    AddressNotRegistered,
    BatchBusy,
    DeviceNotFound,
    AddressOverlapped,
    NotSupportedTransport,
    Dns,
    Socket,
    MalformedJson,
    RejectHandshake,
    Metadata,
    Endpoint,
    Context,
    Numa,
    Clock,
    Memory,
    NotImplemented,
    /// A number neither table knows (kept as returned).
    Unknown(i32),
}

impl Code {
    fn from_magnitude(n: i32) -> Option<Code> {
        Some(match n {
            1 => Code::InvalidArgument,
            2 => Code::TooManyRequests,
            3 => Code::AddressNotRegistered,
            4 => Code::BatchBusy,
            6 => Code::DeviceNotFound,
            7 => Code::AddressOverlapped,
            8 => Code::NotSupportedTransport,
            101 => Code::Dns,
            102 => Code::Socket,
            103 => Code::MalformedJson,
            104 => Code::RejectHandshake,
            200 => Code::Metadata,
            201 => Code::Endpoint,
            202 => Code::Context,
            300 => Code::Numa,
            301 => Code::Clock,
            302 => Code::Memory,
            _ => return None,
        })
    }

    /// Mooncake's name for the code (`Status::Code` spelling).
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "InvalidArgument",
            Code::TooManyRequests => "TooManyRequests",
            Code::AddressNotRegistered => "AddressNotRegistered",
            Code::BatchBusy => "BatchBusy",
            Code::DeviceNotFound => "DeviceNotFound",
            Code::AddressOverlapped => "AddressOverlapped",
            Code::NotSupportedTransport => "NotSupportedTransport",
            Code::Dns => "Dns",
            Code::Socket => "Socket",
            Code::MalformedJson => "MalformedJson",
            Code::RejectHandshake => "RejectHandshake",
            Code::Metadata => "Metadata",
            Code::Endpoint => "Endpoint",
            Code::Context => "Context",
            Code::Numa => "Numa",
            Code::Clock => "Clock",
            Code::Memory => "Memory",
            Code::NotImplemented => "NotImplemented",
            Code::Unknown(_) => "unknown",
        }
    }
}

/// Which convention a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    /// Positive `Status::Code` (submit, status, free batch).
    StatusCode,
    /// Negative `ERR_*` or bare -1 (everything else).
    NegativeErr,
}

/// A non-zero return value of a Mooncake call, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McError {
    pub code: Code,
    /// The raw value Mooncake returned.
    pub raw: i32,
}

impl fmt::Display for McError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Code::Unknown(_) => write!(f, "Mooncake returned unknown code {}", self.raw),
            c => write!(f, "Mooncake returned {} ({})", self.raw, c.name()),
        }
    }
}

/// Decode a return value: `Ok(())` for 0, else the error.
///
/// Either sign is accepted whatever `convention` says (Mooncake versions
/// differ), so the convention only breaks ties: `NotImplemented` is 999 as a
/// status code and -303 as an `ERR_*` value.
pub fn check(raw: i32, convention: Convention) -> Result<(), McError> {
    if raw == 0 {
        return Ok(());
    }
    let code = match (raw, convention) {
        (999, _) | (-303, _) => Code::NotImplemented,
        (n, _) if n > 0 => Code::from_magnitude(n).unwrap_or(Code::Unknown(raw)),
        (n, _) => n.checked_neg().and_then(Code::from_magnitude).unwrap_or(Code::Unknown(raw)),
    };
    Err(McError { code, raw })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_conventions_decode_to_the_same_code() {
        assert_eq!(check(0, Convention::StatusCode), Ok(()));
        assert_eq!(check(0, Convention::NegativeErr), Ok(()));
        for (pos, neg, code) in [
            (1, -1, Code::InvalidArgument),
            (2, -2, Code::TooManyRequests),
            (3, -3, Code::AddressNotRegistered),
            (4, -4, Code::BatchBusy),
            (6, -6, Code::DeviceNotFound),
            (7, -7, Code::AddressOverlapped),
            (8, -8, Code::NotSupportedTransport),
            (101, -101, Code::Dns),
            (102, -102, Code::Socket),
            (103, -103, Code::MalformedJson),
            (104, -104, Code::RejectHandshake),
            (200, -200, Code::Metadata),
            (201, -201, Code::Endpoint),
            (202, -202, Code::Context),
            (300, -300, Code::Numa),
            (301, -301, Code::Clock),
            (302, -302, Code::Memory),
            (999, -303, Code::NotImplemented),
        ] {
            assert_eq!(check(pos, Convention::StatusCode).unwrap_err().code, code, "{pos}");
            assert_eq!(check(neg, Convention::NegativeErr).unwrap_err().code, code, "{neg}");
            assert_eq!(check(neg, Convention::NegativeErr).unwrap_err().raw, neg);
        }
    }

    #[test]
    fn unknown_values_are_kept_not_guessed() {
        for raw in [5, 42, -5, -999, i32::MIN, i32::MAX] {
            let e = check(raw, Convention::NegativeErr).unwrap_err();
            assert_eq!(e.code, Code::Unknown(raw));
            assert_eq!(e.to_string(), format!("Mooncake returned unknown code {raw}"));
        }
        assert_eq!(check(-102, Convention::NegativeErr).unwrap_err().to_string(), "Mooncake returned -102 (Socket)");
    }
}
