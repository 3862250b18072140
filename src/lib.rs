//! pdx: KV-cache transfer for prefill/decode (PD) disaggregation.
//!
//! Layers, in the direction data flows:
//! - [`config`]: SGLang's PD argument rules and transport resolution (pure Rust).
//! - [`device`]: the CUDA driver, loaded at run time (probe, device buffers).
//! - [`engine`]: the native TCP transfer engine (pure Rust).
//! - [`ffi`]: the C ABI; checks and converts, then calls the core.
//!
//! The pure-Rust core never sees a raw C pointer except for the memory
//! addresses that a transfer engine moves bytes between.

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod backend;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod ffi;
pub(crate) mod ids;
pub mod logging;
pub mod mooncake;
pub mod transfer;

pub use error::{Error, ErrorKind, Result};

// Handles and ids handed to C are 64-bit values carried in pointers.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("pdx supports 64-bit targets only");
