//! Registered-memory bookkeeping shared by every backend: regions keyed by
//! start address, the shape and overlap checks, all-or-none registration and
//! withdrawal, and the containment lookup a target uses on every inbound
//! request.

use std::collections::{BTreeMap, HashSet};

use crate::error::{Error, ErrorKind, Result};

/// Regions `[start, start+len)` with a value `T` each, never overlapping.
#[derive(Debug)]
pub struct RegionMap<T> {
    map: BTreeMap<u64, (u64, T)>,
}

impl<T> Default for RegionMap<T> {
    fn default() -> Self {
        RegionMap { map: BTreeMap::new() }
    }
}

/// The end of a region to register, or why it cannot be one.
fn check_shape(addr: u64, len: u64) -> Result<u64> {
    if addr == 0 {
        return Err(Error::invalid_argument("cannot register memory at address 0"));
    }
    if len == 0 {
        return Err(Error::new(
            ErrorKind::AddressOverlap,
            format!("cannot register a zero-length region at {addr:#x}"),
        ));
    }
    addr.checked_add(len)
        .ok_or_else(|| Error::invalid_argument(format!("region {addr:#x}+{len} wraps around the address space")))
}

fn overlap_error(addr: u64, end: u64, other_start: u64, other_end: u64) -> Error {
    Error::new(
        ErrorKind::AddressOverlap,
        format!("region {addr:#x}..{end:#x} overlaps registered region {other_start:#x}..{other_end:#x}"),
    )
}

impl<T> RegionMap<T> {
    /// The region, if any, that overlaps `[addr, end)`: only the last one
    /// starting before `end` can.
    fn overlapping(map: &BTreeMap<u64, (u64, T)>, addr: u64, end: u64) -> Option<(u64, u64)> {
        map.range(..end).next_back().filter(|(s, (l, _))| *s + *l > addr).map(|(s, (l, _))| (*s, *s + *l))
    }

    /// Check that `regions` could all be added: each well-formed, none
    /// overlapping a registered region or another of the list.
    pub fn check_new(&self, regions: &[(u64, u64)]) -> Result<()> {
        let mut added: BTreeMap<u64, (u64, ())> = BTreeMap::new();
        for &(addr, len) in regions {
            let end = check_shape(addr, len)?;
            if let Some((s, e)) = Self::overlapping(&self.map, addr, end) {
                return Err(overlap_error(addr, end, s, e));
            }
            if let Some((s, e)) = RegionMap::<()>::overlapping(&added, addr, end) {
                return Err(overlap_error(addr, end, s, e));
            }
            added.insert(addr, (len, ()));
        }
        Ok(())
    }

    /// Add every region (all or none), each with the value `make` gives it.
    pub fn insert_all(&mut self, regions: &[(u64, u64)], mut make: impl FnMut(u64, u64) -> T) -> Result<()> {
        self.check_new(regions)?;
        for &(addr, len) in regions {
            self.map.insert(addr, (len, make(addr, len)));
        }
        Ok(())
    }

    /// Check that every address in `addrs` starts a region, each once.
    pub fn check_starts(&self, addrs: &[u64]) -> Result<()> {
        let mut seen = HashSet::new();
        for addr in addrs {
            if !self.map.contains_key(addr) || !seen.insert(*addr) {
                return Err(Error::new(ErrorKind::NotFound, format!("no registered region starts at {addr:#x}")));
            }
        }
        Ok(())
    }

    /// Remove the regions starting at `addrs` (all or none); returns their values.
    pub fn remove_all(&mut self, addrs: &[u64]) -> Result<Vec<T>> {
        self.check_starts(addrs)?;
        Ok(addrs.iter().filter_map(|a| self.map.remove(a)).map(|(_, v)| v).collect())
    }

    /// The region that wholly contains `[addr, addr+size)`: `(start, len,
    /// value)`; `None` also for `size == 0` and for ranges that overflow.
    pub fn containing(&self, addr: u64, size: u64) -> Option<(u64, u64, &T)> {
        let end = addr.checked_add(size)?;
        if size == 0 {
            return None;
        }
        let (start, (len, v)) = self.map.range(..=addr).next_back()?;
        (end <= start + len).then_some((*start, *len, v))
    }

    /// The value of the region starting at `addr`.
    pub fn get(&self, addr: u64) -> Option<&T> {
        self.map.get(&addr).map(|(_, v)| v)
    }

    /// Every region, by start address: `(start, len, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, &T)> {
        self.map.iter().map(|(s, (l, v))| (*s, *l, v))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_requires_one_region() {
        let mut r = RegionMap::default();
        r.insert_all(&[(0x1000, 0x100), (0x1100, 0x100)], |_, _| ()).unwrap();
        assert!(r.containing(0x1000, 0x100).is_some());
        assert!(r.containing(0x10ff, 1).is_some());
        assert!(r.containing(0x10ff, 2).is_none(), "spans two adjacent regions");
        assert!(r.containing(0x0fff, 1).is_none());
        assert!(r.containing(0x1200, 1).is_none());
        assert!(r.containing(0x1000, 0).is_none());
        assert!(r.containing(u64::MAX, 2).is_none());
    }

    #[test]
    fn overlaps_and_bad_shapes_are_refused_atomically() {
        let mut r = RegionMap::default();
        r.insert_all(&[(0x1000, 0x100)], |_, _| 1).unwrap();
        for (a, l) in [(0x1000, 1), (0x10ff, 1), (0xf00, 0x101), (0xf00, 0x1000)] {
            assert_eq!(r.check_new(&[(a, l)]).unwrap_err().kind(), ErrorKind::AddressOverlap, "{a:#x}+{l}");
        }
        assert_eq!(r.check_new(&[(0x2000, 0)]).unwrap_err().kind(), ErrorKind::AddressOverlap);
        assert_eq!(r.check_new(&[(0, 1)]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(r.check_new(&[(u64::MAX, 2)]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let inside = r.insert_all(&[(0x3000, 0x10), (0x3008, 0x10)], |_, _| 2).unwrap_err();
        assert_eq!(inside.message(), "region 0x3008..0x3018 overlaps registered region 0x3000..0x3010");
        assert_eq!(r.len(), 1, "nothing of a refused list is registered");
    }

    #[test]
    fn removal_is_exact_and_all_or_none() {
        let mut r = RegionMap::default();
        r.insert_all(&[(0x1000, 0x100), (0x2000, 0x100)], |a, _| a).unwrap();
        assert_eq!(r.remove_all(&[0x1001]).unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(r.remove_all(&[0x1000, 0x1000]).unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(r.remove_all(&[0x1000, 0x3000]).unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(r.len(), 2);
        assert_eq!(r.remove_all(&[0x2000]).unwrap(), vec![0x2000]);
        assert_eq!(r.iter().map(|(s, l, _)| (s, l)).collect::<Vec<_>>(), vec![(0x1000, 0x100)]);
    }
}
