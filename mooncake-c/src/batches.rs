//! Mooncake's batches over pdx's.
//!
//! A Mooncake batch is allocated with a capacity, then filled by any number
//! of submits whose entries may each name their own segment and opcode; its
//! task ids count 0, 1, ... across those submits. pdx starts one batch per
//! peer and direction, so each submit becomes one pdx batch per (segment,
//! opcode) group, and the Mooncake batch keeps, for every task id, which pdx
//! batch and which entry of it carries the task.

use std::collections::BTreeMap;

use pdx::transfer::{Notification, TaskState};

/// Where one task of a Mooncake batch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Entry `index` of the batch's pdx batch number `sub`.
    Running { sub: usize, index: usize },
    /// Its pdx batch could not be started: the task is failed.
    NotStarted,
    /// Its transport was uninstalled: the state it had then, kept here
    /// (the pdx batch went with that transport's engine).
    Settled { state: TaskState, bytes: u64 },
}

/// Where a task stands, as [`McBatch::task`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Entry `index` of the pdx batch `id` of the installed transport.
    Running {
        id: u64,
        index: usize,
    },
    NotStarted,
    Settled {
        state: TaskState,
        bytes: u64,
    },
}

/// A notification this layer sends itself once every task of the batch has
/// completed (when the batch's work is not one pdx batch that carries it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    pub session: String,
    pub note: Notification,
}

/// One Mooncake batch.
#[derive(Debug)]
pub struct McBatch {
    capacity: usize,
    /// The pdx batches started for it on the installed transport, in order.
    subs: Vec<u64>,
    tasks: Vec<Slot>,
    /// Why each settled task that failed failed.
    settled_failures: BTreeMap<usize, String>,
    /// The notification still to send, if this layer sends it.
    pub deferred: Option<Deferred>,
}

impl McBatch {
    pub fn new(capacity: usize) -> McBatch {
        McBatch { capacity, subs: Vec::new(), tasks: Vec::new(), settled_failures: BTreeMap::new(), deferred: None }
    }

    /// Tasks submitted so far.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// How many more tasks fit.
    pub fn room(&self) -> usize {
        self.capacity - self.tasks.len()
    }

    /// The pdx batches started for it.
    pub fn subs(&self) -> &[u64] {
        &self.subs
    }

    /// Where task `task` stands; `Err` (the number of tasks) when there is
    /// no such task.
    pub fn task(&self, task: usize) -> Result<Place, usize> {
        match self.tasks.get(task) {
            Some(Slot::Running { sub, index }) => Ok(Place::Running { id: self.subs[*sub], index: *index }),
            Some(Slot::NotStarted) => Ok(Place::NotStarted),
            Some(Slot::Settled { state, bytes }) => Ok(Place::Settled { state: *state, bytes: *bytes }),
            None => Err(self.tasks.len()),
        }
    }

    /// Why a settled task failed.
    pub fn settled_failure(&self, task: usize) -> Option<&str> {
        self.settled_failures.get(&task).map(String::as_str)
    }

    /// Whether a task never started.
    pub fn has_unstarted(&self) -> bool {
        self.tasks.contains(&Slot::NotStarted)
    }

    /// Whether every settled task completed (true when none is settled).
    pub fn settled_all_completed(&self) -> bool {
        self.tasks.iter().all(|t| !matches!(t, Slot::Settled { state, .. } if *state != TaskState::Completed))
    }

    /// The transport the batch ran on is going: keep each running task's
    /// state as `outcome(pdx batch id, entry)` gives it (with the reason of
    /// a failure) and forget the pdx batches, so that no id of the old
    /// transport is ever asked of the next one. Later submits start afresh.
    pub fn settle(&mut self, mut outcome: impl FnMut(u64, usize) -> (TaskState, u64, Option<String>)) {
        for (task, slot) in self.tasks.iter_mut().enumerate() {
            if let Slot::Running { sub, index } = *slot {
                let (state, bytes, why) = outcome(self.subs[sub], index);
                *slot = Slot::Settled { state, bytes };
                if let (TaskState::Failed, Some(why)) = (state, why) {
                    self.settled_failures.insert(task, why);
                }
            }
        }
        self.subs.clear();
    }

    /// Open a submit of `n` entries: their task ids follow the batch's
    /// tasks so far; each reads as not started until [`started`](Self::started)
    /// places it. Returns the first new task id.
    pub fn open_submit(&mut self, n: usize) -> usize {
        let base = self.tasks.len();
        self.tasks.resize(base + n, Slot::NotStarted);
        base
    }

    /// A pdx batch `id` started for entries `positions` of the submit whose
    /// first task id is `base` (entry k of the pdx batch is entry
    /// `positions[k]` of the submit).
    pub fn started(&mut self, base: usize, id: u64, positions: &[usize]) {
        let sub = self.subs.len();
        self.subs.push(id);
        for (index, p) in positions.iter().enumerate() {
            self.tasks[base + p] = Slot::Running { sub, index };
        }
    }
}

/// Entries of one submit grouped by `(segment, opcode)` in the order each
/// group first appears: the positions of each group's entries.
pub fn group<K: PartialEq + Copy>(keys: impl IntoIterator<Item = K>) -> Vec<(K, Vec<usize>)> {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    for (i, k) in keys.into_iter().enumerate() {
        // Batches name one or a few peers: a linear search beats hashing.
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, positions)) => positions.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_add_up_across_submits_and_groups() {
        let mut b = McBatch::new(8);
        let base = b.open_submit(3);
        assert_eq!(base, 0);
        // Entries 0 and 2 go to one peer, entry 1 to another.
        b.started(base, 100, &[0, 2]);
        b.started(base, 101, &[1]);
        let running = |id, index| Ok(Place::Running { id, index });
        assert_eq!(b.task(0), running(100, 0));
        assert_eq!(b.task(1), running(101, 0));
        assert_eq!(b.task(2), running(100, 1));
        let base = b.open_submit(2);
        assert_eq!(base, 3);
        b.started(base, 102, &[1]);
        assert_eq!(b.task(3), Ok(Place::NotStarted), "entry 0 of the second submit never started");
        assert_eq!(b.task(4), running(102, 0));
        assert_eq!(b.task(5), Err(5));
        assert!(b.has_unstarted());
        assert_eq!((b.len(), b.room(), b.subs()), (5, 3, &[100, 101, 102][..]));
    }

    #[test]
    fn settled_tasks_keep_their_state_and_new_submits_start_afresh() {
        let mut b = McBatch::new(8);
        let base = b.open_submit(3);
        b.started(base, 7, &[0, 1, 2]);
        assert!(b.settled_all_completed());
        b.settle(|id, index| {
            assert_eq!(id, 7);
            match index {
                1 => (TaskState::Failed, 0, Some("peer gone".into())),
                _ => (TaskState::Completed, 64, None),
            }
        });
        assert!(b.subs().is_empty(), "no id of the old transport is kept");
        assert_eq!(b.task(0), Ok(Place::Settled { state: TaskState::Completed, bytes: 64 }));
        assert_eq!(b.task(1), Ok(Place::Settled { state: TaskState::Failed, bytes: 0 }));
        assert_eq!((b.settled_failure(1), b.settled_failure(0)), (Some("peer gone"), None));
        assert!(!b.settled_all_completed());
        // The next transport numbers its batches from 1 again: a new submit
        // of this batch is found by its own id, never confused with the old.
        let base = b.open_submit(1);
        b.started(base, 7, &[0]);
        assert_eq!(b.task(3), Ok(Place::Running { id: 7, index: 0 }));
        assert_eq!(b.task(0), Ok(Place::Settled { state: TaskState::Completed, bytes: 64 }));
        assert_eq!(b.subs(), &[7]);
    }

    #[test]
    fn groups_keep_first_appearance_order() {
        let g = group([(1, 0), (2, 1), (1, 0), (1, 1), (2, 1)]);
        assert_eq!(g, vec![((1, 0), vec![0, 2]), ((2, 1), vec![1, 4]), ((1, 1), vec![3])]);
        assert!(group(Vec::<(i32, i32)>::new()).is_empty());
    }
}
