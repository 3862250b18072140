//! pdx batch ids for Mooncake batches.
//!
//! Mooncake's `batch_id_t` is a pointer cast to an integer: a stale or made-up
//! value crashes it. So C never sees it. pdx hands out ids of index +
//! generation (never 0) from this table; the Mooncake id stays inside the
//! entry, behind a lock that freeing takes exclusively, so no thread can poll
//! a Mooncake batch while another frees it.

use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

use super::convert::{STATE_COMPLETED, STATE_FAILED, STATE_PENDING};
use crate::engine::{BatchSummary, Direction, TaskSummary};
use crate::error::{Error, ErrorKind, Result};

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
pub struct TaskState {
    pub state: i32,
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
    pub states: Mutex<Vec<TaskState>>,
}

impl McBatch {
    pub fn new(session: &str, direction: Direction, tasks: Vec<Task>, mc_id: Option<u64>) -> McBatch {
        let states = tasks
            .iter()
            .map(|t| TaskState {
                state: if t.mc_index.is_none() { STATE_COMPLETED } else { STATE_PENDING },
                bytes: 0,
                error: None,
            })
            .collect();
        McBatch { session: session.to_owned(), direction, tasks, mc_id: RwLock::new(mc_id), states: Mutex::new(states) }
    }

    /// True when every task is terminal (from the cached states).
    pub fn is_done(&self) -> bool {
        self.states.lock().iter().all(|s| s.state != STATE_PENDING)
    }

    pub fn summary(&self) -> BatchSummary {
        let states = self.states.lock();
        let mut s = BatchSummary { state: STATE_PENDING, total: states.len(), completed: 0, failed: 0, bytes: 0 };
        for t in states.iter() {
            match t.state {
                STATE_COMPLETED => s.completed += 1,
                STATE_FAILED => s.failed += 1,
                _ => {}
            }
            s.bytes += t.bytes;
        }
        if s.completed + s.failed == s.total {
            s.state = if s.failed == 0 { STATE_COMPLETED } else { STATE_FAILED };
        }
        s
    }

    pub fn task(&self, i: usize) -> Result<TaskSummary> {
        let states = self.states.lock();
        let t = states.get(i).ok_or_else(|| {
            Error::new(ErrorKind::IndexOutOfRange, format!("task index {i} out of range (batch has {} tasks)", states.len()))
        })?;
        Ok(TaskSummary { state: t.state, bytes: t.bytes, error: t.error.clone() })
    }

    /// The first failure with a count, as the native engine reports it.
    pub fn outcome(&self) -> Result<()> {
        let states = self.states.lock();
        let failed: Vec<&TaskState> = states.iter().filter(|t| t.state == STATE_FAILED).collect();
        let Some(first) = failed.first() else { return Ok(()) };
        let e = first.error.clone().unwrap_or_else(|| Error::new(ErrorKind::ConnectionLost, "failed"));
        if states.len() == 1 {
            return Err(e);
        }
        Err(e.context(format!("{} of {} requests failed; first", failed.len(), states.len())))
    }
}

/// Most batches alive at once.
const MAX_LIVE: usize = 1 << 20;

/// Live batches by pdx id.
#[derive(Default)]
pub struct BatchTable {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    entries: Vec<(u32, Option<Arc<McBatch>>)>,
    free: Vec<u32>,
}

fn split(id: u64) -> (usize, u32) {
    (((id & 0xffff_ffff) as usize).wrapping_sub(1), (id >> 32) as u32)
}

fn not_live(id: u64) -> Error {
    Error::new(ErrorKind::InvalidHandle, format!("batch id {id:#x} is not a live batch"))
}

impl BatchTable {
    /// Store `batch`; the id is never 0.
    pub fn insert(&self, batch: Arc<McBatch>) -> Result<u64> {
        let mut s = self.slots.lock();
        let index = match s.free.pop() {
            Some(i) => i as usize,
            None if s.entries.len() < MAX_LIVE => {
                s.entries.push((0, None));
                s.entries.len() - 1
            }
            None => return Err(Error::new(ErrorKind::Busy, format!("{MAX_LIVE} batches are alive; free some first"))),
        };
        let slot = &mut s.entries[index];
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(batch);
        Ok((u64::from(slot.0) << 32) | (index as u64 + 1))
    }

    pub fn get(&self, id: u64) -> Result<Arc<McBatch>> {
        let (index, generation) = split(id);
        match self.slots.lock().entries.get(index) {
            Some((g, Some(b))) if *g == generation => Ok(b.clone()),
            _ => Err(not_live(id)),
        }
    }

    /// Remove `id` if `release` agrees (it frees the Mooncake side). The
    /// table stays locked meanwhile, so one id is released at most once.
    pub fn remove_with(&self, id: u64, release: impl FnOnce(&McBatch) -> Result<()>) -> Result<()> {
        let (index, generation) = split(id);
        let mut s = self.slots.lock();
        let batch = match s.entries.get(index) {
            Some((g, Some(b))) if *g == generation => b.clone(),
            _ => return Err(not_live(id)),
        };
        release(&batch)?;
        s.entries[index].1 = None;
        s.free.push(index as u32);
        Ok(())
    }

    /// Every live batch (for shutdown).
    pub fn all(&self) -> Vec<Arc<McBatch>> {
        self.slots.lock().entries.iter().filter_map(|(_, b)| b.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_never_zero() {
        let t = BatchTable::default();
        let b = Arc::new(McBatch::new("s", Direction::Write, vec![Task { mc_index: None, len: 0, remote: 0 }], None));
        let id = t.insert(b).unwrap();
        assert_ne!(id, 0);
        assert!(t.get(id).unwrap().is_done());
        assert_eq!(t.get(0).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(t.get(id ^ (1 << 32)).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(t.remove_with(id, |_| Err(Error::new(ErrorKind::Busy, "no"))).unwrap_err().kind(), ErrorKind::Busy);
        t.remove_with(id, |_| Ok(())).unwrap();
        assert_eq!(t.get(id).unwrap_err().kind(), ErrorKind::InvalidHandle);
        let id2 = t.insert(Arc::new(McBatch::new("s", Direction::Read, vec![], None))).unwrap();
        assert_ne!(id, id2, "a reused slot gets a new generation");
    }
}
