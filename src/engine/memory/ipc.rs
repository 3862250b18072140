//! Device memory of another process on this host, through CUDA IPC: the
//! building blocks of the same-host link's device path.
//!
//! The side that owns device memory *exports* it ([`Exports::export`]): the
//! driver names the whole allocation an address lies in with a 64-byte
//! `CUipcMemHandle`, and the address becomes (handle, offset). The other
//! process *imports* it ([`PeerImports`], one per peer): it opens each
//! handle once (`cuIpcOpenMemHandle_v2`, cached until the peer goes away or
//! the handle is closed) and copies between the opened allocation and its
//! own memory on a stream of its own device, synchronized before the call
//! returns. Every copy is checked against the opened allocation's size, so
//! a peer's offset can never make the driver touch memory outside it.
//!
//! The driver refuses to open a handle in the process that exported it
//! (`CUDA_ERROR_INVALID_CONTEXT`), and a driver without the IPC entry points
//! is `DeviceUnavailable`: both are reasons to fall back to another path.

use std::collections::HashMap;
use std::sync::Arc;

use cuda_sys::{Api, CUcontext, CUdeviceptr, CUipcMemHandle, CUresult, CUstream};
use parking_lot::Mutex;

use super::cuda::{device_error, Device};
use crate::error::{Error, ErrorKind, Result};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::ipc";

/// Bytes of an IPC handle.
pub(crate) const HANDLE_LEN: usize = cuda_sys::CU_IPC_HANDLE_SIZE;

/// The most allocations of one peer kept open at once; opening one more
/// closes the least recently used (a peer cannot make us hold more).
pub(crate) const MAX_OPEN_PER_PEER: usize = 1024;

/// A device address as another process on this host can reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceExport {
    /// The `CUipcMemHandle` of the allocation the address lies in.
    pub handle: [u8; HANDLE_LEN],
    /// The address's offset from the allocation's base.
    pub offset: u64,
}

/// The driver's IPC entry points, all present.
struct Ipc {
    range: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult,
    get: unsafe extern "C" fn(*mut CUipcMemHandle, CUdeviceptr) -> CUresult,
    open: unsafe extern "C" fn(*mut CUdeviceptr, CUipcMemHandle, u32) -> CUresult,
    close: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    dtod: unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult,
}

fn entry_points(api: &Api) -> Result<Ipc> {
    let missing = |name: &str| {
        Error::new(
            ErrorKind::DeviceUnavailable,
            format!("the CUDA driver '{}' has no {name}: CUDA IPC is not available", api.path()),
        )
    };
    Ok(Ipc {
        range: api.mem_get_address_range.ok_or_else(|| missing("cuMemGetAddressRange_v2"))?,
        get: api.ipc_get_mem_handle.ok_or_else(|| missing("cuIpcGetMemHandle"))?,
        open: api.ipc_open_mem_handle.ok_or_else(|| missing("cuIpcOpenMemHandle_v2"))?,
        close: api.ipc_close_mem_handle.ok_or_else(|| missing("cuIpcCloseMemHandle"))?,
        dtod: api.memcpy_dtod_async.ok_or_else(|| missing("cuMemcpyDtoDAsync_v2"))?,
    })
}

/// `Ok` when the driver has every entry point this module uses; else
/// `DeviceUnavailable` naming the first one missing (a fallback reason).
pub fn check_usable(api: &Api) -> Result<()> {
    entry_points(api).map(|_| ())
}

/// A device's primary context made current on this thread; the previous
/// one is restored on drop.
struct Current<'a> {
    api: &'a Api,
    prev: CUcontext,
}

impl<'a> Current<'a> {
    fn make(device: &'a Device) -> Result<Current<'a>> {
        let api = &*device.api;
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: the driver writes one context handle.
        api.check(unsafe { (api.ctx_get_current)(&mut prev) }, "cuCtxGetCurrent").map_err(device_error)?;
        // SAFETY: a primary context retained for the process's life.
        api.check(unsafe { (api.ctx_set_current)(device.context()) }, "cuCtxSetCurrent").map_err(device_error)?;
        Ok(Current { api, prev })
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        // SAFETY: the context that was current when `make` ran.
        let _ = unsafe { (self.api.ctx_set_current)(self.prev) };
    }
}

/// The allocation `addr` lies in: its base and size.
fn allocation_of(api: &Api, ipc: &Ipc, addr: u64) -> Result<(u64, u64)> {
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: the driver writes one address and one size into live locals.
    let rc = unsafe { (ipc.range)(&mut base, &mut size, addr) };
    if rc == cuda_sys::CUDA_ERROR_NOT_FOUND {
        return Err(Error::invalid_argument(format!("{addr:#x} is not in device memory the CUDA driver allocated")));
    }
    api.check(rc, "cuMemGetAddressRange_v2").map_err(device_error)?;
    Ok((base, size as u64))
}

/// This process's side: handles of its device allocations, cached by the
/// allocation's base address (the driver is asked once per allocation).
#[derive(Default)]
pub struct Exports {
    /// Base → (size, handle).
    cache: Mutex<HashMap<u64, (u64, [u8; HANDLE_LEN])>>,
    /// Bumped whenever a handle is forgotten: connections opened before
    /// may have let a peer map memory that is now withdrawn.
    epoch: std::sync::atomic::AtomicU64,
}

impl Exports {
    #[cfg(test)]
    /// An empty cache.
    pub fn new() -> Exports {
        Exports::default()
    }

    /// `[addr, addr+len)` of device memory on `device` as another process
    /// can reach it. The range must lie in one allocation; `len` 0 is
    /// allowed (the address itself must be in one).
    ///
    /// Errors: `DeviceUnavailable` (the driver lacks IPC), `InvalidArgument`
    /// (not device memory the driver allocated, or the range runs past the
    /// end of its allocation), `Device` (a driver call failed: memory the
    /// driver cannot export, such as a pool allocation).
    pub fn export(&self, device: &Device, addr: u64, len: u64) -> Result<DeviceExport> {
        let api = &*device.api;
        let ipc = entry_points(api)?;
        let _current = Current::make(device)?;
        let (base, size) = allocation_of(api, &ipc, addr)?;
        let offset = addr - base;
        if !matches!(offset.checked_add(len), Some(end) if end <= size) {
            return Err(Error::invalid_argument(format!(
                "{addr:#x}+{len} runs past the end of its device allocation ({base:#x}, {size} bytes)"
            )));
        }
        let mut cache = self.cache.lock();
        if let Some(&(cached_size, handle)) = cache.get(&base) {
            if cached_size == size {
                return Ok(DeviceExport { handle, offset });
            }
        }
        let mut handle = CUipcMemHandle { reserved: [0; HANDLE_LEN] };
        // SAFETY: the driver writes one 64-byte handle into a live local.
        let rc = unsafe { (ipc.get)(&mut handle, base) };
        api.check(rc, "cuIpcGetMemHandle")
            .map_err(|e| device_error(e).context(format!("cannot export device memory at {base:#x}")))?;
        cache.insert(base, (size, handle.reserved));
        Ok(DeviceExport { handle: handle.reserved, offset })
    }

    /// Forget the handles of allocations that overlap `[addr, addr+len)`:
    /// call it when that memory is unregistered, since a later allocation at
    /// the same base is another allocation with another handle.
    pub fn forget(&self, addr: u64, len: u64) {
        let end = addr.saturating_add(len.max(1));
        let mut cache = self.cache.lock();
        let before = cache.len();
        cache.retain(|&base, &mut (size, _)| base.saturating_add(size.max(1)) <= addr || base >= end);
        if cache.len() != before {
            self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// How many times a handle was forgotten (see [`Exports::forget`]).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    #[cfg(test)]
    /// Allocations with a cached handle.
    pub fn len(&self) -> usize {
        self.cache.lock().len()
    }

    #[cfg(test)]
    /// Whether no handle is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// This process's memory on one side of a copy with a peer's device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Device memory on the device the copy runs on.
    Device(u64),
    /// Host memory (pinned or pageable).
    Host(*mut u8),
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// The peer's memory → this process's.
    Pull,
    /// This process's memory → the peer's.
    Push,
}

/// One copy between this process's memory and a peer's device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCopy {
    pub way: Way,
    pub local: Local,
    /// Where in the peer's memory (its export of the address).
    pub remote: DeviceExport,
    pub len: u64,
}

/// Which peer allocation, opened in which device's context.
type OpenKey = ([u8; HANDLE_LEN], u32);

/// One of the peer's allocations, opened in this process.
struct Opened {
    base: u64,
    size: u64,
    /// The device whose context opened it (and closes it).
    device: Arc<Device>,
    /// Copies using it now: it is not closed while any runs.
    users: usize,
    last_use: u64,
}

#[derive(Default)]
struct ImportState {
    opened: HashMap<OpenKey, Opened>,
    /// Idle streams per device ordinal, with their device.
    streams: HashMap<u32, (Arc<Device>, Vec<usize>)>,
    tick: u64,
}

/// The other process's side, one per peer: that peer's allocations opened
/// here (each handle once per device of ours that copies with it) and the
/// streams copies run on. Dropping it closes every handle and destroys the
/// streams (when the peer's connection goes away). Copies from several
/// threads run concurrently, each on a stream of its own.
pub struct PeerImports {
    peer: String,
    max_open: usize,
    state: Mutex<ImportState>,
}

impl PeerImports {
    /// The imports of the peer named `peer` (its instance, for messages).
    pub fn new(peer: impl Into<String>) -> PeerImports {
        PeerImports::with_limit(peer, MAX_OPEN_PER_PEER)
    }

    /// As [`PeerImports::new`], keeping at most `max_open` (at least 1)
    /// allocations open.
    pub fn with_limit(peer: impl Into<String>, max_open: usize) -> PeerImports {
        PeerImports { peer: peer.into(), max_open: max_open.max(1), state: Mutex::new(ImportState::default()) }
    }

    /// The peer's instance, as given.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    #[cfg(test)]
    /// Allocations open now.
    pub fn open_count(&self) -> usize {
        self.state.lock().opened.len()
    }

    /// Open `handle` in `device`'s context (current), or reuse it if open
    /// there: its base here and its size. Marks it used by one more copy.
    fn acquire(&self, device: &Arc<Device>, ipc: &Ipc, handle: &[u8; HANDLE_LEN]) -> Result<(u64, u64)> {
        let key = (*handle, device.ordinal);
        let mut st = self.state.lock();
        st.tick += 1;
        let tick = st.tick;
        if let Some(o) = st.opened.get_mut(&key) {
            o.users += 1;
            o.last_use = tick;
            return Ok((o.base, o.size));
        }
        if st.opened.len() >= self.max_open {
            let idle = st.opened.iter().filter(|(_, o)| o.users == 0).min_by_key(|(_, o)| o.last_use).map(|(k, _)| *k);
            let Some(oldest) = idle else {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("{} of peer {}'s device allocations are open and in use", st.opened.len(), self.peer),
                ));
            };
            if let Some(o) = st.opened.remove(&oldest) {
                close_opened(ipc, &o);
            }
        }
        let api = &*device.api;
        let mut base: CUdeviceptr = 0;
        let raw = CUipcMemHandle { reserved: *handle };
        // SAFETY: the driver reads the handle (by value) and writes one
        // address; the caller made `device`'s context current.
        let rc = unsafe { (ipc.open)(&mut base, raw, cuda_sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) };
        api.check(rc, "cuIpcOpenMemHandle_v2").map_err(|e| {
            device_error(e).context(format!("cannot open a device memory handle of peer {} on {device:?}", self.peer))
        })?;
        let size = match allocation_of(api, ipc, base) {
            Ok((_, size)) => size,
            Err(e) => {
                // SAFETY: the address the open just returned, in this context.
                let _ = unsafe { (ipc.close)(base) };
                return Err(e.context(format!("peer {}'s opened device memory", self.peer)));
            }
        };
        st.opened.insert(key, Opened { base, size, device: device.clone(), users: 1, last_use: tick });
        Ok((base, size))
    }

    fn release(&self, device: &Device, handle: &[u8; HANDLE_LEN]) {
        if let Some(o) = self.state.lock().opened.get_mut(&(*handle, device.ordinal)) {
            o.users = o.users.saturating_sub(1);
        }
    }

    fn take_stream(&self, device: &Arc<Device>) -> Result<usize> {
        if let Some(s) = self.state.lock().streams.get_mut(&device.ordinal).and_then(|(_, idle)| idle.pop()) {
            return Ok(s);
        }
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: the driver writes one stream handle; the caller made the
        // device's context current.
        let rc = unsafe { (device.api.stream_create)(&mut s, cuda_sys::CU_STREAM_NON_BLOCKING) };
        device.api.check(rc, "cuStreamCreate").map_err(device_error)?;
        Ok(s as usize)
    }

    fn give_stream(&self, device: &Arc<Device>, s: usize) {
        self.state.lock().streams.entry(device.ordinal).or_insert_with(|| (device.clone(), Vec::new())).1.push(s);
    }

    #[cfg(test)]
    /// Close the peer's allocation `handle` wherever it is open (the peer
    /// says it is gone): how many mappings were closed. `Busy` (and nothing
    /// closed) while a copy uses it.
    pub fn close(&self, handle: &[u8; HANDLE_LEN]) -> Result<usize> {
        let mut st = self.state.lock();
        if let Some(o) = st.opened.iter().find(|((h, _), o)| h == handle && o.users > 0).map(|(_, o)| o) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("peer {}'s device allocation at {:#x} is in use by a copy", self.peer, o.base),
            ));
        }
        let keys: Vec<OpenKey> = st.opened.keys().filter(|(h, _)| h == handle).copied().collect();
        for key in &keys {
            if let Some(o) = st.opened.remove(key) {
                if let Ok(ipc) = entry_points(&o.device.api) {
                    close_opened(&ipc, &o);
                }
            }
        }
        Ok(keys.len())
    }

    /// Open `handle` in `device`'s context now (or find it open) and keep it
    /// open: what tells a failure of the mechanism (this call) from a failed
    /// copy (a later [`PeerImports::copy`]).
    ///
    /// Errors: `DeviceUnavailable` (no IPC in the driver), `Device` (the
    /// open failed), `Busy` (every open allocation in use).
    pub fn open(&self, device: &Arc<Device>, handle: &[u8; HANDLE_LEN]) -> Result<()> {
        let ipc = entry_points(&device.api)?;
        let _current = Current::make(device)?;
        self.acquire(device, &ipc, handle)?;
        self.release(device, handle);
        Ok(())
    }

    /// Copy `n` bytes of the peer's memory at `from` into `dst`; see
    /// [`PeerImports::copy`].
    ///
    /// # Safety
    /// As for [`PeerImports::copy`].
    pub unsafe fn pull(&self, device: &Arc<Device>, dst: Local, from: &DeviceExport, n: u64) -> Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.copy(device, &[DeviceCopy { way: Way::Pull, local: dst, remote: *from, len: n }]) }
    }

    /// Copy `n` bytes of `src` into the peer's memory at `to`; see
    /// [`PeerImports::copy`].
    ///
    /// # Safety
    /// As for [`PeerImports::copy`].
    pub unsafe fn push(&self, device: &Arc<Device>, src: Local, to: &DeviceExport, n: u64) -> Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.copy(device, &[DeviceCopy { way: Way::Push, local: src, remote: *to, len: n }]) }
    }

    /// Run `copies` in order on one stream of `device` (in its primary
    /// context, made current for the call and restored after) and wait for
    /// them all: once this returns `Ok`, pulled bytes are in this process's
    /// memory and pushed ones in the peer's. The peer's allocations are
    /// opened in `device`'s context on first use and kept open. Every
    /// copy's range is checked against the peer's allocation before any is
    /// queued, so a refused batch copies nothing.
    ///
    /// Errors: `DeviceUnavailable` (no IPC in the driver), `InvalidArgument`
    /// (a range runs past the end of the peer's allocation), `Device` (the
    /// open or a copy failed; the message names the call and the driver's
    /// error: a handle opened in the process that exported it is
    /// `CUDA_ERROR_INVALID_CONTEXT`), `Busy` (every open allocation in use).
    /// Every message names the peer.
    ///
    /// # Safety
    /// Each copy's local side must be valid for `len` bytes until this
    /// returns (for writes when pulling): device memory on `device`, or host
    /// memory. No other copy or kernel may write it meanwhile (nor read it,
    /// when pulling).
    pub unsafe fn copy(&self, device: &Arc<Device>, copies: &[DeviceCopy]) -> Result<()> {
        if copies.iter().all(|c| c.len == 0) {
            return Ok(());
        }
        let ipc = entry_points(&device.api)?;
        let _current = Current::make(device)?;
        let mut acquired: Vec<&[u8; HANDLE_LEN]> = Vec::with_capacity(copies.len());
        let result = (|| {
            // Open (or find) every allocation and check every range first.
            let mut peer_addrs = Vec::with_capacity(copies.len());
            for c in copies {
                if c.len == 0 {
                    peer_addrs.push(0);
                    continue;
                }
                let (base, size) = self.acquire(device, &ipc, &c.remote.handle)?;
                acquired.push(&c.remote.handle);
                if !matches!(c.remote.offset.checked_add(c.len), Some(end) if end <= size) {
                    return Err(Error::invalid_argument(format!(
                        "{} bytes at offset {} run past the end of peer {}'s {size}-byte device allocation",
                        c.len, c.remote.offset, self.peer
                    )));
                }
                usize::try_from(c.len).map_err(|_| Error::invalid_argument(format!("{} bytes", c.len)))?;
                peer_addrs.push(base + c.remote.offset);
            }
            let api = &*device.api;
            let s = self.take_stream(device)?;
            let stream = s as CUstream;
            let mut queued = Ok(());
            for (c, &peer_addr) in copies.iter().zip(&peer_addrs) {
                if c.len == 0 {
                    continue;
                }
                let len = c.len as usize;
                // SAFETY: the peer's range was checked against its allocation
                // above; the caller vouches for the local side.
                let (rc, call) = unsafe {
                    match (c.way, c.local) {
                        (Way::Pull, Local::Device(dst)) => {
                            ((ipc.dtod)(dst, peer_addr, len, stream), "cuMemcpyDtoDAsync_v2")
                        }
                        (Way::Push, Local::Device(src)) => {
                            ((ipc.dtod)(peer_addr, src, len, stream), "cuMemcpyDtoDAsync_v2")
                        }
                        (Way::Pull, Local::Host(dst)) => {
                            ((api.memcpy_dtoh_async)(dst.cast(), peer_addr, len, stream), "cuMemcpyDtoHAsync_v2")
                        }
                        (Way::Push, Local::Host(src)) => (
                            (api.memcpy_htod_async)(peer_addr, src.cast_const().cast(), len, stream),
                            "cuMemcpyHtoDAsync_v2",
                        ),
                    }
                };
                queued = api.check(rc, call).map_err(device_error);
                if queued.is_err() {
                    break;
                }
            }
            // Synchronize even when queueing failed: nothing may still run on
            // the stream once it is idle again.
            // SAFETY: a stream this object created, in the current context.
            let synced = api.check(unsafe { (api.stream_synchronize)(stream) }, "cuStreamSynchronize");
            if queued.is_ok() && synced.is_ok() {
                self.give_stream(device, s);
            } else {
                // A stream that reported a fault is not reused.
                // SAFETY: as above; nothing runs on it after the synchronize.
                let _ = unsafe { (api.stream_destroy)(stream) };
            }
            queued.and(synced.map_err(device_error))
        })();
        for handle in acquired {
            self.release(device, handle);
        }
        result.map_err(|e| e.context(format!("device copy with peer {}", self.peer)))
    }
}

/// Close one opened allocation in the context that opened it.
fn close_opened(ipc: &Ipc, o: &Opened) {
    let closed = Current::make(&o.device).and_then(|_current| {
        // SAFETY: an address cuIpcOpenMemHandle_v2 returned in this context;
        // no copy uses it (users is 0).
        let rc = unsafe { (ipc.close)(o.base) };
        o.device.api.check(rc, "cuIpcCloseMemHandle").map_err(device_error)
    });
    if let Err(e) = closed {
        log::warn!(target: LOG_TARGET, "cannot close a peer's device memory at {:#x}: {e}", o.base);
    }
}

impl Drop for PeerImports {
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.state.lock());
        for o in st.opened.values() {
            if let Ok(ipc) = entry_points(&o.device.api) {
                close_opened(&ipc, o);
            }
        }
        for (device, idle) in st.streams.values() {
            if let Ok(_current) = Current::make(device) {
                for &s in idle {
                    // SAFETY: idle streams this object created; nothing is queued on them.
                    let _ = unsafe { (device.api.stream_destroy)(s as CUstream) };
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "ipc_tests.rs"]
mod tests;
