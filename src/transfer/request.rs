//! What a transfer asks for: local memory, a remote address, a length, and
//! which way the bytes go.

use crate::error::{Error, ErrorKind, Result};

/// Which way a request moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Remote memory into local memory.
    Read,
    /// Local memory into remote memory.
    Write,
}

impl Direction {
    /// The operation's name in messages (`"READ"` / `"WRITE"`), as Mooncake
    /// spells it.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Read => "READ",
            Direction::Write => "WRITE",
        }
    }
}

/// One entry of a batch: local memory, remote address, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub local: usize,
    pub remote: u64,
    pub len: usize,
}

impl Request {
    /// Refuse requests no backend may start: a NULL local address with a
    /// length, or a range that wraps around.
    pub fn validate_all(reqs: &[Request]) -> Result<()> {
        for (i, r) in reqs.iter().enumerate() {
            if r.len > 0 && r.local == 0 {
                return Err(Error::new(ErrorKind::NullArgument, format!("request {i}: local address is NULL")));
            }
            if r.local.checked_add(r.len).is_none() || r.remote.checked_add(r.len as u64).is_none() {
                return Err(Error::invalid_argument(format!("request {i}: address + length overflows")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_refuses_null_and_wrapping_ranges() {
        let ok = Request { local: 0x1000, remote: 0x2000, len: 16 };
        assert!(Request::validate_all(&[ok, Request { local: 0, remote: 0, len: 0 }]).is_ok());
        let null = Request { local: 0, remote: 0x2000, len: 1 };
        assert_eq!(Request::validate_all(&[ok, null]).unwrap_err().kind(), ErrorKind::NullArgument);
        let wraps = Request { local: 0x1000, remote: u64::MAX, len: 2 };
        assert_eq!(Request::validate_all(&[wraps]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let wraps_local = Request { local: usize::MAX, remote: 0, len: 2 };
        assert_eq!(
            Request::validate_all(&[wraps_local]).unwrap_err().message(),
            "request 0: address + length overflows"
        );
    }
}
