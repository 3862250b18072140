"""KV-cache transfers as one call: page plans over libpdx's KV API.

A :class:`Plan` is built once from the layer buffers of both sides and the
page map (``src_pages[i]`` here goes to ``dst_pages[i]`` there), checked by
pdx, and then moved whole (:meth:`Plan.transfer`) or layer by layer
(:meth:`Plan.submit`, whose notification reaches the peer only after every
earlier submit of the plan to that session has landed). Page indices may be
``array('i')``, numpy ``int32`` arrays (other integer dtypes are converted
in C), ``bytes``-like buffers of native ``int32`` or lists; nothing loops per
page in Python.

    plan = Plan(local, remote, src_pages, dst_pages)          # (base, page_bytes, pages) each
    for layer in range(layers):
        last = layer == layers - 1
        ids.append(plan.submit(engine, peer, 2 * layer, 2 * layer + 2,
                               notify=("kv_done", room) if last else None))
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Union

from .binding import _declare, _enc, _Handle, _Signature, _SIGNATURES, check, lib, pdx_status
from .engine import PDX_OPCODE_READ, PDX_OPCODE_WRITE, Engine, NoteText, NotifyBytes, notify_struct

__all__ = ["Heads", "KvBuffer", "KvHeads", "Plan", "group_concurrent_contiguous_count"]


class KvBuffer(ctypes.Structure):
    """`pdx_kv_buffer`: page `i` is `[base + i * page_bytes, base + (i + 1) * page_bytes)`."""

    _fields_ = [("base", c_uint64), ("page_bytes", c_uint64), ("pages", c_uint64)]

    def __repr__(self) -> str:
        return f"KvBuffer(base={self.base:#x}, page_bytes={self.page_bytes}, pages={self.pages})"


class KvHeads(ctypes.Structure):
    """`pdx_kv_heads`: heads `[local_first, local_first + count)` of each local
    token go to heads `[remote_first, remote_first + count)` of the remote token."""

    _fields_ = [
        ("tokens_per_page", c_uint32),
        ("local_heads", c_uint32),
        ("remote_heads", c_uint32),
        ("local_first", c_uint32),
        ("remote_first", c_uint32),
        ("count", c_uint32),
        ("head_bytes", c_uint64),
    ]


def Heads(
    tokens_per_page: int,
    local_heads: int,
    remote_heads: int,
    local_first: int,
    remote_first: int,
    count: int,
    head_bytes: int,
) -> KvHeads:
    """A :class:`KvHeads` from keyword or positional values."""
    return KvHeads(tokens_per_page, local_heads, remote_heads, local_first, remote_first, count, head_bytes)


_KV_SIGNATURES: list[_Signature] = [
    (
        "pdx_kv_plan_new",
        pdx_status,
        [POINTER(KvBuffer), POINTER(KvBuffer), c_size_t, POINTER(c_int32), POINTER(c_int32), c_size_t,
         POINTER(KvHeads), POINTER(c_void_p)],
    ),
    ("pdx_kv_plan_requests", pdx_status, [c_void_p, c_size_t, c_size_t, POINTER(c_size_t)]),
    (
        "pdx_kv_submit",
        pdx_status,
        [c_void_p, c_char_p, c_void_p, c_size_t, c_size_t, c_int32, c_void_p, c_char_p, c_char_p, POINTER(c_uint64)],
    ),
    (
        "pdx_kv_submit_notify_bytes",
        pdx_status,
        [c_void_p, c_char_p, c_void_p, c_size_t, c_size_t, c_int32, c_void_p, POINTER(NotifyBytes), POINTER(c_uint64)],
    ),
    ("pdx_kv_transfer_sync", pdx_status, [c_void_p, c_char_p, c_void_p, c_int32]),
    ("pdx_kv_notify_wait", pdx_status, [c_void_p, c_uint64, c_uint32, POINTER(pdx_status)]),
    ("pdx_kv_plan_free", None, [c_void_p]),
]
_SIGNATURES.extend(_KV_SIGNATURES)
_declare(lib, _KV_SIGNATURES)

#: A buffer: a KvBuffer or (base, page_bytes, pages).
BufferSpec = Union[KvBuffer, tuple[int, int, int]]
#: Page indices: array('i'), a numpy integer array, int32 bytes, or a sequence of ints.
Pages = Union["array[int]", bytes, bytearray, memoryview, Sequence[int], Any]


def _buffers(specs: Sequence[BufferSpec]) -> Any:
    arr = (KvBuffer * max(len(specs), 1))()
    for i, spec in enumerate(specs):
        arr[i] = spec if isinstance(spec, KvBuffer) else KvBuffer(*spec)
    return arr


def _pages(name: str, pages: Pages) -> tuple[Any, int, object]:
    """(int32 pointer, count, keep-alive) of an index array, copied once into
    an ``array('i')`` in C (pdx copies what it keeps anyway)."""
    ints = array("i")
    if isinstance(pages, (bytes, bytearray)) or (isinstance(pages, memoryview) and pages.format in ("B", "b", "c")):
        raw = memoryview(pages).cast("B")
        if raw.nbytes % 4:
            raise ValueError(f"{name}: {raw.nbytes} bytes are not a whole number of int32 indices")
        ints.frombytes(raw)
    else:
        try:
            view: memoryview | None = memoryview(pages)  # type: ignore[arg-type]  # TypeError: no buffer
        except TypeError:
            view = None
        try:
            if view is None:
                ints.extend(pages)
            elif view.ndim != 1:
                raise ValueError(f"{name} must be one-dimensional, not {view.ndim}-dimensional")
            elif view.format in ("i", "=i", "@i") and view.itemsize == 4 and view.c_contiguous:
                ints.frombytes(view.cast("B"))
            else:
                ints.extend(view.tolist())
        except OverflowError as e:
            raise ValueError(f"{name}: an index does not fit int32 ({e})") from None
    if len(ints) == 0:
        return None, 0, None
    addr, n = ints.buffer_info()
    return ctypes.cast(addr, POINTER(c_int32)), n, ints


def _opcode(op: int | str) -> int:
    if isinstance(op, str):
        return {"read": PDX_OPCODE_READ, "write": PDX_OPCODE_WRITE}[op.lower()]
    return op


def group_concurrent_contiguous_count(src_pages: Pages, dst_pages: Pages) -> int:
    """How many runs SGLang's `group_concurrent_contiguous` makes of this
    page map (the requests one buffer of a whole-page plan issues)."""
    one = KvBuffer(1 << 20, 1, 1 << 31)
    with Plan([one], [one], src_pages, dst_pages) as plan:
        return plan.requests()


class Plan(_Handle):
    """A `pdx_kv_plan`: the page map and buffers, checked and copied by pdx.

    `local[b]` pairs with `remote[b]`; `src_pages[i]` (local) with
    `dst_pages[i]` (remote). `heads` (a :class:`KvHeads`) sends a head slice
    of each token (heterogeneous TP). Arrays of different lengths raise
    ValueError with SGLang's text; every other bad input raises PdxError
    naming the argument and its value. Usable from many threads and with
    many engines."""

    def __init__(
        self,
        local: Sequence[BufferSpec],
        remote: Sequence[BufferSpec],
        src_pages: Pages,
        dst_pages: Pages,
        heads: KvHeads | None = None,
    ):
        self._h = c_void_p()
        src, n_src, _keep_src = _pages("src_pages", src_pages)
        dst, n_dst, _keep_dst = _pages("dst_pages", dst_pages)
        if n_src != n_dst:
            raise ValueError(
                f"group_concurrent_contiguous requires equal-length src/dst index arrays, got {n_src} and {n_dst}"
            )
        if len(local) != len(remote):
            raise ValueError(f"local has {len(local)} buffers but remote has {len(remote)}")
        lb, rb = _buffers(local), _buffers(remote)
        handle = c_void_p()
        check(
            lib.pdx_kv_plan_new(
                lb, rb, len(local), src, dst, n_src, ctypes.byref(heads) if heads is not None else None,
                ctypes.byref(handle),
            )
        )
        self._h = handle
        self.buffers = len(local)
        self.pages = n_src

    @property
    def handle(self) -> c_void_p:
        """The raw `pdx_kv_plan *`."""
        return self._h

    def requests(self, first: int = 0, end: int | None = None) -> int:
        """Requests a submit of buffers `[first, end)` issues (default: all)."""
        out = c_size_t()
        check(lib.pdx_kv_plan_requests(self._h, first, self.buffers if end is None else end, ctypes.byref(out)))
        return out.value

    def submit(
        self,
        engine: Engine,
        session: str,
        first: int = 0,
        end: int | None = None,
        opcode: int | str = "write",
        notify: tuple[NoteText, NoteText] | None = None,
        wait_event: int | None = None,
    ) -> int:
        """Start buffers `[first, end)` as one batch and return its id at once
        (`engine.wait` / `engine.status` / `engine.free` serve it). `notify`
        = (name, msg) reaches the peer once, after this submit and every
        earlier submit of this plan to `session` landed (each str or bytes,
        any bytes, as `Engine.notify` takes them). `wait_event` (a
        CUevent as an int, e.g. `torch.cuda.Event().cuda_event`) orders the
        copies after the work recorded on it, with no synchronize needed."""
        note, _keep = notify_struct(notify)
        out = c_uint64()
        check(
            lib.pdx_kv_submit_notify_bytes(
                engine.handle, _enc(session), self._h, first, self.buffers if end is None else end, _opcode(opcode),
                wait_event, note, ctypes.byref(out),
            )
        )
        return out.value

    def transfer(self, engine: Engine, session: str, opcode: int | str = "write") -> None:
        """Move every buffer and return once all landed."""
        check(lib.pdx_kv_transfer_sync(engine.handle, _enc(session), self._h, _opcode(opcode)))

    @staticmethod
    def notify_wait(engine: Engine, batch: int, timeout_ms: int = 60000) -> int:
        """Wait for the notification of submit `batch`; its status (PDX_OK:
        delivered). PdxError(PDX_ERR_TIMEOUT) while it still waits for its layers."""
        status = pdx_status()
        check(lib.pdx_kv_notify_wait(engine.handle, batch, timeout_ms, ctypes.byref(status)))
        return status.value

    def close(self) -> None:
        """Free the plan; idempotent. Batches already submitted are not affected."""
        super().close()

    def _free(self, handle: c_void_p) -> None:
        lib.pdx_kv_plan_free(handle)
