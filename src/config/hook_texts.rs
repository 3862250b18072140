//! The texts SGLang's `handle_pd_disaggregation` emits, shared by every
//! rule set ([`super::rules`] and [`super::rules_2026_10`]), and what a hook
//! run produces besides its mutations ([`HookOutcome`]).

use super::message::Message;
use super::py;
use crate::error::{Error, ErrorKind};

/// INFO line of the `mooncake_tcp` alias (always says `=1`).
pub const MOONCAKE_TCP_INFO: &str =
    "disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 (TCP transport, no RDMA)";
/// ValueError: decode radix cache with HiSparse.
pub const RADIX_HISPARSE: &str = "--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse";
/// ValueError (2026-07 rules): decode radix cache with the fake backend.
pub const RADIX_FAKE: &str =
    "--disaggregation-decode-enable-radix-cache is incompatible with --disaggregation-transfer-backend fake";
/// WARNING: decode radix cache with DP attention.
pub const RADIX_DP_WARNING: &str =
    "EXPERIMENTAL: Decode radix cache with DP attention. Requires prefix-aware DP rank routing for optimal cache hits.";
/// WARNING: decode radix cache enabled.
pub const RADIX_ENABLED_WARNING: &str = "EXPERIMENTAL: Radix cache is enabled for decode server";
/// WARNING: decode forced to chunk cache.
pub const CHUNK_CACHE_WARNING: &str = "KV cache is forced as chunk cache for decode server";
/// WARNING (default rules): mamba `extra_buffer` fallback.
pub const MAMBA_FALLBACK_WARNING: &str =
    "Mamba extra_buffer is disabled because decode disaggregation currently forces chunk cache. Falling back to no_buffer.";
/// AssertionError: prefill with the fake backend.
pub const PREFILL_FAKE: &str = "Prefill server does not support 'fake' as the transfer backend";

/// WARNING (2026-09 rules): a prefill server with `dcp_size > 1`.
pub const DCP_PREFILL_WARNING: &str = "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it usually adds communication overhead without improving prefill performance.";
/// ValueError (2026-09 rules): decode DCP with the decode radix cache.
pub const DCP_RADIX: &str =
    "PD decode DCP currently requires chunk cache; --disaggregation-decode-enable-radix-cache is not supported.";
/// ValueError (2026-09 rules): decode DCP with HiCache.
pub const DCP_HIERARCHICAL_CACHE: &str =
    "PD decode DCP currently requires chunk cache; --enable-hierarchical-cache is not supported.";

/// ValueError (2026-09 rules): decode DCP needs mooncake, nixl or fake
/// (the backend in Python's repr).
pub fn dcp_backend_error(backend: &str) -> String {
    format!(
        "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for synthetic benchmarking, got {}.",
        py::repr_str(backend)
    )
}

/// ValueError (2026-09 rules, `SGLANG_RUST_SERVER`): an explicit bootstrap
/// port other than the api port.
pub fn rust_server_port_conflict_error(bootstrap_port: i64, port: i64) -> String {
    format!(
        "SGLANG_RUST_SERVER serves the PD KV bootstrap registry on the api port itself; --disaggregation-bootstrap-port {bootstrap_port} conflicts with --port {port}. Drop --disaggregation-bootstrap-port (decode nodes and the PD router must then target the prefill api port)."
    )
}

/// INFO (2026-09 rules, `SGLANG_RUST_SERVER`): the bootstrap port moves to
/// the api port.
pub fn rust_server_port_info(bootstrap_port: i64, port: i64) -> String {
    format!(
        "SGLANG_RUST_SERVER: KV bootstrap registry is served on the api port; disaggregation_bootstrap_port {bootstrap_port} -> {port}"
    )
}

/// ValueError (default rules): decode radix cache needs nixl or mooncake.
pub fn radix_backend_whitelist_error(backend: &str) -> String {
    format!(
        "--disaggregation-decode-enable-radix-cache currently requires --disaggregation-transfer-backend in ('nixl', 'mooncake'), but got {}",
        py::repr_str(backend)
    )
}

/// ValueError: decode radix cache with speculative decoding.
pub fn radix_speculative_error(algorithm: &str) -> String {
    format!("--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding (--speculative-algorithm {algorithm})")
}

/// ValueError: staging buffer with a backend other than mooncake/nixl.
pub fn staging_error(backend: &str) -> String {
    format!(
        "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got '{backend}'."
    )
}

/// What the hook did besides mutating the arguments. A hook fills it as it
/// runs, so on a refusal it holds what SGLang logged before raising.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookOutcome {
    /// Log lines in emission order.
    pub messages: Vec<Message>,
    /// The `mooncake_tcp` alias applied: `MC_FORCE_TCP` must be
    /// set-defaulted to `"1"`. [`handle_pd_disaggregation`] does not write
    /// the environment itself; [`normalize`] does, after every rule passed.
    pub set_default_mc_force_tcp: bool,
}

/// A refused normalization: SGLang's error, and the lines SGLang logged
/// before raising it (its order, its texts; pdx's own `MC_FORCE_TCP` line is
/// not among them, since a refusal leaves the environment as it was).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What SGLang raises (`ValueError`, `AssertionError`, ...), its text.
    pub error: Error,
    /// The info and warning lines logged before the error, in order.
    pub messages: Vec<Message>,
}

impl Refusal {
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }

    /// The error's text.
    pub fn message(&self) -> &str {
        self.error.message()
    }
}

impl From<Refusal> for Error {
    /// The error alone, for callers that keep no messages.
    fn from(refusal: Refusal) -> Error {
        refusal.error
    }
}
