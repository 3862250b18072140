//! Engine tunables. Each honours Mooncake's `MC_*` variable where one exists
//! and has a `PDX_*` override that wins. A malformed value never aborts: it
//! is logged and the default is used.

use std::time::Duration;

use super::wire::{HANDSHAKE_MAX_LIMIT, HANDSHAKE_MIN_LIMIT};

/// The tunables of one engine, read once at `Engine::start`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Range the handshake listener picks its port from.
    pub min_port: u16,
    pub max_port: u16,
    /// Range the data listener picks its port from (default: the same).
    pub min_data_port: u16,
    pub max_data_port: u16,
    /// Largest handshake frame accepted or sent.
    pub handshake_max_len: usize,
    /// Bound on connecting to a peer (handshake and data).
    pub connect_timeout: Duration,
    /// Bound on a whole handshake exchange after connecting.
    pub handshake_timeout: Duration,
    /// Bound on waiting for a v2 status frame.
    pub status_timeout: Duration,
    /// Sliding bound on payload progress in either direction.
    pub progress_timeout: Duration,
    /// Data connections per peer.
    pub lanes_per_peer: usize,
    /// Bound on waiting for a free lane.
    pub lane_wait_timeout: Duration,
    /// Handshake port for session names without a port.
    pub default_handshake_port: u16,
    /// Concurrent inbound data connections served.
    pub max_data_connections: usize,
    /// Concurrent inbound handshake connections served.
    pub max_handshake_connections: usize,
    /// Received notifications kept until drained; more are refused.
    pub max_queued_notifications: usize,
    /// Worker threads that run asynchronous and multi-lane work.
    pub workers: usize,
    /// Initiate with protocol v1 only; `None` reads `MC_TCP_PROTO` on every
    /// transfer, as Mooncake does.
    pub force_v1: Option<bool>,
    /// How long a receive polls before blocking (0 = never poll).
    pub spin: Duration,
    /// Address the listeners bind to; `None` means the hostname's address.
    pub bind_address: Option<String>,
    /// Cap on pinned host memory for staging device memory
    /// (`PDX_CUDA_STAGING_BYTES`; a K/M/G suffix is binary).
    pub staging_bytes: usize,
}

/// `123`, `64K`, `64M`, `1G` (binary multiples).
fn byte_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, shift) = match t.as_bytes().last()? {
        b'k' | b'K' => (&t[..t.len() - 1], 10),
        b'm' | b'M' => (&t[..t.len() - 1], 20),
        b'g' | b'G' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    digits.parse::<usize>().ok().and_then(|n| n.checked_mul(1usize << shift)).filter(|&n| n > 0)
}

fn raw(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// First set variable among `names`, parsed with `parse`; a bad value is
/// logged and skipped.
fn pick<T>(names: &[&str], parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    for name in names {
        if let Some(text) = raw(name) {
            match parse(text.trim()) {
                Some(v) => return Some(v),
                None => log::warn!("ignoring {name}={text:?}: not a valid value"),
            }
        }
    }
    None
}

fn secs(text: &str) -> Option<Duration> {
    text.parse::<f64>().ok().filter(|s| s.is_finite() && *s > 0.0 && *s < 1e7).map(Duration::from_secs_f64)
}

fn millis(text: &str) -> Option<Duration> {
    text.parse::<u64>().ok().filter(|&m| m > 0).map(Duration::from_millis)
}

/// A timeout from `PDX_<pdx>_MS` (milliseconds) or Mooncake's `mc` (seconds).
fn timeout(pdx_ms: &str, mc_secs: Option<&str>, default: Duration) -> Duration {
    pick(&[pdx_ms], millis).or_else(|| mc_secs.and_then(|n| pick(&[n], secs))).unwrap_or(default)
}

impl Settings {
    /// Read the tunables from the process environment.
    pub fn from_env() -> Settings {
        let port = |t: &str| t.parse::<u16>().ok().filter(|&p| p > 0);
        let mut min_port = pick(&["PDX_MIN_PORT", "MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT"], port).unwrap_or(15000);
        let mut max_port = pick(&["PDX_MAX_PORT", "MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT"], port).unwrap_or(17000);
        if min_port > max_port {
            log::warn!("port range {min_port}..{max_port} is empty; using 15000..17000");
            (min_port, max_port) = (15000, 17000);
        }
        let mut min_data_port = pick(&["PDX_MIN_DATA_PORT"], port).unwrap_or(min_port);
        let mut max_data_port = pick(&["PDX_MAX_DATA_PORT"], port).unwrap_or(max_port);
        if min_data_port > max_data_port {
            log::warn!("data port range {min_data_port}..{max_data_port} is empty; using {min_port}..{max_port}");
            (min_data_port, max_data_port) = (min_port, max_port);
        }
        let count = |lo: usize, hi: usize| move |t: &str| t.parse::<usize>().ok().filter(|n| (lo..=hi).contains(n));
        Settings {
            min_port,
            max_port,
            min_data_port,
            max_data_port,
            force_v1: None,
            handshake_max_len: pick(&["MC_HANDSHAKE_MAX_LENGTH"], count(HANDSHAKE_MIN_LIMIT, HANDSHAKE_MAX_LIMIT))
                .unwrap_or(HANDSHAKE_MIN_LIMIT),
            connect_timeout: timeout(
                "PDX_CONNECT_TIMEOUT_MS",
                Some("MC_HANDSHAKE_CONNECT_TIMEOUT"),
                Duration::from_secs(5),
            ),
            handshake_timeout: timeout("PDX_HANDSHAKE_TIMEOUT_MS", None, Duration::from_secs(30)),
            status_timeout: timeout(
                "PDX_STATUS_TIMEOUT_MS",
                Some("MC_TCP_STATUS_TIMEOUT_SEC"),
                Duration::from_secs(30),
            ),
            progress_timeout: timeout(
                "PDX_PROGRESS_TIMEOUT_MS",
                Some("MC_TCP_PROGRESS_TIMEOUT_SEC"),
                Duration::from_secs(30),
            ),
            lanes_per_peer: pick(
                &["PDX_TCP_LANES", "MC_TCP_LANES_PER_PEER", "MC_TCP_MAX_CONNECTIONS_PER_PEER"],
                count(1, 64),
            )
            .unwrap_or(4),
            lane_wait_timeout: timeout(
                "PDX_LANE_WAIT_TIMEOUT_MS",
                Some("MC_TRANSFER_TIMEOUT"),
                Duration::from_secs(30),
            ),
            default_handshake_port: pick(&["MC_HANDSHAKE_PORT"], port).unwrap_or(12001),
            max_data_connections: pick(&["PDX_MAX_DATA_CONNECTIONS"], count(1, 65536)).unwrap_or(512),
            max_handshake_connections: pick(&["PDX_MAX_HANDSHAKE_CONNECTIONS"], count(1, 4096)).unwrap_or(64),
            max_queued_notifications: pick(&["PDX_MAX_QUEUED_NOTIFICATIONS"], count(1, 1 << 24)).unwrap_or(65536),
            workers: pick(&["PDX_WORKERS"], count(1, 256)).unwrap_or(8),
            spin: pick(&["PDX_SPIN_US"], |t| t.parse::<u64>().ok().filter(|&u| u <= 10_000))
                .map(Duration::from_micros)
                .unwrap_or(Duration::from_micros(50)),
            bind_address: raw("PDX_BIND_ADDRESS").filter(|s| !s.is_empty()),
            staging_bytes: pick(&["PDX_CUDA_STAGING_BYTES"], byte_size)
                .unwrap_or(super::staging::DEFAULT_STAGING_BYTES),
        }
    }

    /// Whether initiators must use protocol v1 (`MC_TCP_PROTO=1`). Read on
    /// every transfer, as Mooncake does.
    pub fn force_v1(&self) -> bool {
        self.force_v1.unwrap_or_else(|| raw("MC_TCP_PROTO").is_some_and(|v| v.trim() == "1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_refuse_garbage() {
        assert_eq!(secs("2.5"), Some(Duration::from_millis(2500)));
        for bad in ["", "x", "-1", "0", "nan", "inf", "1e30"] {
            assert_eq!(secs(bad), None, "{bad}");
        }
        assert_eq!(millis("10"), Some(Duration::from_millis(10)));
        assert_eq!(millis("0"), None);
        assert_eq!(millis("-3"), None);
        assert_eq!(byte_size("64M"), Some(64 << 20));
        assert_eq!(byte_size("4096"), Some(4096));
        assert_eq!(byte_size("1g"), Some(1 << 30));
        for bad in ["", "M", "0", "-1", "1T", "99999999999999999999G"] {
            assert_eq!(byte_size(bad), None, "{bad}");
        }
    }
}
