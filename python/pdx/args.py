"""SGLang's PD server arguments (:class:`Args`), their normalization, transport
resolution and IB device configuration (``src/ffi/args.rs``,
``src/ffi/transport.rs``, ``src/ffi/ib_device.rs``)."""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_void_p

from .binding import (
    PDX_ERR_INDEX_OUT_OF_RANGE,
    _dec,
    _declare,
    _enc,
    _Handle,
    _Signature,
    _SIGNATURES,
    _text,
    check,
    lib,
    pdx_status,
)

PDX_LOG_INFO = 20
PDX_LOG_WARNING = 30
PDX_IB_CONFIG_NONE = 0
PDX_IB_CONFIG_ALL_GPUS = 1
PDX_IB_CONFIG_PER_GPU = 2

_CONFIG_SIGNATURES: list[_Signature] = [
    ("pdx_args_new", pdx_status, [POINTER(c_void_p)]),
    ("pdx_args_free", None, [c_void_p]),
    ("pdx_args_set", pdx_status, [c_void_p, c_char_p, c_char_p]),
    ("pdx_args_get", pdx_status, [c_void_p, c_char_p, POINTER(c_char_p)]),
    ("pdx_args_parse_argv", pdx_status, [c_void_p, ctypes.c_int, POINTER(c_char_p)]),
    ("pdx_normalize_args", pdx_status, [c_void_p]),
    ("pdx_args_message_count", c_size_t, [c_void_p]),
    ("pdx_args_message", c_char_p, [c_void_p, c_size_t, POINTER(c_int32)]),
    ("pdx_add_transfer_backend_choice", pdx_status, [c_char_p]),
    ("pdx_check_efa_allocator", pdx_status, [c_char_p]),
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
_declare(lib, _CONFIG_SIGNATURES)


def _environ_snapshot() -> dict[bytes, bytes]:
    """The C library's environment (what getenv sees), which can differ from
    os.environ after native code called setenv."""
    libc = ctypes.CDLL(None)
    env = POINTER(c_char_p).in_dll(libc, "environ")
    out: dict[bytes, bytes] = {}
    i = 0
    while env[i] is not None:
        entry: bytes = env[i]
        name, sep, value = entry.partition(b"=")
        if sep:
            out[name] = value
        i += 1
    return out


class Args(_Handle):
    """A `pdx_args`: SGLang's PD server arguments, set/get as text.

    Keys are ServerArgs field names or CLI flags; values are text, None for
    Python's None. `normalize()` applies SGLang's rules (raising PdxError with
    PDX_ERR_VALUE_ERROR / PDX_ERR_ASSERTION and the exact SGLang message);
    `messages()` returns the (level, text) lines of the last normalization:
    after such a refusal, the lines SGLang logs before it raises.
    """

    def __init__(self, argv: list[str] | None = None, **fields: object):
        """Create the arguments, set `fields` (key=value), then parse `argv`."""
        handle = c_void_p()
        check(lib.pdx_args_new(ctypes.byref(handle)))
        self._h = handle
        for key, value in fields.items():
            self.set(key, value)
        if argv is not None:
            self.parse_argv(argv)

    def _free(self, handle: c_void_p) -> None:
        lib.pdx_args_free(handle)

    def set(self, key: str, value: object) -> None:
        """Set `key` to `value` (bools as true/false, None as Python's None)."""
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = None if value is None else str(value)
        check(lib.pdx_args_set(self._h, key.encode(), _enc(text)))

    def get(self, key: str) -> str | None:
        """The value of `key` as text (None for Python's None)."""
        out = c_char_p()
        check(lib.pdx_args_get(self._h, key.encode(), ctypes.byref(out)))
        return _dec(out.value)

    def __getitem__(self, key: str) -> str | None:
        return self.get(key)

    def __setitem__(self, key: str, value: object) -> None:
        self.set(key, value)

    def parse_argv(self, argv: list[str]) -> None:
        """Parse SGLang command-line flags (without the program name)."""
        arr = (c_char_p * max(len(argv), 1))(*[a.encode() for a in argv])
        check(lib.pdx_args_parse_argv(self._h, len(argv), arr))

    def normalize(self) -> list[tuple[int, str]]:
        """Apply SGLang's PD rules; returns the messages (level, text).

        Where SGLang refuses, raises PdxError and changes neither the
        arguments nor the environment; `messages()` then returns the lines
        SGLang logs before it raises (e.g. the `mooncake_tcp` rewrite's).

        Environment variables the rules set in the C environment (MC_FORCE_TCP
        for `mooncake_tcp`) are mirrored into os.environ, so Python code that
        reads them afterwards sees what native code sees."""
        before = _environ_snapshot()
        check(lib.pdx_normalize_args(self._h))
        for name, value in _environ_snapshot().items():
            if before.get(name) != value:
                os.environ[os.fsdecode(name)] = os.fsdecode(value)
        return self.messages()

    def messages(self) -> list[tuple[int, str]]:
        """The (level, text) messages of the last normalization: its lines
        when it succeeded, the lines SGLang logged before its refusal when it
        raised (none before any)."""
        out = []
        for i in range(lib.pdx_args_message_count(self._h)):
            level = c_int32()
            text: bytes | None = lib.pdx_args_message(self._h, i, ctypes.byref(level))
            if text is None:
                check(PDX_ERR_INDEX_OUT_OF_RANGE)
            out.append((level.value, _text(text)))
        return out


def add_transfer_backend_choice(name: str) -> None:
    """Allow `name` as --disaggregation-transfer-backend (process-wide)."""
    check(lib.pdx_add_transfer_backend_choice(name.encode()))


def check_efa_allocator(protocol: str | None = None) -> None:
    """sglang 0.5.23's EFA allocator guard against the process environment:
    under protocol `efa` (None: MOONCAKE_PROTOCOL), raise PdxError
    (PDX_ERR_VALUE_ERROR, SGLang's text) for an NVLINK/BAREX custom memory
    pool or expandable_segments:True in PyTorch's allocator settings."""
    check(lib.pdx_check_efa_allocator(_enc(protocol)))


class TransportChoice:
    """The result of `resolve_transport` (plain Python values)."""

    def __init__(self, protocol: str, hostname: str, device: str | None, reason: str, warnings: list[str]):
        """Hold the resolved protocol, hostname, device, reason and warnings."""
        self.protocol = protocol
        self.hostname = hostname
        self.device = device
        self.reason = reason
        self.warnings = warnings

    def __repr__(self) -> str:
        return (
            f"TransportChoice(protocol={self.protocol!r}, hostname={self.hostname!r}, "
            f"device={self.device!r}, reason={self.reason!r}, warnings={self.warnings!r})"
        )


def _take_choice(handle: c_void_p) -> TransportChoice:
    """Read a `pdx_transport_choice` into Python and free it."""
    try:
        return TransportChoice(
            _text(lib.pdx_transport_choice_protocol(handle)),
            _text(lib.pdx_transport_choice_hostname(handle)),
            _dec(lib.pdx_transport_choice_device(handle)),
            _text(lib.pdx_transport_choice_reason(handle)),
            [
                _text(lib.pdx_transport_choice_warning(handle, i))
                for i in range(lib.pdx_transport_choice_warning_count(handle))
            ],
        )
    finally:
        lib.pdx_transport_choice_free(handle)


def resolve_transport(
    hostname: str, protocol: str | None = None, device: str | None = None, gpu_id: int = -1
) -> TransportChoice:
    """pdx's single transport resolver (MOONCAKE_PROTOCOL, MC_FORCE_TCP, Ascend)."""
    handle = c_void_p()
    check(lib.pdx_resolve_transport(_enc(hostname), _enc(protocol), _enc(device), gpu_id, ctypes.byref(handle)))
    return _take_choice(handle)


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
        mapping: dict[int, str] = {}
        for i in range(count.value):
            gpu, dev = ctypes.c_int64(), c_char_p()
            check(lib.pdx_ib_device_config_gpu_at(handle, i, ctypes.byref(gpu), ctypes.byref(dev)))
            mapping[gpu.value] = _text(dev.value)
        return mapping
    finally:
        lib.pdx_ib_device_config_free(handle)


def get_ib_devices_for_gpu(text: str | None, gpu_id: int) -> str | None:
    """SGLang's get_ib_devices_for_gpu on a parsed --disaggregation-ib-device."""
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
            messages.append((level.value, _text(text)))
        return _dec(out.value), messages
    finally:
        lib.pdx_ib_validation_free(handle)
