"""Mooncake's ``mooncake.engine.TransferEngine`` API, served by pdx.

``pdx.mooncake.TransferEngine`` has the constructor, method names, argument
order, argument types and return values of the class in the PyPI wheel
``mooncake-transfer-engine-non-cuda`` 0.3.13.post1, so code written for
Mooncake (SGLang's ``MooncakeTransferEngine``, vLLM's and LMCache's
connectors) runs on pdx unchanged::

    from pdx.mooncake import TransferEngine   # instead of mooncake.engine

It is built on pdx's C ABI (``pdx_engine_init``, ``pdx_register_memory``,
``pdx_batch_submit``, ``pdx_send_probe``...): ``tcp`` runs on pdx's native TCP
engine (wire-compatible with Mooncake's), every other protocol on Mooncake's
own library loaded by pdx (see the README). The protocol is resolved by pdx's
single resolver, exactly as for every pdx engine: the ``protocol`` argument,
forced to ``tcp`` when ``MC_FORCE_TCP`` is set.

Conventions kept from the wheel:

- calls return ``0`` on success and a negative code on failure (the codes the
  wheel returns for the same failure: ``-1`` for a failed transfer, ``-7`` for
  an overlapping registration, ``-3`` for an unknown one, ``-101`` / ``-102``
  for a probe whose peer cannot be resolved / reached); the reason is logged
  on the ``pdx.mooncake`` logger;
- asynchronous batch ids are non-zero ints, ``0`` when the batch could not be
  started; ``get_batch_transfer_status`` waits for every listed batch and
  frees it, ``transfer_check_status`` answers 1 (done), 0 (pending) or -1;
- arguments are converted as pybind11 converts them: an ``int`` parameter
  takes ints (bools and objects with ``__index__`` too), never floats, strings
  or negative values for an unsigned one (``TypeError``), a list parameter any
  sequence, a ``str`` parameter ``str`` or ``bytes``.

Metadata servers: ``P2PHANDSHAKE``, Mooncake's HTTP metadata server
(``http://host:port/metadata``) and etcd (``etcd://h:p[,h:p]`` or a bare
``h:p``), with Mooncake's keys and values (see docs/metadata.md); ``redis``
and unknown schemes are refused with ``-1`` and a logged reason (never an
abort).

Where pdx differs (listed in the README): ``get_engine``, ``get_engine_ptr``
and ``get_local_topology`` raise ``NotImplementedError`` (there is no C++
``mooncake::TransferEngine`` object); the ``location`` of a registration and ``transport_hint`` are
accepted and ignored (the wheel ignores the hint too); a stale or made-up
batch id gives ``-1`` instead of undefined behaviour; a batch that
``get_batch_transfer_status`` gives up on (a deadline, a failed neighbour) is
cancelled before the call returns, so its memory is untouched afterwards (the
wheel's keeps moving); and the module function ``cancel_transfer(engine,
batch_id)`` (pdx only) cancels a batch.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import mmap
import operator
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

from .binding import (
    PDX_ERR_ADDRESS_NOT_REGISTERED,
    PDX_ERR_ADDRESS_OVERLAP,
    PDX_ERR_BUSY,
    PDX_ERR_CONNECTION_LOST,
    PDX_ERR_IO,
    PDX_ERR_NOT_FOUND,
    PDX_ERR_PEER_UNREACHABLE,
    PDX_ERR_TIMEOUT,
    PDX_OK,
    STATUS_NAMES,
    PdxError,
    last_error,
    lib,
    status_str,
)
from .engine import (
    PDX_OPCODE_READ,
    PDX_OPCODE_WRITE,
    PDX_TASK_COMPLETED,
    PDX_TASK_FAILED,
    PDX_TASK_PENDING,
    BatchSummary,
    Engine,
    note_value,
    notify_struct,
)

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]

log = logging.getLogger("pdx.mooncake")

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's return codes (its error.h) for the failures the wheel reports.
ERR_INVALID_ARGUMENT = -1
ERR_METADATA = -200
ERR_ADDRESS_NOT_REGISTERED = -3
ERR_ADDRESS_OVERLAPPED = -7
ERR_DNS_FAIL = -101
ERR_SOCKET = -102

# Build features of the wheel's module; pdx serves none of them through this API.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False

_U64 = (1 << 64) - 1


class TransferOpcode(enum.IntEnum):
    """The direction of a transfer (``TransferOpcode.Read`` / ``.Write``)."""

    Read = 0
    Write = 1

    def __str__(self) -> str:
        return f"TransferOpcode.{self.name}"


_Opcode = TransferOpcode  # the enum, for annotations inside TransferEngine (whose attribute shadows it)
Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification (``name``, ``msg``) sent with a transfer or received by ``get_notifies``.

    Both are bytes underneath, as in the wheel (a C++ ``std::string``): each
    is set from a ``str`` (kept as UTF-8) or ``bytes``, and reads as a
    ``str`` when its bytes are UTF-8, as the wheel's does. Where the wheel's
    getter raises ``UnicodeDecodeError`` (bytes that are not UTF-8, such as
    msgpack), this one gives the ``bytes``; ``name_bytes`` and ``msg_bytes``
    always give bytes."""

    __slots__ = ("_name", "_msg")

    def __init__(self, name: Optional[str | bytes] = None, msg: Optional[str | bytes] = None):
        """``TransferNotify()`` (empty) or ``TransferNotify(name, msg)``, as in the wheel."""
        if (name is None) != (msg is None):
            _incompatible("TransferNotify.__init__", (name, msg))
        self._name = b"" if name is None else _note(name, "TransferNotify.__init__")
        self._msg = b"" if msg is None else _note(msg, "TransferNotify.__init__")

    @property
    def name(self) -> str | bytes:
        """The name: a str when its bytes are UTF-8, else the bytes."""
        return note_value(self._name)

    @name.setter
    def name(self, value: str | bytes) -> None:
        self._name = _note(value, "TransferNotify.name")

    @property
    def msg(self) -> str | bytes:
        """The message: a str when its bytes are UTF-8, else the bytes."""
        return note_value(self._msg)

    @msg.setter
    def msg(self, value: str | bytes) -> None:
        self._msg = _note(value, "TransferNotify.msg")

    @property
    def name_bytes(self) -> bytes:
        """The name's bytes (pdx's addition to the wheel's API)."""
        return self._name

    @property
    def msg_bytes(self) -> bytes:
        """The message's bytes (pdx's addition to the wheel's API)."""
        return self._msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferNotify) and (self._name, self._msg) == (other._name, other._msg)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the wheel's


# ---------------------------------------------------------------- arguments
# pybind11's conversions, so bad arguments fail as they do with the wheel.


def _incompatible(fn: str, value: object) -> NoReturn:
    """pybind11's TypeError for arguments it cannot convert, naming the supported signature."""
    import inspect

    owner: Any = TransferNotify if fn.startswith("TransferNotify") else TransferEngine
    method = getattr(owner, fn.rsplit(".", 1)[-1], None)
    try:
        signature = str(inspect.signature(method)).replace("'", "") if method else "(...)"
    except (TypeError, ValueError):
        signature = "(...)"
    raise TypeError(
        f"{fn}(): incompatible function arguments. The following argument types are supported:\n"
        f"    1. {signature}\n\nInvoked with: {value!r}"
    )


def _uint(value: object, fn: str, bits: int = 64) -> int:
    """An unsigned C integer: int, bool or an object with __index__; no floats, strings, negatives."""
    if isinstance(value, (float, str, bytes)) or value is None:
        _incompatible(fn, value)
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        _incompatible(fn, value)
    if number < 0 or number >> bits:
        _incompatible(fn, value)
    return number


def _str(value: object, fn: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    if value is None:
        raise RuntimeError("basic_string: construction from null is not valid")
    _incompatible(fn, value)


def _note(value: object, fn: str) -> bytes:
    """A notification's name or message as pybind11 converts it to a
    ``std::string``: a str as UTF-8, bytes as they are."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    if value is None:
        raise RuntimeError("basic_string: construction from null is not valid")
    _incompatible(fn, value)


def _location(text: str, fn: str) -> str:
    """Mooncake's location hint as pdx takes it: ``cpu:N``, ``cuda:N`` or ``*``."""
    kind, _, index = text.partition(":")
    if text == "*" or (kind in ("cpu", "cuda") and index.isdigit()):
        return text
    log.debug("%s: location %r is no cpu:N / cuda:N; detecting the memory instead", fn, text)
    return "*"


def _uints(values: object, fn: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        _incompatible(fn, values)
    return [_uint(v, fn) for v in values]


def _opcode(value: object, fn: str) -> TransferOpcode:
    # The wheel's own enum is accepted too (a process may hold both).
    if isinstance(value, TransferOpcode):
        return value
    name = getattr(value, "name", None)
    if type(value).__name__ == "TransferOpcode" and name in ("Read", "Write"):
        return TransferOpcode[str(name)]
    _incompatible(fn, value)


def _notify(value: object, fn: str) -> Optional[tuple[bytes, bytes]]:
    if value is None:
        return None
    if isinstance(value, TransferNotify):
        return value.name_bytes, value.msg_bytes
    # The wheel's own TransferNotify (a process may hold both): its getters
    # give str, or raise with the bytes when they are not UTF-8.
    try:
        name, msg = getattr(value, "name", None), getattr(value, "msg", None)
    except UnicodeDecodeError as exc:
        _incompatible(fn, exc.object)
    if isinstance(name, (str, bytes)) and isinstance(msg, (str, bytes)):
        return _note(name, fn), _note(msg, fn)
    _incompatible(fn, value)


def _metadata_string(server: str, metadata_type: Optional[str]) -> str:
    """The metadata string the wheel builds: ``type://server`` for ``initialize_ext``
    (unless the server already names a scheme or is ``P2PHANDSHAKE``)."""
    text = server.strip()
    if not text or text == P2PHANDSHAKE:
        return P2PHANDSHAKE
    kind = (metadata_type or "").strip()
    if kind and kind != P2PHANDSHAKE and "://" not in text:
        return f"{kind}://{text}"
    return text


def _transfer_timeout_s() -> float:
    """MC_TRANSFER_TIMEOUT (seconds, at least 5, default 30), read as the wheel reads it."""
    raw = os.environ.get("MC_TRANSFER_TIMEOUT")
    if raw is None:
        return 30.0
    try:
        seconds = int(raw.strip().split()[0]) if raw.strip() else 0
    except ValueError:
        seconds = 0  # atoi of garbage
    return float(max(5, seconds))


class _Batch:
    __slots__ = ("total_bytes", "started")

    def __init__(self, total_bytes: int):
        self.total_bytes = total_bytes
        self.started = time.monotonic()


class TransferEngine:
    """Mooncake's ``TransferEngine`` (the wheel's Python API) on pdx.

    Construct it without arguments, then ``initialize(...)`` it. Every method
    keeps the wheel's name, argument order and return convention."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        """An engine that is not initialized yet (the wheel's constructor takes no arguments)."""
        self._engine: Optional[Engine] = None
        self._lock = threading.Lock()
        self._batches: dict[int, _Batch] = {}
        self._managed: dict[int, tuple[mmap.mmap, Any]] = {}
        # Sessions an asynchronous call has reached, as the wheel caches its opened segments.
        self._opened: set[str] = set()
        # Batch ids given up while still in flight (freed by _reap once they end).
        self._abandoned: set[int] = set()
        self._timeout_s = _transfer_timeout_s()

    # ------------------------------------------------------------ lifecycle
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Start the engine on ``local_hostname``; 0 on success, -1 on failure (reason logged).

        ``metadata_server`` is ``"P2PHANDSHAKE"``, an ``http://`` URL of
        Mooncake's metadata server, or etcd (``etcd://h:p`` or a bare
        ``h:p``); ``protocol`` is resolved
        by pdx (``MC_FORCE_TCP`` forces ``tcp``); ``device_name`` is a
        comma-separated device list ("" for none)."""
        fn = "initialize"
        args = (_str(local_hostname, fn), _str(metadata_server, fn), _str(protocol, fn), _str(device_name, fn))
        return self._start(*args, metadata_type=None)

    def initialize_ext(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str
    ) -> int:
        """``initialize`` with an explicit metadata type (``http``, ``etcd``...): the
        server string becomes ``type://server`` as the wheel builds it."""
        fn = "initialize_ext"
        return self._start(
            _str(local_hostname, fn),
            _str(metadata_server, fn),
            _str(protocol, fn),
            _str(device_name, fn),
            metadata_type=_str(metadata_type, fn),
        )

    def _start(
        self, hostname: str, metadata_server: str, protocol: str, device: str, metadata_type: Optional[str]
    ) -> int:
        if protocol == "xgmi":
            log.error("Protocol 'xgmi' is not exposed in the Python API. Use 'hip' instead.")
            return -1
        # Always passed: the argument wins over PDX_METADATA_SERVER in the environment.
        options: dict[str, object] = {"metadata_server": _metadata_string(metadata_server, metadata_type)}
        try:
            engine = Engine(hostname, protocol or None, device or None, **options)
        except PdxError as exc:
            log.error("pdx could not start a %s engine on %r: %s", protocol or "default", hostname, exc)
            return -1
        with self._lock:
            old, self._engine = self._engine, engine
            self._batches.clear()
            self._opened.clear()
            self._abandoned.clear()
        if old is not None:
            old.close()
        log.info("pdx engine %s (%s) serving Mooncake's TransferEngine API", engine.session_id, engine.protocol)
        return 0

    def _h(self) -> Any:
        if self._engine is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        return self._engine.handle

    def _fail(self, what: str, status: int) -> None:
        log.error("%s failed: %s: %s", what, STATUS_NAMES.get(status, status), last_error())

    def get_rpc_port(self) -> int:
        """The handshake (RPC) port peers reach this engine on."""
        if self._engine is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        return self._engine.rpc_port

    # ---------------------------------------------------------- registration
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Register ``capacity`` bytes at ``buffer_addr``; 0, -7 if it overlaps a registration, -1 otherwise.

        ``location`` is Mooncake's: ``"cpu:N"``, ``"cuda:N"`` (device memory,
        staged through pinned host memory) or ``"*"`` (detect); other hints are
        treated as ``"*"``."""
        fn = "register_memory"
        addr, length = _uint(buffer_addr, fn), _uint(capacity, fn)
        where = _location(_str(location, fn), fn)
        if length == 0:
            log.error("register_memory: a region of 0 bytes cannot be registered")
            return ERR_INVALID_ARGUMENT
        status = int(lib.pdx_register_memory_at(self._h(), addr, length, where.encode()))
        return self._registration_code(fn, status)

    def _register_each_at(self, fn: str, addrs: list[int], lens: list[int], where: str) -> int:
        """Register one by one at an explicit location, undoing on failure."""
        done: list[int] = []
        for addr, length in zip(addrs, lens):
            status = int(lib.pdx_register_memory_at(self._h(), addr, length, where.encode()))
            if status != PDX_OK:
                message = last_error()
                for a in done:
                    lib.pdx_unregister_memory(self._h(), a)
                log.error("%s: %s: %s", fn, status_str(status), message)
                return ERR_ADDRESS_OVERLAPPED if status == PDX_ERR_ADDRESS_OVERLAP else -1
            done.append(addr)
        return 0

    def _registration_code(self, what: str, status: int) -> int:
        if status == PDX_OK:
            return 0
        self._fail(what, status)
        if status == PDX_ERR_ADDRESS_OVERLAP:
            return ERR_ADDRESS_OVERLAPPED
        if status in (PDX_ERR_ADDRESS_NOT_REGISTERED, PDX_ERR_NOT_FOUND):
            return ERR_ADDRESS_NOT_REGISTERED
        return ERR_INVALID_ARGUMENT

    def unregister_memory(self, buffer_addr: int) -> int:
        """Withdraw the registration starting at ``buffer_addr``; 0, or -3 if there is none."""
        addr = _uint(buffer_addr, "unregister_memory")
        return self._registration_code("unregister_memory", int(lib.pdx_unregister_memory(self._h(), addr)))

    def batch_register_memory(self, buffer_addresses: list[int], capacities: list[int], location: str = "*") -> int:
        """Register several regions, all or none, at ``location`` (as for
        ``register_memory``); codes as ``register_memory``."""
        fn = "batch_register_memory"
        addrs, lens = _uints(buffer_addresses, fn), _uints(capacities, fn)
        where = _location(_str(location, fn), fn)
        if len(addrs) != len(lens):
            log.error("batch_register_memory: %d addresses for %d capacities", len(addrs), len(lens))
            return ERR_INVALID_ARGUMENT
        if any(n == 0 for n in lens):
            log.error("batch_register_memory: a region of 0 bytes cannot be registered")
            return ERR_INVALID_ARGUMENT
        if where != "*":
            return self._register_each_at(fn, addrs, lens, where)
        n = len(addrs)
        c_addrs = (ctypes.c_void_p * max(n, 1))(*addrs)
        c_lens = (ctypes.c_size_t * max(n, 1))(*lens)
        status = int(lib.pdx_batch_register_memory(self._h(), c_addrs, c_lens, n))
        return self._registration_code(fn, status)

    def batch_unregister_memory(self, buffer_addresses: list[int]) -> int:
        """Withdraw several registrations; 0, or -3 if one of them is unknown."""
        addrs = _uints(buffer_addresses, "batch_unregister_memory")
        c_addrs = (ctypes.c_void_p * max(len(addrs), 1))(*addrs)
        status = int(lib.pdx_batch_unregister_memory(self._h(), c_addrs, len(addrs)))
        return self._registration_code("batch_unregister_memory", status)

    def allocate_managed_buffer(self, length: int) -> int:
        """Allocate and register ``length`` bytes owned by the engine; their address, 0 on failure."""
        size = _uint(length, "allocate_managed_buffer")
        if size == 0:
            return 0
        try:
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError, OverflowError) as exc:
            log.error("allocate_managed_buffer(%d): %s", size, exc)
            return 0
        anchor = ctypes.c_char.from_buffer(region)
        addr = ctypes.addressof(anchor)
        status = int(lib.pdx_register_memory(self._h(), addr, size))
        if status != PDX_OK:
            self._fail("allocate_managed_buffer", status)
            del anchor
            region.close()
            return 0
        with self._lock:
            self._managed[addr] = (region, anchor)
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unregister and release a buffer from ``allocate_managed_buffer``; 0, -1 if unknown."""
        addr = _uint(buffer_addr, "free_managed_buffer")
        _uint(length, "free_managed_buffer")
        with self._lock:
            entry = self._managed.pop(addr, None)
        if entry is None:
            log.error("free_managed_buffer: %#x was not allocated by allocate_managed_buffer", addr)
            return ERR_INVALID_ARGUMENT
        lib.pdx_unregister_memory(self._h(), addr)
        region, anchor = entry
        del anchor, entry
        region.close()
        return 0

    # ----------------------------------------------------- synchronous calls
    def _sync(
        self,
        fn: str,
        target_hostname: object,
        buffers: Sequence[int],
        peers: Sequence[int],
        lengths: Sequence[int],
        opcode: _Opcode,
        notify: Optional[tuple[bytes, bytes]],
    ) -> int:
        target = _str(target_hostname, fn)
        if not (len(buffers) == len(peers) == len(lengths)):
            log.error("buffers, peer_buffer_addresses and lengths have different size")
            return -1
        if notify is None:
            # No notification: pdx's synchronous calls, one C call that waits within pdx's deadlines.
            h, session, n = self._h(), target.encode(), len(buffers)
            if n == 1:
                call = lib.pdx_transfer_sync_write if opcode == TransferOpcode.Write else lib.pdx_transfer_sync_read
                status = int(call(h, session, buffers[0], peers[0], lengths[0]))
            else:
                batch = lib.pdx_batch_transfer_sync_write if opcode == TransferOpcode.Write else (
                    lib.pdx_batch_transfer_sync_read
                )
                status = int(
                    batch(
                        h,
                        session,
                        (ctypes.c_void_p * max(n, 1))(*buffers),
                        (ctypes.c_uint64 * max(n, 1))(*peers),
                        (ctypes.c_size_t * max(n, 1))(*lengths),
                        n,
                    )
                )
            if status != PDX_OK:
                self._fail(f"{fn} to {target}", status)
                return -1
            return 0
        batch_id = self._submit(fn, target, buffers, peers, lengths, opcode, notify)
        if batch_id == 0:
            return -1
        return self._wait_and_free(fn, [batch_id])

    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """Write ``length`` bytes from local ``buffer`` to the peer's address; 0 once confirmed, -1 on failure."""
        fn = "transfer_sync_write"
        args = ([_uint(buffer, fn)], [_uint(peer_buffer_address, fn)], [_uint(length, fn)])
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, TransferOpcode.Write, None)

    def transfer_sync_read(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """Read ``length`` bytes from the peer's address into local ``buffer``; 0, or -1 on failure."""
        fn = "transfer_sync_read"
        args = ([_uint(buffer, fn)], [_uint(peer_buffer_address, fn)], [_uint(length, fn)])
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, TransferOpcode.Read, None)

    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: _Opcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int:
        """One transfer in direction ``opcode``, then (with ``notify``) a notification to the peer; 0 or -1."""
        fn = "transfer_sync"
        args = ([_uint(buffer, fn)], [_uint(peer_buffer_address, fn)], [_uint(length, fn)])
        op, note = _opcode(opcode, fn), _notify(notify, fn)
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, op, note)

    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        """Write every (buffer, peer address, length) entry; 0 once all are confirmed, -1 if any failed."""
        fn = "batch_transfer_sync_write"
        args = (_uints(buffers, fn), _uints(peer_buffer_addresses, fn), _uints(lengths, fn))
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, TransferOpcode.Write, None)

    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        """Read every (buffer, peer address, length) entry; 0, or -1 if any failed."""
        fn = "batch_transfer_sync_read"
        args = (_uints(buffers, fn), _uints(peer_buffer_addresses, fn), _uints(lengths, fn))
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, TransferOpcode.Read, None)

    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        opcode: _Opcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int:
        """A batch in direction ``opcode``, then (with ``notify``) a notification; 0 or -1."""
        fn = "batch_transfer_sync"
        args = (_uints(buffers, fn), _uints(peer_buffer_addresses, fn), _uints(lengths, fn))
        op, note = _opcode(opcode, fn), _notify(notify, fn)
        _str(transport_hint, fn)
        return self._sync(fn, target_hostname, *args, op, note)

    # ---------------------------------------------------- asynchronous calls
    def _submit(
        self,
        fn: str,
        target: str,
        buffers: Sequence[int],
        peers: Sequence[int],
        lengths: Sequence[int],
        opcode: _Opcode,
        notify: Optional[tuple[bytes, bytes]],
    ) -> int:
        """Start a pdx batch; its id, or 0 (failure logged)."""
        if self._abandoned:
            self._reap()
        n = len(buffers)
        c_locals = (ctypes.c_void_p * max(n, 1))(*buffers)
        c_remotes = (ctypes.c_uint64 * max(n, 1))(*peers)
        c_lens = (ctypes.c_size_t * max(n, 1))(*lengths)
        note, _keep = notify_struct(notify)
        out = ctypes.c_uint64()
        status = int(
            lib.pdx_batch_submit_notify_bytes(
                self._h(),
                target.encode(),
                PDX_OPCODE_WRITE if opcode == TransferOpcode.Write else PDX_OPCODE_READ,
                c_locals,
                c_remotes,
                c_lens,
                n,
                note,
                ctypes.byref(out),
            )
        )
        if status != PDX_OK:
            self._fail(f"{fn} to {target}", status)
            return 0
        with self._lock:
            self._batches[out.value] = _Batch(sum(lengths))
        return out.value

    def _async(
        self, fn: str, target_hostname: object, buffers: object, peers: object, lengths: object, opcode: _Opcode
    ) -> int:
        target = _str(target_hostname, fn)
        locals_, remotes, lens = _uints(buffers, fn), _uints(peers, fn), _uints(lengths, fn)
        if not self._open(fn, target):
            return 0
        if not (len(locals_) == len(remotes) == len(lens)):
            log.error("buffers, peer_buffer_addresses and lengths have different size")
            return 0
        return self._submit(fn, target, locals_, remotes, lens, opcode, None)

    def _open(self, fn: str, target: str) -> bool:
        """Reach `target` once before its first asynchronous batch.

        The wheel opens the peer's segment (a handshake) inside the call and
        returns 0 when that fails; pdx connects lazily, so a probe stands in
        for the handshake the first time, and the session is remembered."""
        with self._lock:
            if target in self._opened:
                return True
        status = int(lib.pdx_send_probe(self._h(), target.encode()))
        if status != PDX_OK:
            self._fail(f"{fn}: cannot reach {target}", status)
            return False
        with self._lock:
            self._opened.add(target)
        return True

    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        """Start writing a batch; its id (for ``get_batch_transfer_status``), 0 if it could not start."""
        _str(transport_hint, "batch_transfer_async_write")
        return self._async(
            "batch_transfer_async_write", target_hostname, buffers, peer_buffer_addresses, lengths, TransferOpcode.Write
        )

    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        """Start reading a batch; its id, 0 if it could not start."""
        _str(transport_hint, "batch_transfer_async_read")
        return self._async(
            "batch_transfer_async_read", target_hostname, buffers, peer_buffer_addresses, lengths, TransferOpcode.Read
        )

    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        opcode: _Opcode,
        transport_hint: str = "",
    ) -> int:
        """Start a batch in direction ``opcode``; its id, 0 if it could not start."""
        fn = "batch_transfer_async"
        op = _opcode(opcode, fn)
        _str(transport_hint, fn)
        return self._async(fn, target_hostname, buffers, peer_buffer_addresses, lengths, op)

    def _wait_and_free(self, fn: str, batch_ids: Sequence[int]) -> int:
        """Wait for every batch (each within MC_TRANSFER_TIMEOUT plus 1 ns per byte) and free
        it; 0 when all completed, -1 at the first failure. As in the wheel, every listed id
        is invalid afterwards; batches still in flight are cancelled (their memory untouched
        once this returns) and freed."""
        h = self._h()
        result = 0
        for batch in batch_ids:
            with self._lock:
                info = self._batches.get(batch)
            if info is None:
                log.error("%s: %d is not a batch of this engine (unknown or already finished)", fn, batch)
                result = -1
                break
            deadline = info.started + self._timeout_s + info.total_bytes * 1e-9
            state = ctypes.c_int32()
            while True:
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                status = int(lib.pdx_batch_wait(h, batch, min(left_ms, 1000), ctypes.byref(state)))
                if status != PDX_ERR_TIMEOUT or time.monotonic() >= deadline:
                    break
            if status != PDX_OK:
                self._fail(f"{fn}: batch {batch}", status)
                result = -1
                break
            if state.value != PDX_TASK_COMPLETED:
                self._log_batch_failure(fn, batch)
                result = -1
                break
            self._release(batch)
        if result != 0:
            for batch in batch_ids:
                self._release(batch)
        return result

    def _log_batch_failure(self, fn: str, batch: int) -> None:
        """Log why a finished batch failed (its first failed task's error)."""
        summary = BatchSummary()
        h = self._h()
        lib.pdx_batch_status(h, batch, ctypes.byref(summary))
        reason = ""
        for task in range(summary.total):
            state = ctypes.c_int32()
            if lib.pdx_task_status(h, batch, task, ctypes.byref(state), None, None) != PDX_OK:
                break
            if state.value == PDX_TASK_FAILED:
                buf = ctypes.create_string_buffer(512)
                lib.pdx_task_error_message(h, batch, task, buf, len(buf), None)
                reason = f"; task {task}: {buf.value.decode(errors='replace')}"
                break
        log.error("%s: batch %d failed (%d of %d tasks)%s", fn, batch, summary.failed, summary.total, reason)

    def _release(self, batch: int) -> None:
        """Forget a batch id and free it. One still in flight is cancelled first (nothing
        touches its memory once that returns); where it cannot be (Mooncake's own library has
        no cancel) it is freed once it finishes."""
        with self._lock:
            if self._batches.pop(batch, None) is None:
                return
            self._abandoned.add(batch)
        summary = BatchSummary()
        h = self._h()
        if lib.pdx_batch_status(h, batch, ctypes.byref(summary)) == PDX_OK and summary.state == PDX_TASK_PENDING:
            status = int(lib.pdx_batch_cancel(h, batch, None))
            if status != PDX_OK:
                log.warning("batch %d is released in flight and cannot be cancelled: %s", batch, last_error())
        self._reap()

    def _reap(self) -> None:
        """Free the forgotten batches that have finished."""
        with self._lock:
            pending = list(self._abandoned)
        for batch in pending:
            status = int(lib.pdx_batch_free(self._h(), batch))
            if status != PDX_ERR_BUSY:  # freed (or already gone)
                with self._lock:
                    self._abandoned.discard(batch)

    def _cancel_transfer(self, batch_id: int) -> int:
        """See the module's `cancel_transfer`."""
        batch = _uint(batch_id, "cancel_transfer")
        with self._lock:
            known = batch in self._batches
        if not known:
            log.error("cancel_transfer: %d is not a batch of this engine (unknown or already finished)", batch)
            return -1
        status = int(lib.pdx_batch_cancel(self._h(), batch, None))
        if status != PDX_OK:
            self._fail(f"cancel_transfer: batch {batch}", status)
        self._release(batch)
        return 0 if status == PDX_OK else -1

    def get_batch_transfer_status(self, batch_ids: list[int]) -> int:
        """Wait for the listed batches and free them; 0 if every one completed, -1 otherwise."""
        ids = _uints(batch_ids, "get_batch_transfer_status")
        return self._wait_and_free("get_batch_transfer_status", ids)

    def transfer_submit_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """Start one write; its id (for ``transfer_check_status``), 0 if it could not start."""
        fn = "transfer_submit_write"
        args = ([_uint(buffer, fn)], [_uint(peer_buffer_address, fn)], [_uint(length, fn)])
        _str(transport_hint, fn)
        return self._async(fn, target_hostname, *args, TransferOpcode.Write)

    def transfer_check_status(self, batch_id: int) -> int:
        """1 once the transfer completed (its id is freed), 0 while pending, -1 if it failed (freed)."""
        batch = _uint(batch_id, "transfer_check_status")
        with self._lock:
            known = batch in self._batches
        summary = BatchSummary()
        status = int(lib.pdx_batch_status(self._h(), batch, ctypes.byref(summary))) if known else -1
        if status != PDX_OK:
            if known:
                self._fail(f"transfer_check_status: batch {batch}", status)
            else:
                log.error("transfer_check_status: %d is not a batch of this engine", batch)
            return -1
        if summary.state == PDX_TASK_PENDING:
            return 0
        self._release(batch)
        return 1 if summary.state == PDX_TASK_COMPLETED else -1

    # ------------------------------------------------------ control messages
    def send_probe(self, peer_server_name: str) -> int:
        """Ask the peer whether it is alive; 0 when it answered, -101 if its name does not resolve,
        -102 if it cannot be reached, -1 otherwise."""
        name = _str(peer_server_name, "send_probe")
        if self._engine is None:
            return -1
        status = int(lib.pdx_send_probe(self._h(), name.encode()))
        if status == PDX_OK:
            return 0
        self._fail(f"send_probe to {name}", status)
        if status == PDX_ERR_NOT_FOUND:
            return ERR_METADATA  # not published in the metadata server, as the wheel answers
        if status == PDX_ERR_PEER_UNREACHABLE:
            return ERR_DNS_FAIL if _unresolvable(name) else ERR_SOCKET
        if status in (PDX_ERR_CONNECTION_LOST, PDX_ERR_IO, PDX_ERR_TIMEOUT):
            return ERR_SOCKET
        return -1

    def get_notifies(self) -> list[TransferNotify]:
        """The notifications received since the last call, oldest first."""
        if self._engine is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        try:
            return [TransferNotify(name, msg) for name, msg in self._engine.drain_notifications(as_bytes=True)]
        except PdxError as exc:
            log.error("Failed to get notifies: %s", exc)
            return []

    # ------------------------------------------------------- local buffers
    def write_bytes_to_buffer(self, dest_address: int, src: str | bytes, length: int) -> int:
        """Copy ``length`` bytes of ``src`` to local memory at ``dest_address``; 0."""
        fn = "write_bytes_to_buffer"
        addr, size = _uint(dest_address, fn), _uint(length, fn)
        data = src.encode() if isinstance(src, str) else src
        if not isinstance(data, bytes):
            _incompatible(fn, src)
        if size > len(data):
            raise ValueError(f"write_bytes_to_buffer: length {size} exceeds the {len(data)} bytes given")
        ctypes.memmove(addr, data, size)
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """``length`` bytes of local memory at ``source_address``."""
        fn = "read_bytes_from_buffer"
        return ctypes.string_at(_uint(source_address, fn), _uint(length, fn))

    # ------------------------------------------------- what pdx cannot honour
    def get_engine(self) -> NoReturn:
        """Not available: there is no C++ ``mooncake::TransferEngine`` behind pdx to share."""
        raise NotImplementedError(
            "pdx.mooncake.TransferEngine.get_engine: pdx has no C++ mooncake::TransferEngine object to share "
            "(the engine is pdx's; use this object's methods, or pdx's C ABI from native code)"
        )

    def get_engine_ptr(self) -> NoReturn:
        """Not available: there is no C++ ``mooncake::TransferEngine`` pointer behind pdx."""
        raise NotImplementedError(
            "pdx.mooncake.TransferEngine.get_engine_ptr: pdx has no C++ mooncake::TransferEngine pointer "
            "(native code should call pdx's C ABI, include/pdx.h)"
        )

    def get_local_topology(self, device_name: Optional[str] = None) -> NoReturn:
        """Not available: pdx's C ABI does not export Mooncake's topology discovery."""
        raise NotImplementedError(
            "pdx.mooncake.TransferEngine.get_local_topology: pdx does not expose Mooncake's NIC topology"
        )

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The first buffer ``segment_name`` registered (this engine's own, or a peer's read
        afresh from the metadata directory); 0 when the segment is unknown or has none."""
        name = _str(segment_name, "get_first_buffer_address")
        if self._engine is None:
            raise RuntimeError("TransferEngine is not initialized: call initialize() first")
        out = ctypes.c_uint64(0)
        status = int(lib.pdx_first_buffer_address(self._h(), name.encode(), ctypes.byref(out)))
        if status != PDX_OK:
            self._fail(f"get_first_buffer_address({name})", status)
            return 0
        return int(out.value)

    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: nothing to warm up (as the wheel without EFA); EFA engines raise NotImplementedError."""
        _str(segment_name, "warmup_efa_segment")
        if self._engine is not None and self._engine.protocol == "efa":
            raise NotImplementedError("pdx.mooncake.TransferEngine.warmup_efa_segment: not available for efa")
        return 0

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            try:
                engine.close()
            except Exception:
                pass


def cancel_transfer(engine: TransferEngine, batch_id: int) -> int:
    """pdx only (the wheel has no cancel; a function of the module, so that the class keeps
    exactly the wheel's attributes): cancel `engine`'s batch `batch_id` if it is still in
    flight and free the id. 0 once nothing reads or writes its local memory any more (bytes
    of a write already sent may still land at the peer); -1 for an unknown id, or when the
    batch cannot be cancelled (Mooncake's own library; it is then freed once it finishes)."""
    return engine._cancel_transfer(batch_id)


# help() and typing.get_type_hints show the enum by its public name (the source says
# _Opcode only because the class attribute TransferOpcode shadows it for type checkers).
for _method in vars(TransferEngine).values():
    _hints = getattr(_method, "__annotations__", {})
    for _key, _value in list(_hints.items()):
        if _value == "_Opcode":
            _hints[_key] = "TransferOpcode"


def _unresolvable(session: str) -> bool:
    """Whether the host part of ``session`` does not resolve (the wheel's -101 case)."""
    import socket

    if session.startswith("[") and "]" in session:
        host = session[1 : session.index("]")]
    elif session.count(":") == 1:
        host = session.split(":", 1)[0]
    else:
        host = session
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return True
    return False


def __getattr__(name: str) -> NoReturn:
    # Module attributes of the wheel that pdx does not serve (RpcInterface, SharedSegment, ...).
    raise AttributeError(
        f"module 'pdx.mooncake' (pdx's mooncake.engine) has no attribute {name!r}: pdx serves the "
        "TransferEngine API only"
    )


# The opt-in shim's always-on .pth (``--install-shim``). Kept here with the command that
# writes it: ``pdx_mooncake_shim`` imports this module to serve it, never the reverse.
_ALWAYS_PTH = "pdx-mooncake-shim-always.pth"


def _default_site_dir() -> str:
    """This environment's site-packages (where the wheel's files are)."""
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _install_shim(site_dir: str) -> str:
    """Write the always-on ``.pth`` into ``site_dir``; its path."""
    path = os.path.join(site_dir, _ALWAYS_PTH)
    with open(path, "w", encoding="utf-8") as f:
        # One line (a .pth runs lines that start with `import`); harmless once pdx is uninstalled.
        f.write(
            'import importlib.util; importlib.util.find_spec("pdx_mooncake_shim") and '
            '__import__("pdx_mooncake_shim").activate("installed by python -m pdx.mooncake --install-shim")\n'
        )
    return path


def _uninstall_shim(site_dir: str) -> Optional[str]:
    """Remove the always-on ``.pth`` from ``site_dir``; its path, or None if there was none."""
    path = os.path.join(site_dir, _ALWAYS_PTH)
    if not os.path.exists(path):
        return None
    os.remove(path)
    return path


def _shim_active() -> bool:
    """Whether the shim serves ``mooncake.engine`` in this process. It can only when a
    ``.pth`` loaded it at start-up, so an unloaded shim is an inactive one."""
    import sys

    shim = sys.modules.get("pdx_mooncake_shim")
    return shim is not None and bool(shim.active())


def _main(argv: Optional[list[str]] = None) -> int:
    """``python -m pdx.mooncake --install-shim | --uninstall-shim | --status [--site DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pdx.mooncake",
        description="Serve `import mooncake.engine` from pdx in every interpreter of this environment "
        "(or only where PDX_MOONCAKE_SHIM=1, without --install-shim).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--install-shim", action="store_true", help="always serve mooncake.engine from pdx")
    action.add_argument("--uninstall-shim", action="store_true", help="remove what --install-shim wrote")
    action.add_argument("--status", action="store_true", help="say whether the shim is installed / active")
    parser.add_argument("--site", help="site-packages directory to write to (default: this environment's)")
    args = parser.parse_args(argv)
    site_dir = args.site or _default_site_dir()
    if args.install_shim:
        print(f"pdx: wrote {_install_shim(site_dir)}: `import mooncake.engine` is now served by pdx")
    elif args.uninstall_shim:
        removed = _uninstall_shim(site_dir)
        print(f"pdx: removed {removed}" if removed else f"pdx: no shim installed in {site_dir}")
    else:
        installed = os.path.exists(os.path.join(site_dir, _ALWAYS_PTH))
        print(f"installed: {installed} ({site_dir}); active in this process: {_shim_active()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
