//! The pinned staging pool: `cuMemHostAlloc` buffers and streams per
//! device, leased to one transfer at a time. Allocated on first use and
//! kept, at most `staging_bytes` in all (`PDX_CUDA_STAGING_BYTES`, default
//! 64 MiB). Half serves inbound requests (this engine as target), half
//! outbound ones (as initiator), so two engines staging towards each other
//! can never hold each other's buffers. A lease makes the device's primary
//! context current on the calling thread (restoring the caller's own
//! afterwards) before any stream, buffer or copy call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_sys::CUcontext;
use parking_lot::{Condvar, Mutex};

use super::super::cuda::{device_error, Device};
use crate::error::{Error, ErrorKind, Result};

/// Default cap on pinned staging memory per engine.
pub const DEFAULT_STAGING_BYTES: usize = 64 << 20;
/// The smallest cap: smaller values of `PDX_CUDA_STAGING_BYTES` or the engine
/// option `cuda_staging_bytes` are raised to it, with a warning.
pub const MIN_STAGING_BYTES: usize = 64 << 10;
/// Largest staging buffer.
const MAX_CHUNK: usize = 2 << 20;

/// Which half of the pool a lease draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Serving a peer's request (this engine is the target).
    Inbound = 0,
    /// Running our own transfer (this engine is the initiator).
    Outbound = 1,
}

struct Half {
    max_bufs: usize,
    state: Mutex<HalfState>,
    cv: Condvar,
}

#[derive(Default)]
struct HalfState {
    free: Vec<usize>,
    allocated: usize,
    /// Every buffer allocated (they are kept until the pool drops).
    all: Vec<usize>,
}

/// A device and the streams of its context no lease holds.
type IdleStreams = (Arc<Device>, Vec<usize>);

/// One engine's staging pool and streams.
pub struct Staging {
    cap: usize,
    chunk: usize,
    wait: Duration,
    halves: [Half; 2],
    /// Idle streams per device, with the device that owns them.
    streams: Mutex<HashMap<u32, IdleStreams>>,
    /// The device whose context allocated buffers (to free them).
    owner: Mutex<Option<Arc<Device>>>,
}

impl Staging {
    /// A pool capped at `cap` bytes (raised to [`MIN_STAGING_BYTES`]); a
    /// request waits at most `wait` for a buffer. Allocates nothing yet.
    pub fn new(cap: usize, wait: Duration) -> Staging {
        let cap = cap.max(MIN_STAGING_BYTES);
        // Four buffers per half at least, 4 KiB multiples, at most 2 MiB.
        let chunk = ((cap / 8) & !4095).clamp(4096, MAX_CHUNK);
        let per_half = (cap / 2 / chunk).max(1);
        let half = || Half { max_bufs: per_half, state: Mutex::new(HalfState::default()), cv: Condvar::new() };
        Staging {
            cap,
            chunk,
            wait,
            halves: [half(), half()],
            streams: Mutex::new(HashMap::new()),
            owner: Mutex::new(None),
        }
    }

    /// The bytes of one staging buffer: the largest piece of device memory
    /// one request of a window may have.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The cap on pinned bytes.
    #[cfg(test)]
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Every buffer of `side` allocated so far, with their length: host
    /// memory this engine owns and hands to peers to copy (the same-host
    /// link lists the outbound ones as registered).
    pub fn buffers(&self, side: Side) -> (Vec<u64>, usize) {
        let all = self.halves[side as usize].state.lock().all.iter().map(|&b| b as u64).collect();
        (all, self.chunk)
    }

    /// How many buffers of `side` were allocated (they are never freed
    /// before the pool): changes whenever [`Staging::buffers`] does.
    pub fn buffers_allocated(&self, side: Side) -> usize {
        self.halves[side as usize].state.lock().all.len()
    }

    fn take_buffer(&self, side: Side, dev: &Arc<Device>, deadline: Option<Instant>) -> Result<Option<usize>> {
        let half = &self.halves[side as usize];
        let mut st = half.state.lock();
        loop {
            if let Some(b) = st.free.pop() {
                return Ok(Some(b));
            }
            if st.allocated < half.max_bufs {
                st.allocated += 1;
                drop(st);
                let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
                let api = &dev.api;
                // SAFETY: the driver writes one pointer; the lease made the
                // device's primary context current on this thread.
                let rc = unsafe { (api.mem_host_alloc)(&mut p, self.chunk, cuda_sys::CU_MEMHOSTALLOC_PORTABLE) };
                if let Err(e) = api.check(rc, "cuMemHostAlloc") {
                    half.state.lock().allocated -= 1;
                    half.cv.notify_one();
                    return Err(device_error(e));
                }
                self.owner.lock().get_or_insert_with(|| dev.clone());
                half.state.lock().all.push(p as usize);
                return Ok(Some(p as usize));
            }
            let Some(deadline) = deadline else { return Ok(None) };
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "no pinned staging buffer became free within {:?} (the cap is {} bytes: PDX_CUDA_STAGING_BYTES)",
                    self.wait, self.cap
                )));
            }
            // Wake up now and then, to see a stopping engine.
            let slice = deadline.min(Instant::now() + Duration::from_millis(50));
            half.cv.wait_until(&mut st, slice);
        }
    }

    fn give_buffer(&self, side: Side, b: usize) {
        let half = &self.halves[side as usize];
        half.state.lock().free.push(b);
        half.cv.notify_one();
    }

    fn take_stream(&self, dev: &Arc<Device>) -> Result<usize> {
        if let Some((_, idle)) = self.streams.lock().get_mut(&dev.ordinal) {
            if let Some(s) = idle.pop() {
                return Ok(s);
            }
        }
        let mut s: cuda_sys::CUstream = std::ptr::null_mut();
        // SAFETY: the driver writes one stream handle; the device's context
        // is current (see `lease`).
        let rc = unsafe { (dev.api.stream_create)(&mut s, cuda_sys::CU_STREAM_NON_BLOCKING) };
        dev.api.check(rc, "cuStreamCreate").map_err(device_error)?;
        Ok(s as usize)
    }

    fn give_stream(&self, dev: &Arc<Device>, s: usize) {
        self.streams.lock().entry(dev.ordinal).or_insert_with(|| (dev.clone(), Vec::new())).1.push(s);
    }

    /// Up to `want` (1 or 2) buffers and streams of `dev` from `side`: the
    /// first waits (until the deadline or `stop`), a second only if free.
    pub fn lease(&self, side: Side, dev: &Arc<Device>, want: usize, stop: &dyn Fn() -> bool) -> Result<Lease<'_>> {
        let api = &dev.api;
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: the driver writes one context handle.
        api.check(unsafe { (api.ctx_get_current)(&mut prev) }, "cuCtxGetCurrent").map_err(device_error)?;
        // SAFETY: a primary context retained for the process's life.
        api.check(unsafe { (api.ctx_set_current)(dev.context()) }, "cuCtxSetCurrent").map_err(device_error)?;
        let mut lease = Lease { pool: self, side, dev: dev.clone(), bufs: Vec::new(), streams: Vec::new(), prev };
        let deadline = Instant::now() + self.wait;
        while lease.bufs.is_empty() {
            if stop() {
                return Err(Error::new(ErrorKind::Shutdown, "stopped while waiting for a staging buffer"));
            }
            let slice = deadline.min(Instant::now() + Duration::from_millis(50));
            match self.take_buffer(side, dev, Some(slice)) {
                Ok(Some(b)) => lease.bufs.push(b),
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() < deadline => {}
                Err(e) => return Err(e),
            }
        }
        while lease.bufs.len() < want.clamp(1, 2) {
            match self.take_buffer(side, dev, None)? {
                Some(b) => lease.bufs.push(b),
                None => break,
            }
        }
        for _ in 0..lease.bufs.len() {
            let s = self.take_stream(dev)?;
            lease.streams.push(s);
        }
        Ok(lease)
    }
}

/// Buffers and streams borrowed from the pool, with the device's context
/// current on this thread. Dropping it waits for its copies, returns
/// everything and restores the thread's previous context.
pub struct Lease<'a> {
    pool: &'a Staging,
    side: Side,
    dev: Arc<Device>,
    bufs: Vec<usize>,
    streams: Vec<usize>,
    prev: CUcontext,
}

impl Lease<'_> {
    /// The bytes of each buffer.
    pub(crate) fn chunk(&self) -> usize {
        self.pool.chunk
    }

    pub(crate) fn len(&self) -> usize {
        self.bufs.len()
    }

    pub(crate) fn buf(&self, i: usize) -> *mut u8 {
        self.bufs[i] as *mut u8
    }

    pub(crate) fn stream(&self, i: usize) -> cuda_sys::CUstream {
        self.streams[i] as cuda_sys::CUstream
    }

    /// Queue buffer `i`'s first `len` bytes → device `dptr`.
    pub(crate) fn h2d(&self, i: usize, dptr: u64, len: usize) -> Result<()> {
        self.h2d_from(i, dptr, self.buf(i), len)
    }

    /// Queue `src` (inside buffer `i`) → device `dptr`, on buffer `i`'s stream.
    pub(crate) fn h2d_from(&self, i: usize, dptr: u64, src: *const u8, len: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: `src..src+len` lies in our pinned buffer, which stays ours
        // until this stream is synchronized; `dptr` is in a registered device
        // region held by the caller.
        let rc = unsafe { (api.memcpy_htod_async)(dptr, src.cast(), len, self.stream(i)) };
        api.check(rc, "cuMemcpyHtoDAsync_v2").map_err(device_error)
    }

    /// Queue device `dptr` → the start of buffer `i`.
    pub(crate) fn d2h(&self, i: usize, dptr: u64, len: usize) -> Result<()> {
        self.d2h_at(i, 0, dptr, len)
    }

    pub(crate) fn d2h_at(&self, i: usize, off: usize, dptr: u64, len: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: as in `h2d_from`, the other way.
        let rc = unsafe { (api.memcpy_dtoh_async)(self.buf(i).add(off).cast(), dptr, len, self.stream(i)) };
        api.check(rc, "cuMemcpyDtoHAsync_v2").map_err(device_error)
    }

    /// Make buffer `i`'s stream wait for `event` (a `CUevent`) on the device
    /// before its next copy.
    pub(crate) fn wait_event(&self, i: usize, event: usize) -> Result<()> {
        let api = &self.dev.api;
        let wait = api.stream_wait_event.ok_or_else(|| {
            Error::new(ErrorKind::Device, "the CUDA driver has no cuStreamWaitEvent: cannot order after wait_event")
        })?;
        // SAFETY: a stream we created and hold; the caller vouches that the
        // event is valid until the batch is finished.
        let rc = unsafe { wait(self.stream(i), event as cuda_sys::CUevent, 0) };
        api.check(rc, "cuStreamWaitEvent").map_err(device_error)
    }

    pub(crate) fn sync(&self, i: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: a stream we created and hold.
        api.check(unsafe { (api.stream_synchronize)(self.stream(i)) }, "cuStreamSynchronize").map_err(device_error)
    }

    pub(crate) fn sync_all(&self) -> Result<()> {
        let mut first = Ok(());
        for i in 0..self.streams.len() {
            if let Err(e) = self.sync(i) {
                first = first.and(Err(e));
            }
        }
        first
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // No copy may still read or write a buffer (or device memory) once
        // the lease is gone.
        let _ = self.sync_all();
        for s in std::mem::take(&mut self.streams) {
            self.pool.give_stream(&self.dev, s);
        }
        for b in std::mem::take(&mut self.bufs) {
            self.pool.give_buffer(self.side, b);
        }
        let api = &self.dev.api;
        // SAFETY: restoring the context that was current when we started.
        let _ = unsafe { (api.ctx_set_current)(self.prev) };
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let streams = std::mem::take(&mut *self.streams.lock());
        let owner = self.owner.lock().take();
        if streams.is_empty() && owner.is_none() {
            return;
        }
        let dev = owner.or_else(|| streams.values().next().map(|(d, _)| d.clone()));
        let Some(any) = dev else { return };
        let api = any.api.clone();
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: plain driver calls on handles this pool created.
        unsafe {
            let _ = (api.ctx_get_current)(&mut prev);
            for (d, idle) in streams.values() {
                let _ = (api.ctx_set_current)(d.context());
                for &s in idle {
                    let _ = (api.stream_destroy)(s as cuda_sys::CUstream);
                }
            }
            let _ = (api.ctx_set_current)(any.context());
            for half in &self.halves {
                for b in std::mem::take(&mut half.state.lock().free) {
                    let _ = (api.mem_free_host)(b as *mut std::ffi::c_void);
                }
            }
            let _ = (api.ctx_set_current)(prev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_sizes_follow_the_cap() {
        let s = Staging::new(DEFAULT_STAGING_BYTES, Duration::from_secs(1));
        assert_eq!((s.cap(), s.chunk()), (64 << 20, 2 << 20));
        assert_eq!(s.halves[0].max_bufs * s.chunk() * 2, s.cap());
        let small = Staging::new(1, Duration::from_secs(1));
        assert_eq!(small.cap(), MIN_STAGING_BYTES);
        assert_eq!(small.chunk(), 8192);
        assert!(small.halves[1].max_bufs * small.chunk() * 2 <= small.cap());
        let odd = Staging::new(1_000_000, Duration::from_secs(1));
        assert_eq!(odd.chunk() % 4096, 0);
        assert!(odd.halves[0].max_bufs * odd.chunk() * 2 <= odd.cap());
    }
}
