//! Registered memory: the only memory a peer may read or write through us.
//!
//! Every inbound request's `[addr, addr+size)` must lie inside one region.
//! A request holds its region (`Arc`) while it touches the memory, and
//! unregistering revokes the region first and then waits for those holders,
//! so memory is never touched after `unregister` returns.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::cuda::{Classified, Device};
use super::descriptor::AdvertisedBuffer;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;

/// One registered region.
#[derive(Debug)]
pub struct Region {
    pub start: u64,
    pub len: u64,
    /// Where the bytes live; device memory is only ever staged.
    pub location: Location,
    /// The device (primary context retained) for device memory.
    pub device: Option<Arc<Device>>,
    revoked: AtomicBool,
}

impl Region {
    /// True once unregistering began: in-flight users must stop.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

/// The engine's registered regions, keyed by start address.
#[derive(Default)]
pub struct Regions {
    map: RwLock<BTreeMap<u64, Arc<Region>>>,
    /// How many registered regions are device memory (0: no lookups needed
    /// to stage).
    devices: std::sync::atomic::AtomicUsize,
}

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

fn overlap_error(addr: u64, len: u64, other: &Region) -> Error {
    Error::new(
        ErrorKind::AddressOverlap,
        format!(
            "region {addr:#x}..{:#x} overlaps registered region {:#x}..{:#x}",
            addr + len,
            other.start,
            other.start + other.len
        ),
    )
}

impl Regions {
    /// The registered region, if any, that overlaps `[addr, end)`.
    fn overlapping(map: &BTreeMap<u64, Arc<Region>>, addr: u64, end: u64) -> Option<Arc<Region>> {
        // The last region starting before `end` is the only candidate.
        map.range(..end).next_back().filter(|(_, r)| r.start + r.len > addr).map(|(_, r)| r.clone())
    }

    /// Register several host regions, all or none.
    pub fn register_all(&self, regions: &[(u64, u64)]) -> Result<()> {
        self.register_all_at(
            regions.iter().map(|&(a, l)| (a, l, Classified { location: Location::default(), device: None })).collect(),
        )
    }

    /// Register several regions with their classified locations, all or none.
    pub fn register_all_at(&self, regions: Vec<(u64, u64, Classified)>) -> Result<()> {
        let mut map = self.map.write();
        let mut added: BTreeMap<u64, Arc<Region>> = BTreeMap::new();
        for (addr, len, c) in regions {
            let end = check_shape(addr, len)?;
            for existing in [&*map, &added] {
                if let Some(other) = Self::overlapping(existing, addr, end) {
                    return Err(overlap_error(addr, len, &other));
                }
            }
            let region =
                Region { start: addr, len, location: c.location, device: c.device, revoked: AtomicBool::new(false) };
            added.insert(addr, Arc::new(region));
        }
        self.devices.fetch_add(added.values().filter(|r| r.device.is_some()).count(), Ordering::AcqRel);
        map.extend(added);
        Ok(())
    }

    /// True if any registered region is device memory.
    pub fn has_device_regions(&self) -> bool {
        self.devices.load(Ordering::Acquire) > 0
    }

    /// A device region overlapping `[addr, addr+len)`, if any (to refuse a
    /// local range that is partly device memory).
    pub fn device_overlapping(&self, addr: u64, len: u64) -> Option<Arc<Region>> {
        let end = addr.checked_add(len.max(1))?;
        let map = self.map.read();
        // Regions do not overlap: walk back from `end` while they reach `addr`.
        map.range(..end)
            .rev()
            .take_while(|(_, r)| r.start + r.len > addr)
            .find(|(_, r)| r.device.is_some())
            .map(|(_, r)| r.clone())
    }

    /// Unregister several regions by start address, all or none; waits up to
    /// `drain` for requests still using them.
    pub fn unregister_all(&self, addrs: &[u64], drain: Duration) -> Result<()> {
        let removed: Vec<Arc<Region>> = {
            let mut map = self.map.write();
            let mut seen = std::collections::HashSet::new();
            for addr in addrs {
                if !map.contains_key(addr) || !seen.insert(*addr) {
                    return Err(Error::new(ErrorKind::NotFound, format!("no registered region starts at {addr:#x}")));
                }
            }
            let removed: Vec<Arc<Region>> = addrs.iter().filter_map(|a| map.remove(a)).collect();
            self.devices.fetch_sub(removed.iter().filter(|r| r.device.is_some()).count(), Ordering::AcqRel);
            removed
        };
        for r in &removed {
            r.revoked.store(true, Ordering::Release);
        }
        let deadline = Instant::now() + drain;
        for r in &removed {
            // Holders are inbound requests; they check `is_revoked` between
            // slices and each slice is bounded by the progress timeout.
            while Arc::strong_count(r) > 1 {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "region {:#x} is still in use by an inbound transfer after {drain:?}",
                        r.start
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// The region that wholly contains `[addr, addr+size)`, or `None`
    /// (also for `size == 0` and for ranges that overflow).
    pub fn lookup(&self, addr: u64, size: u64) -> Option<Arc<Region>> {
        let end = addr.checked_add(size)?;
        if size == 0 {
            return None;
        }
        let map = self.map.read();
        let (_, r) = map.range(..=addr).next_back()?;
        (end <= r.start + r.len).then(|| r.clone())
    }

    /// The regions as advertised in our descriptor.
    pub fn advertised(&self) -> Vec<AdvertisedBuffer> {
        self.map.read().values().map(|r| AdvertisedBuffer { addr: r.start, length: r.len }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_requires_one_region() {
        let r = Regions::default();
        r.register_all(&[(0x1000, 0x100), (0x1100, 0x100)]).unwrap();
        assert!(r.lookup(0x1000, 0x100).is_some());
        assert!(r.lookup(0x10ff, 1).is_some());
        assert!(r.lookup(0x10ff, 2).is_none(), "spans two adjacent regions");
        assert!(r.lookup(0x0fff, 1).is_none());
        assert!(r.lookup(0x1200, 1).is_none());
        assert!(r.lookup(0x1000, 0).is_none());
        assert!(r.lookup(u64::MAX, 2).is_none());
    }

    #[test]
    fn overlaps_and_zero_lengths_are_refused_atomically() {
        let r = Regions::default();
        r.register_all(&[(0x1000, 0x100)]).unwrap();
        for (a, l) in [(0x1000, 1), (0x10ff, 1), (0xf00, 0x101), (0xf00, 0x1000)] {
            assert_eq!(r.register_all(&[(a, l)]).unwrap_err().kind(), ErrorKind::AddressOverlap, "{a:#x}+{l}");
        }
        assert_eq!(r.register_all(&[(0x2000, 0)]).unwrap_err().kind(), ErrorKind::AddressOverlap);
        assert_eq!(r.register_all(&[(0, 1)]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(r.register_all(&[(u64::MAX, 2)]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        // Overlap inside one batch: nothing is registered.
        assert!(r.register_all(&[(0x3000, 0x10), (0x3008, 0x10)]).is_err());
        assert!(r.lookup(0x3000, 1).is_none());
        assert_eq!(r.advertised().len(), 1);
    }

    #[test]
    fn unregister_is_exact_and_waits_for_holders() {
        let r = Arc::new(Regions::default());
        r.register_all(&[(0x1000, 0x100), (0x2000, 0x100)]).unwrap();
        assert_eq!(r.unregister_all(&[0x1001], Duration::ZERO).unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(r.unregister_all(&[0x1000, 0x1000], Duration::ZERO).unwrap_err().kind(), ErrorKind::NotFound);
        let held = r.lookup(0x2000, 1).unwrap();
        let releaser = std::thread::spawn(move || {
            while !held.is_revoked() {
                std::thread::yield_now();
            }
            drop(held);
        });
        r.unregister_all(&[0x2000], Duration::from_secs(10)).unwrap();
        releaser.join().unwrap();
        assert!(r.lookup(0x2000, 1).is_none());
        assert!(r.lookup(0x1000, 1).is_some());
    }
}
