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

/// The variables this crate reads or writes, with SGLang's defaults.
pub mod names {
    /// Raw presence check; set to `"1"` (setdefault) by the `mooncake_tcp` alias.
    pub const MC_FORCE_TCP: &str = "MC_FORCE_TCP";
    /// EnvStr, default `"rdma"`.
    pub const MOONCAKE_PROTOCOL: &str = "MOONCAKE_PROTOCOL";
    /// EnvStr, default `""`.
    pub const MOONCAKE_DEVICE: &str = "MOONCAKE_DEVICE";
    /// EnvBool, default false.
    pub const ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE: &str = "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE";
    /// EnvInt, default -1.
    pub const ASCEND_NPU_PHY_ID: &str = "ASCEND_NPU_PHY_ID";
    /// EnvBool, default false.
    pub const SGLANG_DISAGG_STAGING_BUFFER: &str = "SGLANG_DISAGG_STAGING_BUFFER";
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
}
