//! The handshake client: every connection an engine opens to a peer's
//! handshake port, bounded in time, and the descriptor it sends about
//! itself. Built once per engine with what it needs (settings, the socket
//! registry that interrupts it at stop, and what the own descriptor names).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::directory::Directory;
use super::super::memory::regions::Regions;
use super::super::net::deadline::BoundedStream;
use super::super::protocol::descriptor::{self, Identity, PeerDescriptor};
use super::super::protocol::wire::{self, FrameType};
use super::super::registry::Registry;
use super::super::settings::Settings;
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::host::{parse_session, SessionAddr};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::dialer";

/// Resolve `host:port` within `timeout`. An IP literal needs no lookup; a
/// name is looked up on a helper thread we stop waiting for at the
/// timeout (a silent resolver cannot hold a transfer past it; the helper
/// ends when the system resolver gives up).
fn resolve(host: &str, port: u16, timeout: std::time::Duration) -> Result<Vec<SocketAddr>> {
    resolve_with(host, port, timeout, |name, port| (name.as_str(), port).to_socket_addrs().map(Iterator::collect))
}

/// [`resolve`] with the name lookup given (the system resolver in pdx; a
/// silent one in the tests).
fn resolve_with(
    host: &str,
    port: u16,
    timeout: std::time::Duration,
    lookup: impl FnOnce(String, u16) -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_owned();
    let spawned =
        std::thread::Builder::new().name("pdx-resolve".into()).spawn(move || drop(tx.send(lookup(name, port))));
    if let Err(e) = spawned {
        return Err(Error::new(ErrorKind::PeerUnreachable, format!("cannot resolve {host}: {e}")));
    }
    let addrs = match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => return Err(Error::new(ErrorKind::PeerUnreachable, format!("cannot resolve {host}: {e}"))),
        Err(_) => {
            return Err(Error::new(
                ErrorKind::PeerUnreachable,
                format!("cannot resolve {host}: no answer within the connect timeout ({timeout:?})"),
            ))
        }
    };
    if addrs.is_empty() {
        return Err(Error::new(ErrorKind::PeerUnreachable, format!("{host} resolves to no address")));
    }
    Ok(addrs)
}

/// Connect to `host:port` within the connect timeout, trying each address,
/// and by `by` when given (name lookup included).
pub fn connect_by(settings: &Settings, host: &str, port: u16, by: Option<Instant>) -> Result<TcpStream> {
    let bound = || match by {
        Some(by) => settings.connect_timeout.min(by.saturating_duration_since(Instant::now())),
        None => settings.connect_timeout,
    };
    let mut last = String::new();
    for addr in resolve(host, port, bound())? {
        let left = bound();
        if left.is_zero() {
            last = format!("{addr}: the connect bound passed");
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let e = Error::new(ErrorKind::PeerUnreachable, format!("cannot connect to {host}:{port} ({last})"));
    log::debug!(target: LOG_TARGET, "{e}");
    Err(e)
}

/// Tries a repeatable handshake exchange gets when the target closes it
/// before any reply (see [`Dialer::exchange_by`]).
pub(crate) const HANDSHAKE_TRIES: usize = 6;

/// The error of the last of several tries, naming each try and why it failed.
fn tries_error(last: Error, failures: &[String]) -> Error {
    if failures.len() < 2 {
        return last;
    }
    let each: Vec<String> = failures.iter().enumerate().map(|(i, why)| format!("try {}: {why}", i + 1)).collect();
    Error::new(last.kind(), format!("{} tries ({})", failures.len(), each.join("; ")))
}

/// Dials peers' handshake ports for one engine.
pub(crate) struct Dialer {
    pub settings: Settings,
    pub registry: Arc<Registry>,
    regions: Arc<Regions>,
    identity: Identity,
    /// The peer secret every handshake and data connection proves (see
    /// [`super::super::protocol::auth`]), when set.
    pub secret: Option<Vec<u8>>,
    /// This engine's device memory as other processes reach it over the
    /// same-host link (CUDA IPC handles, forgotten at unregister).
    pub exports: Arc<super::super::memory::ipc::Exports>,
    /// Where peers' descriptors and handshake addresses come from.
    pub directory: Arc<dyn Directory>,
    /// The one prober of every peer's down rails.
    pub rail_prober: Arc<super::super::net::rails::Prober>,
}

impl Dialer {
    pub fn new(
        settings: Settings,
        registry: Arc<Registry>,
        regions: Arc<Regions>,
        identity: Identity,
        secret: Option<Vec<u8>>,
        directory: Arc<dyn Directory>,
    ) -> Dialer {
        let rail_prober = super::super::net::rails::Prober::new(registry.clone());
        Dialer { settings, registry, regions, identity, secret, exports: Arc::default(), directory, rail_prober }
    }

    /// `session`'s descriptor, read from the directory (in P2P mode asked
    /// of the peer, by `by`) and checked.
    pub fn fetch_descriptor(&self, session: &str, by: Option<Instant>) -> Result<PeerDescriptor> {
        let port = self.settings.default_handshake_port;
        let ask =
            |addr: &SessionAddr| self.exchange_by(addr, FrameType::Metadata, self.own_descriptor().as_bytes(), by);
        let fetched = self
            .directory
            .descriptor(session, port, &ask)
            .map_err(|e| e.context(format!("cannot open session {session}")))?;
        // A descriptor without a data host means the session's host.
        let host = parse_session(session, port).map(|a| a.host).unwrap_or_else(|_| session.to_owned());
        descriptor::parse_descriptor(&fetched.body, session, &host).map_err(|e| match fetched.source.as_str() {
            "" => e,
            source => e.context(format!("{session} ({source})")),
        })
    }

    /// Where `segment`'s handshake port listens (its name in P2P mode,
    /// its `rpc_meta` in a store).
    pub fn rpc_address(&self, segment: &str) -> Result<SessionAddr> {
        self.directory.rpc_address(segment, self.settings.default_handshake_port)
    }

    /// This engine's rails (`PDX_TCP_RAILS`; empty: none).
    pub fn local_rails(&self) -> &[super::super::net::rails::LocalRail] {
        &self.identity.rails
    }

    /// The descriptor this engine sends about itself.
    pub fn own_descriptor(&self) -> String {
        descriptor::own(&self.identity, self.regions.advertised(), self.settings.handshake_max_len)
    }

    /// One handshake exchange: send `json` as a `kind` frame, return the reply
    /// body. The whole exchange (connect excluded) has one deadline, the
    /// handshake timeout or `by` if sooner. The connection is closed at once
    /// (Mooncake serves handshakes one at a time, so lingering would stall its
    /// other clients).
    ///
    /// A request that may be repeated (metadata, probe, connection) whose
    /// connection the target closed before any reply (a target shedding
    /// handshakes under a burst, or restarting) is sent again, up to
    /// [`HANDSHAKE_TRIES`] tries in all, after random pauses growing from
    /// tens to hundreds of milliseconds, all within the exchange's bound; the
    /// final error names every try and why it failed. A target that refuses
    /// for a reason (authentication, a malformed or wrong reply, a timeout)
    /// is not asked again.
    pub fn exchange_by(
        &self,
        addr: &SessionAddr,
        kind: FrameType,
        json: &[u8],
        by: Option<Instant>,
    ) -> Result<Vec<u8>> {
        let repeatable = matches!(kind, FrameType::Metadata | FrameType::Probe | FrameType::Connection);
        let bound = Instant::now() + self.settings.handshake_timeout;
        let bound = by.map_or(bound, |by| by.min(bound));
        let mut pause_ms = 20;
        let mut failures: Vec<String> = Vec::new();
        loop {
            let (e, closed) = match self.exchange_once(addr, kind, json, Some(bound)) {
                Ok(reply) => {
                    if !failures.is_empty() {
                        log::debug!(target: LOG_TARGET, "{}:{}: answered at try {}", addr.host, addr.port, failures.len() + 1);
                    }
                    return Ok(reply);
                }
                Err(failed) => failed,
            };
            failures.push(e.message().to_owned());
            let pause = Duration::from_millis(fastrand::u64(pause_ms / 2..=pause_ms));
            let again = closed
                && repeatable
                && failures.len() < HANDSHAKE_TRIES
                && !self.registry.stopping()
                && Instant::now() + pause < bound;
            if !again {
                return Err(tries_error(e, &failures));
            }
            log::debug!(target: LOG_TARGET, "{e}; asking again in {pause:?}");
            std::thread::sleep(pause);
            pause_ms = (pause_ms * 2).min(400);
        }
    }

    /// One [`exchange_by`](Self::exchange_by); the error says whether the
    /// connection was closed under the exchange (end of stream or reset
    /// before the whole reply).
    fn exchange_once(
        &self,
        addr: &SessionAddr,
        kind: FrameType,
        json: &[u8],
        by: Option<Instant>,
    ) -> std::result::Result<Vec<u8>, (Error, bool)> {
        let settings = &self.settings;
        let mut stream = connect_by(settings, &addr.host, addr.port, by).map_err(|e| (e, false))?;
        // Tracked so that stopping the engine interrupts a peer that never answers.
        let _tracked = self
            .registry
            .track(&stream)
            .ok_or_else(|| (Error::new(ErrorKind::Shutdown, "engine is shutting down"), false))?;
        let where_ = format!("handshake with {}:{}", addr.host, addr.port);
        let mut deadline = Instant::now() + settings.handshake_timeout;
        if let Some(by) = by {
            deadline = deadline.min(by);
        }
        let io_err = |e: std::io::Error| {
            use std::io::ErrorKind as Io;
            if self.registry.stopping() {
                return (Error::new(ErrorKind::Shutdown, format!("{where_}: engine is shutting down")), false);
            }
            if matches!(e.kind(), Io::WouldBlock | Io::TimedOut) {
                let e = Error::timeout(format!("{where_}: no complete reply within {:?}", settings.handshake_timeout));
                return (e, false);
            }
            let closed = matches!(e.kind(), Io::UnexpectedEof | Io::ConnectionReset | Io::BrokenPipe);
            (Error::new(ErrorKind::PeerUnreachable, format!("{where_}: {e}")), closed)
        };
        stream.set_nodelay(true).map_err(io_err)?;
        let mut bounded = BoundedStream::new(&mut stream, deadline);
        let frame = wire::encode_frame(kind, json);
        match &self.secret {
            // Mutual proof of the peer secret first (see [`super::super::protocol::auth`]).
            Some(secret) => super::super::protocol::auth::client_handshake(&mut bounded, secret, &frame, &where_)
                .map_err(|e| {
                    // Closed before any reply: as without a secret, but the
                    // kind the caller sees stays the one it always was.
                    let closed = e.kind() == ErrorKind::ConnectionLost;
                    let kind = if closed { ErrorKind::PeerUnreachable } else { e.kind() };
                    (Error::new(kind, e.message()), closed && !self.registry.stopping())
                })?,
            None => bounded.write_all(&frame).map_err(io_err)?,
        }
        let mut prefix = [0u8; 8];
        bounded.read_exact(&mut prefix).map_err(io_err)?;
        let length = wire::check_frame_length(prefix, settings.handshake_max_len)
            .map_err(|e| (Error::protocol(format!("{where_}: reply length refused ({e:?})")), false))?;
        let mut body = Vec::with_capacity(length.min(64 * 1024));
        (&mut bounded).take(length as u64).read_to_end(&mut body).map_err(io_err)?;
        if body.len() != length {
            return Err((Error::new(ErrorKind::ConnectionLost, format!("{where_}: reply truncated")), true));
        }
        if let Some(refusal) = super::super::protocol::auth::decode_frame_body(&body) {
            let why = refusal.error.unwrap_or_else(|| "it asked for authentication".to_owned());
            let e = Error::new(ErrorKind::PeerUnreachable, format!("{where_}: peer authentication failed: {why}"));
            return Err((e, false));
        }
        let (got, json) = wire::split_frame_body(&body);
        if got != kind {
            let e = Error::protocol(format!("{where_}: reply type {got:?} does not match request {kind:?}"));
            return Err((e, false));
        }
        Ok(json.to_vec())
    }

    /// Send a JSON request and parse the JSON reply (bounded by the handshake
    /// timeout).
    pub fn exchange_json(&self, addr: &SessionAddr, kind: FrameType, json: &[u8]) -> Result<Value> {
        let body = self.exchange_by(addr, kind, json, None)?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::protocol(format!("malformed JSON reply from {}:{}: {e}", addr.host, addr.port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_silent_resolver_is_cut_off_at_the_connect_timeout() {
        let t0 = Instant::now();
        let silent = |_: String, _: u16| {
            std::thread::sleep(Duration::from_secs(3));
            Ok(vec![])
        };
        let e = resolve_with("kv-node.example", 15000, Duration::from_millis(200), silent).unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), ErrorKind::PeerUnreachable);
        assert!(e.message().contains("no answer within the connect timeout"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        let answered = resolve_with("kv-node.example", 7, Duration::from_secs(5), |_, p| {
            Ok(vec![SocketAddr::from(([127, 0, 0, 1], p))])
        });
        assert_eq!(answered.unwrap(), vec![SocketAddr::from(([127, 0, 0, 1], 7))]);
        let literal = resolve_with("[::1]", 9, Duration::ZERO, |_, _| unreachable!("literals need no lookup"));
        assert_eq!(literal.unwrap(), vec![SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 9))]);
    }
}
