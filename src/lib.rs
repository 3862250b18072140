//! pdx: KV-cache transfer for prefill/decode (PD) disaggregation.
//!
//! Layers, in the direction data flows:
//! - [`config`]: SGLang's PD argument rules and transport resolution (pure Rust).
//! - [`engine`]: the native TCP transfer engine (pure Rust).
//! - [`ffi`]: the C ABI; checks and converts, then calls the core.
//!
//! The pure-Rust core never sees a raw C pointer except for the memory
//! addresses that a transfer engine moves bytes between.

pub mod backend;
pub mod config;
pub mod engine;
pub mod error;
pub mod ffi;
pub mod ids;
pub mod location;
pub mod logging;
pub mod mooncake;

pub use error::{Error, ErrorKind, Result};
