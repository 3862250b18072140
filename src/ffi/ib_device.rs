//! C ABI for IB device configuration: SGLang's parsing of device strings
//! and per-GPU mappings (`pdx_ib_device_config`) and its validation against
//! the machine's devices (`pdx_ib_validation`).
//!
//! Every object here is immutable once made; its strings are owned by the
//! object and stay valid until the object is freed. Objects may be read from
//! several threads at once.

use std::ffi::{c_char, CString};
use std::path::Path;

use super::args::{messages_to_c, to_cstring};
use super::boundary::{guard, guard_or, handle_tag, index_out_of_range, opt_c_str, out_ptr, HandleTable};
use super::status::pdx_status;
use crate::config::ib_device::{self, IbDeviceConfig};
use crate::error::Result;

/// Kind of a parsed IB device configuration: nothing configured.
pub const PDX_IB_CONFIG_NONE: i32 = 0;
/// Kind of a parsed IB device configuration: one device string for all GPUs.
pub const PDX_IB_CONFIG_ALL_GPUS: i32 = 1;
/// Kind of a parsed IB device configuration: a per-GPU mapping.
pub const PDX_IB_CONFIG_PER_GPU: i32 = 2;

/// Opaque parsed IB device configuration; released by
/// `pdx_ib_device_config_free`.
#[allow(non_camel_case_types)]
pub struct pdx_ib_device_config {
    _private: [u8; 0],
}

struct IbConfigC {
    parsed: Option<IbDeviceConfig>,
    /// The all-GPU string, or the per-GPU strings in mapping order.
    strings: Vec<(i64, CString)>,
}

static IB_CONFIGS: HandleTable<IbConfigC> =
    HandleTable::new("pdx_ib_device_config handle", handle_tag::IB_DEVICE_CONFIG);

/// SGLang's `parse_ib_device_config`: parse `text` (NULL or blank = nothing
/// configured; a comma list kept as one string; an inline JSON object
/// `{"0": "mlx5_0"}`; or a path ending in `.json`).
///
/// On success `*out` receives a new object owned by the caller (free with
/// `pdx_ib_device_config_free`). Errors (`*out` untouched):
/// `PDX_ERR_NULL_ARGUMENT` (out), `PDX_ERR_INVALID_UTF8`, and SGLang's
/// `PDX_ERR_VALUE_ERROR` / `PDX_ERR_RUNTIME` with the exact texts.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `text` is NULL or a NUL-terminated string;
/// `out` is NULL or valid for writing one pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_parse_ib_device_config(
    text: *const c_char,
    out: *mut *mut pdx_ib_device_config,
) -> pdx_status {
    guard("pdx_parse_ib_device_config", || {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller passes a NUL-terminated string or NULL.
        let text = unsafe { opt_c_str(text, "text")? };
        let parsed = ib_device::parse_ib_device_config(text)?;
        let strings = match &parsed {
            None => Vec::new(),
            Some(IbDeviceConfig::AllGpus(s)) => vec![(-1, to_cstring(s, "devices")?)],
            Some(IbDeviceConfig::PerGpu(map)) => {
                map.iter().map(|(g, d)| Ok((*g, to_cstring(d, "devices")?))).collect::<Result<_>>()?
            }
        };
        let handle = IB_CONFIGS.insert(IbConfigC { parsed, strings })?;
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { *out = handle };
        Ok(())
    })
}

/// The kind of `config`: `PDX_IB_CONFIG_NONE`, `PDX_IB_CONFIG_ALL_GPUS` or
/// `PDX_IB_CONFIG_PER_GPU`, written to `*kind` on success.
/// Errors: `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_HANDLE`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `kind` is NULL or valid for writing one
/// `i32`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_device_config_kind(config: *const pdx_ib_device_config, kind: *mut i32) -> pdx_status {
    guard("pdx_ib_device_config_kind", || {
        let kind = out_ptr(kind, "kind")?;
        let c = IB_CONFIGS.get(config)?;
        let k = match c.parsed {
            None => PDX_IB_CONFIG_NONE,
            Some(IbDeviceConfig::AllGpus(_)) => PDX_IB_CONFIG_ALL_GPUS,
            Some(IbDeviceConfig::PerGpu(_)) => PDX_IB_CONFIG_PER_GPU,
        };
        // SAFETY: checked non-NULL and aligned.
        unsafe { *kind = k };
        Ok(())
    })
}

/// Number of GPU entries of a per-GPU mapping (0 for the other kinds),
/// written to `*count`. Errors: `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_HANDLE`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `count` is NULL or valid for writing one
/// `usize`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_device_config_gpu_count(
    config: *const pdx_ib_device_config,
    count: *mut usize,
) -> pdx_status {
    guard("pdx_ib_device_config_gpu_count", || {
        let count = out_ptr(count, "count")?;
        let c = IB_CONFIGS.get(config)?;
        let n = if matches!(c.parsed, Some(IbDeviceConfig::PerGpu(_))) { c.strings.len() } else { 0 };
        // SAFETY: checked non-NULL and aligned.
        unsafe { *count = n };
        Ok(())
    })
}

/// Entry `i` of a per-GPU mapping, in the JSON object's order: its GPU id
/// and its device string (trimmed, not split; owned by `config`).
/// Errors (outputs untouched): `PDX_ERR_NULL_ARGUMENT`,
/// `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_INDEX_OUT_OF_RANGE`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `gpu_id` is NULL or valid for writing one
/// `i64`; `devices` is NULL or valid for writing one pointer. Handles are checked by pdx, never
/// trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_device_config_gpu_at(
    config: *const pdx_ib_device_config,
    i: usize,
    gpu_id: *mut i64,
    devices: *mut *const c_char,
) -> pdx_status {
    guard("pdx_ib_device_config_gpu_at", || {
        let gpu_id = out_ptr(gpu_id, "gpu_id")?;
        let devices = out_ptr(devices, "devices")?;
        let c = IB_CONFIGS.get(config)?;
        let per_gpu = matches!(c.parsed, Some(IbDeviceConfig::PerGpu(_)));
        let len = if per_gpu { c.strings.len() } else { 0 };
        let (g, d) = c.strings.get(i).filter(|_| per_gpu).ok_or_else(|| index_out_of_range(i, len))?;
        // SAFETY: both checked non-NULL and aligned.
        unsafe {
            *gpu_id = *g;
            *devices = d.as_ptr();
        }
        Ok(())
    })
}

/// SGLang's `get_ib_devices_for_gpu` on a parsed configuration: `*devices`
/// is NULL when nothing is configured, else the device string for `gpu_id`
/// (owned by `config`, valid until it is freed).
///
/// Errors (`*devices` untouched): `PDX_ERR_NULL_ARGUMENT`,
/// `PDX_ERR_INVALID_HANDLE`, `PDX_ERR_VALUE_ERROR`
/// (`No IB devices configured for GPU 2. Available GPUs: [0, 1]`).
///
/// # Safety
/// The caller guarantees, for the duration of the call: `devices` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_devices_for_gpu(
    config: *const pdx_ib_device_config,
    gpu_id: i64,
    devices: *mut *const c_char,
) -> pdx_status {
    guard("pdx_ib_devices_for_gpu", || {
        let devices = out_ptr(devices, "devices")?;
        let c = IB_CONFIGS.get(config)?;
        let ptr = match &c.parsed {
            None => std::ptr::null(),
            Some(cfg) => {
                cfg.devices_for_gpu(gpu_id)?;
                let idx = match cfg {
                    IbDeviceConfig::AllGpus(_) => 0,
                    IbDeviceConfig::PerGpu(_) => c.strings.iter().position(|(g, _)| *g == gpu_id).unwrap_or(0),
                };
                c.strings[idx].1.as_ptr()
            }
        };
        // SAFETY: checked non-NULL and aligned.
        unsafe { *devices = ptr };
        Ok(())
    })
}

/// Release a parsed IB configuration and its strings. NULL and stale
/// pointers are ignored.
#[no_mangle]
pub extern "C" fn pdx_ib_device_config_free(config: *mut pdx_ib_device_config) {
    guard_or("pdx_ib_device_config_free", (), || {
        IB_CONFIGS.remove(config);
        Ok(())
    })
}

/// Opaque result of `pdx_validate_ib_devices`; released by
/// `pdx_ib_validation_free`.
#[allow(non_camel_case_types)]
pub struct pdx_ib_validation {
    _private: [u8; 0],
}

struct ValidationC {
    devices: Option<CString>,
    messages: Vec<(i32, CString)>,
}

static VALIDATIONS: HandleTable<ValidationC> = HandleTable::new("pdx_ib_validation handle", handle_tag::IB_VALIDATION);

/// SGLang's `ServerArgs._validate_ib_devices(devices)`, checking device
/// names against the entries of `sysfs_root` (NULL = `/sys/class/infiniband`;
/// tests pass a directory of their own).
///
/// On success `*out` receives a new object owned by the caller (free with
/// `pdx_ib_validation_free`): the normalized devices (NULL when `devices` is
/// NULL, meaning auto discovery; a comma list; or compact JSON
/// `{"0":"mlx5_0,mlx5_1"}`) and its warnings. Errors (`*out` untouched):
/// `PDX_ERR_NULL_ARGUMENT` (out), `PDX_ERR_INVALID_UTF8`,
/// `PDX_ERR_VALUE_ERROR` and `PDX_ERR_RUNTIME` with SGLang's texts.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `devices` is NULL or a NUL-terminated
/// string; `sysfs_root` is NULL or a NUL-terminated string; `out` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_validate_ib_devices(
    devices: *const c_char,
    sysfs_root: *const c_char,
    out: *mut *mut pdx_ib_validation,
) -> pdx_status {
    guard("pdx_validate_ib_devices", || {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (devices, root) = unsafe { (opt_c_str(devices, "devices")?, opt_c_str(sysfs_root, "sysfs_root")?) };
        let root = Path::new(root.unwrap_or(ib_device::DEFAULT_SYSFS_ROOT));
        let v = ib_device::validate_ib_devices(devices, root)?;
        for m in &v.messages {
            m.log();
        }
        let c = ValidationC {
            devices: v.devices.as_deref().map(|d| to_cstring(d, "devices")).transpose()?,
            messages: messages_to_c(&v.messages)?,
        };
        let handle = VALIDATIONS.insert(c)?;
        // SAFETY: `out` checked non-NULL and aligned.
        unsafe { *out = handle };
        Ok(())
    })
}

/// The normalized devices of a validation, written to `*devices`: NULL for
/// auto discovery, else a string owned by `validation`.
/// Errors (`*devices` untouched): `PDX_ERR_NULL_ARGUMENT`, `PDX_ERR_INVALID_HANDLE`.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `devices` is NULL or valid for writing one
/// pointer. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_validation_devices(
    validation: *const pdx_ib_validation,
    devices: *mut *const c_char,
) -> pdx_status {
    guard("pdx_ib_validation_devices", || {
        let devices = out_ptr(devices, "devices")?;
        let v = VALIDATIONS.get(validation)?;
        // SAFETY: checked non-NULL and aligned.
        unsafe { *devices = v.devices.as_ref().map_or(std::ptr::null(), |d| d.as_ptr()) };
        Ok(())
    })
}

/// Number of warnings of a validation (0 on a bad handle).
#[no_mangle]
pub extern "C" fn pdx_ib_validation_message_count(validation: *const pdx_ib_validation) -> usize {
    guard_or("pdx_ib_validation_message_count", 0, || Ok(VALIDATIONS.get(validation)?.messages.len()))
}

/// Warning `i` of a validation, owned by `validation`; its level
/// (`PDX_LOG_WARNING`) goes to `*level` when `level` is not NULL. NULL on a
/// bad handle or an out-of-range index.
///
/// # Safety
/// The caller guarantees, for the duration of the call: `level` is NULL or valid for writing one
/// `i32`. Handles are checked by pdx, never trusted.
#[no_mangle]
pub unsafe extern "C" fn pdx_ib_validation_message(
    validation: *const pdx_ib_validation,
    i: usize,
    level: *mut i32,
) -> *const c_char {
    guard_or("pdx_ib_validation_message", std::ptr::null(), || {
        if !level.is_null() {
            out_ptr(level, "level")?;
        }
        let v = VALIDATIONS.get(validation)?;
        let (lvl, text) = v.messages.get(i).ok_or_else(|| index_out_of_range(i, v.messages.len()))?;
        if !level.is_null() {
            // SAFETY: checked non-NULL and aligned.
            unsafe { *level = *lvl };
        }
        Ok(text.as_ptr())
    })
}

/// Release a validation result. NULL and stale pointers are ignored.
#[no_mangle]
pub extern "C" fn pdx_ib_validation_free(validation: *mut pdx_ib_validation) {
    guard_or("pdx_ib_validation_free", (), || {
        VALIDATIONS.remove(validation);
        Ok(())
    })
}
