//! [`MooncakeBackend`]: Mooncake's engine behind [`TransferBackend`].

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_sys::{
    Api, BufferEntry, Convention, NotifyMsg, SegmentId, TransferEngineT, TransferRequest, TransferStatus,
};
use parking_lot::{Mutex, RwLock};

use super::batches::{McBatch, Task};
use super::convert::{check, check_notify_frame, notify_cstrings, task_state};
use super::topology;
use crate::config::env::{self, vars, ProcessEnv};
use crate::config::transport::TransportChoice;
use crate::error::{Error, ErrorKind, Result};
use crate::ids::IdTable;
use crate::transfer::backend::unavailable;
use crate::transfer::host::engine_host;
use crate::transfer::regions::RegionMap;
use crate::transfer::stats::{Gauges, Stats, StatsSnapshot};
use crate::transfer::{state, BatchSummary, Direction, Notification, Request, TaskState, TaskSummary, TransferBackend};

/// Sync-call deadline when `MC_TRANSFER_TIMEOUT` is unset (seconds).
const DEFAULT_SYNC_TIMEOUT_S: u64 = 30;
/// Longest sleep between two status polls.
const MAX_POLL_SLEEP: Duration = Duration::from_millis(1);

/// The engine pointer Mooncake gave us. Mooncake's engine is thread-safe.
struct EnginePtr(TransferEngineT);
// SAFETY: the pointer is only passed back to Mooncake, whose engine may be
// used from any thread.
unsafe impl Send for EnginePtr {}
// SAFETY: as for `Send`: Mooncake's engine is thread-safe.
unsafe impl Sync for EnginePtr {}

/// Mooncake's transfer engine, loaded at run time.
pub struct MooncakeBackend {
    api: Arc<Api>,
    engine: RwLock<Option<EnginePtr>>,
    stopping: AtomicBool,
    protocol: String,
    session_id: String,
    rpc_port: u16,
    segments: Mutex<HashMap<String, SegmentId>>,
    regions: Mutex<RegionMap<()>>,
    batches: IdTable<McBatch>,
    /// Mooncake batches a sync call gave up on while tasks were in flight;
    /// freed once Mooncake agrees (never forgotten, never freed twice).
    orphans: Mutex<Vec<u64>>,
    sync_timeout: Duration,
    /// The handshake frame limit Mooncake's peers enforce
    /// (`MC_HANDSHAKE_MAX_LENGTH`): notifications that cannot fit are
    /// refused before Mooncake sends them.
    handshake_max_len: usize,
    stats: Stats,
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid_argument(format!("{what} contains a NUL byte")))
}

/// The sync deadline: `MC_TRANSFER_TIMEOUT` seconds (at least 5, as in
/// Mooncake's Python layer), default 30.
fn sync_timeout_from_env() -> Duration {
    sync_timeout_in(&ProcessEnv)
}

fn sync_timeout_in(env: &dyn env::Env) -> Duration {
    env::read(env, &vars::MC_TRANSFER_TIMEOUT).unwrap_or(Duration::from_secs(DEFAULT_SYNC_TIMEOUT_S))
}

/// Sleeps that grow from a yield to [`MAX_POLL_SLEEP`].
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        match self.next() {
            None => std::thread::yield_now(),
            Some(pause) => std::thread::sleep(pause),
        }
    }

    /// The next pause (`None`: a yield), advancing the schedule.
    fn next(&mut self) -> Option<Duration> {
        let pause = (self.0 > 0).then(|| (Duration::from_micros(10) * 2u32.saturating_pow(self.0)).min(MAX_POLL_SLEEP));
        self.0 = self.0.saturating_add(1).min(16);
        pause
    }
}

/// For a protocol that needs RDMA hardware: how a machine without it runs
/// on TCP (the native engine) instead, for the end of an error.
fn tcp_hint(protocol: &str) -> &'static str {
    match protocol {
        "rdma" | "efa" => {
            "; without RDMA hardware, use TCP instead: pass protocol \"tcp\", or set MOONCAKE_PROTOCOL=tcp or \
             MC_FORCE_TCP=1"
        }
        _ => "",
    }
}

impl MooncakeBackend {
    /// Load the library (`PDX_MOONCAKE_LIB`, default `libtransfer_engine.so`)
    /// and start an engine for `choice`.
    pub fn start(choice: &TransportChoice) -> Result<MooncakeBackend> {
        Self::start_in(choice, &ProcessEnv)
    }

    /// [`MooncakeBackend::start`] reading `PDX_MOONCAKE_LIB` and
    /// `MC_TRANSFER_TIMEOUT` from `env` (an engine's options over the
    /// process environment).
    pub fn start_in(choice: &TransportChoice, env: &dyn env::Env) -> Result<MooncakeBackend> {
        // Mooncake's library is started in P2P mode; a metadata server is
        // served by pdx's own engine only (protocol tcp).
        let metadata: Option<String> = env::read(env, &env::vars::PDX_METADATA_SERVER);
        if let Some(m) = metadata.filter(|m| !matches!(m.trim(), "" | "P2PHANDSHAKE")) {
            return Err(crate::Error::invalid_argument(format!(
                "metadata server {m:?}: protocol '{}' runs on Mooncake's library in P2PHANDSHAKE mode only; \
                 metadata servers are served by pdx's tcp engine",
                choice.protocol
            )));
        }
        let api = super::load_in(env).map_err(|why| {
            unavailable(&choice.protocol, &format!("{}; {why}{}", choice.reason, tcp_hint(&choice.protocol)))
        })?;
        let mut backend = Self::start_with(api, &choice.protocol, &choice.hostname, &choice.device)?;
        backend.sync_timeout = sync_timeout_in(env);
        backend.handshake_max_len = env::read(env, &vars::MC_HANDSHAKE_MAX_LENGTH).unwrap_or(1 << 20);
        Ok(backend)
    }

    /// Start an engine with an already loaded library: P2PHANDSHAKE metadata,
    /// auto-discovery off, exactly `protocol` installed, `device` (a comma
    /// list, `""` = let Mooncake discover) as the NIC priority matrix.
    pub fn start_with(api: Arc<Api>, protocol: &str, hostname: &str, device: &str) -> Result<MooncakeBackend> {
        let host = engine_host(hostname)?;
        let metadata = cstring(mooncake_sys::P2PHANDSHAKE, "metadata")?;
        let server_name = cstring(hostname.trim(), "hostname")?;
        let ip = cstring(&host, "hostname")?;
        let proto = cstring(protocol, "protocol")?;
        let lib = api.path().to_owned();
        // SAFETY: valid NUL-terminated strings; Mooncake copies them.
        let engine =
            unsafe { (api.create_transfer_engine)(metadata.as_ptr(), server_name.as_ptr(), ip.as_ptr(), 0, 0) };
        if engine.is_null() {
            return Err(unavailable(
                protocol,
                &format!("createTransferEngine(P2PHANDSHAKE, {hostname:?}) failed in Mooncake library '{lib}' (its log says why)"),
            ));
        }
        let destroy = |why: Error| {
            // SAFETY: `engine` came from createTransferEngine and is not used again.
            unsafe { (api.destroy_transfer_engine)(engine) };
            why
        };

        let devices = topology::split_devices(device);
        let matrix = topology::nic_priority_matrix(&devices, &topology::numa_nodes());
        let matrix = match matrix.as_deref().map(|m| cstring(m, "device list")) {
            Some(Err(e)) => return Err(destroy(e)),
            Some(Ok(m)) => Some(m),
            None => None,
        };
        if matrix.is_none() && protocol != "tcp" {
            if let Some(discover) = api.discover_topology {
                // SAFETY: live engine.
                let rc = unsafe { discover(engine) };
                if let Err(e) = check(rc, Convention::NegativeErr, "discoverTopology") {
                    log::warn!("Mooncake topology discovery failed ({e}); installing '{protocol}' anyway");
                }
            }
        }
        let mut args: [*mut c_void; 2] =
            [matrix.as_ref().map_or(ptr::null_mut(), |m| m.as_ptr() as *mut c_void), ptr::null_mut()];
        let args_ptr = if matrix.is_some() { args.as_mut_ptr() } else { ptr::null_mut() };
        // SAFETY: live engine, valid strings; args is NULL or a NULL-ended
        // array whose first entry is a NUL-terminated JSON string.
        let transport = unsafe { (api.install_transport)(engine, proto.as_ptr(), args_ptr) };
        if transport.is_null() {
            let devs = if devices.is_empty() { "auto-discovered".to_owned() } else { devices.join(",") };
            return Err(destroy(unavailable(
                protocol,
                &format!(
                    "Mooncake library '{lib}' cannot install the '{protocol}' transport (installTransport returned NULL; \
                     devices: {devs}): it was built without '{protocol}' support, or no usable device for it was \
                     found{}",
                    tcp_hint(protocol)
                ),
            )));
        }

        let mut buf = [0 as c_char; 256];
        // SAFETY: live engine; the buffer and its length match.
        let rc = unsafe { (api.get_local_ip_and_port)(engine, buf.as_mut_ptr(), buf.len()) };
        if let Err(e) = check(rc, Convention::NegativeErr, "getLocalIpAndPort") {
            return Err(destroy(e));
        }
        buf[buf.len() - 1] = 0;
        // SAFETY: the buffer is NUL-terminated (its last byte was just zeroed).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        let port = text.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).filter(|p| *p != 0);
        let Some(rpc_port) = port else {
            return Err(destroy(Error::protocol(format!("getLocalIpAndPort gave {text:?}, which has no port"))));
        };
        let session_id = crate::config::net::session_id(&host, rpc_port);
        log::info!("Mooncake engine {session_id} up: protocol '{protocol}', library '{lib}'");
        Ok(MooncakeBackend {
            api,
            engine: RwLock::new(Some(EnginePtr(engine))),
            stopping: AtomicBool::new(false),
            protocol: protocol.to_owned(),
            session_id,
            rpc_port,
            segments: Mutex::new(HashMap::new()),
            regions: Mutex::new(RegionMap::default()),
            batches: IdTable::new("batch id", 0),
            orphans: Mutex::new(Vec::new()),
            sync_timeout: sync_timeout_from_env(),
            handshake_max_len: env::read(&ProcessEnv, &vars::MC_HANDSHAKE_MAX_LENGTH).unwrap_or(1 << 20),
            stats: Stats::default(),
        })
    }

    /// The library this engine runs on.
    pub fn library(&self) -> &str {
        self.api.path()
    }

    /// Run `f` with the live engine; `Shutdown` once stopping.
    fn with_engine<T>(&self, f: impl FnOnce(TransferEngineT) -> Result<T>) -> Result<T> {
        let guard = self.engine.read();
        match &*guard {
            Some(e) if !self.stopping.load(Ordering::Acquire) => f(e.0),
            _ => Err(Error::new(ErrorKind::Shutdown, "engine is shutting down")),
        }
    }

    fn segment(&self, eng: TransferEngineT, session: &str) -> Result<SegmentId> {
        if let Some(id) = self.segments.lock().get(session) {
            return Ok(*id);
        }
        let name = cstring(session, "session")?;
        // SAFETY: live engine, valid string.
        let id = unsafe { (self.api.open_segment)(eng, name.as_ptr()) };
        if id < 0 {
            return Err(Error::new(
                ErrorKind::PeerUnreachable,
                format!("cannot open Mooncake segment {session:?} (openSegment returned {id}): the peer is unreachable or not a Mooncake engine"),
            ));
        }
        self.segments.lock().insert(session.to_owned(), id);
        Ok(id)
    }

    /// Allocate a Mooncake batch for the non-empty requests and submit them.
    fn start_batch(
        &self,
        session: &str,
        direction: Direction,
        reqs: &[Request],
        notify: Option<&Notification>,
    ) -> Result<McBatch> {
        Request::validate_all(reqs)?;
        if let Some(note) = notify {
            self.check_notification(note)?;
        }
        self.free_orphans();
        let mut tasks = Vec::with_capacity(reqs.len());
        let mut wire = Vec::new();
        self.with_engine(|eng| {
            let seg = if reqs.iter().any(|r| r.len > 0) || notify.is_some() {
                Some(self.segment(eng, session)?)
            } else {
                None
            };
            for r in reqs {
                let mc_index = (r.len > 0).then(|| {
                    wire.push(TransferRequest {
                        opcode: match direction {
                            Direction::Read => mooncake_sys::OPCODE_READ,
                            Direction::Write => mooncake_sys::OPCODE_WRITE,
                        },
                        source: r.local as *mut c_void,
                        target_id: seg.unwrap_or(0),
                        file_id: 0,
                        target_offset: r.remote,
                        length: r.len as u64,
                    });
                    wire.len() - 1
                });
                tasks.push(Task { mc_index, len: r.len as u64, remote: r.remote });
            }
            let notify_c = notify.map(notify_cstrings).transpose()?;
            if wire.is_empty() {
                // Nothing crosses the wire; a requested notification goes out at once.
                if let (Some((n, m)), Some(seg)) = (&notify_c, seg) {
                    self.send_notify_to(eng, seg, session, n, m)?;
                }
                return Ok(self.counted(McBatch::new(session, direction, tasks, None)));
            }
            // SAFETY: live engine.
            let mc = unsafe { (self.api.allocate_batch_id)(eng, wire.len()) };
            if mc == mooncake_sys::INVALID_BATCH {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("allocateBatchID({}) failed (Mooncake returned INVALID_BATCH)", wire.len()),
                ));
            }
            // SAFETY: `mc` is a batch Mooncake just gave us; `wire` holds
            // `wire.len()` requests; the notification strings outlive the call.
            let rc = unsafe {
                match &notify_c {
                    Some((n, m)) => {
                        let msg = NotifyMsg { name: n.as_ptr() as *mut c_char, msg: m.as_ptr() as *mut c_char };
                        (self.api.submit_transfer_with_notify)(eng, mc, wire.as_mut_ptr(), wire.len(), msg)
                    }
                    None => (self.api.submit_transfer)(eng, mc, wire.as_mut_ptr(), wire.len()),
                }
            };
            let call = if notify_c.is_some() { "submitTransferWithNotify" } else { "submitTransfer" };
            if let Err(e) = check(rc, Convention::StatusCode, call) {
                // Nothing was accepted: the batch is idle and can go.
                // SAFETY: `mc` is ours and has no task in flight.
                let frc = unsafe { (self.api.free_batch_id)(eng, mc) };
                if frc != 0 {
                    self.orphans.lock().push(mc);
                }
                return Err(e.context(format!("{} {} request(s) to {session}", direction.name(), wire.len())));
            }
            Ok(self.counted(McBatch::new(session, direction, tasks, Some(mc))))
        })
    }

    /// Count a new batch's zero-length tasks, completed at once.
    fn counted(&self, b: McBatch) -> McBatch {
        for _ in b.tasks.iter().filter(|t| t.mc_index.is_none()) {
            self.stats.completed(b.direction, 0, Duration::ZERO);
        }
        b
    }

    /// Poll Mooncake for every task not yet terminal.
    fn refresh(&self, b: &McBatch) -> Result<()> {
        if b.is_done() {
            return Ok(());
        }
        self.with_engine(|eng| {
            let mc = b.mc_id.read();
            let Some(mc) = *mc else { return Ok(()) };
            let mut states = b.states.lock();
            for (i, t) in b.tasks.iter().enumerate() {
                let Some(idx) = t.mc_index else { continue };
                if states[i].state.is_terminal() {
                    continue;
                }
                let mut st = TransferStatus::default();
                // SAFETY: `mc` is live (the read lock keeps it from being
                // freed) and `idx` is below the count submitted into it.
                let rc = unsafe { (self.api.get_transfer_status)(eng, mc, idx, &mut st) };
                let where_ = || {
                    format!(
                        "task {i} ({} of {} bytes at remote {:#x} on {})",
                        b.direction.name(),
                        t.len,
                        t.remote,
                        b.session
                    )
                };
                if let Err(e) = check(rc, Convention::StatusCode, "getTransferStatus") {
                    self.stats.failed(b.direction, e.kind(), t.len, b.started.elapsed());
                    states[i].state = TaskState::Failed;
                    states[i].error = Some(e.context(where_()));
                    continue;
                }
                let (state, failure) = task_state(st.status);
                states[i].state = state;
                match (state, failure) {
                    (TaskState::Completed, _) => self.stats.completed(b.direction, t.len, b.started.elapsed()),
                    (TaskState::Failed, Some((kind, _))) => {
                        self.stats.failed(b.direction, kind, t.len, b.started.elapsed())
                    }
                    _ => {}
                }
                match state {
                    TaskState::Completed => states[i].bytes = t.len,
                    TaskState::Pending => states[i].bytes = st.transferred_bytes.min(t.len),
                    _ => {}
                }
                if let Some((kind, text)) = failure {
                    states[i].error = Some(Error::new(kind, format!("{}: {text} (status {})", where_(), st.status)));
                }
            }
            Ok(())
        })
    }

    /// Poll until the batch is done or `deadline` passes; true if done.
    fn wait_done(&self, b: &McBatch, deadline: Option<Instant>) -> Result<bool> {
        let mut backoff = Backoff(0);
        loop {
            self.refresh(b)?;
            if b.is_done() {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            backoff.wait();
        }
    }

    /// Free the Mooncake side of a finished batch (exactly once).
    fn release(&self, b: &McBatch) -> Result<()> {
        let mut mc = b.mc_id.write();
        let Some(id) = *mc else { return Ok(()) };
        let eng = self.engine.read();
        let Some(eng) = &*eng else { return Ok(()) };
        // SAFETY: `id` is a live batch of this engine with no task in flight
        // (checked by the caller); the write lock keeps pollers out.
        let rc = unsafe { (self.api.free_batch_id)(eng.0, id) };
        check(rc, Convention::StatusCode, "freeBatchID")?;
        *mc = None;
        Ok(())
    }

    /// Retry freeing batches abandoned by timed-out sync calls.
    fn free_orphans(&self) {
        let mut orphans = self.orphans.lock();
        if orphans.is_empty() {
            return;
        }
        let eng = self.engine.read();
        let Some(eng) = &*eng else { return };
        // SAFETY: each id is a live batch of this engine, freed at most once
        // (removed from the list when Mooncake accepts).
        orphans.retain(|&id| unsafe { (self.api.free_batch_id)(eng.0, id) } != 0);
    }

    fn send_notify_to(
        &self,
        eng: TransferEngineT,
        seg: SegmentId,
        session: &str,
        name: &CStr,
        msg: &CStr,
    ) -> Result<()> {
        let m = NotifyMsg { name: name.as_ptr() as *mut c_char, msg: msg.as_ptr() as *mut c_char };
        // SAFETY: live engine; Mooncake copies the strings.
        let rc = unsafe { (self.api.gen_notify_in_engine)(eng, seg as u64, m) };
        check(rc, Convention::NegativeErr, "genNotifyInEngine")
            .map_err(|e| Error::new(ErrorKind::NotifyRejected, format!("notification to {session} failed: {e}")))
    }
}

impl TransferBackend for MooncakeBackend {
    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn rpc_port(&self) -> u16 {
        self.rpc_port
    }

    fn protocol(&self) -> &str {
        &self.protocol
    }

    fn register_batch(&self, regions: &[(u64, u64)]) -> Result<()> {
        self.register_batch_at(regions, crate::transfer::location::Requested::Detect)
    }

    fn register_batch_at(&self, regions: &[(u64, u64)], location: crate::transfer::location::Requested) -> Result<()> {
        if regions.is_empty() {
            return Ok(());
        }
        let mut known = self.regions.lock();
        known.check_new(regions)?;
        // Mooncake takes the location as given ("*" lets it detect).
        let loc = match location {
            crate::transfer::location::Requested::Detect => cstring(mooncake_sys::WILDCARD_LOCATION, "location")?,
            at => cstring(&at.to_string(), "location")?,
        };
        self.with_engine(|eng| {
            let rc = if let [(addr, len)] = regions {
                // SAFETY: live engine; the caller keeps the memory valid.
                unsafe { (self.api.register_local_memory)(eng, *addr as *mut c_void, *len as usize, loc.as_ptr(), 1) }
            } else {
                let mut entries: Vec<BufferEntry> =
                    regions.iter().map(|&(a, l)| BufferEntry { addr: a as *mut c_void, length: l as usize }).collect();
                // SAFETY: as above; `entries` holds `entries.len()` items.
                unsafe {
                    (self.api.register_local_memory_batch)(eng, entries.as_mut_ptr(), entries.len(), loc.as_ptr())
                }
            };
            let call = if regions.len() == 1 { "registerLocalMemory" } else { "registerLocalMemoryBatch" };
            check(rc, Convention::NegativeErr, call)
        })?;
        known.insert_all(regions, |_, _| ())
    }

    fn unregister_batch(&self, addrs: &[u64]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        let mut known = self.regions.lock();
        known.check_starts(addrs)?;
        self.with_engine(|eng| {
            let rc = if let [a] = addrs {
                // SAFETY: live engine; `a` starts a region registered with it.
                unsafe { (self.api.unregister_local_memory)(eng, *a as *mut c_void) }
            } else {
                let mut list: Vec<*mut c_void> = addrs.iter().map(|&a| a as *mut c_void).collect();
                // SAFETY: as above; `list` holds `list.len()` addresses.
                unsafe { (self.api.unregister_local_memory_batch)(eng, list.as_mut_ptr(), list.len()) }
            };
            let call = if addrs.len() == 1 { "unregisterLocalMemory" } else { "unregisterLocalMemoryBatch" };
            check(rc, Convention::NegativeErr, call)
        })?;
        known.remove_all(addrs).map(drop)
    }

    unsafe fn transfer_sync(&self, session: &str, direction: Direction, reqs: Vec<Request>) -> Result<()> {
        let b = self.start_batch(session, direction, &reqs, None)?;
        let deadline = Instant::now() + self.sync_timeout;
        match self.wait_done(&b, Some(deadline)) {
            Ok(true) => {
                if let Err(e) = self.release(&b) {
                    log::warn!("freeing a finished Mooncake batch failed: {e}");
                    if let Some(id) = b.mc_id.write().take() {
                        self.orphans.lock().push(id);
                    }
                }
                b.outcome()
            }
            Err(e) => {
                if let Some(id) = b.mc_id.write().take() {
                    self.orphans.lock().push(id);
                }
                Err(e)
            }
            Ok(false) => {
                // Tasks still in flight: Mooncake refuses to free the batch
                // now; it is freed by a later call once they end.
                if let Some(id) = b.mc_id.write().take() {
                    self.orphans.lock().push(id);
                }
                let s = b.summary();
                Err(Error::timeout(format!(
                    "{} to {session} not finished after {:?} (MC_TRANSFER_TIMEOUT): {} of {} requests still in flight",
                    direction.name(),
                    self.sync_timeout,
                    s.in_flight(),
                    s.total
                )))
            }
        }
    }

    unsafe fn submit(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<Notification>,
    ) -> Result<u64> {
        let b = Arc::new(self.start_batch(session, direction, &reqs, notify.as_ref())?);
        match self.batches.insert(b.clone()) {
            Ok(id) => Ok(id),
            Err(e) => {
                if let Some(id) = b.mc_id.write().take() {
                    self.orphans.lock().push(id);
                }
                Err(e)
            }
        }
    }

    fn batch_summary(&self, id: u64) -> Result<BatchSummary> {
        let b = self.batches.get(id)?;
        self.refresh(&b)?;
        Ok(b.summary())
    }

    fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary> {
        let b = self.batches.get(id)?;
        self.refresh(&b)?;
        b.task(task)
    }

    fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary> {
        let b = self.batches.get(id)?;
        let deadline = Instant::now().checked_add(timeout);
        if !self.wait_done(&b, deadline)? {
            return Err(b.summary().not_finished(id, timeout));
        }
        Ok(b.summary())
    }

    /// Mooncake's classic API has no cancel: its transfers cannot be
    /// stopped from here (a stale id is still `InvalidHandle`).
    fn cancel(&self, id: u64, _task: Option<usize>) -> Result<usize> {
        self.batches.get(id)?;
        Err(Error::invalid_argument(format!(
            "batch {id:#x}: the {} backend runs Mooncake's own library, whose API has no cancel; wait for the batch \
             to finish (pdx's native engine, protocol tcp, can cancel)",
            self.protocol()
        )))
    }

    fn batch_free(&self, id: u64) -> Result<()> {
        self.batches
            .remove_with(id, |b| {
                if self.engine.read().is_none() {
                    return Ok(()); // stopped: Mooncake's side went with the engine
                }
                self.refresh(b)?;
                if !b.is_done() {
                    return Err(state::still_in_flight(id));
                }
                self.release(b)
            })
            .map(drop)
    }

    fn probe(&self, session: &str) -> Result<()> {
        self.with_engine(|eng| {
            let name = cstring(session, "session")?;
            // Mooncake's C API has no probe: fetching the peer's segment
            // afresh (a handshake with it) shows it is alive.
            // SAFETY: live engine, valid string.
            let id = unsafe {
                match self.api.open_segment_no_cache {
                    Some(f) => f(eng, name.as_ptr()),
                    None => (self.api.open_segment)(eng, name.as_ptr()),
                }
            };
            if id < 0 {
                return Err(Error::new(
                    ErrorKind::PeerUnreachable,
                    format!("probe of {session} failed (openSegment returned {id})"),
                ));
            }
            self.segments.lock().insert(session.to_owned(), id);
            Ok(())
        })
    }

    fn notify(&self, session: &str, note: &Notification) -> Result<()> {
        self.check_notification(note)?;
        let (n, m) = notify_cstrings(note)?;
        self.with_engine(|eng| {
            let seg = self.segment(eng, session)?;
            self.send_notify_to(eng, seg, session, &n, &m)
        })
    }

    /// No NUL byte (Mooncake's C API takes C strings), and a frame that can
    /// fit the peer's handshake frame limit (see [`check_notify_frame`]).
    fn check_notification(&self, note: &Notification) -> Result<()> {
        Notification::check_size(note.name.len(), note.msg.len())?;
        notify_cstrings(note)?;
        check_notify_frame(note, self.handshake_max_len)
    }

    /// Initiator-side counters only: Mooncake serves peers itself and
    /// reports nothing of it.
    fn stats(&self) -> StatsSnapshot {
        let peers = self.segments.lock().len() as u64;
        self.stats.snapshot(Gauges { peers_connected: peers, ..Gauges::default() })
    }

    /// The counters and the task histograms (Mooncake's own figures are not
    /// reachable through its C API).
    fn metrics(&self) -> crate::transfer::metrics::MetricsSnapshot {
        let mut m = crate::transfer::metrics::MetricsSnapshot::from_stats(&self.protocol, self.stats());
        (m.latency_us, m.size_bytes) = self.stats.histogram_snapshots();
        m
    }

    fn drain_notifications(&self) -> Vec<Notification> {
        self.with_engine(|eng| {
            let mut n: std::ffi::c_int = 0;
            // SAFETY: live engine; `n` receives the count.
            let list = unsafe { (self.api.get_notifs_from_engine)(eng, &mut n) };
            if list.is_null() || n <= 0 {
                return Ok(Vec::new());
            }
            // SAFETY: Mooncake returned an array of `n` entries whose strings
            // are NULL or NUL-terminated; it is handed back to it just after.
            let out = unsafe {
                let bytes =
                    |p: *const c_char| if p.is_null() { Vec::new() } else { CStr::from_ptr(p).to_bytes().to_vec() };
                let v = std::slice::from_raw_parts(list, n as usize)
                    .iter()
                    .map(|m| Notification::new(bytes(m.name), bytes(m.msg)))
                    .collect();
                (self.api.free_notifs_msg_buf)(list, n);
                v
            };
            Ok(out)
        })
        .unwrap_or_default()
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let mut guard = self.engine.write();
        let Some(eng) = guard.take() else { return };
        for b in self.batches.all() {
            let mut mc = b.mc_id.write();
            if let Some(id) = *mc {
                // SAFETY: a live batch of this engine; Mooncake refuses
                // (BatchBusy) when tasks are still in flight.
                if unsafe { (self.api.free_batch_id)(eng.0, id) } == 0 {
                    *mc = None;
                }
            }
        }
        for id in self.orphans.lock().drain(..) {
            // SAFETY: as above.
            unsafe { (self.api.free_batch_id)(eng.0, id) };
        }
        // SAFETY: the engine came from createTransferEngine; no call can use
        // it any more (the write lock is held and the slot is now empty).
        unsafe { (self.api.destroy_transfer_engine)(eng.0) };
        log::info!("Mooncake engine {} stopped", self.session_id);
    }
}

impl Drop for MooncakeBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine without Mooncake's library (or RDMA) is told the way to TCP
    /// next to `PDX_MOONCAKE_LIB`; other protocols are not.
    #[test]
    fn an_rdma_or_efa_load_failure_names_the_way_to_tcp() {
        use crate::config::env::MapEnv;
        for protocol in ["rdma", "efa", "ascend"] {
            let choice = TransportChoice {
                protocol: protocol.into(),
                hostname: "127.0.0.1".into(),
                device: String::new(),
                gpu_id: 0,
                rule: Default::default(),
                reason: format!("protocol '{protocol}' from the test"),
                warnings: Vec::new(),
            };
            let env = MapEnv::from_pairs(&[("PDX_MOONCAKE_LIB", "/nonexistent/libtransfer_engine.so")]);
            let e = MooncakeBackend::start_in(&choice, &env).err().unwrap();
            assert_eq!(e.kind(), crate::ErrorKind::BackendUnavailable);
            assert!(e.message().contains("set PDX_MOONCAKE_LIB to the path"), "{e}");
            let hint = "use TCP instead: pass protocol \"tcp\", or set MOONCAKE_PROTOCOL=tcp or MC_FORCE_TCP=1";
            assert_eq!(e.message().ends_with(hint), protocol != "ascend", "{e}");
        }
    }

    /// The poll schedule, step by step (no clock needed): a yield, then
    /// 20 µs doubling to `MAX_POLL_SLEEP`, where it stays.
    #[test]
    fn backoff_yields_then_doubles_to_the_cap() {
        let mut b = Backoff(0);
        let pauses: Vec<Option<Duration>> = (0..40).map(|_| b.next()).collect();
        assert_eq!(pauses[0], None);
        assert_eq!(pauses[1..7], [20, 40, 80, 160, 320, 640].map(|us| Some(Duration::from_micros(us))));
        assert!(pauses[7..].iter().all(|p| *p == Some(MAX_POLL_SLEEP)), "{pauses:?}");
        assert_eq!(b.0, 16, "the step stops growing");
    }
}
