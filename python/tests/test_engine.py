"""The transfer engine through ctypes: the pdx.Engine wrapper between two
native TCP engines on 127.0.0.1, and raw calls for every NULL / bad-handle /
bad-length / bad-id case. Also checks that every function of include/pdx.h is
declared in pdx._SIGNATURES with matching types."""

from __future__ import annotations

import ctypes
import os
import random
import re
import socket
import threading
from ctypes import POINTER, byref, c_char, c_char_p, c_int32, c_size_t, c_uint64, c_void_p
from pathlib import Path

import pytest

import pdx
from pdx import lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "pdx.h"
TARGET_LEN = 1 << 20
WAIT_MS = 30000
BAD_UTF8 = b"12\xff\xfe"


# ----------------------------------------------------------------- header

def _header_prototypes() -> dict[str, tuple[str, list[str]]]:
    """{name: (return type, [parameter types])} of every pdx_* function in the header."""
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    protos = {}
    for decl in text.split(";"):
        m = re.search(r"([A-Za-z_][\w\s\*]*?)\b(pdx_\w+)\s*\(([^)]*)\)\s*$", decl.strip(), flags=re.S)
        if not m or "typedef" in m.group(1):
            continue
        params = []
        for p in m.group(3).split(","):
            p = " ".join(p.split())
            if p in ("", "void"):
                continue
            params.append(re.sub(r"\s*\b\w+$", "", p))  # drop the parameter name
        protos[m.group(2)] = (" ".join(m.group(1).split()), params)
    return protos


_SCALARS = {
    "int32_t": c_int32, "pdx_status": c_int32, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32,
    "uint64_t": c_uint64, "int64_t": ctypes.c_int64, "size_t": c_size_t, "int": ctypes.c_int,
    "bool": ctypes.c_bool,
}


def _allowed(ctype: str) -> set:
    """The ctypes declarations that match a C type."""
    if ctype == "pdx_log_callback":  # a function-pointer typedef
        return {pdx.LOG_CALLBACK}
    stars = ctype.count("*")
    base = " ".join(w for w in ctype.replace("*", " ").split() if w != "const")
    structs = {
        "pdx_batch_summary": pdx.BatchSummary,
        "pdx_stats": pdx.Stats,
        "pdx_kv_buffer": pdx.kv.KvBuffer,
        "pdx_kv_heads": pdx.kv.KvHeads,
        "pdx_notify_bytes": pdx.NotifyBytes,
    }
    opaque = base == "void" or (base.startswith("pdx_") and base != "pdx_status" and base not in structs)
    if stars == 0:
        return {None} if base == "void" else {_SCALARS[base]}
    if stars == 1:
        if base == "char":
            return {c_char_p, POINTER(c_char)}
        if opaque:
            return {c_void_p}
        if base in structs:
            return {POINTER(structs[base])}
        return {POINTER(_SCALARS[base])}
    if stars == 2:
        if base == "char":
            return {POINTER(c_char_p)}
        if opaque:
            return {POINTER(c_void_p)}
    raise AssertionError(f"no ctypes mapping for C type {ctype!r}")


def test_header_functions_all_declared():
    protos = _header_prototypes()
    assert len(protos) > 40 and "pdx_engine_init" in protos and "pdx_version" in protos
    declared = {name: (restype, argtypes) for name, restype, argtypes in pdx._SIGNATURES}
    missing = sorted(set(protos) - set(declared))
    assert not missing, f"exported in pdx.h but not declared in pdx._SIGNATURES: {missing}"
    stale = sorted(set(declared) - set(protos))
    assert not stale, f"declared in pdx._SIGNATURES but not in pdx.h: {stale}"
    assert len(declared) == len(pdx._SIGNATURES), "a function is declared twice"


def test_header_signatures_match():
    protos = _header_prototypes()
    wrong = []
    for name, restype, argtypes in pdx._SIGNATURES:
        ret, params = protos[name]
        if len(argtypes) != len(params):
            wrong.append(f"{name}: {len(argtypes)} argtypes for {len(params)} parameters {params}")
            continue
        if restype not in _allowed(ret):
            wrong.append(f"{name}: restype {restype} for {ret!r}")
        for i, (have, ctype) in enumerate(zip(argtypes, params)):
            if have not in _allowed(ctype):
                wrong.append(f"{name}: argument {i} is {have} for {ctype!r}")
        fn = getattr(lib, name)
        if fn.argtypes != argtypes or fn.restype is not restype:
            wrong.append(f"{name}: the loaded function's signature differs from _SIGNATURES")
    assert not wrong, "\n".join(wrong)


def test_constants_match_header():
    text = HEADER.read_text()
    for name in ("PDX_OPCODE_READ", "PDX_OPCODE_WRITE"):
        m = re.search(rf"#define {name} (-?\d+)", text)
        assert m and int(m.group(1)) == getattr(pdx, name)
    for name, value in pdx.STATUS_NAMES.items():
        m = re.search(rf"#define {value} (-?\d+)", text)
        assert m and int(m.group(1)) == name


def test_task_state_constants_in_header():
    text = HEADER.read_text()
    for name in ("PDX_TASK_PENDING", "PDX_TASK_COMPLETED", "PDX_TASK_FAILED", "PDX_TASK_CANCELED"):
        m = re.search(rf"#define {name} (-?\d+)", text)
        assert m and int(m.group(1)) == getattr(pdx, name)


# --------------------------------------------------------------- fixtures

@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MC_FORCE_TCP", "MOONCAKE_PROTOCOL", "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE"):
        monkeypatch.delenv(name, raising=False)


class Pair:
    def __init__(self):
        self.a = pdx.Engine("127.0.0.1", "tcp")
        self.b = pdx.Engine("127.0.0.1", "tcp")
        self.target = bytearray(TARGET_LEN)
        self.base = self.b.register(self.target)
        self.session = self.b.session_id

    def view(self, addr: int, length: int) -> bytes:
        off = addr - self.base
        return bytes(self.target[off:off + length])


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    yield p
    p.a.close()
    p.b.close()


def _rand(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1000003 + n).randbytes(n)


def _error_text() -> str:
    return pdx.last_error()


# -------------------------------------------------------------- lifecycle

def test_identity(pair):
    for e in (pair.a, pair.b):
        port = e.rpc_port
        assert 0 < port < 65536
        assert e.session_id == f"127.0.0.1:{port}"
        assert e.protocol == "tcp"
    assert pair.a.session_id != pair.b.session_id
    assert lib.pdx_engine_session_id(pair.a.handle) == lib.pdx_engine_session_id(pair.a.handle)


def test_context_manager_and_close():
    with pdx.Engine("127.0.0.1", "tcp") as e:
        assert e.protocol == "tcp"
        handle = e.handle.value
    assert not e.handle
    e.close()  # twice is fine
    with pytest.raises(pdx.PdxError) as err:
        e.probe("127.0.0.1:1")
    assert err.value.status == pdx.PDX_ERR_NULL_ARGUMENT
    # The freed handle itself is refused.
    assert lib.pdx_send_probe(handle, b"127.0.0.1:1") == pdx.PDX_ERR_INVALID_HANDLE
    assert lib.pdx_engine_session_id(handle) is None
    lib.pdx_engine_free(handle)  # already freed: ignored
    lib.pdx_engine_free(None)


def test_init_errors():
    with pytest.raises(pdx.PdxError) as e:
        pdx.Engine("127.0.0.1", "udp")
    assert e.value.status == pdx.PDX_ERR_UNKNOWN_PROTOCOL and "udp" in e.value.message
    with pytest.raises(pdx.PdxError) as e:
        pdx.Engine("127.0.0.1", "rdma")
    assert e.value.status == pdx.PDX_ERR_BACKEND_UNAVAILABLE and e.value.message
    with pytest.raises(pdx.PdxError) as e:
        pdx.Engine("127.0.0.1", None)  # default protocol: rdma
    assert e.value.status == pdx.PDX_ERR_BACKEND_UNAVAILABLE

    sentinel = c_void_p(0x5A5A50)
    assert lib.pdx_engine_init(None, b"tcp", None, byref(sentinel)) == pdx.PDX_ERR_NULL_ARGUMENT
    assert _error_text()
    assert lib.pdx_engine_init(b"127.0.0.1", b"tcp", None, None) == pdx.PDX_ERR_NULL_ARGUMENT
    for args in ((BAD_UTF8, b"tcp", None), (b"127.0.0.1", BAD_UTF8, None), (b"127.0.0.1", b"tcp", BAD_UTF8)):
        assert lib.pdx_engine_init(*args, byref(sentinel)) == pdx.PDX_ERR_INVALID_UTF8
    assert lib.pdx_engine_init(b"127.0.0.1", b"udp", None, byref(sentinel)) == pdx.PDX_ERR_UNKNOWN_PROTOCOL
    assert lib.pdx_engine_init(b"127.0.0.1", b"rdma", None, byref(sentinel)) == pdx.PDX_ERR_BACKEND_UNAVAILABLE
    assert sentinel.value == 0x5A5A50


def test_environment_selects_tcp(monkeypatch):
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    with pdx.Engine("127.0.0.1", None) as e:
        assert e.protocol == "tcp"
    monkeypatch.delenv("MOONCAKE_PROTOCOL")
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    with pdx.Engine("127.0.0.1", "rdma", "mlx5_0") as e:
        assert e.protocol == "tcp"


# ----------------------------------------------------------- registration

def test_registration_rules():
    with pdx.Engine("127.0.0.1", "tcp") as e:
        mem = (ctypes.c_char * 16384)()
        base = ctypes.addressof(mem)
        n = 4096
        with pytest.raises(pdx.PdxError) as err:
            e.register(base, 0)
        assert err.value.status == pdx.PDX_ERR_ADDRESS_OVERLAP
        e.register(base, n)
        for addr, length in ((base, n), (base + 10, 10), (base + n - 1, 2), (base - 1, 2)):
            with pytest.raises(pdx.PdxError) as err:
                e.register(addr, length)
            assert err.value.status == pdx.PDX_ERR_ADDRESS_OVERLAP, (addr - base, length)
        e.register(base + n, n)  # adjacent
        with pytest.raises(pdx.PdxError) as err:
            e.unregister(base + 1)
        assert err.value.status == pdx.PDX_ERR_NOT_FOUND
        e.unregister(base + n)
        with pytest.raises(pdx.PdxError) as err:
            e.unregister(base + n)
        assert err.value.status == pdx.PDX_ERR_NOT_FOUND
        e.unregister(base)

        # Batches, all or none.
        regions = [(base, n), (base + n, n), (base + 2 * n, n)]
        with pytest.raises(pdx.PdxError) as err:
            e.batch_register([(base, n), (base + n, 0), (base + 2 * n, n)])
        assert err.value.status == pdx.PDX_ERR_ADDRESS_OVERLAP
        with pytest.raises(pdx.PdxError) as err:
            e.batch_register([(base, n + 1), (base + n, n)])
        assert err.value.status == pdx.PDX_ERR_ADDRESS_OVERLAP
        with pytest.raises(pdx.PdxError) as err:
            e.unregister(base)
        assert err.value.status == pdx.PDX_ERR_NOT_FOUND  # nothing was registered
        assert e.batch_register(regions) == [r[0] for r in regions]
        with pytest.raises(pdx.PdxError) as err:
            e.batch_unregister([base, base + 3 * n])
        assert err.value.status == pdx.PDX_ERR_NOT_FOUND
        with pytest.raises(pdx.PdxError) as err:
            e.register(base, 1)
        assert err.value.status == pdx.PDX_ERR_ADDRESS_OVERLAP  # still registered
        e.batch_unregister([r[0] for r in regions])
        e.batch_register([])
        e.batch_unregister([])

        # Buffers.
        buf = bytearray(100)
        addr = e.register(buf)
        with pytest.raises(BufferError):
            buf.extend(b"x")  # pinned while registered
        e.unregister(buf)
        with pytest.raises(TypeError):
            e.register(b"read-only bytes")


def test_registration_raw_errors():
    with pdx.Engine("127.0.0.1", "tcp") as e:
        h = e.handle
        mem = (ctypes.c_char * 64)()
        addrs = (c_void_p * 2)(ctypes.addressof(mem), ctypes.addressof(mem) + 32)
        lens = (c_size_t * 2)(32, 32)
        assert lib.pdx_register_memory(h, None, 10) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_unregister_memory(h, None) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_batch_register_memory(h, None, lens, 2) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_batch_register_memory(h, addrs, None, 2) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_batch_unregister_memory(h, None, 2) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_batch_register_memory(h, None, None, 0) == pdx.PDX_OK
        assert lib.pdx_batch_unregister_memory(h, None, 0) == pdx.PDX_OK
        with_null = (c_void_p * 2)(ctypes.addressof(mem), None)
        assert lib.pdx_batch_register_memory(h, with_null, lens, 2) == pdx.PDX_ERR_NULL_ARGUMENT
        assert _error_text()
        assert lib.pdx_unregister_memory(h, ctypes.addressof(mem)) == pdx.PDX_ERR_NOT_FOUND
        assert lib.pdx_batch_register_memory(h, addrs, lens, 2) == pdx.PDX_OK
        assert lib.pdx_batch_unregister_memory(h, with_null, 2) == pdx.PDX_ERR_NULL_ARGUMENT
        assert lib.pdx_batch_unregister_memory(h, addrs, 2) == pdx.PDX_OK


# ---------------------------------------------------------------- transfers

@pytest.mark.parametrize("size", [1, 7, 4096, 65537, (1 << 20) - 3])
def test_sync_write_read(pair, size):
    data = _rand(size, 1)
    remote = pair.base + 3
    pair.a.write(pair.session, data, remote)
    assert pair.view(remote, size) == data
    back = bytearray(size)
    pair.a.read(pair.session, back, remote)
    assert bytes(back) == data


def test_buffer_kinds(pair):
    remote = pair.base + 4096
    arr = (ctypes.c_ubyte * 32)(*range(32))
    pair.a.write(pair.session, arr, remote)
    assert pair.view(remote, 32) == bytes(range(32))
    pair.a.write(pair.session, memoryview(bytearray(b"abcdef"))[1:4], remote)
    assert pair.view(remote, 4) == b"bcd\x03"
    pair.a.write(pair.session, ctypes.addressof(arr) + 8, remote, 2)
    assert pair.view(remote, 3) == b"\x08\x09d"
    dst = bytearray(10)
    pair.a.read(pair.session, dst, remote, 3)
    assert dst[:3] == b"\x08\x09d" and dst[3:] == bytes(7)
    with pytest.raises(TypeError):
        pair.a.read(pair.session, b"immutable", remote)
    with pytest.raises(ValueError):
        pair.a.write(pair.session, b"abc", remote, 4)
    with pytest.raises(TypeError):
        pair.a.write(pair.session, 12345, remote)  # an address needs a length


def test_out_of_range_refused(pair):
    end = pair.base + TARGET_LEN
    before = pair.view(end - 8, 8)
    for remote, size in ((end, 16), (end - 8, 16), (pair.base - 16, 16), (0, 8)):
        for op in (pair.a.write, pair.a.read):
            buf = bytearray(size)
            with pytest.raises(pdx.PdxError) as err:
                op(pair.session, buf, remote)
            assert err.value.status == pdx.PDX_ERR_REMOTE_REJECTED, (op.__name__, remote - pair.base, size)
            assert "rejected" in err.value.message
    assert pair.view(end - 8, 8) == before
    pair.a.write(pair.session, b"still fine", pair.base)
    assert pair.view(pair.base, 10) == b"still fine"


def test_sync_raw_errors(pair):
    h, s = pair.a.handle, pair.session.encode()
    buf = ctypes.create_string_buffer(16)
    assert lib.pdx_transfer_sync_write(h, None, buf, pair.base, 16) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_transfer_sync_read(h, None, buf, pair.base, 16) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_transfer_sync_write(h, BAD_UTF8, buf, pair.base, 16) == pdx.PDX_ERR_INVALID_UTF8
    assert lib.pdx_transfer_sync_read(h, BAD_UTF8, buf, pair.base, 16) == pdx.PDX_ERR_INVALID_UTF8
    assert lib.pdx_transfer_sync_write(h, s, None, pair.base, 16) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_transfer_sync_read(h, s, None, pair.base, 16) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_transfer_sync_write(h, s, buf, 2**64 - 4, 16) == pdx.PDX_ERR_INVALID_ARGUMENT
    assert _error_text()


def _scattered(pair, count: int, slot: int, offset: int, seed: int):
    rnd = random.Random(seed)
    order = list(range(count))
    rnd.shuffle(order)
    srcs, remotes = [], []
    for i in range(count):
        size = rnd.randint(1, slot)
        srcs.append(rnd.randbytes(size))
        remotes.append(pair.base + offset + order[i] * slot + (slot - size))
    return srcs, remotes


def test_batch_sync(pair):
    srcs, remotes = _scattered(pair, 500, 1500, 0, 7)
    pair.a.batch_write(pair.session, list(zip(srcs, remotes)))
    assert all(pair.view(r, len(s)) == s for s, r in zip(srcs, remotes))
    dsts = [bytearray(len(s)) for s in srcs]
    pair.a.batch_read(pair.session, list(zip(dsts, remotes)))
    assert [bytes(d) for d in dsts] == srcs
    pair.a.batch_write(pair.session, [])
    pair.a.batch_read(pair.session, [])


def test_batch_sync_partial_failure(pair):
    srcs = [_rand(64, i) for i in range(8)]
    remotes = [pair.base + 700000 + i * 64 for i in range(8)]
    remotes[5] = pair.base + TARGET_LEN - 10
    with pytest.raises(pdx.PdxError) as err:
        pair.a.batch_write(pair.session, list(zip(srcs, remotes)))
    assert err.value.status == pdx.PDX_ERR_REMOTE_REJECTED
    assert all(pair.view(remotes[i], 64) == srcs[i] for i in range(8) if i != 5)
    with pytest.raises(pdx.PdxError) as err:
        pair.a.batch_read(pair.session, [(bytearray(64), r) for r in remotes])
    assert err.value.status == pdx.PDX_ERR_REMOTE_REJECTED


def _arrays(n: int, addr: int = 0):
    return (c_void_p * n)(*([addr] * n)), (c_uint64 * n)(), (c_size_t * n)(*([1] * n))


@pytest.mark.parametrize("fn", ["pdx_batch_transfer_sync_write", "pdx_batch_transfer_sync_read"])
def test_batch_sync_raw_bad_lengths(pair, fn):
    f = getattr(lib, fn)
    h, s = pair.a.handle, pair.session.encode()
    mem = ctypes.create_string_buffer(8)
    locals_, remotes, lens = _arrays(3, ctypes.addressof(mem))
    remotes[:] = [pair.base, pair.base + 1, pair.base + 2]
    assert f(h, s, None, remotes, lens, 3) == pdx.PDX_ERR_NULL_ARGUMENT
    assert f(h, s, locals_, None, lens, 3) == pdx.PDX_ERR_NULL_ARGUMENT
    assert f(h, s, locals_, remotes, None, 3) == pdx.PDX_ERR_NULL_ARGUMENT
    assert f(h, None, locals_, remotes, lens, 3) == pdx.PDX_ERR_NULL_ARGUMENT
    assert f(h, s, None, None, None, 0) == pdx.PDX_OK
    locals_[1] = None
    assert f(h, s, locals_, remotes, lens, 3) == pdx.PDX_ERR_NULL_ARGUMENT
    assert "NULL" in _error_text()


# ------------------------------------------------------------------ async

def test_async_write_read(pair):
    srcs, remotes = _scattered(pair, 256, 1024, 2048, 11)
    a = pair.a
    batch = a.submit(pair.session, "write", list(zip(srcs, remotes)))
    assert batch != 0
    s = a.status(batch)
    assert s.total == 256 and s.failed == 0
    assert s.state in (pdx.PDX_TASK_PENDING, pdx.PDX_TASK_COMPLETED)
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
    s = a.status(batch)
    assert (s.state, s.total, s.completed, s.failed) == (pdx.PDX_TASK_COMPLETED, 256, 256, 0)
    assert s.bytes == sum(len(x) for x in srcs)
    for i, src in enumerate(srcs):
        assert a.task_status(batch, i) == (pdx.PDX_TASK_COMPLETED, len(src), pdx.PDX_OK)
    assert a.task_error(batch, 0) == ""
    assert all(pair.view(r, len(x)) == x for x, r in zip(srcs, remotes))
    for task in (256, 2**64 - 1):
        with pytest.raises(pdx.PdxError) as err:
            a.task_status(batch, task)
        assert err.value.status == pdx.PDX_ERR_INDEX_OUT_OF_RANGE
    a.free(batch)
    for call in (lambda: a.status(batch), lambda: a.task_status(batch, 0), lambda: a.task_error(batch, 0),
                 lambda: a.wait(batch, 0), lambda: a.free(batch)):
        with pytest.raises(pdx.PdxError) as err:
            call()
        assert err.value.status == pdx.PDX_ERR_INVALID_HANDLE

    dsts = [bytearray(len(x)) for x in srcs]
    batch = a.submit(pair.session, pdx.PDX_OPCODE_READ, list(zip(dsts, remotes)))
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
    assert [bytes(d) for d in dsts] == srcs
    a.free(batch)

    # An empty batch completes at once.
    batch = a.submit(pair.session, "write", [])
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
    assert a.status(batch).total == 0
    a.free(batch)


def test_async_failed_task(pair):
    a = pair.a
    srcs = [_rand(100, i) for i in range(16)]
    remotes = [pair.base + 600000 + i * 128 for i in range(16)]
    remotes[7] = pair.base + TARGET_LEN
    batch = a.submit(pair.session, "write", list(zip(srcs, remotes)))
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_FAILED
    s = a.status(batch)
    assert (s.state, s.total, s.completed, s.failed) == (pdx.PDX_TASK_FAILED, 16, 15, 1)
    assert a.task_status(batch, 7) == (pdx.PDX_TASK_FAILED, 0, pdx.PDX_ERR_REMOTE_REJECTED)
    assert a.task_status(batch, 6) == (pdx.PDX_TASK_COMPLETED, 100, pdx.PDX_OK)
    text = a.task_error(batch, 7)
    assert "rejected" in text

    # The raw message call: length query, truncation, NUL termination.
    h = a.handle
    need = c_size_t(99)
    assert lib.pdx_task_error_message(h, batch, 7, None, 0, byref(need)) == pdx.PDX_OK
    assert need.value == len(text.encode())
    small = ctypes.create_string_buffer(b"z" * 8, 8)
    assert lib.pdx_task_error_message(h, batch, 7, small, 8, None) == pdx.PDX_OK
    assert small.raw == text.encode()[:7] + b"\0"
    keep = c_size_t(55)
    assert lib.pdx_task_error_message(h, batch, 7, None, 8, byref(keep)) == pdx.PDX_ERR_NULL_ARGUMENT
    assert keep.value == 55
    a.free(batch)


def test_async_raw_bad_ids(pair):
    h = pair.a.handle
    live = pair.a.submit(pair.session, "write", [(b"x", pair.base)])
    pair.a.wait(live, WAIT_MS)
    freed = pair.a.submit(pair.session, "write", [(b"y", pair.base)])
    pair.a.wait(freed, WAIT_MS)
    pair.a.free(freed)
    # Another engine does not know this engine's ids.
    assert lib.pdx_batch_status(pair.b.handle, live, byref(pdx.BatchSummary())) == pdx.PDX_ERR_INVALID_HANDLE
    for bad in (freed, 0, 1, 2**64 - 1, 0xDEADBEEF12345678, live + 1, live + (1 << 32), live & 0xFFFFFFFF):
        if bad == live:
            continue
        summary = pdx.BatchSummary(state=7, total=7, completed=7, failed=7, bytes=7)
        assert lib.pdx_batch_status(h, bad, byref(summary)) == pdx.PDX_ERR_INVALID_HANDLE, hex(bad)
        assert (summary.state, summary.total, summary.bytes) == (7, 7, 7)
        state, nbytes, error = c_int32(7), c_uint64(7), c_int32(7)
        assert lib.pdx_task_status(h, bad, 0, byref(state), byref(nbytes), byref(error)) == pdx.PDX_ERR_INVALID_HANDLE
        assert (state.value, nbytes.value, error.value) == (7, 7, 7)
        buf, length = ctypes.create_string_buffer(b"keep", 8), c_size_t(7)
        assert lib.pdx_task_error_message(h, bad, 0, buf, 8, byref(length)) == pdx.PDX_ERR_INVALID_HANDLE
        assert (buf.value, length.value) == (b"keep", 7)
        assert lib.pdx_batch_wait(h, bad, 10, byref(state)) == pdx.PDX_ERR_INVALID_HANDLE
        assert state.value == 7
        assert lib.pdx_batch_free(h, bad) == pdx.PDX_ERR_INVALID_HANDLE
        assert _error_text()
    assert lib.pdx_batch_status(h, live, None) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_task_status(h, live, 0, None, None, None) == pdx.PDX_OK
    assert lib.pdx_batch_wait(h, live, 0, None) == pdx.PDX_OK
    pair.a.free(live)


def test_submit_raw_errors(pair):
    h, s = pair.a.handle, pair.session.encode()
    mem = ctypes.create_string_buffer(8)
    locals_, remotes, lens = _arrays(2, ctypes.addressof(mem))
    remotes[:] = [pair.base, pair.base + 1]
    W = pdx.PDX_OPCODE_WRITE
    out = c_uint64(0x1234)
    cases = [
        ((h, s, 2, locals_, remotes, lens, 2, None, None), pdx.PDX_ERR_INVALID_ARGUMENT),
        ((h, s, -1, locals_, remotes, lens, 2, None, None), pdx.PDX_ERR_INVALID_ARGUMENT),
        ((h, s, W, locals_, remotes, lens, 2, b"name", None), pdx.PDX_ERR_INVALID_ARGUMENT),
        ((h, s, W, locals_, remotes, lens, 2, None, b"msg"), pdx.PDX_ERR_INVALID_ARGUMENT),
        # (A notification's name or message need not be UTF-8: test_notifications_are_bytes.)
        ((h, None, W, locals_, remotes, lens, 2, None, None), pdx.PDX_ERR_NULL_ARGUMENT),
        ((h, BAD_UTF8, W, locals_, remotes, lens, 2, None, None), pdx.PDX_ERR_INVALID_UTF8),
        ((h, s, W, None, remotes, lens, 2, None, None), pdx.PDX_ERR_NULL_ARGUMENT),
        ((h, s, W, locals_, None, lens, 2, None, None), pdx.PDX_ERR_NULL_ARGUMENT),
        ((h, s, W, locals_, remotes, None, 2, None, None), pdx.PDX_ERR_NULL_ARGUMENT),
    ]
    for args, want in cases:
        assert lib.pdx_batch_submit(*args, byref(out)) == want, args
        assert _error_text()
    assert out.value == 0x1234
    assert lib.pdx_batch_submit(h, s, W, locals_, remotes, lens, 2, None, None, None) == pdx.PDX_ERR_NULL_ARGUMENT
    with pytest.raises(pdx.PdxError) as err:
        pair.a.submit(pair.session, 5, [(b"x", pair.base)])
    assert err.value.status == pdx.PDX_ERR_INVALID_ARGUMENT


def test_pending_batch_against_silent_peer(pair):
    """A listener that never answers keeps a batch in flight: wait times out,
    free is refused; closing it fails the tasks."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    silent = f"127.0.0.1:{lsock.getsockname()[1]}"
    try:
        batch = pair.a.submit(silent, "write", [(b"abc", 0x10000), (b"def", 0x20000)])
        state = c_int32(77)
        assert lib.pdx_batch_wait(pair.a.handle, batch, 50, byref(state)) == pdx.PDX_ERR_TIMEOUT
        assert state.value == 77
        with pytest.raises(pdx.PdxError) as err:
            pair.a.free(batch)
        assert err.value.status == pdx.PDX_ERR_BUSY
        s = pair.a.status(batch)
        assert (s.state, s.total, s.completed, s.failed, s.bytes) == (pdx.PDX_TASK_PENDING, 2, 0, 0, 0)
        assert pair.a.task_status(batch, 1) == (pdx.PDX_TASK_PENDING, 0, pdx.PDX_OK)
        assert pair.a.task_error(batch, 1) == ""
        pair.a.probe(pair.session)  # others are not held up
    finally:
        lsock.close()  # resets the pending connection
    assert pair.a.wait(batch, WAIT_MS) == pdx.PDX_TASK_FAILED
    state, _, error = pair.a.task_status(batch, 0)
    assert state == pdx.PDX_TASK_FAILED and error not in (pdx.PDX_OK, pdx.PDX_ERR_REMOTE_REJECTED)
    assert pair.a.task_error(batch, 0)
    pair.a.free(batch)


def test_cancel_a_batch_against_a_silent_peer(pair):
    """A batch stuck on a peer that never answers is cancelled at once: CANCELED (not FAILED),
    freed, and the engine's other peers are not held up."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    silent = f"127.0.0.1:{lsock.getsockname()[1]}"
    try:
        batch = pair.a.submit(silent, "write", [(b"abc", 0x10000), (b"def", 0x20000)])
        assert pair.a.cancel_task(batch, 1) == pdx.PDX_TASK_CANCELED
        assert pair.a.status(batch).state == pdx.PDX_TASK_PENDING  # task 0 still in flight
        assert pair.a.cancel(batch) == 1
        assert pair.a.wait(batch, 0) == pdx.PDX_TASK_CANCELED
        assert pair.a.task_status(batch, 0) == (pdx.PDX_TASK_CANCELED, 0, pdx.PDX_ERR_CANCELED)
        assert pair.a.task_error(batch, 0) == "canceled by the caller"
        assert pair.a.cancel(batch) == 0
        pair.a.free(batch)
        with pytest.raises(pdx.PdxError) as err:
            pair.a.cancel(batch)
        assert err.value.status == pdx.PDX_ERR_INVALID_HANDLE
        pair.a.probe(pair.session)
    finally:
        lsock.close()
    assert pair.a.stats()["tasks_canceled"] >= 2


def test_cancel_a_read_in_flight_leaves_its_buffer_untouched():
    """A 64 MiB read cancelled on the wire: the buffer, filled right after the call returned,
    keeps the fill (no late byte within a second); the peer serves the next read."""
    n = 64 << 20
    with pdx.Engine("127.0.0.1", "tcp", same_host="off") as a, pdx.Engine("127.0.0.1", "tcp", same_host="off") as b:
        remote = bytearray(bytes(range(128)) * (n // 128))
        local = bytearray(n)
        base = b.register(remote)
        batch = a.submit(b.session_id, "read", [(local, base)])
        while a.status(batch).bytes == 0 and a.status(batch).state == pdx.PDX_TASK_PENDING:
            pass
        assert a.cancel(batch) == 1
        ctypes.memset((ctypes.c_char * n).from_buffer(local), 0xA5, n)
        assert a.status(batch).state == pdx.PDX_TASK_CANCELED
        a.free(batch)
        threading.Event().wait(1.0)
        assert local.count(0xA5) == n, "late bytes in a cancelled read's buffer"
        a.read(b.session_id, local, base)
        assert local == remote
        b.unregister(remote)


# ------------------------------------------------------ notify and probe

def test_notify_and_drain(pair):
    a, b = pair.a, pair.b
    assert b.drain_notifications() == []
    a.notify(b.session_id, "req-1", '{"done": true}')
    a.notify(b.session_id, "req-2", "")
    b.notify(a.session_id, "back", "to a")
    assert b.drain_notifications() == [("req-1", '{"done": true}'), ("req-2", "")]
    assert b.drain_notifications() == []
    assert a.drain_notifications() == [("back", "to a")]

    srcs = [_rand(100, i) for i in range(32)]
    remotes = [pair.base + 500000 + i * 128 for i in range(32)]
    batch = a.submit(pair.session, "write", list(zip(srcs, remotes)), notify=("kv-ready", "room 7"))
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
    a.free(batch)
    assert all(pair.view(r, 100) == x for x, r in zip(srcs, remotes))
    assert b.drain_notifications() == [("kv-ready", "room 7")]

    remotes[3] = pair.base + TARGET_LEN
    batch = a.submit(pair.session, "write", list(zip(srcs, remotes)), notify=("never", "sent"))
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_FAILED
    a.free(batch)
    assert b.drain_notifications() == []


def test_notifications_are_bytes(pair):
    """Names and messages are bytes: every byte value (NUL too) and msgpack
    arrive intact; str is sent as UTF-8; received text comes back as str,
    anything else as bytes (always bytes with as_bytes)."""
    a, b = pair.a, pair.b
    every = bytes(range(256))
    push = b"PUSH_REG:" + bytes([0x82, 0xA4]) + b"name" + bytes([0xA1, 0x41, 0xA4]) + b"mems" + bytes([0x92, 0xCD, 0x10, 0x8B, 0x00])
    a.notify(b.session_id, b"PUSH_REG", push)
    a.notify(b.session_id, every, bytearray(every))
    a.notify(b.session_id, "r\u00e9q", memoryview(b"caf\xc3\xa9"))
    src = _rand(64, 5)
    batch = a.submit(pair.session, "write", [(src, pair.base + 700000)], notify=(b"\x00", every))
    assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
    a.free(batch)
    assert b.drain_notifications() == [("PUSH_REG", push), (every, every), ("r\u00e9q", "caf\u00e9"), ("\x00", every)]
    a.notify(b.session_id, "text", "")
    assert b.drain_notifications(as_bytes=True) == [(b"text", b"")]
    with pytest.raises(TypeError):
        a.notify(b.session_id, 7, "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        a.submit(pair.session, "write", [(src, pair.base + 700000)], notify=("only-name",))  # type: ignore[arg-type]
    # Over the peer's frame limit (MC_HANDSHAKE_MAX_LENGTH, 1 MiB): refused before sending.
    with pytest.raises(pdx.PdxError) as err:
        a.notify(b.session_id, "kv", bytes(8 << 20))
    assert err.value.status == pdx.PDX_ERR_INVALID_ARGUMENT
    assert "handshake frame limit of 1048576 bytes" in str(err.value)
    assert b.drain_notifications() == []


def test_notify_raw_errors(pair):
    h, s = pair.a.handle, pair.session.encode()
    assert lib.pdx_send_notify(h, None, b"n", b"m") == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_send_notify(h, s, None, b"m") == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_send_notify(h, s, b"n", None) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_send_notify(h, BAD_UTF8, b"n", b"m") == pdx.PDX_ERR_INVALID_UTF8
    assert lib.pdx_notifications_drain(h, None) == pdx.PDX_ERR_NULL_ARGUMENT
    # A name or message need not be UTF-8: its bytes go as they are.
    assert lib.pdx_send_notify(h, s, BAD_UTF8, b"m") == pdx.PDX_OK
    assert lib.pdx_send_notify(h, s, b"n", BAD_UTF8) == pdx.PDX_OK
    assert pair.b.drain_notifications() == [(BAD_UTF8, "m"), ("n", BAD_UTF8)]
    none = pdx.NotifyBytes(None, 1, None, 0)
    assert lib.pdx_send_notify_bytes(h, s, byref(none)) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_send_notify_bytes(h, s, None) == pdx.PDX_ERR_NULL_ARGUMENT
    assert pair.b.drain_notifications() == []

    # Notification lists: NULL, garbage, freed, index out of range.
    garbage = ctypes.addressof(ctypes.c_int(0))
    name, msg = c_char_p(b"keep"), c_char_p(b"keep")
    assert lib.pdx_notifications_count(None) == 0
    assert lib.pdx_notifications_count(garbage) == 0
    assert lib.pdx_notification_get(None, 0, byref(name), byref(msg)) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_notification_get(garbage, 0, byref(name), byref(msg)) == pdx.PDX_ERR_INVALID_HANDLE
    pair.a.notify(pair.session, "x", "y")
    lst = c_void_p()
    assert lib.pdx_notifications_drain(pair.b.handle, byref(lst)) == pdx.PDX_OK
    assert lib.pdx_notifications_count(lst) == 1
    for i in (1, 2**64 - 1):
        assert lib.pdx_notification_get(lst, i, byref(name), byref(msg)) == pdx.PDX_ERR_INDEX_OUT_OF_RANGE
    assert (name.value, msg.value) == (b"keep", b"keep")
    assert lib.pdx_notification_get(lst, 0, None, byref(msg)) == pdx.PDX_OK
    assert (name.value, msg.value) == (b"keep", b"y")
    assert lib.pdx_notification_get(lst, 0, None, None) == pdx.PDX_OK
    lib.pdx_notifications_free(lst)
    assert lib.pdx_notifications_count(lst) == 0
    assert lib.pdx_notification_get(lst, 0, byref(name), None) == pdx.PDX_ERR_INVALID_HANDLE
    lib.pdx_notifications_free(lst)  # twice: ignored
    lib.pdx_notifications_free(garbage)
    lib.pdx_notifications_free(None)


def test_probe(pair):
    pair.a.probe(pair.b.session_id)
    pair.b.probe(pair.a.session_id)
    pair.a.probe(pair.a.session_id)
    assert lib.pdx_send_probe(pair.a.handle, None) == pdx.PDX_ERR_NULL_ARGUMENT
    assert lib.pdx_send_probe(pair.a.handle, BAD_UTF8) == pdx.PDX_ERR_INVALID_UTF8


@pytest.mark.parametrize("session", ["127.0.0.1:1", "", "127.0.0.1:99999999", "127.0.0.1:notaport"])
def test_unreachable_or_malformed_sessions(pair, session):
    for call in (lambda: pair.a.probe(session), lambda: pair.a.notify(session, "n", "m"),
                 lambda: pair.a.write(session, b"abc", 0x1000)):
        with pytest.raises(pdx.PdxError) as err:
            call()
        assert err.value.message


# ------------------------------------------------------------ bad handles

def _freed_handle() -> int:
    e = pdx.Engine("127.0.0.1", "tcp")
    h = e.handle.value
    e.close()
    return h


_KEEP_ALIVE = ctypes.create_string_buffer(64)

BAD_HANDLES = {
    "null": None,
    "small": 0x1000,
    "stack-like": ctypes.addressof(ctypes.c_int(0)),
    "foreign-heap": ctypes.addressof(_KEEP_ALIVE),
    "high": 0xDEADBEEF0,
}


@pytest.mark.parametrize("kind", [*BAD_HANDLES, "freed"])
def test_bad_engine_handles(pair, kind):
    h = _freed_handle() if kind == "freed" else BAD_HANDLES[kind]
    want = pdx.PDX_ERR_NULL_ARGUMENT if h is None else pdx.PDX_ERR_INVALID_HANDLE
    s = pair.session.encode()
    mem = ctypes.create_string_buffer(16)
    locals_, remotes, lens = _arrays(1, ctypes.addressof(mem))
    remotes[0] = pair.base

    assert lib.pdx_engine_session_id(h) is None
    assert _error_text()
    assert lib.pdx_engine_rpc_port(h) == 0
    assert lib.pdx_engine_protocol(h) is None
    calls = {
        "register": lambda: lib.pdx_register_memory(h, mem, 16),
        "unregister": lambda: lib.pdx_unregister_memory(h, mem),
        "batch_register": lambda: lib.pdx_batch_register_memory(h, locals_, lens, 1),
        "batch_unregister": lambda: lib.pdx_batch_unregister_memory(h, locals_, 1),
        "write": lambda: lib.pdx_transfer_sync_write(h, s, mem, pair.base, 16),
        "read": lambda: lib.pdx_transfer_sync_read(h, s, mem, pair.base, 16),
        "batch_write": lambda: lib.pdx_batch_transfer_sync_write(h, s, locals_, remotes, lens, 1),
        "batch_read": lambda: lib.pdx_batch_transfer_sync_read(h, s, locals_, remotes, lens, 1),
        "batch_free": lambda: lib.pdx_batch_free(h, 0x100000001),
        "probe": lambda: lib.pdx_send_probe(h, s),
        "notify": lambda: lib.pdx_send_notify(h, s, b"n", b"m"),
    }
    for name, call in calls.items():
        assert call() == want, name
        assert _error_text(), name

    out = c_uint64(0x77)
    assert lib.pdx_batch_submit(h, s, pdx.PDX_OPCODE_WRITE, locals_, remotes, lens, 1, None, None, byref(out)) == want
    assert out.value == 0x77
    summary = pdx.BatchSummary(state=7, total=7, completed=7, failed=7, bytes=7)
    assert lib.pdx_batch_status(h, 0x100000001, byref(summary)) == want
    assert (summary.state, summary.total, summary.completed, summary.failed, summary.bytes) == (7,) * 5
    state, nbytes, error = c_int32(7), c_uint64(7), c_int32(7)
    assert lib.pdx_task_status(h, 0x100000001, 0, byref(state), byref(nbytes), byref(error)) == want
    assert (state.value, nbytes.value, error.value) == (7, 7, 7)
    buf, length = ctypes.create_string_buffer(b"keep", 8), c_size_t(7)
    assert lib.pdx_task_error_message(h, 0x100000001, 0, buf, 8, byref(length)) == want
    assert (buf.value, length.value) == (b"keep", 7)
    assert lib.pdx_batch_wait(h, 0x100000001, 0, byref(state)) == want
    assert state.value == 7
    lst = c_void_p(0x4440)
    assert lib.pdx_notifications_drain(h, byref(lst)) == want
    assert lst.value == 0x4440
    lib.pdx_engine_free(h)  # ignored
    # The good engines are unaffected.
    pair.a.probe(pair.session)


# ---------------------------------------------------------------- threads

def test_threads_share_an_engine(pair):
    errors = []

    def worker(index: int):
        try:
            remote = pair.base + 800000 + index * 8192
            for r in range(30):
                data = _rand(8192 - r * 13, index * 100 + r)
                pair.a.write(pair.session, data, remote)
                back = bytearray(len(data))
                pair.a.read(pair.session, back, remote)
                if bytes(back) != data:
                    errors.append(f"thread {index} round {r}: mismatch")
                batch = pair.a.submit(pair.session, "write", [(data[:100], remote)])
                if pair.a.wait(batch, WAIT_MS) != pdx.PDX_TASK_COMPLETED:
                    errors.append(f"thread {index} round {r}: batch failed")
                pair.a.free(batch)
        except Exception as e:  # reported below
            errors.append(f"thread {index}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_last_error_is_per_thread(pair):
    with pytest.raises(pdx.PdxError):
        pair.a.write(pair.session, b"x", 0)
    main_text = pdx.last_error()
    assert main_text
    seen = []
    t = threading.Thread(target=lambda: seen.append(pdx.last_error()))
    t.start()
    t.join()
    assert seen == [""]
    assert pdx.last_error() == main_text


def test_notify_rejected_when_queue_full(monkeypatch):
    monkeypatch.setenv("PDX_MAX_QUEUED_NOTIFICATIONS", "2")
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        a.notify(b.session_id, "n0", "m")
        a.notify(b.session_id, "n1", "m")
        with pytest.raises(pdx.PdxError) as err:
            a.notify(b.session_id, "n2", "m")
        assert err.value.status == pdx.PDX_ERR_NOTIFY_REJECTED
        # A batch whose notification is refused still completed its transfers.
        mem = bytearray(16)
        remote = b.register(mem)
        batch = a.submit(b.session_id, "write", [(b"data", remote)], notify=("n3", "m"))
        assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
        status, text = a.notify_error(batch)
        assert status == pdx.PDX_ERR_NOTIFY_REJECTED and "rejected" in text
        a.free(batch)
        assert bytes(mem[:4]) == b"data"
        assert b.drain_notifications() == [("n0", "m"), ("n1", "m")]
        a.notify(b.session_id, "after", "drain")
        assert b.drain_notifications() == [("after", "drain")]


def test_notify_byte_budget(monkeypatch):
    monkeypatch.setenv("PDX_NOTIFY_QUEUE_BYTES", "4096")
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        a.notify(b.session_id, "kv", "x" * 3000)
        with pytest.raises(pdx.PdxError) as err:
            a.notify(b.session_id, "kv", "x" * 3000)
        assert err.value.status == pdx.PDX_ERR_NOTIFY_REJECTED
        mem = bytearray(16)
        remote = b.register(mem)
        batch = a.submit(b.session_id, "write", [(b"data", remote)])
        assert a.wait(batch, WAIT_MS) == pdx.PDX_TASK_COMPLETED
        assert a.notify_error(batch) == (pdx.PDX_OK, "")
        a.free(batch)
        assert [len(m) for _, m in b.drain_notifications()] == [3000]


def test_backend_availability():
    assert pdx.backend_available("tcp")
    assert pdx.backend_unavailable_reason("tcp") == ""
    assert not pdx.backend_available("no-such-backend")
    assert pdx.backend_unavailable_reason("no-such-backend")
    # Either way something is asserted: available means no reason, else the
    # reason names the library or the variable that names it.
    reason = pdx.backend_unavailable_reason("mooncake")
    if pdx.backend_available("mooncake"):
        assert reason == ""
    else:
        assert "libtransfer_engine" in reason or "PDX_MOONCAKE_LIB" in reason, reason
