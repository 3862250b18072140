//! Registered memory: the only memory a peer may read or write through us.
//!
//! Every inbound request's `[addr, addr+size)` must lie inside one region.
//! A request holds its region (`Arc`) while it touches the memory and lists
//! its connection with it. Unregistering is a fence: it revokes the region
//! (no new request gets it), shuts down the connections of the requests
//! holding it (which ends any `send`/`recv` they are blocked in, as stopping
//! the engine does) and waits until none holds it; only then does it remove
//! the region and return `Ok`, so no byte of it is touched afterwards. If
//! that does not happen within the deadline the region stays registered
//! (and usable) and the caller gets an error it can retry on.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::super::protocol::descriptor::AdvertisedBuffer;
use super::cuda::{Classified, Device};
use crate::error::{Error, ErrorKind, Result};
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
    /// Connections of the requests inside this region now, by hold id.
    holders: Mutex<HashMap<u64, RawFd>>,
    next_hold: AtomicU64,
}

impl Region {
    /// True once unregistering began: in-flight users must stop.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// List the connection `fd` as touching this region until the hold
    /// drops; `None` if unregistering began (the request must not start).
    /// The hold must drop before `fd` is closed.
    pub fn hold(self: &Arc<Self>, fd: RawFd) -> Option<Hold> {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        self.holders.lock().insert(id, fd);
        // Checked after listing: an unregister that revoked before this
        // either sees the listing (and shuts the connection) or we see the
        // flag here.
        if self.is_revoked() {
            self.holders.lock().remove(&id);
            return None;
        }
        Some(Hold { region: self.clone(), id })
    }

    /// Shut down every connection inside this region now.
    fn shut_holders(&self) {
        for &fd in self.holders.lock().values() {
            // SAFETY: a listed fd is open: holds drop (and unlist it, under
            // this lock) before their connection closes. shutdown only
            // changes the socket's state; the owner still closes it.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }
}

/// A request's claim on a region (see [`Region::hold`]).
pub struct Hold {
    region: Arc<Region>,
    id: u64,
}

impl Hold {
    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.region.holders.lock().remove(&self.id);
    }
}

/// The engine's registered regions, keyed by start address.
#[derive(Default)]
pub struct Regions {
    map: RwLock<RegionMap<Arc<Region>>>,
    /// How many registered regions are device memory (0: no lookups needed
    /// to stage).
    devices: AtomicUsize,
    /// Changes whenever a region is added or removed.
    epoch: AtomicU64,
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
            Arc::new(Region {
                start,
                len,
                location: c.location,
                device: c.device,
                revoked: AtomicBool::new(false),
                holders: Mutex::new(HashMap::new()),
                next_hold: AtomicU64::new(0),
            })
        })?;
        self.devices.fetch_add(devices, Ordering::AcqRel);
        self.epoch.fetch_add(1, Ordering::AcqRel);
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

    /// Unregister several regions by start address, all or none, as a fence
    /// (see the module's documentation); `drain` bounds the wait.
    pub fn unregister_all(&self, addrs: &[u64], drain: Duration) -> Result<()> {
        let revoking: Vec<Arc<Region>> = {
            let map = self.map.write();
            map.check_starts(addrs)?;
            let regions: Vec<Arc<Region>> = addrs.iter().filter_map(|a| map.get(*a).cloned()).collect();
            if let Some(r) = regions.iter().find(|r| r.is_revoked()) {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("region {:#x} is being unregistered by another call", r.start),
                ));
            }
            for r in &regions {
                r.revoked.store(true, Ordering::Release);
            }
            regions
        };
        let deadline = Instant::now() + drain;
        loop {
            for r in &revoking {
                r.shut_holders();
            }
            // Ours, the map's: any more is a request still inside.
            let busy = revoking.iter().find(|r| Arc::strong_count(r) > 2);
            let Some(busy) = busy else { break };
            if Instant::now() >= deadline {
                let start = busy.start;
                for r in &revoking {
                    r.revoked.store(false, Ordering::Release);
                }
                return Err(Error::timeout(format!(
                    "region {start:#x} is still in use by an inbound transfer after {drain:?}; it stays registered"
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let removed = self.map.write().remove_all(addrs)?;
        self.devices.fetch_sub(removed.iter().filter(|r| r.device.is_some()).count(), Ordering::AcqRel);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The region that wholly contains `[addr, addr+size)`, or `None`
    /// (also for `size == 0`, for ranges that overflow, and while the
    /// region is being unregistered).
    pub fn lookup(&self, addr: u64, size: u64) -> Option<Arc<Region>> {
        self.map.read().containing(addr, size).map(|(_, _, r)| r.clone()).filter(|r| !r.is_revoked())
    }

    /// A number that changes whenever a region is added or removed.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The host regions (start, length), by address.
    pub fn host_ranges(&self) -> Vec<(u64, u64)> {
        self.map.read().iter().filter(|(_, _, r)| r.device.is_none()).map(|(a, l, _)| (a, l)).collect()
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

    #[test]
    fn an_unfinished_fence_leaves_the_region_registered() {
        let r = Regions::default();
        r.register_all(&[(0x1000, 0x100)]).unwrap();
        let held = r.lookup(0x1000, 1).unwrap();
        let e = r.unregister_all(&[0x1000], Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(r.lookup(0x1000, 1).is_some(), "still registered and usable");
        drop(held);
        r.unregister_all(&[0x1000], Duration::from_secs(1)).unwrap();
        assert!(r.lookup(0x1000, 1).is_none());
        assert_eq!(r.unregister_all(&[0x1000], Duration::ZERO).unwrap_err().kind(), ErrorKind::NotFound);
    }
}
