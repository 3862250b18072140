//! Engine tunables, captured once when an engine starts. Each honours
//! Mooncake's `MC_*` variable where one exists and has a `PDX_*` override
//! that wins; every variable is declared (type, range, default) in
//! [`crate::config::env`]. A malformed value never aborts: it is logged and
//! the next source or the default is used.

use std::time::Duration;

use super::protocol::wire::HANDSHAKE_MIN_LIMIT;
use crate::config::env::vars::*;
use crate::config::env::{read, read_choice, read_first, Env, ProcessEnv, Var};

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
    /// Initiate with protocol v1 only (`MC_TCP_PROTO=1`).
    pub force_v1: bool,
    /// How long a receive polls before blocking (0 = never poll).
    pub spin: Duration,
    /// Address the listeners bind to; `None` means the hostname's address.
    pub bind_address: Option<String>,
    /// Most entries in one batch (checked before anything is allocated).
    pub max_batch_entries: usize,
    /// Longest single request.
    pub max_request_bytes: u64,
    /// Bytes of received notifications (names and messages) kept until drained.
    pub notify_queue_bytes: usize,
    /// Inbound connections kept per peer address.
    pub max_connections_per_address: usize,
    /// Inbound data connections with no request for this long are closed.
    pub idle_timeout: Duration,
    /// Whether this engine offers and accepts the same-host link
    /// (`PDX_SAME_HOST`, `auto` unless `off`).
    pub same_host: bool,
    /// Cap on pinned host memory for staging device memory
    /// (`PDX_CUDA_STAGING_BYTES`).
    pub staging_bytes: usize,
    /// Per-peer series in the metrics (`PDX_METRICS_PER_PEER`).
    pub metrics_per_peer: bool,
    /// How often to log the metrics line (zero: never).
    pub metrics_interval: Duration,
    /// Who may connect (`PDX_ALLOWED_PEERS`), as given; parsed at start.
    pub allowed_peers: Option<String>,
    /// The shared secret's file (`PDX_PEER_SECRET_FILE`); read at start.
    pub peer_secret_file: Option<String>,
    /// Which interfaces carry lanes (`PDX_TCP_RAILS`: `auto` or a list);
    /// `None`: one address, as before (see `super::net::rails`).
    pub tcp_rails: Option<String>,
    /// Where peers are found (`PDX_METADATA_SERVER`; none: P2P handshake).
    pub metadata_server: Option<String>,
    /// `MC_METADATA_CLUSTER_ID`: the namespace of the metadata keys.
    pub metadata_cluster_id: Option<String>,
    /// etcd mode: the lease's time to live.
    pub metadata_lease_ttl: Duration,
    /// Bound on each metadata operation, retries included.
    pub metadata_timeout: Duration,
}

impl Settings {
    /// Read the tunables from the process environment.
    pub fn from_env() -> Settings {
        Self::from(&ProcessEnv)
    }

    /// Read the tunables from `env`: each from its `PDX_*` override, else
    /// Mooncake's `MC_*` name, else the default (see [`crate::config::env::vars`]).
    pub fn from(env: &dyn Env) -> Settings {
        let (mut min_port, mut max_port) = (
            read_first(env, &[PDX_MIN_PORT, MC_MIN_RPC_PORT, MC_MIN_PRC_PORT]).unwrap_or(15000),
            read_first(env, &[PDX_MAX_PORT, MC_MAX_RPC_PORT, MC_MAX_PRC_PORT]).unwrap_or(17000),
        );
        if min_port > max_port {
            log::warn!("port range {min_port}..{max_port} is empty; using 15000..17000");
            (min_port, max_port) = (15000, 17000);
        }
        let mut min_data_port = read(env, &PDX_MIN_DATA_PORT).unwrap_or(min_port);
        let mut max_data_port = read(env, &PDX_MAX_DATA_PORT).unwrap_or(max_port);
        if min_data_port > max_data_port {
            log::warn!("data port range {min_data_port}..{max_data_port} is empty; using {min_port}..{max_port}");
            (min_data_port, max_data_port) = (min_port, max_port);
        }
        let timeout = |vars: &[Var], default: u64| read_first(env, vars).unwrap_or(Duration::from_secs(default));
        Settings {
            min_port,
            max_port,
            min_data_port,
            max_data_port,
            force_v1: read_choice(env, &MC_TCP_PROTO).unwrap_or_else(|e| {
                log::warn!("{e}; using 2");
                None
            }) == Some("1"),
            handshake_max_len: read(env, &MC_HANDSHAKE_MAX_LENGTH).unwrap_or(HANDSHAKE_MIN_LIMIT),
            connect_timeout: timeout(&[PDX_CONNECT_TIMEOUT_MS, MC_HANDSHAKE_CONNECT_TIMEOUT], 5),
            handshake_timeout: timeout(&[PDX_HANDSHAKE_TIMEOUT_MS], 30),
            status_timeout: timeout(&[PDX_STATUS_TIMEOUT_MS, MC_TCP_STATUS_TIMEOUT_SEC], 30),
            progress_timeout: timeout(&[PDX_PROGRESS_TIMEOUT_MS, MC_TCP_PROGRESS_TIMEOUT_SEC], 30),
            lanes_per_peer: read_first(env, &[PDX_TCP_LANES, MC_TCP_LANES_PER_PEER, MC_TCP_MAX_CONNECTIONS_PER_PEER])
                .unwrap_or(4),
            lane_wait_timeout: timeout(&[PDX_LANE_WAIT_TIMEOUT_MS, MC_TRANSFER_TIMEOUT], 30),
            default_handshake_port: read(env, &MC_HANDSHAKE_PORT).unwrap_or(12001),
            max_data_connections: read(env, &PDX_MAX_DATA_CONNECTIONS).unwrap_or(4096),
            max_handshake_connections: read(env, &PDX_MAX_HANDSHAKE_CONNECTIONS).unwrap_or(64),
            max_queued_notifications: read(env, &PDX_MAX_QUEUED_NOTIFICATIONS).unwrap_or(65536),
            workers: read(env, &PDX_WORKERS).unwrap_or(8),
            spin: read(env, &PDX_SPIN_US).unwrap_or(Duration::from_micros(50)),
            bind_address: read(env, &PDX_BIND_ADDRESS),
            max_batch_entries: read(env, &PDX_MAX_BATCH_ENTRIES)
                .unwrap_or(crate::transfer::backend::DEFAULT_MAX_BATCH_ENTRIES),
            max_request_bytes: read(env, &PDX_MAX_REQUEST_BYTES).unwrap_or(1 << 40),
            notify_queue_bytes: read(env, &PDX_NOTIFY_QUEUE_BYTES).unwrap_or(8 << 20),
            max_connections_per_address: read(env, &PDX_MAX_CONNECTIONS_PER_ADDRESS).unwrap_or(256),
            idle_timeout: read(env, &PDX_IDLE_TIMEOUT_MS).unwrap_or(Duration::from_secs(300)),
            same_host: read_choice(env, &PDX_SAME_HOST).unwrap_or_else(|e| {
                log::warn!("{e}; using auto");
                None
            }) != Some("off"),
            staging_bytes: staging_bytes(env),
            metrics_per_peer: read(env, &PDX_METRICS_PER_PEER).unwrap_or(false),
            metrics_interval: read(env, &PDX_METRICS_INTERVAL_S).unwrap_or(Duration::ZERO),
            allowed_peers: read(env, &PDX_ALLOWED_PEERS),
            peer_secret_file: read(env, &PDX_PEER_SECRET_FILE),
            tcp_rails: read(env, &PDX_TCP_RAILS).filter(|s: &String| !s.trim().is_empty()),
            metadata_server: read(env, &PDX_METADATA_SERVER),
            metadata_cluster_id: read(env, &MC_METADATA_CLUSTER_ID),
            metadata_lease_ttl: Duration::from_secs(read(env, &PDX_METADATA_LEASE_TTL_S).unwrap_or(8)),
            metadata_timeout: read(env, &PDX_METADATA_TIMEOUT_MS).unwrap_or(Duration::from_secs(3)),
        }
    }
}

/// `PDX_CUDA_STAGING_BYTES` (or its engine option `cuda_staging_bytes`; both
/// take 0 and up): values below the smallest pool are raised to it, with a
/// warning.
fn staging_bytes(env: &dyn Env) -> usize {
    use super::memory::staging::{DEFAULT_STAGING_BYTES, MIN_STAGING_BYTES};
    let bytes = read(env, &PDX_CUDA_STAGING_BYTES).unwrap_or(DEFAULT_STAGING_BYTES);
    if bytes < MIN_STAGING_BYTES {
        log::warn!(
            "PDX_CUDA_STAGING_BYTES (or engine option cuda_staging_bytes) is {bytes}, below the minimum \
             {MIN_STAGING_BYTES}; using {MIN_STAGING_BYTES}"
        );
        return MIN_STAGING_BYTES;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;

    #[test]
    fn overrides_win_ranges_clamp_and_garbage_falls_through() {
        let env = MapEnv::from_pairs(&[
            ("PDX_CONNECT_TIMEOUT_MS", "250"),
            ("MC_HANDSHAKE_CONNECT_TIMEOUT", "9"),
            ("MC_TCP_STATUS_TIMEOUT_SEC", "2.5"),
            ("PDX_PROGRESS_TIMEOUT_MS", "soon"),
            ("MC_TCP_PROGRESS_TIMEOUT_SEC", "7"),
            ("MC_TCP_LANES_PER_PEER", "100"),
            ("MC_TRANSFER_TIMEOUT", "1"),
            ("MC_TCP_PROTO", "1"),
            ("PDX_SPIN_US", "0"),
            ("MC_MIN_RPC_PORT", "20000"),
            ("MC_MAX_RPC_PORT", "19000"),
        ]);
        let s = Settings::from(&env);
        assert_eq!(s.connect_timeout, Duration::from_millis(250));
        assert_eq!(s.status_timeout, Duration::from_millis(2500));
        assert_eq!(s.progress_timeout, Duration::from_secs(7), "an unparsable override falls through to MC_*");
        assert_eq!(s.lanes_per_peer, 64, "out of range: the nearest bound");
        assert_eq!(s.lane_wait_timeout, Duration::from_secs(5), "MC_TRANSFER_TIMEOUT's minimum is 5 s");
        assert!(s.force_v1);
        assert_eq!(s.spin, Duration::ZERO);
        assert_eq!((s.min_port, s.max_port), (15000, 17000), "an empty range gives the default one");
        let d = Settings::from(&MapEnv::new());
        assert_eq!(
            (d.connect_timeout, d.handshake_timeout, d.lanes_per_peer, d.workers),
            (Duration::from_secs(5), Duration::from_secs(30), 4, 8)
        );
        assert!(!d.force_v1);
        assert_eq!(d.bind_address, None);
    }

    /// Every `PDX_*` variable an engine reads at start is also an engine
    /// option (`MC_*` names are reached through the `PDX_*` option of the
    /// same setting), and the option reaches `Settings`.
    #[test]
    fn every_setting_is_an_engine_option() {
        use crate::config::engine_options::{option_key, EngineOptions, OptionsEnv, OPTION_VARS};
        let source = include_str!("settings.rs");
        let code = source.split("#[cfg(test)]").next().unwrap();
        let mut read: Vec<&str> = code
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("PDX_") && w.len() > 4)
            .collect();
        read.sort_unstable();
        read.dedup();
        assert!(read.len() > 15, "{read:?}");
        for name in read {
            assert!(OPTION_VARS.iter().any(|v| v.name == name), "{name} is read at engine start but is no option");
        }
        let mut o = EngineOptions::new();
        o.set(&option_key(&PDX_CUDA_STAGING_BYTES), Some("131072")).unwrap();
        o.set("notify_queue_bytes", Some("65536")).unwrap();
        let base = MapEnv::from_pairs(&[("PDX_CUDA_STAGING_BYTES", "999999")]);
        let s = Settings::from(&OptionsEnv { base: &base, options: &o });
        assert_eq!((s.staging_bytes, s.notify_queue_bytes), (131072, 65536));
    }

    /// One rule for the variable and the option: below the minimum is
    /// raised to it (the header's MIN_STAGING_BYTES says so).
    #[test]
    fn staging_bytes_below_the_minimum_are_raised_from_either_source() {
        use crate::config::engine_options::{EngineOptions, OptionsEnv};
        use crate::engine::memory::staging::MIN_STAGING_BYTES;
        for text in ["0", "1", "4096", "65535"] {
            let env = MapEnv::from_pairs(&[("PDX_CUDA_STAGING_BYTES", text)]);
            assert_eq!(Settings::from(&env).staging_bytes, MIN_STAGING_BYTES, "{text}");
            let mut o = EngineOptions::new();
            o.set("cuda_staging_bytes", Some(text)).unwrap();
            let s = Settings::from(&OptionsEnv { base: &MapEnv::new(), options: &o });
            assert_eq!(s.staging_bytes, MIN_STAGING_BYTES, "{text}");
        }
        let env = MapEnv::from_pairs(&[("PDX_CUDA_STAGING_BYTES", "+65537")]);
        assert_eq!(Settings::from(&env).staging_bytes, 65537);
    }
}
