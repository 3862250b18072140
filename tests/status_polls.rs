//! Status polls are cheap: `pdx_task_status` and `pdx_batch_status` of a
//! task in flight or completed allocate nothing (a counting allocator
//! proves it on the polling thread), and a poller spinning on every task
//! while transfers complete, fail and are cancelled sees each task end in
//! its true state, once, with its bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::ptr;

use pdx::ffi::engine::*;
use pdx::ffi::status::{pdx_status, PDX_ERR_CANCELED, PDX_ERR_REMOTE_REJECTED, PDX_OK};

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

/// The engine handle, sendable to the poller thread (the ABI is thread-safe).
#[derive(Clone, Copy)]
struct Handle(*mut pdx_engine);
// SAFETY: pdx engine handles may be used from any thread.
unsafe impl Send for Handle {}

struct Agent {
    e: Handle,
    buf: Vec<u8>,
}

impl Agent {
    fn new(len: usize) -> Agent {
        let mut e = ptr::null_mut();
        // SAFETY: NUL-terminated strings; `e` is writable.
        assert_eq!(unsafe { pdx_engine_init(c"127.0.0.1".as_ptr(), c"tcp".as_ptr(), ptr::null(), &mut e) }, PDX_OK);
        let mut buf = vec![0u8; len];
        let p = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: `buf` outlives the engine (dropped after it is freed).
        assert_eq!(unsafe { pdx_register_memory_at(e, p, len, ptr::null()) }, PDX_OK);
        Agent { e: Handle(e), buf }
    }

    fn session(&self) -> &CStr {
        // SAFETY: valid while the engine lives.
        unsafe { CStr::from_ptr(pdx_engine_session_id(self.e.0)) }
    }

    /// Submit `n` writes of `len` bytes to `to` (entry i: local i*len to
    /// remote `remote(i)`).
    fn write(&mut self, to: &Agent, n: usize, len: usize, remote: impl Fn(usize) -> u64) -> u64 {
        let base = self.buf.as_mut_ptr();
        // SAFETY: every local range lies in `buf`.
        let locals: Vec<*mut c_void> = (0..n).map(|i| unsafe { base.add(i * len) }.cast()).collect();
        let remotes: Vec<u64> = (0..n).map(remote).collect();
        let lens = vec![len; n];
        let mut batch = 0;
        // SAFETY: arrays of `n` entries; the memory stays registered and alive.
        let rc = unsafe {
            pdx_batch_submit(
                self.e.0,
                to.session().as_ptr(),
                PDX_OPCODE_WRITE,
                locals.as_ptr(),
                remotes.as_ptr(),
                lens.as_ptr(),
                n,
                ptr::null(),
                ptr::null(),
                &mut batch,
            )
        };
        assert_eq!(rc, PDX_OK);
        batch
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        pdx_engine_free(self.e.0);
    }
}

fn task_status(e: Handle, batch: u64, task: usize) -> (i32, u64, pdx_status) {
    let (mut state, mut bytes, mut error) = (-1, 0, -1);
    // SAFETY: the out-params are writable.
    assert_eq!(unsafe { pdx_task_status(e.0, batch, task, &mut state, &mut bytes, &mut error) }, PDX_OK);
    (state, bytes, error)
}

const N: usize = 64;
const LEN: usize = 64 << 10;

#[test]
fn polling_a_task_in_flight_or_completed_allocates_nothing() {
    let b = Agent::new(N * LEN);
    let mut a = Agent::new(N * LEN);
    let remote_base = b.buf.as_ptr() as u64;
    for round in 0..5 {
        let batch = a.write(&b, N, LEN, |i| remote_base + (i * LEN) as u64);
        // The thread-local last error and the logger are set up on a first call.
        task_status(a.e, batch, 0);
        let mut summary = pdx_batch_summary { state: 0, total: 0, completed: 0, failed: 0, bytes: 0 };
        let (mut polls, mut pending, mut allocated) = (0u64, 0u64, 0u64);
        loop {
            let mut done = 0;
            for t in 0..N {
                let before = allocations();
                let (state, bytes, error) = task_status(a.e, batch, t);
                allocated += allocations() - before;
                polls += 1;
                match state {
                    PDX_TASK_PENDING => pending += 1,
                    PDX_TASK_COMPLETED => {
                        assert_eq!((bytes, error), (LEN as u64, PDX_OK));
                        done += 1;
                    }
                    other => panic!("task {t} ended {other}"),
                }
            }
            let before = allocations();
            // SAFETY: `summary` is writable.
            assert_eq!(unsafe { pdx_batch_status(a.e.0, batch, &mut summary) }, PDX_OK);
            allocated += allocations() - before;
            if done == N {
                break;
            }
        }
        assert_eq!(
            allocated, 0,
            "round {round}: {polls} task polls ({pending} in flight) and the batch polls allocated"
        );
        assert_eq!((summary.state, summary.completed, summary.bytes), (PDX_TASK_COMPLETED, N, (N * LEN) as u64));
        println!("round {round}: {polls} task polls, {pending} of them in flight, no allocation");
    }
}

/// A poller spins on every task while the batch runs: each task it sees end
/// keeps that state on every later poll, and it is the task's true end
/// (completed with every byte, failed where the target refused the address,
/// cancelled where the caller cancelled first).
#[test]
fn a_spinning_poller_sees_every_task_end_in_its_true_state() {
    let b = Agent::new(N * LEN);
    let mut a = Agent::new(N * LEN);
    let remote_base = b.buf.as_ptr() as u64;
    for round in 0..6 {
        // Every 8th task writes outside the target's memory: refused.
        let bad = |i: usize| i % 8 == 7;
        let batch = a.write(&b, N, LEN, |i| if bad(i) { 0x10 } else { remote_base + (i * LEN) as u64 });
        let e = a.e;
        let poller = std::thread::spawn(move || {
            let mut ended: Vec<Option<(i32, u64, pdx_status)>> = vec![None; N];
            while ended.iter().any(Option::is_none) {
                for (t, end) in ended.iter_mut().enumerate() {
                    let s = task_status(e, batch, t);
                    match end {
                        Some(seen) => assert_eq!(*seen, s, "task {t} changed after it ended"),
                        None if s.0 != PDX_TASK_PENDING => *end = Some(s),
                        None => {}
                    }
                }
            }
            ended.into_iter().map(Option::unwrap).collect::<Vec<_>>()
        });
        // On odd rounds, cancel task 0 and the last good task while they may
        // still run (either the cancel or the completion decides).
        let mut canceled = [None, None];
        if round % 2 == 1 {
            for (k, t) in [0, N - 2].into_iter().enumerate() {
                let mut state = -1;
                // SAFETY: `state` is writable.
                assert_eq!(unsafe { pdx_task_cancel(a.e.0, batch, t, &mut state) }, PDX_OK);
                canceled[k] = Some((t, state));
            }
        }
        let ended = poller.join().unwrap();
        for (t, (state, bytes, error)) in ended.into_iter().enumerate() {
            let after = task_status(a.e, batch, t);
            assert_eq!(after, (state, bytes, error), "task {t}: the poller saw its final state");
            if let Some((_, at_cancel)) = canceled.iter().flatten().find(|(c, _)| *c == t) {
                assert_eq!(state, *at_cancel, "task {t}: the state pdx_task_cancel reported");
                if state == PDX_TASK_CANCELED {
                    assert_eq!(error, PDX_ERR_CANCELED);
                    continue;
                }
            }
            if bad(t) {
                assert_eq!((state, bytes, error), (PDX_TASK_FAILED, 0, PDX_ERR_REMOTE_REJECTED), "task {t}");
            } else {
                assert_eq!((state, bytes, error), (PDX_TASK_COMPLETED, LEN as u64, PDX_OK), "task {t}");
            }
        }
    }
}
