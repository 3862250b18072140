//! Cancelling transfers in flight (issue 50). Once a cancel returns, no
//! byte lands in a cancelled read's buffer and none is read from a
//! cancelled write's source: each test fills the local memory right after
//! the cancel returned, waits, and compares. Over TCP, the same-host link
//! and against a frozen peer (the rails' case is in `rails_tests`); a
//! cancel racing a completion ends in exactly one of the two, reported
//! truly; the tasks that shared a window with a cancelled one complete;
//! the peer takes the next transfer and notification at once.

use std::time::{Duration, Instant};

use super::hardening_tests::Freezable;
use super::*;
use crate::transfer::{Notification, TaskState};

/// What local memory is filled with once a cancel returned. The peers'
/// data never holds this byte (see [`pattern`]), so any other byte found
/// in a filled buffer later is a late byte.
const FILL: u8 = 0xA5;
/// How long the tests wait for late bytes after filling.
const LATE: Duration = Duration::from_millis(1500);

fn engine(same_host: bool) -> Engine {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    s.same_host = same_host;
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

/// Pseudo-random bytes below 0x80 (never [`FILL`]).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) & 0x7f
        })
        .collect()
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

/// The bytes of `buf` that are not `byte`.
fn other_than(buf: &[u8], byte: u8) -> usize {
    buf.iter().filter(|&&b| b != byte).count()
}

/// Wait (bounded) until batch `id` has confirmed at least `bytes`.
fn until_moved(a: &Engine, id: u64, bytes: u64) {
    let by = Instant::now() + Duration::from_secs(30);
    while a.batch_summary(id).unwrap().bytes < bytes && Instant::now() < by {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The next transfer and a notification to `session` work at once.
fn serves_on(a: &Engine, session: &str, remote: &[u8]) {
    let mut back = vec![0u8; 1 << 20];
    let r = Request { local: back.as_mut_ptr() as usize, remote: addr(remote), len: back.len() };
    // SAFETY: `back` and `remote` outlive the synchronous call.
    unsafe { a.transfer_sync(session, Direction::Read, vec![r]) }.expect("the next read");
    assert!(back[..] == remote[..back.len()], "the next read gets the peer's bytes (no stale byte of the last)");
    a.notify(session, &Notification::new("after-cancel", "hello")).expect("a notification right after a cancel");
}

/// What a cancel took, and the peer's figures right after it returned.
pub(super) struct Cancelled {
    pub(super) took: Duration,
    pub(super) info: serde_json::Value,
}

/// Read `len` bytes of `region` (at `b`) into a buffer, cancel once
/// `after` bytes moved, fill the buffer, wait, compare.
pub(super) fn cancel_read(a: &Engine, session: &str, region: &[u8], after: u64) -> Cancelled {
    let len = region.len();
    let mut local = vec![0u8; len];
    let r = Request { local: local.as_mut_ptr() as usize, remote: addr(region), len };
    // SAFETY: `local` outlives the batch: it is cancelled (and so left
    // untouched) before the buffer drops.
    let id = unsafe { a.submit(session, Direction::Read, vec![r], None) }.unwrap();
    until_moved(a, id, after);
    let t0 = Instant::now();
    let canceled = a.cancel(id, None).expect("cancel");
    let took = t0.elapsed();
    local.fill(FILL);
    let info = a.peer_info(session).unwrap();
    let s = a.batch_summary(id).unwrap();
    assert_eq!((canceled, s.canceled, s.state), (1, 1, TaskState::Canceled), "{s:?}");
    assert!(a.is_batch_done(id), "a batch whose tasks are cancelled is finished");
    let t = a.task_summary(id, 0).unwrap();
    assert_eq!(t.error.map(|e| e.kind()), Some(ErrorKind::Canceled));
    std::thread::sleep(LATE);
    assert_eq!(other_than(&local, FILL), 0, "late bytes in a cancelled read's buffer");
    a.batch_free(id).expect("freed");
    println!("cancelled a {len}-byte read after {} bytes in {took:?} (via {session})", s.bytes);
    Cancelled { took, info }
}

/// Write `src` to `region` (at `b`), cancel once `after` bytes moved, fill
/// the source, wait, and check that no byte of the fill reached `region`.
pub(super) fn cancel_write(a: &Engine, session: &str, region: &[u8], after: u64) -> Cancelled {
    let mut src = pattern(region.len(), 7);
    let w = Request { local: src.as_ptr() as usize, remote: addr(region), len: src.len() };
    // SAFETY: as in `cancel_read`.
    let id = unsafe { a.submit(session, Direction::Write, vec![w], None) }.unwrap();
    until_moved(a, id, after);
    let t0 = Instant::now();
    assert_eq!(a.cancel(id, None).expect("cancel"), 1);
    let took = t0.elapsed();
    src.fill(FILL);
    let info = a.peer_info(session).unwrap();
    std::thread::sleep(LATE);
    assert_eq!(region.iter().filter(|&&b| b == FILL).count(), 0, "bytes read from a cancelled write's source");
    assert_eq!(a.batch_summary(id).unwrap().state, TaskState::Canceled);
    a.batch_free(id).expect("freed");
    Cancelled { took, info }
}

impl Engine {
    fn is_batch_done(&self, id: u64) -> bool {
        self.inner.batches.get(id).unwrap().is_done()
    }
}

#[test]
fn a_cancelled_read_or_write_over_tcp_touches_no_local_byte_and_the_peer_serves_on() {
    let (a, b) = (engine(false), engine(false));
    let region = pattern(256 << 20, 1);
    b.register(addr(&region), region.len() as u64).unwrap();
    // In flight as NIXL releases it (nothing moved yet), then mid-way.
    cancel_read(&a, b.session_id(), &region, 0);
    cancel_read(&a, b.session_id(), &region, 32 << 20);
    // The target stopped serving them (its sends failed on the reset
    // connections): it served far less than was asked, and nothing since.
    let served = b.stats().served_bytes_read;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.stats().served_bytes_read, served, "the target still serves a cancelled read");
    assert!(served < 2 * region.len() as u64, "the target served {served} bytes of two cancelled reads");
    println!("the target served {} MiB of the two cancelled 256 MiB reads", served >> 20);
    serves_on(&a, b.session_id(), &region);
    let target = vec![0u8; 256 << 20];
    b.register(addr(&target), target.len() as u64).unwrap();
    cancel_write(&a, b.session_id(), &target, 16 << 20);
    serves_on(&a, b.session_id(), &region);
    let st = a.stats();
    assert_eq!((st.tasks_canceled, st.tasks_failed), (3, 0), "cancels are counted as such, not as failures");
}

#[test]
fn a_cancelled_read_over_the_same_host_link_writes_no_late_byte() {
    let (a, b) = (engine(true), engine(true));
    let region = pattern(256 << 20, 2);
    b.register(addr(&region), region.len() as u64).unwrap();
    serves_on(&a, b.session_id(), &region);
    assert_eq!(a.peer_info(b.session_id()).unwrap()["path"], samehost::PATH);
    cancel_read(&a, b.session_id(), &region, 16 << 20);
    let target = vec![0u8; 128 << 20];
    b.register(addr(&target), target.len() as u64).unwrap();
    cancel_write(&a, b.session_id(), &target, 16 << 20);
    serves_on(&a, b.session_id(), &region);
}

/// A peer that stops answering (as SIGSTOP stops a process) does not hold
/// a cancel up, and what it sends once it runs again lands nowhere.
#[test]
fn a_cancel_returns_at_once_on_a_frozen_peer_and_nothing_lands_after_it_thaws() {
    let region = pattern(64 << 20, 3);
    let peer = Freezable::new(&region);
    let a = engine(false);
    serves_on(&a, &peer.session, &region);
    for direction in [Direction::Read, Direction::Write] {
        peer.freeze();
        let mut local = match direction {
            Direction::Read => vec![0u8; region.len()],
            Direction::Write => pattern(region.len(), 9),
        };
        let r = Request { local: local.as_mut_ptr() as usize, remote: addr(&region), len: local.len() };
        // SAFETY: cancelled before `local` drops.
        let id = unsafe { a.submit(&peer.session, direction, vec![r], None) }.unwrap();
        std::thread::sleep(Duration::from_millis(300)); // blocked on the frozen peer by now
        let t0 = Instant::now();
        assert_eq!(a.cancel(id, None).unwrap(), 1);
        let took = t0.elapsed();
        local.fill(FILL);
        peer.thaw();
        std::thread::sleep(LATE);
        println!("{direction:?}: cancel on a frozen peer took {took:?}");
        assert!(took < Duration::from_secs(3), "cancel on a frozen peer took {took:?}");
        match direction {
            Direction::Read => assert_eq!(other_than(&local, FILL), 0, "late bytes after the peer thawed"),
            Direction::Write => assert!(!region.contains(&FILL), "bytes read from the source after the cancel"),
        }
        a.batch_free(id).unwrap();
        serves_on(&a, &peer.session, &region);
    }
}

/// One task of a window is cancelled while the window is on the wire: the
/// window is cut, and its other tasks complete (on fresh lanes), byte for
/// byte; the cancelled one's buffer stays as filled.
#[test]
fn the_tasks_that_shared_a_window_with_a_cancelled_one_complete() {
    let region = pattern(4 << 20, 4);
    let peer = Freezable::new(&region);
    let a = engine(false);
    serves_on(&a, &peer.session, &region);
    // Slowed to about 1.3 MB/s: the window is on the wire for a while.
    peer.slow(true);
    const TASK: usize = 256 << 10;
    let mut local = vec![0u8; 4 * TASK];
    let reqs = (0..4)
        .map(|k| Request {
            local: local.as_mut_ptr() as usize + k * TASK,
            remote: addr(&region) + (k * TASK) as u64,
            len: TASK,
        })
        .collect();
    // SAFETY: every task is finished (or cancelled) before `local` drops.
    let id = unsafe { a.submit(&peer.session, Direction::Read, reqs, None) }.unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(a.cancel(id, Some(2)).unwrap(), 1);
    local[2 * TASK..3 * TASK].fill(FILL);
    let s = a.batch_wait(id, Duration::from_secs(60)).expect("the other tasks finish");
    peer.slow(false);
    std::thread::sleep(LATE);
    assert_eq!((s.completed, s.canceled, s.failed, s.state), (3, 1, 0, TaskState::Canceled), "{s:?}");
    for k in [0, 1, 3] {
        assert_eq!(a.task_summary(id, k).unwrap().state, TaskState::Completed);
        assert!(local[k * TASK..(k + 1) * TASK] == region[k * TASK..(k + 1) * TASK], "task {k}'s bytes");
    }
    assert_eq!(other_than(&local[2 * TASK..3 * TASK], FILL), 0, "late bytes in the cancelled task");
    assert_eq!(a.cancel(id, Some(2)).unwrap(), 0, "cancelling again changes nothing");
    assert_eq!(a.cancel(id, Some(0)).unwrap(), 0, "a completed task stays completed");
    assert_eq!(a.cancel(id, Some(4)).unwrap_err().kind(), ErrorKind::IndexOutOfRange);
    a.batch_free(id).unwrap();
    assert_eq!(a.cancel(id, None).unwrap_err().kind(), ErrorKind::InvalidHandle);
}

/// Cancels at every moment of a small read's life: each task ends either
/// completed (every byte there, the cancel reports none) or cancelled
/// (the cancel reports it, and no byte lands after it returned).
#[test]
fn a_cancel_racing_a_completion_ends_in_exactly_one_reported_truly() {
    let (a, b) = (engine(false), engine(false));
    let region = pattern(8 << 20, 5);
    b.register(addr(&region), region.len() as u64).unwrap();
    serves_on(&a, b.session_id(), &region);
    const LEN: usize = 512 << 10;
    let mut cancelled: Vec<Vec<u8>> = Vec::new();
    let (mut won, mut lost) = (0, 0);
    for k in 0..200usize {
        let mut local = vec![0u8; LEN];
        let off = (k * 4096) % (region.len() - LEN);
        let r = Request { local: local.as_mut_ptr() as usize, remote: addr(&region) + off as u64, len: LEN };
        // SAFETY: the task is finished or cancelled before `local` drops.
        let id = unsafe { a.submit(b.session_id(), Direction::Read, vec![r], None) }.unwrap();
        let delay = Duration::from_micros((k % 10) as u64 * 150);
        let t0 = Instant::now();
        while t0.elapsed() < delay {
            std::hint::spin_loop();
        }
        let n = a.cancel(id, Some(0)).unwrap();
        let t = a.task_summary(id, 0).unwrap();
        match t.state {
            TaskState::Completed => {
                assert_eq!((n, t.bytes), (0, LEN as u64), "a completion reported truly");
                assert!(local[..] == region[off..off + LEN], "a completed read has every byte");
                lost += 1;
            }
            TaskState::Canceled => {
                assert_eq!(n, 1, "the cancel says it cancelled");
                local.fill(FILL);
                cancelled.push(local);
                won += 1;
            }
            other => panic!("task {k} ended {other:?}: {t:?}"),
        }
        // A completed task's batch finishes right after it.
        a.batch_wait(id, Duration::from_secs(10)).unwrap();
        a.batch_free(id).unwrap();
    }
    std::thread::sleep(LATE);
    for (k, local) in cancelled.iter().enumerate() {
        assert_eq!(other_than(local, FILL), 0, "late bytes in cancelled read {k}");
    }
    println!("200 races: {won} cancelled, {lost} completed first");
    assert!(won > 0, "a cancel right after the submit wins");
    serves_on(&a, b.session_id(), &region);
}

/// The figure for the report: a cancel with a gigabyte in flight (run
/// with `--ignored`; it needs 2 GiB of memory).
#[test]
#[ignore]
fn cancel_latency_with_a_gigabyte_in_flight() {
    let (a, b) = (engine(false), engine(false));
    let region = pattern(1 << 30, 6);
    b.register(addr(&region), region.len() as u64).unwrap();
    serves_on(&a, b.session_id(), &region);
    let mut took = Vec::new();
    for _ in 0..5 {
        took.push(cancel_read(&a, b.session_id(), &region, 64 << 20).took);
    }
    took.sort();
    println!("cancel with ~1 GiB in flight: median {:?}, max {:?}", took[2], took[4]);
}
