//! `getTransferStatus` of a task in flight or completed allocates nothing
//! (NIXL asks every task on every poll): a counting allocator in this test
//! binary proves it on the polling thread, through the whole exported call
//! (engine table, batch map, batch, transport, the engine's state word).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_char, c_void};

use super::*;

/// Counts the allocations of the thread that makes them.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, layout, size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const N: usize = 64;
const LEN: usize = 64 << 10;

/// An engine as NIXL's plugin makes it, with `N * LEN` bytes registered.
fn agent() -> (Engine, Vec<u8>, [c_char; 64]) {
    // SAFETY: NUL-terminated strings.
    let e = unsafe { createTransferEngine(c"P2PHANDSHAKE".as_ptr(), c"127.0.0.1".as_ptr(), c"".as_ptr(), 0, 1) };
    assert!(!e.is_null());
    let mut buf = vec![0u8; N * LEN];
    // SAFETY: `buf` outlives the engine in the test.
    let rc = unsafe { registerLocalMemory(e, buf.as_mut_ptr().cast::<c_void>(), buf.len(), c"*".as_ptr(), 1) };
    assert_eq!(rc, 0);
    let mut name = [0 as c_char; 64];
    // SAFETY: `name` is writable for its length.
    assert_eq!(unsafe { getLocalIpAndPort(e, name.as_mut_ptr(), name.len()) }, 0);
    (e, buf, name)
}

#[test]
fn polling_a_task_in_flight_or_completed_allocates_nothing() {
    let (target, target_buf, name) = agent();
    let (e, mut buf, _) = agent();
    // SAFETY: `name` is NUL-terminated.
    let seg = unsafe { openSegment(e, name.as_ptr()) };
    assert!(seg >= 0);
    let batch = allocateBatchID(e, 4 * N);
    for (round, opcode) in [OPCODE_WRITE, OPCODE_READ, OPCODE_WRITE].into_iter().enumerate() {
        let mut reqs: Vec<TransferRequest> = (0..N)
            .map(|i| TransferRequest {
                opcode,
                // SAFETY: inside `buf`.
                source: unsafe { buf.as_mut_ptr().add(i * LEN) }.cast(),
                target_id: seg,
                file_id: 0,
                target_offset: target_buf.as_ptr() as u64 + (i * LEN) as u64,
                length: LEN as u64,
            })
            .collect();
        // SAFETY: `reqs` holds N entries whose memory stays alive.
        assert_eq!(unsafe { submitTransfer(e, batch, reqs.as_mut_ptr(), N) }, 0);
        let base = round * N;
        let mut s = TransferStatus { status: -1, transferred_bytes: 0 };
        // The thread-local last error and the logger are set up on a first call.
        // SAFETY: `s` is writable.
        assert_eq!(unsafe { getTransferStatus(e, batch, base, &mut s) }, 0);
        let (mut polls, mut waiting, mut allocated) = (0u64, 0u64, 0u64);
        loop {
            let mut done = 0;
            for t in base..base + N {
                let before = allocations();
                // SAFETY: `s` is writable.
                let rc = unsafe { getTransferStatus(e, batch, t, &mut s) };
                allocated += allocations() - before;
                assert_eq!(rc, 0);
                polls += 1;
                match s.status {
                    STATUS_WAITING => waiting += 1,
                    STATUS_COMPLETED => {
                        assert_eq!(s.transferred_bytes, LEN as u64);
                        done += 1;
                    }
                    other => panic!("task {t} ended {other}"),
                }
            }
            if done == N {
                break;
            }
        }
        assert_eq!(allocated, 0, "round {round}: {polls} polls ({waiting} in flight) allocated");
        println!("round {round}: {polls} polls, {waiting} of them in flight, no allocation");
    }
    assert_eq!(freeBatchID(e, batch), 0);
    destroyTransferEngine(e);
    destroyTransferEngine(target);
}
