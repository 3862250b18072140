//! Cross-memory attach: one copy between this process and another on the
//! same host (`process_vm_readv` / `process_vm_writev`), and the check
//! that a TCP connection really belongs to the process an offer names.

use std::io;
use std::net::SocketAddr;

/// Copy `len` bytes from `remote` in process `pid` to `local`, all of them
/// (the kernel may copy fewer per call). The kernel checks the remote
/// range (an unmapped one is `EFAULT`).
///
/// # Safety
/// `local` must be writable for `len` bytes.
pub(crate) unsafe fn read_from(pid: u32, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    copy(pid, remote, local, len, false)
}

/// Copy `len` bytes from `local` to `remote` in process `pid`.
///
/// # Safety
/// `local` must be readable for `len` bytes.
pub(crate) unsafe fn write_to(pid: u32, remote: u64, local: *const u8, len: usize) -> io::Result<()> {
    copy(pid, remote, local.cast_mut(), len, true)
}

/// One vectored copy between `locals` here and `remotes` in process `pid`
/// (pairs of address and length, the same total on both sides; a write
/// pulls from `remotes`, a read pushes to them): the bytes copied, which
/// the kernel may stop short of at an iovec boundary.
///
/// # Safety
/// Every local range must be writable (for `pull`) or readable for the
/// duration of the call.
pub(crate) unsafe fn copy_vectored(
    pid: u32,
    locals: &[(*mut u8, usize)],
    remotes: &[(u64, usize)],
    pull: bool,
) -> io::Result<usize> {
    #[cfg(test)]
    injected(locals.first().map_or(std::ptr::null_mut(), |l| l.0))?;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
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
fn copy(pid: u32, remote: u64, local: *mut u8, len: usize, write: bool) -> io::Result<()> {
    #[cfg(test)]
    injected(local)?;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
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
        Some(libc::ESRCH) => "no such process here (another pid namespace?)",
        Some(libc::EFAULT) => "an address is not mapped in one of the processes",
        _ => "",
    };
    if why.is_empty() {
        e.to_string()
    } else {
        format!("{why}: {e}")
    }
}

/// `addr` as `/proc/net/tcp{,6}` prints it (`ADDR:PORT`, the address in
/// 32-bit words of host byte order, upper-case hex).
fn proc_net_form(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr {
        SocketAddr::V4(a) => vec![a.ip().octets()],
        SocketAddr::V6(a) => a.ip().octets().chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect(),
    };
    let hex: String = words.iter().map(|w| format!("{:08X}", u32::from_ne_bytes(*w))).collect();
    format!("{hex}:{:04X}", addr.port())
}

/// The inode of the socket whose local end is `ours` and remote end
/// `theirs`, from `/proc/net/tcp{,6}` text.
fn socket_inode(table: &str, ours: &str, theirs: &str) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == ours && f[2] == theirs).then(|| f[9].parse().ok()).flatten()
    })
}

/// Whether process `pid` holds the socket at the other end of our
/// connection (it connected from `from` to our `local`); `Err` says why
/// not. Only then may an offer naming `pid` have us copy its memory: a
/// connection cannot borrow another process's identity.
pub(crate) fn owns_connection(pid: u32, from: SocketAddr, local: SocketAddr) -> Result<(), String> {
    let table = if from.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let text = std::fs::read_to_string(table).map_err(|e| format!("cannot read {table}: {e}"))?;
    let inode = socket_inode(&text, &proc_net_form(from), &proc_net_form(local)).ok_or_else(|| {
        format!("the initiator's socket {from} is not in this network namespace (the peers must share one)")
    })?;
    let want = format!("socket:[{inode}]");
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        let e = explain(&e);
        format!("cannot check that pid {pid} holds the connection ({dir}: {e})")
    })?;
    let holds = entries.flatten().any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
    if holds {
        Ok(())
    } else {
        Err(format!("pid {pid} does not hold the connection it offered the link on (another pid namespace?)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_within_this_process_and_refuses_bad_addresses() {
        let pid = std::process::id();
        let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: every local range is a live vector of at least that length.
        unsafe {
            read_from(pid, src.as_ptr() as u64, dst.as_mut_ptr(), src.len()).unwrap();
            assert_eq!(dst, src);
            let mut back = vec![0u8; 10];
            write_to(pid, back.as_mut_ptr() as u64, src[5..].as_ptr(), 10).unwrap();
            assert_eq!(back, src[5..15]);
        }
        // SAFETY: as above.
        let e = unsafe { read_from(pid, 8, dst.as_mut_ptr(), 4) }.unwrap_err();
        assert!(explain(&e).contains("not mapped"), "{}", explain(&e));
    }

    #[test]
    fn proc_net_form_matches_the_kernel() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_net_form(v4), if cfg!(target_endian = "little") { "0100007F:1F90" } else { "7F000001:1F90" });
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        let one = if cfg!(target_endian = "little") { "01000000" } else { "00000001" };
        assert_eq!(proc_net_form(v6), format!("000000000000000000000000{one}:0001"));
        let table =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                     0: 0100007F:1F90 0100007F:0001 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0";
        assert_eq!(socket_inode(table, "0100007F:1F90", "0100007F:0001"), Some(4242));
        assert_eq!(socket_inode(table, "0100007F:1F90", "0100007F:0002"), None);
    }

    #[test]
    fn this_process_holds_its_own_connections_only() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, from) = listener.accept().unwrap();
        let local = server.local_addr().unwrap();
        owns_connection(std::process::id(), from, local).unwrap();
        // pid 1 (init, or the container's first process) does not hold it.
        assert!(owns_connection(1, from, local).is_err());
    }
}
