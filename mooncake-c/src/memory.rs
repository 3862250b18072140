//! The memory one engine registered, kept above its transports as Mooncake
//! keeps it: each region with the location it was registered at, to refuse
//! an unregistered local range before anything starts (as Mooncake's
//! transports do) and to serve it again on the next transport installed.
//!
//! Registrations outlive a transport. `installTransport` registers every
//! region with the new one; such a region is "carried" until the caller
//! registers it again (same start and length: a no-op that returns 0, where
//! Mooncake answers -7 because its registration never left) or unregisters
//! it.

use std::collections::HashSet;

use mooncake_sys::Code;
use pdx::transfer::location::Requested;
use pdx::transfer::regions::RegionMap;
use pdx::transfer::TransferBackend;
use pdx::ErrorKind;

use crate::codes::{McError, McResult};

/// A region: start address and length.
type Region = (u64, u64);

#[derive(Default)]
pub struct Registered {
    map: RegionMap<Requested>,
    carried: HashSet<u64>,
}

impl Registered {
    /// Whether `[addr, addr+len)` lies inside one registered region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        self.map.containing(addr, len).is_some()
    }

    /// `registerLocalMemory(Batch)` with `backend`, all or none.
    pub fn register(&mut self, backend: &dyn TransferBackend, regions: &[(u64, u64)], at: Requested) -> McResult<()> {
        let carried = |&(addr, len): &Region| {
            self.carried.contains(&addr)
                && self.map.containing(addr, len).is_some_and(|(s, l, _)| s == addr && l == len)
        };
        let (again, new): (Vec<Region>, Vec<Region>) = regions.iter().copied().partition(carried);
        let mut once = HashSet::new();
        if !again.iter().all(|(addr, _)| once.insert(*addr)) {
            // The same region twice in one list overlaps itself.
            self.map.check_new(regions)?;
        }
        self.map.check_new(&new)?;
        if !new.is_empty() {
            backend.register_batch_at(&new, at)?;
        }
        self.map.insert_all(&new, |_, _| at)?;
        for (addr, _) in again {
            self.carried.remove(&addr);
        }
        Ok(())
    }

    /// `unregisterLocalMemory(Batch)`, all or none; withdrawn from `backend`
    /// when a transport is installed. An address that starts no region is
    /// "address not registered".
    pub fn unregister(&mut self, backend: Option<&dyn TransferBackend>, addrs: &[u64]) -> McResult<()> {
        let not_registered = |e: pdx::Error| McError::new(Code::AddressNotRegistered, e.message());
        self.map.check_starts(addrs).map_err(not_registered)?;
        if let Some(backend) = backend {
            backend.unregister_batch(addrs).map_err(|e| match e.kind() {
                ErrorKind::NotFound => not_registered(e),
                _ => McError::from(e),
            })?;
        }
        self.map.remove_all(addrs)?;
        for addr in addrs {
            self.carried.remove(addr);
        }
        Ok(())
    }

    /// Register every region with a newly started `backend` (one call per
    /// location); each is carried from now on.
    pub fn carry_to(&mut self, backend: &dyn TransferBackend) -> McResult<()> {
        let mut by_location: Vec<(Requested, Vec<Region>)> = Vec::new();
        for (start, len, at) in self.map.iter() {
            match by_location.iter_mut().find(|(a, _)| a == at) {
                Some((_, regions)) => regions.push((start, len)),
                None => by_location.push((*at, vec![(start, len)])),
            }
        }
        for (at, regions) in by_location {
            backend.register_batch_at(&regions, at).map_err(|e| {
                let mut err = McError::from(e.clone());
                err.message = format!(
                    "registering the engine's {} region(s) at {at} with the new transport: {}",
                    regions.len(),
                    e.message()
                );
                err
            })?;
        }
        self.carried = self.map.iter().map(|(start, _, _)| start).collect();
        Ok(())
    }
}
