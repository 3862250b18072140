//! What every transfer backend offers the C ABI: the native TCP engine
//! ([`crate::engine::Engine`]) and, for other protocols, Mooncake's own
//! engine loaded at run time. Semantics and error kinds are the same for all
//! backends, so the ABI maps statuses one way whatever runs underneath.

use std::time::Duration;

use crate::engine::{BatchSummary, Direction, Request, TaskSummary};
use crate::error::{Error, Result};
use crate::location::Requested;

/// A running transfer engine.
pub trait TransferBackend: Send + Sync {
    /// `host:rpc_port`, the name peers use for this engine.
    fn session_id(&self) -> &str;
    /// The handshake (RPC) port.
    fn rpc_port(&self) -> u16;
    /// The protocol really in use (`"tcp"`, `"rdma"`, ...).
    fn protocol(&self) -> &str;
    /// Register regions `(addr, len)`, all or none; overlaps and zero
    /// lengths are `AddressOverlap`.
    fn register_batch(&self, regions: &[(u64, u64)]) -> Result<()>;
    /// As `register_batch`, at an explicit location (`"cpu:N"`, `"cuda:N"`)
    /// or `"*"` to detect it.
    fn register_batch_at(&self, regions: &[(u64, u64)], location: Requested) -> Result<()>;
    /// Unregister regions by start address, all or none; unknown is `NotFound`.
    fn unregister_batch(&self, addrs: &[u64]) -> Result<()>;
    /// Move every request; `Ok` only when each is confirmed at the target.
    ///
    /// # Safety
    /// Local ranges must be valid until this returns.
    unsafe fn transfer_sync(&self, session: &str, direction: Direction, reqs: Vec<Request>) -> Result<()>;
    /// Start a batch; the id is never 0.
    ///
    /// # Safety
    /// Local ranges must stay valid until the batch is finished.
    unsafe fn submit(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<(String, String)>,
    ) -> Result<u64>;
    fn batch_summary(&self, id: u64) -> Result<BatchSummary>;
    fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary>;
    /// Wait for the batch to finish; `Timeout` while tasks are in flight.
    fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary>;
    /// Free a finished batch; `Busy` while tasks are in flight.
    fn batch_free(&self, id: u64) -> Result<()>;
    fn probe(&self, session: &str) -> Result<()>;
    fn notify(&self, session: &str, name: &str, msg: &str) -> Result<()>;
    fn drain_notifications(&self) -> Vec<(String, String)>;
    /// Stop: fail in-flight work, release resources. Idempotent.
    fn stop(&self);
}

impl TransferBackend for crate::engine::Engine {
    fn session_id(&self) -> &str {
        crate::engine::Engine::session_id(self)
    }
    fn rpc_port(&self) -> u16 {
        crate::engine::Engine::rpc_port(self)
    }
    fn protocol(&self) -> &str {
        "tcp"
    }
    fn register_batch(&self, regions: &[(u64, u64)]) -> Result<()> {
        crate::engine::Engine::register_batch(self, regions)
    }
    fn register_batch_at(&self, regions: &[(u64, u64)], location: Requested) -> Result<()> {
        crate::engine::Engine::register_batch_at(self, regions, location)
    }
    fn unregister_batch(&self, addrs: &[u64]) -> Result<()> {
        crate::engine::Engine::unregister_batch(self, addrs)
    }
    unsafe fn transfer_sync(&self, session: &str, direction: Direction, reqs: Vec<Request>) -> Result<()> {
        crate::engine::Engine::transfer_sync(self, session, direction, reqs)
    }
    unsafe fn submit(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<(String, String)>,
    ) -> Result<u64> {
        crate::engine::Engine::submit(self, session, direction, reqs, notify)
    }
    fn batch_summary(&self, id: u64) -> Result<BatchSummary> {
        crate::engine::Engine::batch_summary(self, id)
    }
    fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary> {
        crate::engine::Engine::task_summary(self, id, task)
    }
    fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary> {
        crate::engine::Engine::batch_wait(self, id, timeout)
    }
    fn batch_free(&self, id: u64) -> Result<()> {
        crate::engine::Engine::batch_free(self, id)
    }
    fn probe(&self, session: &str) -> Result<()> {
        crate::engine::Engine::probe(self, session)
    }
    fn notify(&self, session: &str, name: &str, msg: &str) -> Result<()> {
        crate::engine::Engine::notify(self, session, name, msg)
    }
    fn drain_notifications(&self) -> Vec<(String, String)> {
        crate::engine::Engine::drain_notifications(self)
    }
    fn stop(&self) {
        crate::engine::Engine::stop(self)
    }
}

/// Resolve the transport for an engine on `hostname` (explicit `protocol` >
/// `MOONCAKE_PROTOCOL`; `MC_FORCE_TCP` forces tcp; see
/// [`crate::config::transport`]) and start the backend that serves it: the
/// native engine for `tcp` (unless `PDX_TCP_ENGINE=mooncake`), Mooncake's
/// engine for every other protocol.
pub fn start(hostname: &str, protocol: Option<&str>, device: Option<&str>) -> Result<Box<dyn TransferBackend>> {
    let choice = crate::config::transport::resolve_transport_from_process_env(hostname, protocol, device, -1)?;
    for w in &choice.warnings {
        log::warn!("{w}");
    }
    log::info!("starting a transfer engine: {}", choice.reason);
    if choice.protocol == "tcp" && !crate::mooncake::tcp_uses_mooncake()? {
        return Ok(Box::new(crate::engine::Engine::start(&choice.hostname)?));
    }
    Ok(Box::new(crate::mooncake::MooncakeBackend::start(&choice)?))
}

/// The error for a protocol no loaded backend can serve.
pub fn unavailable(protocol: &str, why: &str) -> Error {
    Error::new(crate::ErrorKind::BackendUnavailable, format!("protocol '{protocol}': {why}"))
}
