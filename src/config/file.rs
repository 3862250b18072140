//! Reading a file that configuration names (`PDX_PEER_SECRET_FILE`, a
//! per-GPU IB device mapping `*.json`): only a regular file (a symlink is
//! followed), and only up to a bound, so that a FIFO cannot block engine
//! init and a character device such as `/dev/zero` cannot fill memory; and
//! only a file whose contents are its size: a file of a kernel
//! pseudo-filesystem (`/proc`, `/sys`, ...), which `stat` calls regular but
//! whose bytes the kernel makes up when read (`/proc/self/environ`, or
//! `/proc/kmsg`, which a read consumes), is refused by what `fstatfs` says
//! its filesystem is, before a byte is read.
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
    /// A file of a kernel pseudo-filesystem, or one whose contents are not
    /// its size; the text says which.
    Pseudo(&'static str),
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
            ConfigFileError::Pseudo(what) => write!(f, "it is {what}, not a file of stored bytes"),
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

/// The kernel pseudo-filesystem the open file `file` is on, by its magic
/// number (`statfs(2)`), if it is on one.
fn pseudo_filesystem(file: &File) -> Option<&'static str> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed statfs is a valid out-parameter.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid open descriptor and a writable statfs.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return Some("a file whose filesystem the kernel does not name (fstatfs failed)");
    }
    // Magic numbers of <linux/magic.h>.
    Some(match fs.f_type as u64 {
        0x9fa0 => "a file of /proc (procfs)",
        0x6265_6572 => "a file of /sys (sysfs)",
        0x6462_6720 => "a file of debugfs",
        0x7472_6163 => "a file of tracefs",
        0x7363_6673 => "a file of securityfs",
        0x0027_e0eb | 0x6367_7270 => "a file of a cgroup filesystem",
        0xcafe_4a11 => "a file of the BPF filesystem",
        0x6265_6570 => "a file of configfs",
        0x6165_676c => "a file of pstore",
        0xde5e_81e4 => "a file of efivarfs",
        0x6e73_6673 => "a file of nsfs",
        0x5346_4846 => "a file of hugetlbfs",
        _ => return None,
    })
}

/// Read the regular file at `path` (following symlinks), at most `max`
/// bytes; also return its metadata (as of the open file, for a mode check).
///
/// A path that is not a regular file is refused before it is opened; it is
/// opened non-blocking and checked again on the open descriptor, so one
/// swapped for a FIFO in between cannot block either. A file longer than
/// `max` is refused, and never more than `max + 1` bytes are read. A file
/// of a pseudo-filesystem ([`pseudo_filesystem`]) is refused unread; any
/// other file must hold exactly the bytes its size says (a size of 0 is
/// taken as empty without a read).
pub fn read_regular_file(path: &str, max: usize) -> Result<(Vec<u8>, Metadata), ConfigFileError> {
    check_regular(&std::fs::metadata(path).map_err(ConfigFileError::Unreachable)?)?;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ConfigFileError::Io)?;
    let meta = file.metadata().map_err(ConfigFileError::Io)?;
    check_regular(&meta)?;
    if let Some(what) = pseudo_filesystem(&file) {
        return Err(ConfigFileError::Pseudo(what));
    }
    if meta.len() > max as u64 {
        return Err(ConfigFileError::TooLong { len: meta.len(), max });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if meta.len() == 0 {
        return Ok((bytes, meta));
    }
    file.take(meta.len() + 1).read_to_end(&mut bytes).map_err(ConfigFileError::Io)?;
    if bytes.len() as u64 != meta.len() {
        return Err(ConfigFileError::Pseudo("a file whose contents are not its size (it changed while read)"));
    }
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn pseudo_files_are_refused_unread_and_an_empty_file_is_empty() {
        // Mode 0400 and size 0 in `stat`, yet the kernel makes up its bytes.
        for path in ["/proc/self/environ", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"] {
            if std::fs::metadata(path).is_err() {
                continue;
            }
            let e = refusal(path, 4096);
            assert!(matches!(e, ConfigFileError::Pseudo(_)), "{path}: {e:?}");
            assert!(e.to_string().contains("not a file of stored bytes"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(read_regular_file(empty.to_str().unwrap(), 10).unwrap().0.is_empty());
    }

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
