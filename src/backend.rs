//! The transfer backends pdx can start, in one table ([`BACKENDS`]): each
//! one's name and aliases, the protocols it carries, whether it can run here
//! and why not, and how it starts. The ABI (`pdx_backend_available`,
//! `pdx_capabilities`, `pdx_engine_init*`) and [`capabilities`] read it; the
//! one rule between rows is `tcp`'s: the native engine unless
//! `PDX_TCP_ENGINE=mooncake` ([`serving`]). The one module that knows both
//! backends.

use serde_json::{json, Value};

use crate::config::engine_options::{EngineOptions, OptionsEnv};
use crate::config::env::{self, vars, Env, ProcessEnv};
use crate::config::transport::{resolve_transport_for, TransportChoice, KNOWN_PROTOCOLS};
use crate::error::{Error, ErrorKind, Result};
use crate::transfer::TransferBackend;

/// Whether a backend can run in this process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Availability {
    /// The library it runs on, when it loads one and that loaded.
    pub library: Option<String>,
    /// Why it cannot run here; `None` when it can.
    pub unavailable: Option<String>,
}

/// One backend pdx can start.
pub struct Backend {
    /// The name C and Python ask for (`pdx_backend_available`).
    pub name: &'static str,
    /// Other names for it.
    pub aliases: &'static [&'static str],
    /// The engine that runs it, as `PDX_TCP_ENGINE` names it.
    pub engine: &'static str,
    /// What it is, for messages.
    pub summary: &'static str,
    /// The protocols it may carry.
    pub protocols: &'static [&'static str],
    /// Whether it can run here, with settings read from `env`; probed
    /// afresh on each call (a library installed later is found).
    pub probe: fn(&dyn Env) -> Availability,
    /// Start it for `choice`, its settings read from `env`.
    pub start: fn(&TransportChoice, &dyn Env) -> Result<Box<dyn TransferBackend>>,
}

impl Backend {
    /// Whether `name` is this backend's name or one of its aliases.
    pub fn is_named(&self, name: &str) -> bool {
        self.name == name || self.aliases.contains(&name)
    }
}

/// Every backend, in the order `pdx_capabilities` lists them.
pub static BACKENDS: &[Backend] = &[
    Backend {
        name: "tcp",
        aliases: &["native"],
        engine: "native",
        summary: "the native engine",
        protocols: &["tcp"],
        probe: |_| Availability::default(),
        start: |choice, env| {
            let settings = crate::engine::settings::Settings::from(env);
            Ok(Box::new(crate::engine::Engine::start_with(&choice.hostname, settings)?))
        },
    },
    Backend {
        name: "mooncake",
        aliases: &[],
        engine: "mooncake",
        summary: "Mooncake's Transfer Engine, loaded from PDX_MOONCAKE_LIB",
        protocols: KNOWN_PROTOCOLS,
        probe: |env| match crate::mooncake::load_in(env) {
            Ok(api) => Availability { library: Some(api.path().to_owned()), unavailable: None },
            Err(why) => Availability { library: None, unavailable: Some(why) },
        },
        start: |choice, env| Ok(Box::new(crate::mooncake::MooncakeBackend::start_in(choice, env)?)),
    },
];

/// The backend named (or aliased) `name`.
pub fn find(name: &str) -> Option<&'static Backend> {
    BACKENDS.iter().find(|b| b.is_named(name))
}

/// `None` when the backend `name` can run here (the process environment),
/// else why not (an unknown name included).
pub fn unavailable_reason(name: &str) -> Option<String> {
    match find(name) {
        Some(backend) => (backend.probe)(&ProcessEnv).unavailable,
        None => {
            let known: Vec<String> = BACKENDS.iter().map(|b| format!("{} ({})", b.name, b.summary)).collect();
            Some(format!("no backend is named {name:?}; known: {}", known.join(", ")))
        }
    }
}

/// The backend that serves `protocol` with settings from `env`: for `tcp`
/// the engine `PDX_TCP_ENGINE` names (default `native`), else the first
/// backend that carries the protocol.
///
/// Errors: `InvalidValue` (a `PDX_TCP_ENGINE` that is not a choice),
/// `UnknownProtocol` (no backend carries it).
pub fn serving(protocol: &str, env: &dyn Env) -> Result<&'static Backend> {
    let engine = match protocol {
        "tcp" => Some(env::read_choice(env, &vars::PDX_TCP_ENGINE)?.unwrap_or(vars::PDX_TCP_ENGINE.default)),
        _ => None,
    };
    BACKENDS
        .iter()
        .find(|b| b.protocols.contains(&protocol) && engine.is_none_or(|e| b.engine == e))
        .ok_or_else(|| Error::new(ErrorKind::UnknownProtocol, format!("no backend carries protocol '{protocol}'")))
}

/// The transport an engine with `options` would start with, against `base`
/// (the process environment in production): the options' values stand in
/// for their variables (see [`crate::config::engine_options`]).
pub fn choose(
    base: &dyn Env,
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    options: &EngineOptions,
) -> Result<TransportChoice> {
    options.check()?;
    let env = OptionsEnv { base, options };
    resolve_transport_for(&env, hostname, protocol, device, options.gpu_id(), options.device_rule())
}

/// [`start_with`] without options (the shared-engine rule, GPU 0, every
/// setting from the environment).
pub fn start(hostname: &str, protocol: Option<&str>, device: Option<&str>) -> Result<Box<dyn TransferBackend>> {
    start_with(hostname, protocol, device, &EngineOptions::new()).map(|(backend, _)| backend)
}

/// Resolve the transport for an engine on `hostname` (explicit `protocol` >
/// `MOONCAKE_PROTOCOL`; `MC_FORCE_TCP` forces tcp; the device by the
/// options' `device_source` rule for their `gpu_id`; see
/// [`crate::config::transport`]) and start the backend that serves it
/// ([`serving`]), its settings read from the options over the environment.
/// Returns the backend and the choice it was started with.
pub fn start_with(
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    options: &EngineOptions,
) -> Result<(Box<dyn TransferBackend>, TransportChoice)> {
    let choice = choose(&ProcessEnv, hostname, protocol, device, options)?;
    for w in &choice.warnings {
        log::warn!("{w}");
    }
    log::info!("starting a transfer engine: {}", choice.reason);
    let env = OptionsEnv { base: &ProcessEnv, options };
    let backend = serving(&choice.protocol, &env)?;
    Ok(((backend.start)(&choice, &env)?, choice))
}

/// What this build on this machine can serve, as JSON: every backend of
/// [`BACKENDS`] (whether it can run here and why not, the library it loads,
/// the protocols it may carry), and every kind of memory a region may live
/// in, with whether it is usable here and why not. Probes are read afresh on
/// every call (a library installed later is found).
pub fn capabilities() -> Value {
    let backends: Vec<Value> = BACKENDS
        .iter()
        .map(|b| {
            let a = (b.probe)(&ProcessEnv);
            json!({
                "name": b.name,
                "aliases": b.aliases,
                "engine": b.engine,
                "available": a.unavailable.is_none(),
                "library": a.library,
                "reason": a.unavailable,
                "protocols": b.protocols,
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "backends": backends,
        "memory": [
            {"kind": "cpu", "available": true},
            cuda_capability(),
        ],
    })
}

/// Device memory: usable when the CUDA driver (`PDX_CUDA_LIB`) loads and
/// reports at least one device; staged through pinned host memory.
fn cuda_capability() -> Value {
    let library = crate::device::driver_path();
    match crate::device::probe() {
        Ok(p) if p.devices > 0 => json!({"kind": "cuda", "available": true, "staged": true,
            "devices": p.devices, "driver_version": p.driver_version, "library": library}),
        Ok(_) => json!({"kind": "cuda", "available": false, "library": library,
            "reason": "the CUDA driver loads but reports no device"}),
        Err(e) => json!({"kind": "cuda", "available": false, "library": library, "reason": e.message()}),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::engine_options::DeviceRule;
    use crate::config::env::MapEnv;

    fn options(pairs: &[(&str, &str)]) -> EngineOptions {
        let mut o = EngineOptions::new();
        for (k, v) in pairs {
            o.set(k, Some(v)).unwrap();
        }
        o
    }

    /// Each option feeds the engine's settings in its variable's place.
    #[test]
    fn options_feed_the_settings() {
        let env = MapEnv::from_pairs(&[("PDX_TCP_LANES", "2"), ("MC_TRANSFER_TIMEOUT", "9"), ("PDX_WORKERS", "3")]);
        let o = options(&[("tcp_lanes", "16"), ("transfer_timeout", "40"), ("spin_us", "0"), ("tcp_proto", "1")]);
        let s = crate::engine::settings::Settings::from(&OptionsEnv { base: &env, options: &o });
        assert_eq!(s.lanes_per_peer, 16, "the option wins over PDX_TCP_LANES");
        assert_eq!(s.workers, 3, "no option: the variable");
        assert_eq!(s.lane_wait_timeout, Duration::from_secs(40), "transfer_timeout stands for MC_TRANSFER_TIMEOUT");
        assert_eq!(s.spin, Duration::ZERO);
        assert!(s.force_v1);
        // PDX_LANE_WAIT_TIMEOUT_MS ranks above MC_TRANSFER_TIMEOUT, so it
        // also ranks above the option that takes MC_TRANSFER_TIMEOUT's place.
        env.set("PDX_LANE_WAIT_TIMEOUT_MS", "1500");
        let s = crate::engine::settings::Settings::from(&OptionsEnv { base: &env, options: &o });
        assert_eq!(s.lane_wait_timeout, Duration::from_millis(1500));
        let o = options(&[("lane_wait_timeout_ms", "2500")]);
        let s = crate::engine::settings::Settings::from(&OptionsEnv { base: &env, options: &o });
        assert_eq!(s.lane_wait_timeout, Duration::from_millis(2500));
    }

    /// One engine per GPU: the 8-GPU mapping gives each `gpu_id` its entry.
    #[test]
    fn gpu_id_picks_its_entry() {
        let map: String = format!(
            "{{{}}}",
            (0..8).map(|g| format!("\"{g}\": \"mlx5_{g}, mlx5_{}\"", g + 8)).collect::<Vec<_>>().join(", ")
        );
        for g in 0..8 {
            let o = options(&[("gpu_id", &g.to_string())]);
            let c = choose(&MapEnv::new(), "10.0.0.5", None, Some(&map), &o).unwrap();
            assert_eq!(c.device, format!("mlx5_{g}, mlx5_{}", g + 8));
            assert_eq!((c.gpu_id, c.rule), (g, DeviceRule::Shared));
            assert!(c.reason.contains(&format!("entry {g} of the inline per-GPU JSON mapping")), "{}", c.reason);
        }
        let e = choose(&MapEnv::new(), "10.0.0.5", None, Some(&map), &options(&[("gpu_id", "8")])).unwrap_err();
        assert_eq!(e.message(), "No IB devices configured for GPU 8. Available GPUs: [0, 1, 2, 3, 4, 5, 6, 7]");
    }

    /// SGLang's `initialize` (mooncake_transfer_engine.py at d4801be, lines
    /// 196-198): suffix = gpu_id when ASCEND_NPU_PHY_ID is -1, else that id;
    /// the option `ascend_npu_phy_id` takes the variable's place.
    #[test]
    fn gpu_id_and_phy_id_options_make_the_ascend_suffix() {
        let env = MapEnv::from_pairs(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1"), ("ASCEND_NPU_PHY_ID", "-1")]);
        let c = choose(&env, "10.0.0.5", None, None, &options(&[("gpu_id", "5")])).unwrap();
        assert_eq!(c.protocol, "ascend");
        assert!(c.hostname.starts_with("10.0.0.5:") && c.hostname.ends_with(":npu_5"), "{}", c.hostname);
        let o = options(&[("gpu_id", "5"), ("ascend_npu_phy_id", "2")]);
        let c = choose(&env, "10.0.0.5", None, None, &o).unwrap();
        assert!(c.hostname.ends_with(":npu_2"), "{}", c.hostname);
        // The remote-instance rule has no Ascend path.
        let o = options(&[("gpu_id", "5"), ("device_source", "remote_instance")]);
        let c = choose(&env, "10.0.0.5", None, None, &o).unwrap();
        assert_eq!((c.protocol.as_str(), c.hostname.as_str()), ("rdma", "10.0.0.5"));
    }

    #[test]
    fn capabilities_name_every_backend_and_memory_kind() {
        let c = capabilities();
        assert_eq!(c["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(c["backends"][0]["name"], "tcp");
        assert_eq!(c["backends"][0]["engine"], "native");
        assert_eq!(c["backends"][0]["available"], true);
        assert_eq!(c["backends"][0]["protocols"], json!(["tcp"]));
        let mc = &c["backends"][1];
        assert_eq!(mc["name"], "mooncake");
        assert_eq!(mc["protocols"], json!(KNOWN_PROTOCOLS));
        // Either it loads (and names the library) or it says why not, the
        // same text `pdx_backend_unavailable_reason` gives.
        assert!(mc["available"] == true && mc["library"].is_string() || mc["reason"].is_string(), "{mc}");
        assert_eq!(mc["reason"].as_str().map(str::to_owned), unavailable_reason("mooncake"));
        assert_eq!(c["memory"][0]["kind"], "cpu");
        let cuda = &c["memory"][1];
        assert_eq!(cuda["kind"], "cuda");
        assert!(cuda["available"] == true || cuda["reason"].is_string(), "{cuda}");
    }

    #[test]
    fn backends_are_found_by_name_or_alias() {
        assert_eq!(find("tcp").map(|b| b.name), Some("tcp"));
        assert_eq!(find("native").map(|b| b.name), Some("tcp"));
        assert_eq!(find("mooncake").map(|b| b.name), Some("mooncake"));
        assert!(find("infiniband").is_none() && find("").is_none());
        assert_eq!(unavailable_reason("native"), None);
        assert_eq!(
            unavailable_reason("infiniband").unwrap(),
            "no backend is named \"infiniband\"; known: tcp (the native engine), mooncake (Mooncake's Transfer \
             Engine, loaded from PDX_MOONCAKE_LIB)"
        );
        let mut names: Vec<&str> =
            BACKENDS.iter().flat_map(|b| std::iter::once(b.name).chain(b.aliases.iter().copied())).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name or alias is used twice");
    }

    /// `tcp` runs where `PDX_TCP_ENGINE` says (the native engine unless
    /// `mooncake`); every other protocol on Mooncake's engine.
    #[test]
    fn serving_follows_pdx_tcp_engine_for_tcp_only() {
        let serve = |pairs: &[(&str, &str)], protocol| serving(protocol, &MapEnv::from_pairs(pairs)).map(|b| b.name);
        assert_eq!(serve(&[], "tcp").unwrap(), "tcp");
        assert_eq!(serve(&[("PDX_TCP_ENGINE", "native")], "tcp").unwrap(), "tcp");
        assert_eq!(serve(&[("PDX_TCP_ENGINE", "mooncake")], "tcp").unwrap(), "mooncake");
        assert_eq!(serve(&[("PDX_TCP_ENGINE", "native")], "rdma").unwrap(), "mooncake");
        assert_eq!(serve(&[], "efa").unwrap(), "mooncake");
        let e = serve(&[("PDX_TCP_ENGINE", "fast")], "tcp").unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::InvalidValue, "PDX_TCP_ENGINE=\"fast\" is not one of: native, mooncake")
        );
        assert_eq!(serve(&[], "carrier-pigeon").unwrap_err().kind(), ErrorKind::UnknownProtocol);
    }

    /// The table and the resolver agree: every protocol the resolver accepts
    /// has a backend, every backend's protocols are ones it accepts, and
    /// every `PDX_TCP_ENGINE` choice names an engine that carries `tcp`.
    #[test]
    fn the_table_covers_what_the_resolver_accepts() {
        for protocol in KNOWN_PROTOCOLS {
            assert!(serving(protocol, &MapEnv::new()).is_ok(), "no backend carries {protocol}");
        }
        for b in BACKENDS {
            for protocol in b.protocols {
                assert!(
                    KNOWN_PROTOCOLS.contains(protocol),
                    "{} carries {protocol}, which the resolver refuses",
                    b.name
                );
            }
        }
        let crate::config::env::Ty::Choice(engines) = vars::PDX_TCP_ENGINE.ty else {
            panic!("PDX_TCP_ENGINE is a choice")
        };
        for engine in engines {
            let env = MapEnv::from_pairs(&[("PDX_TCP_ENGINE", engine)]);
            assert_eq!(serving("tcp", &env).unwrap().engine, *engine);
        }
    }
}
