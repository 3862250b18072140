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

/// Record `message` as the calling thread's last error, the text
/// `pdx_last_error_message` returns: for C front ends built on this crate
/// (`mooncake-c`, Mooncake's C API) that report through pdx's last error.
pub fn set_last_error(message: &str) {
    boundary::set_last_error(message);
}
