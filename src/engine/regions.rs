//! Registered memory: the only memory a peer may read or write through us.
//!
//! Every inbound request's `[addr, addr+size)` must lie inside one region.
//! A request holds its region (`Arc`) while it touches the memory, and
//! unregistering revokes the region first and then waits for those holders,
//! so memory is never touched after `unregister` returns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::cuda::{Classified, Device};
use super::descriptor::AdvertisedBuffer;
use crate::error::{Error, Result};
use crate::transfer::location::Location;
use crate::transfer::regions::RegionMap;

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
    map: RwLock<RegionMap<Arc<Region>>>,
    /// How many registered regions are device memory (0: no lookups needed
    /// to stage).
    devices: AtomicUsize,
}

impl Regions {
    /// Register several host regions, all or none.
    #[cfg(test)]
    pub fn register_all(&self, regions: &[(u64, u64)]) -> Result<()> {
        self.register_all_at(
            regions.iter().map(|&(a, l)| (a, l, Classified { location: Location::default(), device: None })).collect(),
        )
    }

    /// Register several regions with their classified locations, all or none.
    pub fn register_all_at(&self, regions: Vec<(u64, u64, Classified)>) -> Result<()> {
        let ranges: Vec<(u64, u64)> = regions.iter().map(|&(a, l, _)| (a, l)).collect();
        let devices = regions.iter().filter(|r| r.2.device.is_some()).count();
        let mut classified = regions.into_iter().map(|(_, _, c)| c);
        let mut map = self.map.write();
        map.insert_all(&ranges, |start, len| {
            let c = classified.next().unwrap_or(Classified { location: Location::default(), device: None });
            Arc::new(Region { start, len, location: c.location, device: c.device, revoked: AtomicBool::new(false) })
        })?;
        self.devices.fetch_add(devices, Ordering::AcqRel);
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
        let found =
            map.iter().find(|(s, l, r)| *s < end && s + l > addr && r.device.is_some()).map(|(_, _, r)| r.clone());
        found
    }

    /// Unregister several regions by start address, all or none; waits up to
    /// `drain` for requests still using them.
    pub fn unregister_all(&self, addrs: &[u64], drain: Duration) -> Result<()> {
        let removed = self.map.write().remove_all(addrs)?;
        self.devices.fetch_sub(removed.iter().filter(|r| r.device.is_some()).count(), Ordering::AcqRel);
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
        self.map.read().containing(addr, size).map(|(_, _, r)| r.clone())
    }

    /// The regions as advertised in our descriptor.
    pub fn advertised(&self) -> Vec<AdvertisedBuffer> {
        self.map.read().iter().map(|(addr, length, _)| AdvertisedBuffer { addr, length }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

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
