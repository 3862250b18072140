//! Mooncake's batches over pdx's.
//!
//! A Mooncake batch is allocated with a capacity, then filled by any number
//! of submits whose entries may each name their own segment and opcode; its
//! task ids count 0, 1, ... across those submits. pdx starts one batch per
//! peer and direction, so each submit becomes one pdx batch per (segment,
//! opcode) group, and the Mooncake batch keeps, for every task id, which pdx
//! batch and which entry of it carries the task.

/// Where one task of a Mooncake batch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Entry `index` of the batch's pdx batch number `sub`.
    Running { sub: usize, index: usize },
    /// Its pdx batch could not be started: the task is failed.
    NotStarted,
}

/// A notification this layer sends itself once every task of the batch has
/// completed (when the batch's work is not one pdx batch that carries it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    pub session: String,
    pub name: String,
    pub msg: String,
}

/// One Mooncake batch.
#[derive(Debug)]
pub struct McBatch {
    capacity: usize,
    /// The pdx batches started for it, in order.
    subs: Vec<u64>,
    tasks: Vec<Slot>,
    /// The notification still to send, if this layer sends it.
    pub deferred: Option<Deferred>,
}

impl McBatch {
    pub fn new(capacity: usize) -> McBatch {
        McBatch { capacity, subs: Vec::new(), tasks: Vec::new(), deferred: None }
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

    /// Where task `task` runs: `(pdx batch id, entry)`, or `None` when it
    /// never started; `Err` when there is no such task.
    pub fn task(&self, task: usize) -> Result<Option<(u64, usize)>, usize> {
        match self.tasks.get(task) {
            Some(Slot::Running { sub, index }) => Ok(Some((self.subs[*sub], *index))),
            Some(Slot::NotStarted) => Ok(None),
            None => Err(self.tasks.len()),
        }
    }

    /// Whether a task never started.
    pub fn has_unstarted(&self) -> bool {
        self.tasks.contains(&Slot::NotStarted)
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
        assert_eq!(b.task(0), Ok(Some((100, 0))));
        assert_eq!(b.task(1), Ok(Some((101, 0))));
        assert_eq!(b.task(2), Ok(Some((100, 1))));
        let base = b.open_submit(2);
        assert_eq!(base, 3);
        b.started(base, 102, &[1]);
        assert_eq!(b.task(3), Ok(None), "entry 0 of the second submit never started");
        assert_eq!(b.task(4), Ok(Some((102, 0))));
        assert_eq!(b.task(5), Err(5));
        assert!(b.has_unstarted());
        assert_eq!((b.len(), b.room(), b.subs()), (5, 3, &[100, 101, 102][..]));
    }

    #[test]
    fn groups_keep_first_appearance_order() {
        let g = group([(1, 0), (2, 1), (1, 0), (1, 1), (2, 1)]);
        assert_eq!(g, vec![((1, 0), vec![0, 2]), ((2, 1), vec![1, 4]), ((1, 1), vec![3])]);
        assert!(group(Vec::<(i32, i32)>::new()).is_empty());
    }
}
