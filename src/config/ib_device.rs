//! InfiniBand device configuration: SGLang's `parse_ib_device_config`,
//! `get_ib_devices_for_gpu` and `ServerArgs._validate_ib_devices`
//! (upstream after PR #26114), with their exact messages.
//!
//! The sysfs directory is a parameter ([`DEFAULT_SYSFS_ROOT`] in production)
//! so the validator can be tested without InfiniBand hardware.

use std::path::Path;

use serde_json::Value;

use super::file::{read_regular_file, ConfigFileError};
use super::message::Message;
use super::py;
use crate::error::{Error, Result};

/// Where Linux lists InfiniBand devices.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys/class/infiniband";

/// A parsed IB device configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IbDeviceConfig {
    /// One device string shared by all GPUs, returned as given (trimmed, not
    /// split): `"mlx5_0,mlx5_1"`.
    AllGpus(String),
    /// A per-GPU mapping in the order of the JSON object; values trimmed.
    PerGpu(Vec<(i64, String)>),
}

impl IbDeviceConfig {
    /// The device string for `gpu_id` (`get_ib_devices_for_gpu` on a parsed
    /// configuration). A mapping without that GPU is a `ValueError`
    /// `No IB devices configured for GPU {gpu_id}. Available GPUs: [0, 1]`.
    pub fn devices_for_gpu(&self, gpu_id: i64) -> Result<&str> {
        match self {
            IbDeviceConfig::AllGpus(s) => Ok(s),
            IbDeviceConfig::PerGpu(map) => {
                map.iter().find(|(g, _)| *g == gpu_id).map(|(_, d)| d.as_str()).ok_or_else(|| {
                    let keys: Vec<i64> = map.iter().map(|(g, _)| *g).collect();
                    Error::value_error(format!(
                        "No IB devices configured for GPU {gpu_id}. Available GPUs: {}",
                        py::repr_int_list(&keys)
                    ))
                })
            }
        }
    }
}

/// Python's `json.loads` also accepts the constants `NaN`, `Infinity` and
/// `-Infinity` (floats); serde_json does not. Outside strings they become
/// `null`, which is, like a float, neither a mapping nor a string value, so
/// `{"0": NaN}` gets SGLang's value-format message (`json.loads` then
/// `isinstance(ib_devices, str)` in `parse_ib_device_config`) instead of
/// `Invalid JSON mapping`. Anything else stays as it was, so text Python
/// refuses is still refused.
fn python_constants_as_null(text: &str) -> std::borrow::Cow<'_, str> {
    if !["NaN", "Infinity"].iter().any(|c| text.contains(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(constant) = ["NaN", "Infinity", "-Infinity"].iter().find(|k| rest.starts_with(**k)) {
            out.push_str("null");
            rest = &rest[constant.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

/// Longest per-GPU mapping file read: a mapping of every GPU of a node to
/// its devices is a few hundred bytes; the bound keeps a wrong path from
/// being read without end.
pub(crate) const MAX_MAPPING_FILE_BYTES: usize = 1 << 20;

const BAD_MAPPING_FORMAT: &str =
    "Invalid format: keys must be integers (or string representations of integers) and values must be strings";

/// `parse_ib_device_config(text)`.
///
/// - `None` or whitespace only → `Ok(None)`.
/// - Trimmed text that neither ends with `.json` nor starts with `{` →
///   [`IbDeviceConfig::AllGpus`] with the trimmed text (not split).
/// - `*.json` → the file is read as UTF-8 JSON (`RuntimeError`s
///   `File {path} does not exist.`, `Failed to parse JSON content from file {path}`,
///   `Failed to read JSON file {path}: {err}`). A path that is not a
///   regular file gets SGLang's `File {path} does not exist.` (its
///   `os.path.isfile` is false too), with what it is in a log line. Unlike
///   SGLang, a file of `/proc`, `/sys` or another kernel pseudo-filesystem
///   is refused unread (`Failed to read JSON file {path}: it is a file of
///   /proc (procfs), not a file of stored bytes`), and a file over
///   `MAX_MAPPING_FILE_BYTES` (1 MiB) is refused (`Failed to read JSON file
///   {path}: it holds N bytes, over the limit of 1048576`).
/// - `{...}` → inline JSON (`ValueError` `Invalid JSON mapping: {text}`).
/// - The JSON must be an object with all-digit keys and string values
///   (`ValueError`s `Invalid format: ...`, `No valid GPU mappings found in JSON`).
///   Keys beyond the `i64` range are refused with the key-format message.
pub fn parse_ib_device_config(text: Option<&str>) -> Result<Option<IbDeviceConfig>> {
    let Some(text) = text else { return Ok(None) };
    let input = py::strip(text);
    if input.is_empty() {
        return Ok(None);
    }
    if !input.ends_with(".json") && !input.starts_with('{') {
        return Ok(Some(IbDeviceConfig::AllGpus(input.to_owned())));
    }
    let mapping: Value = if input.ends_with(".json") {
        let bytes = match read_regular_file(input, MAX_MAPPING_FILE_BYTES) {
            Ok((bytes, _)) => bytes,
            Err(ConfigFileError::Unreachable(_)) => {
                return Err(Error::runtime_error(format!("File {input} does not exist.")))
            }
            // SGLang's `os.path.isfile` is false here too: its text, and
            // what the path is in the log (pdx never opens a FIFO or a
            // device to read).
            Err(ConfigFileError::NotRegular(what)) => {
                log::warn!("IB device mapping {input}: it is {what}, not a regular file");
                return Err(Error::runtime_error(format!("File {input} does not exist.")));
            }
            Err(e @ ConfigFileError::Pseudo(_)) => {
                return Err(Error::runtime_error(format!("Failed to read JSON file {input}: {e}")))
            }
            Err(ConfigFileError::Io(e)) => {
                return Err(Error::runtime_error(format!(
                    "Failed to read JSON file {input}: {}",
                    py_os_error(&e, input)
                )))
            }
            Err(e @ ConfigFileError::TooLong { .. }) => {
                return Err(Error::runtime_error(format!("Failed to read JSON file {input}: {e}")))
            }
        };
        let content = std::str::from_utf8(&bytes).map_err(|e| Error::value_error(py_utf8_error(&bytes, &e)))?;
        serde_json::from_str(&python_constants_as_null(content))
            .map_err(|_| Error::runtime_error(format!("Failed to parse JSON content from file {input}")))?
    } else {
        serde_json::from_str(&python_constants_as_null(input))
            .map_err(|_| Error::value_error(format!("Invalid JSON mapping: {input}")))?
    };
    let Value::Object(object) = mapping else {
        return Err(Error::value_error("Invalid format: expected a mapping from GPU id to IB device string"));
    };
    let mut out: Vec<(i64, String)> = Vec::new();
    for (key, value) in &object {
        let gpu =
            if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) { key.parse::<i64>().ok() } else { None };
        let (Some(gpu), Value::String(devices)) = (gpu, value) else {
            return Err(Error::value_error(BAD_MAPPING_FORMAT));
        };
        let devices = py::strip(devices).to_owned();
        // "0" and "00" are the same GPU: the later value wins, the first
        // position stays (Python dict semantics).
        match out.iter_mut().find(|(g, _)| *g == gpu) {
            Some(slot) => slot.1 = devices,
            None => out.push((gpu, devices)),
        }
    }
    if out.is_empty() {
        return Err(Error::value_error("No valid GPU mappings found in JSON"));
    }
    Ok(Some(IbDeviceConfig::PerGpu(out)))
}

/// `get_ib_devices_for_gpu(text, gpu_id)`: `None` when nothing is
/// configured, the shared string, or the mapping's entry for `gpu_id`.
pub fn get_ib_devices_for_gpu(text: Option<&str>, gpu_id: i64) -> Result<Option<String>> {
    match parse_ib_device_config(text)? {
        None => Ok(None),
        Some(cfg) => cfg.devices_for_gpu(gpu_id).map(|s| Some(s.to_owned())),
    }
}

/// Where [`ib_devices_for_gpu_with_origin`]'s device string came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceOrigin {
    /// One string shared by all GPUs.
    AllGpus,
    /// The entry `gpu` of a per-GPU mapping, inline (`file: None`) or from a
    /// `.json` file.
    Entry { gpu: i64, file: Option<String> },
}

impl DeviceOrigin {
    /// How the transport reason says it.
    pub fn describe(&self) -> String {
        match self {
            DeviceOrigin::AllGpus => "one device list shared by all GPUs".to_owned(),
            DeviceOrigin::Entry { gpu, file: None } => format!("entry {gpu} of the inline per-GPU JSON mapping"),
            DeviceOrigin::Entry { gpu, file: Some(f) } => format!("entry {gpu} of the per-GPU mapping in {f}"),
        }
    }
}

/// [`get_ib_devices_for_gpu`], also saying which entry was used.
pub fn ib_devices_for_gpu_with_origin(text: Option<&str>, gpu_id: i64) -> Result<Option<(String, DeviceOrigin)>> {
    Ok(match parse_ib_device_config(text)? {
        None => None,
        Some(IbDeviceConfig::AllGpus(s)) => Some((s, DeviceOrigin::AllGpus)),
        Some(cfg) => {
            let devices = cfg.devices_for_gpu(gpu_id)?.to_owned();
            let input = py::strip(text.unwrap_or_default());
            let file = input.ends_with(".json").then(|| input.to_owned());
            Some((devices, DeviceOrigin::Entry { gpu: gpu_id, file }))
        }
    })
}

/// Result of [`validate_ib_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbValidation {
    /// `None` (auto discovery), a comma-joined device list, or a compact
    /// JSON mapping `{"0":"mlx5_0,mlx5_1","1":"mlx5_2"}`.
    pub devices: Option<String>,
    /// Warnings (no devices given; duplicates removed).
    pub messages: Vec<Message>,
}

/// `ServerArgs._validate_ib_devices(text)` against the device directory
/// `sysfs_root` (normally [`DEFAULT_SYSFS_ROOT`]).
///
/// Order of checks, as upstream: `None` → warning and `None`; empty after
/// trimming → `ValueError` `No valid IB devices specified`; the sysfs
/// directory must exist and be non-empty (`RuntimeError`s) before the text
/// is parsed; then each device group is split on `,`, trimmed, deduplicated
/// (warning) and checked against the directory entries.
pub fn validate_ib_devices(text: Option<&str>, sysfs_root: &Path) -> Result<IbValidation> {
    let mut messages = Vec::new();
    let Some(text) = text else {
        messages
            .push(Message::warning("No IB devices specified for Mooncake backend, falling back to auto discovery."));
        return Ok(IbValidation { devices: None, messages });
    };
    let input = py::strip(text);
    if input.is_empty() {
        return Err(Error::value_error("No valid IB devices specified"));
    }
    let root = sysfs_root.display().to_string();
    if !sysfs_root.is_dir() {
        return Err(Error::runtime_error(format!(
            "InfiniBand sysfs path not found: {root}. Please ensure InfiniBand drivers are installed."
        )));
    }
    let mut available: Vec<String> = std::fs::read_dir(sysfs_root)
        .map_err(|e| Error::runtime_error(format!("Failed to list {root}: {}", py_os_error(&e, &root))))?
        .filter_map(|entry| entry.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if available.is_empty() {
        return Err(Error::runtime_error(format!("No IB devices found in {root}")));
    }
    available.sort();
    available.dedup();

    let normalize_group = |raw: &str, context: &str, messages: &mut Vec<Message>| -> Result<String> {
        let devices: Vec<&str> = raw.split(',').map(py::strip).filter(|d| !d.is_empty()).collect();
        if devices.is_empty() {
            return Err(Error::value_error(format!("No valid IB devices specified for {context}")));
        }
        let mut unique: Vec<&str> = Vec::new();
        for d in &devices {
            if !unique.contains(d) {
                unique.push(d);
            }
        }
        if unique.len() != devices.len() {
            messages.push(Message::warning(format!(
                "Duplicate IB devices specified for {context}: {raw}. Deduplicating to: {}",
                unique.join(",")
            )));
        }
        let invalid: Vec<&str> =
            unique.iter().copied().filter(|d| available.binary_search_by(|a| a.as_str().cmp(d)).is_err()).collect();
        if !invalid.is_empty() {
            return Err(Error::value_error(format!(
                "Invalid IB devices specified for {context}: {}. Available devices: {}",
                py::repr_str_list(&invalid),
                py::repr_str_list(&available)
            )));
        }
        Ok(unique.join(","))
    };

    match parse_ib_device_config(Some(input))? {
        // Non-empty input always parses to a configuration; never panic on it.
        None => Ok(IbValidation { devices: None, messages }),
        Some(IbDeviceConfig::AllGpus(_)) => {
            let devices = normalize_group(input, "all GPUs", &mut messages)?;
            Ok(IbValidation { devices: Some(devices), messages })
        }
        Some(IbDeviceConfig::PerGpu(map)) => {
            let mut parts = Vec::with_capacity(map.len());
            for (gpu, devices) in &map {
                let key = gpu.to_string();
                let normalized = normalize_group(devices, &format!("GPU {key}"), &mut messages)?;
                parts.push(format!("{}:{}", py::json_string(&key), py::json_string(&normalized)));
            }
            if parts.is_empty() {
                return Err(Error::value_error("No valid GPU mappings found in IB device JSON"));
            }
            Ok(IbValidation { devices: Some(format!("{{{}}}", parts.join(","))), messages })
        }
    }
}

/// Python's `str(OSError)`: `[Errno 13] Permission denied: 'path'`.
fn py_os_error(err: &std::io::Error, path: &str) -> String {
    match err.raw_os_error() {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            format!("[Errno {code}] {text}: {}", py::repr_str(path))
        }
        None => err.to_string(),
    }
}

/// Python's `UnicodeDecodeError` text for a file that is not UTF-8 (upstream
/// lets this `ValueError` subclass escape unchanged).
fn py_utf8_error(bytes: &[u8], err: &std::str::Utf8Error) -> String {
    let pos = err.valid_up_to();
    let byte = bytes[pos];
    let reason = match err.error_len() {
        None => "unexpected end of data",
        Some(_) if (0x80..0xc2).contains(&byte) || byte >= 0xf5 => "invalid start byte",
        Some(_) => "invalid continuation byte",
    };
    format!("'utf-8' codec can't decode byte 0x{byte:02x} in position {pos}: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn fake_sysfs(devices: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for d in devices {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        dir
    }

    fn mlx() -> tempfile::TempDir {
        fake_sysfs(&["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])
    }

    #[test]
    fn parse_none_blank_and_plain() {
        assert_eq!(parse_ib_device_config(None).unwrap(), None);
        assert_eq!(parse_ib_device_config(Some("  \t")).unwrap(), None);
        assert_eq!(
            parse_ib_device_config(Some(" mlx5_0, mlx5_1 ")).unwrap(),
            Some(IbDeviceConfig::AllGpus("mlx5_0, mlx5_1".into()))
        );
    }

    #[test]
    fn parse_inline_mapping_keeps_order_and_trims_values() {
        let cfg =
            parse_ib_device_config(Some(r#"{"1": " mlx5_2 ", "0": "mlx5_0, mlx5_1", "01": "x"}"#)).unwrap().unwrap();
        assert_eq!(cfg, IbDeviceConfig::PerGpu(vec![(1, "x".into()), (0, "mlx5_0, mlx5_1".into())]));
    }

    #[test]
    fn parse_errors_have_upstream_texts() {
        let err = |s: &str| parse_ib_device_config(Some(s)).unwrap_err();
        let e = err("{not json");
        assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, "Invalid JSON mapping: {not json"));
        assert_eq!(err("{}").message(), "No valid GPU mappings found in JSON");
        assert_eq!(err(r#"{"a": "mlx5_0"}"#).message(), BAD_MAPPING_FORMAT);
        assert_eq!(err(r#"{"-1": "mlx5_0"}"#).message(), BAD_MAPPING_FORMAT);
        assert_eq!(err(r#"{"0": 5}"#).message(), BAD_MAPPING_FORMAT);
        let e = err("/nonexistent/pdx/ib.json");
        assert_eq!((e.kind(), e.message()), (ErrorKind::RuntimeError, "File /nonexistent/pdx/ib.json does not exist."));
    }

    /// SGLang's `parse_ib_device_config` (mooncake_transfer_engine.py at
    /// d4801be, line 47 `mapping = json.loads(normalized_input)`, line 59
    /// `not isinstance(ib_devices, str)`): Python's json accepts NaN and
    /// Infinity, so such a value is a value-format error, not a JSON one.
    #[test]
    fn nan_and_infinity_are_python_json_values() {
        let err = |s: &str| parse_ib_device_config(Some(s)).unwrap_err();
        for text in [r#"{"0": NaN}"#, r#"{"0": Infinity}"#, r#"{"0":-Infinity, "1": "mlx5_1"}"#, r#"{"0": [NaN]}"#] {
            let e = err(text);
            assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, BAD_MAPPING_FORMAT), "{text}");
        }
        // Not a mapping at all, as for any float.
        assert_eq!(err("{NaN").message(), "Invalid JSON mapping: {NaN");
        assert_eq!(err(r#"{"0": nan}"#).message(), r#"Invalid JSON mapping: {"0": nan}"#, "Python is case-sensitive");
        assert_eq!(err(r#"{"0": +Infinity}"#).message(), r#"Invalid JSON mapping: {"0": +Infinity}"#);
        assert_eq!(err(r#"{NaN: "mlx5_0"}"#).message(), r#"Invalid JSON mapping: {NaN: "mlx5_0"}"#);
        // Inside a string they are text.
        let cfg = parse_ib_device_config(Some(r#"{"0": "NaN \" Infinity"}"#)).unwrap().unwrap();
        assert_eq!(cfg, IbDeviceConfig::PerGpu(vec![(0, "NaN \" Infinity".into())]));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nan.json");
        std::fs::write(&file, r#"{"0": "mlx5_0", "1": NaN}"#).unwrap();
        assert_eq!(err(file.to_str().unwrap()).message(), BAD_MAPPING_FORMAT);
    }

    #[test]
    fn origin_names_the_entry() {
        let map = r#"{"0": "mlx5_0", "3": "mlx5_3"}"#;
        let (d, o) = ib_devices_for_gpu_with_origin(Some(map), 3).unwrap().unwrap();
        assert_eq!((d.as_str(), o.describe()), ("mlx5_3", "entry 3 of the inline per-GPU JSON mapping".to_owned()));
        let (_, o) = ib_devices_for_gpu_with_origin(Some("mlx5_0"), 3).unwrap().unwrap();
        assert_eq!(o, DeviceOrigin::AllGpus);
        assert_eq!(ib_devices_for_gpu_with_origin(Some("  "), 3).unwrap(), None);
    }

    #[test]
    fn parse_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ib.json");
        std::fs::write(&good, r#"{"0": "mlx5_0, mlx5_1", "1": "mlx5_2"}"#).unwrap();
        let cfg = parse_ib_device_config(Some(good.to_str().unwrap())).unwrap().unwrap();
        assert_eq!(cfg, IbDeviceConfig::PerGpu(vec![(0, "mlx5_0, mlx5_1".into()), (1, "mlx5_2".into())]));

        let list = dir.path().join("list.json");
        std::fs::write(&list, "[1, 2]").unwrap();
        let e = parse_ib_device_config(Some(list.to_str().unwrap())).unwrap_err();
        assert_eq!(e.message(), "Invalid format: expected a mapping from GPU id to IB device string");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{oops").unwrap();
        let e = parse_ib_device_config(Some(bad.to_str().unwrap())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RuntimeError);
        assert_eq!(e.message(), format!("Failed to parse JSON content from file {}", bad.display()));

        let latin1 = dir.path().join("latin1.json");
        std::fs::write(&latin1, b"{\"0\": \"\xe9\"}").unwrap();
        let e = parse_ib_device_config(Some(latin1.to_str().unwrap())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueError);
        assert_eq!(e.message(), "'utf-8' codec can't decode byte 0xe9 in position 7: invalid continuation byte");

        // A directory, a FIFO or a device named *.json is not read (a FIFO
        // would block, a device could be endless): SGLang's text, for which
        // `os.path.isfile` is false too (the log says what it is).
        let d = dir.path().join("dir.json");
        std::fs::create_dir(&d).unwrap();
        assert_eq!(
            parse_ib_device_config(Some(d.to_str().unwrap())).unwrap_err().message(),
            format!("File {} does not exist.", d.display())
        );
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = parse_ib_device_config(Some(fifo.to_str().unwrap())).unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::RuntimeError, format!("File {} does not exist.", fifo.display()).as_str())
        );
        let zero = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            parse_ib_device_config(Some(zero.to_str().unwrap())).unwrap_err().message(),
            format!("File {} does not exist.", zero.display())
        );
        // A regular file over the bound is refused without being read whole.
        let big = dir.path().join("big.json");
        let mut text = String::from("{\"0\": \"mlx5_0\"}");
        text.push_str(&" ".repeat(MAX_MAPPING_FILE_BYTES + 1 - text.len()));
        std::fs::write(&big, &text).unwrap();
        assert_eq!(
            parse_ib_device_config(Some(big.to_str().unwrap())).unwrap_err().message(),
            format!("Failed to read JSON file {}: it holds 1048577 bytes, over the limit of 1048576", big.display())
        );
        text.pop();
        std::fs::write(&big, &text).unwrap();
        assert!(parse_ib_device_config(Some(big.to_str().unwrap())).unwrap().is_some());
    }

    #[test]
    fn devices_for_gpu() {
        assert_eq!(get_ib_devices_for_gpu(None, 0).unwrap(), None);
        assert_eq!(get_ib_devices_for_gpu(Some("mlx5_0,mlx5_1"), 7).unwrap().as_deref(), Some("mlx5_0,mlx5_1"));
        let map = r#"{"0": "mlx5_0", "1": "mlx5_1"}"#;
        assert_eq!(get_ib_devices_for_gpu(Some(map), 1).unwrap().as_deref(), Some("mlx5_1"));
        let e = get_ib_devices_for_gpu(Some(map), 2).unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::ValueError, "No IB devices configured for GPU 2. Available GPUs: [0, 1]")
        );
    }

    // Ported from SGLang's TestServerArgsIBDeviceValidation.
    #[test]
    fn upstream_comma_list_is_normalized() {
        let sys = mlx();
        let v = validate_ib_devices(Some("mlx5_0, mlx5_1"), sys.path()).unwrap();
        assert_eq!(v.devices.as_deref(), Some("mlx5_0,mlx5_1"));
        assert!(v.messages.is_empty());
    }

    #[test]
    fn upstream_json_mapping_is_normalized() {
        let sys = mlx();
        let v = validate_ib_devices(Some(r#"{"0": "mlx5_0, mlx5_1", "1": "mlx5_2, mlx5_3"}"#), sys.path()).unwrap();
        assert_eq!(v.devices.as_deref(), Some(r#"{"0":"mlx5_0,mlx5_1","1":"mlx5_2,mlx5_3"}"#));
    }

    #[test]
    fn upstream_json_file_is_normalized() {
        let sys = mlx();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ib.json");
        std::fs::write(&f, r#"{"0": "mlx5_0, mlx5_1", "1": "mlx5_2"}"#).unwrap();
        let v = validate_ib_devices(Some(f.to_str().unwrap()), sys.path()).unwrap();
        assert_eq!(v.devices.as_deref(), Some(r#"{"0":"mlx5_0,mlx5_1","1":"mlx5_2"}"#));
    }

    #[test]
    fn validate_none_warns() {
        let v = validate_ib_devices(None, Path::new("/nonexistent")).unwrap();
        assert_eq!(v.devices, None);
        assert_eq!(
            v.messages,
            vec![Message::warning("No IB devices specified for Mooncake backend, falling back to auto discovery.")]
        );
    }

    #[test]
    fn validate_errors_in_upstream_order() {
        let sys = mlx();
        let e = validate_ib_devices(Some("   "), Path::new("/nonexistent")).unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, "No valid IB devices specified"));
        // sysfs is checked before the text is parsed.
        let e = validate_ib_devices(Some("{bad"), Path::new("/nonexistent/ib")).unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (
                ErrorKind::RuntimeError,
                "InfiniBand sysfs path not found: /nonexistent/ib. Please ensure InfiniBand drivers are installed."
            )
        );
        let empty = fake_sysfs(&[]);
        let e = validate_ib_devices(Some("mlx5_0"), empty.path()).unwrap_err();
        assert_eq!(e.message(), format!("No IB devices found in {}", empty.path().display()));
        assert_eq!(validate_ib_devices(Some("{bad"), sys.path()).unwrap_err().message(), "Invalid JSON mapping: {bad");
        assert_eq!(
            validate_ib_devices(Some(" , ,"), sys.path()).unwrap_err().message(),
            "No valid IB devices specified for all GPUs"
        );
        assert_eq!(
            validate_ib_devices(Some(r#"{"3": " "}"#), sys.path()).unwrap_err().message(),
            "No valid IB devices specified for GPU 3"
        );
        assert_eq!(
            validate_ib_devices(Some("mlx5_0,mlx5_9,ib0"), sys.path()).unwrap_err().message(),
            "Invalid IB devices specified for all GPUs: ['mlx5_9', 'ib0']. Available devices: ['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_3']"
        );
        assert_eq!(
            validate_ib_devices(Some(r#"{"0": "mlx5_0", "1": "mlx5_7"}"#), sys.path()).unwrap_err().message(),
            "Invalid IB devices specified for GPU 1: ['mlx5_7']. Available devices: ['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_3']"
        );
    }

    #[test]
    fn validate_deduplicates_with_warning() {
        let sys = mlx();
        let v = validate_ib_devices(Some(" mlx5_1, mlx5_0,mlx5_1 "), sys.path()).unwrap();
        assert_eq!(v.devices.as_deref(), Some("mlx5_1,mlx5_0"));
        assert_eq!(
            v.messages,
            vec![Message::warning(
                "Duplicate IB devices specified for all GPUs: mlx5_1, mlx5_0,mlx5_1. Deduplicating to: mlx5_1,mlx5_0"
            )]
        );
        let v = validate_ib_devices(Some(r#"{"2": "mlx5_2,mlx5_2"}"#), sys.path()).unwrap();
        assert_eq!(v.devices.as_deref(), Some(r#"{"2":"mlx5_2"}"#));
        assert_eq!(
            v.messages[0].text,
            "Duplicate IB devices specified for GPU 2: mlx5_2,mlx5_2. Deduplicating to: mlx5_2"
        );
    }
}
