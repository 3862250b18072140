//! The same-host link between two engines of this process (one host, one
//! pid namespace, one user): every direction and size, scattered pages,
//! refusals, `PDX_SAME_HOST=off` on either side, and a mechanism failure
//! falling back to TCP without failing the transfer; memory the initiator
//! did not register rides TCP and is never copied by the target; and a
//! forked child (of another user, or the same) that keeps a linked socket
//! moves no byte of its parent's memory, whatever it sends.

use super::samehost::frames::{self, Doorbell};
use super::samehost::ring::Kind;
use super::samehost::xmem::FAIL_NEXT;
use super::*;
use crate::transfer::backend::TransferBackend;

fn engine_with(same_host: bool) -> Engine {
    let mut s = Settings::from_env();
    s.same_host = same_host;
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

/// `buf` registered with `engine` until the guard drops.
struct Registered<'a>(&'a Engine, u64);

fn registered<'a>(engine: &'a Engine, buf: &[u8]) -> Registered<'a> {
    engine.register(buf.as_ptr() as u64, buf.len() as u64).expect("registers");
    Registered(engine, buf.as_ptr() as u64)
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.unregister(self.1).expect("unregisters");
    }
}

/// Write `src` (registered on `a`) to `dst` (registered on `b`) and read it
/// back into a buffer `a` registers for it, as one request each.
fn round_trip(a: &Engine, b: &Engine, src: &[u8], dst: &[u8]) -> Result<()> {
    let w = Request { local: src.as_ptr() as usize, remote: dst.as_ptr() as u64, len: src.len() };
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }?;
    let mut back = vec![0u8; src.len()];
    let _mine = registered(a, &back);
    let r = Request { local: back.as_mut_ptr() as usize, remote: dst.as_ptr() as u64, len: src.len() };
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![r]) }?;
    assert!(back == src, "read back what was written");
    Ok(())
}

/// `len` random bytes: a secret no pattern of the tests contains.
fn secret(len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::new();
    (0..len).map(|_| rng.u8(..)).collect()
}

/// Whether `haystack` holds any 64-byte piece of `secret` (at a multiple
/// of 64 in it) anywhere.
fn holds_any_of(haystack: &[u8], secret: &[u8]) -> bool {
    let pieces: std::collections::HashSet<&[u8]> = secret.chunks_exact(64).collect();
    haystack.windows(64).any(|w| pieces.contains(w))
}

fn path(a: &Engine, b: &Engine) -> (String, String) {
    let info = a.peer_info(b.session_id()).unwrap();
    (info["path"].as_str().unwrap().to_owned(), info["reason"].as_str().unwrap().to_owned())
}

#[test]
fn every_size_moves_over_the_same_host_link_and_is_counted() {
    let (a, b) = (engine_with(true), engine_with(true));
    let region = vec![0u8; (9 << 20) + 3];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    assert!(a.peer_info(b.session_id()).is_err(), "never contacted");
    let mut moved = 0u64;
    for len in [1usize, 4095, 4096, 65537, (4 << 20) + 1, region.len()] {
        let src = pattern(len, len as u8);
        let _mine = registered(&a, &src);
        round_trip(&a, &b, &src, &region).unwrap();
        let first_diff = region[..len].iter().zip(&src).position(|(x, y)| x != y);
        assert_eq!(first_diff, None, "len {len}");
        moved += len as u64;
    }
    let (p, why) = path(&a, &b);
    assert_eq!(p, "same-host", "{why}");
    assert!(why.contains("wrote the peer's nonce"), "{why}");
    let s = a.stats();
    assert_eq!((s.same_host_bytes_written, s.same_host_bytes_read), (moved, moved));
    assert_eq!((s.same_host_tasks_written, s.same_host_tasks_read), (6, 6));
    assert_eq!(b.stats().served_bytes_written, moved);
    let info = a.peer_info(b.session_id()).unwrap();
    assert_eq!(info["same_host_bytes_written"], moved);
}

/// Write `blocks` blocks of `block` bytes from one engine to another, block
/// i to slot (i * step) % blocks of the target's region (every slot once),
/// check them there, read them back; the two engines, for their figures.
fn scattered_round_trip(blocks: usize, block: usize, step: usize) -> (Engine, Engine) {
    let (a, b) = (engine_with(true), engine_with(true));
    let region = vec![0u8; blocks * block];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let src = pattern(blocks * block, 7);
    let src_registered = registered(&a, &src);
    let slot = |i: usize| (i * step) % blocks * block;
    let reqs = |base: usize| -> Vec<Request> {
        (0..blocks)
            .map(|i| Request { local: base + i * block, remote: region.as_ptr() as u64 + slot(i) as u64, len: block })
            .collect()
    };
    // SAFETY: the test's buffers outlive the call.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, reqs(src.as_ptr() as usize)) }.unwrap();
    for i in 0..blocks {
        assert!(region[slot(i)..slot(i) + block] == src[i * block..(i + 1) * block], "block {i}");
    }
    let mut back = vec![0u8; src.len()];
    let back_registered = registered(&a, &back);
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, reqs(back.as_mut_ptr() as usize)) }.unwrap();
    assert!(back == src);
    drop((back_registered, src_registered));
    b.unregister(region.as_ptr() as u64).unwrap();
    (a, b)
}

#[test]
fn scattered_pages_both_ways() {
    let (a, _) = scattered_round_trip(2048, 4096, 613);
    assert_eq!(a.stats().same_host_tasks_read, 2048);
}

#[test]
fn a_refused_request_changes_nothing_and_keeps_the_link() {
    let (a, b) = (engine_with(true), engine_with(true));
    let region = vec![5u8; 1 << 16];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let src = pattern(1 << 16, 1);
    let _mine = registered(&a, &src);
    round_trip(&a, &b, &src[..4096], &region).unwrap();
    let before = region.clone();
    // One byte past the region's end.
    let w = Request { local: src.as_ptr() as usize, remote: region.as_ptr() as u64 + 1, len: region.len() };
    // SAFETY: the test's buffers outlive the call.
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RemoteRejected, "{e}");
    assert!(region == before, "a refused write changes none of the target's bytes");
    assert_eq!(b.stats().requests_refused, 1);
    round_trip(&a, &b, &src[..100], &region).unwrap();
    assert_eq!(path(&a, &b).0, "same-host", "a refusal is not a failure of the link");
}

#[test]
fn off_on_either_side_means_tcp_with_the_reason() {
    for (init, target, words) in [(false, true, "on this engine"), (true, false, "the peer has")] {
        let (a, b) = (engine_with(init), engine_with(target));
        let region = vec![0u8; 1 << 20];
        b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let src = pattern(1 << 20, 3);
        let _mine = registered(&a, &src);
        round_trip(&a, &b, &src, &region).unwrap();
        let (p, why) = path(&a, &b);
        assert_eq!(p, "tcp");
        assert!(why.contains("PDX_SAME_HOST=off") && why.contains(words), "{why}");
        assert_eq!(a.stats().same_host_bytes_written, 0);
    }
}

#[test]
fn a_failing_copy_falls_back_to_tcp_and_the_transfer_succeeds() {
    let (a, b) = (engine_with(true), engine_with(true));
    let region = vec![0u8; 1 << 20];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let src = pattern(1 << 20, 9);
    let _mine = registered(&a, &src);
    round_trip(&a, &b, &src[..10], &region).unwrap();
    assert_eq!(path(&a, &b).0, "same-host");
    // Copies made by the target's threads (this process) now fail once
    // with EPERM, as a seccomp or ptrace policy would.
    let at = region.as_ptr() as usize;
    *FAIL_NEXT.lock() = Some((at, at + region.len(), libc::EPERM));
    round_trip(&a, &b, &src, &region).unwrap();
    assert!(region == src);
    let (p, why) = path(&a, &b);
    assert_eq!(p, "tcp");
    assert!(why.contains("permission"), "{why}");
    // It stays on TCP.
    round_trip(&a, &b, &src, &region).unwrap();
    assert_eq!(path(&a, &b).0, "tcp");
}

#[test]
fn pipelined_blocks_are_copied_in_runs_both_ways() {
    const BLOCKS: usize = 256;
    let (a, b) = scattered_round_trip(BLOCKS, 64 << 10, 97);
    let s = b.stats();
    assert_eq!((s.served_writes, s.served_reads), (BLOCKS as u64, BLOCKS as u64));
    assert_eq!(a.stats().same_host_tasks_written, BLOCKS as u64);
}

/// Memory the initiator did not register rides TCP on the link's
/// connection, and still arrives whole; a window of registered memory
/// right after it takes the link. Counted by the path each took.
#[test]
fn unregistered_initiator_memory_rides_tcp_and_registered_memory_the_link() {
    let (a, b) = (engine_with(true), engine_with(true));
    let region = vec![0u8; 1 << 20];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let unregistered = pattern(256 << 10, 5);
    let w = Request { local: unregistered.as_ptr() as usize, remote: region.as_ptr() as u64, len: unregistered.len() };
    // SAFETY: the test's buffers outlive the call.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }.unwrap();
    assert!(region[..unregistered.len()] == unregistered[..]);
    let (p, why) = path(&a, &b);
    assert_eq!(p, "same-host", "the connection is linked: {why}");
    let s = a.stats();
    assert_eq!((s.same_host_bytes_written, s.same_host_tasks_written), (0, 0), "it rode TCP");
    let src = pattern(256 << 10, 6);
    let _mine = registered(&a, &src);
    round_trip(&a, &b, &src, &region).unwrap();
    let s = a.stats();
    assert_eq!((s.same_host_bytes_written, s.same_host_bytes_read), (src.len() as u64, src.len() as u64));
}

/// The second fence: even the process granted the link, asking through its
/// own ring (a hand-built message: pdx itself never sends one), gets no
/// byte of its memory outside what it listed as registered copied in
/// either direction; it is answered "not registered", and the next
/// transfer opens a fresh, linked connection.
#[test]
fn a_request_naming_unregistered_memory_is_refused_by_the_target() {
    let (a, b) = (engine_with(true), engine_with(true));
    const N: usize = 64 << 10;
    let region = vec![0x52u8; 4 * N];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    // Never registered (allocated first: no registered buffer freed later
    // can have had its address).
    let private = secret(N);
    let kept = private.clone();
    let mine = pattern(N, 1);
    let _mine = registered(&a, &mine);
    round_trip(&a, &b, &mine, &region).unwrap();
    let peer = a.inner.peers.cached(b.session_id()).unwrap();
    for (direction, remote) in [(Direction::Write, 2 * N), (Direction::Read, 0)] {
        let req = Request { local: private.as_ptr() as usize, remote: region.as_ptr() as u64 + remote as u64, len: N };
        let status = peer
            .with_idle_lane(|lane| {
                let link = lane.link.as_mut().expect("linked");
                assert!(!link.covers(req.local as u64, N));
                let bell = link.post(Kind::Host, &frames::encode_host(direction, &req)).unwrap();
                lane.conn.send_all(&bell.encode()).unwrap();
                let mut status = [0u8; 8];
                lane.conn.recv_exact(&mut status).map(|()| protocol::wire::decode_status(status))
            })
            .expect("an idle linked lane");
        assert_eq!(status.unwrap(), Some(frames::STATUS_NOT_REGISTERED), "{direction:?}");
        assert!(private == kept, "the initiator's unregistered memory is untouched");
        assert!(!holds_any_of(&region, &private), "none of it reached the region");
        // That lane is closed by the target; the next transfer links afresh.
        round_trip(&a, &b, &mine, &region).unwrap();
        assert_eq!(path(&a, &b).0, "same-host");
    }
    assert_eq!(b.stats().requests_refused, 2);
}

/// What a forked child did on its parent's linked lane: the status it got
/// (`NO_STATUS`: the connection closed or gave nothing).
const NO_STATUS: u64 = u64::MAX;

/// What a forked child tries on its parent's linked connection.
struct Attempt {
    /// Bytes the child writes at `ring` in its own memory first (its copy
    /// of the ring), if any.
    forged: Option<(u64, Vec<u8>)>,
    /// What it then sends on the connection.
    sent: Vec<u8>,
}

/// Fork; the child (uid 65534 when `drop_uid`) makes `attempt` on the
/// inherited socket `fd` and reads one status; the parent runs `after_fork`
/// (it writes its secret) before the child starts. Only system calls and
/// plain copies in the child (the test process has threads).
fn child_attempts(fd: i32, attempt: &Attempt, drop_uid: bool, after_fork: impl FnOnce()) -> u64 {
    let (mut go, mut back) = ([0i32; 2], [0i32; 2]);
    // SAFETY: two arrays of two fds.
    assert!(unsafe { libc::pipe(go.as_mut_ptr()) == 0 && libc::pipe(back.as_mut_ptr()) == 0 });
    // SAFETY: the child makes only system calls and copies on memory
    // prepared before the fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if drop_uid
                && (libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(65534) != 0 || libc::setuid(65534) != 0)
            {
                libc::_exit(2);
            }
            // Only the inherited lane and the pipes: the target's end of the
            // connection (in this test's process too) closes with the target.
            let mut keep = [fd, go[0], back[1]];
            keep.sort_unstable();
            let mut from = 3u32;
            for k in keep {
                if k as u32 > from {
                    libc::syscall(libc::SYS_close_range, from, k as u32 - 1, 0);
                }
                from = from.max(k as u32 + 1);
            }
            libc::syscall(libc::SYS_close_range, from, u32::MAX, 0);
            let mut byte = 0u8;
            libc::read(go[0], (&mut byte as *mut u8).cast(), 1);
            if let Some((at, bytes)) = &attempt.forged {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), *at as usize as *mut u8, bytes.len());
            }
            let mut status = [0u8; 8];
            let mut got = 0usize;
            let sent = &attempt.sent;
            if libc::send(fd, sent.as_ptr().cast(), sent.len(), libc::MSG_NOSIGNAL) == sent.len() as isize {
                // The socket's receive timeout is a short slice: a few tries.
                for _ in 0..200 {
                    let n = libc::recv(fd, status.as_mut_ptr().add(got).cast(), 8 - got, 0);
                    if n == 0 {
                        break;
                    }
                    if n > 0 {
                        got += n as usize;
                        if got == 8 {
                            break;
                        }
                    }
                }
            }
            let s = if got == 8 { u64::from_le_bytes(status) } else { NO_STATUS };
            libc::write(back[1], (&s as *const u64).cast(), 8);
            libc::_exit(0);
        }
    }
    after_fork();
    let mut s = 0u64;
    // SAFETY: our pipe ends and one u64.
    unsafe {
        libc::write(go[1], [1u8].as_ptr().cast(), 1);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child failed: {status:#x}");
        assert_eq!(libc::read(back[0], (&mut s as *mut u64).cast(), 8), 8);
        for fd in go.into_iter().chain(back) {
            libc::close(fd);
        }
    }
    s
}

/// Issue 51's reproduction, with pdx's own link: an initiator links to a
/// target through pdx's API, then forks; the child (of another user, and
/// of the same user) keeps the linked socket and asks for memory of its
/// parent that the parent filled after the fork and never registered: with
/// a request frame on the connection (as pdx once sent them), and with a
/// doorbell for a message it wrote into its own copy of the ring (naming
/// the next sequence number, or replaying the last). Nothing of the
/// parent's reaches the target's region (a pull), the parent's memory does
/// not change (a push), and the parent's own transfers stay on the link
/// before and after every attempt.
#[test]
fn a_forked_child_reusing_an_accepted_link_moves_no_byte() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (a, b) = (engine_with(true), engine_with(true));
    const N: usize = 64 << 10;
    let region = vec![0x52u8; 4 * N];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let mine = pattern(N, 1);
    let _mine = registered(&a, &mine);
    // Memory the parent never registered, its secret written after the fork.
    let private = vec![0u8; N];
    let secret = secret(N);
    let pull_into = region.as_ptr() as u64 + 2 * N as u64;
    let peer = a.inner.peers.cached(b.session_id()).map(|p| p.session.clone());
    assert!(peer.is_none(), "not met yet");
    let mut attempts = 0;
    for drop_uid in [true, false] {
        if drop_uid && !root {
            eprintln!("skipped the other-user child: needs root to change uid");
            continue;
        }
        for (direction, remote) in [(Direction::Write, pull_into), (Direction::Read, region.as_ptr() as u64)] {
            let req = Request { local: private.as_ptr() as usize, remote, len: N };
            for way in ["frame on the connection", "doorbell, next message", "doorbell, replayed message"] {
                // The parent's own transfer: on the link.
                let linked = a.stats().same_host_bytes_written;
                round_trip(&a, &b, &mine, &region).unwrap();
                assert_eq!(path(&a, &b).0, "same-host");
                assert!(a.stats().same_host_bytes_written > linked);
                let peer = a.inner.peers.cached(b.session_id()).unwrap();
                let attempt = peer
                    .with_idle_lane(|lane| {
                        let fd = lane.conn.raw_fd();
                        let link = lane.link.as_ref().expect("linked");
                        let entries = frames::encode_host(direction, &req);
                        let (ring, message, bell) = link.next_message(Kind::Host, &entries);
                        let attempt = match way {
                            "frame on the connection" => Attempt { forged: None, sent: entries.to_vec() },
                            "doorbell, next message" => {
                                Attempt { forged: Some((ring, message)), sent: bell.encode().to_vec() }
                            }
                            _ => {
                                let replay = Doorbell { seq: bell.seq - 1, ..bell };
                                Attempt { forged: Some((ring, message)), sent: replay.encode().to_vec() }
                            }
                        };
                        (fd, attempt)
                    })
                    .expect("an idle linked lane");
                // SAFETY: `private` is ours; written in place (the child keeps its zeros).
                let write_secret =
                    || unsafe { std::ptr::copy_nonoverlapping(secret.as_ptr(), private.as_ptr().cast_mut(), N) };
                let status = child_attempts(attempt.0, &attempt.1, drop_uid, write_secret);
                let who = if drop_uid { "uid 65534" } else { "same uid" };
                let leaked = holds_any_of(&region, &secret);
                assert!(!leaked, "LEAKED to a {who} child ({direction:?}, {way}): status {status:#x}");
                assert!(private == secret, "OVERWRITTEN by a {who} child ({direction:?}, {way}): status {status:#x}");
                assert_eq!(status, NO_STATUS, "{who}, {direction:?}, {way}: the connection closes unanswered");
                // Back to the child's zeros for the next attempt.
                // SAFETY: as above.
                unsafe { std::ptr::write_bytes(private.as_ptr().cast_mut(), 0, N) };
                attempts += 1;
            }
        }
    }
    // The honest path, after the last attempt: still on the link.
    let linked = a.stats().same_host_bytes_written;
    round_trip(&a, &b, &mine, &region).unwrap();
    assert_eq!(path(&a, &b).0, "same-host", "{:?}", path(&a, &b));
    assert!(a.stats().same_host_bytes_written > linked);
    assert!(attempts >= 6);
}
