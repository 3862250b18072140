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
    ("pdx_backend_available", c_int32, [c_char_p]),
    ("pdx_session_id", pdx_status, [c_char_p, c_uint16, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_backend_unavailable_reason", pdx_status, [c_char_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
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


# --- engine ---
# The transfer engine (src/ffi/engine.rs). Declared here, in one block, and
# appended to _SIGNATURES so the signature table stays complete.

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


_ENGINE_SIGNATURES = [
    ("pdx_engine_init", pdx_status, [c_char_p, c_char_p, c_char_p, POINTER(c_void_p)]),
    ("pdx_engine_free", None, [c_void_p]),
    ("pdx_engine_session_id", c_char_p, [c_void_p]),
    ("pdx_engine_rpc_port", c_uint16, [c_void_p]),
    ("pdx_engine_protocol", c_char_p, [c_void_p]),
    ("pdx_register_memory", pdx_status, [c_void_p, c_void_p, c_size_t]),
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
    ("pdx_batch_wait", pdx_status, [c_void_p, c_uint64, ctypes.c_uint32, POINTER(c_int32)]),
    ("pdx_batch_free", pdx_status, [c_void_p, c_uint64]),
    ("pdx_send_probe", pdx_status, [c_void_p, c_char_p]),
    ("pdx_send_notify", pdx_status, [c_void_p, c_char_p, c_char_p, c_char_p]),
    ("pdx_notifications_drain", pdx_status, [c_void_p, POINTER(c_void_p)]),
    ("pdx_notifications_count", c_size_t, [c_void_p]),
    ("pdx_notification_get", pdx_status, [c_void_p, c_size_t, POINTER(c_char_p), POINTER(c_char_p)]),
    ("pdx_notifications_free", None, [c_void_p]),
]
_SIGNATURES += _ENGINE_SIGNATURES
for _name, _restype, _argtypes in _ENGINE_SIGNATURES:
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


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
    if isinstance(obj, bytes):
        if writable:
            raise TypeError("bytes are read-only; use a bytearray or another writable buffer")
        addr = ctypes.cast(ctypes.c_char_p(obj), c_void_p).value or 0
        size, keep = len(obj), obj
    else:
        view = memoryview(obj)
        if not view.c_contiguous:
            raise ValueError("buffer is not C-contiguous")
        if view.readonly:
            raise TypeError("buffer is read-only; pass bytes or a writable buffer")
        view = view.cast("B")
        size = view.nbytes
        keep = (ctypes.c_char * size).from_buffer(view)
        addr = ctypes.addressof(keep)
    if length is None:
        length = size
    elif length > size:
        raise ValueError(f"length {length} exceeds the buffer's {size} bytes")
    return addr, length, keep


def _entries(entries, writable: bool):
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


def _opcode(op: int | str) -> int:
    if isinstance(op, str):
        return {"read": PDX_OPCODE_READ, "write": PDX_OPCODE_WRITE}[op.lower()]
    return op


class Engine:
    """A `pdx_engine`: a transfer engine on `hostname` (see pdx_engine_init).

    Memory arguments are int addresses (with a length) or buffers (bytes for
    sources, bytearray / memoryview / ctypes or numpy arrays for anything).
    Remote addresses are ints in the peer's process. Every failure raises
    PdxError. Buffers of registered regions and of submitted batches are
    kept referenced until they are unregistered / the batch is freed.
    """

    def __init__(self, hostname: str = "127.0.0.1", protocol: str | None = "tcp", device: str | None = None):
        handle = c_void_p()
        check(lib.pdx_engine_init(_enc(hostname), _enc(protocol), _enc(device), ctypes.byref(handle)))
        self._h = handle
        self._registered: dict[int, object] = {}
        self._batches: dict[int, object] = {}

    @property
    def handle(self) -> c_void_p:
        return self._h

    def close(self) -> None:
        if self._h:
            lib.pdx_engine_free(self._h)
            self._h = c_void_p()
            self._registered.clear()
            self._batches.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _string(self, raw: bytes | None) -> str:
        if raw is None:
            check(PDX_ERR_INVALID_HANDLE if self._h else PDX_ERR_NULL_ARGUMENT)
        return raw.decode()

    @property
    def session_id(self) -> str:
        return self._string(lib.pdx_engine_session_id(self._h))

    @property
    def rpc_port(self) -> int:
        port = lib.pdx_engine_rpc_port(self._h)
        if port == 0:
            check(PDX_ERR_INVALID_HANDLE if self._h else PDX_ERR_NULL_ARGUMENT)
        return port

    @property
    def protocol(self) -> str:
        return self._string(lib.pdx_engine_protocol(self._h))

    # Registration.
    def register(self, memory: object, length: int | None = None) -> int:
        """Register a buffer (or `length` bytes at an int address); returns its address."""
        addr, length, keep = _memory(memory, length, writable=not isinstance(memory, int))
        check(lib.pdx_register_memory(self._h, addr, length))
        self._registered[addr] = keep
        return addr

    def unregister(self, memory: object) -> None:
        addr = memory if isinstance(memory, int) else _memory(memory, writable=True)[0]
        check(lib.pdx_unregister_memory(self._h, addr))
        self._registered.pop(addr, None)

    def batch_register(self, regions: list) -> list[int]:
        """Register buffers or (address, length) pairs, all or none."""
        found = [_memory(*r, writable=False) if isinstance(r, tuple) else _memory(r, writable=True) for r in regions]
        n = len(found)
        addrs = (c_void_p * max(n, 1))(*[f[0] for f in found])
        lens = (c_size_t * max(n, 1))(*[f[1] for f in found])
        check(lib.pdx_batch_register_memory(self._h, addrs, lens, n))
        for addr, _, keep in found:
            self._registered[addr] = keep
        return [f[0] for f in found]

    def batch_unregister(self, regions: list) -> None:
        addrs = [r if isinstance(r, int) else _memory(r, writable=True)[0] for r in regions]
        arr = (c_void_p * max(len(addrs), 1))(*addrs)
        check(lib.pdx_batch_unregister_memory(self._h, arr, len(addrs)))
        for addr in addrs:
            self._registered.pop(addr, None)

    # Synchronous transfers.
    def write(self, session: str, src: object, remote_addr: int, length: int | None = None) -> None:
        addr, length, _keep = _memory(src, length)
        check(lib.pdx_transfer_sync_write(self._h, _enc(session), addr, remote_addr, length))

    def read(self, session: str, dst: object, remote_addr: int, length: int | None = None) -> None:
        addr, length, _keep = _memory(dst, length, writable=True)
        check(lib.pdx_transfer_sync_read(self._h, _enc(session), addr, remote_addr, length))

    def batch_write(self, session: str, entries: list) -> None:
        """entries: (src, remote_addr[, length]) tuples."""
        locals_, remotes, lens, n, _keep = _entries(entries, writable=False)
        check(lib.pdx_batch_transfer_sync_write(self._h, _enc(session), locals_, remotes, lens, n))

    def batch_read(self, session: str, entries: list) -> None:
        """entries: (dst, remote_addr[, length]) tuples."""
        locals_, remotes, lens, n, _keep = _entries(entries, writable=True)
        check(lib.pdx_batch_transfer_sync_read(self._h, _enc(session), locals_, remotes, lens, n))

    # Asynchronous batches.
    def submit(self, session: str, opcode: int | str, entries: list,
               notify: tuple[str, str] | None = None) -> int:
        """Start a batch ("read"/"write" or PDX_OPCODE_*); returns its id."""
        op = _opcode(opcode)
        locals_, remotes, lens, n, keep = _entries(entries, writable=op == PDX_OPCODE_READ)
        name, msg = notify if notify is not None else (None, None)
        out = c_uint64()
        check(lib.pdx_batch_submit(self._h, _enc(session), op, locals_, remotes, lens, n,
                                   _enc(name), _enc(msg), ctypes.byref(out)))
        self._batches[out.value] = keep
        return out.value

    def status(self, batch: int) -> BatchSummary:
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

    def wait(self, batch: int, timeout_ms: int = 60000) -> int:
        """Wait for the batch; returns its state. PdxError(PDX_ERR_TIMEOUT) if still in flight."""
        state = c_int32()
        check(lib.pdx_batch_wait(self._h, batch, timeout_ms, ctypes.byref(state)))
        return state.value

    def free(self, batch: int) -> None:
        check(lib.pdx_batch_free(self._h, batch))
        self._batches.pop(batch, None)

    # Control messages.
    def probe(self, session: str) -> None:
        check(lib.pdx_send_probe(self._h, _enc(session)))

    def notify(self, session: str, name: str, msg: str) -> None:
        check(lib.pdx_send_notify(self._h, _enc(session), _enc(name), _enc(msg)))

    def drain_notifications(self) -> list[tuple[str, str]]:
        out = c_void_p()
        check(lib.pdx_notifications_drain(self._h, ctypes.byref(out)))
        try:
            pairs = []
            for i in range(lib.pdx_notifications_count(out)):
                name, msg = c_char_p(), c_char_p()
                check(lib.pdx_notification_get(out, i, ctypes.byref(name), ctypes.byref(msg)))
                pairs.append((name.value.decode(), msg.value.decode()))
            return pairs
        finally:
            lib.pdx_notifications_free(out)


# --- backends ---


def backend_available(name: str) -> bool:
    """Whether backend `name` ("tcp", "mooncake") can run in this process."""
    return lib.pdx_backend_available(_enc(name)) == 1


def backend_unavailable_reason(name: str) -> str:
    """Why `backend_available(name)` is false ("" when it is available)."""
    needed = c_size_t()
    check(lib.pdx_backend_unavailable_reason(_enc(name), None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib.pdx_backend_unavailable_reason(_enc(name), buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()


def session_id(host: str, port: int) -> str:
    """`host:port` as Mooncake names sessions (IPv6 literals bracketed)."""
    buf = ctypes.create_string_buffer(300)
    needed = c_size_t()
    check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    if needed.value >= len(buf):
        buf = ctypes.create_string_buffer(needed.value + 1)
        check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()


# ------------------------------------------------ device (CUDA) memory
# Appended as one block so it merges cleanly with the package split.

STATUS_NAMES.update({-26: "PDX_ERR_DEVICE_UNAVAILABLE", -27: "PDX_ERR_DEVICE"})
globals().update({name: code for code, name in STATUS_NAMES.items()})

_DEVICE_SIGNATURES = [
    ("pdx_register_memory_at", pdx_status, [c_void_p, c_void_p, c_size_t, c_char_p]),
]
_SIGNATURES += _DEVICE_SIGNATURES
for _name, _restype, _argtypes in _DEVICE_SIGNATURES:
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def _register_at(self, memory: object, length: int | None = None, location: str = "*") -> int:
    """Register a buffer, or `length` bytes at an int address (a device
    pointer for `"cuda:N"`), at `location`: "cpu:N", "cuda:N" or "*" (ask the
    CUDA driver). Returns the address."""
    if isinstance(memory, int):
        addr, length, keep = memory, length, None
        if length is None:
            raise ValueError("length is required with an address")
    else:
        addr, length, keep = _memory(memory, length, writable=True)
    check(lib.pdx_register_memory_at(self._h, addr, length, location.encode()))
    self._registered[addr] = keep
    return addr


Engine.register_at = _register_at
