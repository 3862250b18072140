//! Checked ids: the one table behind every object C refers to, by handle
//! (engines, argument sets, transport choices, ...) or by number
//! (asynchronous batches). An id is a slot index plus a generation plus a
//! tag naming the table, never a pointer, never 0. A stale, freed, foreign
//! or made-up id is an `InvalidHandle` error, not a crash; a freed slot is
//! reused (memory stays flat however many objects come and go) under a new
//! generation, so the old id stays dead.
//!
//! Layout: `tag << 56 | generation << 24 | (index + 1)`.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::{Error, ErrorKind, Result};

/// Most objects alive at once in one table.
const MAX_LIVE: usize = 1 << 20;
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u64 = 0xffff_ffff;

/// A table of live objects by id.
pub struct IdTable<T> {
    what: &'static str,
    tag: u8,
    /// Read-locked by lookups (status polls look up their batch on every
    /// call: they never wait on each other), write-locked to insert and remove.
    slots: RwLock<Slots<T>>,
}

struct Slots<T> {
    entries: Vec<(u32, Option<Arc<T>>)>,
    free: Vec<u32>,
}

impl<T> IdTable<T> {
    /// An empty table; `what` names the objects in error messages, `tag`
    /// (distinct per table that shares an id space) keeps one table's ids
    /// from ever naming an object of another.
    pub const fn new(what: &'static str, tag: u8) -> Self {
        IdTable { what, tag, slots: parking_lot::const_rwlock(Slots { entries: Vec::new(), free: Vec::new() }) }
    }

    /// `(index, generation)` of an id of this table.
    fn split(&self, id: u64) -> Option<(usize, u32)> {
        if (id >> 56) as u8 != self.tag {
            return None;
        }
        let index = ((id & INDEX_MASK) as usize).checked_sub(1)?;
        Some((index, ((id >> INDEX_BITS) & GENERATION_MASK) as u32))
    }

    fn not_live(&self, id: u64) -> Error {
        Error::new(ErrorKind::InvalidHandle, format!("{} {id:#x} is not live (freed, or never issued)", self.what))
    }

    /// Store `value`; the id is never 0, and a reused slot gets a new
    /// generation so old ids stay dead. `Busy` when the table is full.
    pub fn insert(&self, value: Arc<T>) -> Result<u64> {
        let mut s = self.slots.write();
        let index = match s.free.pop() {
            Some(i) => i as usize,
            None if s.entries.len() < MAX_LIVE => {
                s.entries.push((0, None));
                s.entries.len() - 1
            }
            None => {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("{MAX_LIVE} of {} are alive; free some first", self.what),
                ))
            }
        };
        let slot = &mut s.entries[index];
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(value);
        Ok((u64::from(self.tag) << 56) | (u64::from(slot.0) << INDEX_BITS) | (index as u64 + 1))
    }

    /// The live object behind `id`.
    pub fn get(&self, id: u64) -> Result<Arc<T>> {
        let (index, generation) = self.split(id).ok_or_else(|| self.not_live(id))?;
        match self.slots.read().entries.get(index) {
            Some((g, Some(v))) if *g == generation => Ok(v.clone()),
            _ => Err(self.not_live(id)),
        }
    }

    /// Remove `id` if `release` agrees. The table stays locked meanwhile, so
    /// one id is released at most once.
    pub fn remove_with(&self, id: u64, release: impl FnOnce(&T) -> Result<()>) -> Result<Arc<T>> {
        let (index, generation) = self.split(id).ok_or_else(|| self.not_live(id))?;
        let mut s = self.slots.write();
        let value = match s.entries.get(index) {
            Some((g, Some(v))) if *g == generation => v.clone(),
            _ => return Err(self.not_live(id)),
        };
        release(&value)?;
        s.entries[index].1 = None;
        s.free.push(index as u32);
        Ok(value)
    }

    /// Remove `id` unconditionally; the object if it was live.
    pub fn remove(&self, id: u64) -> Option<Arc<T>> {
        self.remove_with(id, |_| Ok(())).ok()
    }

    /// What the table holds, as messages name it.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.slots.read().entries.iter().filter_map(|(_, v)| v.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_never_zero_and_not_reused() {
        let t: IdTable<u32> = IdTable::new("batch", 0);
        let id = t.insert(Arc::new(5)).unwrap();
        assert_ne!(id, 0);
        assert_eq!(*t.get(id).unwrap(), 5);
        for bad in [0, 1 << 24, id ^ (1 << 24), u64::MAX, id + 1, id | (1 << 56)] {
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

    #[test]
    fn tags_keep_tables_apart_and_slots_are_reused() {
        let a: IdTable<u32> = IdTable::new("a", 1);
        let b: IdTable<u32> = IdTable::new("b", 2);
        let ida = a.insert(Arc::new(1)).unwrap();
        let idb = b.insert(Arc::new(2)).unwrap();
        assert_eq!(ida & !(0xff << 56), idb & !(0xff << 56), "same slot and generation");
        assert_eq!(b.get(ida).unwrap_err().kind(), ErrorKind::InvalidHandle);
        assert_eq!(a.get(idb).unwrap_err().kind(), ErrorKind::InvalidHandle);
        let mut stale = ida;
        for _ in 0..1000 {
            a.remove(stale).unwrap();
            let fresh = a.insert(Arc::new(3)).unwrap();
            assert_eq!(a.get(stale).unwrap_err().kind(), ErrorKind::InvalidHandle);
            assert!(a.remove(stale).is_none());
            stale = fresh;
        }
        assert_eq!(a.slots.read().entries.len(), 1, "one slot serves every cycle");
    }
}
