//! The CUDA driver as the engine uses it (loaded through [`crate::device`]):
//! classifying regions at registration, and the primary context of each
//! device a registered region lives on.
//!
//! pdx never creates a context: it retains a device's *primary* context
//! (the one the CUDA runtime, PyTorch and every serving stack share) the
//! first time a region on that device is registered, once per process, and
//! keeps it. A device no region lives on is never touched.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cuda_sys::{Api, CUcontext, CudaError};
use parking_lot::Mutex;

// The driver's loading lives in the device module; the engine reaches it here.
pub use crate::device::{device_error, driver, driver_path, resident_driver};
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::location::{Location, Requested};

/// Refuse an event up front when it cannot be honoured: no CUDA driver in
/// the process, or one without the event calls.
pub fn check_events_usable() -> Result<()> {
    let api = resident_driver().ok_or_else(|| {
        Error::new(ErrorKind::DeviceUnavailable, "wait_event given, but no CUDA driver is loaded in this process")
    })?;
    if api.stream_wait_event.is_none() || api.event_synchronize.is_none() {
        return Err(Error::new(
            ErrorKind::DeviceUnavailable,
            "wait_event given, but the CUDA driver lacks cuStreamWaitEvent or cuEventSynchronize",
        ));
    }
    Ok(())
}

/// Wait on this thread until the CUDA event `event` (a `CUevent`) has
/// completed (`cuEventSynchronize`: the driver blocks, no busy wait): what
/// a transfer of host memory ordered after a kernel needs.
pub fn wait_on_host(event: usize) -> Result<()> {
    let api = resident_driver()
        .ok_or_else(|| Error::new(ErrorKind::DeviceUnavailable, "wait_event given, but no CUDA driver is loaded"))?;
    let sync = api
        .event_synchronize
        .ok_or_else(|| Error::new(ErrorKind::Device, "the CUDA driver has no cuEventSynchronize"))?;
    // SAFETY: the caller vouches that the event is valid until the batch is finished.
    let rc = unsafe { sync(event as cuda_sys::CUevent) };
    api.check(rc, "cuEventSynchronize").map_err(device_error)
}

/// Where an address the CPU may not touch lives: `Some("cuda:N")` when the
/// driver says `addr` is device memory that is not managed (managed memory
/// is reachable from the CPU), `None` for host memory and for addresses the
/// driver does not know (pageable memory).
fn device_memory_at(api: &Api, addr: u64) -> Option<String> {
    if memory_type(api, addr).ok()? != cuda_sys::CU_MEMORYTYPE_DEVICE {
        return None;
    }
    let mut managed = 0i32;
    // SAFETY: IS_MANAGED writes one int.
    let rc = unsafe {
        (api.pointer_get_attribute)(
            (&mut managed as *mut i32).cast::<c_void>(),
            cuda_sys::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            addr,
        )
    };
    if rc == cuda_sys::CUDA_SUCCESS && managed != 0 {
        return None;
    }
    Some(device_ordinal(api, addr).map_or_else(|_| "device memory".to_owned(), |o| format!("cuda:{o}")))
}

/// Whether `[addr, addr+len)` (not empty) is, at its first or last byte,
/// device memory the CPU cannot touch (see [`device_memory_at`]). Host and
/// device memory never share a page, so a range within one page is asked
/// about once.
pub fn device_memory_in(api: &Api, addr: u64, len: u64) -> Option<String> {
    let last = addr.saturating_add(len.max(1) - 1);
    device_memory_at(api, addr).or_else(|| (last >> 12 != addr >> 12).then(|| device_memory_at(api, last)).flatten())
}

/// One device's retained primary context.
pub struct Device {
    pub api: Arc<Api>,
    pub ordinal: u32,
    ctx: usize,
}

impl Device {
    /// The primary context (a driver handle, only passed back to the driver).
    pub fn context(&self) -> CUcontext {
        self.ctx as CUcontext
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{}", self.ordinal)
    }
}

type DeviceTable = Mutex<HashMap<(String, u32), Arc<Device>>>;
static DEVICES: OnceLock<DeviceTable> = OnceLock::new();

/// The device `ordinal` of `api`, its primary context retained on first use.
pub fn device(api: &Arc<Api>, ordinal: u32) -> Result<Arc<Device>> {
    let table = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut table = table.lock();
    let key = (api.path().to_owned(), ordinal);
    if let Some(d) = table.get(&key) {
        return Ok(d.clone());
    }
    let mut count = 0i32;
    // SAFETY: the driver writes one int.
    api.check(unsafe { (api.device_get_count)(&mut count) }, "cuDeviceGetCount").map_err(device_error)?;
    if i64::from(ordinal) >= i64::from(count) {
        return Err(Error::new(
            ErrorKind::DeviceUnavailable,
            format!("there is no cuda:{ordinal}: the CUDA driver '{}' reports {count} device(s)", api.path()),
        ));
    }
    let mut dev = 0;
    // SAFETY: the driver writes one CUdevice; the ordinal is in range.
    api.check(unsafe { (api.device_get)(&mut dev, ordinal as i32) }, "cuDeviceGet").map_err(device_error)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: as above; the retained context is kept for the process's life.
    api.check(unsafe { (api.primary_ctx_retain)(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain").map_err(device_error)?;
    let d = Arc::new(Device { api: api.clone(), ordinal, ctx: ctx as usize });
    table.insert(key, d.clone());
    Ok(d)
}

/// What a registration resolved to: the location and, for device memory,
/// the device (primary context retained).
pub struct Classified {
    pub location: Location,
    pub device: Option<Arc<Device>>,
}

/// One 4-byte pointer attribute of `addr` (`name` for errors).
fn pointer_attribute(
    api: &Api,
    attribute: cuda_sys::CUpointerAttribute,
    name: &'static str,
    addr: u64,
) -> std::result::Result<u32, CudaError> {
    let mut value = 0u32;
    // SAFETY: MEMORY_TYPE and DEVICE_ORDINAL each write one 4-byte integer.
    let rc = unsafe { (api.pointer_get_attribute)((&mut value as *mut u32).cast::<c_void>(), attribute, addr) };
    api.check(rc, name).map(|()| value)
}

fn memory_type(api: &Api, addr: u64) -> std::result::Result<u32, CudaError> {
    pointer_attribute(api, cuda_sys::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "cuPointerGetAttribute(MEMORY_TYPE)", addr)
}

fn device_ordinal(api: &Api, addr: u64) -> std::result::Result<u32, CudaError> {
    // An int on the wire of the API; a negative one means none.
    pointer_attribute(api, cuda_sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "cuPointerGetAttribute(DEVICE_ORDINAL)", addr)
        .map(|o| (o as i32).max(0) as u32)
}

/// Decide where `[addr, addr+len)` lives. `"cpu:N"` is taken as given and
/// asks no driver. `"*"` asks the driver if one loads: device memory is a
/// device region, an error or host memory is host memory. `"cuda:N"` needs
/// the driver and a device pointer on device N. Refusals name the region
/// and the cause.
pub fn classify(addr: u64, len: u64, requested: Requested) -> Result<Classified> {
    let region = |e: Error| e.context(format!("cannot register {addr:#x}+{len} as {requested}"));
    let host = |location| Ok(Classified { location, device: None });
    let at_device = |api: &Arc<Api>, ordinal| {
        device(api, ordinal).map(|d| Classified { location: Location::Cuda { ordinal }, device: Some(d) })
    };
    match requested {
        Requested::At(l @ Location::Host { .. }) => host(l),
        Requested::Detect => {
            let Ok(api) = driver() else { return host(Location::default()) };
            match memory_type(&api, addr) {
                Ok(cuda_sys::CU_MEMORYTYPE_DEVICE) => {
                    let ordinal = device_ordinal(&api, addr).map_err(|e| region(device_error(e)))?;
                    at_device(&api, ordinal).map_err(region)
                }
                _ => host(Location::default()),
            }
        }
        Requested::At(Location::Cuda { ordinal }) => {
            let api = driver().map_err(region)?;
            let t = memory_type(&api, addr).map_err(|e| region(device_error(e)))?;
            if t != cuda_sys::CU_MEMORYTYPE_DEVICE {
                return Err(region(Error::invalid_argument(format!(
                    "the CUDA driver says it is not device memory (memory type {t})"
                ))));
            }
            let actual = device_ordinal(&api, addr).map_err(|e| region(device_error(e)))?;
            if actual != ordinal {
                return Err(region(Error::invalid_argument(format!("the CUDA driver says it is on cuda:{actual}"))));
            }
            at_device(&api, ordinal).map_err(region)
        }
    }
}
