//! Staging device (CUDA) memory through pinned host buffers. The CPU never
//! touches device memory: bytes go device → pinned buffer → socket, or
//! socket → pinned buffer → device, on streams of the region's device's
//! primary context, and nothing is sent, acknowledged or reported completed
//! before `cuStreamSynchronize` of its copy returned.
//!
//! - [`pool`]: the bounded pinned pool and its leases (buffers, streams,
//!   the device's context current while leased).
//! - [`staged`]: device memory as the initiator's window protocol sees it
//!   (`window::LocalMemory`). The target's side is `server::device`.

mod pool;
mod staged;

pub(crate) use pool::{Lease, Side, Staging, DEFAULT_STAGING_BYTES, MIN_STAGING_BYTES};

#[cfg(test)]
mod tests {
    use crate::transfer::{Direction, Request};

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
