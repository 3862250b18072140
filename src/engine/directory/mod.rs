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

use std::collections::BTreeMap;
use std::time::Duration;

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

/// `h:p[,h:p]`: each a non-empty host and a non-zero port.
fn endpoints(list: &str) -> std::result::Result<Vec<String>, String> {
    let eps: Vec<String> = list.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
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
/// Whether an engine answers at a handshake address (a probe).
pub type IsAlive<'a> = &'a dyn Fn(&SessionAddr) -> bool;

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
    /// address. A live holder of the name (one `alive` answers for) is
    /// refused, naming it; a dead one's keys are replaced.
    fn claim(&self, segment: &str, descriptor: &str, rpc: &RpcMeta, alive: IsAlive<'_>) -> Result<()>;

    /// Publish the descriptor again (after a registration changed).
    fn republish(&self, segment: &str, descriptor: &str) -> Result<()>;

    /// Remove this engine's keys (best effort, bounded).
    fn withdraw(&self, segment: &str);

    /// Keep this engine's keys alive; returns when to call again (`None`:
    /// never needed).
    fn upkeep(&self) -> Option<Duration>;
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
    /// Bound on each request (connect included).
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

    fn claim(&self, _: &str, _: &str, _: &RpcMeta, _: IsAlive<'_>) -> Result<()> {
        Ok(())
    }

    fn republish(&self, _: &str, _: &str) -> Result<()> {
        Ok(())
    }

    fn withdraw(&self, _: &str) {}

    fn upkeep(&self) -> Option<Duration> {
        None
    }
}

/// A key-value store holding Mooncake's keys.
pub trait Store: Send + Sync {
    /// The store, for messages.
    fn describe(&self) -> String;
    /// The value of `key` (`None`: absent), at most `max` bytes.
    fn get(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>>;
    /// Set `key` (under this engine's lease where the store has leases).
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Remove `key` (absent is fine).
    fn delete(&self, key: &str) -> Result<()>;
    /// Keep the lease alive: `Ok(true)` while it lives, `Ok(false)` when it
    /// was lost (a new one is in place, the keys must be put again).
    fn renew(&self) -> Result<bool>;
    /// How often [`Store::renew`] must run (`None`: no lease).
    fn renew_every(&self) -> Option<Duration>;
    /// End the lease (its keys go with it).
    fn release(&self);
}

/// HTTP or etcd: Mooncake's keys in a [`Store`].
pub struct StoreDirectory<S: Store> {
    store: S,
    keys: Keys,
    limits: Limits,
    /// This engine's keys and values, put again if the lease is lost.
    own: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl<S: Store> StoreDirectory<S> {
    pub fn new(store: S, keys: Keys, limits: Limits) -> Self {
        StoreDirectory { store, keys, limits, own: Mutex::default() }
    }

    fn put_own(&self, key: String, value: &[u8]) -> Result<()> {
        self.store.put(&key, value)?;
        self.own.lock().insert(key, value.to_vec());
        Ok(())
    }

    fn not_published(&self, segment: &str, key: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("segment {segment} is not published in {} (no key {key})", self.store.describe()),
        )
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
        let value = self.store.get(&key, MAX_RPC_META_LEN)?.ok_or_else(|| self.not_published(segment, &key))?;
        Ok(RpcMeta::parse(&value, &key)?.address())
    }

    fn descriptor(&self, segment: &str, _: u16, _: AskPeer<'_>) -> Result<Fetched> {
        let key = self.keys.descriptor(segment);
        let body = self.store.get(&key, self.limits.max_value)?.ok_or_else(|| self.not_published(segment, &key))?;
        Ok(Fetched { body, source: format!("key {key} in {}", self.store.describe()) })
    }

    fn claim(&self, segment: &str, descriptor: &str, rpc: &RpcMeta, alive: IsAlive<'_>) -> Result<()> {
        let rpc_key = self.keys.rpc_meta(segment);
        let present = self.store.get(&rpc_key, MAX_RPC_META_LEN)?;
        let was_there = present.is_some();
        let held = match present {
            None => None,
            Some(v) => match RpcMeta::parse(&v, &rpc_key) {
                Ok(holder) => Some(holder),
                Err(e) => {
                    log::warn!("{e}; replacing it");
                    None
                }
            },
        };
        if let Some(holder) = held.filter(|h| h != rpc) {
            let addr = holder.address();
            if alive(&addr) {
                return Err(Error::invalid_argument(format!(
                    "segment name {segment} is held by a live engine at {}:{} ({rpc_key} in {}); choose another name \
                     or stop that engine",
                    addr.host,
                    addr.port,
                    self.store.describe()
                )));
            }
            log::info!(
                "segment name {segment}: its holder at {}:{} does not answer; taking the name over",
                addr.host,
                addr.port
            );
        }
        // Removed first: Mooncake's HTTP server refuses to overwrite an rpc_meta key.
        if was_there {
            self.store.delete(&rpc_key)?;
        }
        self.put_own(rpc_key, rpc.to_json().as_bytes())?;
        self.put_own(self.keys.descriptor(segment), descriptor.as_bytes())
    }

    fn republish(&self, segment: &str, descriptor: &str) -> Result<()> {
        self.put_own(self.keys.descriptor(segment), descriptor.as_bytes())
    }

    fn withdraw(&self, _: &str) {
        // Only what this engine put: a refused claim leaves the holder's keys.
        let own = std::mem::take(&mut *self.own.lock());
        for key in own.keys() {
            if let Err(e) = self.store.delete(key) {
                log::warn!("could not remove {key} from {}: {e}", self.store.describe());
                if matches!(e.kind(), ErrorKind::PeerUnreachable | ErrorKind::Timeout) {
                    // A store that does not answer would hold the stop for
                    // a timeout per key; a lease removes the keys anyway.
                    return;
                }
            }
        }
        self.store.release();
    }

    fn upkeep(&self) -> Option<Duration> {
        let every = self.store.renew_every()?;
        match self.store.renew() {
            Ok(true) => {}
            Ok(false) => {
                let own = self.own.lock().clone();
                log::warn!("the lease in {} was lost; putting {} keys again", self.store.describe(), own.len());
                for (key, value) in own {
                    if let Err(e) = self.store.put(&key, &value) {
                        log::warn!("could not put {key} again: {e}");
                    }
                }
            }
            Err(e) => log::warn!("keeping the lease in {} alive: {e}", self.store.describe()),
        }
        Some(every)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A store in memory that refuses to overwrite `rpc_meta` keys (as
    /// Mooncake's HTTP server does) and can lose its lease.
    #[derive(Default)]
    struct MemoryStore {
        map: Mutex<BTreeMap<String, Vec<u8>>>,
        lease_lost: std::sync::atomic::AtomicBool,
    }

    impl Store for MemoryStore {
        fn describe(&self) -> String {
            "memory".into()
        }
        fn get(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>> {
            let v = self.map.lock().get(key).cloned();
            match v {
                Some(v) if v.len() > max => Err(Error::protocol(format!("{key} too large"))),
                v => Ok(v),
            }
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<()> {
            let mut map = self.map.lock();
            if key.contains("rpc_meta") && map.contains_key(key) {
                return Err(Error::protocol("HTTP 400: Duplicate rpc_meta key not allowed"));
            }
            map.insert(key.to_owned(), value.to_vec());
            Ok(())
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.map.lock().remove(key);
            Ok(())
        }
        fn renew(&self) -> Result<bool> {
            if self.lease_lost.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.map.lock().clear(); // the lease's keys went with it
                return Ok(false);
            }
            Ok(true)
        }
        fn renew_every(&self) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }
        fn release(&self) {}
    }

    fn directory() -> StoreDirectory<MemoryStore> {
        let limits = Limits { timeout: Duration::from_secs(1), max_value: 1 << 20, lease_ttl: Duration::from_secs(3) };
        StoreDirectory::new(MemoryStore::default(), Keys::new(None).unwrap(), limits)
    }

    fn rpc(port: u16) -> RpcMeta {
        RpcMeta { ip_or_host_name: "127.0.0.1".into(), rpc_port: port }
    }

    fn ask_nobody(_: &SessionAddr) -> Result<Vec<u8>> {
        unreachable!("a store is read, no peer asked")
    }

    #[test]
    fn a_live_holder_keeps_its_name_and_its_keys() {
        let d = directory();
        d.claim("n", "first", &rpc(1), &|_| false).unwrap();
        let e = d.claim("n", "second", &rpc(2), &|a| a.port == 1).unwrap_err();
        assert!(e.message().contains("held by a live engine at 127.0.0.1:1"), "{e}");
        assert!(e.message().contains("mooncake/rpc_meta/n"), "{e}");
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"first");
        // A refused engine's withdrawal leaves the holder's keys.
        let refused = directory();
        *refused.store.map.lock() = d.store.map.lock().clone();
        assert!(refused.claim("n", "second", &rpc(2), &|_| true).is_err());
        refused.withdraw("n");
        assert_eq!(refused.store.map.lock().len(), 2);
    }

    #[test]
    fn a_dead_holder_is_taken_over_without_a_duplicate_refusal() {
        let d = directory();
        d.claim("n", "old", &rpc(1), &|_| false).unwrap();
        d.claim("n", "new", &rpc(2), &|_| false).unwrap();
        assert_eq!(d.rpc_address("n", 0).unwrap().port, 2);
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"new");
        // Claiming one's own keys again is idempotent.
        d.claim("n", "new", &rpc(2), &|_| true).unwrap();
        d.republish("n", "newer").unwrap();
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"newer");
        d.withdraw("n");
        assert!(d.store.map.lock().is_empty());
    }

    #[test]
    fn a_lost_lease_puts_the_keys_again() {
        let d = directory();
        d.claim("n", "desc", &rpc(1), &|_| false).unwrap();
        d.store.lease_lost.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(d.upkeep(), Some(Duration::from_secs(1)));
        assert_eq!(d.descriptor("n", 0, &ask_nobody).unwrap().body, b"desc");
        assert_eq!(d.rpc_address("n", 0).unwrap().port, 1);
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
        d.store.map.lock().insert("mooncake/rpc_meta/bad".into(), b"{}".to_vec());
        assert!(d.rpc_address("bad", 0).unwrap_err().message().contains("mooncake/rpc_meta/bad"));
    }
}
