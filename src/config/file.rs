//! Reading a file that configuration names (`PDX_PEER_SECRET_FILE`, a
//! per-GPU IB device mapping `*.json`): only a regular file (a symlink is
//! followed), and only up to a bound, so that a FIFO cannot block engine
//! init and a character device such as `/dev/zero` cannot fill memory.
//!
//! Callers turn a [`ConfigFileError`] into their own message (SGLang's
//! texts for the IB mapping, pdx's for the secret).

use std::fmt;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

/// Why a configured file was not read.
#[derive(Debug)]
pub enum ConfigFileError {
    /// `stat` failed: missing, no permission on a directory, a loop, ...
    Unreachable(std::io::Error),
    /// It exists but is not a regular file; the text says what it is
    /// ("a FIFO", "a character device", ...).
    NotRegular(&'static str),
    /// It is longer than `max` bytes (`len` as `stat` saw it, or `max + 1`
    /// when it grew while being read).
    TooLong { len: u64, max: usize },
    /// Opening or reading it failed.
    Io(std::io::Error),
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigFileError::Unreachable(e) | ConfigFileError::Io(e) => write!(f, "cannot read it: {e}"),
            ConfigFileError::NotRegular(what) => write!(f, "it is {what}, not a regular file"),
            ConfigFileError::TooLong { len, max } => write!(f, "it holds {len} bytes, over the limit of {max}"),
        }
    }
}

/// What a file of type `ty` is, in words, for a message.
fn describe(ty: std::fs::FileType) -> &'static str {
    if ty.is_dir() {
        "a directory"
    } else if ty.is_fifo() {
        "a FIFO (named pipe)"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn check_regular(meta: &Metadata) -> Result<(), ConfigFileError> {
    if meta.file_type().is_file() {
        Ok(())
    } else {
        Err(ConfigFileError::NotRegular(describe(meta.file_type())))
    }
}

/// Read the regular file at `path` (following symlinks), at most `max`
/// bytes; also return its metadata (as of the open file, for a mode check).
///
/// A path that is not a regular file is refused before it is opened; it is
/// opened non-blocking and checked again on the open descriptor, so one
/// swapped for a FIFO in between cannot block either. A file longer than
/// `max` is refused, and never more than `max + 1` bytes are read.
pub fn read_regular_file(path: &str, max: usize) -> Result<(Vec<u8>, Metadata), ConfigFileError> {
    check_regular(&std::fs::metadata(path).map_err(ConfigFileError::Unreachable)?)?;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ConfigFileError::Io)?;
    let meta = file.metadata().map_err(ConfigFileError::Io)?;
    check_regular(&meta)?;
    if meta.len() > max as u64 {
        return Err(ConfigFileError::TooLong { len: meta.len(), max });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max as u64 + 1).read_to_end(&mut bytes).map_err(ConfigFileError::Io)?;
    if bytes.len() > max {
        return Err(ConfigFileError::TooLong { len: bytes.len() as u64, max });
    }
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn refusal(path: &str, max: usize) -> ConfigFileError {
        read_regular_file(path, max).map(|_| ()).unwrap_err()
    }

    #[test]
    fn a_regular_file_within_the_bound_is_read_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"0123456789").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let (bytes, meta) = read_regular_file(link.to_str().unwrap(), 10).unwrap();
        assert_eq!((bytes.as_slice(), meta.len()), (&b"0123456789"[..], 10));
        let e = refusal(file.to_str().unwrap(), 9);
        assert!(matches!(e, ConfigFileError::TooLong { len: 10, max: 9 }), "{e:?}");
        assert_eq!(e.to_string(), "it holds 10 bytes, over the limit of 9");
    }

    #[test]
    fn a_fifo_is_refused_at_once_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let start = Instant::now();
        let e = refusal(fifo.to_str().unwrap(), 4096);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(e.to_string(), "it is a FIFO (named pipe), not a regular file");
    }

    #[test]
    fn devices_directories_and_missing_paths_are_refused_naming_what_they_are() {
        assert_eq!(refusal("/dev/zero", 4096).to_string(), "it is a character device, not a regular file");
        assert_eq!(refusal("/tmp", 4096).to_string(), "it is a directory, not a regular file");
        let e = refusal("/nonexistent/pdx-file", 4096);
        assert!(matches!(&e, ConfigFileError::Unreachable(io) if io.kind() == std::io::ErrorKind::NotFound), "{e:?}");
    }
}
