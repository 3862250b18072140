//! The PD-related subset of SGLang's `ServerArgs`, typed, with set/get by
//! field name (`disaggregation_transfer_backend`) or CLI flag
//! (`--disaggregation-transfer-backend`).
//!
//! Values cross this API as text: booleans accept SGLang's spellings
//! (`true 1 yes y` / `false 0 no n`, any case) and read back as
//! `true`/`false`; integers are decimal (Python `int()` syntax); `None`
//! means Python's `None` and is accepted only by `Optional` fields.

use super::choices::{self, transfer_backend_choices};
use super::env;
use super::py;
use crate::error::{Error, ErrorKind, Result};

/// Which version of `handle_pd_disaggregation` the rules follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuleSet {
    /// `"default"`: the hook as merged with `mooncake_tcp` (SGLang commit
    /// 6076066e3, 2026-05-26): decode radix cache needs nixl/mooncake, mamba
    /// `extra_buffer` fallback, prefill sets `disable_cuda_graph`, load-balance
    /// defaulting runs before the hook.
    #[default]
    Pr26346,
    /// `"2026-07"`: upstream main at d4801be (2026-07-19): only `fake` is
    /// rejected for decode radix cache, extra-slots defaulting, no mamba
    /// fallback, no `disable_cuda_graph`; load-balance defaulting runs after.
    Upstream202607,
    /// `"2026-09"`: the 2026-07 rules plus what SGLang's main added after
    /// July (hook as in zihanlin-ai/sglang@77e0052, a fork of SGLang synced
    /// with main; PRs #32837, #35409 and #33125): decode context parallel
    /// (`dcp_size > 1`) checks right after the alias, and under
    /// `SGLANG_RUST_SERVER` the prefill bootstrap port moves to `port`.
    Upstream202609,
    /// `"2026-10"` (also `"latest"`): the hook of sglang 0.5.23 as released on
    /// PyPI (`sglang/srt/arg_groups/pd_disaggregation_hook.py`): the
    /// `prefill_complete` allocation policy, decode host receive, PD role
    /// switching, the widened decode DCP backend list, attention DP read
    /// from `attn_dp_size` (the deprecated `--enable-dp-attention` resolved
    /// first), and the Rust server's bootstrap alias only for backends it
    /// serves.
    Upstream202610,
}

impl RuleSet {
    /// The names accepted by `pdx_rules`.
    pub const CHOICES: &'static [&'static str] = &["default", "2026-07", "2026-09", "2026-10"];

    /// The name that follows the newest rule set (reads back as that set's name).
    pub const LATEST: &'static str = "latest";

    /// The newest rule set, the one [`Self::LATEST`] names.
    pub const NEWEST: RuleSet = RuleSet::Upstream202610;

    /// The name `pdx_rules` reads back as.
    pub fn name(self) -> &'static str {
        match self {
            RuleSet::Pr26346 => "default",
            RuleSet::Upstream202607 => "2026-07",
            RuleSet::Upstream202609 => "2026-09",
            RuleSet::Upstream202610 => "2026-10",
        }
    }

    /// Parse a `pdx_rules` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(RuleSet::Pr26346),
            "2026-07" => Some(RuleSet::Upstream202607),
            "2026-09" => Some(RuleSet::Upstream202609),
            "2026-10" => Some(RuleSet::Upstream202610),
            Self::LATEST => Some(Self::NEWEST),
            _ => None,
        }
    }
}

/// The type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `bool` (`store_true` on the command line).
    Bool,
    /// `int`.
    Int,
    /// `Optional[int]`.
    OptInt,
    /// `str` (possibly with choices).
    Str,
    /// `Optional[str]`.
    OptStr,
    /// `float`.
    Float,
}

/// One settable field: its name, CLI flags and type.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    /// The ServerArgs field name.
    pub name: &'static str,
    /// Every CLI flag that sets it (the first is `--` + name with `-`).
    pub flags: &'static [&'static str],
    /// Its type.
    pub kind: Kind,
}

/// How a field's Rust type crosses the text API.
trait FieldValue: Sized {
    const KIND: Kind;
    /// Parse `value` (`None`: Python's `None`); `invalid` builds the error.
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<Self>;
    fn show(&self) -> Option<String>;
}

const BOOL_SPELLINGS: &str = "true, 1, yes, y, false, 0, no, n (any case)";

fn not_none<'a>(value: Option<&'a str>, invalid: &dyn Fn(String) -> Error, expected: &str) -> Result<&'a str> {
    value.ok_or_else(|| invalid(format!("None is not allowed; expected {expected}")))
}

impl FieldValue for bool {
    const KIND: Kind = Kind::Bool;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<bool> {
        let v = not_none(value, invalid, &format!("a boolean: {BOOL_SPELLINGS}"))?;
        env::parse_bool(v).map_err(|_| invalid(format!("{}; expected a boolean: {BOOL_SPELLINGS}", py::repr_str(v))))
    }
    fn show(&self) -> Option<String> {
        Some(if *self { "true" } else { "false" }.to_owned())
    }
}

impl FieldValue for i64 {
    const KIND: Kind = Kind::Int;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<i64> {
        let v = not_none(value, invalid, "a decimal integer")?;
        py::parse_int(v).ok_or_else(|| invalid(format!("{}; expected a decimal integer", py::repr_str(v))))
    }
    fn show(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl FieldValue for Option<i64> {
    const KIND: Kind = Kind::OptInt;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<Option<i64>> {
        value.map(|v| i64::parse(Some(v), invalid)).transpose()
    }
    fn show(&self) -> Option<String> {
        self.map(|v| v.to_string())
    }
}

impl FieldValue for String {
    const KIND: Kind = Kind::Str;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<String> {
        not_none(value, invalid, "a string").map(str::to_owned)
    }
    fn show(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl FieldValue for Option<String> {
    const KIND: Kind = Kind::OptStr;
    fn parse(value: Option<&str>, _: &dyn Fn(String) -> Error) -> Result<Option<String>> {
        Ok(value.map(str::to_owned))
    }
    fn show(&self) -> Option<String> {
        self.clone()
    }
}

/// A Python `float` field. Equality is bitwise, so a `nan` set twice
/// compares equal to itself (the arguments are a record, not arithmetic).
#[derive(Debug, Clone, Copy)]
pub struct PyFloat(pub f64);

impl PartialEq for PyFloat {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for PyFloat {}

impl FieldValue for PyFloat {
    const KIND: Kind = Kind::Float;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<PyFloat> {
        let v = not_none(value, invalid, "a number")?;
        py::parse_float(v).map(PyFloat).ok_or_else(|| invalid(format!("{}; expected a number", py::repr_str(v))))
    }
    fn show(&self) -> Option<String> {
        Some(py::repr_float(self.0))
    }
}

impl FieldValue for RuleSet {
    const KIND: Kind = Kind::Str;
    fn parse(value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<RuleSet> {
        let v = not_none(value, invalid, "a string")?;
        RuleSet::from_name(v).ok_or_else(|| {
            invalid(format!(
                "{}; allowed values: {}, {}",
                py::repr_str(v),
                RuleSet::CHOICES.join(", "),
                RuleSet::LATEST
            ))
        })
    }
    fn show(&self) -> Option<String> {
        Some(self.name().to_owned())
    }
}

/// Declares every field once: its type, SGLang's default, its CLI flags and
/// its meaning; the struct, its `Default`, [`FIELDS`] and the text
/// set/get all come from this one list.
macro_rules! server_args {
    ($($(#[doc = $doc:literal])* $name:ident: $ty:ty = $default:expr, [$($flag:literal),+];)*) => {
        /// The typed arguments. Defaults are SGLang's.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct ServerArgs {
            $($(#[doc = $doc])* pub $name: $ty,)*
        }

        impl Default for ServerArgs {
            fn default() -> Self {
                ServerArgs { $($name: $default,)* }
            }
        }

        /// Every field, in SGLang's documentation order.
        pub const FIELDS: &[FieldSpec] = &[
            $(FieldSpec { name: stringify!($name), flags: &[$($flag),+], kind: <$ty as FieldValue>::KIND }),*
        ];

        impl ServerArgs {
            fn set_field(&mut self, spec: &FieldSpec, value: Option<&str>, invalid: &dyn Fn(String) -> Error) -> Result<()> {
                match spec.name {
                    $(stringify!($name) => self.$name = <$ty as FieldValue>::parse(value, invalid)?,)*
                    other => return Err(unknown_key(other)),
                }
                Ok(())
            }

            fn get_field(&self, name: &str) -> Option<String> {
                match name {
                    $(stringify!($name) => self.$name.show(),)*
                    _ => None,
                }
            }
        }
    };
}

server_args! {
    /// `null`, `prefill` or `decode`.
    disaggregation_mode: String = "null".into(), ["--disaggregation-mode"];
    /// One of the transfer-backend choices; `mooncake_tcp` is rewritten by normalization.
    disaggregation_transfer_backend: String = "mooncake".into(), ["--disaggregation-transfer-backend"];
    /// IB devices (comma list, JSON mapping or `.json` path); cleared for `mooncake_tcp`.
    disaggregation_ib_device: Option<String> = None, ["--disaggregation-ib-device"];
    /// Decode keeps a radix cache.
    disaggregation_decode_enable_radix_cache: bool = false, ["--disaggregation-decode-enable-radix-cache"];
    /// Extra decode req-to-token slots (defaulted by the 2026-07 rules).
    disaggregation_decode_extra_slots: Option<i64> = None, ["--disaggregation-decode-extra-slots"];
    /// Radix cache disabled (forced for decode without the radix flag).
    disable_radix_cache: bool = false, ["--disable-radix-cache"];
    /// HiSparse attention.
    enable_hisparse: bool = false, ["--enable-hisparse"];
    /// Speculative decoding algorithm, e.g. `EAGLE`.
    speculative_algorithm: Option<String> = None, ["--speculative-algorithm"];
    /// DP attention (warning only).
    enable_dp_attention: bool = false, ["--enable-dp-attention"];
    /// Max running requests.
    max_running_requests: Option<i64> = None, ["--max-running-requests"];
    /// Data-parallel size.
    dp_size: i64 = 1, ["--dp-size", "--data-parallel-size"];
    /// CUDA graphs disabled (set for prefill by the default rules).
    disable_cuda_graph: bool = false, ["--disable-cuda-graph"];
    /// `auto`, `no_buffer` or `extra_buffer`.
    mamba_scheduler_strategy: String = "auto".into(), ["--mamba-scheduler-strategy"];
    /// Decode offloads KV cache to HiCache storage.
    disaggregation_decode_enable_offload_kvcache: bool = false, ["--disaggregation-decode-enable-offload-kvcache"];
    /// Reserved decode tokens.
    num_reserved_decode_tokens: i64 = 512, ["--num-reserved-decode-tokens"];
    /// Decode polling interval.
    disaggregation_decode_polling_interval: i64 = 1, ["--disaggregation-decode-polling-interval"];
    /// Optimistic prefill attempts.
    optimistic_prefill_attempts: i64 = 0, ["--optimistic-prefill-attempts"];
    /// `auto` is resolved by normalization.
    load_balance_method: String = "auto".into(), ["--load-balance-method"];
    /// Elastic-EP IB devices (fallback IB source of the shared engine).
    mooncake_ib_device: Option<String> = None, ["--mooncake-ib-device"];
    /// Encoder transfer backend.
    encoder_transfer_backend: String = "zmq_to_scheduler".into(), ["--encoder-transfer-backend"];
    /// Prefill's KV bootstrap port (moved to `port` under `SGLANG_RUST_SERVER`
    /// by the 2026-09 rules).
    disaggregation_bootstrap_port: i64 = DEFAULT_BOOTSTRAP_PORT, ["--disaggregation-bootstrap-port"];
    /// HTTP (api) port.
    port: i64 = 30000, ["--port"];
    /// Decode context-parallel size (checked by the 2026-09 rules when above 1).
    dcp_size: i64 = 1, ["--dcp-size", "--decode-context-parallel-size"];
    /// HiCache (refused with decode DCP by the 2026-09 rules).
    enable_hierarchical_cache: bool = false, ["--enable-hierarchical-cache"];
    /// `2026-10`: when decode allocates KV for a request (`early`, or `prefill_complete`).
    disaggregation_decode_allocation_policy: String = "early".into(), ["--disaggregation-decode-allocation-policy"];
    /// `2026-10`: below 1, decode receives KV into host memory first.
    disaggregation_decode_host_receive_threshold: PyFloat = PyFloat(1.0), ["--disaggregation-decode-host-receive-threshold"];
    /// `2026-10`: where a retracted decode request's KV goes.
    disaggregation_decode_retraction_backup: Option<String> = None, ["--disaggregation-decode-retraction-backup"];
    /// `2026-10`: a PD server may switch between prefill and decode at run time.
    enable_pd_role_switch: bool = false, ["--enable-pd-role-switch"];
    /// `2026-10`: attention data-parallel groups (what `--dp-size N --enable-dp-attention` used to say).
    attn_dp_size: i64 = 1, ["--attn-dp-size", "--attention-data-parallel-size"];
    /// `2026-10`: tensor-parallel size.
    tp_size: i64 = 1, ["--tp-size", "--tensor-parallel-size"];
    /// `2026-10`: pipeline-parallel size.
    pp_size: i64 = 1, ["--pp-size", "--pipeline-parallel-size"];
    /// `2026-10`: attention context-parallel size.
    attn_cp_size: i64 = 1, ["--attn-cp-size", "--attention-context-parallel-size"];
    /// `2026-10`: expert-parallel size.
    ep_size: i64 = 1, ["--ep-size", "--expert-parallel-size", "--ep"];
    /// `2026-10`: MoE all-to-all backend.
    moe_a2a_backend: String = "none".into(), ["--moe-a2a-backend"];
    /// `2026-10`: DP attention's local control broadcast.
    enable_dp_attention_local_control_broadcast: bool = false, ["--enable-dp-attention-local-control-broadcast"];
    /// `2026-10`: PD multiplexing.
    enable_pdmux: bool = false, ["--enable-pdmux"];
    /// `2026-10`: decoupled speculative decoding role.
    decoupled_spec_role: String = "null".into(), ["--decoupled-spec-role"];
    /// `2026-10`: an encoder-only server (encoder disaggregation).
    encoder_only: bool = false, ["--encoder-only"];
    /// `2026-10`: a language-only server (encoder disaggregation).
    language_only: bool = false, ["--language-only"];
    /// `2026-10`: HiCache's storage backend.
    hicache_storage_backend: Option<String> = None, ["--hicache-storage-backend"];
    /// `2026-10`: HiCache's write policy.
    hicache_write_policy: String = "write_through".into(), ["--hicache-write-policy"];
    /// pdx's own setting: which rule set normalization applies.
    pdx_rules: RuleSet = RuleSet::Pr26346, ["--pdx-rules"];
}

/// SGLang's default of `disaggregation_bootstrap_port`; the 2026-09 rules
/// compare against it (`SGLANG_RUST_SERVER`).
pub const DEFAULT_BOOTSTRAP_PORT: i64 = 8998;

/// The read-only key of SGLang's shared-engine device choice,
/// `disaggregation_ib_device or mooncake_ib_device`
/// (`maybe_init_shared_mooncake_transfer_engine`, mooncake_transfer_engine.py
/// at d4801be line 343): the `device` a host passes to
/// `pdx_engine_init_with`.
pub const SHARED_ENGINE_IB_DEVICE: &str = "shared_engine_ib_device";

/// Read-only key: `true` where SGLang validates `disaggregation_ib_device`
/// for these (normalized) arguments, in `handle_encoder_disaggregation`
/// after the hook (`mooncake` in prefill or decode, or the `mooncake`
/// encoder transfer backend); `false` otherwise.
pub const IB_DEVICE_VALIDATED: &str = "ib_device_validated";

/// The name a readable key is cached under: its field's name, or the
/// derived key itself.
pub fn read_name(key: &str) -> Option<&'static str> {
    if key == SHARED_ENGINE_IB_DEVICE {
        return Some(SHARED_ENGINE_IB_DEVICE);
    }
    if key == IB_DEVICE_VALIDATED {
        return Some(IB_DEVICE_VALIDATED);
    }
    lookup(key).map(|spec| spec.name)
}

/// The field a key names: a field name, or (when it starts with `--`) a flag.
pub fn lookup(key: &str) -> Option<&'static FieldSpec> {
    if key.starts_with("--") {
        FIELDS.iter().find(|f| f.flags.contains(&key))
    } else {
        FIELDS.iter().find(|f| f.name == key)
    }
}

/// The allowed values of a choice field, `None` for free-form fields.
pub fn choices_of(name: &str) -> Option<Vec<String>> {
    let fixed = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match name {
        "disaggregation_mode" => Some(fixed(choices::DISAGGREGATION_MODE_CHOICES)),
        "disaggregation_transfer_backend" => Some(transfer_backend_choices()),
        "load_balance_method" => Some(fixed(choices::LOAD_BALANCE_METHOD_CHOICES)),
        "encoder_transfer_backend" => Some(fixed(choices::ENCODER_TRANSFER_BACKEND_CHOICES)),
        "mamba_scheduler_strategy" => Some(fixed(choices::MAMBA_SCHEDULER_STRATEGY_CHOICES)),
        "disaggregation_decode_allocation_policy" => Some(fixed(choices::DECODE_ALLOCATION_POLICY_CHOICES)),
        "disaggregation_decode_retraction_backup" => Some(fixed(choices::DECODE_RETRACTION_BACKUP_CHOICES)),
        "moe_a2a_backend" => Some(fixed(choices::MOE_A2A_BACKEND_CHOICES)),
        "decoupled_spec_role" => Some(fixed(choices::DECOUPLED_SPEC_ROLE_CHOICES)),
        "hicache_storage_backend" => Some(fixed(choices::HICACHE_STORAGE_BACKEND_CHOICES)),
        "hicache_write_policy" => Some(fixed(choices::HICACHE_WRITE_POLICY_CHOICES)),
        "pdx_rules" => Some(fixed(&[RuleSet::CHOICES, &[RuleSet::LATEST]].concat())),
        _ => None,
    }
}

fn unknown_key(key: &str) -> Error {
    Error::new(
        ErrorKind::UnknownKey,
        format!("unknown argument key {}: expected a ServerArgs field name such as 'disaggregation_mode' or a flag such as '--disaggregation-mode'", py::repr_str(key)),
    )
}

fn label(spec: &FieldSpec) -> String {
    format!("{} ({})", spec.name, spec.flags[0])
}

impl ServerArgs {
    /// Set the field named by `key` from text; `None` is Python's `None`.
    ///
    /// Errors: `UnknownKey`; `InvalidValue` naming the field and the allowed
    /// values when the text does not parse, is not an allowed choice, or is
    /// `None` for a non-optional field. On error nothing changes.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        if key == SHARED_ENGINE_IB_DEVICE {
            return Err(Error::invalid_value(format!(
                "{SHARED_ENGINE_IB_DEVICE} is read-only: it is disaggregation_ib_device or mooncake_ib_device"
            )));
        }
        if key == IB_DEVICE_VALIDATED {
            return Err(Error::invalid_value(format!(
                "{IB_DEVICE_VALIDATED} is read-only: it says whether SGLang validates disaggregation_ib_device"
            )));
        }
        let spec = lookup(key).ok_or_else(|| unknown_key(key))?;
        let invalid = |what: String| Error::invalid_value(format!("invalid value for {}: {what}", label(spec)));
        if let Some(allowed) = choices_of(spec.name) {
            match value {
                Some(v) if !allowed.iter().any(|a| a == v) => {
                    return Err(invalid(format!("{}; allowed values: {}", py::repr_str(v), allowed.join(", "))));
                }
                None if spec.kind == Kind::Str => {
                    return Err(invalid(format!("None is not allowed; expected one of {}", allowed.join(", "))));
                }
                _ => {}
            }
        }
        self.set_field(spec, value, &invalid)
    }

    /// The value of the field named by `key` as text: `None` for Python's
    /// `None`, booleans as `true`/`false`, integers in decimal.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        if key == SHARED_ENGINE_IB_DEVICE {
            return Ok(self.shared_engine_ib_device().map(str::to_owned));
        }
        if key == IB_DEVICE_VALIDATED {
            let applies = self.ib_device_validated();
            return Ok(Some(if applies { "true" } else { "false" }.to_owned()));
        }
        let spec = lookup(key).ok_or_else(|| unknown_key(key))?;
        Ok(self.get_field(spec.name))
    }

    /// SGLang's `disaggregation_ib_device or mooncake_ib_device`: Python's
    /// `or`, so an empty first value falls through to the second.
    /// Whether SGLang validates `disaggregation_ib_device` for these
    /// (normalized) arguments: `handle_encoder_disaggregation` does, after
    /// the hook, for the `mooncake` backend in prefill or decode, or the
    /// `mooncake` encoder transfer backend (the same in every rule set).
    pub fn ib_device_validated(&self) -> bool {
        (self.disaggregation_transfer_backend == "mooncake"
            && matches!(self.disaggregation_mode.as_str(), "prefill" | "decode"))
            || self.encoder_transfer_backend == "mooncake"
    }

    pub fn shared_engine_ib_device(&self) -> Option<&str> {
        match self.disaggregation_ib_device.as_deref() {
            Some(d) if !d.is_empty() => Some(d),
            _ => self.mooncake_ib_device.as_deref(),
        }
    }

    /// Every field with its current value, in [`FIELDS`] order.
    pub fn entries(&self) -> Vec<(&'static str, Option<String>)> {
        FIELDS.iter().map(|f| (f.name, self.get_field(f.name))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips_and_has_its_canonical_flag() {
        let args = ServerArgs::default();
        for f in FIELDS {
            assert_eq!(f.flags[0], format!("--{}", f.name.replace('_', "-")));
            // Reading every field must not hit an unreachable arm.
            let _ = args.get(f.name).unwrap();
            let mut copy = args.clone();
            let sample = match f.kind {
                Kind::Bool => "true".to_owned(),
                Kind::Int | Kind::OptInt => "7".to_owned(),
                // The last choice that reads back as itself (`latest` reads back as the set it names).
                Kind::Str | Kind::OptStr => choices_of(f.name)
                    .map_or("x".to_owned(), |c| c.iter().rev().find(|v| *v != RuleSet::LATEST).unwrap().clone()),
                Kind::Float => "0.25".to_owned(),
            };
            copy.set(f.flags[0], Some(&sample)).unwrap();
            assert_eq!(copy.get(f.name).unwrap().as_deref(), Some(sample.as_str()), "{}", f.name);
        }
    }

    #[test]
    fn defaults_match_sglang() {
        let a = ServerArgs::default();
        assert_eq!(a.get("disaggregation_mode").unwrap().as_deref(), Some("null"));
        assert_eq!(a.get("--disaggregation-transfer-backend").unwrap().as_deref(), Some("mooncake"));
        assert_eq!(a.get("disaggregation_ib_device").unwrap(), None);
        assert_eq!(a.get("disable_radix_cache").unwrap().as_deref(), Some("false"));
        assert_eq!(a.get("dp_size").unwrap().as_deref(), Some("1"));
        assert_eq!(a.get("load_balance_method").unwrap().as_deref(), Some("auto"));
        assert_eq!(a.get("pdx_rules").unwrap().as_deref(), Some("default"));
        assert_eq!(a.get("disaggregation_bootstrap_port").unwrap().as_deref(), Some("8998"));
        assert_eq!(a.get("--port").unwrap().as_deref(), Some("30000"));
        assert_eq!(a.get("--decode-context-parallel-size").unwrap().as_deref(), Some("1"));
        assert_eq!(a.get("enable_hierarchical_cache").unwrap().as_deref(), Some("false"));
    }

    #[test]
    fn booleans_accept_sglang_spellings() {
        let mut a = ServerArgs::default();
        for (text, want) in [("YES", "true"), ("n", "false"), ("1", "true"), ("False", "false")] {
            a.set("enable_hisparse", Some(text)).unwrap();
            assert_eq!(a.get("enable_hisparse").unwrap().as_deref(), Some(want));
        }
        let e = a.set("--enable-hisparse", Some("on")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert_eq!(
            e.message(),
            "invalid value for enable_hisparse (--enable-hisparse): 'on'; expected a boolean: true, 1, yes, y, false, 0, no, n (any case)"
        );
        assert_eq!(a.set("enable_hisparse", None).unwrap_err().kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn ints_and_none() {
        let mut a = ServerArgs::default();
        a.set("--data-parallel-size", Some("4")).unwrap();
        assert_eq!(a.dp_size, 4);
        a.set("max_running_requests", Some("64")).unwrap();
        assert_eq!(a.max_running_requests, Some(64));
        a.set("max_running_requests", None).unwrap();
        assert_eq!(a.get("max_running_requests").unwrap(), None);
        let e = a.set("dp_size", Some("two")).unwrap_err();
        assert_eq!(e.message(), "invalid value for dp_size (--dp-size): 'two'; expected a decimal integer");
        let e = a.set("dp_size", None).unwrap_err();
        assert_eq!(
            e.message(),
            "invalid value for dp_size (--dp-size): None is not allowed; expected a decimal integer"
        );
        assert_eq!(a.dp_size, 4, "a failed set changes nothing");
    }

    #[test]
    fn choices_are_enforced_with_allowed_values_listed() {
        let mut a = ServerArgs::default();
        a.set("disaggregation_transfer_backend", Some("mooncake_tcp")).unwrap();
        let e = a.set("disaggregation_transfer_backend", Some("rdma")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.message().starts_with(
            "invalid value for disaggregation_transfer_backend (--disaggregation-transfer-backend): 'rdma'; allowed values: mooncake, nixl, ascend, fake, mori, mooncake_tcp"
        ));
        let e = a.set("disaggregation_mode", None).unwrap_err();
        assert_eq!(
            e.message(),
            "invalid value for disaggregation_mode (--disaggregation-mode): None is not allowed; expected one of null, prefill, decode"
        );
        a.set("pdx_rules", Some("2026-07")).unwrap();
        assert_eq!(a.pdx_rules, RuleSet::Upstream202607);
        a.set("--pdx-rules", Some("2026-09")).unwrap();
        assert_eq!((a.pdx_rules, a.get("pdx_rules").unwrap().as_deref()), (RuleSet::Upstream202609, Some("2026-09")));
        assert!(a
            .set("pdx_rules", Some("2026-08"))
            .unwrap_err()
            .message()
            .ends_with("'2026-08'; allowed values: default, 2026-07, 2026-09, 2026-10, latest"));
        // `latest` names the newest set and reads back as its name.
        a.set("pdx_rules", Some("latest")).unwrap();
        assert_eq!((a.pdx_rules, a.get("pdx_rules").unwrap().as_deref()), (RuleSet::NEWEST, Some("2026-10")));
        assert_eq!(a.disaggregation_transfer_backend, "mooncake_tcp");
    }

    #[test]
    fn unknown_keys() {
        let mut a = ServerArgs::default();
        for key in ["model_path", "--model-path", "disaggregation-mode", "-disaggregation-mode", "", "--dp_size"] {
            let e = a.set(key, Some("1")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::UnknownKey, "{key}");
            assert_eq!(a.get(key).unwrap_err().kind(), ErrorKind::UnknownKey);
        }
        assert!(a.get("model_path").unwrap_err().message().starts_with("unknown argument key 'model_path'"));
    }

    /// SGLang's shared-engine device: `server_args.disaggregation_ib_device
    /// or server_args.mooncake_ib_device` (mooncake_transfer_engine.py at
    /// d4801be, line 343).
    #[test]
    fn shared_engine_device_is_python_or() {
        let mut a = ServerArgs::default();
        assert_eq!(a.get(SHARED_ENGINE_IB_DEVICE).unwrap(), None);
        a.set("--mooncake-ib-device", Some("mlx5_4")).unwrap();
        assert_eq!(a.get(SHARED_ENGINE_IB_DEVICE).unwrap().as_deref(), Some("mlx5_4"));
        a.set("disaggregation_ib_device", Some("")).unwrap();
        assert_eq!(a.get(SHARED_ENGINE_IB_DEVICE).unwrap().as_deref(), Some("mlx5_4"), "'' is falsy");
        a.set("disaggregation_ib_device", Some(r#"{"0": "mlx5_0"}"#)).unwrap();
        assert_eq!(a.get(SHARED_ENGINE_IB_DEVICE).unwrap().as_deref(), Some(r#"{"0": "mlx5_0"}"#));
        let e = a.set(SHARED_ENGINE_IB_DEVICE, Some("x")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.message().contains("read-only"));
        assert_eq!(read_name(SHARED_ENGINE_IB_DEVICE), Some(SHARED_ENGINE_IB_DEVICE));
        assert_eq!(read_name("--dp-size"), Some("dp_size"));
    }

    #[test]
    fn plugin_backends_become_settable() {
        let mut a = ServerArgs::default();
        assert!(a.set("disaggregation_transfer_backend", Some("pdx_args_test_backend")).is_err());
        choices::add_transfer_backend_choices(&["pdx_args_test_backend"]);
        a.set("disaggregation_transfer_backend", Some("pdx_args_test_backend")).unwrap();
    }
}
