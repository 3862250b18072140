//! Environment access with SGLang's `environ.py` parsing rules.
//!
//! Every rule reads the environment through the [`Env`] trait, so tests use a
//! private [`MapEnv`] and never race on the real process environment. The
//! process implementation, [`ProcessEnv`], serializes pdx's own reads and
//! writes under one process-wide lock.
//!
//! Parsing follows SGLang's `EnvField` family: a variable is read on every
//! call (no caching); unset gives the default; a value that does not parse
//! gives a warning `Invalid value for NAME: <reason>, using default "<default>"`
//! and the default.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::py;

/// Read access to an environment, plus the one write pdx ever makes
/// (`setdefault`).
pub trait Env: Send + Sync {
    /// The raw value of `name`, or `None` when unset. Values that are not
    /// valid UTF-8 are converted lossily (U+FFFD).
    fn var(&self, name: &str) -> Option<String>;

    /// Python's `os.environ.setdefault(name, value)`: set `name` to `value`
    /// only when it is absent. Returns the value that was already present
    /// (which is kept), or `None` when `value` was written.
    fn set_default(&self, name: &str, value: &str) -> Option<String>;
}

/// Serializes pdx's reads and writes of the process environment.
static PROCESS_ENV_LOCK: Mutex<()> = Mutex::new(());

/// The real process environment (`std::env`).
///
/// Writes happen under a process-wide lock shared with pdx's own reads.
/// Other code in the host that calls `getenv`/`setenv` directly does not
/// take that lock: a write concurrent with such a read is a data race in C
/// libraries. Hosts should therefore trigger pdx's writes (normalizing
/// `mooncake_tcp` arguments) before starting threads that read the
/// environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        if name.is_empty() || name.contains(['=', '\0']) {
            return None;
        }
        let _g = PROCESS_ENV_LOCK.lock();
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }

    fn set_default(&self, name: &str, value: &str) -> Option<String> {
        let _g = PROCESS_ENV_LOCK.lock();
        match std::env::var_os(name) {
            Some(existing) => Some(existing.to_string_lossy().into_owned()),
            None => {
                std::env::set_var(name, value);
                None
            }
        }
    }
}

/// An in-memory environment for tests and for callers that want to evaluate
/// rules against a hypothetical environment.
#[derive(Debug, Default)]
pub struct MapEnv {
    vars: Mutex<BTreeMap<String, String>>,
}

impl MapEnv {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// An environment holding `pairs`.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        let env = Self::new();
        for (k, v) in pairs {
            env.set(k, v);
        }
        env
    }

    /// Set `name` to `value` (overwriting).
    pub fn set(&self, name: &str, value: &str) {
        self.vars.lock().insert(name.to_owned(), value.to_owned());
    }

    /// Remove `name`.
    pub fn remove(&self, name: &str) {
        self.vars.lock().remove(name);
    }
}

impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.vars.lock().get(name).cloned()
    }

    fn set_default(&self, name: &str, value: &str) -> Option<String> {
        let mut vars = self.vars.lock();
        match vars.get(name) {
            Some(existing) => Some(existing.clone()),
            None => {
                vars.insert(name.to_owned(), value.to_owned());
                None
            }
        }
    }
}

/// A parsed environment value plus the warning SGLang would emit for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvValue<T> {
    /// The parsed value, or the default.
    pub value: T,
    /// `Some(text)` when the variable was set but did not parse.
    pub warning: Option<String>,
}

/// `EnvBool.parse`: lower-cased, not trimmed; `true 1 yes y` / `false 0 no n`.
/// The error is SGLang's reason text, `"<lowered>" is not a valid boolean value`.
pub fn parse_bool(value: &str) -> std::result::Result<bool, String> {
    let lowered = value.to_lowercase();
    match lowered.as_str() {
        "true" | "1" | "yes" | "y" => Ok(true),
        "false" | "0" | "no" | "n" => Ok(false),
        _ => Err(format!("\"{lowered}\" is not a valid boolean value")),
    }
}

/// `EnvInt.parse`: Python `int(value)`. The error is
/// `"<value>" is not a valid integer value`.
pub fn parse_int(value: &str) -> std::result::Result<i64, String> {
    py::parse_int(value).ok_or_else(|| format!("\"{value}\" is not a valid integer value"))
}

fn invalid(name: &str, reason: &str, default: &str) -> String {
    format!("Invalid value for {name}: {reason}, using default \"{default}\"")
}

/// Python's `str(bool)`.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// `EnvBool(default).get()`.
pub fn get_bool(env: &dyn Env, name: &str, default: bool) -> EnvValue<bool> {
    match env.var(name) {
        None => EnvValue { value: default, warning: None },
        Some(raw) => match parse_bool(&raw) {
            Ok(value) => EnvValue { value, warning: None },
            Err(reason) => EnvValue { value: default, warning: Some(invalid(name, &reason, py_bool(default))) },
        },
    }
}

/// `EnvInt(default).get()`; a `None` default renders as `None`.
pub fn get_int(env: &dyn Env, name: &str, default: Option<i64>) -> EnvValue<Option<i64>> {
    match env.var(name) {
        None => EnvValue { value: default, warning: None },
        Some(raw) => match parse_int(&raw) {
            Ok(v) => EnvValue { value: Some(v), warning: None },
            Err(reason) => {
                let shown = default.map_or_else(|| "None".to_owned(), |d| d.to_string());
                EnvValue { value: default, warning: Some(invalid(name, &reason, &shown)) }
            }
        },
    }
}

/// `EnvStr(default).get()`: the raw value, `""` kept; unset gives the default.
pub fn get_str(env: &dyn Env, name: &str, default: &str) -> String {
    env.var(name).unwrap_or_else(|| default.to_owned())
}

/// The type and range of a declared variable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ty {
    /// Only presence counts (any value, even empty).
    Presence,
    /// SGLang's `EnvBool` spellings.
    Bool,
    /// A decimal integer in `min..=max`.
    Int { min: i64, max: i64 },
    /// Seconds, decimals allowed, in `min..=max`.
    Seconds { min: f64, max: f64 },
    /// Whole milliseconds in `min..=max`.
    Millis { min: u64, max: u64 },
    /// Whole microseconds in `min..=max`.
    Micros { min: u64, max: u64 },
    /// Free text (a name, an address, a path, a device list).
    Text,
    /// One of the listed words.
    Choice(&'static [&'static str]),
}

/// One environment variable pdx reads: declared once, here, with its
/// meaning, type, range and default. Nothing else in pdx reads the
/// environment (a test checks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Var {
    pub name: &'static str,
    pub ty: Ty,
    /// The default as the README shows it.
    pub default: &'static str,
    pub meaning: &'static str,
}

macro_rules! vars {
    ($($id:ident: $ty:expr, $default:literal, $meaning:literal;)*) => {
        /// Every variable pdx reads.
        pub mod vars {
            use super::*;
            $(#[doc = $meaning] pub const $id: Var = Var { name: stringify!($id), ty: $ty, default: $default, meaning: $meaning };)*
            /// All of them, in declaration order.
            pub const ALL: &[Var] = &[$($id),*];
        }
    };
}

const SECONDS: Ty = Ty::Seconds { min: 0.001, max: 1e6 };
const MILLIS: Ty = Ty::Millis { min: 1, max: 1_000_000_000 };
const PORT: Ty = Ty::Int { min: 1, max: 65535 };

vars! {
    MC_FORCE_TCP: Ty::Presence, "unset",
        "Present (any value): every engine uses `tcp`. `mooncake_tcp` normalization sets it to `1` unless set.";
    MOONCAKE_PROTOCOL: Ty::Text, "rdma",
        "The transport of every engine initialized without an explicit protocol (`rdma`, `efa`, `tcp`, `ascend`, ...).";
    ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE: Ty::Bool, "false",
        "Ascend: protocol `ascend` and the `:port:npu_N` hostname suffix.";
    ASCEND_NPU_PHY_ID: Ty::Int { min: i64::MIN, max: i64::MAX }, "-1",
        "Ascend: physical NPU id of the hostname suffix (-1: the GPU id).";
    SGLANG_DISAGG_STAGING_BUFFER: Ty::Bool, "false",
        "SGLang's staging-buffer rule of argument normalization.";
    SGLANG_RUST_SERVER: Ty::Bool, "false",
        "SGLang's Rust server: under the `2026-09` and `2026-10` rules a prefill's bootstrap port moves to its api port.";
    SGLANG_MOONCAKE_CUSTOM_MEM_POOL: Ty::Text, "unset",
        "SGLang's Mooncake custom memory pool (`NVLINK`, `BAREX`, `INTRA_NODE_NVLINK`, `true` = `NVLINK`); NVLINK and BAREX are refused under `efa`.";
    PYTORCH_CUDA_ALLOC_CONF: Ty::Text, "unset",
        "PyTorch's allocator settings; `expandable_segments:True` is refused under `efa`.";
    PYTORCH_ALLOC_CONF: Ty::Text, "unset",
        "PyTorch's allocator settings (newer name); `expandable_segments:True` is refused under `efa`.";
    PDX_MIN_PORT: PORT, "15000", "Lowest listener port (wins over `MC_MIN_RPC_PORT`).";
    MC_MIN_RPC_PORT: PORT, "15000", "Lowest listener port.";
    MC_MIN_PRC_PORT: PORT, "15000", "Mooncake's misspelt alias of `MC_MIN_RPC_PORT`.";
    PDX_MAX_PORT: PORT, "17000", "Highest listener port (wins over `MC_MAX_RPC_PORT`).";
    MC_MAX_RPC_PORT: PORT, "17000", "Highest listener port.";
    MC_MAX_PRC_PORT: PORT, "17000", "Mooncake's misspelt alias of `MC_MAX_RPC_PORT`.";
    PDX_MIN_DATA_PORT: PORT, "the listener range", "Lowest data-listener port.";
    PDX_MAX_DATA_PORT: PORT, "the listener range", "Highest data-listener port.";
    MC_HANDSHAKE_PORT: PORT, "12001", "Handshake port of session names given without one.";
    MC_HANDSHAKE_MAX_LENGTH: Ty::Int { min: 1 << 20, max: 128 << 20 }, "1048576", "Largest handshake frame (bytes).";
    PDX_CONNECT_TIMEOUT_MS: MILLIS, "5000", "Connect bound (wins over `MC_HANDSHAKE_CONNECT_TIMEOUT`).";
    MC_HANDSHAKE_CONNECT_TIMEOUT: SECONDS, "5", "Connect bound.";
    PDX_HANDSHAKE_TIMEOUT_MS: MILLIS, "30000", "Bound on a handshake exchange after connecting.";
    PDX_STATUS_TIMEOUT_MS: MILLIS, "30000", "v2 acknowledgement bound (wins over `MC_TCP_STATUS_TIMEOUT_SEC`).";
    MC_TCP_STATUS_TIMEOUT_SEC: SECONDS, "30", "v2 acknowledgement bound.";
    PDX_PROGRESS_TIMEOUT_MS: MILLIS, "30000", "Sliding payload-progress bound (wins over `MC_TCP_PROGRESS_TIMEOUT_SEC`).";
    MC_TCP_PROGRESS_TIMEOUT_SEC: SECONDS, "30", "Sliding payload-progress bound.";
    PDX_TCP_LANES: Ty::Int { min: 1, max: 64 }, "4", "Data connections per peer (wins over `MC_TCP_LANES_PER_PEER`).";
    MC_TCP_LANES_PER_PEER: Ty::Int { min: 1, max: 64 }, "4", "Data connections per peer.";
    MC_TCP_MAX_CONNECTIONS_PER_PEER: Ty::Int { min: 1, max: 64 }, "4", "Alias of `MC_TCP_LANES_PER_PEER`.";
    PDX_LANE_WAIT_TIMEOUT_MS: MILLIS, "30000", "Wait for a free lane (wins over `MC_TRANSFER_TIMEOUT`).";
    MC_TRANSFER_TIMEOUT: Ty::Seconds { min: 5.0, max: 1e6 }, "30",
        "How long a transfer may wait: the native engine's lane wait, the Mooncake backend's sync deadline.";
    MC_TCP_PROTO: Ty::Choice(&["1", "2"]), "2", "`1`: initiate with data protocol v1.";
    PDX_MAX_DATA_CONNECTIONS: Ty::Int { min: 1, max: 65536 }, "4096", "Inbound data connections held at once (at most a quarter of RLIMIT_NOFILE in all).";
    PDX_MAX_HANDSHAKE_CONNECTIONS: Ty::Int { min: 1, max: 4096 }, "64", "Inbound handshake connections served at once.";
    PDX_MAX_QUEUED_NOTIFICATIONS: Ty::Int { min: 1, max: 1 << 24 }, "65536", "Received notifications kept until drained.";
    PDX_WORKERS: Ty::Int { min: 1, max: 256 }, "8", "Worker threads for asynchronous and multi-lane work.";
    PDX_SPIN_US: Ty::Micros { min: 0, max: 10_000 }, "50", "How long a receive polls before it sleeps (0: never).";
    PDX_BIND_ADDRESS: Ty::Text, "the hostname's address", "Where the listeners bind.";
    PDX_TCP_ENGINE: Ty::Choice(&["native", "mooncake"]), "native", "Which engine serves `tcp`.";
    PDX_MOONCAKE_LIB: Ty::Text, "libtransfer_engine.so", "Mooncake's Transfer Engine library (C API) to load.";
    PDX_FREE_BATCH_IN_FLIGHT: Ty::Choice(&["cancel", "busy"]), "cancel",
        "pdx's `libtransfer_engine.so`: `freeBatchID` of a batch with tasks in flight cancels them, waits until their local memory is untouched and frees it (`cancel`), or answers \"batch busy\" and keeps it, as Mooncake does (`busy`).";
    PDX_CUDA_LIB: Ty::Text, "libcuda.so.1", "The CUDA driver library to load (device memory; see docs/gpu.md).";
    PDX_CUDA_STAGING_BYTES: Ty::Int { min: 0, max: 1 << 40 }, "67108864",
        "Pinned host memory per engine for staging device memory (bytes); values below 65536 are raised to it, with a warning.";
    RUST_LOG: Ty::Text, "warn", "Log filter (`env_logger` syntax).";
    MOONCAKE_DEVICE: Ty::Text, "\"\"",
        "The device of an engine under the remote-instance rule (`device_source=remote_instance`) started without a device; read only then.";
    PDX_MAX_BATCH_ENTRIES: Ty::Int { min: 1, max: 1 << 30 }, "1048576",
        "Most entries in one batch; a larger batch is `PDX_ERR_INVALID_ARGUMENT` before anything is allocated.";
    PDX_MAX_REQUEST_BYTES: Ty::Int { min: 1, max: 1 << 56 }, "1099511627776",
        "Longest single request (bytes); also never longer than the largest region the peer advertised.";
    PDX_NOTIFY_QUEUE_BYTES: Ty::Int { min: 4096, max: 1 << 34 }, "8388608",
        "Bytes of received notifications kept until drained; a notification over it is refused.";
    PDX_MAX_CONNECTIONS_PER_ADDRESS: Ty::Int { min: 1, max: 65536 }, "256",
        "Inbound connections kept per peer address; past it that address's least recently used idle one is closed.";
    PDX_METRICS_PER_PEER: Ty::Bool, "false",
        "`pdx_engine_metrics` adds series per peer, labelled by session name, for the 100 busiest peers.";
    PDX_METRICS_INTERVAL_S: Ty::Seconds { min: 0.0, max: 86400.0 }, "0 (off)",
        "Log one line of totals and rates at info level every this many seconds (0: never).";
    PDX_ALLOWED_PEERS: Ty::Text, "any address",
        "Comma list of IPv4/IPv6 addresses and CIDR blocks; an inbound connection from elsewhere is closed unread.";
    PDX_PEER_SECRET_FILE: Ty::Text, "unset (no authentication)",
        "Regular file with a shared secret (32 bytes to 16 KiB, not readable by group or others): pdx peers authenticate every handshake and data connection; Mooncake peers are refused.";
    PDX_IDLE_TIMEOUT_MS: Ty::Millis { min: 500, max: 600_000 }, "300000",
        "Inbound data connections with no request for this long are closed (an initiator reconnects unseen).";
    PDX_SAME_HOST: Ty::Choice(&["auto", "off"]), "auto",
        "`auto`: two pdx engines on one host move bytes with one cross-process copy instead of TCP; `off` (on either side): TCP.";
    PDX_TCP_RAILS: Ty::Text, "unset (one address)",
        "`auto`: every interface that is up, not loopback and has an address carries lanes to pdx peers that advertise rails; or a comma list of interface names or local addresses (see docs/real-traffic.md).";
    PDX_METADATA_SERVER: Ty::Text, "P2PHANDSHAKE",
        "Where peers are found: `P2PHANDSHAKE`, Mooncake's HTTP metadata server (`http://host:port/metadata`), or etcd (`etcd://h:p[,h:p]` or a bare `h:p[,h:p]`; `;` separates endpoints too, as in Mooncake).";
    MC_METADATA_CLUSTER_ID: Ty::Text, "unset",
        "Namespace of the metadata keys: `mooncake/<id>/…` instead of `mooncake/…` (HTTP and etcd modes).";
    PDX_METADATA_LEASE_TTL_S: Ty::Int { min: 2, max: 300 }, "8",
        "etcd mode: seconds a killed engine's keys outlive it (the lease's time to live; kept alive every third of it).";
    PDX_METADATA_TIMEOUT_MS: Ty::Millis { min: 100, max: 60_000 }, "3000",
        "Bound on each metadata operation (HTTP and etcd modes): connects, answers and the retries of an etcd cluster's passing answers (an election) together.";
}

/// The names SGLang's rules use (the declarations' names).
pub mod names {
    use super::vars;
    pub(crate) const MC_FORCE_TCP: &str = vars::MC_FORCE_TCP.name;
    pub(crate) const MOONCAKE_PROTOCOL: &str = vars::MOONCAKE_PROTOCOL.name;
    pub(crate) const ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE: &str = vars::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE.name;
    pub(crate) const ASCEND_NPU_PHY_ID: &str = vars::ASCEND_NPU_PHY_ID.name;
    pub(crate) const SGLANG_DISAGG_STAGING_BUFFER: &str = vars::SGLANG_DISAGG_STAGING_BUFFER.name;
    pub(crate) const SGLANG_RUST_SERVER: &str = vars::SGLANG_RUST_SERVER.name;
    pub(crate) const MOONCAKE_DEVICE: &str = vars::MOONCAKE_DEVICE.name;
    pub(crate) const SGLANG_MOONCAKE_CUSTOM_MEM_POOL: &str = vars::SGLANG_MOONCAKE_CUSTOM_MEM_POOL.name;
    pub(crate) const PYTORCH_CUDA_ALLOC_CONF: &str = vars::PYTORCH_CUDA_ALLOC_CONF.name;
    pub(crate) const PYTORCH_ALLOC_CONF: &str = vars::PYTORCH_ALLOC_CONF.name;
}

/// The variables read under SGLang's rules (`get_bool`, `get_int`,
/// `get_str`) rather than pdx's own readers ([`FromVar`], [`read_choice`]).
const SGLANG_RULES: &[&str] = &[
    names::MC_FORCE_TCP,
    names::MOONCAKE_PROTOCOL,
    names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE,
    names::ASCEND_NPU_PHY_ID,
    names::SGLANG_DISAGG_STAGING_BUFFER,
    names::SGLANG_RUST_SERVER,
    names::MOONCAKE_DEVICE,
    names::SGLANG_MOONCAKE_CUSTOM_MEM_POOL,
    names::PYTORCH_CUDA_ALLOC_CONF,
    names::PYTORCH_ALLOC_CONF,
];

/// A variable's value as its reader understands it, before any range check.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// [`Ty::Int`].
    Int(i64),
    /// [`Ty::Seconds`].
    Seconds(f64),
    /// [`Ty::Millis`] and [`Ty::Micros`].
    Whole(u64),
    /// Everything else, as the reader keeps it.
    Text(String),
}

/// Seconds as pdx reads them: plain decimal notation, an optional sign,
/// digits with at most one `.` (`30`, `7.5`, `.5`); no exponent, no
/// `inf`/`nan`.
fn parse_seconds(text: &str) -> Option<f64> {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    let digits = body.bytes().filter(u8::is_ascii_digit).count();
    let dots = body.bytes().filter(|&b| b == b'.').count();
    if digits == 0 || dots > 1 || digits + dots != body.len() {
        return None;
    }
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// What `var`'s reader makes of the raw text `raw`, before range checks:
/// `None` where it would ignore the text (it does not parse; for pdx's own
/// readers also empty text, which counts as unset). The engine options
/// accept exactly these forms, so an option and its variable take the same
/// texts. pdx's readers trim surrounding whitespace; integers are decimal
/// with an optional sign (`+5` and `05` are 5), whole numbers the same
/// without `-`; seconds as [`parse_seconds`] says. Variables under SGLang's
/// rules take SGLang's forms (Python's `int()`, `EnvBool`, raw text).
pub fn parse_as_read(var: &Var, raw: &str) -> Option<Parsed> {
    if SGLANG_RULES.contains(&var.name) {
        return match var.ty {
            Ty::Int { .. } => py::parse_int(raw).map(Parsed::Int),
            Ty::Bool => parse_bool(raw).ok().map(|b| Parsed::Text(if b { "true" } else { "false" }.to_owned())),
            _ => Some(Parsed::Text(raw.to_owned())),
        };
    }
    let text = raw.trim();
    if text.is_empty() {
        return None;
    }
    match var.ty {
        Ty::Presence => Some(Parsed::Text(raw.to_owned())),
        Ty::Bool => parse_bool(raw).ok().map(|b| Parsed::Text(if b { "true" } else { "false" }.to_owned())),
        Ty::Int { .. } => text.parse::<i64>().ok().map(Parsed::Int),
        Ty::Seconds { .. } => parse_seconds(text).map(Parsed::Seconds),
        Ty::Millis { .. } | Ty::Micros { .. } => text.parse::<u64>().ok().map(Parsed::Whole),
        Ty::Text => Some(Parsed::Text(text.to_owned())),
        Ty::Choice(words) => words.iter().find(|w| **w == text).map(|w| Parsed::Text((*w).to_owned())),
    }
}

impl Parsed {
    /// Whether the value lies in `ty`'s declared range (text always does).
    pub fn in_range(&self, ty: Ty) -> bool {
        match (self, ty) {
            (Parsed::Int(v), Ty::Int { min, max }) => (min..=max).contains(v),
            (Parsed::Seconds(v), Ty::Seconds { min, max }) => (min..=max).contains(v),
            (Parsed::Whole(v), Ty::Millis { min, max } | Ty::Micros { min, max }) => (min..=max).contains(v),
            (Parsed::Text(_), _) => true,
            _ => false,
        }
    }

    /// The value in its one normal spelling (`+05` → `5`, `7.50` → `7.5`),
    /// which its reader takes back to the same value.
    pub fn normal_text(&self) -> String {
        match self {
            Parsed::Int(v) => v.to_string(),
            Parsed::Seconds(v) => v.to_string(),
            Parsed::Whole(v) => v.to_string(),
            Parsed::Text(t) => t.clone(),
        }
    }
}

/// A value pdx reads for itself (not under SGLang's rules): unset or empty
/// gives `None`; a value that does not parse is a warning and `None` (the
/// next source or the default applies); a value out of range is a warning
/// naming the variable and the value used instead (the nearest bound).
pub trait FromVar: Sized {
    fn from_var(env: &dyn Env, var: &Var) -> Option<Self>;
}

fn present(env: &dyn Env, var: &Var) -> Option<String> {
    env.var(var.name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// A reader used on a variable of another type: a pdx bug, which the
/// declaration tests catch; never a panic at run time.
fn misdeclared<T>(var: &Var, as_what: &str) -> Option<T> {
    debug_assert!(false, "{} is read as {as_what} but declared {:?}", var.name, var.ty);
    log::error!("pdx bug: {} is read as {as_what} but declared {:?}; ignoring it", var.name, var.ty);
    None
}

fn unparsable(var: &Var, text: &str, what: &str) {
    log::warn!("ignoring {}={text:?}: not {what}", var.name);
}

fn clamp_warn<T: PartialOrd + Copy + std::fmt::Display>(var: &Var, text: &str, v: T, min: T, max: T) -> T {
    let used = if v < min {
        min
    } else if v > max {
        max
    } else {
        return v;
    };
    log::warn!("{}={text:?} is outside {min}..={max}; using {used}", var.name);
    used
}

impl FromVar for i64 {
    fn from_var(env: &dyn Env, var: &Var) -> Option<i64> {
        let text = present(env, var)?;
        let Ty::Int { min, max } = var.ty else { return misdeclared(var, "an integer") };
        match parse_as_read(var, &text) {
            Some(Parsed::Int(v)) => Some(clamp_warn(var, &text, v, min, max)),
            _ => {
                unparsable(var, &text, "an integer");
                None
            }
        }
    }
}

macro_rules! narrow_int {
    ($($t:ty),*) => {$(
        impl FromVar for $t {
            fn from_var(env: &dyn Env, var: &Var) -> Option<$t> {
                // Declared ranges lie inside the type, so the conversion holds.
                i64::from_var(env, var).and_then(|v| <$t>::try_from(v).ok())
            }
        }
    )*};
}
narrow_int!(u16, u64, usize);

impl FromVar for std::time::Duration {
    fn from_var(env: &dyn Env, var: &Var) -> Option<std::time::Duration> {
        use std::time::Duration;
        let text = present(env, var)?;
        match var.ty {
            Ty::Seconds { min, max } => match parse_as_read(var, &text) {
                Some(Parsed::Seconds(v)) => Some(Duration::from_secs_f64(clamp_warn(var, &text, v, min, max))),
                _ => {
                    unparsable(var, &text, "a number of seconds (decimal notation)");
                    None
                }
            },
            Ty::Millis { min, max } | Ty::Micros { min, max } => match parse_as_read(var, &text) {
                Some(Parsed::Whole(v)) => {
                    let v = clamp_warn(var, &text, v, min, max);
                    Some(if matches!(var.ty, Ty::Millis { .. }) {
                        Duration::from_millis(v)
                    } else {
                        Duration::from_micros(v)
                    })
                }
                _ => {
                    unparsable(var, &text, "a whole number");
                    None
                }
            },
            _ => misdeclared(var, "a duration"),
        }
    }
}

impl FromVar for bool {
    fn from_var(env: &dyn Env, var: &Var) -> Option<bool> {
        let text = present(env, var)?;
        let Ty::Bool = var.ty else { return misdeclared(var, "a boolean") };
        match parse_bool(&text) {
            Ok(b) => Some(b),
            Err(_) => {
                unparsable(var, &text, "a boolean (true, 1, yes, y, false, 0, no, n)");
                None
            }
        }
    }
}

impl FromVar for String {
    fn from_var(env: &dyn Env, var: &Var) -> Option<String> {
        present(env, var)
    }
}

/// Read `var` as `T` (see [`FromVar`]).
pub fn read<T: FromVar>(env: &dyn Env, var: &Var) -> Option<T> {
    T::from_var(env, var)
}

/// The first of `vars` that is set and valid.
pub fn read_first<T: FromVar>(env: &dyn Env, vars: &[Var]) -> Option<T> {
    vars.iter().find_map(|v| read(env, v))
}

/// A [`Ty::Choice`] variable: its word, `None` when unset or empty, an
/// `InvalidValue` error naming the allowed words otherwise.
pub fn read_choice(env: &dyn Env, var: &Var) -> crate::Result<Option<&'static str>> {
    let Ty::Choice(words) = var.ty else { return Ok(misdeclared(var, "a choice")) };
    let Some(text) = present(env, var) else { return Ok(None) };
    words.iter().find(|w| **w == text).map(|w| Some(*w)).ok_or_else(|| {
        crate::Error::new(
            crate::ErrorKind::InvalidValue,
            format!("{}={text:?} is not one of: {}", var.name, words.join(", ")),
        )
    })
}

fn describe(ty: Ty) -> String {
    match ty {
        Ty::Presence => "presence".to_owned(),
        Ty::Bool => "boolean".to_owned(),
        Ty::Int { min: i64::MIN, .. } => "integer".to_owned(),
        Ty::Int { min, max } => format!("integer {min}..={max}"),
        Ty::Seconds { min, max } => format!("seconds {min}..={max}"),
        Ty::Millis { min, max } => format!("ms {min}..={max}"),
        Ty::Micros { min, max } => format!("µs {min}..={max}"),
        Ty::Text => "text".to_owned(),
        Ty::Choice(words) => words.join(" \\| "),
    }
}

/// The README's table of every variable, generated from the declarations.
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | type | default | meaning |\n|---|---|---|---|\n");
    for v in vars::ALL {
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", v.name, describe(v.ty), v.default, v.meaning));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_spellings_case_insensitive_without_trimming() {
        for t in ["true", "TRUE", "1", "yes", "Y", "y"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["false", "False", "0", "no", "N"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        assert_eq!(parse_bool(" 1").unwrap_err(), "\" 1\" is not a valid boolean value");
        assert_eq!(parse_bool("On").unwrap_err(), "\"on\" is not a valid boolean value");
        assert_eq!(parse_bool("").unwrap_err(), "\"\" is not a valid boolean value");
    }

    #[test]
    fn invalid_bool_warns_and_uses_default() {
        let env = MapEnv::from_pairs(&[("B", " 1"), ("C", "yes")]);
        let got = get_bool(&env, "B", false);
        assert!(!got.value);
        assert_eq!(
            got.warning.as_deref(),
            Some("Invalid value for B: \" 1\" is not a valid boolean value, using default \"False\"")
        );
        assert_eq!(get_bool(&env, "C", false), EnvValue { value: true, warning: None });
        assert_eq!(get_bool(&env, "UNSET", true), EnvValue { value: true, warning: None });
    }

    #[test]
    fn int_rules() {
        let env = MapEnv::from_pairs(&[("I", " 3 "), ("J", "x"), ("K", "1_0")]);
        assert_eq!(get_int(&env, "I", Some(-1)).value, Some(3));
        assert_eq!(get_int(&env, "K", Some(-1)).value, Some(10));
        let bad = get_int(&env, "J", Some(-1));
        assert_eq!(bad.value, Some(-1));
        assert_eq!(
            bad.warning.as_deref(),
            Some("Invalid value for J: \"x\" is not a valid integer value, using default \"-1\"")
        );
        let bad_none = get_int(&env, "J", None);
        assert_eq!(bad_none.value, None);
        assert!(bad_none.warning.unwrap().ends_with("using default \"None\""));
        assert_eq!(get_int(&env, "UNSET", None).value, None);
    }

    #[test]
    fn str_keeps_empty_and_raw() {
        let env = MapEnv::from_pairs(&[("S", ""), ("T", " RDMA ")]);
        assert_eq!(get_str(&env, "S", "rdma"), "");
        assert_eq!(get_str(&env, "T", "rdma"), " RDMA ");
        assert_eq!(get_str(&env, "UNSET", "rdma"), "rdma");
    }

    #[test]
    fn map_env_setdefault() {
        let env = MapEnv::from_pairs(&[("KEEP", "0")]);
        assert_eq!(env.set_default("KEEP", "1"), Some("0".to_owned()));
        assert_eq!(env.var("KEEP").as_deref(), Some("0"));
        assert_eq!(env.set_default("NEW", "1"), None);
        assert_eq!(env.var("NEW").as_deref(), Some("1"));
    }

    #[test]
    fn process_env_setdefault_on_a_private_name() {
        // A name no other test uses, so this does not race with anything.
        let name = "PDX_TEST_PROCESS_ENV_SETDEFAULT_7F3A";
        assert_eq!(ProcessEnv.var(name), None);
        assert_eq!(ProcessEnv.set_default(name, "1"), None);
        assert_eq!(ProcessEnv.var(name).as_deref(), Some("1"));
        assert_eq!(ProcessEnv.set_default(name, "2"), Some("1".to_owned()));
        assert_eq!(ProcessEnv.var(name).as_deref(), Some("1"));
        assert_eq!(ProcessEnv.var("BAD=NAME"), None);
    }

    #[test]
    fn declarations_are_unique_and_typed_readers_match() {
        let mut seen = std::collections::HashSet::new();
        for v in vars::ALL {
            assert!(seen.insert(v.name), "{} declared twice", v.name);
            assert!(!v.meaning.is_empty() && !v.default.is_empty(), "{}", v.name);
        }
        let env = MapEnv::from_pairs(&[("PDX_TCP_LANES", "0"), ("PDX_SPIN_US", "x"), ("PDX_TCP_ENGINE", "fast")]);
        assert_eq!(read::<usize>(&env, &vars::PDX_TCP_LANES), Some(1), "clamped to the range");
        assert_eq!(read::<std::time::Duration>(&env, &vars::PDX_SPIN_US), None, "garbage is ignored");
        let e = read_choice(&env, &vars::PDX_TCP_ENGINE).unwrap_err();
        assert_eq!(e.message(), "PDX_TCP_ENGINE=\"fast\" is not one of: native, mooncake");
        assert_eq!(read_choice(&MapEnv::new(), &vars::PDX_TCP_ENGINE).unwrap(), None);
    }

    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every variable is read here and only here: no other non-test source of
    /// the workspace calls `std::env::var`/`var_os`/`vars` or `getenv`, and
    /// every declared variable is used by some reader.
    #[test]
    fn nothing_else_reads_the_environment() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ["src", "mooncake-sys/src", "mooncake-c/src", "cuda-sys/src", "pdx-bench/src"] {
            if root.join(dir).is_dir() {
                sources(&root.join(dir), &mut files);
            }
        }
        let this = root.join("src/config/env.rs");
        let mut used = String::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            if *f != this {
                for pattern in
                    ["env::var(", "env::var_os(", "env::vars(", "env::vars_os(", "libc::getenv", "env_logger::Env"]
                {
                    assert!(
                        !code.contains(pattern),
                        "{} reads the environment ({pattern}) outside config::env",
                        f.display()
                    );
                }
                used.push_str(code);
            }
        }
        for v in vars::ALL {
            assert!(used.contains(v.name), "{} is declared but nothing reads it", v.name);
        }
    }

    /// The README's table is the declarations, rendered
    /// (`PDX_BLESS_README=1 cargo test` rewrites it).
    #[test]
    fn readme_table_lists_every_variable() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = ("<!-- env-table:begin -->\n", "<!-- env-table:end -->");
        let start = readme.find(begin).expect("README has no env-table:begin marker") + begin.len();
        let stop = readme[start..].find(end).expect("README has no env-table:end marker") + start;
        let table = markdown_table();
        if readme[start..stop] != table {
            if std::env::var_os("PDX_BLESS_README").is_some() {
                std::fs::write(&path, format!("{}{table}{}", &readme[..start], &readme[stop..])).unwrap();
                return;
            }
            panic!("README's variable table is stale: run PDX_BLESS_README=1 cargo test --lib readme_table");
        }
    }
}
