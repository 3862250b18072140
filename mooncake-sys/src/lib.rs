//! Mooncake Transfer Engine's classic C API (`transfer_engine_c.h`),
//! declared from its documented signatures and loaded at run time.
//!
//! Nothing links against Mooncake when this crate builds: [`Api::load`]
//! opens the library named by `PDX_MOONCAKE_LIB` (default
//! `libtransfer_engine.so`) with `dlopen`, resolves every symbol once into a
//! struct of function pointers, and reports a missing library or symbol as
//! an error that names it.
//!
//! - [`types`]: the `#[repr(C)]` structs (layouts checked at compile time)
//!   and the integer constants. Values C writes are plain integers.
//! - [`status`]: decoding Mooncake's two return conventions (positive
//!   `Status::Code`, negative `ERR_*`).
//! - [`loader`]: the library and its symbols.

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod loader;
pub mod status;
pub mod types;

pub use loader::{load_cached, Api, LoadError, DEFAULT_LIB, REQUIRED_SYMBOLS};
pub use status::{check, Code, Convention, McError};
pub use types::*;
