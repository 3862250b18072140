//! Mooncake's own Transfer Engine as a pdx backend, for every protocol the
//! native engine does not speak (rdma, efa, ascend, nvlink, ...) and for
//! `tcp` when `PDX_TCP_ENGINE=mooncake`.
//!
//! The library is loaded at run time through [`mooncake_sys`]
//! (`PDX_MOONCAKE_LIB`, default `libtransfer_engine.so`); nothing links
//! against Mooncake at build time.
//!
//! - [`backend`]: the engine behind [`crate::backend::TransferBackend`].
//! - [`batches`]: pdx batch ids (index + generation) over Mooncake's
//!   pointer-valued batch ids, which never reach C.
//! - [`convert`]: Mooncake's mixed return conventions and task states as pdx
//!   errors and states.
//! - [`topology`]: the device list as Mooncake's NIC priority matrix.

pub mod backend;
mod batches;
pub mod convert;
pub mod topology;

use std::sync::Arc;

pub use backend::MooncakeBackend;

/// The environment variable that makes `tcp` run on Mooncake's engine.
pub const TCP_ENGINE_ENV: &str = "PDX_TCP_ENGINE";

/// Load (once) the library `PDX_MOONCAKE_LIB` names; the error text names
/// the library and what is missing.
pub fn load() -> std::result::Result<Arc<mooncake_sys::Api>, String> {
    mooncake_sys::load_default().map_err(|e| e.to_string())
}

/// Whether `tcp` should run on Mooncake's engine: `PDX_TCP_ENGINE` is
/// `mooncake` (`native` or unset: the native engine).
pub fn tcp_uses_mooncake() -> crate::Result<bool> {
    match std::env::var(TCP_ENGINE_ENV) {
        Err(_) => Ok(false),
        Ok(v) => match v.trim() {
            "" | "native" => Ok(false),
            "mooncake" => Ok(true),
            other => Err(crate::Error::new(
                crate::ErrorKind::InvalidValue,
                format!("{TCP_ENGINE_ENV}={other:?} is neither 'native' nor 'mooncake'"),
            )),
        },
    }
}
