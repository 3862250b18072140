//! Mooncake's own Transfer Engine as a pdx backend, for every protocol the
//! native engine does not speak (rdma, efa, ascend, nvlink, ...) and for
//! `tcp` when `PDX_TCP_ENGINE=mooncake` (the rule is in `crate::backend`'s
//! table).
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

mod backend;
mod batches;
mod convert;
mod topology;

use std::sync::Arc;

pub use backend::MooncakeBackend;

use crate::config::env::{self, vars, Env, ProcessEnv};

/// Load (once per path) the library `PDX_MOONCAKE_LIB` names (default
/// `libtransfer_engine.so`, found on the dynamic linker's search path); the
/// error text names the library and what is missing.
pub fn load() -> std::result::Result<Arc<mooncake_sys::Api>, String> {
    load_in(&ProcessEnv)
}

/// [`load`] with `PDX_MOONCAKE_LIB` read from `env` (an engine's options).
pub fn load_in(env: &dyn Env) -> std::result::Result<Arc<mooncake_sys::Api>, String> {
    let path: String = env::read(env, &vars::PDX_MOONCAKE_LIB).unwrap_or_else(|| mooncake_sys::DEFAULT_LIB.to_owned());
    mooncake_sys::load_cached(&path).map_err(|e| match e {
        mooncake_sys::LoadError::Open { .. } => {
            format!("{e} (set PDX_MOONCAKE_LIB to the path of a libtransfer_engine.so built with its C API)")
        }
        _ => e.to_string(),
    })
}
