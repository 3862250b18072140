"""The transfer engine (:class:`Engine`, ``src/ffi/engine/``): registered
memory, transfers and batches, notifications, and what an engine shows of
itself (stats, metrics, peers)."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint16, c_uint64, c_void_p
from typing import Any, Union

from .binding import (
    PDX_ERR_INVALID_HANDLE,
    PDX_ERR_NULL_ARGUMENT,
    _declare,
    _enc,
    _grown_text,
    _Handle,
    _Signature,
    _SIGNATURES,
    check,
    lib,
    pdx_status,
)
from .options import _Options

PDX_OPCODE_READ = 0
PDX_OPCODE_WRITE = 1
PDX_TASK_PENDING = 0
PDX_TASK_COMPLETED = 1
PDX_TASK_FAILED = 2
PDX_TASK_CANCELED = 3


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
    "tasks_canceled",
)


class NotifyBytes(ctypes.Structure):
    """`pdx_notify_bytes`: a notification's name and message as bytes."""

    _fields_ = [
        ("name", c_void_p),
        ("name_len", c_size_t),
        ("msg", c_void_p),
        ("msg_len", c_size_t),
    ]


#: A notification's name or message as callers give it: text (sent as UTF-8) or bytes.
NoteText = Union[str, bytes, bytearray, memoryview]


def note_bytes(value: object, what: str = "notification") -> bytes:
    """The bytes of a notification's name or message: a str as UTF-8, bytes
    (bytearray, memoryview) as they are; TypeError for anything else."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def note_value(raw: bytes) -> str | bytes:
    """A received name or message: a str when its bytes are UTF-8 (as text
    usually is), else the bytes themselves (msgpack, any binary)."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def notify_struct(notify: tuple[NoteText, NoteText] | None) -> tuple[Any, Any]:
    """`(pointer to pdx_notify_bytes or None, keep-alive)` for a (name, msg) pair."""
    if notify is None:
        return None, None
    if not isinstance(notify, tuple) or len(notify) != 2:
        raise TypeError(f"notify must be a (name, msg) tuple, not {notify!r}")
    name, msg = note_bytes(notify[0], "notify name"), note_bytes(notify[1], "notify message")
    note = NotifyBytes(ctypes.cast(ctypes.c_char_p(name), c_void_p), len(name),
                       ctypes.cast(ctypes.c_char_p(msg), c_void_p), len(msg))
    return ctypes.byref(note), (note, name, msg)


class Stats(ctypes.Structure):
    """`pdx_stats`: an engine's counters since it started (see `Engine.stats`)."""

    _fields_ = [("size", c_size_t)] + [(name, c_uint64) for name in STATS_FIELDS]

_ENGINE_SIGNATURES: list[_Signature] = [
    ("pdx_engine_init", pdx_status, [c_char_p, c_char_p, c_char_p, POINTER(c_void_p)]),
    ("pdx_engine_init_with", pdx_status, [c_char_p, c_char_p, c_char_p, c_void_p, POINTER(c_void_p)]),
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
    ("pdx_batch_cancel", pdx_status, [c_void_p, c_uint64, POINTER(c_size_t)]),
    ("pdx_task_cancel", pdx_status, [c_void_p, c_uint64, c_size_t, POINTER(c_int32)]),
    ("pdx_send_probe", pdx_status, [c_void_p, c_char_p]),
    ("pdx_first_buffer_address", pdx_status, [c_void_p, c_char_p, POINTER(ctypes.c_uint64)]),
    ("pdx_batch_submit_notify_bytes", pdx_status,
     [c_void_p, c_char_p, c_int32, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_size_t), c_size_t,
      POINTER(NotifyBytes), POINTER(c_uint64)]),
    ("pdx_send_notify", pdx_status, [c_void_p, c_char_p, c_char_p, c_char_p]),
    ("pdx_send_notify_bytes", pdx_status, [c_void_p, c_char_p, POINTER(NotifyBytes)]),
    ("pdx_notifications_drain", pdx_status, [c_void_p, POINTER(c_void_p)]),
    ("pdx_notifications_count", c_size_t, [c_void_p]),
    ("pdx_notification_get", pdx_status, [c_void_p, c_size_t, POINTER(c_char_p), POINTER(c_char_p)]),
    ("pdx_notification_get_bytes", pdx_status, [c_void_p, c_size_t, POINTER(NotifyBytes)]),
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
        self,
        session: str,
        opcode: int | str,
        entries: Sequence[Entry],
        notify: tuple[NoteText, NoteText] | None = None,
    ) -> int:
        """Start a batch ("read"/"write" or PDX_OPCODE_*); returns its id.

        With `notify` = (name, msg), str or bytes, the peer is notified once
        every entry completed."""
        op = _opcode(opcode)
        locals_, remotes, lens, n, keep = _entries(entries, writable=op == PDX_OPCODE_READ)
        note, _keep_note = notify_struct(notify)
        out = c_uint64()
        check(
            lib.pdx_batch_submit_notify_bytes(
                self._h, _enc(session), op, locals_, remotes, lens, n, note, ctypes.byref(out)
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
        """Release a finished batch (PDX_ERR_BUSY while tasks are in flight: cancel it first)."""
        check(lib.pdx_batch_free(self._h, batch))
        self._batches.pop(batch, None)

    def cancel(self, batch: int) -> int:
        """Cancel the batch's tasks still in flight; returns how many this call cancelled.

        Once it returns, pdx reads and writes none of their local memory again (a cancelled
        write's bytes already sent may still land at the peer); they end PDX_TASK_CANCELED and
        the batch is finished (free it as usual)."""
        n = c_size_t()
        check(lib.pdx_batch_cancel(self._h, batch, ctypes.byref(n)))
        return n.value

    def cancel_task(self, batch: int, task: int) -> int:
        """Cancel one task if it is still in flight, as `cancel`; returns its state after
        (PDX_TASK_CANCELED, or PDX_TASK_COMPLETED / PDX_TASK_FAILED when it had ended first)."""
        state = c_int32()
        check(lib.pdx_task_cancel(self._h, batch, task, ctypes.byref(state)))
        return state.value

    # Control messages.
    def probe(self, session: str) -> None:
        """Check that `session` answers (PdxError if not)."""
        check(lib.pdx_send_probe(self._h, _enc(session)))

    def notify(self, session: str, name: NoteText, msg: NoteText) -> None:
        """Send the notification (name, msg) to `session`: each str (sent as
        UTF-8) or bytes, any bytes (a pdx peer receives them intact)."""
        note, _keep = notify_struct((name, msg))
        check(lib.pdx_send_notify_bytes(self._h, _enc(session), note))

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

    def drain_notifications(self, as_bytes: bool = False) -> list[tuple[Any, Any]]:
        """Take the (name, msg) notifications received so far, oldest first.

        Each name and message is a str when its bytes are UTF-8 and the
        bytes themselves otherwise; with `as_bytes`, always bytes."""
        out = c_void_p()
        check(lib.pdx_notifications_drain(self._h, ctypes.byref(out)))
        try:
            pairs: list[tuple[Any, Any]] = []
            for i in range(lib.pdx_notifications_count(out)):
                note = NotifyBytes()
                check(lib.pdx_notification_get_bytes(out, i, ctypes.byref(note)))
                name = ctypes.string_at(note.name, note.name_len) if note.name_len else b""
                msg = ctypes.string_at(note.msg, note.msg_len) if note.msg_len else b""
                pairs.append((name, msg) if as_bytes else (note_value(name), note_value(msg)))
            return pairs
        finally:
            lib.pdx_notifications_free(out)
