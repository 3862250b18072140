//! The CUDA *driver* API entry points pdx stages device memory with,
//! declared from their documented signatures and loaded at run time.
//!
//! Nothing links against CUDA when this crate builds: [`Api::load`] opens
//! the library its caller names (pdx: `PDX_CUDA_LIB`, default
//! [`DEFAULT_LIB`]) with `dlopen`, resolves every symbol once into a struct of function pointers,
//! and reports a missing library or symbol as an error that names it. Only
//! the entry points in [`REQUIRED_SYMBOLS`] are used, so any faithful
//! stand-in of the driver works; `cuMemAlloc_v2` / `cuMemFree_v2` are
//! resolved when present, for tests and the benchmark only, and the CUDA IPC
//! entry points (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`,
//! `cuIpcCloseMemHandle`, `cuMemGetAddressRange_v2`, `cuMemcpyDtoDAsync_v2`)
//! when present: a driver without them still loads.

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod loader;
pub mod types;

pub use loader::{load_cached, resident, Api, CudaError, LoadError, DEFAULT_LIB, REQUIRED_SYMBOLS};
pub use types::*;
