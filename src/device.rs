//! The CUDA driver as the rest of pdx sees it: loaded on first need from
//! `PDX_CUDA_LIB` (never linked), probed for what this machine can serve,
//! and device buffers for tools that need device memory of their own (the
//! benchmark). Everything outside this module and the native engine's
//! registration and staging (`engine::cuda`, `engine::memory::staging`) goes through
//! this API and never calls the driver itself.

use std::sync::Arc;

use cuda_sys::{Api, CUcontext, CUdeviceptr, CUstream, CudaError};

use crate::config::env::{read, vars, ProcessEnv};
use crate::error::{Error, ErrorKind, Result};

/// A driver error as a pdx error (the driver's name and text kept).
pub fn device_error(e: CudaError) -> Error {
    Error::new(ErrorKind::Device, e.to_string())
}

/// The driver library `PDX_CUDA_LIB` names (default `libcuda.so.1`).
pub fn driver_path() -> String {
    read(&ProcessEnv, &vars::PDX_CUDA_LIB).unwrap_or_else(|| cuda_sys::DEFAULT_LIB.to_owned())
}

/// The driver named by `PDX_CUDA_LIB`, loaded once per path.
pub fn driver() -> Result<Arc<Api>> {
    cuda_sys::load_cached(&driver_path()).map_err(|e| {
        let hint = match e {
            cuda_sys::LoadError::Open { .. } => {
                " (no NVIDIA driver here? set PDX_CUDA_LIB to the path of libcuda.so.1)"
            }
            _ => "",
        };
        Error::new(ErrorKind::DeviceUnavailable, format!("{e}{hint}"))
    })
}

/// The driver `PDX_CUDA_LIB` names if pdx loaded it already or the process
/// has it mapped (the application uses CUDA); never loads it otherwise.
pub fn resident_driver() -> Option<Arc<Api>> {
    cuda_sys::resident(&driver_path())
}

/// What the driver reports about this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// `cuDeviceGetCount`.
    pub devices: i32,
    /// `cuDriverGetVersion` (e.g. 12040 for 12.4).
    pub driver_version: i32,
}

/// Load the driver (see [`driver`]) and ask it how many devices there are
/// and its version.
pub fn probe() -> Result<Probe> {
    let api = driver()?;
    let (mut devices, mut driver_version) = (0, 0);
    // SAFETY: the loader initialized the driver; the out-param is a live local.
    api.check(unsafe { (api.device_get_count)(&mut devices) }, "cuDeviceGetCount").map_err(device_error)?;
    // SAFETY: as above.
    api.check(unsafe { (api.driver_get_version)(&mut driver_version) }, "cuDriverGetVersion").map_err(device_error)?;
    Ok(Probe { devices, driver_version })
}

/// Device memory on one device with a stream of its own, freed on drop:
/// filled and read back through the driver's copies, so its owner never
/// touches device memory with the CPU.
pub struct DeviceBuffer {
    api: Arc<Api>,
    device: i32,
    ctx: usize,
    stream: usize,
    ptr: CUdeviceptr,
    len: usize,
}

// SAFETY: driver handles, used with the context made current on each call.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; the driver serializes work on one stream.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `len` bytes (at least 1 allocated) of memory on device `ordinal`, in its
    /// primary context (retained until the buffer is dropped).
    ///
    /// Errors: `DeviceUnavailable` (no driver, or it lacks `cuMemAlloc_v2`),
    /// `Device` (a driver call failed).
    pub fn new(ordinal: u32, len: usize) -> Result<DeviceBuffer> {
        let api = driver()?;
        let (Some(alloc), Some(_)) = (api.mem_alloc, api.mem_free) else {
            return Err(Error::new(
                ErrorKind::DeviceUnavailable,
                format!("the CUDA driver '{}' has no cuMemAlloc_v2 / cuMemFree_v2", api.path()),
            ));
        };
        let device = i32::try_from(ordinal).map_err(|_| Error::invalid_argument(format!("no cuda:{ordinal}")))?;
        let mut dev = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: plain driver calls writing one value each into live locals.
        unsafe {
            api.check((api.device_get)(&mut dev, device), "cuDeviceGet").map_err(device_error)?;
            api.check((api.primary_ctx_retain)(&mut ctx, dev), "cuDevicePrimaryCtxRetain").map_err(device_error)?;
        }
        // From here on, drop releases what was made so far.
        let mut buffer = DeviceBuffer { api, device: dev, ctx: ctx as usize, stream: 0, ptr: 0, len };
        buffer.current()?;
        let (mut ptr, mut stream): (CUdeviceptr, CUstream) = (0, std::ptr::null_mut());
        // SAFETY: the context is current; each call writes one value into a live local.
        unsafe {
            buffer.check(alloc(&mut ptr, len.max(1)), "cuMemAlloc_v2")?;
            buffer.ptr = ptr;
            buffer.check((buffer.api.stream_create)(&mut stream, 0), "cuStreamCreate")?;
        }
        buffer.stream = stream as usize;
        Ok(buffer)
    }

    /// The device address (to register with an engine as `cuda:N`).
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it was asked for with length 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, rc: cuda_sys::CUresult, call: &'static str) -> Result<()> {
        self.api.check(rc, call).map_err(device_error)
    }

    fn current(&self) -> Result<()> {
        // SAFETY: our retained primary context.
        self.check(unsafe { (self.api.ctx_set_current)(self.ctx as CUcontext) }, "cuCtxSetCurrent")
    }

    fn range(&self, off: usize, n: usize) -> Result<u64> {
        match off.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.ptr + off as u64),
            _ => Err(Error::invalid_argument(format!("{n} bytes at offset {off} are past a {}-byte buffer", self.len))),
        }
    }

    /// Copy `src` to offset `off` and wait for the copy.
    pub fn upload(&self, off: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(off, src.len())?;
        self.current()?;
        let s = self.stream as CUstream;
        // SAFETY: the range is inside the allocation; `src` stays readable
        // until the synchronize below returns.
        unsafe {
            self.check((self.api.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), s), "cuMemcpyHtoDAsync_v2")?;
            self.check((self.api.stream_synchronize)(s), "cuStreamSynchronize")
        }
    }

    /// Copy offset `off` into `dst` and wait for the copy.
    pub fn download(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(off, dst.len())?;
        self.current()?;
        let s = self.stream as CUstream;
        // SAFETY: the range is inside the allocation; `dst` stays writable
        // until the synchronize below returns.
        unsafe {
            self.check(
                (self.api.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), s),
                "cuMemcpyDtoHAsync_v2",
            )?;
            self.check((self.api.stream_synchronize)(s), "cuStreamSynchronize")
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.current().is_ok() {
            // SAFETY: handles this buffer made (0 when not made); nothing is
            // queued on the stream, every copy was synchronized.
            unsafe {
                if self.stream != 0 {
                    let _ = (self.api.stream_destroy)(self.stream as CUstream);
                }
                if let (Some(free), true) = (self.api.mem_free, self.ptr != 0) {
                    let _ = free(self.ptr);
                }
            }
        }
        // SAFETY: balances the retain in `new`.
        let _ = unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (no `PDX_CUDA_LIB` on this machine, or one that does
    /// not load) every entry point says why, as `DeviceUnavailable`; with one
    /// (a GPU machine) the probe reports its devices. Either way the same
    /// call is asserted on, never skipped.
    #[test]
    fn probe_and_buffer_report_the_driver_or_why_not() {
        match driver() {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
                assert_eq!(probe().unwrap_err().kind(), ErrorKind::DeviceUnavailable);
                assert_eq!(DeviceBuffer::new(0, 16).err().map(|e| e.kind()), Some(ErrorKind::DeviceUnavailable));
            }
            Ok(api) => {
                let p = probe().unwrap();
                assert!(p.devices >= 0 && p.driver_version > 0, "{p:?} from {}", api.path());
            }
        }
    }

    /// Only this module and the native engine (registration and staging)
    /// call the driver (`cuda_sys`); the backend table, the ABI and the
    /// benchmark go through this module's API.
    #[test]
    fn only_the_device_module_and_the_engine_call_the_driver() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let allowed = |name: &str| name == "src/device.rs" || name.starts_with("src/engine/");
        let mut callers = Vec::new();
        let mut dirs = vec![root.join("src"), root.join("pdx-bench/src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text.contains("cuda_sys") && !allowed(&name) {
                    callers.push(name);
                }
            }
        }
        callers.sort();
        assert!(callers.is_empty(), "call the CUDA driver through crate::device instead: {callers:?}");
    }
}
