//! A batch checked once, before anything is planned or sent: the engine is
//! running, every request is well-formed and within the limits, and each
//! local range is classified (host memory, or device memory of one of this
//! engine's regions) or refused. The planner takes only what this returns.

use std::sync::Arc;

use super::super::memory::cuda::{self, Device};
use super::super::memory::regions::Regions;
use super::super::settings::Settings;
use super::limits;
use super::plan::Kind;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::Request;

/// A checked batch.
pub(crate) struct Prepared {
    pub reqs: Vec<Request>,
    /// Where each request's local bytes are (empty: all host memory).
    pub kinds: Vec<Kind>,
    /// The devices `kinds` name.
    pub devices: Vec<Arc<Device>>,
}

impl Prepared {
    /// The device with `ordinal` among this batch's.
    pub fn device(&self, ordinal: u32) -> Option<&Arc<Device>> {
        self.devices.iter().find(|d| d.ordinal == ordinal)
    }
}

/// Check `reqs` once: shapes and limits, then every local range.
pub(crate) fn prepare(settings: &Settings, regions: &Regions, reqs: Vec<Request>) -> Result<Prepared> {
    Request::validate_all(&reqs)?;
    limits::check_requests(settings, &reqs)?;
    let has_devices = regions.has_device_regions();
    let driver = cuda::resident_driver();
    let mut prepared = Prepared { kinds: Vec::new(), devices: Vec::new(), reqs };
    if !has_devices && driver.is_none() {
        return Ok(prepared);
    }
    let mut kinds = Vec::with_capacity(prepared.reqs.len());
    for (i, r) in prepared.reqs.iter().enumerate() {
        let dev = classify(regions, has_devices, driver.as_deref(), i, r)?;
        kinds.push(dev.as_ref().map(|d| d.ordinal));
        if let Some(dev) = dev.filter(|d| prepared.device(d.ordinal).is_none()) {
            prepared.devices.push(dev);
        }
    }
    if kinds.iter().any(Option::is_some) {
        prepared.kinds = kinds;
    }
    Ok(prepared)
}

/// Where request `i`'s local range is, or why it cannot move: the CPU must
/// not touch it and staging cannot move it. Refused: ranges partly inside
/// a device region of this engine, and (when the CUDA driver is loaded in
/// this process) ranges outside every region of this engine that the
/// driver says are device memory, such as device memory never registered,
/// or registered on another engine only. Ranges inside one registered
/// region ask the driver nothing.
fn classify(
    regions: &Regions,
    has_devices: bool,
    driver: Option<&cuda_sys::Api>,
    i: usize,
    r: &Request,
) -> Result<Option<Arc<Device>>> {
    if r.len == 0 {
        return Ok(None);
    }
    let (addr, len) = (r.local as u64, r.len as u64);
    if let Some(region) = regions.lookup(addr, len) {
        return Ok(region.device.clone());
    }
    if let Some(dev) = has_devices.then(|| regions.device_overlapping(addr, len)).flatten() {
        return Err(Error::new(
            ErrorKind::AddressNotRegistered,
            format!(
                "request {i}: local range {addr:#x}+{len} is not inside device region {:#x}+{} ({}) \
                 it overlaps; device memory is moved only within one registered region",
                dev.start, dev.len, dev.location
            ),
        ));
    }
    if let Some(location) = driver.and_then(|api| cuda::device_memory_in(api, addr, len)) {
        return Err(Error::new(
            ErrorKind::AddressNotRegistered,
            format!(
                "request {i}: local range {addr:#x}+{len} is device memory ({location}, says the CUDA driver) \
                 that this engine has not registered; register it with this engine (location \"*\" or \
                 its cuda:N; a registration with another engine does not count) so that it is staged"
            ),
        ));
    }
    Ok(None)
}
