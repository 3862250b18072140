//! The same-host link between two engines of this process (one host, one
//! pid namespace, one user): every direction and size, scattered pages,
//! refusals, `PDX_SAME_HOST=off` on either side, and a mechanism failure
//! falling back to TCP without failing the transfer.

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

/// Write `src` to `dst` (registered on `b`) and read it back, as one request.
fn round_trip(a: &Engine, b: &Engine, src: &[u8], dst: &[u8]) -> Result<()> {
    let w = Request { local: src.as_ptr() as usize, remote: dst.as_ptr() as u64, len: src.len() };
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }?;
    let mut back = vec![0u8; src.len()];
    let r = Request { local: back.as_mut_ptr() as usize, remote: dst.as_ptr() as u64, len: src.len() };
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![r]) }?;
    assert!(back == src, "read back what was written");
    Ok(())
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
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, reqs(back.as_mut_ptr() as usize)) }.unwrap();
    assert!(back == src);
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
        round_trip(&a, &b, &pattern(1 << 20, 3), &region).unwrap();
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
