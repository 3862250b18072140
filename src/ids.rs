//! Checked ids for objects C refers to by number (asynchronous batches):
//! a slot index plus a generation, never a pointer, never 0. A stale, freed
//! or made-up id is an `InvalidHandle` error, not a crash.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, ErrorKind, Result};

/// Most objects alive at once in one table.
const MAX_LIVE: usize = 1 << 20;

/// A table of live objects by id.
pub struct IdTable<T> {
    what: &'static str,
    slots: Mutex<Slots<T>>,
}

struct Slots<T> {
    entries: Vec<(u32, Option<Arc<T>>)>,
    free: Vec<u32>,
}

fn split(id: u64) -> (usize, u32) {
    (((id & 0xffff_ffff) as usize).wrapping_sub(1), (id >> 32) as u32)
}

impl<T> IdTable<T> {
    /// An empty table; `what` names the objects in error messages.
    pub fn new(what: &'static str) -> Self {
        IdTable { what, slots: Mutex::new(Slots { entries: Vec::new(), free: Vec::new() }) }
    }

    fn not_live(&self, id: u64) -> Error {
        Error::new(ErrorKind::InvalidHandle, format!("{} id {id:#x} is not live (freed, or never issued)", self.what))
    }

    /// Store `value`; the id is never 0, and a reused slot gets a new
    /// generation so old ids stay dead. `Busy` when the table is full.
    pub fn insert(&self, value: Arc<T>) -> Result<u64> {
        let mut s = self.slots.lock();
        let index = match s.free.pop() {
            Some(i) => i as usize,
            None if s.entries.len() < MAX_LIVE => {
                s.entries.push((0, None));
                s.entries.len() - 1
            }
            None => {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("{MAX_LIVE} {}es are alive; free some first", self.what),
                ))
            }
        };
        let slot = &mut s.entries[index];
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(value);
        Ok((u64::from(slot.0) << 32) | (index as u64 + 1))
    }

    /// The live object behind `id`.
    pub fn get(&self, id: u64) -> Result<Arc<T>> {
        let (index, generation) = split(id);
        match self.slots.lock().entries.get(index) {
            Some((g, Some(v))) if *g == generation => Ok(v.clone()),
            _ => Err(self.not_live(id)),
        }
    }

    /// Remove `id` if `release` agrees. The table stays locked meanwhile, so
    /// one id is released at most once.
    pub fn remove_with(&self, id: u64, release: impl FnOnce(&T) -> Result<()>) -> Result<()> {
        let (index, generation) = split(id);
        let mut s = self.slots.lock();
        let value = match s.entries.get(index) {
            Some((g, Some(v))) if *g == generation => v.clone(),
            _ => return Err(self.not_live(id)),
        };
        release(&value)?;
        s.entries[index].1 = None;
        s.free.push(index as u32);
        Ok(())
    }

    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.slots.lock().entries.iter().filter_map(|(_, v)| v.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_never_zero_and_not_reused() {
        let t: IdTable<u32> = IdTable::new("batch");
        let id = t.insert(Arc::new(5)).unwrap();
        assert_ne!(id, 0);
        assert_eq!(*t.get(id).unwrap(), 5);
        for bad in [0, 1 << 32, id ^ (1 << 32), u64::MAX, id + 1] {
            assert_eq!(t.get(bad).unwrap_err().kind(), ErrorKind::InvalidHandle, "{bad:#x}");
        }
        let busy = t.remove_with(id, |_| Err(Error::new(ErrorKind::Busy, "in flight")));
        assert_eq!(busy.unwrap_err().kind(), ErrorKind::Busy);
        t.remove_with(id, |_| Ok(())).unwrap();
        assert_eq!(t.get(id).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(t.remove_with(id, |_| Ok(())).unwrap_err().kind(), ErrorKind::InvalidHandle);
        let id2 = t.insert(Arc::new(6)).unwrap();
        assert_ne!(id, id2, "a reused slot gets a new generation");
        assert_eq!(t.all().len(), 1);
    }
}
