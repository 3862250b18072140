//! What the kernel says about the process at the other end of a data
//! connection: which user owns its socket, whether a given process holds
//! that socket, and that process's credentials and pid namespace. A
//! same-host offer's claims are only ever checked against these facts,
//! never trusted on their own.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;

/// The initiator's socket, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Socket {
    pub inode: u64,
    /// The user that owns the socket (the one that created it).
    pub uid: u32,
}

/// A process's credentials, as `/proc/<pid>/status` (readable by anyone)
/// shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Process {
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
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

/// The socket whose local end is `ours` and remote end `theirs`, from
/// `/proc/net/tcp{,6}` text (columns: sl, local, remote, st, queues,
/// timer, retransmits, uid, timeout, inode).
fn socket_in(table: &str, ours: &str, theirs: &str) -> Option<Socket> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 9 && f[1] == ours && f[2] == theirs {
            Some(Socket { inode: f[9].parse().ok()?, uid: f[7].parse().ok()? })
        } else {
            None
        }
    })
}

/// The initiator's socket of our connection (it connected from `from` to
/// our `local`); `Err` says why it cannot be found.
pub(crate) fn socket_of(from: SocketAddr, local: SocketAddr) -> Result<Socket, String> {
    let table = if from.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let text = std::fs::read_to_string(table).map_err(|e| format!("cannot read {table}: {e}"))?;
    socket_in(&text, &proc_net_form(from), &proc_net_form(local)).ok_or_else(|| {
        format!("the initiator's socket {from} is not in this network namespace (the peers must share one)")
    })
}

/// The four uids of a `/proc/<pid>/status` text.
fn uids_in(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let ids: Vec<u32> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    ids.try_into().ok()
}

/// Process `pid`'s credentials.
pub(crate) fn process(pid: u32) -> Result<Process, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let uids = uids_in(&status).ok_or_else(|| format!("{path} has no readable Uid line"))?;
    Ok(Process { uids })
}

/// Inode of process `pid`'s pid namespace (ptrace read access needed).
pub(crate) fn pid_namespace(pid: u32) -> Result<u64, String> {
    let ns = format!("/proc/{pid}/ns/pid");
    Ok(std::fs::metadata(&ns).map_err(|e| format!("cannot read {ns}: {}", explain(&e)))?.ino())
}

/// Whether process `pid` holds the socket `inode` among its open files;
/// `Err` says why not.
pub(crate) fn holds_socket(pid: u32, inode: u64) -> Result<(), String> {
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
        Err(format!("pid {pid} does not hold the connection it offered the link on"))
    }
}

/// A failed read of another process's `/proc` entries, in words (this file
/// reads what the kernel says; the copies and their errors are `xmem`'s).
fn explain(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "permission denied (ptrace access: another user, Yama's ptrace_scope, or a container without \
             CAP_SYS_PTRACE): {e}"
        ),
        Some(libc::ESRCH) | Some(libc::ENOENT) => format!("the process has exited: {e}"),
        _ => e.to_string(),
    }
}

/// This process's real and effective uid.
pub(crate) fn own_uids() -> (u32, u32) {
    // SAFETY: getuid and geteuid have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::geteuid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(socket_in(table, "0100007F:1F90", "0100007F:0001"), Some(Socket { inode: 4242, uid: 1000 }));
        assert_eq!(socket_in(table, "0100007F:1F90", "0100007F:0002"), None);
    }

    #[test]
    fn uids_come_from_the_status_text() {
        assert_eq!(uids_in("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n"), Some([1000, 0, 0, 0]));
        assert_eq!(uids_in("Name:\tx\n"), None);
        assert_eq!(uids_in("Uid:\t1\t2\n"), None);
    }

    #[test]
    fn this_process_holds_its_own_connections_only_and_the_kernel_names_its_user() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, from) = listener.accept().unwrap();
        let local = server.local_addr().unwrap();
        let socket = socket_of(from, local).unwrap();
        assert_eq!(socket.uid, own_uids().1);
        holds_socket(std::process::id(), socket.inode).unwrap();
        // pid 1 (init, or the container's first process) does not hold it.
        assert!(holds_socket(1, socket.inode).is_err());
        let me = process(std::process::id()).unwrap();
        assert_eq!(me.uids[1], own_uids().1);
        let ns = pid_namespace(std::process::id()).unwrap();
        assert_eq!(ns, std::fs::metadata("/proc/self/ns/pid").unwrap().ino());
    }
}
