//! One engine of Mooncake's C API over a pdx transfer backend: the state
//! Mooncake keeps above its transports (the transport installed, the
//! segments opened and their ids, the memory registered, the batches and
//! their task ids, the notifications not yet handed out), and the calls in
//! Rust terms. Everything that moves bytes or speaks the wire is pdx's
//! backend, reached through `pdx::transfer::TransferBackend` as pdx's own C
//! ABI reaches it.

use std::collections::{HashMap, VecDeque};
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_sys::Code;
use parking_lot::{Mutex, RwLock};
use pdx::config::engine_options::EngineOptions;
use pdx::config::env::{self, vars, ProcessEnv};
use pdx::transfer::location::Requested;
use pdx::transfer::{Direction, Notification, Request, TaskState, TransferBackend};
use pdx::ErrorKind;

use crate::batches::{group, Deferred, McBatch};
use crate::codes::{McError, McResult};
use crate::memory::Registered;
use crate::transport::{check_mooncake_library, discovered_protocol};
use crate::types::{SegmentId, TransferRequest, LOCAL_SEGMENT, OPCODE_READ, OPCODE_WRITE};

mod status;

/// A Mooncake batch, shared by the calls that name it. Status polls take
/// its read lock (they never wait on each other); submits and frees its
/// write lock. No transfer thread takes it.
type SharedBatch = Arc<RwLock<McBatch>>;

/// Most segments one engine keeps open.
const MAX_SEGMENTS: usize = 1 << 16;
/// Most batches one engine keeps allocated.
const MAX_BATCHES: usize = 1 << 16;
/// How long `destroyTransferEngine` waits for in-flight batches after
/// `enableGracefulShutdown`.
const GRACEFUL_WAIT: Duration = Duration::from_secs(30);
/// The handshake port of a segment name without one (Mooncake's default).
const DEFAULT_HANDSHAKE_PORT: u16 = 12001;

/// Batch ids are unique in the process (an id of one engine is unknown to
/// another), never 0 and never `INVALID_BATCH`.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);
/// Each transport installed in the process has its own number, so that a
/// pdx batch id is never taken for one of another transport (each backend
/// numbers its batches from 1).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// The transport an engine runs.
pub struct Installed {
    pub protocol: String,
    pub backend: Arc<dyn TransferBackend>,
    /// pdx's native engine (else Mooncake's own library behind pdx).
    pub native: bool,
    /// Which install this is (see [`NEXT_GENERATION`]).
    generation: u64,
}

#[derive(Default)]
struct Segments {
    by_name: HashMap<String, SegmentId>,
    by_id: HashMap<SegmentId, String>,
    next: SegmentId,
}

/// A request checked and converted, with the key of its pdx batch.
struct Entry {
    segment: SegmentId,
    direction: Direction,
    request: Request,
}

pub struct McEngine {
    metadata: String,
    host: String,
    rpc_port: u64,
    transport: RwLock<Option<Installed>>,
    segments: Mutex<Segments>,
    /// What this engine registered, to refuse unregistered local memory
    /// before anything starts (as Mooncake's transports do), and to serve
    /// it again on the next transport installed.
    regions: RwLock<Registered>,
    /// Lock order: a batch's lock before `transport` (a batch's pdx ids are
    /// read against the transport installed while its lock is held;
    /// `uninstall` settles every batch under its lock before another
    /// transport can be installed).
    batches: RwLock<HashMap<u64, SharedBatch>>,
    /// pdx batches (generation, id) whose Mooncake batch was freed while
    /// their notification was still on its way: freed once it is, on the
    /// transport that ran them (dropped with it).
    orphans: Mutex<Vec<(u64, u64)>>,
    /// Notifications drained from the backend, not yet handed to C.
    inbox: Mutex<VecDeque<Notification>>,
    /// Held for the whole of `installTransport` and `uninstallTransport`.
    reinstall: Mutex<()>,
    graceful: AtomicBool,
    /// `freeBatchID` of a batch in flight cancels it (else "batch busy",
    /// as Mooncake answers): `PDX_FREE_BATCH_IN_FLIGHT`.
    cancel_on_free: bool,
}

impl McEngine {
    /// An engine for `createTransferEngine`: with `auto_discover` it installs
    /// its transport now (see [`crate::transport::discovered_protocol`]).
    pub fn create(metadata: &str, local_server_name: &str, ip: &str, rpc_port: u64, auto: bool) -> McResult<McEngine> {
        let named = if local_server_name.trim().is_empty() { ip } else { local_server_name };
        let host = pdx::transfer::host::engine_host(named)?;
        let metadata = if metadata.trim().is_empty() { "P2PHANDSHAKE" } else { metadata.trim() };
        let cancel_on_free = env::read_choice(&ProcessEnv, &vars::PDX_FREE_BATCH_IN_FLIGHT)? != Some("busy");
        let e = McEngine {
            metadata: metadata.to_owned(),
            host,
            rpc_port,
            transport: RwLock::new(None),
            segments: Mutex::new(Segments { next: 1, ..Default::default() }),
            regions: RwLock::new(Registered::default()),
            batches: RwLock::new(HashMap::new()),
            orphans: Mutex::new(Vec::new()),
            inbox: Mutex::new(VecDeque::new()),
            reinstall: Mutex::new(()),
            graceful: AtomicBool::new(false),
            cancel_on_free,
        };
        if auto {
            e.install(&discovered_protocol(&ProcessEnv))?;
        }
        Ok(e)
    }

    /// The installed transport's backend, or why there is none.
    fn backend(&self) -> McResult<Arc<dyn TransferBackend>> {
        self.installed().map(|(b, _)| b)
    }

    /// The installed transport's backend and whether it is pdx's native engine.
    fn installed(&self) -> McResult<(Arc<dyn TransferBackend>, bool)> {
        self.generation().map(|(b, native, _)| (b, native))
    }

    /// The installed transport's backend, whether it is native, and its generation.
    fn generation(&self) -> McResult<(Arc<dyn TransferBackend>, bool, u64)> {
        match &*self.transport.read() {
            Some(t) => Ok((t.backend.clone(), t.native, t.generation)),
            None => Err(no_transport()),
        }
    }

    /// `installTransport`: `tcp` is pdx's native engine; another protocol
    /// runs on Mooncake's own library, which must be named by path
    /// (`PDX_MOONCAKE_LIB`), since its file name is this library's. One
    /// transport per engine; installing the installed one again is a no-op.
    /// The memory this engine registered is registered with the new
    /// transport too (all of it, or the install fails).
    pub fn install(&self, protocol: &str) -> McResult<()> {
        let _reinstall = self.reinstall.lock();
        let protocol = protocol.trim();
        let mut slot = self.transport.write();
        if let Some(t) = &*slot {
            if t.protocol == protocol {
                return Ok(());
            }
            return Err(McError::new(
                Code::NotSupportedTransport,
                format!(
                    "this engine already runs {:?}; pdx serves one transport per engine (uninstallTransport it first)",
                    t.protocol
                ),
            ));
        }
        let mut options = EngineOptions::new();
        options.set("metadata_server", Some(&self.metadata))?;
        let base = ProcessEnv;
        let choice = pdx::backend::choose(&base, &self.host, Some(protocol), None, &options)?;
        let serving = pdx::backend::serving(
            &choice.protocol,
            &pdx::config::engine_options::OptionsEnv { base: &base, options: &options },
        )?;
        let native = serving.engine == "native";
        if !native {
            check_mooncake_library(&choice.protocol)?;
        }
        let (backend, choice) = pdx::backend::start_with(&self.host, Some(protocol), None, &options)?;
        if let Err(e) = self.regions.write().carry_to(&*backend) {
            backend.stop();
            return Err(e);
        }
        log::info!(
            "{} serves Mooncake's C API over {} ({})",
            backend.session_id(),
            backend.protocol(),
            if native { "pdx's native engine" } else { "Mooncake's library" }
        );
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        *slot = Some(Installed { protocol: choice.protocol, backend: Arc::from(backend), native, generation });
        Ok(())
    }

    /// `uninstallTransport`: stop the transport named `protocol`. Its
    /// batches' tasks keep the states they had when it stopped (a task in
    /// flight then is failed); the memory registered stays registered, to
    /// be served by the next transport installed.
    pub fn uninstall(&self, protocol: &str) -> McResult<()> {
        let _reinstall = self.reinstall.lock();
        let gone = {
            let mut slot = self.transport.write();
            match &*slot {
                Some(t) if t.protocol == protocol.trim() => slot.take(),
                Some(t) => {
                    return Err(McError::invalid(format!(
                        "{protocol:?} is not installed (this engine runs {:?})",
                        t.protocol
                    )))
                }
                None => return Err(McError::invalid(format!("{protocol:?} is not installed (no transport is)"))),
            }
        };
        let Some(gone) = gone else { return Ok(()) };
        gone.backend.stop();
        self.settle_batches(&*gone.backend);
        self.orphans.lock().retain(|(generation, _)| *generation != gone.generation);
        Ok(())
    }

    /// Keep the state of every task the stopped `backend` ran in its
    /// Mooncake batch (see [`McBatch::settle`]).
    fn settle_batches(&self, backend: &dyn TransferBackend) {
        let batches: Vec<SharedBatch> = self.batches.read().values().cloned().collect();
        for b in batches {
            b.write().settle(|id, index| match backend.task_summary(id, index) {
                Ok(t) => (t.state, t.bytes, t.error.map(|e| e.message().to_owned())),
                Err(e) => (TaskState::Failed, 0, Some(format!("its transport was uninstalled: {}", e.message()))),
            });
        }
    }

    /// `getLocalIpAndPort`: `host:rpc_port`, the name peers open this
    /// engine's segment by.
    pub fn local_name(&self) -> String {
        match &*self.transport.read() {
            Some(t) => t.backend.session_id().to_owned(),
            None => format!("{}:{}", self.host, self.rpc_port),
        }
    }

    pub fn protocol(&self) -> Option<String> {
        self.transport.read().as_ref().map(|t| t.protocol.clone())
    }

    // ------------------------------------------------------------ segments

    /// Reach `name` once: fetch its descriptor (the native engine), or open
    /// it in Mooncake's engine.
    fn reach(&self, name: &str) -> McResult<()> {
        let (backend, native) = self.installed()?;
        let reached = if native { backend.first_buffer_address(name).map(drop) } else { backend.probe(name) };
        reached.map_err(|e| {
            let mut err = McError::from(e.clone());
            if e.kind() == ErrorKind::PeerUnreachable && !resolves(name) {
                err.code = Code::Dns;
            }
            err.message = format!("cannot open segment {name:?}: {}", e.message());
            err
        })
    }

    /// `openSegment` (`refresh`: `openSegmentNoCache`): the segment's id,
    /// the same for the same name as long as it is open; 0 for this
    /// engine's own name.
    pub fn open_segment(&self, name: &str, refresh: bool) -> McResult<SegmentId> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(McError::invalid("segment name is empty"));
        }
        if name == self.local_name() {
            return Ok(LOCAL_SEGMENT);
        }
        if !refresh {
            if let Some(id) = self.segments.lock().by_name.get(name) {
                return Ok(*id);
            }
        }
        // The handshake runs unlocked; a concurrent open of the same name
        // takes the id the first one to finish assigned.
        self.reach(name)?;
        let mut s = self.segments.lock();
        if let Some(id) = s.by_name.get(name) {
            return Ok(*id);
        }
        if s.by_name.len() >= MAX_SEGMENTS {
            return Err(McError::new(
                Code::TooManyRequests,
                format!("{MAX_SEGMENTS} segments are open: close some (closeSegment)"),
            ));
        }
        let id = s.next;
        s.next = s.next.checked_add(1).ok_or_else(|| McError::new(Code::TooManyRequests, "segment ids exhausted"))?;
        s.by_name.insert(name.to_owned(), id);
        s.by_id.insert(id, name.to_owned());
        Ok(id)
    }

    /// The session name behind an open segment id (0: this engine).
    fn session_of(&self, id: SegmentId) -> Option<String> {
        if id == LOCAL_SEGMENT {
            return Some(self.local_name());
        }
        self.segments.lock().by_id.get(&id).cloned()
    }

    pub fn close_segment(&self, id: SegmentId) -> McResult<()> {
        if id == LOCAL_SEGMENT {
            return Ok(());
        }
        let mut s = self.segments.lock();
        let name = s.by_id.remove(&id).ok_or_else(|| McError::invalid(format!("segment {id} is not open")))?;
        s.by_name.remove(&name);
        Ok(())
    }

    /// `syncSegmentCache`: reach every open segment again; the first
    /// failure is the result (the others are still tried and logged).
    pub fn sync_segments(&self) -> McResult<()> {
        let names: Vec<String> = self.segments.lock().by_name.keys().cloned().collect();
        let mut first = None;
        for name in names {
            if let Err(e) = self.reach(&name) {
                log::warn!("syncSegmentCache: {}", e.message);
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    // -------------------------------------------------------------- memory

    /// `registerLocalMemory(Batch)`: all or none (see [`Registered`]).
    pub fn register(&self, regions: &[(u64, u64)], location: &str) -> McResult<()> {
        for &(addr, len) in regions {
            if addr == 0 {
                return Err(McError::invalid("cannot register memory at address NULL"));
            }
            if len == 0 {
                return Err(McError::invalid(format!("cannot register zero bytes at {addr:#x}")));
            }
        }
        let at = Requested::parse(location)?;
        let backend = self.backend()?;
        self.regions.write().register(&*backend, regions, at)
    }

    /// `unregisterLocalMemory(Batch)`: all or none; an address that starts
    /// no registered region is "address not registered". Between
    /// `uninstallTransport` and the next install it only forgets the region.
    pub fn unregister(&self, addrs: &[u64]) -> McResult<()> {
        let backend = self.transport.read().as_ref().map(|t| t.backend.clone());
        self.regions.write().unregister(backend.as_deref(), addrs)
    }

    // ------------------------------------------------------------- batches

    /// `allocateBatchID`.
    pub fn allocate_batch(&self, capacity: usize) -> McResult<u64> {
        let max = self.transport.read().as_ref().map_or(1 << 20, |t| t.backend.max_batch_entries());
        if capacity > max {
            return Err(McError::invalid(format!("a batch of {capacity} entries is over the limit of {max}")));
        }
        self.reap_orphans();
        let mut batches = self.batches.write();
        if batches.len() >= MAX_BATCHES {
            return Err(McError::new(
                Code::TooManyRequests,
                format!("{MAX_BATCHES} batches are allocated: free finished ones (freeBatchID)"),
            ));
        }
        let id = NEXT_BATCH.fetch_add(1, Ordering::Relaxed);
        batches.insert(id, Arc::new(RwLock::new(McBatch::new(capacity))));
        Ok(id)
    }

    fn batch(&self, id: u64) -> McResult<SharedBatch> {
        self.batches.read().get(&id).cloned().ok_or_else(|| {
            McError::invalid(format!("batch {id:#x} is not a batch of this engine (never allocated, or freed)"))
        })
    }

    /// Check every entry before anything starts.
    fn check_entries(&self, reqs: &[TransferRequest]) -> McResult<Vec<Entry>> {
        let regions = self.regions.read();
        let mut out = Vec::with_capacity(reqs.len());
        let mut known: Option<SegmentId> = None;
        for (i, r) in reqs.iter().enumerate() {
            let direction = match r.opcode {
                OPCODE_READ => Direction::Read,
                OPCODE_WRITE => Direction::Write,
                op => {
                    return Err(McError::invalid(format!("entry {i}: opcode {op} is neither READ (0) nor WRITE (1)")))
                }
            };
            if known != Some(r.target_id) {
                if r.target_id != LOCAL_SEGMENT && !self.segments.lock().by_id.contains_key(&r.target_id) {
                    return Err(McError::invalid(format!(
                        "entry {i}: segment {} is not open (openSegment it first)",
                        r.target_id
                    )));
                }
                known = Some(r.target_id);
            }
            let len = usize::try_from(r.length)
                .map_err(|_| McError::invalid(format!("entry {i}: length {} is too large", r.length)))?;
            let local = r.source as usize;
            if len > 0 {
                if local == 0 {
                    return Err(McError::invalid(format!("entry {i}: source is NULL")));
                }
                if !regions.contains(local as u64, len as u64) {
                    return Err(McError::new(
                        Code::AddressNotRegistered,
                        format!(
                            "entry {i}: local range {local:#x}+{len} is not inside one registered region \
                             (registerLocalMemory it first)"
                        ),
                    ));
                }
            }
            out.push(Entry {
                segment: r.target_id,
                direction,
                request: Request { local, remote: r.target_offset, len },
            });
        }
        pdx::transfer::Request::validate_all(&out.iter().map(|e| e.request).collect::<Vec<_>>())?;
        Ok(out)
    }

    /// `submitTransfer` / `submitTransferWithNotify` (`notify`: its name and
    /// message). A notification the transport could never send (over the
    /// peer's frame limit) is refused before anything starts.
    ///
    /// # Safety
    /// The local memory of every entry stays valid until its task is finished.
    pub unsafe fn submit(&self, batch: u64, reqs: &[TransferRequest], notify: Option<Notification>) -> McResult<()> {
        let b = self.batch(batch)?;
        if notify.is_some() && reqs.is_empty() {
            return Err(McError::invalid("entries must not be empty when a notification rides on them"));
        }
        let entries = self.check_entries(reqs)?;
        let mut b = b.write();
        // Taken under the batch's lock: the pdx ids it records are this
        // transport's (see `batches`).
        let backend = self.backend()?;
        if let Some(note) = &notify {
            backend.check_notification(note)?;
        }
        if entries.len() > b.room() {
            return Err(McError::new(
                Code::TooManyRequests,
                format!("{} entries do not fit: the batch has room for {} more", entries.len(), b.room()),
            ));
        }
        if entries.is_empty() {
            return Ok(());
        }
        let groups = group(entries.iter().map(|e| (e.segment, e.direction)));
        // One pdx batch that is all of this Mooncake batch carries the
        // notification itself (sent once every byte landed); otherwise this
        // layer sends it when every task has completed, as Mooncake does.
        let mut ride = None;
        if let Some(note) = notify {
            if b.is_empty() && groups.len() == 1 {
                ride = Some(note);
            } else {
                let session = self
                    .session_of(entries[0].segment)
                    .ok_or_else(|| McError::invalid(format!("segment {} is not open", entries[0].segment)))?;
                b.deferred = Some(Deferred { session, note });
            }
        }
        let base = b.open_submit(entries.len());
        for ((segment, direction), positions) in groups {
            let session = self
                .session_of(segment)
                .ok_or_else(|| McError::invalid(format!("segment {segment} was closed during the submit")))?;
            let reqs: Vec<Request> = positions.iter().map(|p| entries[*p].request).collect();
            // SAFETY: the caller keeps the local memory valid until the tasks finish.
            let id = unsafe { backend.submit(&session, direction, reqs, ride.take()) }
                .map_err(|e| McError::from(e.clone()).with_context(format!("submit to {session}")))?;
            b.started(base, id, &positions);
        }
        Ok(())
    }

    /// `freeBatchID`. A batch with tasks in flight has them cancelled
    /// first: once pdx's cancel returns, nothing reads or writes their
    /// local memory any more, and the batch is freed. That is what NIXL's
    /// `releaseReqH` needs (it frees a batch in flight, ignores the result
    /// and hands the memory to the next request). Mooncake answers "batch
    /// busy" and keeps the batch; so does this engine with
    /// `PDX_FREE_BATCH_IN_FLIGHT=busy`, and on a transport that cannot
    /// cancel (Mooncake's own library). The pdx batches it frees are the
    /// installed transport's only: a batch whose transport was uninstalled
    /// kept its states and frees nothing else.
    pub fn free_batch(&self, batch: u64) -> McResult<()> {
        let b = self.batch(batch)?;
        // Read under the batch's lock: `uninstall` settles (and empties) a
        // batch under it, so pdx batches seen here belong to this backend.
        let running = {
            let g = b.read();
            if g.subs().is_empty() {
                None
            } else {
                Some((self.backend()?, g.subs().to_vec()))
            }
        };
        if let Some((backend, subs)) = running {
            let in_flight: Vec<u64> =
                subs.into_iter().filter(|id| backend.batch_summary(*id).is_ok_and(|s| s.in_flight() > 0)).collect();
            if !in_flight.is_empty() && !self.cancel_on_free {
                return Err(McError::new(
                    Code::BatchBusy,
                    format!(
                        "batch {batch:#x} cannot be freed until all its tasks are done \
                         (PDX_FREE_BATCH_IN_FLIGHT=busy; unset, it would cancel them)"
                    ),
                ));
            }
            for id in in_flight {
                backend.cancel(id, None).map_err(|e| {
                    McError::new(
                        Code::BatchBusy,
                        format!("batch {batch:#x} has tasks in flight and cancelling them failed: {}", e.message()),
                    )
                })?;
            }
        }
        self.send_deferred(&b);
        if self.batches.write().remove(&batch).is_none() {
            return Err(McError::invalid(format!("batch {batch:#x} was freed by another thread")));
        }
        let g = b.read();
        if g.subs().is_empty() {
            return Ok(());
        }
        // Uninstalled meanwhile: the pdx batches went with their engine.
        let Ok((backend, _, generation)) = self.generation() else { return Ok(()) };
        let mut orphans = self.orphans.lock();
        for id in g.subs() {
            if let Err(e) = backend.batch_free(*id) {
                if e.kind() == ErrorKind::Busy {
                    orphans.push((generation, *id));
                }
            }
        }
        Ok(())
    }

    /// Free the pdx batches whose notification has gone out since (those of
    /// an uninstalled transport are forgotten).
    fn reap_orphans(&self) {
        let Ok((backend, _, generation)) = self.generation() else { return };
        self.orphans
            .lock()
            .retain(|&(g, id)| g == generation && backend.batch_free(id).is_err_and(|e| e.kind() == ErrorKind::Busy));
    }

    // ------------------------------------------------------- notifications

    /// Every notification received so far, oldest first, out of the backend
    /// and into this engine's inbox; `take` hands them over (`put_back`
    /// returns them when they could not be delivered).
    pub fn take_notifications(&self) -> McResult<VecDeque<Notification>> {
        let backend = self.backend()?;
        let mut inbox = self.inbox.lock();
        inbox.extend(backend.drain_notifications());
        Ok(std::mem::take(&mut *inbox))
    }

    pub fn put_back(&self, mut notes: VecDeque<Notification>) {
        let mut inbox = self.inbox.lock();
        notes.append(&mut inbox);
        *inbox = notes;
    }

    /// `genNotifyInEngine`: a notification with no transfer.
    pub fn notify(&self, segment: u64, note: &Notification) -> McResult<()> {
        let backend = self.backend()?;
        let session = i32::try_from(segment).ok().and_then(|id| self.session_of(id)).ok_or_else(|| {
            McError::new(Code::Metadata, format!("segment {segment} is not open (openSegment it first)"))
        })?;
        backend.notify(&session, note).map_err(|e| McError::from(e.clone()).with_context(format!("notify {session}")))
    }

    // ---------------------------------------------------------- reporting

    /// `getNicLoadStats`: the rails of multi-rail TCP, if any (name, bytes
    /// confirmed); none otherwise, as Mooncake's TCP transport has none.
    pub fn nic_rails(&self) -> McResult<Vec<(String, u64)>> {
        let backend = self.backend()?;
        Ok(backend.metrics().rails.into_iter().filter(|r| r.1).map(|r| (r.0, r.2)).collect())
    }

    /// `showLinks`: this engine, its transport, and every open segment with
    /// what pdx knows of the peer.
    pub fn links(&self, json: bool) -> McResult<String> {
        let backend = self.backend()?;
        let mut segments: Vec<(SegmentId, String)> =
            self.segments.lock().by_id.iter().map(|(id, name)| (*id, name.clone())).collect();
        segments.sort();
        let peers: Vec<serde_json::Value> = segments
            .iter()
            .map(|(id, name)| {
                let info = backend.peer_info(name).unwrap_or(serde_json::Value::Null);
                serde_json::json!({"segment_id": id, "name": name, "peer": info})
            })
            .collect();
        if json {
            let v = serde_json::json!({
                "local": backend.session_id(),
                "protocol": backend.protocol(),
                "segments": peers,
            });
            return Ok(v.to_string());
        }
        let mut text = format!("{} over {}\n", backend.session_id(), backend.protocol());
        for p in &peers {
            text.push_str(&format!(
                "segment {} {}: {}\n",
                p["segment_id"],
                p["name"].as_str().unwrap_or(""),
                p["peer"]
            ));
        }
        Ok(text)
    }

    pub fn enable_graceful_shutdown(&self) {
        self.graceful.store(true, Ordering::Relaxed);
    }

    /// `destroyTransferEngine`: after `enableGracefulShutdown`, in-flight
    /// batches finish first (30 s at most); then the transport stops.
    pub fn shutdown(&self) {
        let _reinstall = self.reinstall.lock();
        let Some(t) = self.transport.write().take() else { return };
        if self.graceful.load(Ordering::Relaxed) {
            let deadline = Instant::now() + GRACEFUL_WAIT;
            let batches: Vec<SharedBatch> = self.batches.read().values().cloned().collect();
            for b in batches {
                let subs = b.read().subs().to_vec();
                for id in subs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if let Err(e) = t.backend.batch_wait(id, left) {
                        log::warn!("destroyTransferEngine: {}", e.message());
                    }
                }
            }
        }
        t.backend.stop();
    }
}

/// What a call that needs a transport answers when none is installed.
fn no_transport() -> McError {
    McError::new(
        Code::NotSupportedTransport,
        "no transport is installed: create the engine with auto_discover or call installTransport(engine, \"tcp\", \
         NULL) first",
    )
}

impl McError {
    fn with_context(mut self, what: impl std::fmt::Display) -> McError {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

/// Whether a segment name's host resolves (telling "no such host" from
/// "not reachable", as Mooncake's DNS and socket errors do).
fn resolves(name: &str) -> bool {
    match pdx::transfer::host::parse_session(name, DEFAULT_HANDSHAKE_PORT) {
        Ok(a) => (a.host.as_str(), a.port).to_socket_addrs().is_ok_and(|mut it| it.next().is_some()),
        Err(_) => false,
    }
}
