#!/usr/bin/env python3
"""Many initiator engines against one target (issue 22's scale check).

    PYTHONPATH=python python3 scripts/scale.py [--engines 256] [--procs 4] [--seconds 10] [--target pdx|mooncake]

One target process (pdx, or Mooncake's wheel with --target mooncake) serves
a region with one slot per initiator engine. `--procs` processes start
`--engines` pdx initiator engines in all (`PDX_TCP_LANES=4`), each driven by
its own thread: four asynchronous batches at once (so all four lanes open),
writes of a fresh pattern into its slot, then reads back and compares.
The target runs with `PDX_MAX_DATA_CONNECTIONS` and
`PDX_MAX_CONNECTIONS_PER_ADDRESS` at 4096 and `PDX_IDLE_TIMEOUT_MS=600000`.

Reported: the target's socket descriptors (inbound data connections plus
its two listeners), threads (whole process) and RSS, idle and at the peak of
open connections; per-engine bytes moved (max/min); the longest round of
any engine (a stall shows there); failed transfers and mismatches. Exit
status 1 on any failure or mismatch.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

SLOT = 256 << 10  # one initiator engine's slot in the target's region
QUARTER = SLOT // 4
BLOCK = 64 << 10


def proc_status(pid: int) -> dict:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                sockets += 1
        except OSError:
            pass
    return {"threads": int(fields["Threads"]), "rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "sockets": sockets}


def target_main(kind: str, engines: int) -> None:
    size = engines * SLOT
    region = mmap.mmap(-1, size)
    region.write(b"\1" * size)  # resident before the idle reading: RSS growth is the engine's, not the region's
    addr = ctypes_addr(region)
    if kind == "pdx":
        import pdx

        engine = pdx.Engine("127.0.0.1", "tcp")
        engine.register(region)
        session = engine.session_id
    else:
        os.environ["MC_FORCE_TCP"] = "1"
        from mooncake.engine import TransferEngine

        engine = TransferEngine()
        if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise SystemExit("mooncake initialize failed")
        if engine.register_memory(addr, size) != 0:
            raise SystemExit("mooncake register_memory failed")
        session = f"127.0.0.1:{engine.get_rpc_port()}"
    print(json.dumps({"session": session, "addr": addr, "size": size}), flush=True)
    sys.stdin.readline()  # until the driver says stop


def ctypes_addr(m: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def initiator_main(session: str, remote: int, first: int, count: int, seconds: float) -> None:
    import pdx

    engines = [pdx.Engine("127.0.0.1", "tcp") for _ in range(count)]
    results = [None] * count
    start_at = time.monotonic() + 1.0

    def drive(k: int) -> None:
        e = engines[k]
        slot = remote + (first + k) * SLOT
        src = bytearray(os.urandom(SLOT))
        dst = bytearray(SLOT)
        moved = failed = mismatched = rounds = 0
        longest = 0.0
        while time.monotonic() < start_at:
            time.sleep(0.01)
        end = time.monotonic() + seconds
        while (started := time.monotonic()) < end:
            src[0:8] = rounds.to_bytes(8, "little")
            for op, buf in (("write", src), ("read", dst)):
                mv = memoryview(buf)
                ids = []
                for q in range(4):
                    entries = [(mv[q * QUARTER + o : q * QUARTER + o + BLOCK], slot + q * QUARTER + o) for o in range(0, QUARTER, BLOCK)]
                    try:
                        ids.append(e.submit(session, op, entries))
                    except pdx.PdxError:
                        failed += len(entries)
                for b in ids:
                    try:
                        e.wait(b, 60000)
                        s = e.status(b)
                        failed += s.failed
                        moved += s.bytes
                        e.free(b)
                    except pdx.PdxError:
                        failed += QUARTER // BLOCK
            if dst != src:
                mismatched += 1
            rounds += 1
            longest = max(longest, time.monotonic() - started)
        results[k] = {"moved": moved, "failed": failed, "mismatched": mismatched, "rounds": rounds, "longest_s": longest}

    threads = [threading.Thread(target=drive, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results), flush=True)
    for e in engines:
        e.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=256)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--target", choices=["pdx", "mooncake"], default="pdx")
    ap.add_argument("--target-lib", help="libpdx.so for the target only (PDX_LIB), e.g. an older build to compare")
    ap.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--args", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "target":
        target_main(a.target, a.engines)
        return 0
    if a.role == "initiator":
        session, remote, first, count = a.args.split(",")
        initiator_main(session, int(remote), int(first), int(count), a.seconds)
        return 0

    env = dict(os.environ, PDX_MAX_DATA_CONNECTIONS="4096", PDX_MAX_CONNECTIONS_PER_ADDRESS="4096",
               PDX_IDLE_TIMEOUT_MS="600000", PDX_TCP_LANES="4", PDX_SAME_HOST="off",
               # Every engine binds two listeners in this range; the default
               # (15000-17000) holds about 1000 engines on one address.
               PDX_MIN_PORT="15000", PDX_MAX_PORT="30000")
    me = [sys.executable, __file__, "--engines", str(a.engines), "--seconds", str(a.seconds), "--target", a.target]
    tenv = dict(env, PDX_LIB=a.target_lib) if a.target_lib else env
    target = subprocess.Popen([*me, "--role", "target"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=tenv, text=True)
    try:
        info = json.loads(target.stdout.readline())
        time.sleep(0.5)
        idle = proc_status(target.pid)
        per = a.engines // a.procs
        ienv = dict(env, PDX_WORKERS="4")
        procs = [
            subprocess.Popen([*me, "--role", "initiator", "--args", f"{info['session']},{info['addr']},{i * per},{per}"],
                             stdout=subprocess.PIPE, env=ienv, text=True)
            for i in range(a.procs)
        ]
        peak = dict(idle)
        samples = 0
        while any(p.poll() is None for p in procs):
            s = proc_status(target.pid)
            samples += 1
            if s["sockets"] > peak["sockets"] or (s["sockets"] == peak["sockets"] and s["threads"] > peak["threads"]):
                peak = s
            peak["max_threads"] = max(peak.get("max_threads", 0), s["threads"])
            peak["max_rss_mib"] = max(peak.get("max_rss_mib", 0), s["rss_mib"])
            time.sleep(0.1)
        results = []
        for p in procs:
            out = p.stdout.read().strip().splitlines()
            p.wait()
            results += json.loads(out[-1]) if out else []
    finally:
        target.stdin.close()
        target.wait(timeout=30)
    moved = [r["moved"] for r in results]
    failed = sum(r["failed"] for r in results)
    mismatched = sum(r["mismatched"] for r in results)
    report = {
        "target": a.target,
        "engines": len(results),
        "seconds": a.seconds,
        "target_idle": idle,
        "target_at_peak_connections": peak,
        "rss_above_idle_mib": round(peak["rss_mib"] - idle["rss_mib"], 1),
        "total_gb": round(sum(moved) / 1e9, 2),
        "per_engine_mb_max_min": [round(max(moved) / 1e6, 1), round(min(moved) / 1e6, 1)] if moved else None,
        "max_over_min": round(max(moved) / max(min(moved), 1), 2) if moved else None,
        "longest_round_ms": round(max(r["longest_s"] for r in results) * 1e3, 1) if results else None,
        "per_process_mean_mb": [round(sum(moved[i:i + per]) / per / 1e6, 1) for i in range(0, len(moved), per)],
        "failed_transfers": failed,
        "mismatched_rounds": mismatched,
        "cores": os.cpu_count(),
    }
    print(json.dumps(report, indent=1))
    return 0 if failed == 0 and mismatched == 0 and len(results) == a.engines else 1


if __name__ == "__main__":
    sys.exit(main())
