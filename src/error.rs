//! The one error type of the pure-Rust core.
//!
//! Every fallible core function returns [`Result<T>`]. The `kind` decides the
//! C status code (the `ffi` layer maps kinds to codes one to one); the
//! `message` is the human text that ends up in `pdx_last_error_message()` and
//! is copied byte for byte from SGLang where SGLang defines the text.

use std::fmt;

/// Declares [`ErrorKind`] and [`ErrorKind::ALL`] from one list, so no kind
/// can be left out of `ALL` (the status table's tests walk it).
macro_rules! error_kinds {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $kind:ident,)* }) => {
        $(#[$meta])*
        pub enum $name { $($(#[$doc])* $kind,)* }

        impl $name {
            /// Every kind, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$kind),*];
        }
    };
}

error_kinds! {
    /// What went wrong, coarse enough to act on from C.
    ///
    /// Variants are never removed or renumbered: each maps to a fixed C status
    /// (the table in `ffi/status.rs`, one row per kind).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ErrorKind {
        /// A required pointer argument was NULL.
        NullArgument,
        /// A string argument was not valid UTF-8.
        InvalidUtf8,
        /// An argument is malformed or out of range (API misuse).
        InvalidArgument,
        /// A panic was caught at the ABI boundary (a pdx bug).
        Panic,
        /// An argument key names no known field.
        UnknownKey,
        /// A value does not parse for its field, or is not an allowed choice.
        InvalidValue,
        /// SGLang would raise `ValueError`.
        ValueError,
        /// SGLang would fail an `assert` (`AssertionError`).
        AssertionError,
        /// SGLang would raise `RuntimeError` (files, sysfs).
        RuntimeError,
        /// The requested transport protocol is not known.
        UnknownProtocol,
        /// The backend needed for this protocol is not available.
        BackendUnavailable,
        /// An index is past the end of a list.
        IndexOutOfRange,
        /// A local operating-system call failed (bind, spawn, ...).
        Io,
        /// A handle is stale, freed or was never issued.
        InvalidHandle,
        /// A local address range is not inside one registered region.
        AddressNotRegistered,
        /// The peer refused the request (address outside its registered memory).
        RemoteRejected,
        /// A region to register overlaps one already registered.
        AddressOverlap,
        /// A deadline passed.
        Timeout,
        /// The peer could not be reached (connect or handshake failed).
        PeerUnreachable,
        /// The connection to the peer broke during a transfer.
        ConnectionLost,
        /// The peer sent bytes that break the wire protocol.
        Protocol,
        /// The operation cannot run now (in-flight work, full queue).
        Busy,
        /// The named thing does not exist (region, peer).
        NotFound,
        /// The engine is shutting down.
        Shutdown,
        /// The peer rejected a notification.
        NotifyRejected,
        /// Device memory was asked for but no usable CUDA driver or device is
        /// there (`PDX_CUDA_LIB`, device ordinal).
        DeviceUnavailable,
        /// A CUDA driver call failed; the message has the driver's error name
        /// and text.
        Device,
        /// The caller cancelled the transfer (never a failure pdx chose).
        Canceled,
    }
}

/// A core error: a kind plus the exact message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// Result alias used throughout the core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Build an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    /// The kind, which decides the C status code.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefix the message with context, keeping the kind.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Error { kind: self.kind, message: format!("{what}: {}", self.message) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Shorthand constructors, one per frequently used kind.
macro_rules! ctor {
    ($($name:ident => $kind:ident),* $(,)?) => {
        impl Error {
            $(
                #[doc = concat!("An error of kind [`ErrorKind::", stringify!($kind), "`].")]
                pub fn $name(message: impl Into<String>) -> Self {
                    Error::new(ErrorKind::$kind, message)
                }
            )*
        }
    };
}

ctor! {
    invalid_argument => InvalidArgument,
    invalid_value => InvalidValue,
    value_error => ValueError,
    assertion_error => AssertionError,
    runtime_error => RuntimeError,
    io => Io,
    protocol => Protocol,
    timeout => Timeout,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_kind_and_prefixes_message() {
        let e = Error::value_error("bad").context("while parsing");
        assert_eq!(e.kind(), ErrorKind::ValueError);
        assert_eq!(e.message(), "while parsing: bad");
        assert_eq!(e.to_string(), "while parsing: bad");
    }
}
