//! Which backend serves a protocol: the native TCP engine for `tcp` (unless
//! `PDX_TCP_ENGINE=mooncake`), Mooncake's engine for every other protocol.
//! The one module that knows both backends; the ABI calls only [`start`].

use serde_json::{json, Value};

use crate::config::transport::KNOWN_PROTOCOLS;
use crate::error::Result;
use crate::transfer::TransferBackend;

/// Resolve the transport for an engine on `hostname` (explicit `protocol` >
/// `MOONCAKE_PROTOCOL`; `MC_FORCE_TCP` forces tcp; see
/// [`crate::config::transport`]) and start the backend that serves it.
pub fn start(hostname: &str, protocol: Option<&str>, device: Option<&str>) -> Result<Box<dyn TransferBackend>> {
    let choice = crate::config::transport::resolve_transport_from_process_env(hostname, protocol, device, -1)?;
    for w in &choice.warnings {
        log::warn!("{w}");
    }
    log::info!("starting a transfer engine: {}", choice.reason);
    if choice.protocol == "tcp" && !crate::mooncake::tcp_uses_mooncake()? {
        return Ok(Box::new(crate::engine::Engine::start(&choice.hostname)?));
    }
    Ok(Box::new(crate::mooncake::MooncakeBackend::start(&choice)?))
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
    #[test]
    fn capabilities_name_every_backend_and_memory_kind() {
        let c = super::capabilities();
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
