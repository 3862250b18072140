//! Where a registered region lives, in Mooncake's location syntax:
//! `"cpu:N"` (host memory, NUMA node N), `"cuda:N"` (device memory of CUDA
//! device N) or `"*"` (let pdx find out at registration).

use std::fmt;

use crate::error::{Error, Result};

/// A location as the caller gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Requested {
    /// `"*"`: ask the CUDA driver (if one loads) what the memory is.
    Detect,
    /// An explicit location.
    At(Location),
}

/// Where a region's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory the CPU can read and write (`cpu:N`; N is informative).
    Host { numa: u32 },
    /// Device memory of CUDA device `ordinal`: the CPU never touches it.
    Cuda { ordinal: u32 },
}

impl Location {
    /// The CUDA device, for device memory.
    pub fn cuda_ordinal(self) -> Option<u32> {
        match self {
            Location::Cuda { ordinal } => Some(ordinal),
            Location::Host { .. } => None,
        }
    }
}

impl Default for Location {
    fn default() -> Self {
        Location::Host { numa: 0 }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host { numa } => write!(f, "cpu:{numa}"),
            Location::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl Requested {
    /// Parse `"cpu:N"`, `"cuda:N"` or `"*"` (surrounding spaces ignored).
    pub fn parse(text: &str) -> Result<Requested> {
        let t = text.trim();
        if t == "*" {
            return Ok(Requested::Detect);
        }
        let bad = || {
            Error::invalid_argument(format!(
                "location {text:?} is not \"cpu:N\", \"cuda:N\" or \"*\" (N a decimal number)"
            ))
        };
        let (kind, n) = t.split_once(':').ok_or_else(bad)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u32 = n.parse().map_err(|_| bad())?;
        match kind {
            "cpu" => Ok(Requested::At(Location::Host { numa: n })),
            "cuda" => Ok(Requested::At(Location::Cuda { ordinal: n })),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Requested {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requested::Detect => f.write_str("*"),
            Requested::At(l) => l.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mooncake_locations() {
        assert_eq!(Requested::parse("*").unwrap(), Requested::Detect);
        assert_eq!(Requested::parse(" cpu:1 ").unwrap(), Requested::At(Location::Host { numa: 1 }));
        assert_eq!(Requested::parse("cuda:3").unwrap(), Requested::At(Location::Cuda { ordinal: 3 }));
        for bad in ["", "cuda", "cuda:", "cuda:-1", "cuda:+1", "gpu:0", "cuda:0x1", "cuda:99999999999", "**"] {
            assert!(Requested::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Location::Cuda { ordinal: 3 }.to_string(), "cuda:3");
        assert_eq!(Requested::parse("cpu:0").unwrap().to_string(), "cpu:0");
    }
}
