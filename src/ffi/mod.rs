//! The C ABI. This layer only checks and converts: every exported function
//! runs inside [`guard`], validates its pointers and strings, calls the pure
//! Rust core, and turns the result into a `pdx_status` plus out-params that
//! are written only on success.

#[macro_use]
pub(crate) mod boundary;
pub mod args;
pub mod backend;
pub mod engine;
pub mod engine_options;
pub mod ib_device;
pub mod kv;
pub mod log;
pub mod metrics;
pub mod stats;
pub mod status;
pub mod transport;
pub mod version;

pub use status::*;
