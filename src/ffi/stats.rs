//! C ABI for engine statistics: counters since the engine started, in a
//! versioned struct the caller allocates.

use super::boundary::guard;
use super::engine::{pdx_engine, with_engine};
use super::status::pdx_status;
use crate::error::{Error, ErrorKind};
use crate::transfer::stats::StatsSnapshot;

/// Counters of one engine since `pdx_engine_init`, filled by
/// `pdx_engine_stats`. Fields are only ever added at the end: set `size` to
/// `sizeof(pdx_stats)` before the call; pdx fills the fields that fit
/// and sets `size` to the bytes it filled (smaller when the library is
/// older than the header the caller was built with).
///
/// "Written"/"read" are this engine's own tasks as initiator (a sync call of
/// n entries is n tasks); "served" are requests of peers this engine served
/// as target (native engine only; a Mooncake-backed engine reports 0 there).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pdx_stats {
    /// In: the struct size the caller knows. Out: the bytes filled.
    pub size: usize,
    /// Payload bytes of completed write tasks.
    pub bytes_written: u64,
    /// Payload bytes of completed read tasks.
    pub bytes_read: u64,
    /// Completed write tasks.
    pub tasks_written: u64,
    /// Completed read tasks.
    pub tasks_read: u64,
    /// Failed tasks (all kinds; the next fields split them).
    pub tasks_failed: u64,
    /// Failed with `PDX_ERR_TIMEOUT`.
    pub failed_timeout: u64,
    /// Failed with `PDX_ERR_CONNECTION_LOST`.
    pub failed_connection_lost: u64,
    /// Failed with `PDX_ERR_PEER_UNREACHABLE`.
    pub failed_peer_unreachable: u64,
    /// Failed with `PDX_ERR_REMOTE_REJECTED`.
    pub failed_remote_rejected: u64,
    /// Failed with `PDX_ERR_SHUTDOWN`.
    pub failed_shutdown: u64,
    /// Failed with `PDX_ERR_PROTOCOL`.
    pub failed_protocol: u64,
    /// Failed with any other status.
    pub failed_other: u64,
    /// Payload bytes peers wrote into this engine's memory.
    pub served_bytes_written: u64,
    /// Payload bytes peers read from this engine's memory.
    pub served_bytes_read: u64,
    /// Write requests of peers served.
    pub served_writes: u64,
    /// Read requests of peers served.
    pub served_reads: u64,
    /// Requests of peers refused because their range is not inside one
    /// registered region (`served_device_failures` counts the other reason).
    pub requests_refused: u64,
    /// Handshake requests answered (metadata, probe, notify, ...).
    pub handshakes: u64,
    /// Inbound connections accepted.
    pub inbound_connections: u64,
    /// Inbound connections open now.
    pub inbound_connections_open: u64,
    /// Peers this engine knows (descriptor fetched, or segment open) now.
    pub peers_connected: u64,
    /// Bytes of received notifications waiting to be drained now.
    pub notification_bytes_queued: u64,
    /// Median latency of completed tasks, from submission, in microseconds
    /// (log-scale buckets, within 19%).
    pub latency_p50_us: u64,
    /// 99th percentile of the same.
    pub latency_p99_us: u64,
    /// Requests of peers that failed while being served because a CUDA
    /// driver call failed on this engine (a copy, a synchronize, a pinned
    /// buffer or a stream): the wire can only reject them, so the peer sees
    /// the same reject as for a bad range; this engine logs a warning naming
    /// the call. Native engine only.
    pub served_device_failures: u64,
    /// Payload bytes of completed writes (of `bytes_written`) that moved
    /// entirely over the same-host link (one cross-process copy, not TCP).
    pub same_host_bytes_written: u64,
    /// The same for reads (of `bytes_read`).
    pub same_host_bytes_read: u64,
    /// Completed writes (of `tasks_written`) that moved entirely over the
    /// same-host link.
    pub same_host_tasks_written: u64,
    /// The same for reads (of `tasks_read`).
    pub same_host_tasks_read: u64,
    /// Tasks the caller cancelled (`pdx_batch_cancel`, `pdx_task_cancel`;
    /// counted in neither completed nor failed tasks).
    pub tasks_canceled: u64,
}

fn to_c(s: &StatsSnapshot) -> pdx_stats {
    let [failed_timeout, failed_connection_lost, failed_peer_unreachable, failed_remote_rejected, failed_shutdown, failed_protocol, failed_other] =
        s.failed_by_kind;
    pdx_stats {
        size: std::mem::size_of::<pdx_stats>(),
        bytes_written: s.bytes_written,
        bytes_read: s.bytes_read,
        tasks_written: s.tasks_written,
        tasks_read: s.tasks_read,
        tasks_failed: s.tasks_failed,
        failed_timeout,
        failed_connection_lost,
        failed_peer_unreachable,
        failed_remote_rejected,
        failed_shutdown,
        failed_protocol,
        failed_other,
        served_bytes_written: s.served_bytes_written,
        served_bytes_read: s.served_bytes_read,
        served_writes: s.served_writes,
        served_reads: s.served_reads,
        requests_refused: s.requests_refused,
        handshakes: s.handshakes,
        inbound_connections: s.inbound_connections,
        inbound_connections_open: s.gauges.inbound_connections_open,
        peers_connected: s.gauges.peers_connected,
        notification_bytes_queued: s.gauges.notification_bytes_queued,
        latency_p50_us: s.latency_p50_us,
        latency_p99_us: s.latency_p99_us,
        served_device_failures: s.served_device_failures,
        same_host_bytes_written: s.same_host_bytes_written,
        same_host_bytes_read: s.same_host_bytes_read,
        same_host_tasks_written: s.same_host_tasks_written,
        same_host_tasks_read: s.same_host_tasks_read,
        tasks_canceled: s.tasks_canceled,
    }
}

/// Fill `*out` with the engine's counters (see `pdx_stats`). The
/// caller sets `out->size` first; a size smaller than the `size` field
/// itself is `PDX_ERR_INVALID_ARGUMENT`. Reading the counters takes no lock
/// the transfers use: call it as often as you like.
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes (at least the
/// `size` field) for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn pdx_engine_stats(engine: *mut pdx_engine, out: *mut pdx_stats) -> pdx_status {
    guard("pdx_engine_stats", || {
        let out = super::boundary::out_ptr(out, "out")?;
        // SAFETY: `out` is non-NULL and aligned; the caller provides at least
        // the `size` field.
        let given = unsafe { (*out).size };
        if given < std::mem::size_of::<usize>() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("out->size is {given}: set it to sizeof(pdx_stats) first"),
            ));
        }
        let full = to_c(&with_engine(engine, |e| Ok(e.stats()))?);
        let n = given.min(std::mem::size_of::<pdx_stats>());
        // SAFETY: the caller provides `given` writable bytes and `n <= given`;
        // `full` is a plain-old-data struct of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping((&full as *const pdx_stats).cast::<u8>(), out.cast::<u8>(), n) };
        // SAFETY: as above; the size field lies inside the first `n` bytes.
        unsafe { (*out).size = n };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_field_comes_first_and_fields_are_u64() {
        assert_eq!(std::mem::offset_of!(pdx_stats, size), 0);
        assert_eq!(std::mem::size_of::<pdx_stats>(), 8 + 30 * 8, "fields are only added at the end");
    }
}
