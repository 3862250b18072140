"""Device (CUDA) memory through the C ABI, from Python.

Against the driver stand-in (c_tests/cuda_double, built by CMake into
build/, or compiled here with cc when absent), loaded by libpdx through
PDX_CUDA_LIB; the same process loads it too, to allocate "device memory"
(which the CPU cannot touch) and to read the stand-in's counters. The
real-GPU variant at the end runs when libcuda.so.1 loads with a device and
SKIPs visibly otherwise.
"""

import ctypes
import hashlib
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pdx

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "c_tests" / "cuda_double" / "cuda_double.c"
KiB, MiB = 1 << 10, 1 << 20


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "inits", "contexts_live", "contexts_retained_mask", "retains", "pinned_bytes", "pinned_peak",
        "pinned_allocs", "h2d_copies", "d2h_copies", "copies_no_context", "copies_wrong_context",
        "copies_pageable", "syncs", "streams_live", "device_bytes")] + [("copies_by_device", ctypes.c_uint64 * 8)] + [
        (n, ctypes.c_uint64) for n in (
            "event_waits", "d2d_copies", "ipc_exports", "ipc_opens", "ipc_closes", "ipc_mapped")]


class Driver:
    """The few driver calls a test needs to own device memory."""

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        L.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        L.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        L.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        L.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        L.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        L.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.ok(L.cuInit(0), "cuInit")
        n = ctypes.c_int()
        self.ok(L.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        self.devices = n.value
        self.is_double = hasattr(L, "cuda_double_stats")
        self.own = []

    @staticmethod
    def ok(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA error {rc}")

    def use(self, dev):
        ctx = ctypes.c_void_p()
        self.ok(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ok(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def alloc(self, dev, n):
        self.use(dev)
        p = ctypes.c_uint64()
        self.ok(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc_v2")
        self.own.append(p.value)
        return p.value

    def free(self, p):
        self.ok(self.lib.cuMemFree_v2(p), "cuMemFree_v2")
        self.own.remove(p)

    def put(self, dev, p, data: bytes):
        self.use(dev)
        buf = ctypes.create_string_buffer(data, len(data))
        self.ok(self.lib.cuMemcpyHtoDAsync_v2(p, buf, len(data), None), "cuMemcpyHtoDAsync_v2")
        self.ok(self.lib.cuStreamSynchronize(None), "cuStreamSynchronize")

    def get(self, dev, p, n) -> bytes:
        self.use(dev)
        buf = ctypes.create_string_buffer(n)
        self.ok(self.lib.cuMemcpyDtoHAsync_v2(buf, p, n, None), "cuMemcpyDtoHAsync_v2")
        self.ok(self.lib.cuStreamSynchronize(None), "cuStreamSynchronize")
        return buf.raw

    def stats(self) -> Stats:
        s = Stats()
        self.lib.cuda_double_stats(ctypes.byref(s))
        return s


def _double_path(tmp_dir: Path) -> str:
    built = ROOT / "build" / "libcuda_double.so"
    if built.exists() and built.stat().st_mtime >= SOURCE.stat().st_mtime:
        return str(built)
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the CUDA driver stand-in (and no build/libcuda_double.so)")
    out = tmp_dir / "libcuda_double.so"
    subprocess.run([cc, "-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", str(out), str(SOURCE),
                    "-lpthread"], check=True)
    return str(out)


@pytest.fixture(scope="module")
def cuda(tmp_path_factory):
    path = _double_path(tmp_path_factory.mktemp("cuda_double"))
    old = os.environ.get("PDX_CUDA_LIB")
    os.environ["PDX_CUDA_LIB"] = path
    yield Driver(path)
    if old is None:
        os.environ.pop("PDX_CUDA_LIB", None)
    else:
        os.environ["PDX_CUDA_LIB"] = old


@pytest.fixture(scope="module")
def engines(cuda):
    with pdx.Engine("127.0.0.1", "tcp") as target, pdx.Engine("127.0.0.1", "tcp") as initiator:
        yield target, initiator


def test_no_driver_refuses_device_memory_at_registration(monkeypatch):
    monkeypatch.setenv("PDX_CUDA_LIB", "/nonexistent/libcuda.so.1")
    with pdx.Engine("127.0.0.1", "tcp") as e:
        buf = bytearray(8192)
        with pytest.raises(pdx.PdxError) as err:
            e.register_at(buf, location="cuda:0")
        assert err.value.status == pdx.PDX_ERR_DEVICE_UNAVAILABLE
        assert "cannot register 0x" in err.value.message and "as cuda:0" in err.value.message
        assert "/nonexistent/libcuda.so.1" in err.value.message
        # Without a driver, detection says host memory, and it works as before.
        e.register_at(buf, location="*")
        with pytest.raises(pdx.PdxError) as err:
            e.register_at(bytearray(16), location="tpu:0")
        assert err.value.status == pdx.PDX_ERR_INVALID_ARGUMENT


@pytest.mark.parametrize("local_dev,remote_dev", [(0, 3), (None, 3), (0, None)], ids=["cuda0-cuda3", "host-cuda3",
                                                                                     "cuda0-host"])
@pytest.mark.parametrize("size", [1, 64 * KiB + 1, 4 * MiB + 3])
def test_round_trip(cuda, engines, local_dev, remote_dev, size):
    target, initiator = engines
    want = random.Random(size).randbytes(size)

    def make(engine, dev, n):
        if dev is None:
            buf = bytearray(n)
            return buf, engine.register_at(buf, location="cpu:0")
        p = cuda.alloc(dev, n)
        engine.register_at(p, n, f"cuda:{dev}")
        return None, p

    lbuf, laddr = make(initiator, local_dev, 2 * size)
    rbuf, raddr = make(target, remote_dev, size)
    try:
        if lbuf is None:
            cuda.put(local_dev, laddr, want)
        else:
            lbuf[:size] = want
        initiator.write(target.session_id, laddr, raddr, size)
        got = bytes(rbuf) if rbuf is not None else cuda.get(remote_dev, raddr, size)
        assert got == want
        initiator.read(target.session_id, laddr + size, raddr, size)
        back = bytes(lbuf[size:]) if lbuf is not None else cuda.get(local_dev, laddr + size, size)
        assert back == want
    finally:
        for engine, buf, addr in ((initiator, lbuf, laddr), (target, rbuf, raddr)):
            engine.unregister(addr)
            if buf is None:
                cuda.free(addr)


def test_a_cancelled_staged_read_copies_nothing_to_the_device_after(cuda):
    """A read into device memory over TCP goes through pinned buffers, each copied to the
    device: cancelled on the wire, no copy reaches the device memory once the cancel
    returned (the memory, filled right after, keeps the fill; the stand-in counts no
    copy but the test's own)."""
    n = 64 * MiB
    with pdx.Engine("127.0.0.1", "tcp", same_host="off") as target, pdx.Engine(
        "127.0.0.1", "tcp", same_host="off"
    ) as initiator:
        remote = bytearray(bytes(range(128)) * (n // 128))
        base = target.register_at(remote, location="cpu:0")
        dev = cuda.alloc(0, n)
        initiator.register_at(dev, n, "cuda:0")
        try:
            batch = initiator.submit(target.session_id, "read", [(dev, base, n)])
            while initiator.status(batch).bytes == 0 and initiator.status(batch).state == pdx.PDX_TASK_PENDING:
                pass
            assert initiator.cancel(batch) == 1
            copies = cuda.stats().h2d_copies
            fill = b"\xa5" * n
            cuda.put(0, dev, fill)
            time.sleep(1.0)
            assert cuda.stats().h2d_copies == copies + 1, "a device copy after the cancel returned"
            assert cuda.get(0, dev, n) == fill, "late bytes in a cancelled read's device memory"
            assert initiator.status(batch).state == pdx.PDX_TASK_CANCELED
            initiator.free(batch)
            initiator.read(target.session_id, dev, base, n)
            assert cuda.get(0, dev, n) == bytes(remote), "the next staged read lands whole"
        finally:
            initiator.unregister(dev)
            cuda.free(dev)
            target.unregister(remote)


def test_scattered_pages_and_accounting(cuda, engines):
    target, initiator = engines
    pages, page, n = 4096, 4 * KiB, 2048
    src = cuda.alloc(0, pages * page)
    dst = cuda.alloc(3, pages * page)
    initiator.register_at(src, pages * page, "cuda:0")
    target.register_at(dst, pages * page, "*")  # detected: device memory on cuda:3
    image = random.Random(5).randbytes(pages * page)
    cuda.put(0, src, image)
    before = cuda.stats()
    order = random.Random(9).sample(range(pages), 2 * n)
    entries = [(src + order[i] * page, dst + order[n + i] * page, page) for i in range(n)]
    initiator.batch_write(target.session_id, entries)
    got = cuda.get(3, dst, pages * page)
    for i in range(n):
        s, d = order[i] * page, order[n + i] * page
        assert got[d:d + page] == image[s:s + page], f"page {i}"
    after = cuda.stats()
    assert after.copies_wrong_context == before.copies_wrong_context == 0
    assert after.copies_no_context == 0
    assert after.copies_pageable - before.copies_pageable == 1  # only this test's own cuda.get
    # Only devices 0 and 3 were used (counted from `before`: other tests of
    # this process may have used the others).
    assert [after.copies_by_device[d] - before.copies_by_device[d] for d in (1, 2)] == [0, 0]
    # Devices 0 and 3 have live contexts (other tests' helpers may hold more).
    assert after.contexts_retained_mask & 0b1001 == 0b1001 and after.contexts_live >= 2
    for engine, addr in ((initiator, src), (target, dst)):
        engine.unregister(addr)
        cuda.free(addr)


@pytest.fixture(params=["v2", "v1"])
def mooncake(request, cuda):
    pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")
    interop = str(Path(__file__).resolve().parent / "interop")
    if interop not in sys.path:
        sys.path.insert(0, interop)
    from peer_client import Peer
    env = {"MC_TCP_PROTO": "1"} if request.param == "v1" else {}
    with Peer("mooncake", env, name=f"mc-cuda-{request.param}") as m:
        yield m, request.param


def test_mooncake_initiator_into_and_out_of_a_pdx_device_region(cuda, mooncake, monkeypatch):
    """The wire does not change: Mooncake writes and reads host bytes, pdx stages them."""
    peer, proto = mooncake
    size = 16 * MiB + 5
    with pdx.Engine("127.0.0.1", "tcp") as target:
        dptr = cuda.alloc(3, size)
        target.register_at(dptr, size, "cuda:3")
        buf = peer.alloc(2 * size)
        peer.fill(buf, 0, size, seed=31)
        r = peer.transfer("write", target.session_id, buf, 0, dptr, size)
        assert r["rc"] == 0, r
        want = peer.sha256(buf, 0, size)
        # A Mooncake v1 initiator reports a write done once it is sent (v1 has
        # no acknowledgement): wait for the target to have staged it.
        deadline = time.monotonic() + (10 if proto == "v1" else 0)
        while True:
            got = hashlib.sha256(cuda.get(3, dptr, size)).hexdigest()
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert got == want
        # Read: fresh bytes on the device, fetched into the other half.
        fresh = random.Random(proto).randbytes(size)
        cuda.put(3, dptr, fresh)
        r = peer.transfer("read", target.session_id, buf, size, dptr, size)
        assert r["rc"] == 0, r
        assert peer.sha256(buf, size, size) == hashlib.sha256(fresh).hexdigest()
        target.unregister(dptr)
        cuda.free(dptr)


def test_pdx_initiator_from_and_into_device_memory_against_a_mooncake_target(cuda, mooncake):
    """The other direction: pdx stages its own device memory towards a Mooncake target."""
    peer, proto = mooncake
    size = 8 * MiB + 3
    with pdx.Engine("127.0.0.1", "tcp") as initiator:
        dptr = cuda.alloc(0, 2 * size)
        initiator.register_at(dptr, 2 * size, "*")
        want = random.Random(size).randbytes(size)
        cuda.put(0, dptr, want)
        buf = peer.alloc(size)
        initiator.write(peer.session, dptr, buf.addr, size)
        assert peer.sha256(buf, 0, size) == hashlib.sha256(want).hexdigest()
        peer.fill(buf, 0, size, seed=77)
        initiator.read(peer.session, dptr + size, buf.addr, size)
        assert hashlib.sha256(cuda.get(0, dptr + size, size)).hexdigest() == peer.sha256(buf, 0, size)
        initiator.unregister(dptr)
        cuda.free(dptr)


def test_real_gpu_round_trip(monkeypatch):
    """The same round trip through the real driver (cuMemAlloc_v2); SKIP without a GPU."""
    path = os.environ.get("PDX_TEST_CUDA_REAL_LIB", "libcuda.so.1")
    try:
        drv = Driver(path)
    except (OSError, RuntimeError, AttributeError) as exc:
        pytest.skip(f"no NVIDIA GPU here ({path}: {exc})")
    if drv.devices < 1:
        pytest.skip(f"no NVIDIA GPU here ({path} reports no device)")
    monkeypatch.setenv("PDX_CUDA_LIB", path)
    hi = min(3, drv.devices - 1)
    with pdx.Engine("127.0.0.1", "tcp") as target, pdx.Engine("127.0.0.1", "tcp") as initiator:
        for size in (1, 64 * KiB + 1, 64 * MiB + 3):
            want = os.urandom(size)
            src, dst = drv.alloc(0, 2 * size), drv.alloc(hi, size)
            initiator.register_at(src, 2 * size, "*")
            target.register_at(dst, size, f"cuda:{hi}")
            drv.put(0, src, want)
            initiator.write(target.session_id, src, dst, size)
            assert drv.get(hi, dst, size) == want
            initiator.read(target.session_id, src + size, dst, size)
            assert drv.get(0, src + size, size) == want
            initiator.unregister(src)
            target.unregister(dst)
            drv.free(src)
            drv.free(dst)


def test_capabilities_report_the_driver(cuda, monkeypatch):
    mem = {m["kind"]: m for m in pdx.capabilities()["memory"]}
    assert mem["cuda"]["available"] is True and mem["cuda"]["devices"] >= 1, mem
    assert mem["cuda"]["library"] == os.environ["PDX_CUDA_LIB"]
    monkeypatch.setenv("PDX_CUDA_LIB", "/nonexistent/libcuda.so.1")
    mem = {m["kind"]: m for m in pdx.capabilities()["memory"]}
    assert mem["cuda"]["available"] is False and "/nonexistent/libcuda.so.1" in mem["cuda"]["reason"]


def test_dropin_registers_device_memory_at_its_location(cuda):
    from pdx.mooncake import TransferEngine

    target, initiator = TransferEngine(), TransferEngine()
    for e in (target, initiator):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dev = cuda.alloc(0, 1 << 20)
    host = ctypes.create_string_buffer(b"\x5a" * (1 << 20), 1 << 20)
    assert target.register_memory(dev, 1 << 20, "cuda:0") == 0
    assert target.register_memory(dev, 1 << 20, "cuda:0") == -7
    assert target.unregister_memory(dev) == 0
    assert target.batch_register_memory([dev], [1 << 20], "cuda:0") == 0
    assert initiator.register_memory(ctypes.addressof(host), 1 << 20, "cpu:0") == 0
    session = f"127.0.0.1:{target.get_rpc_port()}"
    assert initiator.transfer_sync_write(session, ctypes.addressof(host), dev, 1 << 20) == 0
    assert cuda.get(0, dev, 1 << 20) == host.raw
    assert target.register_memory(dev + (2 << 20), 4096, "cuda:9") == -1  # no such device
    for e in (initiator, target):
        e.unregister_memory(dev if e is target else ctypes.addressof(host))
    cuda.free(dev)
