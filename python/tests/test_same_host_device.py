"""Device memory over the same-host link (CUDA IPC), between two processes.

The target engine runs in a process of its own (same_host_device_peer.py,
driven over a pipe); this process is the initiator. Both load the CUDA
driver stand-in (c_tests/cuda_double) through PDX_CUDA_LIB, whose IPC maps
one process's device memory into the other. The stand-in's counters, read
in each process, show which copies ran: device to device on the target,
and no staging (no host<->device copy) on either side.
"""

import ctypes
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pdx

from test_cuda import KiB, MiB, cuda  # noqa: F401  (`cuda`: the stand-in, a fixture of this module too)

HERE = Path(__file__).resolve().parent


class Peer:
    """The target process."""

    def __init__(self, lib: str):
        env = dict(os.environ, PDX_CUDA_LIB=lib, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "same_host_device_peer.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.session = self._answer()["session"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer process ended (exit {self.proc.wait(timeout=10)})")
        return json.loads(line)

    def __call__(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self):
        try:
            self("quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def peer(cuda):
    p = Peer(cuda.path)
    yield p
    p.close()


@pytest.fixture
def initiator(cuda):
    with pdx.Engine("127.0.0.1", "tcp") as engine:
        yield engine


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def delta(after, before, *names) -> dict:
    return {n: after[n] - before[n] for n in names}


def own_stats(cuda) -> dict:
    s = cuda.stats()
    return {n: getattr(s, n) for n, _ in s._fields_ if n != "copies_by_device"}


COPIES = ("h2d_copies", "d2h_copies", "d2d_copies")


@pytest.mark.parametrize("size", [1, 4 * KiB + 1, 8 * MiB + 3])
def test_device_to_device_both_ways_is_one_copy_on_the_target(cuda, peer, initiator, size):
    remote = peer("alloc", dev=1, n=size)["addr"]
    local = cuda.alloc(0, 2 * size)
    initiator.register_at(local, 2 * size, "cuda:0")
    want = random.Random(size).randbytes(size)
    cuda.put(0, local, want)
    theirs, ours = peer("stats"), own_stats(cuda)
    initiator.write(peer.session, local, remote, size)
    assert peer("digest", area=remote, n=size)["sha"] == sha(want)
    peer("fill", area=remote, n=size, seed=size + 1)
    initiator.read(peer.session, local + size, remote, size)
    t, o = delta(peer("stats"), theirs, *COPIES), delta(own_stats(cuda), ours, *COPIES)
    # The peer's own digest and fill are one d2h and one h2d.
    assert t["h2d_copies"] == 1 and t["d2h_copies"] == 1 and t["d2d_copies"] >= 2, t
    assert o == {"h2d_copies": 0, "d2h_copies": 0, "d2d_copies": 0}, o
    assert cuda.get(0, local + size, size) == random.Random(size + 1).randbytes(size)
    info = initiator.peer_info(peer.session)
    assert info["path"] == "same-host" and "CUDA IPC" in info["reason"], info
    assert info["same_host_bytes_written"] == size and info["same_host_bytes_read"] == size, info
    initiator.unregister(local)
    cuda.free(local)


def test_scattered_pages_device_to_device(cuda, peer, initiator):
    pages, page, n = 4096, 4 * KiB, 2048
    remote = peer("alloc", dev=2, n=pages * page)["addr"]
    local = cuda.alloc(0, pages * page)
    initiator.register_at(local, pages * page, "cuda:0")
    image = random.Random(5).randbytes(pages * page)
    cuda.put(0, local, image)
    peer("fill", area=remote, n=pages * page, seed=6)
    order = random.Random(9).sample(range(pages), 2 * n)
    entries = [(local + order[i] * page, remote + order[n + i] * page, page) for i in range(n)]
    theirs = peer("stats")
    initiator.batch_write(peer.session, entries)
    t = delta(peer("stats"), theirs, *COPIES)
    assert t == {"h2d_copies": 0, "d2h_copies": 0, "d2d_copies": n}, t
    expected = bytearray(random.Random(6).randbytes(pages * page))
    for i in range(n):
        s, d = order[i] * page, order[n + i] * page
        expected[d:d + page] = image[s:s + page]
    assert peer("digest", area=remote, n=pages * page)["sha"] == sha(bytes(expected))
    # And back, scattered the other way.
    back = [(local + order[n + i] * page, remote + order[i] * page, page) for i in range(n)]
    initiator.batch_read(peer.session, back)
    got = cuda.get(0, local, pages * page)
    for i in range(n):
        s, d = order[i] * page, order[n + i] * page
        assert got[d:d + page] == expected[s:s + page], f"page {i}"
    initiator.unregister(local)
    cuda.free(local)


@pytest.mark.parametrize("size", [1, 64 * KiB + 1])
def test_host_and_device_across_the_processes(cuda, peer, initiator, size):
    # Initiator device memory -> the peer's host memory: one device-to-host
    # copy there (on a device of its own), and back host-to-device.
    peer("alloc", dev=1, n=4096)  # the peer holds a device region
    remote_host = peer("alloc", n=size)["addr"]
    local = cuda.alloc(0, 2 * size)
    initiator.register_at(local, 2 * size, "cuda:0")
    want = random.Random(size + 7).randbytes(size)
    cuda.put(0, local, want)
    theirs = peer("stats")
    initiator.write(peer.session, local, remote_host, size)
    initiator.read(peer.session, local + size, remote_host, size)
    t = delta(peer("stats"), theirs, *COPIES)
    assert t == {"h2d_copies": 1, "d2h_copies": 1, "d2d_copies": 0}, t
    assert peer("digest", area=remote_host, n=size)["sha"] == sha(want)
    assert cuda.get(0, local + size, size) == want
    # Initiator host memory -> the peer's device memory (the cross-process
    # copy of the host path, then the peer's own staging).
    remote_dev = peer("alloc", dev=3, n=size)["addr"]
    buf = bytearray(random.Random(size + 8).randbytes(size))
    initiator.register_at(buf, location="cpu:0")
    initiator.write(peer.session, buf, remote_dev, size)
    assert peer("digest", area=remote_dev, n=size)["sha"] == sha(bytes(buf))
    peer("fill", area=remote_dev, n=size, seed=size + 9)
    initiator.read(peer.session, buf, remote_dev, size)
    assert bytes(buf) == random.Random(size + 9).randbytes(size)
    assert initiator.peer_info(peer.session)["path"] == "same-host"
    initiator.unregister(buf)
    initiator.unregister(local)
    cuda.free(local)


def test_an_ipc_failure_falls_back_to_staging_and_the_transfer_succeeds(cuda, peer, initiator):
    size = 4 * KiB + 1
    remote = peer("alloc", dev=1, n=size)["addr"]
    local = cuda.alloc(0, size)
    initiator.register_at(local, size, "cuda:0")
    want = random.Random(77).randbytes(size)
    cuda.put(0, local, want)
    # This initiator's connections are new: the peer opens its handle anew,
    # and that open fails (CUDA_ERROR_MAP_FAILED).
    peer("inject", what="cuIpcOpenMemHandle", after=0, count=1, code=205)
    theirs = peer("stats")
    initiator.write(peer.session, local, remote, size)
    assert peer("digest", area=remote, n=size)["sha"] == sha(want)
    t = delta(peer("stats"), theirs, *COPIES)
    # Staged: the peer's host-to-device copy (and its digest's d2h).
    assert t["h2d_copies"] >= 1 and t["d2d_copies"] == 0, t
    info = initiator.peer_info(peer.session)
    assert info["path"] == "same-host", info
    assert "CUDA IPC failed" in info["reason"] and "staged" in info["reason"], info
    # Later transfers stay staged, and still right.
    peer("fill", area=remote, n=size, seed=78)
    initiator.read(peer.session, local, remote, size)
    assert cuda.get(0, local, size) == random.Random(78).randbytes(size)
    initiator.unregister(local)
    cuda.free(local)


def test_two_engines_of_one_process_stage_device_memory_with_the_reason(cuda):
    with pdx.Engine("127.0.0.1", "tcp") as target, pdx.Engine("127.0.0.1", "tcp") as initiator:
        size = 64 * KiB + 3
        src, dst = cuda.alloc(0, size), cuda.alloc(1, size)
        initiator.register_at(src, size, "cuda:0")
        target.register_at(dst, size, "cuda:1")
        want = random.Random(3).randbytes(size)
        cuda.put(0, src, want)
        initiator.write(target.session_id, src, dst, size)
        assert cuda.get(1, dst, size) == want
        info = initiator.peer_info(target.session_id)
        assert info["path"] == "same-host" and "one process" in info["reason"], info
        initiator.unregister(src)
        target.unregister(dst)
        cuda.free(src)
        cuda.free(dst)


def test_unregistering_device_memory_closes_the_peers_mappings_of_it(cuda, peer, initiator):
    remote = peer("alloc", dev=1, n=MiB)["addr"]
    for round_ in range(2):
        local = cuda.alloc(0, MiB)
        initiator.register_at(local, MiB, "cuda:0")
        want = random.Random(round_).randbytes(MiB)
        cuda.put(0, local, want)
        initiator.write(peer.session, local, remote, MiB)
        assert peer("digest", area=remote, n=MiB)["sha"] == sha(want)
        assert peer("stats")["ipc_mapped"] >= 1
        # The connections that let the peer map it close with the
        # unregistration, and the peer's mappings with them.
        initiator.unregister(local)
        deadline = time.monotonic() + 10
        while peer("stats")["ipc_mapped"] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert peer("stats")["ipc_mapped"] == 0
        cuda.free(local)
