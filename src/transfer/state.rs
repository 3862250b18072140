//! Task and batch states, their summaries, and the messages every backend
//! reports for them. The ABI maps [`TaskState`] to its `PDX_TASK_*`
//! integers; nothing below the ABI sees those.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// Where a task (or a whole batch) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Still in flight.
    Pending,
    /// Every byte confirmed at the target.
    Completed,
    /// Failed (a batch: at least one task failed). Also every task pdx gave
    /// up on by itself (a deadline, a dead peer, the engine stopping).
    Failed,
    /// Cancelled by the caller (and only then): no byte of its local memory
    /// is read or written again (a batch: none failed, at least one was
    /// cancelled).
    Canceled,
}

impl TaskState {
    /// Compact form for atomics.
    pub fn to_u8(self) -> u8 {
        match self {
            TaskState::Pending => 0,
            TaskState::Completed => 1,
            TaskState::Failed => 2,
            TaskState::Canceled => 3,
        }
    }

    /// Inverse of [`to_u8`](Self::to_u8); unknown values read as `Failed`.
    pub fn from_u8(v: u8) -> TaskState {
        match v {
            0 => TaskState::Pending,
            1 => TaskState::Completed,
            3 => TaskState::Canceled,
            _ => TaskState::Failed,
        }
    }

    /// True for `Completed`, `Failed` and `Canceled`.
    pub fn is_terminal(self) -> bool {
        self != TaskState::Pending
    }
}

/// A summary of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSummary {
    pub state: TaskState,
    pub total: usize,
    pub completed: usize,
    pub failed: usize,
    /// Tasks cancelled by the caller (counted in neither of the above).
    pub canceled: usize,
    pub bytes: u64,
}

impl BatchSummary {
    /// Count `tasks` (state, bytes); the batch state is terminal only when
    /// `done` (a batch may have work left after its tasks, e.g. a
    /// notification). A done batch is failed if a task failed, else
    /// cancelled if one was, else completed.
    pub fn tally(tasks: impl IntoIterator<Item = (TaskState, u64)>, done: bool) -> BatchSummary {
        let mut s =
            BatchSummary { state: TaskState::Pending, total: 0, completed: 0, failed: 0, canceled: 0, bytes: 0 };
        for (state, bytes) in tasks {
            s.total += 1;
            match state {
                TaskState::Completed => s.completed += 1,
                TaskState::Failed => s.failed += 1,
                TaskState::Canceled => s.canceled += 1,
                TaskState::Pending => {}
            }
            s.bytes += bytes;
        }
        if done {
            s.state = match (s.failed, s.canceled) {
                (0, 0) => TaskState::Completed,
                (0, _) => TaskState::Canceled,
                _ => TaskState::Failed,
            };
        }
        s
    }

    /// Tasks not yet terminal.
    pub fn in_flight(&self) -> usize {
        self.total - self.completed - self.failed - self.canceled
    }

    /// The `Timeout` error for a batch still in flight after waiting `waited`.
    pub fn not_finished(&self, id: u64, waited: Duration) -> Error {
        Error::timeout(format!(
            "batch {id:#x} not finished after {waited:?}: {} of {} tasks still in flight",
            self.in_flight(),
            self.total
        ))
    }
}

/// One task's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSummary {
    pub state: TaskState,
    pub bytes: u64,
    pub error: Option<Error>,
}

/// The error of a finished batch of `total` tasks whose failures are
/// `failures` (in task order): `Ok` when there are none, the failure itself
/// for a single-task batch, else the first one with a count.
pub fn outcome(total: usize, failures: impl IntoIterator<Item = Option<Error>>) -> Result<()> {
    let mut failures = failures.into_iter();
    let Some(first) = failures.next() else { return Ok(()) };
    let count = 1 + failures.count();
    let e = first.unwrap_or_else(|| Error::new(ErrorKind::ConnectionLost, "failed"));
    if total == 1 {
        return Err(e);
    }
    Err(e.context(format!("{count} of {total} requests failed; first")))
}

/// `Busy`: a batch cannot be freed while tasks are in flight.
pub fn still_in_flight(id: u64) -> Error {
    Error::new(ErrorKind::Busy, format!("batch id {id:#x} still has tasks in flight"))
}

/// The error a task cancelled by the caller reports.
pub fn canceled() -> Error {
    Error::new(ErrorKind::Canceled, "canceled by the caller")
}

/// `IndexOutOfRange` for task `i` of a batch of `total`.
pub fn no_such_task(i: usize, total: usize) -> Error {
    Error::new(ErrorKind::IndexOutOfRange, format!("task index {i} out of range (batch has {total} tasks)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_tally() {
        for s in [TaskState::Pending, TaskState::Completed, TaskState::Failed, TaskState::Canceled] {
            assert_eq!(TaskState::from_u8(s.to_u8()), s);
        }
        assert_eq!(TaskState::from_u8(200), TaskState::Failed);
        let tasks =
            [(TaskState::Completed, 4), (TaskState::Failed, 0), (TaskState::Pending, 2), (TaskState::Canceled, 1)];
        let s = BatchSummary::tally(tasks, false);
        assert_eq!(
            (s.state, s.total, s.completed, s.failed, s.canceled, s.bytes, s.in_flight()),
            (TaskState::Pending, 4, 1, 1, 1, 7, 1)
        );
        assert_eq!(BatchSummary::tally(tasks[..1].iter().copied(), true).state, TaskState::Completed);
        assert_eq!(BatchSummary::tally(tasks[..2].iter().copied(), true).state, TaskState::Failed);
        assert_eq!(BatchSummary::tally([tasks[0], tasks[3]], true).state, TaskState::Canceled);
        assert_eq!(BatchSummary::tally([tasks[3], tasks[1]], true).state, TaskState::Failed, "a failure wins");
        assert!(s.not_finished(0x10, Duration::from_secs(1)).message().contains("1 of 4 tasks still in flight"));
    }

    #[test]
    fn outcome_names_the_first_failure_and_counts() {
        assert!(outcome(3, []).is_ok());
        let e = Error::timeout("slow");
        assert_eq!(outcome(1, [Some(e.clone())]).unwrap_err(), e);
        let got = outcome(4, [Some(e), None]).unwrap_err();
        assert_eq!(got.kind(), ErrorKind::Timeout);
        assert_eq!(got.message(), "2 of 4 requests failed; first: slow");
    }
}
