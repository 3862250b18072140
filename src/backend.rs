//! Which backend serves a protocol: the native TCP engine for `tcp` (unless
//! `PDX_TCP_ENGINE=mooncake`), Mooncake's engine for every other protocol.
//! The one module that knows both backends; the ABI calls only [`start`].

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
