#!/usr/bin/env python3
"""Mixed clusters at the C-API level: the four pairings of a Mooncake and a
pdx node side by side, in one run, rounds alternating, each pairing in fresh
processes (a target process and an initiator process per figure).

  Mooncake -> Mooncake, Mooncake -> pdx, pdx -> Mooncake, pdx -> pdx

A pdx node is pdx's Mooncake C API (`libtransfer_engine.so` from
`mooncake-c`, through ctypes, driven as NIXL's Mooncake plugin drives it:
allocateBatchID, submitTransfer, getTransferStatus on every task each poll,
freeBatchID; each poll reads the tasks from the first one not yet seen
completed, so that the figure is not Python's ctypes overhead). A Mooncake node is the PyPI wheel's `TransferEngine` (it has
no C library): batch_transfer_async_*, then transfer_check_status each poll
(the wheel reads its tasks' states in C++). Both poll the same way: every
100 us (`--poll sleep`) or spinning (`--poll spin`). pdx -> pdx runs over
TCP (PDX_SAME_HOST=off), as a pdx pair on two hosts would.

Usage:
  scripts/bench-mixed.py [--lib DIR] [--rounds 3] [--iters 20] [--poll sleep|spin]
                         [--configs write:256:64K,read:256:64K,write:64:1M,read:64:1M]
--lib: the directory of libtransfer_engine.so (default target/release).
Prints, per configuration, each pairing's median GB/s over the rounds and
its ratio to Mooncake -> Mooncake, and the load average before and after.
"""
import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import time

REGION = 64 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


class TransferRequest(ctypes.Structure):
    _fields_ = [("opcode", ctypes.c_int), ("source", ctypes.c_void_p), ("target_id", ctypes.c_int32),
                ("file_id", ctypes.c_uint32), ("target_offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class TransferStatus(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("transferred_bytes", ctypes.c_uint64)]


STATUS_COMPLETED, STATUS_FAILED = 4, 5


def pdx_lib(libdir):
    lib = ctypes.CDLL(os.path.join(libdir, "libtransfer_engine.so"))
    E = ctypes.c_void_p
    sig = {
        "createTransferEngine": (E, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]),
        "getLocalIpAndPort": (ctypes.c_int, [E, ctypes.c_char_p, ctypes.c_size_t]),
        "registerLocalMemory": (ctypes.c_int, [E, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int]),
        "openSegment": (ctypes.c_int32, [E, ctypes.c_char_p]),
        "allocateBatchID": (ctypes.c_uint64, [E, ctypes.c_size_t]),
        "submitTransfer": (ctypes.c_int, [E, ctypes.c_uint64, ctypes.POINTER(TransferRequest), ctypes.c_size_t]),
        "getTransferStatus": (ctypes.c_int, [E, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(TransferStatus)]),
        "freeBatchID": (ctypes.c_int, [E, ctypes.c_uint64]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def region():
    buf = mmap.mmap(-1, REGION)
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


def mooncake_engine(addr):
    os.environ["MC_FORCE_TCP"] = "1"
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.register_memory(addr, REGION) == 0
    return e, f"127.0.0.1:{e.get_rpc_port()}"


def pdx_engine(libdir, addr):
    lib = pdx_lib(libdir)
    e = lib.createTransferEngine(b"P2PHANDSHAKE", b"127.0.0.1", b"", 0, 1)
    assert e, "createTransferEngine failed"
    assert lib.registerLocalMemory(e, addr, REGION, b"*", 1) == 0
    name = ctypes.create_string_buffer(64)
    assert lib.getLocalIpAndPort(e, name, 64) == 0
    return lib, e, name.value.decode()


def target(kind, libdir):
    buf, addr = region()
    if kind == "pdx":
        keep = pdx_engine(libdir, addr)
        name = keep[2]
    else:
        keep = mooncake_engine(addr)
        name = keep[1]
    print(name, addr, flush=True)
    sys.stdin.read()
    del keep, buf


def wait(poll):
    if poll == "sleep":
        time.sleep(100e-6)


def initiate(kind, libdir, session, raddr, op, n, each, iters, poll):
    buf, addr = region()
    srcs = [addr + i * each for i in range(n)]
    dsts = [raddr + i * each for i in range(n)]
    if kind == "pdx":
        lib, e, _ = pdx_engine(libdir, addr)
        seg = lib.openSegment(e, session.encode())
        assert seg >= 0, "openSegment failed"
        opcode = 0 if op == "read" else 1
        reqs = (TransferRequest * n)(*[TransferRequest(opcode, s, seg, 0, d, each) for s, d in zip(srcs, dsts)])
        st = TransferStatus()

        def one():
            b = lib.allocateBatchID(e, n)
            assert lib.submitTransfer(e, b, reqs, n) == 0
            t = 0
            while t < n:
                # Tasks complete about in order: each poll reads from the
                # first one not seen completed (a C poller such as NIXL's
                # reads them all; from Python that would time ctypes).
                while t < n:
                    assert lib.getTransferStatus(e, b, t, ctypes.byref(st)) == 0
                    if st.status == STATUS_FAILED:
                        raise SystemExit(f"task {t} failed")
                    if st.status != STATUS_COMPLETED:
                        break
                    t += 1
                if t < n:
                    wait(poll)
            assert lib.freeBatchID(e, b) == 0
    else:
        e, _ = mooncake_engine(addr)
        submit = e.batch_transfer_async_read if op == "read" else e.batch_transfer_async_write

        def one():
            b = submit(session, srcs, dsts, [each] * n)
            assert b != 0, "batch_transfer_async failed"
            while True:
                s = e.transfer_check_status(b)
                if s == 1:
                    break
                if s < 0:
                    raise SystemExit("transfer failed")
                wait(poll)
    one()  # connections and descriptors
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    print(n * each / statistics.median(times) / 1e9, flush=True)


def figure(tkind, ikind, libdir, op, n, each, iters, poll):
    env = dict(os.environ, PDX_SAME_HOST="off", GLOG_minloglevel="2")
    me = os.path.abspath(__file__)
    t = subprocess.Popen([sys.executable, me, "--role", "target", "--kind", tkind, "--lib", libdir],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        session, raddr = t.stdout.readline().split()
        out = subprocess.run([sys.executable, me, "--role", "init", "--kind", ikind, "--lib", libdir, "--session", session,
                              "--raddr", raddr, "--op", op, "--n", str(n), "--each", str(each), "--iters", str(iters),
                              "--poll", poll], env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"{ikind} -> {tkind} {op}: {out.stderr.strip()[-400:]}")
        return float(out.stdout.split()[-1])
    finally:
        t.stdin.close()
        t.wait(timeout=30)


def size(text):
    return int(text[:-1]) << {"K": 10, "M": 20}[text[-1]] if text[-1] in "KM" else int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", default="driver", choices=["driver", "target", "init"])
    p.add_argument("--kind", choices=["pdx", "mooncake"])
    p.add_argument("--lib", default=os.path.join(HERE, "..", "target", "release"))
    p.add_argument("--session")
    p.add_argument("--raddr", type=int)
    p.add_argument("--op")
    p.add_argument("--n", type=int)
    p.add_argument("--each", type=int)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--poll", default="sleep", choices=["sleep", "spin"])
    p.add_argument("--configs", default="write:256:64K,read:256:64K,write:64:1M,read:64:1M")
    a = p.parse_args()
    lib = os.path.abspath(a.lib)
    if a.role == "target":
        return target(a.kind, lib)
    if a.role == "init":
        return initiate(a.kind, lib, a.session, a.raddr, a.op, a.n, a.each, a.iters, a.poll)
    pairings = [("mooncake", "mooncake"), ("mooncake", "pdx"), ("pdx", "mooncake"), ("pdx", "pdx")]
    print(f"load average before: {os.getloadavg()[0]:.2f}; poller: {a.poll}; {a.rounds} rounds x {a.iters} batches")
    for config in a.configs.split(","):
        op, n, each = config.split(":")
        n, each = int(n), size(each)
        got = {pair: [] for pair in pairings}
        for r in range(a.rounds):
            order = pairings if r % 2 == 0 else pairings[::-1]
            for ikind, tkind in order:
                got[(ikind, tkind)].append(figure(tkind, ikind, lib, op, n, each, a.iters, a.poll))
        base = statistics.median(got[("mooncake", "mooncake")])
        print(f"{op} {n} x {each >> 10} KiB")
        for ikind, tkind in pairings:
            m = statistics.median(got[(ikind, tkind)])
            runs = " ".join(f"{g:.2f}" for g in got[(ikind, tkind)])
            print(f"  {ikind:>8} -> {tkind:<8} {m:6.2f} GB/s  {m / base:5.2f}x   ({runs})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
