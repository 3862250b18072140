//! Where a peer's segment descriptor and handshake (rpc) address come from:
//! one seam, [`Directory`], with three implementations chosen by the
//! metadata string Mooncake takes:
//!
//! - `P2PHANDSHAKE` (or none): ask the peer itself on its handshake port
//!   ([`P2p`]);
//! - `http://host:port/path`: Mooncake's HTTP metadata server ([`http`]);
//! - `etcd://h:p[,h:p]` or a bare `h:p[,h:p]`: etcd's v3 API through its
//!   JSON gateway ([`etcd`]), the engine's keys under a lease it keeps alive.
//!
//! Both stores hold Mooncake's keys and values (see [`Keys`]), so pdx and
//! Mooncake engines find each other through the same server. Everything read
//! from a store is bounded in size and checked before use; nothing is cached
//! here (the peer cache above decides when to read again).

pub(crate) mod etcd;
pub(crate) mod http;

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::transfer::host::{parse_session, SessionAddr};

/// The metadata string meaning "ask each peer directly".
pub const P2P_HANDSHAKE: &str = "P2PHANDSHAKE";

/// Longest metadata string accepted.
const MAX_METADATA_LEN: usize = 4096;
/// Most etcd endpoints in one metadata string.
const MAX_ENDPOINTS: usize = 16;
/// Longest cluster id (`MC_METADATA_CLUSTER_ID`).
const MAX_CLUSTER_ID_LEN: usize = 128;
/// Longest host name accepted from an `rpc_meta` value.
const MAX_HOST_LEN: usize = 255;
/// Largest `rpc_meta` value read.
const MAX_RPC_META_LEN: usize = 4096;

/// A metadata string, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Ask each peer on its handshake port.
    P2p,
    /// Mooncake's HTTP metadata server at this URL (`http://…`).
    Http(String),
    /// etcd at these `host:port` endpoints, tried in order.
    Etcd(Vec<String>),
}

impl Mode {
    /// Parse Mooncake's metadata string: `P2PHANDSHAKE` (or empty),
    /// `http://…`, `etcd://h:p[,h:p]`, or a bare `h:p[,h:p]` (etcd, as
    /// Mooncake reads it). Anything else is refused, naming it.
    pub fn parse(text: &str) -> Result<Mode> {
        let bad = |why: &str| Error::invalid_argument(format!("metadata server {text:?}: {why}"));
        let t = text.trim();
        if t.len() > MAX_METADATA_LEN {
            return Err(Error::invalid_argument(format!(
                "metadata server string of {} bytes: longer than {MAX_METADATA_LEN}",
                t.len()
            )));
        }
        if t.is_empty() || t == P2P_HANDSHAKE {
            return Ok(Mode::P2p);
        }
        if let Some((scheme, rest)) = t.split_once("://") {
            return match scheme.to_ascii_lowercase().as_str() {
                "http" => http::check_url(t).map(|()| Mode::Http(t.to_owned())).map_err(|why| bad(&why)),
                "https" => Err(bad("https is not supported (this build has no TLS); use http://")),
                "etcd" => endpoints(rest).map(Mode::Etcd).map_err(|why| bad(&why)),
                "redis" | "rediss" => Err(bad("redis metadata is not supported (use etcd or http)")),
                other => Err(bad(&format!(
                    "unknown scheme '{other}' (expected P2PHANDSHAKE, http://, etcd:// or host:port for etcd)"
                ))),
            };
        }
        endpoints(t).map(Mode::Etcd).map_err(|why| {
            bad(&format!("{why} (expected P2PHANDSHAKE, http://…, etcd://host:port or a bare host:port for etcd)"))
        })
    }
}

/// `h:p[,h:p]` or `h:p[;h:p]` (Mooncake's etcd client takes both, spaces
/// around them too): each a non-empty host and a non-zero port.
fn endpoints(list: &str) -> std::result::Result<Vec<String>, String> {
    let eps: Vec<String> = list.split([',', ';']).map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
    if eps.is_empty() {
        return Err("no endpoint given".to_owned());
    }
    if eps.len() > MAX_ENDPOINTS {
        return Err(format!("{} endpoints; at most {MAX_ENDPOINTS}", eps.len()));
    }
    for ep in &eps {
        let addr = parse_session(ep, 0).map_err(|e| format!("endpoint {ep:?}: {}", e.message()))?;
        if addr.port == 0 || ep.contains('/') {
            return Err(format!("endpoint {ep:?} is not host:port"));
        }
    }
    Ok(eps)
}

/// Mooncake's keys: `mooncake/[<cluster id>/]ram/<segment>` (the segment
/// descriptor) and `mooncake/[<cluster id>/]rpc_meta/<segment>` (where its
/// handshake port is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys of cluster `cluster_id` (`MC_METADATA_CLUSTER_ID`; none or
    /// empty: Mooncake's default namespace).
    pub fn new(cluster_id: Option<&str>) -> Result<Keys> {
        match cluster_id.map(str::trim).filter(|c| !c.is_empty()) {
            None => Ok(Keys { prefix: "mooncake/".to_owned() }),
            Some(id) if id.len() <= MAX_CLUSTER_ID_LEN && !id.chars().any(char::is_control) => {
                Ok(Keys { prefix: format!("mooncake/{id}/") })
            }
            Some(id) => Err(Error::invalid_argument(format!(
                "metadata cluster id {id:?}: 1 to {MAX_CLUSTER_ID_LEN} characters, no control characters"
            ))),
        }
    }

    pub fn descriptor(&self, segment: &str) -> String {
        format!("{}ram/{segment}", self.prefix)
    }

    pub fn rpc_meta(&self, segment: &str) -> String {
        format!("{}rpc_meta/{segment}", self.prefix)
    }
}

/// An `rpc_meta` value: where a segment's handshake port listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcMeta {
    pub ip_or_host_name: String,
    pub rpc_port: u16,
}

impl RpcMeta {
    /// Parse and check a stored value (`key` names it in errors).
    pub fn parse(value: &[u8], key: &str) -> Result<RpcMeta> {
        let bad = |why: String| Error::protocol(format!("malformed value of {key}: {why}"));
        if value.len() > MAX_RPC_META_LEN {
            return Err(bad(format!("{} bytes, more than {MAX_RPC_META_LEN}", value.len())));
        }
        let meta: RpcMeta = serde_json::from_slice(value).map_err(|e| bad(e.to_string()))?;
        let host = &meta.ip_or_host_name;
        if host.is_empty() || host.len() > MAX_HOST_LEN || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(format!("\"ip_or_host_name\" {host:?} is not a host name")));
        }
        if meta.rpc_port == 0 {
            return Err(bad("\"rpc_port\" is 0".to_owned()));
        }
        Ok(meta)
    }

    pub fn address(&self) -> SessionAddr {
        let host = crate::config::net::strip_brackets(&self.ip_or_host_name).to_owned();
        SessionAddr { host, port: self.rpc_port }
    }

    pub fn to_json(&self) -> String {
        // Serializing a string and an integer cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A segment descriptor as fetched, with where it came from (for errors).
pub struct Fetched {
    pub body: Vec<u8>,
    /// `key K in SERVER`, or empty when the peer answered itself.
    pub source: String,
}

/// Asks a peer's handshake port for its descriptor (P2P mode).
pub type AskPeer<'a> = &'a dyn Fn(&SessionAddr) -> Result<Vec<u8>>;

/// What a probe of a name's holder found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// An engine answered there (a refusal by authentication included).
    Answers,
    /// Nothing listens there (the connection was refused): the holder is gone.
    Gone,
    /// No answer by the probe's deadline (paused, overloaded, cut off).
    Silent,
}

/// Probes a name's holder at a handshake address, waiting for an answer
/// until the given deadline (`None`: the probe's own bound).
pub type Probe<'a> = &'a dyn Fn(&SessionAddr, Option<Instant>) -> Liveness;

/// How this engine's entry in the directory stands (for operators).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// The store lacks this engine's latest keys (a publish failed and is
    /// retried in the background).
    pub behind: bool,
    /// Another engine holds this engine's name now (it was taken while this
    /// engine's lease had lapsed); this engine no longer publishes.
    pub name_lost: bool,
    /// Publishes that failed since the engine started.
    pub publish_failures: u64,
    /// The last publish failure, bounded.
    pub last_error: Option<String>,
}

/// Where peers' descriptors and handshake addresses come from, and where
/// this engine publishes its own.
pub trait Directory: Send + Sync {
    /// The metadata string, for messages.
    fn describe(&self) -> String;

    /// Whether peers are asked directly (no store).
    fn is_p2p(&self) -> bool;

    /// Where `segment`'s handshake (rpc) port listens.
    fn rpc_address(&self, segment: &str, default_port: u16) -> Result<SessionAddr>;

    /// `segment`'s descriptor, unparsed (the caller checks it); `ask` asks a
    /// peer's handshake port.
    fn descriptor(&self, segment: &str, default_port: u16, ask: AskPeer<'_>) -> Result<Fetched>;

    /// Take `segment` for this engine and publish its descriptor and rpc
    /// address. A holder of the name that answers `probe` (or may still
    /// answer within its lease) is refused, naming it; a gone one's keys are
    /// replaced, with the store's own compare where it has one.
    fn claim(&self, segment: &str, descriptor: &str, rpc: &RpcMeta, probe: Probe<'_>) -> Result<()>;

    /// Publish the descriptor again (after a registration changed), with
    /// every key of the name. A failure leaves the directory behind: the
    /// latest descriptor is put again by [`Directory::upkeep`] until it lands.
    fn republish(&self, segment: &str, descriptor: &str) -> Result<()>;

    /// Remove this engine's keys, only those still its own (bounded); no
    /// publish follows.
    fn withdraw(&self, segment: &str);

    /// How often [`Directory::upkeep`] must run (`None`: never).
    fn upkeep_every(&self) -> Option<Duration>;

    /// Keep this engine's keys alive and put what is behind again; returns
    /// when to call again.
    fn upkeep(&self) -> Duration;

    /// How this engine's entry stands.
    fn standing(&self) -> Standing {
        Standing::default()
    }
}

/// Open the directory for `mode`.
pub fn open(mode: &Mode, keys: Keys, limits: Limits) -> Result<Box<dyn Directory>> {
    Ok(match mode {
        Mode::P2p => Box::new(P2p),
        Mode::Http(url) => Box::new(StoreDirectory::new(http::HttpStore::new(url, limits)?, keys, limits)),
        Mode::Etcd(eps) => Box::new(StoreDirectory::new(etcd::EtcdStore::new(eps, limits)?, keys, limits)),
    })
}

/// Bounds on talking to a store.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bound on each operation on the store (`PDX_METADATA_TIMEOUT_MS`):
    /// connects, answers and the retries of transient answers together.
    pub timeout: Duration,
    /// Largest value read.
    pub max_value: usize,
    /// The etcd lease's time to live.
    pub lease_ttl: Duration,
}

/// P2P handshake mode: the session name is `host:rpc_port`, and the peer
/// answers for itself.
pub struct P2p;

impl Directory for P2p {
    fn describe(&self) -> String {
        P2P_HANDSHAKE.to_owned()
    }

    fn is_p2p(&self) -> bool {
        true
    }

    fn rpc_address(&self, segment: &str, default_port: u16) -> Result<SessionAddr> {
        parse_session(segment, default_port)
    }

    fn descriptor(&self, segment: &str, default_port: u16, ask: AskPeer<'_>) -> Result<Fetched> {
        let addr = parse_session(segment, default_port)?;
        Ok(Fetched { body: ask(&addr)?, source: String::new() })
    }

    fn claim(&self, _: &str, _: &str, _: &RpcMeta, _: Probe<'_>) -> Result<()> {
        Ok(())
    }

    fn republish(&self, _: &str, _: &str) -> Result<()> {
        Ok(())
    }

    fn withdraw(&self, _: &str) {}

    fn upkeep_every(&self) -> Option<Duration> {
        None
    }

    fn upkeep(&self) -> Duration {
        Duration::from_secs(3600)
    }
}

/// A stored value with what a compare checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    /// The store's revision of the key's last change (0: the store has none).
    pub revision: i64,
    /// The lease the key lives under (0: none).
    pub lease: i64,
}

/// When a conditional put applies, checked on the name's `rpc_meta` key.
#[derive(Debug, Clone, Copy)]
pub enum Guard<'a> {
    /// The key does not exist.
    Absent,
    /// The key is still as read.
    Unchanged(&'a Entry),
    /// The key is still this engine's.
    Own,
}

/// A key-value store holding Mooncake's keys.
pub trait Store: Send + Sync {
    /// The store, for messages.
    fn describe(&self) -> String;
    /// The value of `key` (`None`: absent), at most `max` bytes.
    fn read(&self, key: &str, max: usize) -> Result<Option<Entry>>;
    /// Put every pair (the first is the name's `rpc_meta` key, on which
    /// `guard` is checked), under this engine's lease where the store has
    /// leases, if `guard` holds: `Ok(false)` when it did not (nothing put).
    fn put_if(&self, guard: Guard<'_>, pairs: &[(&str, &[u8])]) -> Result<bool>;
    /// Whether `entry` (an `rpc_meta` read) is this engine's, whose own
    /// value is `own`.
    fn is_own(&self, entry: &Entry, own: &[u8]) -> bool;
    /// How long a holder's `lease` still lives (`None`: gone, or no leases).
    fn lease_left(&self, lease: i64) -> Result<Option<Duration>>;
    /// Remove `keys` (the first the name's `rpc_meta`) if they are still
    /// this engine's (its `rpc_meta` value `own`).
    fn remove_own(&self, keys: &[&str], own: &[u8]) -> Result<()>;
    /// Keep the lease alive: `Ok(true)` while it lives, `Ok(false)` when it
    /// was lost (a new one is in place, the keys must be put again).
    fn renew(&self) -> Result<bool>;
    /// How often [`Store::renew`] must run (`None`: no lease).
    fn renew_every(&self) -> Option<Duration>;
    /// End the lease (its keys go with it).
    fn release(&self);
}

/// How often the keeper looks at a store without leases (is anything behind?).
const IDLE_UPKEEP: Duration = Duration::from_secs(1);
/// First and longest pause between background publishes while behind.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MOST: Duration = Duration::from_secs(2);
/// Longest wait for a silent holder whose lease still runs.
const MAX_HOLDER_WAIT: Duration = Duration::from_secs(60);
/// Most compare failures in one claim (each means another engine changed
/// the key between our read and our write).
const MAX_CLAIM_ROUNDS: usize = 16;
/// Longest text taken from a store into an error or a log line.
pub(crate) const MAX_STORE_TEXT: usize = 200;

/// A text from a store, fit for an error or a log line: at most
/// [`MAX_STORE_TEXT`] bytes (a cut is marked `…`), control characters escaped.
pub fn store_text(text: &str) -> String {
    let text = text.trim();
    let mut cut = text.len().min(MAX_STORE_TEXT);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + 8);
    for c in text[..cut].chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if cut < text.len() {
        out.push('…');
    }
    out
}

/// This engine's entry: what it put, for putting again.
struct Published {
    segment: String,
    rpc: Vec<u8>,
    descriptor: Vec<u8>,
}

#[derive(Default)]
struct State {
    own: Option<Published>,
    behind: bool,
    name_lost: bool,
    failures: u64,
    /// Background publishes failed in a row (for the pause and the log).
    retries: u32,
    last_error: Option<String>,
}

/// HTTP or etcd: Mooncake's keys in a [`Store`].
pub struct StoreDirectory<S: Store> {
    store: S,
    keys: Keys,
    limits: Limits,
    /// Held through every write of this engine's keys, so that a background
    /// publish never lands after [`Directory::withdraw`].
    state: Mutex<State>,
    /// A copy of the state's figures, for readers that must not wait for a
    /// write in flight (a metrics scrape).
    shown: Mutex<Standing>,
}

impl<S: Store> StoreDirectory<S> {
    pub fn new(store: S, keys: Keys, limits: Limits) -> Self {
        StoreDirectory { store, keys, limits, state: Mutex::default(), shown: Mutex::default() }
    }

    /// Show `state`'s figures to [`Directory::standing`].
    fn show(&self, state: &State) {
        *self.shown.lock() = Standing {
            behind: state.behind,
            name_lost: state.name_lost,
            publish_failures: state.failures,
            last_error: state.last_error.clone(),
        };
    }

    fn not_published(&self, segment: &str, key: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("segment {segment} is not published in {} (no key {key})", self.store.describe()),
        )
    }

    fn get(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.store.read(key, max)?.map(|e| e.value))
    }

    /// Put this engine's keys again if they are still its own, or create
    /// them if its name is free (its lease lapsed and nobody took it); the
    /// name is lost when another engine holds it.
    fn publish(&self, state: &mut State) -> Result<()> {
        let Some(own) = &state.own else { return Ok(()) };
        if state.name_lost {
            return Err(self.lost(&own.segment));
        }
        let (rpc_key, desc_key) = (self.keys.rpc_meta(&own.segment), self.keys.descriptor(&own.segment));
        let pairs = [(rpc_key.as_str(), own.rpc.as_slice()), (desc_key.as_str(), own.descriptor.as_slice())];
        let outcome = match self.store.put_if(Guard::Own, &pairs) {
            Ok(true) => Ok(true),
            Ok(false) => self.store.put_if(Guard::Absent, &pairs),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(true) => {
                if state.retries > 0 {
                    log::info!("segment {} is published in {} again", own.segment, self.store.describe());
                }
                (state.behind, state.retries) = (false, 0);
                Ok(())
            }
            Ok(false) => {
                let e = self.lost(&own.segment);
                log::error!("{e}");
                (state.name_lost, state.behind) = (true, false);
                state.last_error = Some(e.message().to_owned());
                Err(e)
            }
            Err(e) => {
                state.behind = true;
                state.failures += 1;
                state.last_error = Some(store_text(e.message()));
                Err(e)
            }
        }
    }

    fn lost(&self, segment: &str) -> Error {
        Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "segment name {segment} was taken by another engine in {} while this engine's entry had lapsed; \
                 this engine no longer publishes it (restart it under another name)",
                self.store.describe()
            ),
        )
    }

    fn held(&self, segment: &str, addr: &SessionAddr, rpc_key: &str, how: &str) -> Error {
        Error::invalid_argument(format!(
            "segment name {segment} is held by a live engine at {}:{} ({rpc_key} in {}{how}); choose another name or \
             stop that engine (through a metadata server each engine needs its own name: a resolvable host and a \
             port, the port only part of the name)",
            addr.host,
            addr.port,
            self.store.describe()
        ))
    }
}

impl<S: Store> Directory for StoreDirectory<S> {
    fn describe(&self) -> String {
        self.store.describe()
    }

    fn is_p2p(&self) -> bool {
        false
    }

    fn rpc_address(&self, segment: &str, _: u16) -> Result<SessionAddr> {
        let key = self.keys.rpc_meta(segment);
        let value = self.get(&key, MAX_RPC_META_LEN)?.ok_or_else(|| self.not_published(segment, &key))?;
        Ok(RpcMeta::parse(&value, &key)?.address())
    }

    fn descriptor(&self, segment: &str, _: u16, _: AskPeer<'_>) -> Result<Fetched> {
        let key = self.keys.descriptor(segment);
        let body = self.get(&key, self.limits.max_value)?.ok_or_else(|| self.not_published(segment, &key))?;
        Ok(Fetched { body, source: format!("key {key} in {}", self.store.describe()) })
    }

    fn claim(&self, segment: &str, descriptor: &str, rpc: &RpcMeta, probe: Probe<'_>) -> Result<()> {
        let (rpc_key, desc_key) = (self.keys.rpc_meta(segment), self.keys.descriptor(segment));
        let own_rpc = rpc.to_json().into_bytes();
        let pairs = [(rpc_key.as_str(), own_rpc.as_slice()), (desc_key.as_str(), descriptor.as_bytes())];
        let mut state = self.state.lock();
        let mut waited_since: Option<Instant> = None;
        let mut compare_failures = 0;
        while compare_failures < MAX_CLAIM_ROUNDS {
            let entry = self.store.read(&rpc_key, MAX_RPC_META_LEN)?;
            let guard = match &entry {
                None => Guard::Absent,
                // Ours already (a claim whose answer was lost and retried).
                Some(e) if self.store.is_own(e, &own_rpc) => Guard::Own,
                Some(e) => match RpcMeta::parse(&e.value, &rpc_key) {
                    Err(err) => {
                        log::warn!("{}; replacing it", store_text(err.message()));
                        Guard::Unchanged(e)
                    }
                    // An earlier engine at this very address: gone, as this
                    // engine listens there now.
                    Ok(holder) if holder == *rpc => Guard::Unchanged(e),
                    Ok(holder) => {
                        let addr = holder.address();
                        // A leased holder may answer until its lease ends.
                        let left = match e.lease {
                            0 => None,
                            lease => self.store.lease_left(lease)?,
                        };
                        let by = left.map(|l| Instant::now() + l + Duration::from_secs(1));
                        match probe(&addr, by) {
                            Liveness::Answers => return Err(self.held(segment, &addr, &rpc_key, "")),
                            Liveness::Gone => {
                                log::info!(
                                    "segment name {segment}: nothing listens at its holder's address {}:{}; taking \
                                     the name over",
                                    addr.host,
                                    addr.port
                                );
                                Guard::Unchanged(e)
                            }
                            Liveness::Silent if left.is_none() => {
                                log::info!(
                                    "segment name {segment}: its holder at {}:{} does not answer (and has no lease); \
                                     taking the name over",
                                    addr.host,
                                    addr.port
                                );
                                Guard::Unchanged(e)
                            }
                            Liveness::Silent => {
                                // Silent through its lease: the lease should
                                // have ended and the key gone; read again.
                                let since = *waited_since.get_or_insert_with(Instant::now);
                                if since.elapsed() > MAX_HOLDER_WAIT {
                                    let how = "; it does not answer but keeps its lease alive";
                                    return Err(self.held(segment, &addr, &rpc_key, how));
                                }
                                // A probe that failed early (a reset): wait
                                // towards the lease's end before reading again.
                                let rest = by.map_or(Duration::ZERO, |by| by.saturating_duration_since(Instant::now()));
                                std::thread::sleep(rest.clamp(Duration::from_millis(100), Duration::from_secs(1)));
                                continue;
                            }
                        }
                    }
                },
            };
            if self.store.put_if(guard, &pairs)? {
                state.own = Some(Published {
                    segment: segment.to_owned(),
                    rpc: own_rpc,
                    descriptor: descriptor.as_bytes().to_vec(),
                });
                self.show(&state);
                return Ok(());
            }
            // Another engine wrote the key since it was read: read again.
            compare_failures += 1;
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!(
                "segment name {segment}: {rpc_key} in {} changed under {MAX_CLAIM_ROUNDS} claims in a row (other \
                 engines claim it at the same time)",
                self.store.describe()
            ),
        ))
    }

    fn republish(&self, _: &str, descriptor: &str) -> Result<()> {
        let mut state = self.state.lock();
        let Some(own) = state.own.as_mut() else { return Ok(()) };
        own.descriptor = descriptor.as_bytes().to_vec();
        let outcome = self.publish(&mut state);
        self.show(&state);
        outcome
    }

    fn withdraw(&self, _: &str) {
        let mut state = self.state.lock();
        // Only what this engine holds: a refused claim or a lost name leaves
        // the holder's keys.
        if let Some(own) = state.own.take() {
            if !state.name_lost {
                let (rpc_key, desc_key) = (self.keys.rpc_meta(&own.segment), self.keys.descriptor(&own.segment));
                if let Err(e) = self.store.remove_own(&[&rpc_key, &desc_key], &own.rpc) {
                    log::warn!("could not remove segment {}'s keys: {e}", own.segment);
                }
            }
        }
        state.behind = false;
        self.show(&state);
        self.store.release();
    }

    fn upkeep_every(&self) -> Option<Duration> {
        Some(self.store.renew_every().unwrap_or(IDLE_UPKEEP))
    }

    fn upkeep(&self) -> Duration {
        let every = self.store.renew_every().unwrap_or(IDLE_UPKEEP);
        let mut state = self.state.lock();
        if state.own.is_none() {
            return every;
        }
        if self.store.renew_every().is_some() {
            match self.store.renew() {
                Ok(true) => {}
                Ok(false) => {
                    log::warn!("the lease in {} was lost; putting this engine's keys again", self.store.describe());
                    state.behind = true;
                }
                Err(e) => log::warn!("keeping the lease in {} alive: {e}", self.store.describe()),
            }
        }
        if !state.behind || state.name_lost {
            self.show(&state);
            return every;
        }
        let outcome = self.publish(&mut state);
        self.show(&state);
        match outcome {
            Ok(()) => every,
            Err(e) => {
                state.retries = state.retries.saturating_add(1);
                if state.retries == 1 {
                    log::warn!("the directory is behind (retried in the background until it lands): {e}");
                } else {
                    log::debug!("the directory is still behind: {e}");
                }
                let pause = RETRY_FIRST.saturating_mul(1 << state.retries.min(4)).min(RETRY_MOST);
                pause.min(every)
            }
        }
    }

    fn standing(&self) -> Standing {
        self.shown.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn metadata_strings_parse_as_mooncake_reads_them() {
        assert_eq!(Mode::parse("P2PHANDSHAKE").unwrap(), Mode::P2p);
        assert_eq!(Mode::parse("").unwrap(), Mode::P2p);
        assert_eq!(
            Mode::parse("http://127.0.0.1:8080/metadata").unwrap(),
            Mode::Http("http://127.0.0.1:8080/metadata".into())
        );
        assert_eq!(Mode::parse("etcd://10.0.0.1:2379").unwrap(), Mode::Etcd(vec!["10.0.0.1:2379".into()]));
        assert_eq!(
            Mode::parse("etcd://a:1,b:2").unwrap(),
            Mode::Etcd(vec!["a:1".into(), "b:2".into()]),
            "several endpoints"
        );
        assert_eq!(Mode::parse("127.0.0.1:2379").unwrap(), Mode::Etcd(vec!["127.0.0.1:2379".into()]));
        assert_eq!(Mode::parse("[::1]:2379").unwrap(), Mode::Etcd(vec!["[::1]:2379".into()]));
    }

    #[test]
    fn unknown_or_broken_metadata_strings_are_refused_naming_them() {
        for (text, says) in [
            ("redis://127.0.0.1:6379", "redis"),
            ("https://h/metadata", "TLS"),
            ("zk://h:1", "unknown scheme 'zk'"),
            ("etcd://", "no endpoint"),
            ("etcd://h", "not host:port"),
            ("localhost", "not host:port"),
            ("http://", "host"),
            ("http://h:99999/m", "port"),
        ] {
            let e = Mode::parse(text).unwrap_err();
            assert!(e.message().contains(text) && e.message().contains(says), "{text}: {e}");
        }
        assert!(Mode::parse(&"a".repeat(5000)).is_err());
    }

    #[test]
    fn keys_are_mooncakes_with_and_without_a_cluster_id() {
        let k = Keys::new(None).unwrap();
        assert_eq!(k.descriptor("127.0.0.1:17777"), "mooncake/ram/127.0.0.1:17777");
        assert_eq!(k.rpc_meta("127.0.0.1:17777"), "mooncake/rpc_meta/127.0.0.1:17777");
        let k = Keys::new(Some("blue")).unwrap();
        assert_eq!(k.descriptor("n"), "mooncake/blue/ram/n");
        assert_eq!(k.rpc_meta("n"), "mooncake/blue/rpc_meta/n");
        assert_eq!(Keys::new(Some(" ")).unwrap(), Keys::new(None).unwrap());
        assert!(Keys::new(Some("a\nb")).is_err());
    }

    #[test]
    fn rpc_meta_values_are_checked_naming_the_key() {
        let captured = br#"{"ip_or_host_name":"192.0.2.2","rpc_port":15403}"#;
        let m = RpcMeta::parse(captured, "k").unwrap();
        assert_eq!(m.address(), SessionAddr { host: "192.0.2.2".into(), port: 15403 });
        assert_eq!(m.to_json().as_bytes(), captured);
        for bad in [
            &br#"{"ip_or_host_name":"","rpc_port":1}"#[..],
            br#"{"ip_or_host_name":"h","rpc_port":0}"#,
            br#"{"ip_or_host_name":"h","rpc_port":70000}"#,
            br#"{"ip_or_host_name":"a b","rpc_port":1}"#,
            br#"{"rpc_port":1}"#,
            br#"[1]"#,
            b"\xff",
        ] {
            let e = RpcMeta::parse(bad, "mooncake/rpc_meta/x").unwrap_err();
            assert!(e.message().contains("mooncake/rpc_meta/x"), "{e}");
        }
        let huge = format!(r#"{{"ip_or_host_name":"{}","rpc_port":1}}"#, "h".repeat(5000));
        assert!(RpcMeta::parse(huge.as_bytes(), "k").is_err());
    }

    /// A store in memory with etcd's compares and a lease it can lose, and
    /// a switch that makes every write fail (a store that does not answer).
    #[derive(Default)]
    struct MemoryStore {
        map: Mutex<BTreeMap<String, Entry>>,
        revision: std::sync::atomic::AtomicI64,
        lease: std::sync::atomic::AtomicI64,
        lease_lost: std::sync::atomic::AtomicBool,
        down: std::sync::atomic::AtomicBool,
    }

    use std::sync::atomic::Ordering::SeqCst;

    impl MemoryStore {
        fn with_lease(lease: i64) -> Self {
            let s = MemoryStore::default();
            s.lease.store(lease, SeqCst);
            s
        }
        fn check_up(&self) -> Result<()> {
            match self.down.load(SeqCst) {
                true => Err(Error::new(ErrorKind::PeerUnreachable, "memory did not answer")),
                false => Ok(()),
            }
        }
    }

    impl Store for MemoryStore {
        fn describe(&self) -> String {
            "memory".into()
        }
        fn read(&self, key: &str, max: usize) -> Result<Option<Entry>> {
            self.check_up()?;
            let v = self.map.lock().get(key).cloned();
            match v {
                Some(v) if v.value.len() > max => Err(Error::protocol(format!("{key} too large"))),
                v => Ok(v),
            }
        }
        fn put_if(&self, guard: Guard<'_>, pairs: &[(&str, &[u8])]) -> Result<bool> {
            self.check_up()?;
            let mut map = self.map.lock();
            let lease = self.lease.load(SeqCst);
            let now = map.get(pairs[0].0);
            let holds = match guard {
                Guard::Absent => now.is_none(),
                Guard::Unchanged(e) => now.is_some_and(|n| n.revision == e.revision),
                Guard::Own => now.is_some_and(|n| n.lease == lease),
            };
            if !holds {
                return Ok(false);
            }
            for (k, v) in pairs {
                let revision = self.revision.fetch_add(1, SeqCst) + 1;
                map.insert(k.to_string(), Entry { value: v.to_vec(), revision, lease });
            }
            Ok(true)
        }
        fn is_own(&self, entry: &Entry, _: &[u8]) -> bool {
            entry.lease == self.lease.load(SeqCst)
        }
        fn lease_left(&self, _: i64) -> Result<Option<Duration>> {
            Ok(None)
        }
        fn remove_own(&self, keys: &[&str], _: &[u8]) -> Result<()> {
            let lease = self.lease.load(SeqCst);
            let mut map = self.map.lock();
            for k in keys {
                if map.get(*k).is_some_and(|e| e.lease == lease) {
                    map.remove(*k);
                }
            }
            Ok(())
        }
        fn renew(&self) -> Result<bool> {
            self.check_up()?;
            if self.lease_lost.swap(false, SeqCst) {
                let old = self.lease.fetch_add(1000, SeqCst);
                self.map.lock().retain(|_, e| e.lease != old); // the lease's keys went with it
                return Ok(false);
            }
            Ok(true)
        }
        fn renew_every(&self) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }
        fn release(&self) {}
    }

    fn limits() -> Limits {
        Limits { timeout: Duration::from_secs(1), max_value: 1 << 20, lease_ttl: Duration::from_secs(3) }
    }

    fn directory() -> StoreDirectory<MemoryStore> {
        StoreDirectory::new(MemoryStore::with_lease(1), Keys::new(None).unwrap(), limits())
    }

    /// A second engine on the same store (its own lease).
    fn beside(d: &StoreDirectory<MemoryStore>, lease: i64) -> StoreDirectory<MemoryStore> {
        let other = StoreDirectory::new(MemoryStore::with_lease(lease), Keys::new(None).unwrap(), limits());
        // One map: the stores share it by swapping in a view after each step.
        *other.store.map.lock() = d.store.map.lock().clone();
        other.store.revision.store(d.store.revision.load(SeqCst) + 100, SeqCst);
        other
    }

    fn sync(from: &StoreDirectory<MemoryStore>, to: &StoreDirectory<MemoryStore>) {
        *to.store.map.lock() = from.store.map.lock().clone();
    }

    fn rpc(port: u16) -> RpcMeta {
        RpcMeta { ip_or_host_name: "127.0.0.1".into(), rpc_port: port }
    }

    fn ask_nobody(_: &SessionAddr) -> Result<Vec<u8>> {
        unreachable!("a store is read, no peer asked")
    }

    fn answers(port: u16) -> impl Fn(&SessionAddr, Option<Instant>) -> Liveness {
        move |a, _| if a.port == port { Liveness::Answers } else { Liveness::Gone }
    }

    fn nobody(_: &SessionAddr, _: Option<Instant>) -> Liveness {
        Liveness::Gone
    }

    #[test]
    fn a_live_holder_keeps_its_name_and_its_keys() {
        let d = directory();
        d.claim("n", "first", &rpc(1), &nobody).unwrap();
        let other = beside(&d, 2);
        let e = other.claim("n", "second", &rpc(2), &answers(1)).unwrap_err();
        assert!(e.message().contains("held by a live engine at 127.0.0.1:1"), "{e}");
        assert!(e.message().contains("mooncake/rpc_meta/n"), "{e}");
        assert_eq!(other.descriptor("n", 0, &ask_nobody).unwrap().body, b"first");
        // A refused engine's withdrawal leaves the holder's keys.
        other.withdraw("n");
        assert_eq!(other.store.map.lock().len(), 2);
    }

    #[test]
    fn a_gone_holder_is_taken_over_with_a_compare() {
        let d = directory();
        d.claim("n", "old", &rpc(1), &nobody).unwrap();
        let new = beside(&d, 2);
        new.claim("n", "new", &rpc(2), &nobody).unwrap();
        assert_eq!(new.rpc_address("n", 0).unwrap().port, 2);
        assert_eq!(new.descriptor("n", 0, &ask_nobody).unwrap().body, b"new");
        // Claiming one's own keys again is idempotent.
        new.claim("n", "new", &rpc(2), &answers(2)).unwrap();
        new.republish("n", "newer").unwrap();
        assert_eq!(new.descriptor("n", 0, &ask_nobody).unwrap().body, b"newer");
        // The old holder wakes: its re-publish finds the name taken and
        // leaves it; its stop removes nothing.
        sync(&new, &d);
        let e = d.republish("n", "stale").unwrap_err();
        assert!(e.message().contains("taken by another engine"), "{e}");
        assert!(d.standing().name_lost);
        d.withdraw("n");
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"newer");
        new.withdraw("n");
        assert!(new.store.map.lock().is_empty());
    }

    #[test]
    fn a_silent_holder_without_a_lease_is_taken_over() {
        let d = directory();
        d.claim("n", "old", &rpc(1), &nobody).unwrap();
        let new = beside(&d, 2);
        new.claim("n", "new", &rpc(2), &|_, _| Liveness::Silent).unwrap();
        assert_eq!(new.rpc_address("n", 0).unwrap().port, 2);
    }

    #[test]
    fn a_lost_lease_puts_every_key_again_unless_the_name_was_taken() {
        let d = directory();
        d.claim("n", "desc", &rpc(1), &nobody).unwrap();
        d.store.lease_lost.store(true, SeqCst);
        assert!(d.upkeep() <= Duration::from_secs(1));
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"desc");
        assert_eq!(d.rpc_address("n", 0).unwrap().port, 1);
        assert!(!d.standing().behind);
        // Lost again, and another engine takes the free name meanwhile.
        d.store.lease_lost.store(true, SeqCst);
        d.store.renew().unwrap();
        let c = beside(&d, 9000);
        c.claim("n", "c", &rpc(3), &nobody).unwrap();
        sync(&c, &d);
        d.store.lease_lost.store(false, SeqCst);
        d.state.lock().behind = true;
        d.upkeep();
        assert!(d.standing().name_lost);
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"c");
        assert_eq!(d.rpc_address("n", 0).unwrap().port, 3);
    }

    #[test]
    fn a_failed_republish_is_behind_until_the_keeper_lands_the_latest() {
        let d = directory();
        d.claim("n", "one", &rpc(1), &nobody).unwrap();
        d.store.down.store(true, SeqCst);
        assert!(d.republish("n", "two").is_err());
        assert!(d.republish("n", "three").is_err());
        let s = d.standing();
        assert!(s.behind && s.publish_failures == 2 && s.last_error.is_some(), "{s:?}");
        assert!(d.upkeep() < Duration::from_secs(1), "a short pause while behind");
        d.store.down.store(false, SeqCst);
        d.upkeep();
        assert!(!d.standing().behind);
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"three");
        // After withdrawal nothing is put again.
        d.store.down.store(true, SeqCst);
        assert!(d.republish("n", "four").is_err());
        d.store.down.store(false, SeqCst);
        d.withdraw("n");
        assert!(d.store.map.lock().is_empty());
        d.upkeep();
        assert!(d.store.map.lock().is_empty(), "no resurrected descriptor");
    }

    #[test]
    fn store_texts_are_bounded_and_escaped() {
        assert_eq!(store_text("a\r\nb\u{1b}"), "a\\r\\nb\\u{1b}");
        let long = store_text(&"é".repeat(500));
        assert!(long.len() <= MAX_STORE_TEXT + 3 && long.ends_with('…'), "{long}");
    }

    #[test]
    fn endpoint_lists_take_commas_and_semicolons() {
        let want = Mode::Etcd(vec!["a:1".into(), "b:2".into(), "c:3".into()]);
        for text in ["etcd://a:1;b:2;c:3", "etcd://a:1 , b:2 ; c:3", "a:1;b:2,c:3", " a:1 ;b:2; c:3 ;"] {
            assert_eq!(Mode::parse(text).unwrap(), want, "{text}");
        }
        assert!(Mode::parse("etcd://;;").is_err());
    }

    #[test]
    fn a_missing_segment_is_not_found_and_named() {
        let d = directory();
        let e = d.descriptor("ghost", 0, &ask_nobody).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.message().contains("mooncake/ram/ghost") && e.message().contains("memory"), "{e}");
        let e = d.rpc_address("ghost", 0).unwrap_err();
        assert!(e.message().contains("mooncake/rpc_meta/ghost"), "{e}");
        // A malformed rpc_meta is refused naming its key.
        d.store
            .map
            .lock()
            .insert("mooncake/rpc_meta/bad".into(), Entry { value: b"{}".to_vec(), revision: 1, lease: 0 });
        assert!(d.rpc_address("bad", 0).unwrap_err().message().contains("mooncake/rpc_meta/bad"));
    }
}
