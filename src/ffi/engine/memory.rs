//! Registering memory that peers may read and write.

use std::ffi::{c_char, c_void};

use super::{pdx_engine, ENGINES};
use crate::error::{Error, ErrorKind, Result};
use crate::ffi::boundary::{c_slice, guard, opt_c_str};
use crate::ffi::status::pdx_status;

fn region(addr: *const c_void, len: usize, i: Option<usize>) -> Result<(u64, u64)> {
    let at = i.map(|i| format!(" (entry {i})")).unwrap_or_default();
    if addr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("addr is NULL{at}")));
    }
    Ok((addr as u64, len as u64))
}

/// Let peers read and write `[addr, addr+len)`. The memory stays owned by
/// the caller and must stay valid until it is unregistered (or the engine
/// freed). Zero lengths and overlaps with registered regions fail with
/// `PDX_ERR_ADDRESS_OVERLAP`; NULL `addr` with `PDX_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub extern "C" fn pdx_register_memory(engine: *mut pdx_engine, addr: *mut c_void, len: usize) -> pdx_status {
    guard("pdx_register_memory", || {
        let h = ENGINES.get(engine)?;
        let r = region(addr, len, None)?;
        h.engine.register_batch(&[r])
    })
}

/// Register `[addr, addr+len)` at `location`, in Mooncake's syntax:
/// `"cpu:N"` (host memory), `"cuda:N"` (device memory of CUDA device N) or
/// `"*"` (detect; NULL means `"*"`, and so does `pdx_register_memory`).
/// Detection asks the CUDA driver (`PDX_CUDA_LIB`, default
/// `libcuda.so.1`) when one loads; otherwise the memory is host memory.
/// Device memory is staged through pinned host buffers and never touched
/// by the CPU. A `"cuda:N"` region with no loadable driver or no device N
/// fails with `PDX_ERR_DEVICE_UNAVAILABLE`, one the driver does not report
/// as device memory of N with `PDX_ERR_INVALID_ARGUMENT`, a failing driver
/// call with `PDX_ERR_DEVICE`; each message names the region and the cause.
/// Other errors as `pdx_register_memory`. The Mooncake backend passes the
/// location to `registerLocalMemory` unchanged.
///
/// # Safety
/// `location` is NULL or a NUL-terminated string; the memory stays valid
/// until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn pdx_register_memory_at(
    engine: *mut pdx_engine,
    addr: *mut c_void,
    len: usize,
    location: *const c_char,
) -> pdx_status {
    guard("pdx_register_memory_at", || {
        let h = ENGINES.get(engine)?;
        let r = region(addr, len, None)?;
        let location = match opt_c_str(location, "location")? {
            Some(text) => crate::transfer::location::Requested::parse(text)?,
            None => crate::transfer::location::Requested::Detect,
        };
        h.engine.register_batch_at(&[r], location)
    })
}

/// Withdraw the region that starts at `addr`. Returns once no inbound
/// request touches it any more (an inbound transfer into it is cut off).
/// `PDX_ERR_NOT_FOUND` if no region starts there.
#[no_mangle]
pub extern "C" fn pdx_unregister_memory(engine: *mut pdx_engine, addr: *mut c_void) -> pdx_status {
    guard("pdx_unregister_memory", || {
        let h = ENGINES.get(engine)?;
        let (a, _) = region(addr, 0, None)?;
        h.engine.unregister_batch(&[a])
    })
}

/// Register `n` regions (`addrs[i]`, `lens[i]`), all or none.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `addrs` is NULL (with `n` 0) or points to
/// `n` readable elements; `lens` is NULL (with `n` 0) or points to `n` readable elements. Handles
/// are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_register_memory(
    engine: *mut pdx_engine,
    addrs: *const *mut c_void,
    lens: *const usize,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_register_memory", || {
        let h = ENGINES.get(engine)?;
        let addrs = c_slice(addrs, n, "addrs")?;
        let lens = c_slice(lens, n, "lens")?;
        let regions = addrs
            .iter()
            .zip(lens)
            .enumerate()
            .map(|(i, (&a, &l))| region(a, l, Some(i)))
            .collect::<Result<Vec<_>>>()?;
        h.engine.register_batch(&regions)
    })
}

/// Unregister `n` regions by start address, all or none.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `addrs` is NULL (with `n` 0) or points to
/// `n` readable elements. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_batch_unregister_memory(
    engine: *mut pdx_engine,
    addrs: *const *mut c_void,
    n: usize,
) -> pdx_status {
    guard("pdx_batch_unregister_memory", || {
        let h = ENGINES.get(engine)?;
        let addrs = c_slice(addrs, n, "addrs")?;
        let starts =
            addrs.iter().enumerate().map(|(i, &a)| region(a, 0, Some(i)).map(|r| r.0)).collect::<Result<Vec<_>>>()?;
        h.engine.unregister_batch(&starts)
    })
}
