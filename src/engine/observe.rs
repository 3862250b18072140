//! The native engine's figures for operators: the statistics snapshot with
//! its gauges, the metrics scrape ([`crate::transfer::metrics`]), one
//! peer's figures as JSON, and the periodic metrics line
//! (`PDX_METRICS_INTERVAL_S`).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::directory::Directory;
use super::initiator::peers::Peers;
use super::registry::Registry;
use super::server::Notifications;
use crate::error::{Error, Result};
use crate::transfer::metrics::{self, MetricsSnapshot};
use crate::transfer::stats::{kind_label, Gauges, Stats, StatsSnapshot};

/// The engine's main path (the same-host link is counted apart).
const PATH: &str = "tcp";

/// The parts of the engine's state the figures are read from.
pub(super) struct Sources<'a> {
    pub(super) stats: &'a Stats,
    pub(super) peers: &'a Peers,
    pub(super) notifications: &'a Notifications,
    /// Whether the scrape carries each peer's figures (`PDX_METRICS_PER_PEER`).
    pub(super) per_peer: bool,
}

pub(super) fn stats(from: &Sources<'_>) -> StatsSnapshot {
    from.stats.snapshot(Gauges {
        peers_connected: from.peers.len() as u64,
        inbound_connections_open: from.stats.inbound_open.load(Relaxed),
        notification_bytes_queued: from.notifications.queued_bytes() as u64,
    })
}

pub(super) fn metrics(from: &Sources<'_>) -> MetricsSnapshot {
    let s = from.stats;
    let mut m = MetricsSnapshot::from_stats(PATH, stats(from));
    (m.latency_us, m.size_bytes) = s.histogram_snapshots();
    m.refused_address = s.connections_refused_address.load(Relaxed);
    m.refused_auth = s.connections_refused_auth.load(Relaxed);
    m.lanes_open = from.peers.lanes_open();
    m.tasks_queued = s.tasks_queued.load(Relaxed);
    m.rails = from.peers.rail_samples();
    let standing = from.peers.dialer().directory.standing();
    m.directory_behind = u64::from(standing.behind);
    m.directory_name_lost = u64::from(standing.name_lost);
    m.directory_publish_failures = standing.publish_failures;
    if from.per_peer {
        m.peers = Some(s.peers.snapshots());
    }
    m
}

/// `session`'s figures: always `path` and `reason` (of its last data
/// connection); bytes and tasks each way (completed tasks; bytes also of
/// the same-host link), failures by kind, the last error and when (Unix
/// seconds), lanes open, tasks queued. `InvalidArgument` for a peer this
/// engine never sent to, or has forgotten (see
/// [`crate::transfer::peer_stats`]).
pub(super) fn peer_info(from: &Sources<'_>, session: &str) -> Result<Value> {
    let counted = from.stats.peers.get(session);
    let lanes = from.peers.lanes_open_to(session);
    if counted.is_none() && lanes.is_none() {
        return Err(Error::invalid_argument(format!(
            "{session}: no figures for this peer (never used, or forgotten: the engine keeps the {} most recently \
             active peers)",
            crate::transfer::peer_stats::MAX_PEERS_KEPT
        )));
    }
    let p = counted.unwrap_or_else(|| crate::transfer::peer_stats::PeerCounters::empty_snapshot(session));
    let rails = from.peers.cached(session).and_then(|peer| peer.rails().map(|set| set.info()));
    // The live peer's path, else the last one recorded.
    let (path, reason) = from
        .peers
        .cached(session)
        .map(|peer| peer.path.get())
        .or_else(|| p.path.clone())
        .unwrap_or(("tcp", "no data connection opened yet".to_owned()));
    let failures: Map<String, Value> =
        p.failed_by_kind.iter().enumerate().map(|(i, n)| (kind_label(i).to_owned(), json!(n))).collect();
    let (last_error, when) = match &p.last_error {
        Some((text, at)) => (json!(text), json!(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64())),
        None => (Value::Null, Value::Null),
    };
    let mut info = json!({
        "session": session,
        "path": path,
        "reason": reason,
        "bytes_written": p.bytes[0],
        "bytes_read": p.bytes[1],
        "same_host_bytes_written": p.same_host_bytes[0],
        "same_host_bytes_read": p.same_host_bytes[1],
        "tasks_written": p.tasks[0],
        "tasks_read": p.tasks[1],
        "tasks_failed": p.failed(),
        "failures": failures,
        "last_error": last_error,
        "last_error_unix_s": when,
        "lanes_open": lanes.unwrap_or(0),
        "tasks_queued": p.queued,
    });
    // Only a peer paired with rails has them (see `super::net::rails`).
    if let (Some(rails), Some(map)) = (rails, info.as_object_mut()) {
        map.insert("rails".to_owned(), rails);
    }
    Ok(info)
}

/// How this engine's entry in its directory stands, for `pdx_peer_info` of
/// its own name: the metadata mode, whether the store lacks its latest keys
/// (`behind`, put again in the background), whether another engine took
/// its name, and the failed publishes.
pub(super) fn directory_info(directory: &dyn Directory) -> Value {
    let s = directory.standing();
    json!({
        "metadata": directory.describe(),
        "behind": s.behind,
        "name_lost": s.name_lost,
        "publish_failures": s.publish_failures,
        "last_error": s.last_error,
    })
}

/// Log the metrics line of engine `session` every `interval` until
/// `registry` says the engine stops (checked every 100 ms, so stopping is
/// not held up).
pub(super) fn log_periodically(from: &Sources<'_>, registry: &Registry, session: &str, interval: Duration) {
    let mut before = stats(from);
    let mut since = Instant::now();
    loop {
        while since.elapsed() < interval {
            if registry.stopping() {
                return;
            }
            std::thread::sleep((interval - since.elapsed().min(interval)).min(Duration::from_millis(100)));
        }
        if registry.stopping() {
            return;
        }
        let now = metrics(from);
        log::info!("{}", metrics::line(session, &before, &now, since.elapsed().as_secs_f64()));
        before = now.stats;
        since = Instant::now();
    }
}
