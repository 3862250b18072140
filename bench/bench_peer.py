#!/usr/bin/env python3
"""One benchmark peer: a pdx or Mooncake engine in its own process, driven by JSON lines.

    python3 bench/bench_peer.py pdx        # pdx engine through the C ABI (ctypes)
    python3 bench/bench_peer.py mooncake   # Mooncake wheel engine (MC_FORCE_TCP=1)

The engines, the command loop and the mmap buffers are the interop harness's
(python/tests/interop: peer_common.py, pdx_peer.py, mooncake_peer.py), imported
unchanged. This file adds the commands a benchmark needs:

  bench      run `warmup` + `iters` transfer calls here, in the initiator, and
             return the duration of each call (ns); nothing crosses the pipe
             between calls, so the timings hold only the engine call.
  randomize  fill a buffer with random bytes (os.urandom, fast).
  clear      memset ranges of a buffer to zero.
  crc        crc32 over the concatenation of ranges of a buffer (verification:
             the initiator's source ranges and the target's destination ranges
             must give the same value).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
import zlib
from pathlib import Path

INTEROP = Path(__file__).resolve().parent.parent / "python" / "tests" / "interop"
sys.path.insert(0, str(INTEROP))

import peer_common  # noqa: E402

RANDOM_CHUNK = 16 << 20


class BenchCommands:
    """Mixed into an interop peer class; uses its buffers and engine."""

    def _ranges(self, b, ranges):
        out = []
        for offset, length in ranges:
            offset, length = int(offset), int(length)
            b.check_range(offset, length)
            out.append((offset, length))
        return out

    def cmd_randomize(self, a):
        b = self.buf(a)
        at = 0
        while at < b.size:
            take = min(RANDOM_CHUNK, b.size - at)
            b.view[at : at + take] = os.urandom(take)
            at += take
        return {}

    def cmd_clear(self, a):
        b = self.buf(a)
        for offset, length in self._ranges(b, a["ranges"]):
            ctypes.memset(b.addr + offset, 0, length)
        return {}

    def cmd_crc(self, a):
        b = self.buf(a)
        crc = 0
        for offset, length in self._ranges(b, a["ranges"]):
            crc = zlib.crc32(b.view[offset : offset + length], crc)
        return {"crc32": crc}

    def cmd_bench(self, a):
        """Time `iters` calls (after `warmup` untimed ones); stop early after `max_seconds`.

        entries: [[local_offset, remote_addr, len], ...]; mode "single" sends
        entries[0] with transfer_sync_*, mode "batch" sends all entries with
        one batch_transfer_sync_* call per iteration.
        """
        op, mode = a["op"], a["mode"]
        if op not in ("write", "read") or mode not in ("single", "batch"):
            raise ValueError(f"bad op/mode {op!r}/{mode!r}")
        b = self.buf(a)
        entries = [(int(lo), int(r), int(n)) for lo, r, n in a["entries"]]
        for lo, _, n in entries:
            b.check_range(lo, n)
        if mode == "single" and len(entries) != 1:
            raise ValueError("single mode takes exactly one entry")
        call = self.bench_call(op, mode, a["target"], [b.addr + lo for lo, _, _ in entries],
                               [r for _, r, _ in entries], [n for _, _, n in entries])
        iters, warmup = int(a["iters"]), int(a.get("warmup", 1))
        max_ns = int(float(a.get("max_seconds", 1e9)) * 1e9)
        min_iters = int(a.get("min_iters", 3))
        for _ in range(warmup):
            rc = call()
            if rc != 0:
                return {"rc": int(rc), "stage": "warmup", "times_ns": [], "error": self.bench_error()}
        clock = time.perf_counter_ns
        times = []
        start = clock()
        for i in range(iters):
            t0 = clock()
            rc = call()
            t1 = clock()
            if rc != 0:
                return {"rc": int(rc), "stage": f"iteration {i}", "times_ns": times, "error": self.bench_error()}
            times.append(t1 - t0)
            if t1 - start > max_ns and len(times) >= min_iters:
                break
        return {"rc": 0, "times_ns": times}


def make_pdx():
    import pdx_peer
    from ctypes import c_size_t, c_uint64, c_void_p

    class PdxBenchPeer(BenchCommands, pdx_peer.PdxPeer):
        def bench_error(self):
            return self.engine.last_error()

        def bench_call(self, op, mode, target, locals_, remotes, lens):
            # Everything a call needs is built once; the timed call is the bare C function.
            lib, handle, session = self.engine.lib, self.engine.handle, target.encode()
            if mode == "single":
                fn = lib.pdx_transfer_sync_write if op == "write" else lib.pdx_transfer_sync_read
                local, remote, length = locals_[0], remotes[0], lens[0]
                return lambda: fn(handle, session, local, remote, length)
            fn = lib.pdx_batch_transfer_sync_write if op == "write" else lib.pdx_batch_transfer_sync_read
            n = len(locals_)
            la, ra, na = (c_void_p * n)(*locals_), (c_uint64 * n)(*remotes), (c_size_t * n)(*lens)
            return lambda: fn(handle, session, la, ra, na, n)

    return PdxBenchPeer()


def make_mooncake():
    import mooncake_peer

    class MooncakeBenchPeer(BenchCommands, mooncake_peer.MooncakePeer):
        def bench_error(self):
            return ""

        def bench_call(self, op, mode, target, locals_, remotes, lens):
            e = self.engine
            if mode == "single":
                fn = e.transfer_sync_write if op == "write" else e.transfer_sync_read
                local, remote, length = locals_[0], remotes[0], lens[0]
                return lambda: fn(target, local, remote, length)
            fn = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
            return lambda: fn(target, locals_, remotes, lens)

    return MooncakeBenchPeer()


if __name__ == "__main__":
    kinds = {"pdx": make_pdx, "mooncake": make_mooncake}
    if len(sys.argv) != 2 or sys.argv[1] not in kinds:
        sys.exit("usage: bench_peer.py pdx|mooncake")
    sys.exit(peer_common.run(kinds[sys.argv[1]]))
