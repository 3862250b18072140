//! Cross-memory attach: one copy between this process and another on the
//! same host (`process_vm_readv` / `process_vm_writev`), only while the
//! process that was checked ([`super::kernel`]) is the one its pid names.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The initiator process a same-host link was granted to, pinned by a
/// pidfd taken before its credentials and its socket were checked.
///
/// `process_vm_readv`/`writev` take a bare pid, so every copy is bracketed:
/// - before it, the pidfd must report the process running (a copy for a
///   process that has exited never starts);
/// - after it, the same: a process still running then held its pid during
///   the whole copy (a pid is never given to another process before its
///   holder has exited and been reaped), so the bytes moved were its own;
///   otherwise the copy is reported failed, and bytes it pulled in are
///   wiped before anything else reads them;
/// - in between, the kernel itself decides whom the copy may touch: copying
///   threads give up `CAP_SYS_PTRACE` ([`shed_ptrace_capability`]), so a
///   pid that changed hands inside that window reaches only a dumpable
///   process running entirely as this engine's user, which that user (the
///   initiator's, by the kernel's account) can read and write anyway. A
///   set-uid exec makes the named process undumpable with mixed
///   credentials: the kernel refuses every copy from then on.
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: libc::pid_t,
    pidfd: OwnedFd,
}

impl PeerProcess {
    /// Pin process `pid` (`ESRCH` if there is none).
    pub fn open(pid: u32) -> io::Result<PeerProcess> {
        let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        if pid <= 0 {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(PeerProcess { pid, pidfd })
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Whether the pinned process is still running (its pid names it).
    pub fn running(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        loop {
            // SAFETY: one pollfd on the stack, no wait; a pidfd turns readable
            // once its process has exited.
            let n = unsafe { libc::poll(&mut pfd, 1, 0) };
            if n >= 0 {
                return n == 0;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return false;
            }
        }
    }

    /// `Err(ESRCH)` unless the pinned process is still running.
    fn still_running(&self) -> io::Result<()> {
        if self.running() {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ESRCH))
        }
    }

    /// Copy `len` bytes from `remote` in the process to `local`, all of them
    /// (the kernel may copy fewer per call). The kernel checks the remote
    /// range (an unmapped one is `EFAULT`).
    ///
    /// # Safety
    /// `local` must be writable for `len` bytes.
    pub unsafe fn read_from(&self, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
        // SAFETY: as the caller vouches.
        unsafe { self.bracketed(&[(local, len)], true, || copy(self.pid, remote, local, len, false).map(|()| len)) }
            .map(|_| ())
    }

    /// Copy `len` bytes from `local` to `remote` in the process.
    ///
    /// # Safety
    /// `local` must be readable for `len` bytes.
    pub unsafe fn write_to(&self, remote: u64, local: *const u8, len: usize) -> io::Result<()> {
        let local = local.cast_mut();
        // SAFETY: nothing is written locally for a push.
        unsafe { self.bracketed(&[(local, len)], false, || copy(self.pid, remote, local, len, true).map(|()| len)) }
            .map(|_| ())
    }

    /// One vectored copy between `locals` here and `remotes` in the process
    /// (pairs of address and length, the same total on both sides; `pull`
    /// reads from `remotes`, otherwise they are written): the bytes copied,
    /// which the kernel may stop short of at an iovec boundary.
    ///
    /// # Safety
    /// Every local range must be writable (for `pull`) or readable for the
    /// duration of the call.
    pub unsafe fn copy_vectored(
        &self,
        locals: &[(*mut u8, usize)],
        remotes: &[(u64, usize)],
        pull: bool,
    ) -> io::Result<usize> {
        // SAFETY: as the caller vouches.
        unsafe { self.bracketed(locals, pull, || copy_vectored(self.pid, locals, remotes, pull)) }
    }

    /// Run `copy` between the two checks of [`PeerProcess`]; if the process
    /// exited meanwhile, the local bytes a pull may have written are wiped.
    ///
    /// # Safety
    /// With `pull`, every range of `locals` must be writable.
    unsafe fn bracketed(
        &self,
        locals: &[(*mut u8, usize)],
        pull: bool,
        copy: impl FnOnce() -> io::Result<usize>,
    ) -> io::Result<usize> {
        shed_ptrace_capability()?;
        self.still_running()?;
        let copied = copy();
        if self.running() {
            return copied;
        }
        if pull && copied.is_ok() {
            for &(p, n) in locals {
                // SAFETY: writable, as the caller vouches.
                unsafe { std::ptr::write_bytes(p, 0, n) };
            }
        }
        Err(io::Error::from_raw_os_error(libc::ESRCH))
    }
}

/// Drop `CAP_SYS_PTRACE` from this thread's effective capabilities, once
/// per thread (capabilities are per thread; other threads of the process
/// keep theirs). Then the kernel lets this thread's cross-process copies
/// reach only dumpable processes whose real, effective and saved ids all
/// match this thread's: even a root target cannot be made to touch another
/// user's memory. The permitted set keeps it, for
/// [`with_ptrace_capability`].
pub(crate) fn shed_ptrace_capability() -> io::Result<()> {
    thread_local! {
        static SHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if SHED.with(|s| s.get()) {
        return Ok(());
    }
    set_ptrace_effective(false)?;
    SHED.with(|s| s.set(true));
    Ok(())
}

/// Run `f` with `CAP_SYS_PTRACE` in this thread's effective set where the
/// thread is permitted it, then shed it again: for reading `/proc/<pid>/fd`
/// and `/proc/<pid>/ns` of a process whose uids were already checked (the
/// kernel refuses those reads to a thread that has fewer effective
/// capabilities than the process has permitted ones, as root's engines have).
pub(crate) fn with_ptrace_capability<T>(f: impl FnOnce() -> T) -> io::Result<T> {
    shed_ptrace_capability()?;
    let raised = set_ptrace_effective(true)?;
    let out = f();
    if raised {
        set_ptrace_effective(false)?;
    }
    Ok(out)
}

/// Put `CAP_SYS_PTRACE` in or out of this thread's effective set (in only
/// where the permitted set has it): whether the set changed.
fn set_ptrace_effective(on: bool) -> io::Result<bool> {
    // The kernel's capability ABI (linux/capability.h): version 3 uses two
    // 32-bit words per set; pid 0 is the calling thread.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_PTRACE: u32 = 19;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two Data words for version 3 into `data`.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let bit = 1u32 << CAP_SYS_PTRACE;
    let effective = if on && data[0].permitted & bit != 0 { data[0].effective | bit } else { data[0].effective & !bit };
    if effective == data[0].effective {
        return Ok(false);
    }
    data[0].effective = effective;
    // SAFETY: capset reads the header and two Data words; the effective set
    // stays within the permitted one.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// One vectored copy with process `pid` (see [`PeerProcess::copy_vectored`]).
///
/// # Safety
/// Every local range must be writable (for `pull`) or readable for the
/// duration of the call.
unsafe fn copy_vectored(
    pid: libc::pid_t,
    locals: &[(*mut u8, usize)],
    remotes: &[(u64, usize)],
    pull: bool,
) -> io::Result<usize> {
    #[cfg(test)]
    injected(locals.first().map_or(std::ptr::null_mut(), |l| l.0))?;
    let l: Vec<libc::iovec> = locals.iter().map(|&(p, n)| libc::iovec { iov_base: p.cast(), iov_len: n }).collect();
    let r: Vec<libc::iovec> =
        remotes.iter().map(|&(a, n)| libc::iovec { iov_base: a as usize as *mut libc::c_void, iov_len: n }).collect();
    loop {
        // SAFETY: the local iovecs are memory the caller vouches for, the
        // remote ones are checked by the kernel (EFAULT); counts fit c_ulong.
        let n = unsafe {
            if pull {
                libc::process_vm_readv(pid, l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
            } else {
                libc::process_vm_writev(pid, l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
            }
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Tests: the next copy whose local side starts in `start..end` fails with
/// `errno` (`(start, end, errno)`; tests run in parallel, each on its own memory).
#[cfg(test)]
pub(crate) static FAIL_NEXT: parking_lot::Mutex<Option<(usize, usize, i32)>> = parking_lot::Mutex::new(None);

/// Tests: the failure injected for a copy starting at `local`, once.
#[cfg(test)]
fn injected(local: *mut u8) -> io::Result<()> {
    let mut fail = FAIL_NEXT.lock();
    match *fail {
        Some((start, end, errno)) if (start..end).contains(&(local as usize)) => {
            *fail = None;
            Err(io::Error::from_raw_os_error(errno))
        }
        _ => Ok(()),
    }
}

/// Both directions; `local` is valid for `len` bytes as the callers vouch.
fn copy(pid: libc::pid_t, remote: u64, local: *mut u8, len: usize, write: bool) -> io::Result<()> {
    #[cfg(test)]
    injected(local)?;
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
        let r =
            libc::iovec { iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: one iovec each side; the local one is memory the caller
        // vouches for, the remote one is checked by the kernel (EFAULT).
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::from_raw_os_error(libc::EFAULT)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// A cross-process copy's failure in words a person can act on.
pub(crate) fn explain(e: &io::Error) -> String {
    let why = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "permission denied (ptrace access: another user, Yama's ptrace_scope, or a container without \
             CAP_SYS_PTRACE)"
        }
        Some(libc::ENOSYS) => "process_vm_readv/writev unavailable (a seccomp filter, or the kernel lacks it)",
        Some(libc::ESRCH) => {
            "the process that was granted the link has exited (its pid may name another process now), or is in \
             another pid namespace"
        }
        Some(libc::EFAULT) => "an address is not mapped in one of the processes",
        _ => "",
    };
    if why.is_empty() {
        e.to_string()
    } else {
        format!("{why}: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_within_this_process_and_refuses_bad_addresses() {
        let me = PeerProcess::open(std::process::id()).unwrap();
        assert!(me.running());
        let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: every local range is a live vector of at least that length.
        unsafe {
            me.read_from(src.as_ptr() as u64, dst.as_mut_ptr(), src.len()).unwrap();
            assert_eq!(dst, src);
            let mut back = vec![0u8; 10];
            me.write_to(back.as_mut_ptr() as u64, src[5..].as_ptr(), 10).unwrap();
            assert_eq!(back, src[5..15]);
        }
        // SAFETY: as above.
        let e = unsafe { me.read_from(8, dst.as_mut_ptr(), 4) }.unwrap_err();
        assert!(explain(&e).contains("not mapped"), "{}", explain(&e));
    }
}

#[cfg(test)]
mod pin_tests {
    use super::*;

    /// A child that exits at once: once it is gone (and reaped, so its pid
    /// could be anyone's), no copy with it starts, in either direction or
    /// vectored, and the reason says the process is gone.
    #[test]
    fn no_copy_runs_once_the_pinned_process_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pinned = PeerProcess::open(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!pinned.running());
        let mut buf = [7u8; 16];
        let remote = buf.as_ptr() as u64;
        // SAFETY: `buf` is 16 writable bytes.
        let errors = unsafe {
            [
                pinned.read_from(remote, buf.as_mut_ptr(), 16).unwrap_err(),
                pinned.write_to(remote, buf.as_ptr(), 16).unwrap_err(),
                pinned.copy_vectored(&[(buf.as_mut_ptr(), 16)], &[(remote, 16)], true).unwrap_err(),
            ]
        };
        for e in errors {
            assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
            assert!(explain(&e).contains("has exited"), "{}", explain(&e));
        }
        assert_eq!(buf, [7u8; 16]);
        assert_eq!(PeerProcess::open(0).unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }

    /// After shedding, this thread keeps no CAP_SYS_PTRACE in its effective
    /// set, and other threads keep theirs.
    #[test]
    fn shedding_the_ptrace_capability_is_per_thread() {
        fn effective_has_ptrace() -> bool {
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_owned();
            u64::from_str_radix(&eff, 16).unwrap() & (1 << 19) != 0
        }
        let before = effective_has_ptrace();
        std::thread::spawn(|| {
            shed_ptrace_capability().unwrap();
            assert!(!effective_has_ptrace());
        })
        .join()
        .unwrap();
        assert_eq!(effective_has_ptrace(), before, "another thread's capabilities are its own");
    }
}
