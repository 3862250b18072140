//! Driver types and the constants pdx needs (values from the driver's
//! `cuda.h`, which this crate does not include).

use std::ffi::{c_int, c_void};

/// `CUresult`: 0 is success, everything else an error code.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal handle.
pub type CUdevice = c_int;
/// `CUcontext`: an opaque context pointer.
pub type CUcontext = *mut c_void;
/// `CUstream`: an opaque stream pointer (NULL is the legacy default stream).
pub type CUstream = *mut c_void;
/// `CUevent`: an opaque event pointer.
pub type CUevent = *mut c_void;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = u64;
/// `CUpointer_attribute`.
pub type CUpointerAttribute = c_int;

/// Bytes of a [`CUipcMemHandle`] (`CU_IPC_HANDLE_SIZE`).
pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// `CUipcMemHandle`: names a device allocation for another process
/// (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2`); opaque bytes, passed by
/// value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CUipcMemHandle {
    pub reserved: [u8; CU_IPC_HANDLE_SIZE],
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: let `cuIpcOpenMemHandle_v2` enable
/// peer access when the allocation is on another device.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_MAP_FAILED: CUresult = 205;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: writes a `CUmemorytype` (u32).
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CUpointerAttribute = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`: writes an `int` (non-zero: managed
/// memory, which the CPU may touch).
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: CUpointerAttribute = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: writes an `int`.
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: CUpointerAttribute = 9;

/// `CUmemorytype` values.
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context.
pub const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with stream 0.
pub const CU_STREAM_NON_BLOCKING: u32 = 0x01;
