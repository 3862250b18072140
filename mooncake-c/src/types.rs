//! The C types and values of Mooncake's C API as this library serves them.
//!
//! The four structs Mooncake's engine reads and writes on every call
//! (`transfer_request`, `transfer_status`, `buffer_entry`, `notify_msg`) are
//! the ones `mooncake-sys` declares to load Mooncake's own library: one
//! declaration of each layout in the workspace. The two that only this side
//! needs (`segment_desc`, `nic_load_stat`) are declared here. Every layout is
//! checked at compile time and again from C (`c_tests/mooncake_c/test_mc_abi.c`).

use std::ffi::{c_char, c_int, c_void};

pub use mooncake_sys::types::{
    BatchId, BufferEntry, NotifyMsg, SegmentId, TransferRequest, TransferStatus, INVALID_BATCH, LOCAL_SEGMENT,
    OPCODE_READ, OPCODE_WRITE, STATUS_CANCELED, STATUS_COMPLETED, STATUS_FAILED, STATUS_INVALID, STATUS_PENDING,
    STATUS_TIMEOUT, STATUS_WAITING,
};

/// `segment_desc`'s `rdma` arm.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SegmentDescRdma {
    pub addr: *mut c_void,
    pub size: u64,
    pub location: *const c_char,
}

/// `segment_desc`'s `nvmeof` arm.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SegmentDescNvmeof {
    pub file_path: *const c_char,
    pub subsystem_name: *const c_char,
    pub proto: *const c_char,
    pub ip: *const c_char,
    pub port: u64,
}

/// The union of `segment_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union SegmentDescUnion {
    pub rdma: SegmentDescRdma,
    pub nvmeof: SegmentDescNvmeof,
}

/// `struct segment_desc`: declared by the header, taken by no call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SegmentDesc {
    pub kind: c_int,
    pub desc: SegmentDescUnion,
}

/// `struct nic_load_stat`, filled by `getNicLoadStats`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NicLoadStat {
    pub device_name: [c_char; 64],
    pub inflight_bytes: u64,
    pub ewma_bandwidth_bps: f64,
}

// LP64 layouts (the only targets pdx builds for).
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<TransferRequest>() == 40 && align_of::<TransferRequest>() == 8);
    assert!(offset_of!(TransferRequest, opcode) == 0 && offset_of!(TransferRequest, source) == 8);
    assert!(offset_of!(TransferRequest, target_id) == 16 && offset_of!(TransferRequest, target_offset) == 24);
    assert!(offset_of!(TransferRequest, length) == 32);
    assert!(size_of::<TransferStatus>() == 16);
    assert!(offset_of!(TransferStatus, status) == 0 && offset_of!(TransferStatus, transferred_bytes) == 8);
    assert!(size_of::<NotifyMsg>() == 16 && offset_of!(NotifyMsg, msg) == 8);
    assert!(size_of::<BufferEntry>() == 16 && offset_of!(BufferEntry, length) == 8);
    assert!(size_of::<SegmentDesc>() == 48 && offset_of!(SegmentDesc, desc) == 8);
    assert!(size_of::<SegmentDescRdma>() == 24 && size_of::<SegmentDescNvmeof>() == 40);
    assert!(size_of::<NicLoadStat>() == 80);
    assert!(offset_of!(NicLoadStat, inflight_bytes) == 64 && offset_of!(NicLoadStat, ewma_bandwidth_bps) == 72);
    assert!(LOCAL_SEGMENT == 0 && INVALID_BATCH == u64::MAX && OPCODE_READ == 0 && OPCODE_WRITE == 1);
    assert!(STATUS_WAITING == 0 && STATUS_PENDING == 1 && STATUS_INVALID == 2 && STATUS_CANCELED == 3);
    assert!(STATUS_COMPLETED == 4 && STATUS_TIMEOUT == 5 && STATUS_FAILED == 6);
};
