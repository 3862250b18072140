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
}

impl RuleSet {
    /// The names accepted by `pdx_rules`.
    pub const CHOICES: &'static [&'static str] = &["default", "2026-07"];

    /// The name `pdx_rules` reads back as.
    pub fn name(self) -> &'static str {
        match self {
            RuleSet::Pr26346 => "default",
            RuleSet::Upstream202607 => "2026-07",
        }
    }

    /// Parse a `pdx_rules` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(RuleSet::Pr26346),
            "2026-07" => Some(RuleSet::Upstream202607),
            _ => None,
        }
    }
}

/// The typed arguments. Defaults are SGLang's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerArgs {
    /// `null`, `prefill` or `decode`.
    pub disaggregation_mode: String,
    /// One of the transfer-backend choices; `mooncake_tcp` is rewritten by normalization.
    pub disaggregation_transfer_backend: String,
    /// IB devices (comma list, JSON mapping or `.json` path); cleared for `mooncake_tcp`.
    pub disaggregation_ib_device: Option<String>,
    /// Decode keeps a radix cache.
    pub disaggregation_decode_enable_radix_cache: bool,
    /// Extra decode req-to-token slots (defaulted by the 2026-07 rules).
    pub disaggregation_decode_extra_slots: Option<i64>,
    /// Radix cache disabled (forced for decode without the radix flag).
    pub disable_radix_cache: bool,
    /// HiSparse attention.
    pub enable_hisparse: bool,
    /// Speculative decoding algorithm, e.g. `EAGLE`.
    pub speculative_algorithm: Option<String>,
    /// DP attention (warning only).
    pub enable_dp_attention: bool,
    /// Max running requests.
    pub max_running_requests: Option<i64>,
    /// Data-parallel size.
    pub dp_size: i64,
    /// CUDA graphs disabled (set for prefill by the default rules).
    pub disable_cuda_graph: bool,
    /// `auto`, `no_buffer` or `extra_buffer`.
    pub mamba_scheduler_strategy: String,
    /// Decode offloads KV cache to HiCache storage.
    pub disaggregation_decode_enable_offload_kvcache: bool,
    /// Reserved decode tokens.
    pub num_reserved_decode_tokens: i64,
    /// Decode polling interval.
    pub disaggregation_decode_polling_interval: i64,
    /// Optimistic prefill attempts.
    pub optimistic_prefill_attempts: i64,
    /// `auto` is resolved by normalization.
    pub load_balance_method: String,
    /// Elastic-EP IB devices (fallback IB source of the shared engine).
    pub mooncake_ib_device: Option<String>,
    /// Encoder transfer backend.
    pub encoder_transfer_backend: String,
    /// Bootstrap port.
    pub disaggregation_bootstrap_port: i64,
    /// HTTP port.
    pub port: i64,
    /// Decode context-parallel size.
    pub dcp_size: i64,
    /// HiCache.
    pub enable_hierarchical_cache: bool,
    /// pdx's own setting: which rule set normalization applies.
    pub pdx_rules: RuleSet,
}

impl Default for ServerArgs {
    fn default() -> Self {
        ServerArgs {
            disaggregation_mode: "null".into(),
            disaggregation_transfer_backend: "mooncake".into(),
            disaggregation_ib_device: None,
            disaggregation_decode_enable_radix_cache: false,
            disaggregation_decode_extra_slots: None,
            disable_radix_cache: false,
            enable_hisparse: false,
            speculative_algorithm: None,
            enable_dp_attention: false,
            max_running_requests: None,
            dp_size: 1,
            disable_cuda_graph: false,
            mamba_scheduler_strategy: "auto".into(),
            disaggregation_decode_enable_offload_kvcache: false,
            num_reserved_decode_tokens: 512,
            disaggregation_decode_polling_interval: 1,
            optimistic_prefill_attempts: 0,
            load_balance_method: "auto".into(),
            mooncake_ib_device: None,
            encoder_transfer_backend: "zmq_to_scheduler".into(),
            disaggregation_bootstrap_port: 8998,
            port: 30000,
            dcp_size: 1,
            enable_hierarchical_cache: false,
            pdx_rules: RuleSet::Pr26346,
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

macro_rules! fields {
    ($($name:ident : $kind:ident [$($flag:literal),+]),* $(,)?) => {
        /// Every field, in SGLang's documentation order.
        pub const FIELDS: &[FieldSpec] = &[
            $(FieldSpec { name: stringify!($name), flags: &[$($flag),+], kind: Kind::$kind }),*
        ];
    };
}

fields! {
    disaggregation_mode: Str ["--disaggregation-mode"],
    disaggregation_transfer_backend: Str ["--disaggregation-transfer-backend"],
    disaggregation_ib_device: OptStr ["--disaggregation-ib-device"],
    disaggregation_decode_enable_radix_cache: Bool ["--disaggregation-decode-enable-radix-cache"],
    disaggregation_decode_extra_slots: OptInt ["--disaggregation-decode-extra-slots"],
    disable_radix_cache: Bool ["--disable-radix-cache"],
    enable_hisparse: Bool ["--enable-hisparse"],
    speculative_algorithm: OptStr ["--speculative-algorithm"],
    enable_dp_attention: Bool ["--enable-dp-attention"],
    max_running_requests: OptInt ["--max-running-requests"],
    dp_size: Int ["--dp-size", "--data-parallel-size"],
    disable_cuda_graph: Bool ["--disable-cuda-graph"],
    mamba_scheduler_strategy: Str ["--mamba-scheduler-strategy"],
    disaggregation_decode_enable_offload_kvcache: Bool ["--disaggregation-decode-enable-offload-kvcache"],
    num_reserved_decode_tokens: Int ["--num-reserved-decode-tokens"],
    disaggregation_decode_polling_interval: Int ["--disaggregation-decode-polling-interval"],
    optimistic_prefill_attempts: Int ["--optimistic-prefill-attempts"],
    load_balance_method: Str ["--load-balance-method"],
    mooncake_ib_device: OptStr ["--mooncake-ib-device"],
    encoder_transfer_backend: Str ["--encoder-transfer-backend"],
    disaggregation_bootstrap_port: Int ["--disaggregation-bootstrap-port"],
    port: Int ["--port"],
    dcp_size: Int ["--dcp-size", "--decode-context-parallel-size"],
    enable_hierarchical_cache: Bool ["--enable-hierarchical-cache"],
    pdx_rules: Str ["--pdx-rules"],
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
        "pdx_rules" => Some(fixed(RuleSet::CHOICES)),
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

const BOOL_SPELLINGS: &str = "true, 1, yes, y, false, 0, no, n (any case)";

impl ServerArgs {
    /// Set the field named by `key` from text; `None` is Python's `None`.
    ///
    /// Errors: `UnknownKey`; `InvalidValue` naming the field and the allowed
    /// values when the text does not parse, is not an allowed choice, or is
    /// `None` for a non-optional field. On error nothing changes.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        let spec = lookup(key).ok_or_else(|| unknown_key(key))?;
        let invalid = |what: String| Error::invalid_value(format!("invalid value for {}: {what}", label(spec)));
        let shown = |v: &str| py::repr_str(v);
        match spec.kind {
            Kind::Bool => {
                let v = value
                    .ok_or_else(|| invalid(format!("None is not allowed; expected a boolean: {BOOL_SPELLINGS}")))?;
                let b = env::parse_bool(v)
                    .map_err(|_| invalid(format!("{}; expected a boolean: {BOOL_SPELLINGS}", shown(v))))?;
                self.set_bool(spec.name, b);
            }
            Kind::Int | Kind::OptInt => {
                let parsed = match value {
                    None if spec.kind == Kind::OptInt => None,
                    None => return Err(invalid("None is not allowed; expected a decimal integer".into())),
                    Some(v) => Some(
                        py::parse_int(v).ok_or_else(|| invalid(format!("{}; expected a decimal integer", shown(v))))?,
                    ),
                };
                self.set_int(spec.name, parsed);
            }
            Kind::Str | Kind::OptStr => {
                if let (Some(v), Some(allowed)) = (value, choices_of(spec.name)) {
                    if !allowed.iter().any(|a| a == v) {
                        return Err(invalid(format!("{}; allowed values: {}", shown(v), allowed.join(", "))));
                    }
                }
                if value.is_none() && spec.kind == Kind::Str {
                    let hint = choices_of(spec.name)
                        .map_or_else(|| "a string".to_owned(), |a| format!("one of {}", a.join(", ")));
                    return Err(invalid(format!("None is not allowed; expected {hint}")));
                }
                self.set_str(spec.name, value.map(str::to_owned));
            }
        }
        Ok(())
    }

    /// The value of the field named by `key` as text: `None` for Python's
    /// `None`, booleans as `true`/`false`, integers in decimal.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let spec = lookup(key).ok_or_else(|| unknown_key(key))?;
        Ok(self.get_field(spec.name))
    }

    /// Every field with its current value, in [`FIELDS`] order.
    pub fn entries(&self) -> Vec<(&'static str, Option<String>)> {
        FIELDS.iter().map(|f| (f.name, self.get_field(f.name))).collect()
    }

    fn bool_slot(&mut self, name: &str) -> &mut bool {
        match name {
            "disaggregation_decode_enable_radix_cache" => &mut self.disaggregation_decode_enable_radix_cache,
            "disable_radix_cache" => &mut self.disable_radix_cache,
            "enable_hisparse" => &mut self.enable_hisparse,
            "enable_dp_attention" => &mut self.enable_dp_attention,
            "disable_cuda_graph" => &mut self.disable_cuda_graph,
            "disaggregation_decode_enable_offload_kvcache" => &mut self.disaggregation_decode_enable_offload_kvcache,
            "enable_hierarchical_cache" => &mut self.enable_hierarchical_cache,
            other => unreachable!("{other} is not a bool field"),
        }
    }

    fn set_bool(&mut self, name: &str, v: bool) {
        *self.bool_slot(name) = v;
    }

    fn set_int(&mut self, name: &str, v: Option<i64>) {
        match name {
            "disaggregation_decode_extra_slots" => self.disaggregation_decode_extra_slots = v,
            "max_running_requests" => self.max_running_requests = v,
            other => {
                let v = v.expect("non-optional int checked by set");
                *match other {
                    "dp_size" => &mut self.dp_size,
                    "num_reserved_decode_tokens" => &mut self.num_reserved_decode_tokens,
                    "disaggregation_decode_polling_interval" => &mut self.disaggregation_decode_polling_interval,
                    "optimistic_prefill_attempts" => &mut self.optimistic_prefill_attempts,
                    "disaggregation_bootstrap_port" => &mut self.disaggregation_bootstrap_port,
                    "port" => &mut self.port,
                    "dcp_size" => &mut self.dcp_size,
                    other => unreachable!("{other} is not an int field"),
                } = v;
            }
        }
    }

    fn set_str(&mut self, name: &str, v: Option<String>) {
        match name {
            "disaggregation_ib_device" => self.disaggregation_ib_device = v,
            "speculative_algorithm" => self.speculative_algorithm = v,
            "mooncake_ib_device" => self.mooncake_ib_device = v,
            "pdx_rules" => {
                self.pdx_rules = RuleSet::from_name(v.as_deref().unwrap_or_default()).expect("checked by set")
            }
            other => {
                let v = v.expect("non-optional str checked by set");
                *match other {
                    "disaggregation_mode" => &mut self.disaggregation_mode,
                    "disaggregation_transfer_backend" => &mut self.disaggregation_transfer_backend,
                    "mamba_scheduler_strategy" => &mut self.mamba_scheduler_strategy,
                    "load_balance_method" => &mut self.load_balance_method,
                    "encoder_transfer_backend" => &mut self.encoder_transfer_backend,
                    other => unreachable!("{other} is not a str field"),
                } = v;
            }
        }
    }

    fn get_field(&self, name: &str) -> Option<String> {
        let b = |v: bool| Some(if v { "true" } else { "false" }.to_owned());
        let i = |v: i64| Some(v.to_string());
        match name {
            "disaggregation_mode" => Some(self.disaggregation_mode.clone()),
            "disaggregation_transfer_backend" => Some(self.disaggregation_transfer_backend.clone()),
            "disaggregation_ib_device" => self.disaggregation_ib_device.clone(),
            "disaggregation_decode_enable_radix_cache" => b(self.disaggregation_decode_enable_radix_cache),
            "disaggregation_decode_extra_slots" => self.disaggregation_decode_extra_slots.map(|v| v.to_string()),
            "disable_radix_cache" => b(self.disable_radix_cache),
            "enable_hisparse" => b(self.enable_hisparse),
            "speculative_algorithm" => self.speculative_algorithm.clone(),
            "enable_dp_attention" => b(self.enable_dp_attention),
            "max_running_requests" => self.max_running_requests.map(|v| v.to_string()),
            "dp_size" => i(self.dp_size),
            "disable_cuda_graph" => b(self.disable_cuda_graph),
            "mamba_scheduler_strategy" => Some(self.mamba_scheduler_strategy.clone()),
            "disaggregation_decode_enable_offload_kvcache" => b(self.disaggregation_decode_enable_offload_kvcache),
            "num_reserved_decode_tokens" => i(self.num_reserved_decode_tokens),
            "disaggregation_decode_polling_interval" => i(self.disaggregation_decode_polling_interval),
            "optimistic_prefill_attempts" => i(self.optimistic_prefill_attempts),
            "load_balance_method" => Some(self.load_balance_method.clone()),
            "mooncake_ib_device" => self.mooncake_ib_device.clone(),
            "encoder_transfer_backend" => Some(self.encoder_transfer_backend.clone()),
            "disaggregation_bootstrap_port" => i(self.disaggregation_bootstrap_port),
            "port" => i(self.port),
            "dcp_size" => i(self.dcp_size),
            "enable_hierarchical_cache" => b(self.enable_hierarchical_cache),
            "pdx_rules" => Some(self.pdx_rules.name().to_owned()),
            other => unreachable!("{other} is not a field"),
        }
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
                Kind::Str | Kind::OptStr => choices_of(f.name).map_or("x".to_owned(), |c| c.last().unwrap().clone()),
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
        assert!(a.set("pdx_rules", Some("2025")).unwrap_err().message().contains("allowed values: default, 2026-07"));
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

    #[test]
    fn plugin_backends_become_settable() {
        let mut a = ServerArgs::default();
        assert!(a.set("disaggregation_transfer_backend", Some("pdx_args_test_backend")).is_err());
        choices::add_transfer_backend_choices(&["pdx_args_test_backend"]);
        a.set("disaggregation_transfer_backend", Some("pdx_args_test_backend")).unwrap();
    }
}
