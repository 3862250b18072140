//! The native TCP transfer engine, wire-compatible with Mooncake's TCP
//! transport (pure Rust, no C types); peers are found through the
//! [`directory`] (P2P handshake, Mooncake's HTTP metadata server, etcd).
//!
//! An [`Engine`] serves two listeners (handshake and data, see [`server`]),
//! keeps the memory peers may touch ([`memory`]), and initiates transfers
//! to peers by session name ([`initiator`]).
//! "Completed" always means confirmed at the target: v2 acknowledgements, or
//! for v1 peers a fence read after the writes.
//!
//! Its files are grouped by role, one folder each: `initiator` (who starts
//! a transfer), `server` (who serves one), `protocol` (what travels on
//! the wire), `net` (sockets, deadlines, rails), `memory` (how bytes
//! reach memory), `samehost` (the same-host link) and `directory` (where
//! peers are found). Beside them: the `settings`, the `registry` of
//! threads and sockets, and the figures for operators (`observe`). Each
//! folder's `mod.rs` says which other roles it may use; this file reaches
//! into a folder only through what its `mod.rs` re-exports.

// cbindgen reads modules in the order they are declared: `server` (its
// `MIN_SECRET_BYTES`) comes before `memory` (the staging sizes), the order
// those constants have in include/pdx.h.
mod server;

pub(crate) mod directory;
mod initiator;
mod memory;
mod net;
mod observe;
mod protocol;
mod registry;
mod samehost;
pub mod settings;

pub use memory::cuda;
// The codecs are public only for the fuzz targets (feature `fuzzing`); the
// engine's API is `Engine` and `Settings`.
#[cfg(feature = "fuzzing")]
pub use protocol::{descriptor, notify, wire};

#[cfg(test)]
mod auth_tests;
#[cfg(test)]
mod burst_tests;
#[cfg(test)]
mod cancel_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod hardening_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod rails_tests;
#[cfg(test)]
mod samehost_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod traffic_tests;

use std::net::{IpAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::ids::IdTable;
use crate::transfer::host::engine_host;
use crate::transfer::location::Requested;
use crate::transfer::stats::{Stats, StatsSnapshot};
use crate::transfer::{state, BatchSummary, Direction, Notification, Request, TaskState, TaskSummary, TransferBackend};
use initiator::{BatchRun, Dialer, Peers, Prepared, Workers};
use memory::{Regions, Staging};
use protocol::{FrameType, Identity};
use registry::Registry;
use server::{Access, Budget, Notifications, Plane, Serving};
use settings::Settings;

/// State shared by the engine's threads. Its fields are private to the
/// engine's modules; only the executor (`batch`) takes it whole, the others
/// get the parts they use (the server a [`server::Serving`], the figures an
/// [`observe::Sources`]).
pub(crate) struct Inner {
    settings: Settings,
    identity: Identity,
    registry: Arc<Registry>,
    regions: Arc<Regions>,
    notifications: Arc<Notifications>,
    peers: Peers,
    workers: Arc<Workers>,
    /// Caps on inbound connections and handshake bytes (see [`Budget`]).
    budget: Arc<Budget>,
    batches: IdTable<BatchRun>,
    stats: Arc<Stats>,
    /// Pinned buffers and streams for device memory (allocated on first use).
    staging: Arc<Staging>,
    /// Who may connect (allowlist, shared secret).
    access: Arc<Access>,
}

impl Inner {
    /// The parts of the state the engine's figures are read from.
    fn figures(&self) -> observe::Sources<'_> {
        observe::Sources {
            stats: &self.stats,
            peers: &self.peers,
            notifications: &self.notifications,
            per_peer: self.settings.metrics_per_peer,
        }
    }
}

/// A running engine. Dropping it (or calling [`Engine::stop`]) stops the
/// listeners, fails what is in flight and joins every thread it started.
pub struct Engine {
    inner: Arc<Inner>,
    listeners: Mutex<Vec<TcpListener>>,
}

fn bind_ip(hostname: &str, settings: &Settings) -> Result<IpAddr> {
    if let Some(addr) = &settings.bind_address {
        return addr
            .parse::<IpAddr>()
            .map_err(|_| Error::invalid_argument(format!("PDX_BIND_ADDRESS={addr:?} is not an IP address")));
    }
    (hostname, 0)
        .to_socket_addrs()
        .map_err(|e| Error::invalid_argument(format!("cannot resolve hostname {hostname:?}: {e}")))?
        .map(|a| a.ip())
        .next()
        .ok_or_else(|| Error::invalid_argument(format!("hostname {hostname:?} resolves to no address")))
}

/// The connection budget for `settings` and this process's descriptor
/// limit: a quarter of `RLIMIT_NOFILE` for inbound connections, a quarter
/// of that (at most `PDX_MAX_HANDSHAKE_CONNECTIONS`) for handshakes.
fn budget_for(settings: &Settings) -> Budget {
    let total = server::total_for(server::fd_limit());
    let handshakes = settings.max_handshake_connections.min((total / 4).max(4));
    let data = settings.max_data_connections.min(total);
    let bytes = settings.handshake_max_len.saturating_mul(4);
    Budget::new(total, handshakes, data, settings.max_connections_per_address, bytes)
}

/// The directory `settings` name (P2P handshake unless a metadata server is set).
fn open_directory(settings: &Settings) -> Result<Arc<dyn directory::Directory>> {
    let mode = directory::Mode::parse(settings.metadata_server.as_deref().unwrap_or(""))?;
    let keys = directory::Keys::new(settings.metadata_cluster_id.as_deref())?;
    let limits = directory::Limits {
        timeout: settings.metadata_timeout,
        max_value: settings.handshake_max_len,
        lease_ttl: settings.metadata_lease_ttl,
    };
    Ok(Arc::from(directory::open(&mode, keys, limits)?))
}

/// What a probe's outcome says of a name's holder: any answer (a refusal
/// by authentication or a malformed reply included) is an engine alive;
/// a refused connection is nothing listening; anything else is silence.
fn liveness(outcome: Result<Vec<u8>>) -> directory::Liveness {
    let Err(e) = outcome else { return directory::Liveness::Answers };
    let text = e.message().to_ascii_lowercase();
    match e.kind() {
        ErrorKind::Timeout => directory::Liveness::Silent,
        _ if text.contains("authentication") => directory::Liveness::Answers,
        ErrorKind::Protocol => directory::Liveness::Answers,
        ErrorKind::PeerUnreachable if text.contains("connection refused") => directory::Liveness::Gone,
        _ => directory::Liveness::Silent,
    }
}

impl Engine {
    /// Start an engine on `hostname` (a name or IP literal; any `:port` is
    /// ignored as Mooncake does in P2P mode) with settings from the
    /// environment.
    pub fn start(hostname: &str) -> Result<Engine> {
        Self::start_with(hostname, Settings::from_env())
    }

    /// Start with explicit settings.
    pub fn start_with(hostname: &str, settings: Settings) -> Result<Engine> {
        let host = engine_host(hostname)?;
        let access = Access::from_settings(&settings)?;
        let ip = bind_ip(&host, &settings)?;
        let mut rails = net::discover_rails(settings.tcp_rails.as_deref())?;
        // The data port listens on one family (the host's): rails of the
        // other could not be reached there.
        let (kept, other): (Vec<_>, Vec<_>) = rails.into_iter().partition(|r| r.addr.is_ipv4() == ip.is_ipv4());
        if !other.is_empty() {
            let names: Vec<String> = other.iter().map(|r| format!("{} ({})", r.addr, r.name)).collect();
            log::info!("PDX_TCP_RAILS: not the host address's family, so not rails: {}", names.join(", "));
        }
        rails = kept;
        let rpc = server::bind_in_range(ip, settings.min_port, settings.max_port)?;
        // With rails, data arrives on every rail's address: the data port
        // listens on all of them (the allowlist still applies).
        let data_ip = match (rails.is_empty(), ip) {
            (true, ip) => ip,
            (false, IpAddr::V4(_)) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            (false, IpAddr::V6(_)) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        let data = server::bind_in_range(data_ip, settings.min_data_port, settings.max_data_port)?;
        let port_of = |l: &TcpListener| l.local_addr().map(|a| a.port()).map_err(|e| Error::io(e.to_string()));
        let (rpc_port, data_port) = (port_of(&rpc)?, port_of(&data)?);
        let directory = open_directory(&settings)?;
        // Through a store, the segment is named as given (any port in it is
        // only part of the name); in P2P mode it is `host:rpc_port`.
        let session_id = match directory.is_p2p() {
            true => crate::config::net::session_id(&host, rpc_port),
            false => hostname.trim().to_owned(),
        };
        let identity =
            Identity { session_id, data_host: host, rpc_port, data_port, instance: protocol::new_instance(), rails };
        let workers = Arc::new(Workers::default());
        let (registry, regions) = (Arc::new(Registry::default()), Arc::new(Regions::default()));
        let secret = access.secret.clone();
        let staging = Arc::new(Staging::new(settings.staging_bytes, settings.lane_wait_timeout));
        let memory = (regions.clone(), staging.clone());
        let dialer = Dialer::new(settings.clone(), registry.clone(), memory, identity.clone(), secret, directory);
        let inner = Arc::new(Inner {
            notifications: Arc::new(Notifications::new(settings.max_queued_notifications, settings.notify_queue_bytes)),
            identity,
            registry,
            regions,
            peers: Peers::new(Arc::new(dialer)),
            workers: workers.clone(),
            budget: Arc::new(budget_for(&settings)),
            batches: IdTable::new("batch id", 0),
            stats: Arc::default(),
            staging,
            access: Arc::new(access),
            settings,
        });
        let clone = |l: &TcpListener| l.try_clone().map_err(|e| Error::io(format!("listener: {e}")));
        let engine = Engine { listeners: Mutex::new(vec![clone(&rpc)?, clone(&data)?]), inner: inner.clone() };
        // From here on, `engine` dropping on error stops what was started.
        workers
            .start(&inner.registry, inner.settings.workers, inner.settings.lanes_per_peer)
            .map_err(|e| Error::io(format!("cannot start worker threads: {e}")))?;
        let serving = Arc::new(Serving::of(&inner));
        for (listener, plane, name) in
            [(rpc, Plane::Handshake, "pdx-rpc-accept"), (data, Plane::Data, "pdx-data-accept")]
        {
            let serving = serving.clone();
            inner
                .registry
                .spawn(name.to_owned(), move || server::accept_loop(serving, listener, plane))
                .map_err(|e| Error::io(format!("cannot start listener thread: {e}")))?;
        }
        let inner2 = inner.clone();
        inner
            .registry
            .spawn("pdx-peer-sweep".to_owned(), move || inner2.peers.sweep_until_stopped())
            .map_err(|e| Error::io(format!("cannot start the peer sweeper: {e}")))?;
        if !inner.settings.metrics_interval.is_zero() {
            let (inner2, every) = (inner.clone(), inner.settings.metrics_interval);
            let log = move || {
                let session = &inner2.identity.session_id;
                observe::log_periodically(&inner2.figures(), &inner2.registry, session, every)
            };
            inner
                .registry
                .spawn("pdx-metrics-log".to_owned(), log)
                .map_err(|e| Error::io(format!("cannot start the metrics line's thread: {e}")))?;
        }
        engine.publish_in_directory()?;
        let (total, handshakes, data, per_ip) = inner.budget.caps();
        log::info!(
            "pdx tcp engine {} up (data port {data_port}; inbound connections: {total} in all, {handshakes} handshake, \
             {data} data, {per_ip} per address)",
            inner.identity.session_id
        );
        Ok(engine)
    }

    pub fn data_port(&self) -> u16 {
        self.inner.identity.data_port
    }

    /// Take this engine's segment name in the directory and publish its
    /// descriptor and rpc address (nothing in P2P mode); then keep them
    /// alive on a thread of their own where the store has leases.
    fn publish_in_directory(&self) -> Result<()> {
        let inner = &self.inner;
        let dialer = inner.peers.dialer();
        let directory = dialer.directory.clone();
        if directory.is_p2p() {
            return Ok(());
        }
        let id = &inner.identity;
        let own = directory::RpcMeta { ip_or_host_name: id.data_host.clone(), rpc_port: id.rpc_port };
        let own_addr = own.address();
        // The holder of the name answers a probe; this engine (already
        // listening, perhaps at the dead holder's address) does not count.
        let probe = |addr: &crate::transfer::host::SessionAddr, by: Option<Instant>| {
            if *addr == own_addr {
                return directory::Liveness::Gone;
            }
            liveness(dialer.exchange_by(addr, FrameType::Probe, b"{}", by))
        };
        directory
            .claim(&id.session_id, &dialer.own_descriptor(), &own, &probe)
            .map_err(|e| e.context(format!("cannot publish segment {} in {}", id.session_id, directory.describe())))?;
        let Some(first) = directory.upkeep_every() else {
            return Ok(());
        };
        // One thread per engine keeps its lease alive and puts again what a
        // failed publish left behind.
        let inner2 = inner.clone();
        let keep = move || {
            let mut every = first;
            while !inner2.peers.wait_unless_stopping(every) {
                every = directory.upkeep();
            }
        };
        inner
            .registry
            .spawn("pdx-metadata-keeper".to_owned(), keep)
            .map_err(|e| Error::io(format!("cannot start the metadata keeper's thread: {e}")))?;
        Ok(())
    }

    /// Publish the descriptor again after the registrations changed. A
    /// failure is logged and leaves the directory behind: the keeper thread
    /// puts the latest descriptor again until it lands (peers that read the
    /// older one meanwhile are refused what lies outside it).
    fn republish(&self) {
        let dialer = self.inner.peers.dialer();
        if dialer.directory.is_p2p() {
            return;
        }
        let name = &self.inner.identity.session_id;
        if let Err(e) = dialer.directory.republish(name, &dialer.own_descriptor()) {
            log::warn!("could not publish segment {name}'s new descriptor (retried in the background): {e}");
        }
    }

    /// Let peers read and write `[addr, addr+len)` (its location detected,
    /// see [`register_batch_at`](Self::register_batch_at)). Refuses zero
    /// lengths and overlaps with registered regions.
    pub fn register(&self, addr: u64, len: u64) -> Result<()> {
        self.register_batch(&[(addr, len)])
    }

    /// Where the registered region containing `addr` lives, if any.
    pub fn location_of(&self, addr: u64) -> Option<crate::transfer::location::Location> {
        self.inner.regions.lookup(addr, 1).map(|r| r.location)
    }

    /// Withdraw the region starting at `addr`; returns once no inbound
    /// request touches it.
    pub fn unregister(&self, addr: u64) -> Result<()> {
        self.unregister_batch(&[addr])
    }

    fn check_running(&self) -> Result<()> {
        if self.inner.registry.stopping() {
            return Err(Error::new(ErrorKind::Shutdown, "engine is shutting down"));
        }
        Ok(())
    }

    /// Check a batch once, refusing what cannot succeed before allocating
    /// for it (see [`initiator::prepare_batch`]); for a peer whose descriptor is cached, also
    /// a request longer than every region it advertised.
    fn prepare(&self, session: &str, reqs: Vec<Request>) -> Result<Prepared> {
        self.check_running()?;
        let prepared = initiator::prepare_batch(&self.inner.settings, &self.inner.regions, reqs)?;
        if let Some(peer) = self.inner.peers.cached(session) {
            let longest = prepared.reqs.iter().map(|r| r.len).max().unwrap_or(0);
            peer.check_fits(longest)?;
        }
        Ok(prepared)
    }

    /// The failure of a finished batch (`Ok` if all completed).
    pub fn batch_outcome(&self, id: u64) -> Result<()> {
        self.inner.batches.get(id)?.outcome()
    }

    /// The error of the batch's notification, if it was requested and failed
    /// (the transfers themselves still count as completed, as in Mooncake).
    pub fn batch_notify_error(&self, id: u64) -> Result<Option<Error>> {
        Ok(self.inner.batches.get(id)?.notify_error())
    }
}

impl TransferBackend for Engine {
    /// `host:rpc_port` (IPv6 bracketed): the name peers use for us.
    fn session_id(&self) -> &str {
        &self.inner.identity.session_id
    }

    fn rpc_port(&self) -> u16 {
        self.inner.identity.rpc_port
    }

    fn protocol(&self) -> &str {
        "tcp"
    }

    fn register_batch(&self, regions: &[(u64, u64)]) -> Result<()> {
        self.register_batch_at(regions, Requested::Detect)
    }

    /// Register several regions at `location`, all or none: `"*"` asks the
    /// CUDA driver (when one loads) whether each is device memory; a
    /// `cuda:N` region needs the driver and is refused at once (naming the
    /// region and the cause) if it or the driver call fails.
    fn register_batch_at(&self, regions: &[(u64, u64)], location: Requested) -> Result<()> {
        let classified = regions
            .iter()
            .map(|&(a, l)| cuda::classify(a, l, location).map(|c| (a, l, c)))
            .collect::<Result<Vec<_>>>()?;
        self.inner.regions.register_all_at(classified)?;
        self.republish();
        Ok(())
    }

    fn unregister_batch(&self, addrs: &[u64]) -> Result<()> {
        let drain = self.inner.settings.progress_timeout + Duration::from_secs(1);
        // Device regions' IPC handles are forgotten: memory allocated later
        // at the same address is another allocation.
        let device: Vec<(u64, u64)> = addrs
            .iter()
            .filter_map(|&a| self.inner.regions.lookup(a, 1).filter(|r| r.start == a && r.device.is_some()))
            .map(|r| (r.start, r.len))
            .collect();
        self.inner.regions.unregister_all(addrs, drain)?;
        let forgot = !device.is_empty();
        for (addr, len) in device {
            self.inner.peers.dialer().exports.forget(addr, len);
        }
        if forgot {
            // Peers close their mappings of it with the lanes that made them.
            self.inner.peers.retire_device_lanes();
        }
        self.republish();
        Ok(())
    }

    /// Move every request and return when each is confirmed at the target
    /// (or failed). Returns the first failure, with a count.
    unsafe fn transfer_sync(&self, session: &str, direction: Direction, reqs: Vec<Request>) -> Result<()> {
        let prepared = self.prepare(session, reqs)?;
        let run = BatchRun::new(&self.inner, session, direction, prepared, None, None);
        run.start(&self.inner, true);
        run.wait_until(None);
        run.outcome()
    }

    /// Start a batch and return its id (never 0). `notify` is sent to the
    /// peer after every request completed.
    unsafe fn submit(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<Notification>,
    ) -> Result<u64> {
        // SAFETY: forwarded from the caller.
        unsafe { self.submit_after(session, direction, reqs, notify, None) }
    }

    /// [`submit`](TransferBackend::submit), ordered after the CUDA event
    /// `after`: device copies wait for it on the device (their streams
    /// wait on the event), host memory on a worker (`cuEventSynchronize`)
    /// before its first window.
    unsafe fn submit_after(
        &self,
        session: &str,
        direction: Direction,
        reqs: Vec<Request>,
        notify: Option<Notification>,
        after: Option<usize>,
    ) -> Result<u64> {
        if after.is_some() {
            cuda::check_events_usable()?;
        }
        if let Some(note) = &notify {
            self.check_notification(note)?;
        }
        let prepared = self.prepare(session, reqs)?;
        let run = BatchRun::new(&self.inner, session, direction, prepared, notify, after);
        let id = self.inner.batches.insert(run.clone())?;
        run.start(&self.inner, false);
        Ok(id)
    }

    fn batch_notify_error(&self, id: u64) -> Result<Option<Error>> {
        Engine::batch_notify_error(self, id)
    }

    fn max_batch_entries(&self) -> usize {
        self.inner.settings.max_batch_entries
    }

    fn batch_summary(&self, id: u64) -> Result<BatchSummary> {
        Ok(self.inner.batches.get(id)?.summary())
    }

    fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary> {
        self.inner.batches.get(id)?.task(task)
    }

    fn task_state(&self, id: u64, task: usize) -> Result<(TaskState, u64)> {
        self.inner.batches.get(id)?.task_state(task)
    }

    fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary> {
        let run = self.inner.batches.get(id)?;
        let deadline = Instant::now().checked_add(timeout);
        if !run.wait_until(deadline) {
            return Err(run.summary().not_finished(id, timeout));
        }
        Ok(run.summary())
    }

    fn batch_free(&self, id: u64) -> Result<()> {
        self.inner
            .batches
            .remove_with(id, |run| if run.is_done() { Ok(()) } else { Err(state::still_in_flight(id)) })
            .map(drop)
    }

    /// Cancel in-flight tasks (see [`TransferBackend::cancel`] and
    /// `initiator::cancel`): every path stops touching their memory before
    /// this returns.
    fn cancel(&self, id: u64, task: Option<usize>) -> Result<usize> {
        self.inner.batches.get(id)?.cancel(&self.inner, task)
    }

    /// Ask the peer whether it is alive (a Probe exchange).
    fn probe(&self, session: &str) -> Result<()> {
        self.check_running()?;
        let addr = self.inner.peers.dialer().rpc_address(session)?;
        let reply = self.inner.peers.dialer().exchange_json(&addr, FrameType::Probe, b"{}")?;
        match reply.get("status").and_then(Value::as_str) {
            Some("success") => Ok(()),
            _ => Err(Error::protocol(format!("probe of {session} answered {reply}"))),
        }
    }

    /// Send a notification to the peer (to the `name` in its descriptor).
    fn notify(&self, session: &str, note: &Notification) -> Result<()> {
        self.check_running()?;
        self.check_notification(note)?;
        self.inner.peers.get(session)?.notify(note)
    }

    /// A notification's frame must fit the handshake frame limit, which
    /// this engine assumes its peers share (`MC_HANDSHAKE_MAX_LENGTH`).
    fn check_notification(&self, note: &Notification) -> Result<()> {
        Notification::check_size(note.name.len(), note.msg.len())?;
        protocol::notify::check_frame(note, self.inner.settings.handshake_max_len)
    }

    fn stats(&self) -> StatsSnapshot {
        observe::stats(&self.inner.figures())
    }

    fn metrics(&self) -> crate::transfer::metrics::MetricsSnapshot {
        observe::metrics(&self.inner.figures())
    }

    /// The first buffer `segment` advertises (its own when `segment` is this
    /// engine), read afresh from the directory: `Ok(0)` when it has none.
    fn first_buffer_address(&self, segment: &str) -> Result<u64> {
        self.check_running()?;
        if segment == self.inner.identity.session_id {
            return Ok(self.inner.regions.advertised().first().map_or(0, |b| b.addr));
        }
        let desc = self.inner.peers.dialer().fetch_descriptor(segment, None)?;
        Ok(desc.buffers.first().map_or(0, |b| b.addr))
    }

    /// A peer's figures; for this engine's own name, how its entry in the
    /// directory stands (`"directory"`).
    fn peer_info(&self, session: &str) -> Result<Value> {
        let figures = observe::peer_info(&self.inner.figures(), session);
        if session != self.inner.identity.session_id {
            return figures;
        }
        let mut info = figures.unwrap_or_else(|_| serde_json::json!({ "session": session }));
        if let Some(map) = info.as_object_mut() {
            map.insert("directory".to_owned(), observe::directory_info(self.inner.peers.dialer().directory.as_ref()));
        }
        Ok(info)
    }

    /// Take every notification received so far, oldest first.
    fn drain_notifications(&self) -> Vec<Notification> {
        self.inner.notifications.drain()
    }

    /// Stop listeners, fail in-flight work, join every thread. Idempotent.
    ///
    /// Called on one of the engine's own threads (a log callback that frees
    /// the engine), it cannot wait for that thread: everything is told to
    /// stop as usual, and a short-lived `pdx-reaper` thread joins the
    /// engine's threads, the caller's once it has returned out of pdx.
    fn stop(&self) {
        let listeners = std::mem::take(&mut *self.listeners.lock());
        if listeners.is_empty() {
            return;
        }
        // Out of the directory first, so that peers stop finding this engine.
        self.inner.peers.dialer().directory.withdraw(&self.inner.identity.session_id);
        self.inner.registry.begin_stop();
        self.inner.peers.wake_all();
        for l in &listeners {
            server::wake_listener(l);
        }
        self.inner.workers.close();
        let session = self.inner.identity.session_id.clone();
        if self.inner.registry.is_own_thread() {
            let (registry, name) = (self.inner.registry.clone(), session.clone());
            let reaper = std::thread::Builder::new().name("pdx-reaper".to_owned()).spawn(move || {
                registry.join_all();
                log::info!("pdx tcp engine {name} stopped");
            });
            match reaper {
                Ok(_) => return,
                // No thread to wait with: join the others here (this one
                // ends on its own once it leaves pdx).
                Err(e) => log::warn!("cannot start a thread to join the engine's threads ({e}); joining here"),
            }
            self.inner.registry.join_all();
            log::info!("pdx tcp engine {session} stopped (but for the thread that stopped it)");
            return;
        }
        self.inner.registry.join_all();
        log::info!("pdx tcp engine {session} stopped");
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}
