"""ctypes binding for libpdx, pdx's C ABI (``include/pdx.h``).

Every exported C function is declared in ``_SIGNATURES`` with its argtypes
and restype, so a wrong call fails in Python instead of corrupting memory.
Errors become :class:`PdxError` with the status code, its name and pdx's last
error message. :mod:`pdx.mooncake` offers Mooncake's ``TransferEngine`` API on
top of the same library.

The library is looked up, in order (see :func:`find_library`):

1. ``PDX_LIB``: a path to ``libpdx.so``, or a directory holding it. When set,
   it is the only place tried (a wrong explicit path is an error, never
   silently replaced by another build);
2. the package directory (the copy a wheel bundles);
3. ``target/release`` then ``target/debug`` of the source checkout this
   package sits in (``python/pdx`` of a checkout);
4. the system loader (``LD_LIBRARY_PATH``, ``ldconfig``) by the name
   ``libpdx.so``.

If none loads, :class:`OSError` names every place tried and why it failed.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint16, c_uint64, c_void_p
from pathlib import Path
from typing import Any, TypeVar, Union

__all__ = [
    "Args",
    "BatchSummary",
    "Engine",
    "PdxError",
    "TransportChoice",
    "add_transfer_backend_choice",
    "backend_available",
    "backend_unavailable_reason",
    "check",
    "find_library",
    "get_ib_devices_for_gpu",
    "last_error",
    "lib",
    "library_path",
    "parse_ib_device_config",
    "resolve_transport",
    "resolve_transport_with",
    "session_id",
    "status_str",
    "validate_ib_devices",
    "version",
]

pdx_status = c_int32

# Status codes (pdx_status in include/pdx.h; never reused, new ones appended). These and STATUS_NAMES are
# checked against the Rust table (src/ffi/status.rs) by a test there that fails on any difference.
PDX_OK = 0
PDX_ERR_NULL_ARGUMENT = -1
PDX_ERR_INVALID_UTF8 = -2
PDX_ERR_INVALID_ARGUMENT = -3
PDX_ERR_PANIC = -4
PDX_ERR_UNKNOWN_KEY = -5
PDX_ERR_INVALID_VALUE = -6
PDX_ERR_VALUE_ERROR = -7
PDX_ERR_ASSERTION = -8
PDX_ERR_RUNTIME = -9
PDX_ERR_UNKNOWN_PROTOCOL = -10
PDX_ERR_BACKEND_UNAVAILABLE = -11
PDX_ERR_INDEX_OUT_OF_RANGE = -12
PDX_ERR_IO = -13
PDX_ERR_INVALID_HANDLE = -14
PDX_ERR_ADDRESS_NOT_REGISTERED = -15
PDX_ERR_REMOTE_REJECTED = -16
PDX_ERR_ADDRESS_OVERLAP = -17
PDX_ERR_TIMEOUT = -18
PDX_ERR_PEER_UNREACHABLE = -19
PDX_ERR_CONNECTION_LOST = -20
PDX_ERR_PROTOCOL = -21
PDX_ERR_BUSY = -22
PDX_ERR_NOT_FOUND = -23
PDX_ERR_SHUTDOWN = -24
PDX_ERR_NOTIFY_REJECTED = -25
PDX_ERR_DEVICE_UNAVAILABLE = -26
PDX_ERR_DEVICE = -27

STATUS_NAMES: dict[int, str] = {
    PDX_OK: "PDX_OK",
    PDX_ERR_NULL_ARGUMENT: "PDX_ERR_NULL_ARGUMENT",
    PDX_ERR_INVALID_UTF8: "PDX_ERR_INVALID_UTF8",
    PDX_ERR_INVALID_ARGUMENT: "PDX_ERR_INVALID_ARGUMENT",
    PDX_ERR_PANIC: "PDX_ERR_PANIC",
    PDX_ERR_UNKNOWN_KEY: "PDX_ERR_UNKNOWN_KEY",
    PDX_ERR_INVALID_VALUE: "PDX_ERR_INVALID_VALUE",
    PDX_ERR_VALUE_ERROR: "PDX_ERR_VALUE_ERROR",
    PDX_ERR_ASSERTION: "PDX_ERR_ASSERTION",
    PDX_ERR_RUNTIME: "PDX_ERR_RUNTIME",
    PDX_ERR_UNKNOWN_PROTOCOL: "PDX_ERR_UNKNOWN_PROTOCOL",
    PDX_ERR_BACKEND_UNAVAILABLE: "PDX_ERR_BACKEND_UNAVAILABLE",
    PDX_ERR_INDEX_OUT_OF_RANGE: "PDX_ERR_INDEX_OUT_OF_RANGE",
    PDX_ERR_IO: "PDX_ERR_IO",
    PDX_ERR_INVALID_HANDLE: "PDX_ERR_INVALID_HANDLE",
    PDX_ERR_ADDRESS_NOT_REGISTERED: "PDX_ERR_ADDRESS_NOT_REGISTERED",
    PDX_ERR_REMOTE_REJECTED: "PDX_ERR_REMOTE_REJECTED",
    PDX_ERR_ADDRESS_OVERLAP: "PDX_ERR_ADDRESS_OVERLAP",
    PDX_ERR_TIMEOUT: "PDX_ERR_TIMEOUT",
    PDX_ERR_PEER_UNREACHABLE: "PDX_ERR_PEER_UNREACHABLE",
    PDX_ERR_CONNECTION_LOST: "PDX_ERR_CONNECTION_LOST",
    PDX_ERR_PROTOCOL: "PDX_ERR_PROTOCOL",
    PDX_ERR_BUSY: "PDX_ERR_BUSY",
    PDX_ERR_NOT_FOUND: "PDX_ERR_NOT_FOUND",
    PDX_ERR_SHUTDOWN: "PDX_ERR_SHUTDOWN",
    PDX_ERR_NOTIFY_REJECTED: "PDX_ERR_NOTIFY_REJECTED",
    PDX_ERR_DEVICE_UNAVAILABLE: "PDX_ERR_DEVICE_UNAVAILABLE",
    PDX_ERR_DEVICE: "PDX_ERR_DEVICE",
}


class PdxError(Exception):
    """A pdx call returned a negative status.

    ``status`` is the code (``PDX_ERR_*``), ``name`` its constant's name and
    ``message`` pdx's last error message for the failing call.
    """

    def __init__(self, status: int, message: str):
        """An error for `status` with pdx's `message`."""
        self.status = status
        self.name = STATUS_NAMES.get(status, f"status {status}")
        self.message = message
        super().__init__(f"{self.name}: {message}")


LIBRARY_NAME = "libpdx.so"
_PACKAGE_DIR = Path(__file__).resolve().parent


def _package_candidates() -> list[Path]:
    """The library files a wheel may have bundled next to this file.

    setuptools-rust names the copy after the extension (``libpdx.abi3.so``);
    a plain ``libpdx.so`` dropped in by hand is accepted too."""
    found = [_PACKAGE_DIR / LIBRARY_NAME]
    found += sorted(p for p in _PACKAGE_DIR.glob("libpdx.*.so") if p not in found)
    return found


def _candidates() -> Iterator[tuple[str, Callable[[], ctypes.CDLL]]]:
    """(description, loader) for every place tried, in order."""

    def from_file(path: Path) -> Callable[[], ctypes.CDLL]:
        def load() -> ctypes.CDLL:
            if not path.is_file():
                raise OSError("no such file")
            return ctypes.CDLL(str(path))

        return load

    explicit = os.environ.get("PDX_LIB")
    if explicit:
        path = Path(explicit)
        if path.is_dir():
            path = path / LIBRARY_NAME
        yield f"PDX_LIB={explicit} ({path})", from_file(path)
        return
    for path in _package_candidates():
        yield f"package directory ({path})", from_file(path)
    root = _PACKAGE_DIR.parent.parent  # <checkout>/python/pdx -> <checkout>
    if (root / "Cargo.toml").is_file():
        for profile in ("release", "debug"):
            path = root / "target" / profile / LIBRARY_NAME
            yield f"checkout build ({path})", from_file(path)
    yield f"system loader ({LIBRARY_NAME} via LD_LIBRARY_PATH / ldconfig)", lambda: ctypes.CDLL(LIBRARY_NAME)


def find_library() -> tuple[ctypes.CDLL, str]:
    """Load libpdx: (the library, a description of where it came from).

    Raises OSError naming every place tried (see the module docstring)."""
    tried = []
    for where, load in _candidates():
        try:
            return load(), where
        except OSError as exc:
            tried.append(f"  {where}: {exc}")
    raise OSError(
        "libpdx.so not found; tried, in order:\n"
        + "\n".join(tried)
        + "\nbuild it with `cargo build --release`, install the wheel (`pip install .`), or set PDX_LIB"
    )


# (name, restype, argtypes) for every exported function.
_Signature = tuple[str, Any, list[Any]]
_SIGNATURES: list[_Signature] = [
    ("pdx_version", c_char_p, []),
    ("pdx_status_str", c_char_p, [pdx_status]),
    ("pdx_last_error_message", c_char_p, []),
    ("pdx_backend_available", c_int32, [c_char_p]),
    ("pdx_session_id", pdx_status, [c_char_p, c_uint16, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_backend_unavailable_reason", pdx_status, [c_char_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_capabilities", pdx_status, [POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
]


def _declare(lib: ctypes.CDLL, signatures: list[_Signature]) -> None:
    for name, restype, argtypes in signatures:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


lib, _library_where = find_library()
_declare(lib, _SIGNATURES)


def library_path() -> str:
    """Where the loaded libpdx came from (the description find_library gave)."""
    return _library_where


def last_error() -> str:
    """pdx's last error message on this thread ("" before any failure)."""
    raw: bytes = lib.pdx_last_error_message()
    return raw.decode(errors="replace")


def check(status: int) -> None:
    """Raise PdxError for a non-zero status (with the last error message)."""
    if status != 0:
        raise PdxError(status, last_error())


def version() -> str:
    """The library's version string ("pdx/X.Y.Z")."""
    raw: bytes = lib.pdx_version()
    return raw.decode()


def status_str(status: int) -> str:
    """pdx's short description of a status code."""
    raw: bytes = lib.pdx_status_str(status)
    return raw.decode()


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _dec(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _text(raw: bytes | None) -> str:
    """A string pdx documents as never NULL for a valid handle."""
    if raw is None:
        check(PDX_ERR_NULL_ARGUMENT)
    assert raw is not None
    return raw.decode()


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


# --- configuration ---
# Arguments, normalization, transport resolution and IB devices
# (src/ffi/args.rs, src/ffi/transport.rs).

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


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """An owned pdx handle `_h`, freed once (by `_free`): at `close()`, at
    the end of a `with` block, or when collected."""

    _h: c_void_p

    def _free(self, handle: c_void_p) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Free the handle (idempotent)."""
        if self._h:
            self._free(self._h)
            self._h = c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Args(_Handle):
    """A `pdx_args`: SGLang's PD server arguments, set/get as text.

    Keys are ServerArgs field names or CLI flags; values are text, None for
    Python's None. `normalize()` applies SGLang's rules (raising PdxError with
    PDX_ERR_VALUE_ERROR / PDX_ERR_ASSERTION and the exact SGLang message);
    `messages()` returns the (level, text) lines of the last normalization.
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
        """The (level, text) messages of the last successful normalization."""
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


# --- engine ---
# The transfer engine (src/ffi/engine.rs).

PDX_OPCODE_READ = 0
PDX_OPCODE_WRITE = 1
PDX_TASK_PENDING = 0
PDX_TASK_COMPLETED = 1
PDX_TASK_FAILED = 2


class BatchSummary(ctypes.Structure):
    """`pdx_batch_summary`: state (PDX_TASK_*), task counts, bytes confirmed."""

    _fields_ = [
        ("state", c_int32),
        ("total", c_size_t),
        ("completed", c_size_t),
        ("failed", c_size_t),
        ("bytes", c_uint64),
    ]

    def __repr__(self) -> str:
        return (f"BatchSummary(state={self.state}, total={self.total}, completed={self.completed}, "
                f"failed={self.failed}, bytes={self.bytes})")


#: The counters of `pdx_stats`, in the struct's order after `size`.
STATS_FIELDS = (
    "bytes_written", "bytes_read", "tasks_written", "tasks_read", "tasks_failed",
    "failed_timeout", "failed_connection_lost", "failed_peer_unreachable", "failed_remote_rejected",
    "failed_shutdown", "failed_protocol", "failed_other",
    "served_bytes_written", "served_bytes_read", "served_writes", "served_reads", "requests_refused",
    "handshakes", "inbound_connections", "inbound_connections_open", "peers_connected",
    "notification_bytes_queued", "latency_p50_us", "latency_p99_us", "served_device_failures",
    "same_host_bytes_written", "same_host_bytes_read", "same_host_tasks_written", "same_host_tasks_read",
)


class Stats(ctypes.Structure):
    """`pdx_stats`: an engine's counters since it started (see `Engine.stats`)."""

    _fields_ = [("size", c_size_t)] + [(name, c_uint64) for name in STATS_FIELDS]


_ENGINE_SIGNATURES: list[_Signature] = [
    ("pdx_engine_init", pdx_status, [c_char_p, c_char_p, c_char_p, POINTER(c_void_p)]),
    ("pdx_engine_init_with", pdx_status, [c_char_p, c_char_p, c_char_p, c_void_p, POINTER(c_void_p)]),
    ("pdx_engine_options_new", pdx_status, [POINTER(c_void_p)]),
    ("pdx_engine_options_free", None, [c_void_p]),
    ("pdx_engine_options_set", pdx_status, [c_void_p, c_char_p, c_char_p]),
    ("pdx_engine_options_get", pdx_status, [c_void_p, c_char_p, POINTER(c_char_p)]),
    ("pdx_resolve_transport_with", pdx_status, [c_char_p, c_char_p, c_char_p, c_void_p, POINTER(c_void_p)]),
    ("pdx_engine_device", c_char_p, [c_void_p]),
    ("pdx_engine_transport_reason", c_char_p, [c_void_p]),
    ("pdx_engine_free", None, [c_void_p]),
    ("pdx_engine_session_id", c_char_p, [c_void_p]),
    ("pdx_engine_rpc_port", c_uint16, [c_void_p]),
    ("pdx_engine_protocol", c_char_p, [c_void_p]),
    ("pdx_register_memory", pdx_status, [c_void_p, c_void_p, c_size_t]),
    ("pdx_register_memory_at", pdx_status, [c_void_p, c_void_p, c_size_t, c_char_p]),
    ("pdx_unregister_memory", pdx_status, [c_void_p, c_void_p]),
    ("pdx_batch_register_memory", pdx_status, [c_void_p, POINTER(c_void_p), POINTER(c_size_t), c_size_t]),
    ("pdx_batch_unregister_memory", pdx_status, [c_void_p, POINTER(c_void_p), c_size_t]),
    ("pdx_transfer_sync_write", pdx_status, [c_void_p, c_char_p, c_void_p, c_uint64, c_size_t]),
    ("pdx_transfer_sync_read", pdx_status, [c_void_p, c_char_p, c_void_p, c_uint64, c_size_t]),
    ("pdx_batch_transfer_sync_write", pdx_status,
     [c_void_p, c_char_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_size_t), c_size_t]),
    ("pdx_batch_transfer_sync_read", pdx_status,
     [c_void_p, c_char_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_size_t), c_size_t]),
    ("pdx_batch_submit", pdx_status,
     [c_void_p, c_char_p, c_int32, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_size_t), c_size_t,
      c_char_p, c_char_p, POINTER(c_uint64)]),
    ("pdx_batch_status", pdx_status, [c_void_p, c_uint64, POINTER(BatchSummary)]),
    ("pdx_task_status", pdx_status,
     [c_void_p, c_uint64, c_size_t, POINTER(c_int32), POINTER(c_uint64), POINTER(pdx_status)]),
    ("pdx_task_error_message", pdx_status,
     [c_void_p, c_uint64, c_size_t, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_batch_notify_error", pdx_status,
     [c_void_p, c_uint64, POINTER(pdx_status), POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_batch_wait", pdx_status, [c_void_p, c_uint64, ctypes.c_uint32, POINTER(c_int32)]),
    ("pdx_batch_free", pdx_status, [c_void_p, c_uint64]),
    ("pdx_send_probe", pdx_status, [c_void_p, c_char_p]),
    ("pdx_first_buffer_address", pdx_status, [c_void_p, c_char_p, POINTER(ctypes.c_uint64)]),
    ("pdx_send_notify", pdx_status, [c_void_p, c_char_p, c_char_p, c_char_p]),
    ("pdx_notifications_drain", pdx_status, [c_void_p, POINTER(c_void_p)]),
    ("pdx_notifications_count", c_size_t, [c_void_p]),
    ("pdx_notification_get", pdx_status, [c_void_p, c_size_t, POINTER(c_char_p), POINTER(c_char_p)]),
    ("pdx_notifications_free", None, [c_void_p]),
    ("pdx_engine_stats", pdx_status, [c_void_p, POINTER(Stats)]),
    ("pdx_engine_metrics", pdx_status, [c_void_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_peer_info", pdx_status, [c_void_p, c_char_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
]
_SIGNATURES += _ENGINE_SIGNATURES
_declare(lib, _ENGINE_SIGNATURES)


#: A memory argument: an int address (with a length) or a buffer object.
Memory = Union[int, bytes, bytearray, memoryview, Any]
#: A batch entry: (local memory, remote address) or (local memory, remote address, length).
Entry = Union[tuple[Memory, int], tuple[Memory, int, int]]


def _memory(obj: object, length: int | None = None, writable: bool = False) -> tuple[int, int, object]:
    """(address, length, keep-alive) of `obj`: an int address (with `length`),
    `bytes` (read-only), or any C-contiguous object with the buffer protocol
    (bytearray, memoryview, ctypes arrays, numpy arrays). `length` defaults
    to the buffer's size and may not exceed it."""
    if isinstance(obj, bool):
        raise TypeError("a memory address or buffer is required, not bool")
    if isinstance(obj, int):
        if length is None:
            raise TypeError("a length is required with an integer address")
        return obj, length, None
    keep: object
    if isinstance(obj, bytes):
        if writable:
            raise TypeError("bytes are read-only; use a bytearray or another writable buffer")
        addr = ctypes.cast(ctypes.c_char_p(obj), c_void_p).value or 0
        size, keep = len(obj), obj
    else:
        view = memoryview(obj)  # type: ignore[arg-type]  # TypeError for objects without the buffer protocol
        if not view.c_contiguous:
            raise ValueError("buffer is not C-contiguous")
        if view.readonly:
            raise TypeError("buffer is read-only; pass bytes or a writable buffer")
        view = view.cast("B")
        size = view.nbytes
        array = (ctypes.c_char * size).from_buffer(view)
        addr, keep = ctypes.addressof(array), array
    if length is None:
        length = size
    elif length > size:
        raise ValueError(f"length {length} exceeds the buffer's {size} bytes")
    return addr, length, keep


def _entries(entries: Sequence[Entry], writable: bool) -> tuple[Any, Any, Any, int, list[object]]:
    """C arrays (locals, remotes, lens, n) and keep-alives for a batch of
    (local, remote_addr) or (local, remote_addr, length) entries."""
    n = len(entries)
    locals_, remotes, lens = (c_void_p * max(n, 1))(), (c_uint64 * max(n, 1))(), (c_size_t * max(n, 1))()
    keep = []
    for i, entry in enumerate(entries):
        local, remote, *rest = entry
        addr, length, k = _memory(local, rest[0] if rest else None, writable)
        locals_[i], remotes[i], lens[i] = addr, remote, length
        keep.append(k)
    return locals_, remotes, lens, n, keep


def _option_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


class _Options(_Handle):
    """A `pdx_engine_options` built from keyword arguments (None: not set)."""

    def __init__(self, options: dict[str, object]):
        self._h = c_void_p()
        check(lib.pdx_engine_options_new(ctypes.byref(self._h)))
        try:
            for key, value in options.items():
                text = _option_text(value)
                if text is not None:
                    check(lib.pdx_engine_options_set(self._h, key.encode(), text.encode()))
        except BaseException:
            self.close()
            raise

    def _free(self, handle: c_void_p) -> None:
        lib.pdx_engine_options_free(handle)


def resolve_transport_with(
    hostname: str, protocol: str | None = None, device: str | None = None, **options: object
) -> TransportChoice:
    """The transport `Engine(hostname, protocol, device, **options)` would use,
    without starting one (pdx_resolve_transport_with)."""
    handle = c_void_p()
    with _Options(options) as o:
        check(lib.pdx_resolve_transport_with(_enc(hostname), _enc(protocol), _enc(device), o._h, ctypes.byref(handle)))
    return _take_choice(handle)


def _opcode(op: int | str) -> int:
    if isinstance(op, str):
        return {"read": PDX_OPCODE_READ, "write": PDX_OPCODE_WRITE}[op.lower()]
    return op


class Engine(_Handle):
    """A `pdx_engine`: a transfer engine on `hostname` (see pdx_engine_init).

    Memory arguments are int addresses (with a length) or buffers (bytes for
    sources, bytearray / memoryview / ctypes or numpy arrays for anything).
    Remote addresses are ints in the peer's process. Every failure raises
    PdxError. Buffers of registered regions and of submitted batches are
    kept referenced until they are unregistered / the batch is freed.
    """

    def __init__(
        self, hostname: str = "127.0.0.1", protocol: str | None = None, device: str | None = None, **options: object
    ):
        """Start an engine. `protocol=None` follows pdx's resolver like every
        other pdx engine: MOONCAKE_PROTOCOL (default "rdma"), "tcp" when
        MC_FORCE_TCP is set. Pass "tcp" for the native TCP engine.

        Keyword arguments are engine options (pdx_engine_init_with): e.g.
        `gpu_id=3` picks GPU 3's entry of a per-GPU `device` mapping,
        `device_source="remote_instance"` takes the device from
        MOONCAKE_DEVICE, `tcp_lanes=8` wins over PDX_TCP_LANES. None leaves
        an option unset; an unknown key or a bad value raises PdxError."""
        handle = c_void_p()
        with _Options(options) as o:
            check(lib.pdx_engine_init_with(_enc(hostname), _enc(protocol), _enc(device), o._h, ctypes.byref(handle)))
        self._h = handle
        self._registered: dict[int, object] = {}
        self._batches: dict[int, object] = {}

    @property
    def handle(self) -> c_void_p:
        """The raw `pdx_engine *` (for calls through `lib`)."""
        return self._h

    def close(self) -> None:
        """Stop the engine (in-flight transfers fail); idempotent."""
        super().close()

    def _free(self, handle: c_void_p) -> None:
        lib.pdx_engine_free(handle)
        self._registered.clear()
        self._batches.clear()

    def _string(self, raw: bytes | None) -> str:
        if raw is None:
            check(PDX_ERR_INVALID_HANDLE if self._h else PDX_ERR_NULL_ARGUMENT)
        assert raw is not None
        return raw.decode()

    @property
    def session_id(self) -> str:
        """This engine's session name, "host:port", as peers address it."""
        return self._string(lib.pdx_engine_session_id(self._h))

    @property
    def rpc_port(self) -> int:
        """The handshake (RPC) port."""
        port = int(lib.pdx_engine_rpc_port(self._h))
        if port == 0:
            check(PDX_ERR_INVALID_HANDLE if self._h else PDX_ERR_NULL_ARGUMENT)
        return port

    @property
    def protocol(self) -> str:
        """The protocol the engine runs ("tcp", "rdma", ...)."""
        return self._string(lib.pdx_engine_protocol(self._h))

    @property
    def device(self) -> str:
        """The device filter the engine started with ("" = auto / TCP)."""
        return self._string(lib.pdx_engine_device(self._h))

    @property
    def transport_reason(self) -> str:
        """Why this protocol and device (rule, gpu_id, mapping entry)."""
        return self._string(lib.pdx_engine_transport_reason(self._h))

    # Registration.
    def register(self, memory: Memory, length: int | None = None) -> int:
        """Register a buffer (or `length` bytes at an int address); returns its address."""
        addr, length, keep = _memory(memory, length, writable=not isinstance(memory, int))
        check(lib.pdx_register_memory(self._h, addr, length))
        self._registered[addr] = keep
        return addr

    def register_at(self, memory: Memory, length: int | None = None, location: str = "*") -> int:
        """Register a buffer, or `length` bytes at an int address (a device
        pointer for "cuda:N"), at `location`: "cpu:N", "cuda:N" or "*" (ask
        the CUDA driver, see docs/gpu.md); returns the address."""
        addr, length, keep = _memory(memory, length, writable=not isinstance(memory, int))
        check(lib.pdx_register_memory_at(self._h, addr, length, location.encode()))
        self._registered[addr] = keep
        return addr

    def unregister(self, memory: Memory) -> None:
        """Withdraw a registration (by the buffer or its int address)."""
        addr = memory if isinstance(memory, int) else _memory(memory, writable=True)[0]
        check(lib.pdx_unregister_memory(self._h, addr))
        self._registered.pop(addr, None)

    def batch_register(self, regions: Sequence[Memory | tuple[int, int]]) -> list[int]:
        """Register buffers or (address, length) pairs, all or none."""
        found = [
            _memory(r[0], r[1], writable=False) if isinstance(r, tuple) else _memory(r, writable=True) for r in regions
        ]
        n = len(found)
        addrs = (c_void_p * max(n, 1))(*[f[0] for f in found])
        lens = (c_size_t * max(n, 1))(*[f[1] for f in found])
        check(lib.pdx_batch_register_memory(self._h, addrs, lens, n))
        for addr, _, keep in found:
            self._registered[addr] = keep
        return [f[0] for f in found]

    def batch_unregister(self, regions: Sequence[Memory]) -> None:
        """Withdraw several registrations (buffers or int addresses), all or none."""
        addrs = [r if isinstance(r, int) else _memory(r, writable=True)[0] for r in regions]
        arr = (c_void_p * max(len(addrs), 1))(*addrs)
        check(lib.pdx_batch_unregister_memory(self._h, arr, len(addrs)))
        for addr in addrs:
            self._registered.pop(addr, None)

    # Synchronous transfers.
    def write(self, session: str, src: Memory, remote_addr: int, length: int | None = None) -> None:
        """Write local `src` to `remote_addr` on `session`; returns once confirmed."""
        addr, length, _keep = _memory(src, length)
        check(lib.pdx_transfer_sync_write(self._h, _enc(session), addr, remote_addr, length))

    def read(self, session: str, dst: Memory, remote_addr: int, length: int | None = None) -> None:
        """Read from `remote_addr` on `session` into local `dst`."""
        addr, length, _keep = _memory(dst, length, writable=True)
        check(lib.pdx_transfer_sync_read(self._h, _enc(session), addr, remote_addr, length))

    def batch_write(self, session: str, entries: Sequence[Entry]) -> None:
        """Write a batch of (src, remote_addr[, length]) entries; all confirmed on return."""
        locals_, remotes, lens, n, _keep = _entries(entries, writable=False)
        check(lib.pdx_batch_transfer_sync_write(self._h, _enc(session), locals_, remotes, lens, n))

    def batch_read(self, session: str, entries: Sequence[Entry]) -> None:
        """Read a batch of (dst, remote_addr[, length]) entries."""
        locals_, remotes, lens, n, _keep = _entries(entries, writable=True)
        check(lib.pdx_batch_transfer_sync_read(self._h, _enc(session), locals_, remotes, lens, n))

    # Asynchronous batches.
    def submit(
        self, session: str, opcode: int | str, entries: Sequence[Entry], notify: tuple[str, str] | None = None
    ) -> int:
        """Start a batch ("read"/"write" or PDX_OPCODE_*); returns its id.

        With `notify` = (name, msg), the peer is notified once every entry completed."""
        op = _opcode(opcode)
        locals_, remotes, lens, n, keep = _entries(entries, writable=op == PDX_OPCODE_READ)
        name, msg = notify if notify is not None else (None, None)
        out = c_uint64()
        check(
            lib.pdx_batch_submit(
                self._h, _enc(session), op, locals_, remotes, lens, n, _enc(name), _enc(msg), ctypes.byref(out)
            )
        )
        self._batches[out.value] = keep
        return out.value

    def status(self, batch: int) -> BatchSummary:
        """The batch's summary (state, counts, bytes confirmed)."""
        out = BatchSummary()
        check(lib.pdx_batch_status(self._h, batch, ctypes.byref(out)))
        return out

    def task_status(self, batch: int, task: int) -> tuple[int, int, int]:
        """(state, bytes confirmed, error status) of one task."""
        state, nbytes, error = c_int32(), c_uint64(), pdx_status()
        check(lib.pdx_task_status(self._h, batch, task, ctypes.byref(state), ctypes.byref(nbytes), ctypes.byref(error)))
        return state.value, nbytes.value, error.value

    def task_error(self, batch: int, task: int) -> str:
        """The failure text of one task ("" if it has not failed)."""
        need = c_size_t()
        check(lib.pdx_task_error_message(self._h, batch, task, None, 0, ctypes.byref(need)))
        buf = ctypes.create_string_buffer(need.value + 1)
        check(lib.pdx_task_error_message(self._h, batch, task, buf, len(buf), ctypes.byref(need)))
        return buf.value.decode(errors="replace")

    def notify_error(self, batch: int) -> tuple[int, str]:
        """(status, text) of the batch's notification: (PDX_OK, "") unless it
        was requested and failed (e.g. PDX_ERR_NOTIFY_REJECTED)."""
        status, need = pdx_status(), c_size_t()
        check(lib.pdx_batch_notify_error(self._h, batch, ctypes.byref(status), None, 0, ctypes.byref(need)))
        buf = ctypes.create_string_buffer(need.value + 1)
        check(lib.pdx_batch_notify_error(self._h, batch, None, buf, len(buf), None))
        return status.value, buf.value.decode(errors="replace")

    def wait(self, batch: int, timeout_ms: int = 60000) -> int:
        """Wait for the batch; returns its state. PdxError(PDX_ERR_TIMEOUT) if still in flight."""
        state = c_int32()
        check(lib.pdx_batch_wait(self._h, batch, timeout_ms, ctypes.byref(state)))
        return state.value

    def free(self, batch: int) -> None:
        """Release a finished batch (PDX_ERR_BUSY while tasks are in flight)."""
        check(lib.pdx_batch_free(self._h, batch))
        self._batches.pop(batch, None)

    # Control messages.
    def probe(self, session: str) -> None:
        """Check that `session` answers (PdxError if not)."""
        check(lib.pdx_send_probe(self._h, _enc(session)))

    def notify(self, session: str, name: str, msg: str) -> None:
        """Send the notification (name, msg) to `session`."""
        check(lib.pdx_send_notify(self._h, _enc(session), _enc(name), _enc(msg)))

    def stats(self) -> dict[str, int]:
        """The engine's counters since it started, by `pdx_stats` field name:
        bytes and tasks written/read as initiator, failures by kind, requests
        served as target, handshakes, connections, peers, queued notification
        bytes, p50/p99 task latency in microseconds, and requests that failed
        as target on a device (CUDA) call."""
        out = Stats()
        out.size = ctypes.sizeof(Stats)
        check(lib.pdx_engine_stats(self._h, ctypes.byref(out)))
        return {name: int(getattr(out, name)) for name in STATS_FIELDS}

    def metrics_text(self) -> str:
        """The engine's metrics in the Prometheus text format 0.0.4
        (`pdx_engine_metrics`); `pdx.metrics` turns them into a collector."""
        return _grown_text(lambda buf, n, out: lib.pdx_engine_metrics(self._h, buf, n, out))

    def peer_info(self, session: str) -> dict[str, Any]:
        """One peer's figures (`pdx_peer_info`): "path" ("same-host" or
        "tcp") and "reason", bytes and tasks each way (and the bytes of the
        same-host link), failures by kind, last error and when, lanes open,
        tasks queued. PdxError (PDX_ERR_INVALID_ARGUMENT) for a peer this
        engine never sent to or has forgotten."""
        raw = _grown_text(lambda buf, n, out: lib.pdx_peer_info(self._h, _enc(session), buf, n, out))
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    def drain_notifications(self) -> list[tuple[str, str]]:
        """Take the (name, msg) notifications received so far, oldest first."""
        out = c_void_p()
        check(lib.pdx_notifications_drain(self._h, ctypes.byref(out)))
        try:
            pairs = []
            for i in range(lib.pdx_notifications_count(out)):
                name, msg = c_char_p(), c_char_p()
                check(lib.pdx_notification_get(out, i, ctypes.byref(name), ctypes.byref(msg)))
                pairs.append((_text(name.value), _text(msg.value)))
            return pairs
        finally:
            lib.pdx_notifications_free(out)


def _grown_text(call: Callable[[Any, int, Any], int]) -> str:
    """A text a pdx function copies out, when its length may change between
    the call that asks for the length and the one that copies."""
    needed = c_size_t()
    check(call(None, 0, ctypes.byref(needed)))
    while True:
        buf = ctypes.create_string_buffer(needed.value + 1 + needed.value // 8)
        check(call(buf, len(buf), ctypes.byref(needed)))
        if needed.value < len(buf):
            return buf.raw[: needed.value].decode()


# --- backends ---


def backend_available(name: str) -> bool:
    """Whether backend `name` ("tcp", "mooncake") can run in this process."""
    return bool(lib.pdx_backend_available(_enc(name)) == 1)


def backend_unavailable_reason(name: str) -> str:
    """Why `backend_available(name)` is false ("" when it is available)."""
    needed = c_size_t()
    check(lib.pdx_backend_unavailable_reason(_enc(name), None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib.pdx_backend_unavailable_reason(_enc(name), buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()


def capabilities() -> dict[str, Any]:
    """What this build and machine can serve: backends (native tcp; Mooncake's
    engine and whether its library loads, and why not) and memory kinds (see
    `pdx_capabilities`)."""
    needed = c_size_t()
    check(lib.pdx_capabilities(None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib.pdx_capabilities(buf, len(buf), ctypes.byref(needed)))
    parsed: dict[str, Any] = json.loads(buf.value.decode())
    return parsed


def session_id(host: str, port: int) -> str:
    """`host:port` as Mooncake names sessions (IPv6 literals bracketed)."""
    buf = ctypes.create_string_buffer(300)
    needed = c_size_t()
    check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    if needed.value >= len(buf):
        buf = ctypes.create_string_buffer(needed.value + 1)
        check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()


# --- logging ---
# pdx_set_log_callback (src/ffi/log.rs); levels are on logging's scale.

PDX_LOG_TRACE = 5
PDX_LOG_DEBUG = 10
PDX_LOG_ERROR = 40
#: void (*)(void *userdata, int32_t level, const char *module, size_t module_len,
#:          const char *message, size_t message_len); LOG_CALLBACK() is NULL.
LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int32, POINTER(ctypes.c_char), c_size_t,
                                POINTER(ctypes.c_char), c_size_t)
_LOG_SIGNATURES: list[_Signature] = [
    ("pdx_set_log_callback", pdx_status, [LOG_CALLBACK, c_void_p, c_int32]),
]
_SIGNATURES += _LOG_SIGNATURES
_declare(lib, _LOG_SIGNATURES)

# The installed callback: kept referenced while pdx may call it.
_log_callback: Any = None


def set_log_handler(logger: logging.Logger | None = None, level: int | None = None) -> None:
    """Route pdx's log records into Python's `logging`, or back to stderr.

    Records go to the child of `logger` named after the pdx module that
    logged (`pdx::engine::batch` -> `<logger>.engine.batch`); `logger`
    defaults to `logging.getLogger("pdx")`. Records below `level` (default:
    the logger's effective level) are dropped inside pdx, before any Python
    code runs. `remove_log_handler()` undoes it.
    Records logged from pdx's own threads arrive on those threads.
    """
    global _log_callback
    target = logger if logger is not None else logging.getLogger("pdx")
    threshold = target.getEffectiveLevel() if level is None else level

    def deliver(_userdata: object, lvl: int, module: Any, module_len: int, message: Any, message_len: int) -> None:
        try:
            name = ctypes.string_at(module, module_len).decode("utf-8", "replace")
            text = ctypes.string_at(message, message_len).decode("utf-8", "replace")
            parts = name.split("::")[1:]
            child = target.getChild(".".join(parts)) if parts else target
            child.log(lvl, "%s", text)
        except Exception:  # a handler must never unwind into pdx
            pass

    callback = LOG_CALLBACK(deliver)
    check(lib.pdx_set_log_callback(callback, None, threshold))
    _log_callback = callback


def remove_log_handler() -> None:
    """Send pdx's records to stderr again (`RUST_LOG` filters them). Returns
    once no call into the previous handler is running."""
    global _log_callback
    check(lib.pdx_set_log_callback(LOG_CALLBACK(), None, 0))
    _log_callback = None


@atexit.register
def _detach_log_handler() -> None:
    # pdx threads may still log while the interpreter shuts down.
    if _log_callback is not None:
        lib.pdx_set_log_callback(LOG_CALLBACK(), None, 0)


# The KV API (pdx.kv) declares its functions into _SIGNATURES on import.
from . import kv  # noqa: E402
