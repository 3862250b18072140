//! Per-engine options: what one engine of a multi-GPU host needs that the
//! process environment cannot say per engine.
//!
//! Keys and values are text. Two keys are pdx's own:
//!
//! - `gpu_id`: the GPU this engine serves (SGLang's `gpu_id`); it picks the
//!   entry of a per-GPU device mapping and the Ascend `npu_N` suffix.
//! - `device_source`: which of SGLang's engine rules chooses the device
//!   ([`DeviceRule`]).
//!
//! Every other key stands for one environment variable the engine reads at
//! start, and is derived from that variable's declaration in
//! [`crate::config::env`] (its name without `PDX_`/`MC_`, lower case:
//! `PDX_TCP_LANES` → `tcp_lanes`); its value is checked against the declared
//! type and range. An option takes its variable's place: it wins over that
//! variable, and ranks against the other variables of the same setting as
//! that variable does (the `PDX_*` options win over every variable of their
//! setting). The engine reads them through [`OptionsEnv`], so each setting
//! keeps its one declaration and its one reader.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::env::{parse_as_read, vars, Env, Ty, Var};
use super::py;
use crate::error::{Error, ErrorKind, Result};

/// Which of SGLang's engine-start rules picks the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRule {
    /// `"shared"`: SGLang's shared PD engine (`MooncakeTransferEngine`): the
    /// device argument (a list, an inline JSON mapping or a `.json` file) is
    /// resolved for `gpu_id` by `get_ib_devices_for_gpu`; Ascend applies.
    #[default]
    Shared,
    /// `"remote_instance"`: SGLang's remote-instance weight engine
    /// (`remote_instance_init_transfer_engine`): the device is the argument
    /// as given, else `MOONCAKE_DEVICE`, passed verbatim; protocol explicit
    /// or `MOONCAKE_PROTOCOL`; no Ascend hostname.
    RemoteInstance,
}

impl DeviceRule {
    /// The `device_source` values.
    pub const CHOICES: &'static [&'static str] = &["shared", "remote_instance"];

    /// The `device_source` value of this rule.
    pub fn name(self) -> &'static str {
        match self {
            DeviceRule::Shared => "shared",
            DeviceRule::RemoteInstance => "remote_instance",
        }
    }

    fn from_name(name: &str) -> Option<DeviceRule> {
        match name {
            "shared" => Some(DeviceRule::Shared),
            "remote_instance" => Some(DeviceRule::RemoteInstance),
            _ => None,
        }
    }
}

/// The variables an engine reads at start that an option may set, in the
/// order the README lists them.
pub const OPTION_VARS: &[Var] = &[
    vars::PDX_MIN_PORT,
    vars::PDX_MAX_PORT,
    vars::PDX_MIN_DATA_PORT,
    vars::PDX_MAX_DATA_PORT,
    vars::MC_HANDSHAKE_PORT,
    vars::MC_HANDSHAKE_MAX_LENGTH,
    vars::PDX_CONNECT_TIMEOUT_MS,
    vars::PDX_HANDSHAKE_TIMEOUT_MS,
    vars::PDX_STATUS_TIMEOUT_MS,
    vars::PDX_PROGRESS_TIMEOUT_MS,
    vars::PDX_TCP_LANES,
    vars::PDX_LANE_WAIT_TIMEOUT_MS,
    vars::MC_TRANSFER_TIMEOUT,
    vars::MC_TCP_PROTO,
    vars::PDX_MAX_DATA_CONNECTIONS,
    vars::PDX_MAX_HANDSHAKE_CONNECTIONS,
    vars::PDX_MAX_QUEUED_NOTIFICATIONS,
    vars::PDX_WORKERS,
    vars::PDX_SPIN_US,
    vars::PDX_BIND_ADDRESS,
    vars::PDX_TCP_ENGINE,
    vars::PDX_MOONCAKE_LIB,
    vars::ASCEND_NPU_PHY_ID,
    vars::PDX_CUDA_STAGING_BYTES,
    vars::PDX_MAX_BATCH_ENTRIES,
    vars::PDX_MAX_REQUEST_BYTES,
    vars::PDX_NOTIFY_QUEUE_BYTES,
    vars::PDX_MAX_CONNECTIONS_PER_ADDRESS,
    vars::PDX_METRICS_PER_PEER,
    vars::PDX_METRICS_INTERVAL_S,
    vars::PDX_ALLOWED_PEERS,
    vars::PDX_PEER_SECRET_FILE,
    vars::PDX_IDLE_TIMEOUT_MS,
    vars::PDX_SAME_HOST,
    vars::PDX_TCP_RAILS,
    vars::PDX_METADATA_SERVER,
    vars::MC_METADATA_CLUSTER_ID,
    vars::PDX_METADATA_LEASE_TTL_S,
    vars::PDX_METADATA_TIMEOUT_MS,
];

/// The option key of a variable: its name without `PDX_` / `MC_`, lower case.
pub fn option_key(var: &Var) -> String {
    let name = var.name;
    name.strip_prefix("PDX_").or_else(|| name.strip_prefix("MC_")).unwrap_or(name).to_ascii_lowercase()
}

/// What an option key sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptionKind {
    /// `gpu_id`.
    GpuId,
    /// `device_source`.
    DeviceSource,
    /// The engine's reading of this variable.
    Var(Var),
}

/// One option: its key, what it sets, and its allowed values in words.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionSpec {
    pub key: String,
    pub kind: OptionKind,
}

/// The largest `gpu_id` (the C ABI's `int32_t`).
pub const MAX_GPU_ID: i64 = i32::MAX as i64;

impl OptionSpec {
    /// The allowed values, as the error messages and the README say them.
    pub fn allowed(&self) -> String {
        match self.kind {
            OptionKind::GpuId => format!("a GPU index 0..={MAX_GPU_ID}"),
            OptionKind::DeviceSource => DeviceRule::CHOICES.join(", "),
            OptionKind::Var(var) => match var.ty {
                Ty::Presence => "any text".to_owned(),
                Ty::Bool => "true, 1, yes, y, false, 0, no, n (any case)".to_owned(),
                Ty::Int { min: i64::MIN, max: i64::MAX } => "an integer".to_owned(),
                Ty::Int { min, max } => format!("an integer {min}..={max}"),
                Ty::Seconds { min, max } => format!("seconds {min}..={max} (decimals allowed)"),
                Ty::Millis { min, max } => format!("whole milliseconds {min}..={max}"),
                Ty::Micros { min, max } => format!("whole microseconds {min}..={max}"),
                Ty::Text => "non-empty text".to_owned(),
                Ty::Choice(words) => words.join(", "),
            },
        }
    }

    /// What the option means (the README's column).
    pub fn meaning(&self) -> String {
        match self.kind {
            OptionKind::GpuId => "The GPU this engine serves: picks that GPU's entry of a per-GPU device mapping \
                                  and the Ascend `npu_N` suffix (default 0)."
                .to_owned(),
            OptionKind::DeviceSource => "`shared`: the device argument resolved for `gpu_id` (SGLang's shared PD \
                                         engine). `remote_instance`: the device argument, else `MOONCAKE_DEVICE`, \
                                         verbatim (SGLang's remote-instance engine)."
                .to_owned(),
            OptionKind::Var(var) => format!("Takes the place of `{}`: {}", var.name, var.meaning),
        }
    }

    /// Check `value`; returns the text to keep: the value in its normal
    /// spelling (`+05` → `5`). A variable's option takes exactly the forms
    /// its variable's reader takes ([`parse_as_read`]), within the declared
    /// range.
    fn check(&self, value: &str) -> Result<String> {
        let text = py::strip(value);
        let kept = match self.kind {
            OptionKind::GpuId => {
                text.parse::<i64>().ok().filter(|g| (0..=MAX_GPU_ID).contains(g)).map(|g| g.to_string())
            }
            OptionKind::DeviceSource => DeviceRule::from_name(text).map(|r| r.name().to_owned()),
            OptionKind::Var(var) => parse_as_read(&var, value).filter(|p| p.in_range(var.ty)).map(|p| p.normal_text()),
        };
        match kept {
            Some(kept) => Ok(kept),
            None => Err(Error::invalid_value(format!(
                "invalid value for engine option '{}': {}; allowed values: {}",
                self.key,
                py::repr_str(value),
                self.allowed()
            ))),
        }
    }
}

/// Every option, `gpu_id` and `device_source` first.
pub fn specs() -> &'static [OptionSpec] {
    static SPECS: OnceLock<Vec<OptionSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut out = vec![
            OptionSpec { key: "gpu_id".to_owned(), kind: OptionKind::GpuId },
            OptionSpec { key: "device_source".to_owned(), kind: OptionKind::DeviceSource },
        ];
        out.extend(OPTION_VARS.iter().map(|v| OptionSpec { key: option_key(v), kind: OptionKind::Var(*v) }));
        out
    })
}

fn spec(key: &str) -> Result<&'static OptionSpec> {
    specs().iter().find(|s| s.key == key).ok_or_else(|| {
        let known: Vec<&str> = specs().iter().map(|s| s.key.as_str()).collect();
        Error::new(
            ErrorKind::UnknownKey,
            format!("unknown engine option {}; known options: {}", py::repr_str(key), known.join(", ")),
        )
    })
}

/// A set of options (empty = every engine default; `pdx_engine_init`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineOptions {
    /// Checked values by key.
    values: BTreeMap<&'static str, String>,
}

impl EngineOptions {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set `key` to `value`, or unset it (`None`).
    ///
    /// Errors (nothing changes): `UnknownKey` listing the known keys;
    /// `InvalidValue` naming the key and its allowed values.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        let spec = spec(key)?;
        match value {
            Some(v) => {
                let checked = spec.check(v)?;
                self.values.insert(spec.key.as_str(), checked);
            }
            None => {
                self.values.remove(spec.key.as_str());
            }
        }
        Ok(())
    }

    /// The value of `key` (`None`: not set). `UnknownKey` for an unknown key.
    pub fn get(&self, key: &str) -> Result<Option<&str>> {
        let spec = spec(key)?;
        Ok(self.values.get(spec.key.as_str()).map(String::as_str))
    }

    /// The GPU id (`None`: not set, which SGLang treats as GPU 0).
    pub fn gpu_id(&self) -> Option<i64> {
        self.values.get("gpu_id").and_then(|v| v.parse().ok())
    }

    /// The device rule (default [`DeviceRule::Shared`]).
    pub fn device_rule(&self) -> DeviceRule {
        self.values.get("device_source").and_then(|v| DeviceRule::from_name(v)).unwrap_or_default()
    }

    /// The options that stand for variables, by variable name.
    fn var_value(&self, name: &str) -> Option<&str> {
        specs()
            .iter()
            .find(|s| matches!(s.kind, OptionKind::Var(v) if v.name == name))
            .and_then(|s| self.values.get(s.key.as_str()))
            .map(String::as_str)
    }

    /// Checks across options, made when an engine starts: a port range given
    /// by both of its options must not be empty (`InvalidValue`).
    pub fn check(&self) -> Result<()> {
        for (lo, hi) in [("min_port", "max_port"), ("min_data_port", "max_data_port")] {
            let value = |k: &str| self.values.get(k).and_then(|v| v.parse::<u16>().ok());
            if let (Some(a), Some(b)) = (value(lo), value(hi)) {
                if a > b {
                    return Err(Error::invalid_value(format!(
                        "engine options {lo}={a} and {hi}={b} give an empty port range"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every set option, by key order.
    pub fn entries(&self) -> Vec<(&'static str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

/// The environment as an engine with `options` sees it: an option's value
/// in place of its variable, everything else from `base`.
pub struct OptionsEnv<'a> {
    pub base: &'a dyn Env,
    pub options: &'a EngineOptions,
}

impl Env for OptionsEnv<'_> {
    fn var(&self, name: &str) -> Option<String> {
        match self.options.var_value(name) {
            Some(v) => Some(v.to_owned()),
            None => self.base.var(name),
        }
    }

    fn set_default(&self, name: &str, value: &str) -> Option<String> {
        self.base.set_default(name, value)
    }
}

/// The README's table of options, generated from [`specs`].
pub fn markdown_table() -> String {
    let mut out = String::from("| option | allowed values | meaning |\n|---|---|---|\n");
    for s in specs() {
        out.push_str(&format!("| `{}` | {} | {} |\n", s.key, s.allowed(), s.meaning()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::{read, MapEnv};

    #[test]
    fn keys_are_derived_unique_and_every_var_is_declared() {
        let mut seen = std::collections::HashSet::new();
        for s in specs() {
            assert!(seen.insert(s.key.clone()), "{} twice", s.key);
            if let OptionKind::Var(v) = s.kind {
                assert!(vars::ALL.contains(&v), "{} is not a declared variable", v.name);
                assert_eq!(s.key, option_key(&v));
            }
        }
        assert_eq!(option_key(&vars::PDX_TCP_LANES), "tcp_lanes");
        assert_eq!(option_key(&vars::MC_TRANSFER_TIMEOUT), "transfer_timeout");
        assert_eq!(option_key(&vars::ASCEND_NPU_PHY_ID), "ascend_npu_phy_id");
    }

    #[test]
    fn values_are_checked_against_the_declaration() {
        let mut o = EngineOptions::new();
        o.set("gpu_id", Some("7")).unwrap();
        o.set("tcp_lanes", Some(" 8 ")).unwrap();
        o.set("transfer_timeout", Some("7.5")).unwrap();
        o.set("tcp_engine", Some("mooncake")).unwrap();
        o.set("device_source", Some("remote_instance")).unwrap();
        assert_eq!((o.gpu_id(), o.device_rule()), (Some(7), DeviceRule::RemoteInstance));
        assert_eq!(o.get("tcp_lanes").unwrap(), Some("8"));
        let before = o.clone();
        for (key, value, allowed) in [
            ("tcp_lanes", "0", "an integer 1..=64"),
            ("tcp_lanes", "four", "an integer 1..=64"),
            ("gpu_id", "-1", "a GPU index 0..=2147483647"),
            ("transfer_timeout", "1", "seconds 5..=1000000 (decimals allowed)"),
            ("connect_timeout_ms", "1.5", "whole milliseconds 1..=1000000000"),
            ("tcp_engine", "fast", "native, mooncake"),
            ("device_source", "env", "shared, remote_instance"),
            ("bind_address", " ", "non-empty text"),
        ] {
            let e = o.set(key, Some(value)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidValue, "{key}");
            assert_eq!(
                e.message(),
                format!("invalid value for engine option '{key}': {}; allowed values: {allowed}", py::repr_str(value))
            );
        }
        assert_eq!(o, before, "a failed set changes nothing");
        let e = o.set("lanes", Some("4")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownKey);
        assert!(e
            .message()
            .starts_with("unknown engine option 'lanes'; known options: gpu_id, device_source, min_port"));
        assert_eq!(o.get("nope").unwrap_err().kind(), ErrorKind::UnknownKey);
        o.set("gpu_id", None).unwrap();
        assert_eq!(o.gpu_id(), None);
        o.set("min_port", Some("20000")).unwrap();
        o.check().unwrap();
        o.set("max_port", Some("19000")).unwrap();
        assert_eq!(
            o.check().unwrap_err().message(),
            "engine options min_port=20000 and max_port=19000 give an empty port range"
        );
    }

    #[test]
    fn options_keep_the_normal_spelling() {
        let mut o = EngineOptions::new();
        for (key, given, kept) in [
            ("tcp_lanes", "+5", "5"),
            ("tcp_lanes", "05", "5"),
            ("tcp_lanes", " 7 ", "7"),
            ("gpu_id", "+3", "3"),
            ("gpu_id", "007", "7"),
            ("transfer_timeout", "7.50", "7.5"),
            ("transfer_timeout", "+30", "30"),
            ("transfer_timeout", "30.", "30"),
            ("connect_timeout_ms", "+250", "250"),
            ("ascend_npu_phy_id", "1_0", "10"),
            ("cuda_staging_bytes", "4096", "4096"),
            ("tcp_proto", " 1 ", "1"),
            ("bind_address", " 10.0.0.1 ", "10.0.0.1"),
        ] {
            o.set(key, Some(given)).unwrap();
            assert_eq!(o.get(key).unwrap(), Some(kept), "{key}={given:?}");
        }
        for (key, given) in [
            ("transfer_timeout", "1e3"),
            ("transfer_timeout", "inf"),
            ("transfer_timeout", "NaN"),
            ("transfer_timeout", "1..5"),
            ("tcp_lanes", "1_0"),
            ("tcp_lanes", "0x5"),
            ("connect_timeout_ms", "-5"),
            ("tcp_proto", "01"),
        ] {
            assert_eq!(o.set(key, Some(given)).unwrap_err().kind(), ErrorKind::InvalidValue, "{key}={given:?}");
        }
    }

    /// What an engine reads for `var` from `env`, as text (`None`: unset or ignored).
    fn as_read(env: &dyn Env, var: &Var) -> Option<String> {
        use crate::config::env::{get_int, read_choice};
        use std::time::Duration;
        match var.ty {
            Ty::Int { .. } if var.name == vars::ASCEND_NPU_PHY_ID.name => {
                get_int(env, var.name, None).value.map(|v| v.to_string())
            }
            Ty::Int { .. } => read::<i64>(env, var).map(|v| v.to_string()),
            Ty::Seconds { .. } | Ty::Millis { .. } | Ty::Micros { .. } => {
                read::<Duration>(env, var).map(|d| format!("{d:?}"))
            }
            Ty::Choice(_) => read_choice(env, var).ok().flatten().map(str::to_owned),
            Ty::Bool => read::<bool>(env, var).map(|b| b.to_string()),
            _ => read::<String>(env, var),
        }
    }

    /// For every option variable, the option takes a text exactly when its
    /// variable's reader reads it as a value in range, and the text the
    /// option keeps reads as that same value.
    #[test]
    fn an_option_takes_exactly_its_variables_forms() {
        let samples = [
            "5",
            "+5",
            "05",
            " 5 ",
            "-1",
            "0",
            "1e3",
            "7.5",
            ".5",
            "5.",
            "1_0",
            "abc",
            "",
            " ",
            "1",
            "2",
            "+1",
            "native",
            "mooncake",
            " native",
            "65536",
            "4096",
            "30",
            "99999999999999",
            "10.0.0.1",
        ];
        for var in OPTION_VARS {
            let key = option_key(var);
            for raw in samples {
                let env = MapEnv::from_pairs(&[(var.name, raw)]);
                let from_env = as_read(&env, var);
                let in_range = crate::config::env::parse_as_read(var, raw).is_some_and(|p| p.in_range(var.ty));
                let mut o = EngineOptions::new();
                match o.set(&key, Some(raw)) {
                    Ok(()) => {
                        assert!(in_range, "{key}={raw:?} taken but {} would not read it in range", var.name);
                        let seen = OptionsEnv { base: &MapEnv::new(), options: &o };
                        assert_eq!(as_read(&seen, var), from_env, "{key}={raw:?} kept as {:?}", o.get(&key));
                        assert!(from_env.is_some(), "{key}={raw:?}");
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::InvalidValue);
                        assert!(!in_range, "{key}={raw:?} refused but {} reads it in range", var.name);
                    }
                }
            }
        }
    }

    #[test]
    fn an_option_takes_its_variables_place() {
        use std::time::Duration;
        let env = MapEnv::from_pairs(&[("PDX_TCP_LANES", "2"), ("MC_TRANSFER_TIMEOUT", "9"), ("PDX_WORKERS", "3")]);
        let mut o = EngineOptions::new();
        o.set("tcp_lanes", Some("16")).unwrap();
        o.set("transfer_timeout", Some("40")).unwrap();
        let seen = OptionsEnv { base: &env, options: &o };
        assert_eq!(read::<usize>(&seen, &vars::PDX_TCP_LANES), Some(16), "the option wins over PDX_TCP_LANES");
        assert_eq!(read::<usize>(&seen, &vars::PDX_WORKERS), Some(3), "no option: the variable");
        assert_eq!(read::<Duration>(&seen, &vars::MC_TRANSFER_TIMEOUT), Some(Duration::from_secs(40)));
        assert_eq!(seen.var("PDX_TCP_LANES").as_deref(), Some("16"));
    }

    /// The README's option table is [`markdown_table`]
    /// (`PDX_BLESS_README=1 cargo test --lib options_table` rewrites it).
    #[test]
    fn readme_options_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = ("<!-- options-table:begin -->\n", "<!-- options-table:end -->");
        let start = readme.find(begin).expect("README has no options-table:begin marker") + begin.len();
        let stop = readme[start..].find(end).expect("README has no options-table:end marker") + start;
        let table = markdown_table();
        if readme[start..stop] != table {
            if std::env::var_os("PDX_BLESS_README").is_some() {
                std::fs::write(&path, format!("{}{table}{}", &readme[..start], &readme[stop..])).unwrap();
                return;
            }
            panic!("README's options table is stale: run PDX_BLESS_README=1 cargo test --lib options_table");
        }
    }
}
