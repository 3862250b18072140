//! The types of Mooncake's classic C API (`transfer_engine_c.h`), written
//! from its documented declarations. Every value C writes into these structs
//! is a plain integer: nothing here is a Rust enum that C could fill with a
//! value it does not have.

use std::ffi::{c_char, c_int, c_void};

/// `transfer_engine_t`: an opaque engine pointer (NULL on failure).
pub type TransferEngineT = *mut c_void;
/// `transport_t`: an opaque transport pointer (NULL on failure).
pub type TransportT = *mut c_void;
/// `segment_id_t` (a `#define` for `int32_t`): negative values are errors.
pub type SegmentId = i32;
/// `batch_id_t` (a `#define` for `uint64_t`). Mooncake casts a pointer into
/// it: never pass it a value it did not return.
pub type BatchId = u64;

/// The segment of the engine itself.
pub const LOCAL_SEGMENT: SegmentId = 0;
/// What `allocateBatchID` returns on failure (`UINT64_MAX`).
pub const INVALID_BATCH: BatchId = u64::MAX;

/// `transfer_request.opcode`: read remote memory into `source`.
pub const OPCODE_READ: c_int = 0;
/// `transfer_request.opcode`: write `source` into remote memory.
pub const OPCODE_WRITE: c_int = 1;

/// `transfer_status.status` values.
pub const STATUS_WAITING: c_int = 0;
pub const STATUS_PENDING: c_int = 1;
pub const STATUS_INVALID: c_int = 2;
pub const STATUS_CANCELED: c_int = 3;
pub const STATUS_COMPLETED: c_int = 4;
pub const STATUS_TIMEOUT: c_int = 5;
pub const STATUS_FAILED: c_int = 6;

/// The metadata connection string of peer-to-peer handshake mode.
pub const P2PHANDSHAKE: &str = "P2PHANDSHAKE";
/// The location that lets Mooncake pick devices for a region itself.
pub const WILDCARD_LOCATION: &str = "*";

/// `struct transfer_request`.
///
/// Some Mooncake versions name the 4 bytes after `target_id` `file_id`
/// (0 = memory); others leave them as padding. The layout is the same either
/// way, so the field is kept and always zero.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TransferRequest {
    pub opcode: c_int,
    pub source: *mut c_void,
    pub target_id: SegmentId,
    pub file_id: u32,
    /// The remote *virtual address* (not an offset into a segment).
    pub target_offset: u64,
    pub length: u64,
}

/// `struct transfer_status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TransferStatus {
    /// One of the `STATUS_*` values (read as a plain integer).
    pub status: c_int,
    pub transferred_bytes: u64,
}

/// `struct buffer_entry`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BufferEntry {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct notify_msg` (passed by value; Mooncake copies the strings).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NotifyMsg {
    pub name: *mut c_char,
    pub msg: *mut c_char,
}

// The layout of every struct, checked at compile time against the C
// declarations on LP64 targets (the only ones Mooncake builds for).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<TransferRequest>() == 40);
    assert!(align_of::<TransferRequest>() == 8);
    assert!(offset_of!(TransferRequest, opcode) == 0);
    assert!(offset_of!(TransferRequest, source) == 8);
    assert!(offset_of!(TransferRequest, target_id) == 16);
    assert!(offset_of!(TransferRequest, file_id) == 20);
    assert!(offset_of!(TransferRequest, target_offset) == 24);
    assert!(offset_of!(TransferRequest, length) == 32);

    assert!(size_of::<TransferStatus>() == 16);
    assert!(offset_of!(TransferStatus, status) == 0);
    assert!(offset_of!(TransferStatus, transferred_bytes) == 8);

    assert!(size_of::<BufferEntry>() == 16);
    assert!(offset_of!(BufferEntry, addr) == 0);
    assert!(offset_of!(BufferEntry, length) == 8);

    assert!(size_of::<NotifyMsg>() == 16);
    assert!(offset_of!(NotifyMsg, name) == 0);
    assert!(offset_of!(NotifyMsg, msg) == 8);
};

/// The name of a `transfer_status.status` value.
pub fn task_status_name(status: c_int) -> &'static str {
    match status {
        STATUS_WAITING => "WAITING",
        STATUS_PENDING => "PENDING",
        STATUS_INVALID => "INVALID",
        STATUS_CANCELED => "CANCELED",
        STATUS_COMPLETED => "COMPLETED",
        STATUS_TIMEOUT => "TIMEOUT",
        STATUS_FAILED => "FAILED",
        _ => "UNKNOWN",
    }
}
