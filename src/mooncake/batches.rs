//! Mooncake batches behind pdx batch ids.
//!
//! Mooncake's `batch_id_t` is a pointer cast to an integer: a stale or made-up
//! value crashes it. So C never sees it: pdx hands out checked ids
//! ([`crate::ids::IdTable`]) and the Mooncake id stays inside the entry,
//! behind a lock that freeing takes exclusively, so no thread can poll a
//! Mooncake batch while another frees it.

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::transfer::state::{self, BatchSummary, TaskState, TaskSummary};
use crate::transfer::Direction;

/// One pdx task.
#[derive(Debug)]
pub struct Task {
    /// Index of the task in the Mooncake batch; `None` for a zero-length
    /// request (completed at once, never submitted).
    pub mc_index: Option<usize>,
    pub len: u64,
    pub remote: u64,
}

/// What is known about one task (terminal states never change again).
#[derive(Debug, Clone)]
pub struct Known {
    pub state: TaskState,
    pub bytes: u64,
    pub error: Option<Error>,
}

/// A submitted batch.
#[derive(Debug)]
pub struct McBatch {
    pub session: String,
    pub direction: Direction,
    pub tasks: Vec<Task>,
    /// The Mooncake batch id; `None` once freed (or when every request had
    /// length zero). Polls hold it shared, freeing holds it exclusively.
    pub mc_id: RwLock<Option<u64>>,
    pub states: Mutex<Vec<Known>>,
    /// When the batch was submitted: task latencies count from here.
    pub started: std::time::Instant,
}

impl McBatch {
    pub fn new(session: &str, direction: Direction, tasks: Vec<Task>, mc_id: Option<u64>) -> McBatch {
        let states = tasks
            .iter()
            .map(|t| Known {
                state: if t.mc_index.is_none() { TaskState::Completed } else { TaskState::Pending },
                bytes: 0,
                error: None,
            })
            .collect();
        McBatch {
            session: session.to_owned(),
            direction,
            tasks,
            mc_id: RwLock::new(mc_id),
            states: Mutex::new(states),
            started: std::time::Instant::now(),
        }
    }

    /// True when every task is terminal (from the cached states).
    pub fn is_done(&self) -> bool {
        self.states.lock().iter().all(|s| s.state.is_terminal())
    }

    pub fn summary(&self) -> BatchSummary {
        let states = self.states.lock();
        let done = states.iter().all(|s| s.state.is_terminal());
        BatchSummary::tally(states.iter().map(|t| (t.state, t.bytes)), done)
    }

    pub fn task(&self, i: usize) -> Result<TaskSummary> {
        let states = self.states.lock();
        let t = states.get(i).ok_or_else(|| state::no_such_task(i, states.len()))?;
        Ok(TaskSummary { state: t.state, bytes: t.bytes, error: t.error.clone() })
    }

    /// The first failure with a count, as every backend reports it.
    pub fn outcome(&self) -> Result<()> {
        let states = self.states.lock();
        let failures = states.iter().filter(|t| t.state == TaskState::Failed).map(|t| t.error.clone());
        state::outcome(states.len(), failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_length_tasks_are_done_at_once() {
        let b = McBatch::new("s", Direction::Write, vec![Task { mc_index: None, len: 0, remote: 0 }], None);
        assert!(b.is_done());
        let b = McBatch::new("s", Direction::Write, vec![Task { mc_index: Some(0), len: 8, remote: 64 }], Some(1));
        assert!(!b.is_done());
    }
}
