//! Who may connect: the address allowlist (`PDX_ALLOWED_PEERS`) checked on
//! every accepted connection before a byte is read from it, and the shared
//! secret (`PDX_PEER_SECRET_FILE`) the handshake and data connections prove
//! knowledge of (see [`super::super::protocol::auth`]). Both are read when an engine starts;
//! a malformed entry or an unfit secret file fails the start, naming it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::settings::Settings;
use crate::config::file::{read_regular_file, ConfigFileError};
use crate::error::{Error, Result};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::access";

/// One allowed block: an address and how many leading bits must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    addr: IpAddr,
    prefix: u8,
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack
/// listener reports for an IPv4 peer) compare as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

impl Block {
    fn parse(entry: &str) -> std::result::Result<Block, String> {
        let (addr, prefix) = match entry.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (entry, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let addr: IpAddr = addr.parse().map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
        let addr = canonical(addr);
        let width = bits(addr).1;
        let prefix = match prefix {
            None => width,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= width => p,
                _ => return Err(format!("prefix length {p:?} is not a number 0..={width}")),
            },
        };
        Ok(Block { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let (want, width) = bits(self.addr);
        let (got, got_width) = bits(canonical(ip));
        if width != got_width {
            return false;
        }
        let shift = u32::from(width - self.prefix);
        // A zero prefix matches every address of the family.
        shift >= u32::from(width) || (want >> shift) == (got >> shift)
    }
}

/// The addresses inbound connections may come from (`None`: any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    blocks: Option<Vec<Block>>,
}

impl Allowlist {
    /// Parse a comma list of addresses and CIDR blocks; the error names the
    /// first malformed entry.
    pub fn parse(text: Option<&str>) -> Result<Allowlist> {
        let Some(text) = text else { return Ok(Allowlist::default()) };
        let blocks = text
            .split(',')
            .map(str::trim)
            .map(|entry| {
                Block::parse(entry).map_err(|why| {
                    Error::invalid_value(format!(
                        "PDX_ALLOWED_PEERS (or engine option allowed_peers): entry {entry:?} is not an address or \
                         CIDR block: {why}"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Allowlist { blocks: Some(blocks) })
    }

    /// Whether a connection from `ip` may be served.
    pub fn admits(&self, ip: IpAddr) -> bool {
        self.blocks.as_ref().is_none_or(|blocks| blocks.iter().any(|b| b.contains(ip)))
    }
}

/// Smallest secret accepted.
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest secret file accepted: a secret needs far less, and the bound
/// keeps a wrong path (a device, a log) from being read without end.
pub(crate) const MAX_SECRET_FILE_BYTES: usize = 16 * 1024;

/// Read the shared secret from `path`: refused (naming the file and why)
/// when it cannot be read, is not a regular file (a symlink is followed),
/// is readable by group or others, holds more than
/// `MAX_SECRET_FILE_BYTES` (16 KiB) or fewer than [`MIN_SECRET_BYTES`] (a
/// trailing newline does not count).
pub fn read_secret(path: &str) -> Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |why: String| {
        Error::invalid_value(format!("PDX_PEER_SECRET_FILE (or engine option peer_secret_file) {path:?}: {why}"))
    };
    let (mut secret, meta) = read_regular_file(path, MAX_SECRET_FILE_BYTES).map_err(|e| match e {
        ConfigFileError::TooLong { len, max } => {
            fail(format!("it holds {len} bytes; a secret file may hold at most {max}"))
        }
        e => fail(e.to_string()),
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(fail(format!("it is readable by group or others (mode {:o}); chmod 600 it", mode & 0o777)));
    }
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Err(fail(format!("it holds {} bytes; at least {MIN_SECRET_BYTES} are needed", secret.len())));
    }
    Ok(secret)
}

/// At most one log line a second per address.
#[derive(Default)]
struct RefusalLog {
    last: HashMap<IpAddr, (Instant, u64)>,
}

/// Addresses remembered for rate-limiting refusal lines.
const MAX_LOGGED_ADDRESSES: usize = 4096;

impl RefusalLog {
    /// Whether to log a refusal of `ip` at `now`, and how many refusals of it
    /// went unlogged since its last line.
    fn should_log(&mut self, ip: IpAddr, now: Instant) -> Option<u64> {
        if self.last.len() >= MAX_LOGGED_ADDRESSES {
            self.last.retain(|_, (t, _)| now.saturating_duration_since(*t) < Duration::from_secs(1));
            if self.last.len() >= MAX_LOGGED_ADDRESSES {
                self.last.clear();
            }
        }
        match self.last.get_mut(&ip) {
            Some((t, suppressed)) if now.saturating_duration_since(*t) < Duration::from_secs(1) => {
                *suppressed += 1;
                None
            }
            Some((t, suppressed)) => {
                *t = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                self.last.insert(ip, (now, 0));
                Some(0)
            }
        }
    }
}

/// An engine's access rules, read at start.
pub struct Access {
    pub allowlist: Allowlist,
    /// The shared secret, when set.
    pub secret: Option<Vec<u8>>,
    log: Mutex<RefusalLog>,
}

impl Access {
    pub fn from_settings(settings: &Settings) -> Result<Access> {
        let allowlist = Allowlist::parse(settings.allowed_peers.as_deref())?;
        let secret = settings.peer_secret_file.as_deref().map(read_secret).transpose()?;
        Ok(Access { allowlist, secret, log: Mutex::new(RefusalLog::default()) })
    }

    /// Log a refused connection from `ip` (`what` says why), at most once a
    /// second per address.
    pub fn log_refusal(&self, ip: IpAddr, what: &str) {
        if let Some(suppressed) = self.log.lock().should_log(ip, Instant::now()) {
            let more = if suppressed > 0 { format!(" ({suppressed} more since the last line)") } else { String::new() };
            log::warn!(target: LOG_TARGET, "refused a connection from {ip}: {what}{more}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_blocks_of_both_families() {
        let a = Allowlist::parse(Some("127.0.0.1/32, 10.1.0.0/16,::1,[fd00::]/8, 192.168.7.9")).unwrap();
        assert!(a.admits(ip("127.0.0.1")));
        assert!(!a.admits(ip("127.0.0.2")));
        assert!(a.admits(ip("10.1.200.3")) && !a.admits(ip("10.2.0.1")));
        assert!(a.admits(ip("::1")) && a.admits(ip("fd12::5")) && !a.admits(ip("fe80::1")));
        assert!(a.admits(ip("::ffff:192.168.7.9")), "IPv4-mapped compares as IPv4");
        assert!(a.admits(ip("192.168.7.9")) && !a.admits(ip("192.168.7.10")));
        let any = Allowlist::parse(Some("0.0.0.0/0")).unwrap();
        assert!(any.admits(ip("8.8.8.8")) && !any.admits(ip("::2")));
        assert!(Allowlist::parse(None).unwrap().admits(ip("1.2.3.4")));
    }

    #[test]
    fn a_malformed_entry_is_named() {
        for (text, entry) in
            [("127.0.0.1,10.0.0.0/33", "10.0.0.0/33"), ("localhost", "localhost"), ("1.2.3.4,", ""), ("::1/x", "::1/x")]
        {
            let e = Allowlist::parse(Some(text)).unwrap_err();
            assert!(e.message().contains(&format!("entry {entry:?}")), "{text}: {e}");
        }
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_per_address() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(log.should_log(ip("1.1.1.1"), t0), Some(0));
        assert_eq!(log.should_log(ip("1.1.1.1"), t0 + Duration::from_millis(10)), None);
        assert_eq!(log.should_log(ip("1.1.1.2"), t0 + Duration::from_millis(20)), Some(0));
        assert_eq!(log.should_log(ip("1.1.1.1"), t0 + Duration::from_millis(1100)), Some(1));
    }

    #[test]
    fn the_secret_file_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, format!("{}\n", "k".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(path.to_str().unwrap()).unwrap().len(), 32);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_secret(path.to_str().unwrap()).unwrap_err();
        assert!(e.message().contains("readable by group or others") && e.message().contains("secret"), "{e}");
        std::fs::write(&path, "short").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_secret(path.to_str().unwrap()).unwrap_err().message().contains("holds 5 bytes"));
        assert!(read_secret("/nonexistent/pdx-secret").unwrap_err().message().contains("cannot read it"));
    }

    #[test]
    fn a_secret_file_that_is_not_a_regular_file_or_too_long_is_refused_at_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_secret(fifo.to_str().unwrap()).unwrap_err();
        assert!(e.message().contains("fifo\": it is a FIFO (named pipe), not a regular file"), "{e}");
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_secret(zero.to_str().unwrap()).unwrap_err();
        assert!(e.message().contains("zero\": it is a character device, not a regular file"), "{e}");
        let long = dir.path().join("long");
        std::fs::write(&long, vec![b'k'; MAX_SECRET_FILE_BYTES + 1]).unwrap();
        std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_secret(long.to_str().unwrap()).unwrap_err();
        assert!(e.message().contains("it holds 16385 bytes; a secret file may hold at most 16384"), "{e}");
        std::fs::write(&long, vec![b'k'; MAX_SECRET_FILE_BYTES]).unwrap();
        assert_eq!(read_secret(long.to_str().unwrap()).unwrap().len(), MAX_SECRET_FILE_BYTES);
    }
}
