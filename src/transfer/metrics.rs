//! The Prometheus text exposition (format 0.0.4) of an engine's figures,
//! and the periodic metrics line: pure functions over a [`MetricsSnapshot`]
//! (no I/O, no clock), so what a scrape shows is tested against known
//! numbers.
//!
//! Every family is named `pdx_*` with its unit in the name (`_bytes`,
//! `_seconds`, `_total` for counters) and has `HELP` and `TYPE`. Per-peer
//! families appear only when asked for, for the busiest
//! [`MAX_PEER_SERIES`] peers at most (the same peers in every family), so
//! a scrape's size stays bounded however many peers an engine meets.

use std::fmt::Write as _;

use super::counter_index::{kind_label, FAILURE_KINDS};
use super::peer_stats::PeerSnapshot;
use super::stats::{HistogramSnapshot, StatsSnapshot};

/// Most distinct peers in one scrape's per-peer series.
pub const MAX_PEER_SERIES: usize = 100;

/// What one scrape shows.
#[derive(Debug, Clone)]
pub struct MetricsSnapshot {
    /// The path every task of this engine takes (`tcp` for the native
    /// engine; the protocol for Mooncake's).
    pub path: String,
    pub stats: StatsSnapshot,
    /// Task latency in µs and task size in bytes, by direction (write, read).
    pub latency_us: [HistogramSnapshot; 2],
    pub size_bytes: [HistogramSnapshot; 2],
    /// Inbound connections refused: address not allowed, not authenticated.
    pub refused_address: u64,
    pub refused_auth: u64,
    pub lanes_open: u64,
    pub tasks_queued: u64,
    /// Per-peer figures, when asked for (`PDX_METRICS_PER_PEER`).
    pub peers: Option<Vec<PeerSnapshot>>,
    /// Rails of multi-rail TCP (`PDX_TCP_RAILS`), as `(local->remote,
    /// up, bytes confirmed)`; empty without rails (no series then).
    pub rails: Vec<(String, bool, u64)>,
    /// The metadata directory: whether the store lacks this engine's latest
    /// keys (1: a publish failed and is retried), whether another engine
    /// took its name (1), and the publishes that failed.
    pub directory_behind: u64,
    pub directory_name_lost: u64,
    pub directory_publish_failures: u64,
}

/// Most rails the scrape names (the busiest).
pub(crate) const MAX_RAIL_SERIES: usize = 64;

impl MetricsSnapshot {
    /// A snapshot with counters only (a backend that keeps no histograms).
    pub fn from_stats(path: &str, stats: StatsSnapshot) -> MetricsSnapshot {
        use super::stats::{LATENCY_BOUNDS_US, SIZE_BOUNDS_BYTES};
        let empty = |bounds: &'static [u64]| HistogramSnapshot { bounds, counts: vec![0; bounds.len() + 1], sum: 0 };
        MetricsSnapshot {
            path: path.to_owned(),
            stats,
            latency_us: [empty(LATENCY_BOUNDS_US), empty(LATENCY_BOUNDS_US)],
            size_bytes: [empty(SIZE_BOUNDS_BYTES), empty(SIZE_BOUNDS_BYTES)],
            refused_address: 0,
            refused_auth: 0,
            lanes_open: 0,
            tasks_queued: 0,
            peers: None,
            rails: Vec::new(),
            directory_behind: 0,
            directory_name_lost: 0,
            directory_publish_failures: 0,
        }
    }
}

const DIRECTIONS: [&str; 2] = ["write", "read"];
/// The native engine's second path (its share of the completed tasks is
/// counted apart from `tcp`).
const SAME_HOST: &str = "same-host";

/// A label value with `\`, `"` and newlines escaped as the format asks.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

struct Text(String);

impl Text {
    /// Samples of `name` per direction (`totals`, write then read): under
    /// `path` what did not move over the same-host link, and for the native
    /// engine (`tcp`) also `same_host` under its own path.
    fn by_direction_and_path(&mut self, name: &str, path: &str, totals: [u64; 2], same_host: [u64; 2]) {
        for ((d, total), near) in DIRECTIONS.iter().zip(totals).zip(same_host) {
            self.sample(name, &[("direction", d), ("path", path)], total.saturating_sub(near));
            if path == "tcp" {
                self.sample(name, &[("direction", d), ("path", SAME_HOST)], near);
            }
        }
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// One metric with a single sample.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram's `_bucket` (cumulative), `_sum` and `_count` samples;
    /// bounds and sum divided by `divisor` (µs to seconds).
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot, divisor: f64) {
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = match h.bounds.get(i) {
                Some(&b) => format_float(b as f64 / divisor),
                None => "+Inf".to_owned(),
            };
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, format_float(h.sum as f64 / divisor));
        self.sample(&format!("{name}_count"), labels, cumulative);
    }
}

/// A float as the text format takes it (no exponent needed for our values).
fn format_float(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// The busiest `MAX_PEER_SERIES` peers (by bytes, then tasks; ties by name).
fn busiest(peers: &[PeerSnapshot]) -> Vec<&PeerSnapshot> {
    let mut sorted: Vec<&PeerSnapshot> = peers.iter().collect();
    sorted.sort_by(|a, b| b.busyness().cmp(&a.busyness()).then_with(|| a.session.cmp(&b.session)));
    sorted.truncate(MAX_PEER_SERIES);
    sorted
}

/// The exposition of `m` in the Prometheus text format 0.0.4.
pub fn render(m: &MetricsSnapshot) -> String {
    let s = &m.stats;
    let path = m.path.as_str();
    let mut t = Text(String::with_capacity(8192));
    t.family("pdx_engine_info", "gauge", "The engine: pdx version and the path its tasks take (always 1).");
    t.sample("pdx_engine_info", &[("version", env!("CARGO_PKG_VERSION")), ("path", path)], 1);

    t.family(
        "pdx_transferred_bytes_total",
        "counter",
        "Payload bytes of completed tasks this engine initiated, by direction and path.",
    );
    let same_host = [s.same_host_bytes_written, s.same_host_bytes_read];
    t.by_direction_and_path("pdx_transferred_bytes_total", path, [s.bytes_written, s.bytes_read], same_host);
    t.family(
        "pdx_tasks_completed_total",
        "counter",
        "Tasks this engine initiated that completed, by direction and path.",
    );
    let same_host = [s.same_host_tasks_written, s.same_host_tasks_read];
    t.by_direction_and_path("pdx_tasks_completed_total", path, [s.tasks_written, s.tasks_read], same_host);
    t.family("pdx_tasks_failed_total", "counter", "Tasks this engine initiated that failed, by kind of failure.");
    for (i, v) in s.failed_by_kind.iter().enumerate() {
        t.sample("pdx_tasks_failed_total", &[("kind", kind_label(i)), ("path", path)], v);
    }
    t.family("pdx_served_bytes_total", "counter", "Payload bytes peers wrote into or read from this engine.");
    for (d, v) in DIRECTIONS.iter().zip([s.served_bytes_written, s.served_bytes_read]) {
        t.sample("pdx_served_bytes_total", &[("direction", d)], v);
    }
    t.family("pdx_served_requests_total", "counter", "Requests of peers this engine served, by direction.");
    for (d, v) in DIRECTIONS.iter().zip([s.served_writes, s.served_reads]) {
        t.sample("pdx_served_requests_total", &[("direction", d)], v);
    }
    t.family(
        "pdx_served_refusals_total",
        "counter",
        "Requests of peers refused: range outside every registered region, or a device fault while serving.",
    );
    t.sample("pdx_served_refusals_total", &[("reason", "range")], s.requests_refused);
    t.sample("pdx_served_refusals_total", &[("reason", "device")], s.served_device_failures);
    t.single("pdx_handshakes_total", "counter", "Handshake requests answered.", s.handshakes);
    t.single("pdx_inbound_connections_total", "counter", "Inbound connections accepted.", s.inbound_connections);
    t.single(
        "pdx_inbound_connections_open",
        "gauge",
        "Inbound connections open now.",
        s.gauges.inbound_connections_open,
    );
    t.family(
        "pdx_inbound_connections_refused_total",
        "counter",
        "Inbound connections closed: from an address not allowed (closed unread), or not authenticated.",
    );
    t.sample("pdx_inbound_connections_refused_total", &[("reason", "address")], m.refused_address);
    t.sample("pdx_inbound_connections_refused_total", &[("reason", "auth")], m.refused_auth);
    t.single("pdx_peers_connected", "gauge", "Peers this engine knows now.", s.gauges.peers_connected);
    t.single(
        "pdx_notification_queued_bytes",
        "gauge",
        "Bytes of received notifications waiting to be drained.",
        s.gauges.notification_bytes_queued,
    );
    t.single("pdx_lanes_open", "gauge", "Data connections to peers open now (idle or in use).", m.lanes_open);
    t.single("pdx_tasks_queued", "gauge", "Tasks submitted and not yet finished.", m.tasks_queued);
    t.single(
        "pdx_directory_behind",
        "gauge",
        "1 while the metadata store lacks this engine's latest keys (a publish failed; retried in the background).",
        m.directory_behind,
    );
    t.single(
        "pdx_directory_name_lost",
        "gauge",
        "1 when another engine took this engine's name in the metadata store (it no longer publishes).",
        m.directory_name_lost,
    );
    t.single(
        "pdx_directory_publish_failures_total",
        "counter",
        "Publishes of this engine's keys to the metadata store that failed.",
        m.directory_publish_failures,
    );

    t.family(
        "pdx_task_latency_seconds",
        "histogram",
        "Time from submission to the end of each task (completed or failed), by direction and path.",
    );
    for (d, h) in DIRECTIONS.iter().zip(&m.latency_us) {
        t.histogram("pdx_task_latency_seconds", &[("direction", d), ("path", path)], h, 1e6);
    }
    t.family(
        "pdx_task_size_bytes",
        "histogram",
        "Requested size of each task (completed or failed), by direction and path.",
    );
    for (d, h) in DIRECTIONS.iter().zip(&m.size_bytes) {
        t.histogram("pdx_task_size_bytes", &[("direction", d), ("path", path)], h, 1.0);
    }

    if !m.rails.is_empty() {
        let mut rails: Vec<&(String, bool, u64)> = m.rails.iter().collect();
        rails.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        rails.truncate(MAX_RAIL_SERIES);
        t.family(
            "pdx_rail_transferred_bytes_total",
            "counter",
            "Payload bytes confirmed over each rail (local->remote address; the busiest rails only).",
        );
        for (rail, _, bytes) in &rails {
            t.sample("pdx_rail_transferred_bytes_total", &[("rail", rail)], *bytes);
        }
        t.family("pdx_rail_up", "gauge", "Whether each rail is up (1) or down or dropped (0).");
        for (rail, up, _) in &rails {
            t.sample("pdx_rail_up", &[("rail", rail)], u64::from(*up));
        }
    }

    if let Some(peers) = &m.peers {
        let top = busiest(peers);
        t.family(
            "pdx_peer_transferred_bytes_total",
            "counter",
            "Payload bytes of completed tasks to one peer (the busiest peers only), by direction.",
        );
        for p in &top {
            for (i, d) in DIRECTIONS.iter().enumerate() {
                t.sample("pdx_peer_transferred_bytes_total", &[("peer", &p.session), ("direction", d)], p.bytes[i]);
            }
        }
        t.family("pdx_peer_tasks_completed_total", "counter", "Completed tasks to one peer, by direction.");
        for p in &top {
            for (i, d) in DIRECTIONS.iter().enumerate() {
                t.sample("pdx_peer_tasks_completed_total", &[("peer", &p.session), ("direction", d)], p.tasks[i]);
            }
        }
        t.family("pdx_peer_tasks_failed_total", "counter", "Failed tasks to one peer.");
        for p in &top {
            t.sample("pdx_peer_tasks_failed_total", &[("peer", &p.session)], p.failed());
        }
        t.family("pdx_peer_tasks_queued", "gauge", "Tasks to one peer submitted and not yet finished.");
        for p in &top {
            t.sample("pdx_peer_tasks_queued", &[("peer", &p.session)], p.queued);
        }
    }
    t.0
}

/// The periodic metrics line: totals, and rates over the `seconds` since
/// `before` (the previous line's snapshot).
pub fn line(session: &str, before: &StatsSnapshot, now: &MetricsSnapshot, seconds: f64) -> String {
    let s = &now.stats;
    let rate = |a: u64, b: u64| if seconds > 0.0 { a.saturating_sub(b) as f64 / seconds } else { 0.0 };
    let mb = |a: u64, b: u64| rate(a, b) / 1e6;
    format!(
        "pdx metrics {session}: written {} B in {} tasks ({:.1} MB/s, {:.1} tasks/s); read {} B in {} tasks ({:.1} \
         MB/s, {:.1} tasks/s); failed {} ({} timeout); served {} B written, {} B read; refused {} requests, {} \
         connections; lanes open {}, tasks queued {}, inbound open {}; latency p50 {} us, p99 {} us",
        s.bytes_written,
        s.tasks_written,
        mb(s.bytes_written, before.bytes_written),
        rate(s.tasks_written, before.tasks_written),
        s.bytes_read,
        s.tasks_read,
        mb(s.bytes_read, before.bytes_read),
        rate(s.tasks_read, before.tasks_read),
        s.tasks_failed,
        s.failed_by_kind[0],
        s.served_bytes_written,
        s.served_bytes_read,
        s.requests_refused + s.served_device_failures,
        now.refused_address + now.refused_auth,
        now.lanes_open,
        now.tasks_queued,
        s.gauges.inbound_connections_open,
        s.latency_p50_us,
        s.latency_p99_us,
    )
}

const _: () = assert!(FAILURE_KINDS.len() + 1 == 7, "kind_label names seven kinds");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};
    use crate::transfer::stats::{Gauges, Stats};
    use crate::transfer::Direction;
    use std::time::Duration;

    fn sample_value(text: &str, line_prefix: &str) -> Option<String> {
        text.lines().find_map(|l| l.strip_prefix(line_prefix).map(|v| v.trim().to_owned()))
    }

    #[test]
    fn counters_and_histograms_of_a_known_workload() {
        let s = Stats::default();
        let peer = s.peers.entry("10.0.0.2:15000");
        s.tasks_submitted(&peer, 3);
        s.task_finished(&peer, Direction::Write, 1000, Duration::from_micros(70), Ok(1000));
        s.task_finished(&peer, Direction::Write, 5 << 20, Duration::from_millis(3), Ok(5 << 20));
        let e = Error::new(ErrorKind::RemoteRejected, "no");
        s.task_finished(&peer, Direction::Read, 64, Duration::from_millis(1), Err(&e));
        let (latency_us, size_bytes) = s.histogram_snapshots();
        let mut m = MetricsSnapshot::from_stats("tcp", s.snapshot(Gauges::default()));
        (m.latency_us, m.size_bytes) = (latency_us, size_bytes);
        let text = render(&m);
        let v = |p: &str| sample_value(&text, p).unwrap_or_else(|| panic!("no {p} in\n{text}"));
        assert_eq!(v("pdx_transferred_bytes_total{direction=\"write\",path=\"tcp\"}"), (1000 + (5 << 20)).to_string());
        assert_eq!(v("pdx_tasks_completed_total{direction=\"read\",path=\"tcp\"}"), "0");
        assert_eq!(v("pdx_tasks_failed_total{kind=\"remote_rejected\",path=\"tcp\"}"), "1");
        assert_eq!(v("pdx_task_latency_seconds_count{direction=\"write\",path=\"tcp\"}"), "2");
        assert_eq!(v("pdx_task_latency_seconds_bucket{direction=\"write\",path=\"tcp\",le=\"0.0001\"}"), "1");
        assert_eq!(v("pdx_task_latency_seconds_bucket{direction=\"write\",path=\"tcp\",le=\"+Inf\"}"), "2");
        assert_eq!(v("pdx_task_size_bytes_count{direction=\"read\",path=\"tcp\"}"), "1", "failed tasks count");
        assert_eq!(v("pdx_task_size_bytes_sum{direction=\"read\",path=\"tcp\"}"), "64.0");
        assert!(!text.contains("pdx_peer_"), "per-peer series only when asked");
        // Every family has HELP and TYPE, every sample a family.
        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        for f in &families {
            let name = f.split(' ').next().unwrap();
            assert!(name.starts_with("pdx_"));
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
            assert!(families.iter().any(|f| f.starts_with(&format!("{name} ")) || f.starts_with(&format!("{base} "))));
        }
    }

    #[test]
    fn rail_series_only_with_rails_and_bounded() {
        let mut m = MetricsSnapshot::from_stats("tcp", Stats::default().snapshot(Gauges::default()));
        assert!(!render(&m).contains("rail"), "no rails: the scrape is what it was");
        m.rails = (0..100u64).map(|i| (format!("10.0.1.1->10.0.2.{i}"), i != 99, i * 10)).collect();
        let text = render(&m);
        let v = |p: &str| sample_value(&text, p);
        assert_eq!(v("pdx_rail_transferred_bytes_total{rail=\"10.0.1.1->10.0.2.99\"}").as_deref(), Some("990"));
        assert_eq!(v("pdx_rail_up{rail=\"10.0.1.1->10.0.2.99\"}").as_deref(), Some("0"));
        assert_eq!(v("pdx_rail_up{rail=\"10.0.1.1->10.0.2.98\"}").as_deref(), Some("1"));
        assert_eq!(v("pdx_rail_up{rail=\"10.0.1.1->10.0.2.0\"}"), None, "only the busiest 64");
        assert_eq!(text.lines().filter(|l| l.starts_with("pdx_rail_up{")).count(), MAX_RAIL_SERIES);
    }

    #[test]
    fn per_peer_series_are_the_busiest_hundred_in_every_family() {
        let peers: Vec<PeerSnapshot> = (0..300u64)
            .map(|i| PeerSnapshot {
                session: format!("10.0.{}.{}:15000", i / 256, i % 256),
                bytes: [i * 10, 0],
                tasks: [i, 0],
                failed_by_kind: [0; 7],
                queued: 0,
                same_host_bytes: [0, 0],
                path: None,
                last_error: None,
            })
            .collect();
        let mut m = MetricsSnapshot::from_stats("tcp", StatsSnapshot::default());
        m.peers = Some(peers);
        let text = render(&m);
        let mut seen = std::collections::BTreeSet::new();
        for l in text.lines().filter(|l| l.starts_with("pdx_peer_")) {
            let peer = l.split("peer=\"").nth(1).unwrap().split('"').next().unwrap();
            seen.insert(peer.to_owned());
        }
        assert_eq!(seen.len(), MAX_PEER_SERIES);
        assert!(seen.contains("10.0.1.43:15000"), "the busiest (299) is in");
        assert!(!seen.contains("10.0.0.199:15000"), "the 101st busiest (199) is not");
    }

    /// README's table names every family a scrape can show.
    #[test]
    fn the_readme_names_every_family() {
        let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"));
        let readme = readme.unwrap();
        let mut m = MetricsSnapshot::from_stats("tcp", StatsSnapshot::default());
        m.peers = Some(Vec::new());
        for name in render(&m).lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = name.split(' ').next().unwrap();
            assert!(readme.contains(&format!("| `{name}` |")), "README's metrics table lacks {name}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(format_float(5e-5), "0.00005");
        assert_eq!(format_float(2.0), "2.0");
    }

    #[test]
    fn the_periodic_line_has_totals_and_rates() {
        let before = StatsSnapshot::default();
        let mut now = MetricsSnapshot::from_stats("tcp", StatsSnapshot::default());
        now.stats.bytes_written = 20_000_000;
        now.stats.tasks_written = 10;
        let l = line("h:1", &before, &now, 2.0);
        assert!(l.contains("written 20000000 B in 10 tasks (10.0 MB/s, 5.0 tasks/s)"), "{l}");
    }
}
