//! C ABI for KV-cache transfers: page plans built once from the layer
//! buffers and the page map, submitted whole or layer by layer.
//!
//! ```c
//! pdx_kv_buffer local[72], remote[72];          // K and V of 36 layers
//! // ... base, page_bytes, pages of each buffer on each side ...
//! pdx_kv_plan *plan;
//! pdx_kv_plan_new(local, remote, 72, src_pages, dst_pages, n, NULL, &plan);
//! for (size_t layer = 0; layer < 36; layer++) {  // as the prefill writes them
//!   int last = layer == 35;
//!   pdx_kv_submit(e, peer, plan, 2 * layer, 2 * layer + 2, PDX_OPCODE_WRITE, NULL,
//!                 last ? "kv_done" : NULL, last ? room : NULL, &batch[layer]);
//! }
//! // wait for and free the batches as any other; then pdx_kv_plan_free(plan)
//! ```

use std::ffi::{c_char, c_void};
use std::time::Duration;

use super::boundary::{c_slice, c_str, guard, guard_or, handle_tag, out_ptr, HandleTable};
use super::engine::{
    backend_ref, notification_from, notification_from_c, pdx_engine, pdx_notify_bytes, with_engine, PDX_OPCODE_READ,
    PDX_OPCODE_WRITE,
};
use super::status::{pdx_status, status_of, PDX_OK};
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::kv::{KvBuffer, KvHeads, KvPlan, MAX_BUFFERS, MAX_PAGES};
use crate::transfer::kv_stream::{notify_outcome, LayerStreams, NotifyOutcome};
use crate::transfer::{Direction, Notification};

/// One buffer of a KV plan on one side: a layer's K, V or MLA buffer, or an
/// aux or state buffer. Page `i` is `[base + i * page_bytes, base + (i + 1)
/// * page_bytes)`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct pdx_kv_buffer {
    /// Address of page 0 (local: a pointer as an integer; remote: the
    /// peer's address). Never 0.
    pub base: u64,
    /// Bytes of one page in this buffer; never 0.
    pub page_bytes: u64,
    /// Pages in the buffer: every page index must be below it, and
    /// `base + pages * page_bytes` must fit 64 bits.
    pub pages: u64,
}

/// A heterogeneous-TP head slice: each page is token-major (a token's
/// heads side by side, then the next token); heads `[local_first,
/// local_first + count)` of each local token are sent to heads
/// `[remote_first, remote_first + count)` of the remote token. Each side's
/// `page_bytes` must be `tokens_per_page * heads * head_bytes`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct pdx_kv_heads {
    /// Tokens in one page (both sides).
    pub tokens_per_page: u32,
    /// Heads per token here.
    pub local_heads: u32,
    /// Heads per token at the peer.
    pub remote_heads: u32,
    /// First head read here.
    pub local_first: u32,
    /// First head written there.
    pub remote_first: u32,
    /// Heads per token sent.
    pub count: u32,
    /// Bytes of one head of one token.
    pub head_bytes: u64,
}

/// Opaque KV page plan. Made by `pdx_kv_plan_new`, released by
/// `pdx_kv_plan_free`. Immutable once built and safe to use from many
/// threads and with many engines at once.
#[allow(non_camel_case_types)]
pub struct pdx_kv_plan {
    _private: [u8; 0],
}

struct PlanHandle {
    plan: KvPlan,
    streams: LayerStreams,
}

static PLANS: HandleTable<PlanHandle> = HandleTable::new("pdx_kv_plan handle", handle_tag::KV_PLAN);

fn direction_of(opcode: i32) -> Result<Direction> {
    match opcode {
        PDX_OPCODE_READ => Ok(Direction::Read),
        PDX_OPCODE_WRITE => Ok(Direction::Write),
        other => Err(Error::invalid_argument(format!(
            "opcode {other} is neither PDX_OPCODE_READ (0) nor PDX_OPCODE_WRITE (1)"
        ))),
    }
}

fn buffers_of(c: &[pdx_kv_buffer]) -> Vec<KvBuffer> {
    c.iter().map(|b| KvBuffer { base: b.base, page_bytes: b.page_bytes, pages: b.pages }).collect()
}

/// Build a plan that moves pages `src_pages[i]` of every `local` buffer to
/// pages `dst_pages[i]` of the matching `remote` buffer (`buffers` of each,
/// `pages` indices in each array).
///
/// The pairs are cut into maximal runs consecutive on both sides, in the
/// given order (SGLang's grouping); each run becomes one request per
/// buffer, never merged further. With `heads` (NULL: whole pages, which
/// needs equal `page_bytes` on both sides of each buffer) each token's head
/// slice is one request, except when the slice is a whole token on both
/// sides: then tokens merge and the plan issues exactly as many requests as
/// without `heads`.
///
/// Checked here, each failing with `PDX_ERR_INVALID_ARGUMENT` (or
/// `PDX_ERR_NULL_ARGUMENT` for a NULL array with a length) and a message
/// naming the argument and its value: `buffers` 0; a zero `base` or
/// `page_bytes`; more than 65536 buffers or 2^26 pages; a buffer span that
/// overflows; an index below 0 or not below a buffer's `pages`; a
/// destination page repeated (two writes to one page); a head count of 0,
/// a head range outside a token, or a `page_bytes` other than
/// `tokens_per_page * heads * head_bytes`. No
/// engine is needed and no registration is checked; the plan copies what
/// it needs, so the arrays may be freed after the call. On success `*out`
/// receives a plan owned by the caller (`pdx_kv_plan_free`); on error it is
/// untouched.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `local` and `remote` are NULL (with
/// `buffers` 0) or point to `buffers` readable elements; `src_pages` and `dst_pages` are NULL
/// (with `pages` 0) or point to `pages` readable elements; `heads` is NULL or readable; `out` is
/// NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_plan_new(
    local: *const pdx_kv_buffer,
    remote: *const pdx_kv_buffer,
    buffers: usize,
    src_pages: *const i32,
    dst_pages: *const i32,
    pages: usize,
    heads: *const pdx_kv_heads,
    out: *mut *mut pdx_kv_plan,
) -> pdx_status {
    guard("pdx_kv_plan_new", || {
        let out = out_ptr(out, "out")?;
        if buffers == 0 {
            return Err(Error::invalid_argument("buffers is 0: a plan needs at least one buffer"));
        }
        // Bounds before any copy proportional to the lengths.
        if buffers > MAX_BUFFERS {
            return Err(Error::invalid_argument(format!("buffers is {buffers}, over the limit of {MAX_BUFFERS}")));
        }
        if pages > MAX_PAGES {
            return Err(Error::invalid_argument(format!("pages is {pages}, over the limit of {MAX_PAGES}")));
        }
        let local = buffers_of(c_slice(local, buffers, "local")?);
        let remote = buffers_of(c_slice(remote, buffers, "remote")?);
        let src = c_slice(src_pages, pages, "src_pages")?;
        let dst = c_slice(dst_pages, pages, "dst_pages")?;
        let heads = if heads.is_null() {
            None
        } else {
            if !heads.is_aligned() {
                return Err(Error::invalid_argument("heads is not aligned"));
            }
            let h = *heads;
            Some(KvHeads {
                tokens_per_page: h.tokens_per_page,
                local_heads: h.local_heads,
                remote_heads: h.remote_heads,
                local_first: h.local_first,
                remote_first: h.remote_first,
                count: h.count,
                head_bytes: h.head_bytes,
            })
        };
        let plan = KvPlan::new(&local, &remote, src, dst, heads.as_ref())?;
        *out = PLANS.insert(PlanHandle { plan, streams: LayerStreams::default() })?;
        Ok(())
    })
}

/// The number of requests a submit of buffers `[first_buffer, end_buffer)`
/// issues, into `*out_requests`. `PDX_ERR_INVALID_ARGUMENT` when
/// `first_buffer >= end_buffer` or `end_buffer` is past the plan's buffers;
/// `PDX_ERR_INVALID_HANDLE` for a freed plan. `*out_requests` is untouched
/// on error.
///
/// # Safety
/// `out_requests` is NULL or valid for writing one `size_t`. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_plan_requests(
    plan: *const pdx_kv_plan,
    first_buffer: usize,
    end_buffer: usize,
    out_requests: *mut usize,
) -> pdx_status {
    guard("pdx_kv_plan_requests", || {
        let out = out_ptr(out_requests, "out_requests")?;
        let n = PLANS.get(plan)?.plan.request_count(first_buffer, end_buffer)?;
        *out = usize::try_from(n).map_err(|_| Error::invalid_argument(format!("{n} requests do not fit size_t")))?;
        Ok(())
    })
}

/// Start the requests of buffers `[first_buffer, end_buffer)` of `plan` to
/// `session` as one ordinary batch and return at once with its id in
/// `*out_batch` (`pdx_batch_wait`, `pdx_batch_status`, `pdx_batch_free`
/// serve it). A stack submits layer by layer as the prefill writes them.
///
/// With `notify_name` and `notify_msg` (both set, or both NULL for none)
/// the notification is delivered to the peer exactly once, only after this
/// submit **and every earlier submit of the same plan to that session** (on
/// this engine) have landed; it is not sent if one of them failed. The
/// batch itself finishes when its own requests land; wait for the
/// notification with `pdx_kv_notify_wait`. Earlier batches already freed
/// by the caller count as landed (a batch can only be freed once finished);
/// a failed one not yet freed holds back later notifications of this plan
/// to that session.
///
/// `wait_event` (a `CUevent`, or NULL) orders the batch after the caller's
/// work: pdx's copies of device memory wait for it on the device (their
/// streams wait on the event, no host-side wait), and host memory is moved
/// once the event completed (`cuEventSynchronize` on a pdx thread), so the
/// caller needs no synchronize. The event must stay valid until the batch
/// is finished. With no CUDA driver loaded in the process a non-NULL event
/// is `PDX_ERR_DEVICE_UNAVAILABLE`; the Mooncake backend cannot order after
/// an event and refuses one (`PDX_ERR_INVALID_ARGUMENT`). A READ of a plan whose local pages repeat is refused (two writes
/// to one page). A submit of more requests than `PDX_MAX_BATCH_ENTRIES`
/// allows is refused; submit fewer buffers at once. Bad arguments fail as
/// `pdx_batch_submit`'s do, and as `pdx_kv_plan_requests`'s for the buffer
/// range; nothing is sent then and `*out_batch` is untouched. Local memory
/// must stay valid until the batch is finished.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session`, `notify_name` and
/// `notify_msg` are NULL or NUL-terminated strings; `out_batch` is NULL or valid for writing one
/// `u64`; the local memory of the plan's buffers is valid (readable for writes, writable for
/// reads) until the batch is finished. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_submit(
    engine: *mut pdx_engine,
    session: *const c_char,
    plan: *const pdx_kv_plan,
    first_buffer: usize,
    end_buffer: usize,
    opcode: i32,
    wait_event: *const c_void,
    notify_name: *const c_char,
    notify_msg: *const c_char,
    out_batch: *mut u64,
) -> pdx_status {
    guard("pdx_kv_submit", || {
        let out = out_ptr(out_batch, "out_batch")?;
        let notify = notification_from_c(notify_name, notify_msg)?;
        kv_submit(engine, session, plan, (first_buffer, end_buffer), opcode, wait_event, notify, out)
    })
}

/// `pdx_kv_submit` with the notification as bytes: `notify` NULL for none,
/// else its name and message, any bytes (NUL and bytes that are not UTF-8
/// included).
///
/// # Safety
/// As `pdx_kv_submit`; `notify` is NULL or points to a readable `pdx_notify_bytes` whose `name`
/// and `msg` are readable for `name_len` and `msg_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_submit_notify_bytes(
    engine: *mut pdx_engine,
    session: *const c_char,
    plan: *const pdx_kv_plan,
    first_buffer: usize,
    end_buffer: usize,
    opcode: i32,
    wait_event: *const c_void,
    notify: *const pdx_notify_bytes,
    out_batch: *mut u64,
) -> pdx_status {
    guard("pdx_kv_submit_notify_bytes", || {
        let out = out_ptr(out_batch, "out_batch")?;
        let notify = notification_from(notify)?;
        kv_submit(engine, session, plan, (first_buffer, end_buffer), opcode, wait_event, notify, out)
    })
}

/// What both KV submits do once their notification is read.
#[allow(clippy::too_many_arguments)]
unsafe fn kv_submit(
    engine: *mut pdx_engine,
    session: *const c_char,
    plan: *const pdx_kv_plan,
    (first_buffer, end_buffer): (usize, usize),
    opcode: i32,
    wait_event: *const c_void,
    notify: Option<Notification>,
    out: *mut u64,
) -> Result<()> {
    let backend = backend_ref(engine)?;
    let session = c_str(session, "session")?;
    let p = PLANS.get(plan)?;
    p.plan.check_range(first_buffer, end_buffer)?;
    let direction = direction_of(opcode)?;
    let after = (!wait_event.is_null()).then_some(wait_event as usize);
    let key = engine as u64;
    // SAFETY: the caller keeps the local memory valid until the batch finishes.
    let id = unsafe {
        p.streams.submit(key, backend, &p.plan, session, (first_buffer, end_buffer), direction, notify, after)?
    };
    *out = id;
    Ok(())
}

/// Move every buffer of `plan` to (`PDX_OPCODE_WRITE`) or from
/// (`PDX_OPCODE_READ`) `session` and wait until all landed. `PDX_OK` only
/// when every request is confirmed; otherwise the status of the first
/// failure. When the plan issues more requests than `PDX_MAX_BATCH_ENTRIES`
/// allows at once they go in consecutive groups of whole buffers. Errors as
/// `pdx_kv_submit`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `session` is NULL or a NUL-terminated
/// string; the local memory of the plan's buffers is valid until the call returns. Handles are
/// checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_transfer_sync(
    engine: *mut pdx_engine,
    session: *const c_char,
    plan: *const pdx_kv_plan,
    opcode: i32,
) -> pdx_status {
    guard("pdx_kv_transfer_sync", || {
        with_engine(engine, |backend| {
            let session = c_str(session, "session")?;
            let p = PLANS.get(plan)?;
            let direction = direction_of(opcode)?;
            if direction == Direction::Read {
                p.plan.check_readable()?;
            }
            let (limit, buffers) = (backend.max_batch_entries(), p.plan.buffers());
            let per_buffer = p.plan.requests_per_buffer().max(1);
            let group = usize::try_from(limit as u64 / per_buffer).unwrap_or(buffers).clamp(1, buffers);
            let mut first = 0;
            while first < buffers {
                let end = (first + group).min(buffers);
                let reqs = p.plan.requests(first, end, limit)?;
                // SAFETY: the caller keeps the local memory valid until this returns.
                unsafe { backend.transfer_sync(session, direction, reqs)? };
                first = end;
            }
            Ok(())
        })
    })
}

/// Wait up to `timeout_ms` for the notification of the KV submit `batch`
/// (one that carried `notify_name`/`notify_msg`). `PDX_OK` once it is
/// settled, with `*out_error` (may be NULL) `PDX_OK` when it was delivered
/// and its failure's status otherwise: a failed layer's own status (the
/// earliest submit's that failed, e.g. `PDX_ERR_REMOTE_REJECTED`), or the
/// peer refusing the notification; the last error then has its text,
/// naming the failed batch. `PDX_ERR_TIMEOUT` while it still
/// waits for its layers; `PDX_ERR_NOT_FOUND` for a batch that carried no
/// notification (or one so old that its outcome was dropped: the last
/// 4096 are kept).
///
/// # Safety
/// `out_error` is NULL or valid for writing one `pdx_status`. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_kv_notify_wait(
    engine: *mut pdx_engine,
    batch: u64,
    timeout_ms: u32,
    out_error: *mut pdx_status,
) -> pdx_status {
    guard("pdx_kv_notify_wait", || {
        let out = super::boundary::opt_out_ptr(out_error, "out_error")?;
        with_engine(engine, |_| Ok(()))?;
        let outcome =
            notify_outcome(engine as u64, batch, Duration::from_millis(u64::from(timeout_ms))).ok_or_else(|| {
                Error::new(ErrorKind::NotFound, format!("batch {batch:#x} has no KV notification of this engine"))
            })?;
        let status = match outcome {
            NotifyOutcome::Pending => {
                return Err(Error::timeout(format!(
                    "the notification of batch {batch:#x} still waits for its layers after {timeout_ms} ms"
                )))
            }
            NotifyOutcome::Sent => PDX_OK,
            NotifyOutcome::Failed(e) => {
                super::boundary::set_last_error(e.message());
                status_of(e.kind())
            }
        };
        if let Some(p) = out {
            *p = status;
        }
        Ok(())
    })
}

/// Release a plan. NULL does nothing. A plan already freed (or never
/// issued) is not touched: the call records `PDX_ERR_INVALID_HANDLE`'s
/// text as the last error and returns. Batches already submitted from the
/// plan are not affected, nor are their notifications.
#[no_mangle]
pub extern "C" fn pdx_kv_plan_free(plan: *mut pdx_kv_plan) {
    guard_or("pdx_kv_plan_free", (), || {
        if plan.is_null() {
            return Ok(());
        }
        if PLANS.remove(plan).is_none() {
            PLANS.get(plan)?;
        }
        Ok(())
    })
}
