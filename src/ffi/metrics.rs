//! C ABI for the operators' view: an engine's metrics in the Prometheus
//! text format, and one peer's figures as JSON.
//!
//! ```c
//! size_t n = 0;
//! pdx_engine_metrics(engine, NULL, 0, &n);   /* ask for the length */
//! char *text = malloc(n + 1);
//! pdx_engine_metrics(engine, text, n + 1, &n);
//! ```

use std::ffi::c_char;

use super::boundary::{c_str, guard, text_out};
use super::engine::{pdx_engine, with_engine};
use super::status::pdx_status;

/// The engine's metrics in the Prometheus text exposition format (version
/// 0.0.4): counters of bytes and tasks by direction and path, failures by
/// kind, served requests and refusals, handshakes, connections (accepted,
/// open, refused by address or authentication), queued notification bytes,
/// lanes open, tasks queued, and histograms of task latency
/// (`pdx_task_latency_seconds`) and task size (`pdx_task_size_bytes`), each
/// with `HELP` and `TYPE`. Per-peer series (label `peer`, the session
/// name) only with `PDX_METRICS_PER_PEER` (engine option
/// `metrics_per_peer`), for the 100 busiest peers at most. README lists
/// every name; names are only ever added.
///
/// Copied into `buf` (`buf_len` bytes, NUL-terminated, truncated if
/// needed); the full length without the NUL goes to `*out_len` (may be
/// NULL); `buf` may be NULL with `buf_len` 0 to ask for the length. The
/// text is made afresh on each call (two calls may differ in length: give
/// room to spare). The caller owns `buf`.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT` (`buf` NULL with `buf_len` > 0),
/// `PDX_ERR_INVALID_HANDLE`. Nothing is written on error.
///
/// # Safety
/// `buf` is NULL (with `buf_len` 0) or writable for `buf_len` bytes;
/// `out_len` is NULL or valid for writing one `usize`. Handles are checked
/// by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_metrics(
    engine: *mut pdx_engine,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_engine_metrics", || {
        let out = text_out(buf, buf_len, out_len)?;
        let text = with_engine(engine, |e| Ok(crate::transfer::metrics::render(&e.metrics())))?;
        // SAFETY: checked shape; the caller provides `buf_len` writable bytes.
        unsafe { out.write(&text) };
        Ok(())
    })
}

/// One peer's figures as a JSON object: `"path"` (`"same-host"` or
/// `"tcp"`: the path of the last data connection opened to the peer) and
/// `"reason"` (why that path, in plain words: what qualified the peer for
/// the same-host link, or why it is on TCP) always, filled by the time the
/// first transfer to the peer returns; `bytes_written`, `bytes_read`,
/// `tasks_written`, `tasks_read` (completed tasks this engine initiated to
/// the peer), `same_host_bytes_written`, `same_host_bytes_read` (of those
/// bytes, what moved over the same-host link),
/// `tasks_failed` and `failures` (by kind: `timeout`, `connection_lost`,
/// `peer_unreachable`, `remote_rejected`, `shutdown`, `protocol`, `other`),
/// `last_error` (text or null) and `last_error_unix_s` (when, or null),
/// `lanes_open`, `tasks_queued`. Fields are only ever added. The engine
/// keeps these figures for the 4096 most recently active peers, after its
/// connections to a peer closed too. Copied as `pdx_engine_metrics` copies.
///
/// Errors: `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INVALID_ARGUMENT` (a peer this
/// engine never sent to, or has forgotten; also on a Mooncake-backed
/// engine, which keeps no figures per peer). Nothing is written on error.
///
/// # Safety
/// `session` is NULL or a NUL-terminated string; `buf` is NULL (with
/// `buf_len` 0) or writable for `buf_len` bytes; `out_len` is NULL or
/// valid for writing one `usize`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_peer_info(
    engine: *mut pdx_engine,
    session: *const c_char,
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> pdx_status {
    guard("pdx_peer_info", || {
        let out = text_out(buf, buf_len, out_len)?;
        let session = c_str(session, "session")?;
        let info = with_engine(engine, |e| e.peer_info(session))?;
        // SAFETY: checked shape; the caller provides `buf_len` writable bytes.
        unsafe { out.write(&info.to_string()) };
        Ok(())
    })
}
