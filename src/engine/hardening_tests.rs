//! Tests of the engine's limits, deadlines and budgets under hostile or
//! stalled peers (issue #11). Loopback only; every wait is bounded and the
//! bounds are generous (they check correctness, not speed).

use std::time::{Duration, Instant};

use super::*;
use crate::error::ErrorKind;

fn settings() -> Settings {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    s
}

fn engine_with(s: Settings) -> Engine {
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

fn req(local: &[u8], remote: u64, len: usize) -> Request {
    Request { local: local.as_ptr() as usize, remote, len }
}

#[test]
fn bogus_lengths_and_oversized_batches_are_refused_up_front() {
    let mut s = settings();
    s.max_batch_entries = 1000;
    let (a, b) = (engine_with(s), engine_with(settings()));
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    let src = vec![7u8; 8192];
    let started = Instant::now();
    for dir in [Direction::Write, Direction::Read] {
        // SAFETY: nothing is moved: the request is refused before any I/O.
        let e = unsafe { a.transfer_sync(b.session_id(), dir, vec![req(&src, addr(&target), 1 << 62)]) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // SAFETY: as above.
        let e = unsafe { a.submit(b.session_id(), dir, vec![req(&src, addr(&target), 1 << 62)], None) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    let many = vec![req(&src, addr(&target), 1); 1001];
    // SAFETY: refused before any I/O.
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, many) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(started.elapsed() < Duration::from_secs(2), "refusals are immediate");
    // Longer than the largest region the peer advertised: first while the
    // descriptor is not cached yet (the batch fails as invalid), then cached.
    for _ in 0..2 {
        // SAFETY: `src` outlives the call; the request is refused before any byte moves.
        let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, addr(&target), 8192)]) }
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    // A larger region registered later is seen (the descriptor is refreshed).
    let bigger = vec![0u8; 16384];
    b.register(addr(&bigger), bigger.len() as u64).unwrap();
    // SAFETY: `src` and `bigger` outlive the call.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, addr(&bigger), 8192)]) }.unwrap();
    assert!(bigger[..8192].iter().all(|&x| x == 7));
}
