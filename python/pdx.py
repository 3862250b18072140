"""ctypes binding for libpdx.

Every exported C function is declared here with its argtypes and restype, so
a wrong call fails in Python instead of corrupting memory. Errors become
`PdxError` with the status code, its name and pdx's last error message.

The library is found through `PDX_LIB` (a path to libpdx.so), else
`target/release/libpdx.so`, else `target/debug/libpdx.so` next to this folder.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint16, c_uint64, c_void_p
from pathlib import Path

pdx_status = c_int32

STATUS_NAMES = {
    0: "PDX_OK",
    -1: "PDX_ERR_NULL_ARGUMENT",
    -2: "PDX_ERR_INVALID_UTF8",
    -3: "PDX_ERR_INVALID_ARGUMENT",
    -4: "PDX_ERR_PANIC",
    -5: "PDX_ERR_UNKNOWN_KEY",
    -6: "PDX_ERR_INVALID_VALUE",
    -7: "PDX_ERR_VALUE_ERROR",
    -8: "PDX_ERR_ASSERTION",
    -9: "PDX_ERR_RUNTIME",
    -10: "PDX_ERR_UNKNOWN_PROTOCOL",
    -11: "PDX_ERR_BACKEND_UNAVAILABLE",
    -12: "PDX_ERR_INDEX_OUT_OF_RANGE",
    -13: "PDX_ERR_IO",
    -14: "PDX_ERR_INVALID_HANDLE",
    -15: "PDX_ERR_ADDRESS_NOT_REGISTERED",
    -16: "PDX_ERR_REMOTE_REJECTED",
    -17: "PDX_ERR_ADDRESS_OVERLAP",
    -18: "PDX_ERR_TIMEOUT",
    -19: "PDX_ERR_PEER_UNREACHABLE",
    -20: "PDX_ERR_CONNECTION_LOST",
    -21: "PDX_ERR_PROTOCOL",
    -22: "PDX_ERR_BUSY",
    -23: "PDX_ERR_NOT_FOUND",
    -24: "PDX_ERR_SHUTDOWN",
    -25: "PDX_ERR_NOTIFY_REJECTED",
}
globals().update({name: code for code, name in STATUS_NAMES.items()})


class PdxError(Exception):
    """A pdx call returned a negative status."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.name = STATUS_NAMES.get(status, f"status {status}")
        self.message = message
        super().__init__(f"{self.name}: {message}")


def _find_library() -> str:
    explicit = os.environ.get("PDX_LIB")
    if explicit:
        return explicit
    root = Path(__file__).resolve().parent.parent
    for profile in ("release", "debug"):
        candidate = root / "target" / profile / "libpdx.so"
        if candidate.exists():
            return str(candidate)
    raise OSError("libpdx.so not found: build it with `cargo build --release` or set PDX_LIB")


# (name, restype, argtypes) for every exported function.
_SIGNATURES = [
    ("pdx_version", c_char_p, []),
    ("pdx_status_str", c_char_p, [pdx_status]),
    ("pdx_last_error_message", c_char_p, []),
]


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_find_library())
    for name, restype, argtypes in _SIGNATURES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


def last_error() -> str:
    return lib.pdx_last_error_message().decode()


def check(status: int) -> None:
    """Raise PdxError for a negative status."""
    if status != 0:
        raise PdxError(status, last_error())


def version() -> str:
    return lib.pdx_version().decode()


def status_str(status: int) -> str:
    return lib.pdx_status_str(status).decode()


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


# --- configuration ---
# Arguments, normalization, transport resolution and IB devices
# (src/ffi/args.rs, src/ffi/transport.rs). Declared here, in one block, and
# appended to _SIGNATURES so the signature table stays complete.

PDX_LOG_INFO = 20
PDX_LOG_WARNING = 30
PDX_IB_CONFIG_NONE = 0
PDX_IB_CONFIG_ALL_GPUS = 1
PDX_IB_CONFIG_PER_GPU = 2

_CONFIG_SIGNATURES = [
    ("pdx_args_new", pdx_status, [POINTER(c_void_p)]),
    ("pdx_args_free", None, [c_void_p]),
    ("pdx_args_set", pdx_status, [c_void_p, c_char_p, c_char_p]),
    ("pdx_args_get", pdx_status, [c_void_p, c_char_p, POINTER(c_char_p)]),
    ("pdx_args_parse_argv", pdx_status, [c_void_p, ctypes.c_int, POINTER(c_char_p)]),
    ("pdx_normalize_args", pdx_status, [c_void_p]),
    ("pdx_args_message_count", c_size_t, [c_void_p]),
    ("pdx_args_message", c_char_p, [c_void_p, c_size_t, POINTER(c_int32)]),
    ("pdx_add_transfer_backend_choice", pdx_status, [c_char_p]),
    ("pdx_resolve_transport", pdx_status, [c_char_p, c_char_p, c_char_p, c_int32, POINTER(c_void_p)]),
    ("pdx_transport_choice_protocol", c_char_p, [c_void_p]),
    ("pdx_transport_choice_hostname", c_char_p, [c_void_p]),
    ("pdx_transport_choice_device", c_char_p, [c_void_p]),
    ("pdx_transport_choice_reason", c_char_p, [c_void_p]),
    ("pdx_transport_choice_warning_count", c_size_t, [c_void_p]),
    ("pdx_transport_choice_warning", c_char_p, [c_void_p, c_size_t]),
    ("pdx_transport_choice_free", None, [c_void_p]),
    ("pdx_parse_ib_device_config", pdx_status, [c_char_p, POINTER(c_void_p)]),
    ("pdx_ib_device_config_kind", pdx_status, [c_void_p, POINTER(c_int32)]),
    ("pdx_ib_device_config_gpu_count", pdx_status, [c_void_p, POINTER(c_size_t)]),
    ("pdx_ib_device_config_gpu_at", pdx_status, [c_void_p, c_size_t, POINTER(ctypes.c_int64), POINTER(c_char_p)]),
    ("pdx_ib_devices_for_gpu", pdx_status, [c_void_p, ctypes.c_int64, POINTER(c_char_p)]),
    ("pdx_ib_device_config_free", None, [c_void_p]),
    ("pdx_validate_ib_devices", pdx_status, [c_char_p, c_char_p, POINTER(c_void_p)]),
    ("pdx_ib_validation_devices", pdx_status, [c_void_p, POINTER(c_char_p)]),
    ("pdx_ib_validation_message_count", c_size_t, [c_void_p]),
    ("pdx_ib_validation_message", c_char_p, [c_void_p, c_size_t, POINTER(c_int32)]),
    ("pdx_ib_validation_free", None, [c_void_p]),
]
_SIGNATURES += _CONFIG_SIGNATURES
for _name, _restype, _argtypes in _CONFIG_SIGNATURES:
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def _dec(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


class Args:
    """A `pdx_args`: SGLang's PD server arguments, set/get as text.

    Keys are ServerArgs field names or CLI flags; values are text, None for
    Python's None. `normalize()` applies SGLang's rules (raising PdxError with
    PDX_ERR_VALUE_ERROR / PDX_ERR_ASSERTION and the exact SGLang message);
    `messages()` returns the (level, text) lines of the last normalization.
    """

    def __init__(self, argv: list[str] | None = None, **fields: object):
        handle = c_void_p()
        check(lib.pdx_args_new(ctypes.byref(handle)))
        self._h = handle
        for key, value in fields.items():
            self.set(key, value)
        if argv is not None:
            self.parse_argv(argv)

    def close(self) -> None:
        if self._h:
            lib.pdx_args_free(self._h)
            self._h = c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Args":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set(self, key: str, value: object) -> None:
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = None if value is None else str(value)
        check(lib.pdx_args_set(self._h, key.encode(), _enc(text)))

    def get(self, key: str) -> str | None:
        out = c_char_p()
        check(lib.pdx_args_get(self._h, key.encode(), ctypes.byref(out)))
        return _dec(out.value)

    def __getitem__(self, key: str) -> str | None:
        return self.get(key)

    def __setitem__(self, key: str, value: object) -> None:
        self.set(key, value)

    def parse_argv(self, argv: list[str]) -> None:
        arr = (c_char_p * max(len(argv), 1))(*[a.encode() for a in argv])
        check(lib.pdx_args_parse_argv(self._h, len(argv), arr))

    def normalize(self) -> list[tuple[int, str]]:
        check(lib.pdx_normalize_args(self._h))
        return self.messages()

    def messages(self) -> list[tuple[int, str]]:
        out = []
        for i in range(lib.pdx_args_message_count(self._h)):
            level = c_int32()
            text = lib.pdx_args_message(self._h, i, ctypes.byref(level))
            if text is None:
                check(PDX_ERR_INDEX_OUT_OF_RANGE)
            out.append((level.value, text.decode()))
        return out


def add_transfer_backend_choice(name: str) -> None:
    check(lib.pdx_add_transfer_backend_choice(name.encode()))


class TransportChoice:
    """The result of `resolve_transport` (plain Python values)."""

    def __init__(self, protocol: str, hostname: str, device: str, reason: str, warnings: list[str]):
        self.protocol = protocol
        self.hostname = hostname
        self.device = device
        self.reason = reason
        self.warnings = warnings

    def __repr__(self) -> str:
        return (f"TransportChoice(protocol={self.protocol!r}, hostname={self.hostname!r}, "
                f"device={self.device!r}, reason={self.reason!r}, warnings={self.warnings!r})")


def resolve_transport(hostname: str, protocol: str | None = None, device: str | None = None,
                      gpu_id: int = -1) -> TransportChoice:
    handle = c_void_p()
    check(lib.pdx_resolve_transport(_enc(hostname), _enc(protocol), _enc(device), gpu_id, ctypes.byref(handle)))
    try:
        return TransportChoice(
            _dec(lib.pdx_transport_choice_protocol(handle)),
            _dec(lib.pdx_transport_choice_hostname(handle)),
            _dec(lib.pdx_transport_choice_device(handle)),
            _dec(lib.pdx_transport_choice_reason(handle)),
            [_dec(lib.pdx_transport_choice_warning(handle, i))
             for i in range(lib.pdx_transport_choice_warning_count(handle))],
        )
    finally:
        lib.pdx_transport_choice_free(handle)


def parse_ib_device_config(text: str | None) -> None | str | dict[int, str]:
    """SGLang's parse_ib_device_config: None, a shared string, or {gpu: devices}."""
    handle = c_void_p()
    check(lib.pdx_parse_ib_device_config(_enc(text), ctypes.byref(handle)))
    try:
        kind = c_int32()
        check(lib.pdx_ib_device_config_kind(handle, ctypes.byref(kind)))
        if kind.value == PDX_IB_CONFIG_NONE:
            return None
        if kind.value == PDX_IB_CONFIG_ALL_GPUS:
            out = c_char_p()
            check(lib.pdx_ib_devices_for_gpu(handle, 0, ctypes.byref(out)))
            return _dec(out.value)
        count = c_size_t()
        check(lib.pdx_ib_device_config_gpu_count(handle, ctypes.byref(count)))
        mapping = {}
        for i in range(count.value):
            gpu, dev = ctypes.c_int64(), c_char_p()
            check(lib.pdx_ib_device_config_gpu_at(handle, i, ctypes.byref(gpu), ctypes.byref(dev)))
            mapping[gpu.value] = _dec(dev.value)
        return mapping
    finally:
        lib.pdx_ib_device_config_free(handle)


def get_ib_devices_for_gpu(text: str | None, gpu_id: int) -> str | None:
    handle = c_void_p()
    check(lib.pdx_parse_ib_device_config(_enc(text), ctypes.byref(handle)))
    try:
        out = c_char_p()
        check(lib.pdx_ib_devices_for_gpu(handle, gpu_id, ctypes.byref(out)))
        return _dec(out.value)
    finally:
        lib.pdx_ib_device_config_free(handle)


def validate_ib_devices(devices: str | None, sysfs_root: str | None = None) -> tuple[str | None, list[tuple[int, str]]]:
    """SGLang's _validate_ib_devices against sysfs_root: (normalized, messages)."""
    handle = c_void_p()
    check(lib.pdx_validate_ib_devices(_enc(devices), _enc(sysfs_root), ctypes.byref(handle)))
    try:
        out = c_char_p()
        check(lib.pdx_ib_validation_devices(handle, ctypes.byref(out)))
        messages = []
        for i in range(lib.pdx_ib_validation_message_count(handle)):
            level = c_int32()
            text = lib.pdx_ib_validation_message(handle, i, ctypes.byref(level))
            messages.append((level.value, text.decode()))
        return _dec(out.value), messages
    finally:
        lib.pdx_ib_validation_free(handle)
