//! Which backend serves a protocol: the native TCP engine for `tcp` (unless
//! `PDX_TCP_ENGINE=mooncake`), Mooncake's engine for every other protocol.
//! The one module that knows both backends; the ABI calls only [`start_with`]
//! (and [`choose`], to show the choice without starting).

use serde_json::{json, Value};

use crate::config::engine_options::{EngineOptions, OptionsEnv};
use crate::config::env::{Env, ProcessEnv};
use crate::config::transport::{resolve_transport_for, TransportChoice, KNOWN_PROTOCOLS};
use crate::error::Result;
use crate::transfer::TransferBackend;

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
/// [`crate::config::transport`]) and start the backend that serves it, its
/// settings read from the options over the environment. Returns the
/// backend and the choice it was started with.
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
    if choice.protocol == "tcp" && !crate::mooncake::tcp_uses_mooncake_in(&env)? {
        let settings = crate::engine::settings::Settings::from(&env);
        let engine = crate::engine::Engine::start_with(&choice.hostname, settings)?;
        return Ok((Box::new(engine), choice));
    }
    let backend = crate::mooncake::MooncakeBackend::start_in(&choice, &env)?;
    Ok((Box::new(backend), choice))
}

/// What this build on this machine can serve, as JSON: every backend (the
/// native `tcp` engine; Mooncake's, with whether its library loads and why
/// not) with the protocols it may carry, and every kind of memory a region
/// may live in, with whether it is usable here and why not. Probes are read
/// afresh on every call (a library installed later is found).
pub fn capabilities() -> Value {
    let mooncake = crate::mooncake::load();
    let mooncake_protocols: Vec<&str> = KNOWN_PROTOCOLS.to_vec();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "backends": [
            {"name": "tcp", "engine": "native", "available": true, "protocols": ["tcp"]},
            {
                "name": "mooncake",
                "available": mooncake.is_ok(),
                "library": mooncake.as_ref().map(|api| api.path().to_owned()).ok(),
                "reason": mooncake.as_ref().err(),
                "protocols": mooncake_protocols,
            },
        ],
        "memory": [
            {"kind": "cpu", "available": true},
            cuda_capability(),
        ],
    })
}

/// Device memory: usable when the CUDA driver (`PDX_CUDA_LIB`) loads and
/// reports at least one device; staged through pinned host memory.
fn cuda_capability() -> Value {
    let library = crate::engine::cuda::driver_path();
    let probe = crate::engine::cuda::driver().and_then(|api| {
        let (mut count, mut version) = (0, 0);
        // SAFETY: the driver is initialized by the loader; both out-params
        // are live locals.
        let counted = unsafe { (api.device_get_count)(&mut count) };
        api.check(counted, "cuDeviceGetCount").map_err(crate::engine::cuda::device_error)?;
        // SAFETY: as above.
        let versioned = unsafe { (api.driver_get_version)(&mut version) };
        api.check(versioned, "cuDriverGetVersion").map_err(crate::engine::cuda::device_error)?;
        Ok((count, version))
    });
    match probe {
        Ok((devices, version)) if devices > 0 => json!({"kind": "cuda", "available": true, "staged": true,
            "devices": devices, "driver_version": version, "library": library}),
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
        assert_eq!(c["backends"][0]["available"], true);
        let mc = &c["backends"][1];
        assert_eq!(mc["name"], "mooncake");
        // Either it loads (and names the library) or it says why not.
        assert!(mc["available"] == true && mc["library"].is_string() || mc["reason"].is_string(), "{mc}");
        assert_eq!(c["memory"][0]["kind"], "cpu");
        let cuda = &c["memory"][1];
        assert_eq!(cuda["kind"], "cuda");
        assert!(cuda["available"] == true || cuda["reason"].is_string(), "{cuda}");
    }
}
