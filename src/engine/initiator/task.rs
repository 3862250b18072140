//! One task of a batch: its state word, which the transfer threads write
//! once (completion, failure or cancel, whichever decides first) and status
//! polls read with two atomic loads, never a lock a transfer thread takes
//! nor an allocation (NIXL asks every task's status on every poll). The
//! failure text sits behind a lock beside it, read only for a task that
//! ended failed or cancelled.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::Error;
use crate::transfer::TaskState;

pub(super) struct Task {
    state: AtomicU8,
    /// Bytes confirmed. Added before the state is decided (a completed
    /// task's bytes are final when its state reads `Completed`).
    pub bytes: AtomicU64,
    /// The length asked for (what the statistics count a failed task at).
    pub requested: u64,
    /// Pieces of this task not yet terminal.
    pub pieces_left: AtomicUsize,
    /// A piece of it went over TCP (else it moved over the same-host link).
    pub over_tcp: AtomicBool,
    /// Why it failed (set before a failure is decided) or that it was
    /// cancelled (set just after).
    pub error: Mutex<Option<Error>>,
}

impl Task {
    /// A task of `pieces` pieces asking `requested` bytes; one of no piece
    /// (a zero-length request) is completed from the start.
    pub fn new(pieces: usize, requested: u64) -> Task {
        let state = if pieces == 0 { TaskState::Completed } else { TaskState::Pending };
        Task {
            state: AtomicU8::new(state.to_u8()),
            bytes: AtomicU64::new(0),
            requested,
            pieces_left: AtomicUsize::new(pieces),
            over_tcp: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    pub fn state(&self) -> TaskState {
        TaskState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// State and bytes confirmed, lock-free. The state is read first: its
    /// acquire orders the bytes load after every byte the decision counted.
    pub fn status(&self) -> (TaskState, u64) {
        let state = self.state();
        (state, self.bytes.load(Ordering::Acquire))
    }

    /// End the task in `state` unless it has already ended: the one atomic
    /// decision a completion and a cancel race for. True if this call did.
    pub fn decide(&self, state: TaskState) -> bool {
        let pending = TaskState::Pending.to_u8();
        self.state.compare_exchange(pending, state.to_u8(), Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_state_word_is_decided_once() {
        assert_eq!(Task::new(0, 0).status(), (TaskState::Completed, 0), "a zero-length task is done at once");
        let t = Task::new(2, 10);
        assert_eq!(t.status(), (TaskState::Pending, 0));
        t.bytes.fetch_add(10, Ordering::AcqRel);
        assert!(t.decide(TaskState::Completed));
        assert!(!t.decide(TaskState::Canceled), "a cancel after a completion changes nothing");
        assert!(!t.decide(TaskState::Failed));
        assert_eq!(t.status(), (TaskState::Completed, 10));
        let c = Task::new(1, 10);
        assert!(c.decide(TaskState::Canceled));
        assert!(!c.decide(TaskState::Completed), "a completion after a cancel changes nothing");
        assert_eq!(c.status(), (TaskState::Canceled, 0));
    }

    /// A reader spinning on the state word while writers race to decide:
    /// it never sees a state change once terminal, and a completed task
    /// always shows all of its bytes.
    #[test]
    fn a_poller_sees_one_terminal_state_and_final_bytes() {
        for round in 0..200u64 {
            let t = Arc::new(Task::new(4, 400));
            let poller = {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut seen = TaskState::Pending;
                    loop {
                        let (state, bytes) = t.status();
                        if seen.is_terminal() {
                            assert_eq!(state, seen, "a terminal state never changes");
                        }
                        if state == TaskState::Completed {
                            assert_eq!(bytes, 400, "completed with every byte");
                            return state;
                        }
                        if state == TaskState::Canceled {
                            return state;
                        }
                        seen = state;
                        std::hint::spin_loop();
                    }
                })
            };
            let pieces: Vec<_> = (0..4)
                .map(|_| {
                    let t = t.clone();
                    std::thread::spawn(move || {
                        t.bytes.fetch_add(100, Ordering::AcqRel);
                        if t.pieces_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                            t.decide(TaskState::Completed);
                        }
                    })
                })
                .collect();
            let canceled = round % 3 == 0 && t.decide(TaskState::Canceled);
            pieces.into_iter().for_each(|p| p.join().unwrap());
            let seen = poller.join().unwrap();
            assert_eq!(seen, t.state());
            assert_eq!(seen == TaskState::Canceled, canceled);
        }
    }
}
