//! Staging device (CUDA) memory through pinned host buffers, on both sides
//! of the wire. The CPU never touches device memory: bytes go device →
//! pinned buffer → socket, or socket → pinned buffer → device, on streams of
//! the region's device's primary context, and nothing is sent, acknowledged
//! or reported completed before `cuStreamSynchronize` of its copy returned.
//!
//! - **Bounded.** Each engine has one pool of `cuMemHostAlloc` buffers,
//!   allocated on first use and kept, at most `staging_bytes` in all
//!   (`PDX_CUDA_STAGING_BYTES`, default 64 MiB). Half serves inbound
//!   requests (this engine as target), half outbound ones (as initiator),
//!   so two engines staging towards each other can never hold each other's
//!   buffers. A request that finds none free waits, up to its deadline.
//! - **Pipelined.** A lease holds up to two buffers, each with its own
//!   stream: the copy of chunk *k+1* is queued before chunk *k* is
//!   synchronized, so copies overlap socket I/O. Small requests of one
//!   window are staged together into one buffer and sent in one gathered
//!   send.
//! - **The right device.** A lease makes the device's primary context
//!   current on the calling thread (restoring the caller's own afterwards)
//!   before any stream, buffer or copy call.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_sys::CUcontext;
use parking_lot::{Condvar, Mutex};

use super::conn::Conn;
use super::cuda::{device_error, Device};
use super::regions::Hold;
use super::transfer::{header, io_error, run_window, take_acks, WindowOutcome};
use super::wire::{self, RequestHeader, HEADER_LEN};
use super::Inner;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::{Direction, Request};

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

/// Why a staged transfer on a server connection stopped.
pub enum Failure {
    /// The socket failed or the region was withdrawn: close the connection.
    Io(io::Error),
    /// A driver call failed; nothing was confirmed for this request.
    Device(Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Device(e)
    }
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

    /// Receive `size` bytes of an inbound write into device memory at
    /// `dptr`; returns after the last copy was synchronized.
    pub fn recv_to_device(
        &self,
        conn: &mut Conn,
        dev: &Arc<Device>,
        dptr: u64,
        size: usize,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Failure> {
        let chunks = size.div_ceil(self.chunk);
        let lease = self.lease(Side::Inbound, dev, chunks, stop)?;
        let n = lease.len();
        for k in 0..chunks {
            let (off, len) = (k * self.chunk, (size - k * self.chunk).min(self.chunk));
            let i = k % n;
            if k >= n {
                // The buffer's previous copy must be done before it is refilled.
                lease.sync(i)?;
            }
            // SAFETY: the buffer is ours and `chunk` bytes long.
            unsafe { conn.recv_raw(lease.buf(i), len, stop) }?;
            lease.h2d(i, dptr + off as u64, len)?;
        }
        lease.sync_all()?;
        Ok(())
    }

    /// Send `size` bytes of device memory at `dptr` for an inbound read,
    /// after `acks` (and this request's status when `acknowledged`: OK, or
    /// REJECTED if the first copy failed, before any payload byte).
    #[allow(clippy::too_many_arguments)]
    pub fn send_from_device(
        &self,
        conn: &Conn,
        dev: &Arc<Device>,
        dptr: u64,
        size: usize,
        acks: &mut Vec<u8>,
        acknowledged: bool,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Failure> {
        let chunks = size.div_ceil(self.chunk);
        let first = self.lease(Side::Inbound, dev, chunks, stop).and_then(|lease| {
            let len0 = size.min(self.chunk);
            lease.d2h(0, dptr, len0)?;
            if lease.len() > 1 && chunks > 1 {
                lease.d2h(1, dptr + self.chunk as u64, (size - self.chunk).min(self.chunk))?;
            }
            lease.sync(0)?;
            Ok((lease, len0))
        });
        let (lease, len0) = match first {
            Ok(v) => v,
            Err(e) => {
                if acknowledged {
                    acks.extend_from_slice(&wire::encode_status(wire::STATUS_REJECTED));
                    let _ = conn.send_all(acks);
                }
                acks.clear();
                return Err(Failure::Device(e));
            }
        };
        if acknowledged {
            acks.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
        }
        // SAFETY: both pieces are readable: our Vec and our pinned buffer.
        let sent = unsafe { conn.send_vectored(&[(acks.as_ptr(), acks.len()), (lease.buf(0).cast_const(), len0)]) };
        acks.clear();
        sent?;
        let n = lease.len();
        for k in 1..chunks {
            if stop() {
                return Err(Failure::Io(io::Error::new(io::ErrorKind::Interrupted, "source region was unregistered")));
            }
            let i = k % n;
            if n == 1 {
                lease.d2h(0, dptr + (k * self.chunk) as u64, (size - k * self.chunk).min(self.chunk))?;
            } else if k + 1 < chunks {
                // Queue chunk k+1 into the buffer chunk k-1 was sent from
                // before waiting for chunk k.
                let next = (k + 1) * self.chunk;
                lease.d2h((k + 1) % n, dptr + next as u64, (size - next).min(self.chunk))?;
            }
            lease.sync(i)?;
            // SAFETY: our pinned buffer, synchronized.
            unsafe { conn.send_raw(lease.buf(i), (size - k * self.chunk).min(self.chunk)) }?;
        }
        Ok(())
    }

    /// Run one window of an initiator whose requests may have device-memory
    /// locals (`devs[i]`). Every device request is at most [`chunk`](Self::chunk)
    /// bytes. Consecutive requests are grouped into one staging buffer;
    /// groups are pipelined two buffers deep.
    ///
    /// # Safety
    /// As [`run_window`]: host locals valid, device locals registered.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_window_staged(
        &self,
        conn: &mut Conn,
        session: &str,
        direction: Direction,
        v2: bool,
        reqs: &[Request],
        devs: &[Option<Arc<Device>>],
        stop: &dyn Fn() -> bool,
    ) -> WindowOutcome {
        // Pieces were cut to one buffer when the batch was made; a local range
        // registered as device memory since then may be larger.
        if let Some(r) = reqs.iter().zip(devs).find(|(r, d)| d.is_some() && r.len > self.chunk).map(|(r, _)| r) {
            let e = Error::invalid_argument(format!(
                "local range {:#x}+{} became device memory after the transfer was submitted",
                r.local, r.len
            ));
            return WindowOutcome { confirmed: 0, rejected: false, broken: Some(e) };
        }
        let mut confirmed = 0usize;
        let ords: Vec<Option<u32>> = devs.iter().map(|d| d.as_ref().map(|d| d.ordinal)).collect();
        for (range, _) in runs(&ords) {
            let dev = devs[range.clone()].iter().flatten().next().cloned();
            let Some(dev) = dev else {
                let out = run_window(conn, session, direction, v2, &reqs[range.clone()]);
                confirmed += out.confirmed;
                if out.broken.is_some() {
                    return WindowOutcome { confirmed, ..out };
                }
                continue;
            };
            let groups = self.groups(&reqs[range.clone()], &ords[range.clone()], range.start);
            let lease = match self.lease(Side::Outbound, &dev, groups.len(), stop) {
                Ok(l) => l,
                Err(e) => return WindowOutcome { confirmed, rejected: false, broken: Some(e) },
            };
            let out = match (direction, v2) {
                (Direction::Write, true) => write_groups_v2(&lease, conn, session, reqs, devs, &groups),
                // v1: a fence read per group confirms it.
                (Direction::Write, false) => write_groups(&lease, conn, session, false, reqs, devs, &groups),
                (Direction::Read, _) => read_groups(&lease, conn, session, v2, reqs, devs, &groups),
            };
            confirmed += out.confirmed;
            if out.broken.is_some() {
                return WindowOutcome { confirmed, ..out };
            }
        }
        WindowOutcome { confirmed, rejected: false, broken: None }
    }

    /// Cut a run into groups whose device bytes fit one buffer.
    fn groups(&self, reqs: &[Request], devs: &[Option<u32>], base: usize) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut start = 0usize;
        let mut bytes = 0usize;
        for (i, (r, d)) in reqs.iter().zip(devs).enumerate() {
            let need = if d.is_some() { r.len } else { 0 };
            if i > start && bytes + need > self.chunk {
                out.push(base + start..base + i);
                start = i;
                bytes = 0;
            }
            bytes += need;
        }
        if start < reqs.len() {
            out.push(base + start..base + reqs.len());
        }
        out
    }
}

/// Consecutive requests whose device requests share one device: (range,
/// that device's ordinal, `None` if all are host memory).
fn runs(ords: &[Option<u32>]) -> Vec<(Range<usize>, Option<u32>)> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut current: Option<u32> = None;
    for (i, &d) in ords.iter().enumerate() {
        match (current, d) {
            (Some(c), Some(d)) if c != d => {
                out.push((start..i, Some(c)));
                start = i;
                current = Some(d);
            }
            (None, Some(d)) => current = Some(d),
            _ => {}
        }
    }
    if start < ords.len() {
        out.push((start..ords.len(), current));
    }
    out
}

/// The host view of a group: device locals replaced by offsets in buffer `b`.
fn host_view(
    lease: &Lease<'_>,
    b: usize,
    reqs: &[Request],
    devs: &[Option<Arc<Device>>],
    g: &Range<usize>,
) -> Vec<Request> {
    let mut off = 0usize;
    g.clone()
        .map(|i| match devs[i] {
            Some(_) => {
                let r = Request { local: lease.buf(b) as usize + off, ..reqs[i] };
                off += reqs[i].len;
                r
            }
            None => reqs[i],
        })
        .collect()
}

fn stage_out(
    lease: &Lease<'_>,
    b: usize,
    reqs: &[Request],
    devs: &[Option<Arc<Device>>],
    g: &Range<usize>,
) -> Result<Vec<Request>> {
    let view = host_view(lease, b, reqs, devs, g);
    let base = lease.buf(b) as usize;
    for (k, i) in g.clone().enumerate() {
        if devs[i].is_some() {
            lease.d2h_at(b, view[k].local - base, reqs[i].local as u64, reqs[i].len)?;
        }
    }
    Ok(view)
}

unsafe fn write_groups(
    lease: &Lease<'_>,
    conn: &mut Conn,
    session: &str,
    v2: bool,
    reqs: &[Request],
    devs: &[Option<Arc<Device>>],
    groups: &[Range<usize>],
) -> WindowOutcome {
    let n = lease.len();
    let fail = |confirmed, e: Error| WindowOutcome { confirmed, rejected: false, broken: Some(e) };
    let mut views: Vec<Option<Result<Vec<Request>>>> = (0..n).map(|_| None).collect();
    views[0] = Some(stage_out(lease, 0, reqs, devs, &groups[0]));
    let mut confirmed = 0usize;
    for (g, group) in groups.iter().enumerate() {
        let b = g % n;
        if n > 1 && g + 1 < groups.len() {
            views[(g + 1) % n] = Some(stage_out(lease, (g + 1) % n, reqs, devs, &groups[g + 1]));
        }
        let view = match views[b].take() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return fail(confirmed, e),
            None => return fail(confirmed, Error::new(ErrorKind::Panic, "staging group was not prepared")),
        };
        if let Err(e) = lease.sync(b) {
            return fail(confirmed, e);
        }
        let out = run_window(conn, session, Direction::Write, v2, &view);
        confirmed += out.confirmed;
        if out.broken.is_some() {
            return WindowOutcome { confirmed, ..out };
        }
        debug_assert_eq!(out.confirmed, group.len());
        if n == 1 && g + 1 < groups.len() {
            views[0] = Some(stage_out(lease, 0, reqs, devs, &groups[g + 1]));
        }
    }
    WindowOutcome { confirmed, rejected: false, broken: None }
}

/// The outcome when the target refused a request or the connection ended
/// while acknowledgements were awaited.
fn ended(confirmed: usize, (rejected, err): (bool, Option<Error>)) -> WindowOutcome {
    let broken = Some(err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected")));
    WindowOutcome { confirmed, rejected, broken }
}

/// Protocol v2 writes of a run, pipelined across groups: group g+1 is
/// staged while group g is sent, and acknowledgements are taken as they
/// come and waited for only at the end (as for host memory).
unsafe fn write_groups_v2(
    lease: &Lease<'_>,
    conn: &mut Conn,
    session: &str,
    reqs: &[Request],
    devs: &[Option<Arc<Device>>],
    groups: &[Range<usize>],
) -> WindowOutcome {
    let n = lease.len();
    let total = groups.iter().map(|g| g.len()).sum::<usize>();
    let mut views: Vec<Option<Result<Vec<Request>>>> = (0..n).map(|_| None).collect();
    views[0] = Some(stage_out(lease, 0, reqs, devs, &groups[0]));
    let (mut acked, mut sent) = (0usize, 0usize);
    // A local failure after `sent` requests went out: report what the
    // target confirmed of those.
    let local_failure =
        |conn: &mut Conn, acked: &mut usize, sent: usize, e: Error| match take_acks(conn, session, sent, acked, true) {
            Ok(()) => WindowOutcome { confirmed: *acked, rejected: false, broken: Some(e) },
            Err(end) => ended(*acked, end),
        };
    for (g, group) in groups.iter().enumerate() {
        let b = g % n;
        if n > 1 && g + 1 < groups.len() {
            views[(g + 1) % n] = Some(stage_out(lease, (g + 1) % n, reqs, devs, &groups[g + 1]));
        }
        let view = match views[b].take() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return local_failure(conn, &mut acked, sent, e),
            None => return local_failure(conn, &mut acked, sent, Error::new(ErrorKind::Panic, "group not staged")),
        };
        if let Err(e) = lease.sync(b) {
            return local_failure(conn, &mut acked, sent, e);
        }
        let headers: Vec<[u8; HEADER_LEN]> = view.iter().map(|r| header(r, Direction::Write, true)).collect();
        let mut pieces = Vec::with_capacity(2 * view.len());
        for (h, r) in headers.iter().zip(&view) {
            pieces.push((h.as_ptr(), HEADER_LEN));
            pieces.push((r.local as *const u8, r.len));
        }
        if let Err(e) = conn.send_vectored(&pieces) {
            // The target may have refused an earlier request and closed.
            let e = io_error(e, session);
            let _ = conn.fill_nonblocking();
            return match take_acks(conn, session, sent, &mut acked, false) {
                Err(end) => ended(acked, end),
                Ok(()) => WindowOutcome { confirmed: acked, rejected: false, broken: Some(e) },
            };
        }
        sent += group.len();
        if conn.fill_nonblocking().is_ok() {
            if let Err(end) = take_acks(conn, session, sent, &mut acked, false) {
                return ended(acked, end);
            }
        }
        if n == 1 && g + 1 < groups.len() {
            views[0] = Some(stage_out(lease, 0, reqs, devs, &groups[g + 1]));
        }
    }
    match take_acks(conn, session, total, &mut acked, true) {
        Ok(()) => WindowOutcome { confirmed: acked, rejected: false, broken: None },
        Err(end) => ended(acked, end),
    }
}

/// Reads of a run: every header is sent first (as for host memory), then
/// group after group is received into alternating buffers, each group's
/// copies to the device queued while the next one arrives. A request is
/// confirmed once its copy was synchronized (in order).
unsafe fn read_groups(
    lease: &Lease<'_>,
    conn: &mut Conn,
    session: &str,
    v2: bool,
    reqs: &[Request],
    devs: &[Option<Arc<Device>>],
    groups: &[Range<usize>],
) -> WindowOutcome {
    let n = lease.len();
    let mut wire_headers = Vec::with_capacity(HEADER_LEN * groups.iter().map(|g| g.len()).sum::<usize>());
    for g in groups {
        for r in &reqs[g.clone()] {
            wire_headers.extend_from_slice(&header(r, Direction::Read, v2));
        }
    }
    if let Err(e) = conn.send_all(&wire_headers) {
        return WindowOutcome { confirmed: 0, rejected: false, broken: Some(io_error(e, session)) };
    }
    // Requests received into buffer b whose copies are queued, not yet synchronized.
    let mut pending: Vec<usize> = vec![0; n];
    let mut confirmed = 0usize;
    let settle = |b: usize, pending: &mut Vec<usize>, confirmed: &mut usize| -> Result<()> {
        lease.sync(b)?;
        *confirmed += std::mem::take(&mut pending[b]);
        Ok(())
    };
    for (g, group) in groups.iter().enumerate() {
        let b = g % n;
        if g >= n {
            if let Err(e) = settle(b, &mut pending, &mut confirmed) {
                return WindowOutcome { confirmed, rejected: false, broken: Some(e) };
            }
        }
        let view = host_view(lease, b, reqs, devs, group);
        let mut got = 0usize;
        let mut failure: Option<(bool, Error)> = None;
        for r in &view {
            if v2 {
                let mut one = 0;
                if let Err((rejected, err)) = take_acks(conn, session, 1, &mut one, true) {
                    let e = err.unwrap_or_else(|| Error::new(ErrorKind::RemoteRejected, "rejected"));
                    failure = Some((rejected, e));
                    break;
                }
            }
            if let Err(e) = conn.recv_raw(r.local as *mut u8, r.len, &|| false) {
                failure = Some((false, io_error(e, session)));
                break;
            }
            got += 1;
        }
        let mut queued: Result<()> = Ok(());
        for (k, i) in group.clone().enumerate().take(got) {
            if queued.is_ok() && devs[i].is_some() {
                queued = lease.h2d_from(b, reqs[i].local as u64, view[k].local as *const u8, reqs[i].len);
            }
        }
        pending[b] = got;
        let failure = match (queued, failure) {
            (Err(e), _) => Some((false, e)),
            (Ok(()), f) => f,
        };
        if let Some((rejected, e)) = failure {
            // Settle what is queued, oldest first; the prefix stops at the
            // first copy that failed.
            for j in (g + 1).saturating_sub(n)..=g {
                if settle(j % n, &mut pending, &mut confirmed).is_err() {
                    return WindowOutcome { confirmed, rejected: false, broken: Some(e) };
                }
            }
            return WindowOutcome { confirmed, rejected, broken: Some(e) };
        }
    }
    for j in groups.len().saturating_sub(n)..groups.len() {
        if let Err(e) = settle(j % n, &mut pending, &mut confirmed) {
            return WindowOutcome { confirmed, rejected: false, broken: Some(e) };
        }
    }
    WindowOutcome { confirmed, rejected: false, broken: None }
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
    fn len(&self) -> usize {
        self.bufs.len()
    }

    fn buf(&self, i: usize) -> *mut u8 {
        self.bufs[i] as *mut u8
    }

    fn stream(&self, i: usize) -> cuda_sys::CUstream {
        self.streams[i] as cuda_sys::CUstream
    }

    /// Queue buffer `i`'s first `len` bytes → device `dptr`.
    fn h2d(&self, i: usize, dptr: u64, len: usize) -> Result<()> {
        self.h2d_from(i, dptr, self.buf(i), len)
    }

    /// Queue `src` (inside buffer `i`) → device `dptr`, on buffer `i`'s stream.
    fn h2d_from(&self, i: usize, dptr: u64, src: *const u8, len: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: `src..src+len` lies in our pinned buffer, which stays ours
        // until this stream is synchronized; `dptr` is in a registered device
        // region held by the caller.
        let rc = unsafe { (api.memcpy_htod_async)(dptr, src.cast(), len, self.stream(i)) };
        api.check(rc, "cuMemcpyHtoDAsync_v2").map_err(device_error)
    }

    /// Queue device `dptr` → the start of buffer `i`.
    fn d2h(&self, i: usize, dptr: u64, len: usize) -> Result<()> {
        self.d2h_at(i, 0, dptr, len)
    }

    fn d2h_at(&self, i: usize, off: usize, dptr: u64, len: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: as in `h2d_from`, the other way.
        let rc = unsafe { (api.memcpy_dtoh_async)(self.buf(i).add(off).cast(), dptr, len, self.stream(i)) };
        api.check(rc, "cuMemcpyDtoHAsync_v2").map_err(device_error)
    }

    fn sync(&self, i: usize) -> Result<()> {
        let api = &self.dev.api;
        // SAFETY: a stream we created and hold.
        api.check(unsafe { (api.stream_synchronize)(self.stream(i)) }, "cuStreamSynchronize").map_err(device_error)
    }

    fn sync_all(&self) -> Result<()> {
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

/// Serve inbound requests on a device region (the target side). An inbound
/// write is received into staging, copied to the device and acknowledged
/// (v2) only after the copy was synchronized, so a v1 fence read behind it
/// also passes only then; an inbound read is copied to staging,
/// synchronized and sent. Small requests already pipelined behind this one
/// (same direction, same device, fitting one buffer) are served together:
/// one synchronize, one send. A failed driver call answers REJECTED for the
/// request it concerns where requests are acknowledged, after confirming
/// the ones before it, and closes the connection (`false`).
pub(crate) fn serve_device(
    inner: &Inner,
    conn: &mut Conn,
    dev: &Arc<Device>,
    header: &RequestHeader,
    acks: &mut Vec<u8>,
    revoked: &dyn Fn() -> bool,
) -> bool {
    let size = header.size as usize;
    let staging = &inner.staging;
    let result = if size > staging.chunk {
        large(staging, conn, dev, header, acks, revoked).inspect(|()| inner.stats.served(header.direction, header.size))
    } else {
        small_run(inner, conn, dev, header, acks, revoked)
    };
    match result {
        Ok(()) => true,
        Err(Failure::Io(e)) => {
            log::debug!("data connection: {e}");
            false
        }
        Err(Failure::Device(e)) => {
            // The wire can only reject: the peer cannot tell this from a bad
            // range, so it is logged and, for a driver fault, counted here.
            if e.kind() == ErrorKind::Device {
                crate::transfer::stats::Stats::bump(&inner.stats.served_device_failures);
            }
            if !inner.registry.stopping() {
                log::warn!(
                    "data connection: a peer's {} of {} bytes at {:#x} ({dev:?}) failed on this side and is rejected: {e}",
                    header.direction.name(),
                    header.size,
                    header.addr
                );
            }
            false
        }
    }
}

/// Flush acknowledgements unless more pipelined requests are already here.
fn flush_acks(conn: &Conn, acks: &mut Vec<u8>) -> io::Result<()> {
    if conn.buffered() < HEADER_LEN || acks.len() >= 4096 {
        conn.send_all(acks)?;
        acks.clear();
    }
    Ok(())
}

fn reject(conn: &Conn, acks: &mut Vec<u8>, acknowledged: bool, e: Error) -> Failure {
    if acknowledged {
        acks.extend_from_slice(&wire::encode_status(wire::STATUS_REJECTED));
        let _ = conn.send_all(acks);
    }
    acks.clear();
    Failure::Device(e)
}

/// One request larger than a staging buffer, pipelined in chunks.
fn large(
    staging: &Staging,
    conn: &mut Conn,
    dev: &Arc<Device>,
    header: &RequestHeader,
    acks: &mut Vec<u8>,
    revoked: &dyn Fn() -> bool,
) -> std::result::Result<(), Failure> {
    let size = header.size as usize;
    match header.direction {
        Direction::Write => {
            match staging.recv_to_device(conn, dev, header.addr, size, revoked) {
                Ok(()) => {}
                Err(Failure::Device(e)) => return Err(reject(conn, acks, header.acknowledged, e)),
                Err(f) => return Err(f),
            }
            if header.acknowledged {
                acks.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
            }
            flush_acks(conn, acks)?;
            Ok(())
        }
        Direction::Read => staging.send_from_device(conn, dev, header.addr, size, acks, header.acknowledged, revoked),
    }
}

/// The next pipelined request, if it can join a run of small requests in
/// direction `d` on `dev` with `room` bytes left in the buffer.
fn next_small(inner: &Inner, conn: &Conn, d: Direction, dev: &Device, room: usize) -> Option<(RequestHeader, Hold)> {
    let h = RequestHeader::decode(&conn.peek_buffered::<HEADER_LEN>()?);
    if h.direction != d || h.size == 0 || h.size as usize > room {
        return None;
    }
    let r = inner.regions.lookup(h.addr, h.size)?;
    if r.device.as_ref()?.ordinal != dev.ordinal {
        return None;
    }
    // Held with this connection listed, so unregistering can end it.
    r.hold(conn.raw_fd()).map(|hold| (h, hold))
}

/// A run of small requests staged in one buffer with one synchronize.
fn small_run(
    inner: &Inner,
    conn: &mut Conn,
    dev: &Arc<Device>,
    first: &RequestHeader,
    acks: &mut Vec<u8>,
    revoked: &dyn Fn() -> bool,
) -> std::result::Result<(), Failure> {
    let staging = &inner.staging;
    let lease = match staging.lease(Side::Inbound, dev, 1, revoked) {
        Ok(l) => l,
        // A driver call failed (pinned buffer, stream): refuse this request.
        Err(e) if e.kind() == ErrorKind::Device => return Err(reject(conn, acks, first.acknowledged, e)),
        // No buffer in time (or stopping): close, the initiator retries.
        Err(e) => return Err(Failure::Io(io::Error::new(io::ErrorKind::TimedOut, e.to_string()))),
    };
    let base = lease.buf(0);
    // Regions of the requests after the first (the caller holds the first's)
    // stay held until their copies are synchronized.
    let mut held: Vec<Hold> = Vec::new();
    let mut run: Vec<(RequestHeader, usize)> = Vec::new();
    let mut header = *first;
    let mut off = 0usize;
    loop {
        let size = header.size as usize;
        let stop = || revoked() || held.iter().any(|r| r.region().is_revoked());
        // `base+off .. +size` lies in our pinned buffer (size fits the room
        // left); the device range is in a held region.
        let queued = match header.direction {
            Direction::Write => {
                // SAFETY: see above; the buffer is ours until the lease drops.
                let dst = unsafe { base.add(off) };
                // SAFETY: `dst..dst+size` is writable (see above).
                unsafe { conn.recv_raw(dst, size, &stop) }?;
                lease.h2d_from(0, header.addr, dst, size)
            }
            Direction::Read => lease.d2h_at(0, off, header.addr, size),
        };
        if let Err(e) = queued {
            // This request alone failed: confirm the ones before it.
            let done = lease.sync(0).map(|()| run.len()).unwrap_or(0);
            let e = finish_run(conn, &lease, &run[..done], acks).err().map(Failure::Io).unwrap_or(Failure::Device(e));
            return Err(match e {
                Failure::Device(e) => reject(conn, acks, header.acknowledged, e),
                f => f,
            });
        }
        run.push((header, off));
        off += size;
        match next_small(inner, conn, header.direction, dev, staging.chunk - off) {
            Some((h, r)) => {
                let mut raw = [0u8; HEADER_LEN];
                conn.recv_exact(&mut raw)?; // the header peeked at, now consumed
                held.push(r);
                header = h;
            }
            None => break,
        }
    }
    if let Err(e) = lease.sync(0) {
        // Which copy failed is unknown: the first request of the run is
        // refused and the connection closes; the initiator retries the rest.
        return Err(reject(conn, acks, run[0].0.acknowledged, e));
    }
    finish_run(conn, &lease, &run, acks)?;
    drop(held);
    for (h, _) in &run {
        inner.stats.served(h.direction, h.size);
    }
    Ok(())
}

/// Acknowledge a synchronized run of writes, or send a run of reads (each
/// with its status frame in v2) in one gathered send.
fn finish_run(conn: &Conn, lease: &Lease<'_>, run: &[(RequestHeader, usize)], acks: &mut Vec<u8>) -> io::Result<()> {
    let Some((first, _)) = run.first() else { return Ok(()) };
    if first.direction == Direction::Write {
        for (h, _) in run {
            if h.acknowledged {
                acks.extend_from_slice(&wire::encode_status(wire::STATUS_OK));
            }
        }
        return flush_acks(conn, acks);
    }
    let ok = wire::encode_status(wire::STATUS_OK);
    let mut pieces: Vec<(*const u8, usize)> = Vec::with_capacity(2 * run.len() + 1);
    pieces.push((acks.as_ptr(), acks.len()));
    for (h, off) in run {
        if h.acknowledged {
            pieces.push((ok.as_ptr(), ok.len()));
        }
        // SAFETY: inside our pinned buffer, synchronized.
        pieces.push((unsafe { lease.buf(0).add(*off) }.cast_const(), h.size as usize));
    }
    // SAFETY: every piece is readable: our Vec, a local array, our buffer.
    let sent = unsafe { conn.send_vectored(&pieces) };
    acks.clear();
    sent
}

/// The device each request's local range lives on (`None`: host memory),
/// or `None` for the whole window when this engine has no device region.
fn local_devices(inner: &Inner, reqs: &[Request]) -> Option<Vec<Option<Arc<Device>>>> {
    if !inner.regions.has_device_regions() {
        return None;
    }
    let devs: Vec<Option<Arc<Device>>> = reqs
        .iter()
        .map(|r| inner.regions.lookup(r.local as u64, r.len as u64).and_then(|reg| reg.device.clone()))
        .collect();
    devs.iter().any(Option::is_some).then_some(devs)
}

/// Run a window on an initiator lane, staging device-memory locals.
///
/// # Safety
/// As [`run_window`].
pub(crate) unsafe fn run_window_any(
    inner: &Inner,
    conn: &mut Conn,
    session: &str,
    direction: Direction,
    v2: bool,
    reqs: &[Request],
) -> WindowOutcome {
    match local_devices(inner, reqs) {
        None => run_window(conn, session, direction, v2, reqs),
        Some(devs) => {
            let stop = || inner.registry.stopping();
            inner.staging.run_window_staged(conn, session, direction, v2, reqs, &devs, &stop)
        }
    }
}

/// The largest piece a request may travel as: device locals are cut to one
/// staging buffer.
pub(crate) fn piece_limit(inner: &Inner, r: &Request, default: usize) -> usize {
    if !inner.regions.has_device_regions() {
        return default;
    }
    match inner.regions.lookup(r.local as u64, r.len.max(1) as u64) {
        Some(reg) if reg.device.is_some() => default.min(inner.staging.chunk()),
        _ => default,
    }
}

/// Refuse local ranges the CPU must not touch and staging cannot move,
/// before anything is read or written: ranges partly inside a device
/// region of this engine, and (when the CUDA driver is loaded in this
/// process) ranges outside every region of this engine that the driver
/// says are device memory, such as device memory never registered, or
/// registered on another engine only. Ranges inside one registered region
/// ask the driver nothing.
pub(crate) fn check_locals(inner: &Inner, reqs: &[Request]) -> Result<()> {
    let has_devices = inner.regions.has_device_regions();
    let driver = super::cuda::resident_driver();
    if !has_devices && driver.is_none() {
        return Ok(());
    }
    for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.len > 0) {
        let (addr, len) = (r.local as u64, r.len as u64);
        if inner.regions.lookup(addr, len).is_some() {
            continue;
        }
        if let Some(dev) = has_devices.then(|| inner.regions.device_overlapping(addr, len)).flatten() {
            return Err(Error::new(
                ErrorKind::AddressNotRegistered,
                format!(
                    "request {i}: local range {addr:#x}+{len} is not inside device region {:#x}+{} ({}) \
                     it overlaps; device memory is moved only within one registered region",
                    dev.start, dev.len, dev.location
                ),
            ));
        }
        if let Some(location) = driver.as_ref().and_then(|api| super::cuda::device_memory_in(api, addr, len)) {
            return Err(Error::new(
                ErrorKind::AddressNotRegistered,
                format!(
                    "request {i}: local range {addr:#x}+{len} is device memory ({location}, says the CUDA driver) \
                     that this engine has not registered; register it with this engine (location \"*\" or \
                     its cuda:N; a registration with another engine does not count) so that it is staged"
                ),
            ));
        }
    }
    Ok(())
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

    #[test]
    fn runs_split_at_device_changes_and_groups_fit_a_buffer() {
        let (d0, d3) = (Some(0), Some(3));
        let r = runs(&[None, d0, None, d0, d3, None, d3]);
        assert_eq!(r, vec![(0..4, Some(0)), (4..7, Some(3))]);
        assert_eq!(runs(&[None, None]), vec![(0..2, None)]);
        assert!(runs(&[]).is_empty());

        let s = Staging::new(MIN_STAGING_BYTES, Duration::from_secs(1));
        let c = s.chunk();
        let req = |len| Request { local: 0x1000, remote: 0x2000, len };
        // Device bytes per group never exceed one buffer; host requests ride along.
        let reqs = [req(c / 2), req(c / 2), req(1), req(c / 2 + 1), req(c), req(100)];
        let g = s.groups(&reqs, &[d0, d0, None, d0, d0, None], 10);
        assert_eq!(g, vec![10..13, 13..14, 14..16]);
    }

    #[test]
    fn host_memory_is_detected_as_host_and_moves_unstaged() {
        use crate::engine::{settings::Settings, Engine};
        use crate::transfer::location::{Location, Requested};
        use crate::transfer::TransferBackend;
        let a = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
        let b = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
        let target = vec![0u8; 8192];
        let source: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        // With or without a driver here, malloc'd memory is host memory.
        a.register_batch_at(&[(target.as_ptr() as u64, 4096)], Requested::Detect).unwrap();
        let cpu1 = Requested::At(Location::Host { numa: 1 });
        a.register_batch_at(&[(target.as_ptr() as u64 + 4096, 4096)], cpu1).unwrap();
        assert_eq!(a.location_of(target.as_ptr() as u64), Some(Location::Host { numa: 0 }));
        assert_eq!(a.location_of(target.as_ptr() as u64 + 4096), Some(Location::Host { numa: 1 }));
        assert_eq!(a.location_of(1), None);
        assert!(!a.inner.regions.has_device_regions());
        let reqs = vec![Request { local: source.as_ptr() as usize, remote: target.as_ptr() as u64 + 4096, len: 4096 }];
        // SAFETY: both vectors outlive the call.
        unsafe { b.transfer_sync(a.session_id(), Direction::Write, reqs) }.unwrap();
        assert_eq!(&target[4096..], &source[..]);
    }
}
