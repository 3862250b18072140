//! Device (CUDA) buffers for `--location cuda:N` / `--remote-location`:
//! allocated with `cuMemAlloc_v2` through the driver pdx loads
//! (`PDX_CUDA_LIB`: the real driver, or the test stand-in), filled and read
//! back with copies of the bench's own, so the bench never touches device
//! memory with the CPU either.

use std::sync::Arc;

use cuda_sys::{Api, CUcontext, CUdeviceptr, CUstream};

/// Device memory on one device, freed on drop.
pub struct DeviceBuffer {
    api: Arc<Api>,
    ctx: usize,
    stream: usize,
    ptr: CUdeviceptr,
    len: usize,
}

// SAFETY: driver handles, used with the context made current on each call.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; the driver serializes work on one stream.
unsafe impl Sync for DeviceBuffer {}

fn check(api: &Api, rc: i32, call: &'static str) -> Result<(), String> {
    api.check(rc, call).map_err(|e| e.to_string())
}

/// The ordinal of a `cuda:N` location, `None` for host locations.
pub fn ordinal(location: &str) -> Result<Option<u32>, String> {
    match pdx::transfer::location::Requested::parse(location).map_err(|e| e.to_string())? {
        pdx::transfer::location::Requested::At(l) => Ok(l.cuda_ordinal()),
        pdx::transfer::location::Requested::Detect => Ok(None),
    }
}

impl DeviceBuffer {
    pub fn new(ordinal: u32, len: usize) -> Result<DeviceBuffer, String> {
        let api = pdx::engine::cuda::driver().map_err(|e| e.to_string())?;
        let alloc = api.mem_alloc.ok_or("the CUDA driver has no cuMemAlloc_v2")?;
        let mut dev = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut ptr: CUdeviceptr = 0;
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: plain driver calls writing one value each.
        unsafe {
            check(&api, (api.device_get)(&mut dev, ordinal as i32), "cuDeviceGet")?;
            check(&api, (api.primary_ctx_retain)(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            check(&api, (api.ctx_set_current)(ctx), "cuCtxSetCurrent")?;
            check(&api, alloc(&mut ptr, len.max(1)), "cuMemAlloc_v2")?;
            check(&api, (api.stream_create)(&mut stream, 0), "cuStreamCreate")?;
        }
        Ok(DeviceBuffer { api, ctx: ctx as usize, stream: stream as usize, ptr, len })
    }

    pub fn addr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn current(&self) -> Result<(), String> {
        // SAFETY: our retained primary context.
        check(&self.api, unsafe { (self.api.ctx_set_current)(self.ctx as CUcontext) }, "cuCtxSetCurrent")
    }

    /// Copy `src` to device offset `off`.
    pub fn upload(&self, off: usize, src: &[u8]) -> Result<(), String> {
        assert!(off + src.len() <= self.len);
        self.current()?;
        let s = self.stream as CUstream;
        // SAFETY: `src` is readable until the synchronize below returns.
        unsafe {
            check(
                &self.api,
                (self.api.memcpy_htod_async)(self.ptr + off as u64, src.as_ptr().cast(), src.len(), s),
                "cuMemcpyHtoDAsync_v2",
            )?;
            check(&self.api, (self.api.stream_synchronize)(s), "cuStreamSynchronize")
        }
    }

    /// Copy device offset `off` into `dst`.
    pub fn download(&self, off: usize, dst: &mut [u8]) -> Result<(), String> {
        assert!(off + dst.len() <= self.len);
        self.current()?;
        let s = self.stream as CUstream;
        // SAFETY: `dst` is writable until the synchronize below returns.
        unsafe {
            check(
                &self.api,
                (self.api.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), self.ptr + off as u64, dst.len(), s),
                "cuMemcpyDtoHAsync_v2",
            )?;
            check(&self.api, (self.api.stream_synchronize)(s), "cuStreamSynchronize")
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.current().is_err() {
            return;
        }
        // SAFETY: handles we created; nothing is queued on the stream.
        unsafe {
            let _ = (self.api.stream_destroy)(self.stream as CUstream);
            if let Some(free) = self.api.mem_free {
                let _ = free(self.ptr);
            }
        }
    }
}
