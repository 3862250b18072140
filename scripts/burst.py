#!/usr/bin/env python3
"""Hundreds of initiator engines starting at once against one target, each
host in its own network namespace (issue 41's burst).

    scripts/netns-testbed --hosts H -- python3 scripts/burst.py \\
        [--engines 256] [--callers 4] [--rounds 8] [--initiator pdx|mooncake] [--lib PATH]

Host 1 of the test bed runs the target (a pdx engine serving one region);
hosts 2..H each run one initiator process holding its share of `--engines`
engines (pdx, or Mooncake's wheel with `--initiator mooncake`). Every engine
is made, every process reports ready, then all start together: each of an
engine's `--callers` threads does `--rounds` rounds of a 64 KiB write of a
fresh pattern into its own slot of the target's region and a read back,
compared. The target keeps its default connection settings.

Printed (one JSON line): transfers done and failed (with each distinct error
and its count), mismatches, the target engine's threads (idle, peak; those
named pdx-*, the process's own Python thread not counted) and RSS growth
(MiB above idle), the time from the start to each engine's first completed
transfer (p50, p99, and the last one), and the whole run's time. Exit status
1 on any failure or mismatch, or when the target's threads passed
`--max-threads` (default 2 x cores + 16).
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

SLOT = 64 << 10  # one caller's slot in the target's region
ROOT = Path(__file__).resolve().parents[1]


def proc_status(pid: int) -> tuple[int, float]:
    """The engine's threads (named pdx-*) in process `pid`, and its RSS in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    threads = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads += (task / "comm").read_text().startswith("pdx")
        except OSError:
            pass  # the thread ended meanwhile
    return threads, int(fields["VmRSS"].split()[0]) / 1024


def buffer_addr(buf) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def target_main(host: str, slots: int) -> None:
    import pdx

    region = mmap.mmap(-1, slots * SLOT)
    region.write(b"\0" * (slots * SLOT))  # resident before the idle reading: RSS growth is the engine's
    engine = pdx.Engine(host, "tcp")
    engine.register(region)
    print(json.dumps({"session": engine.session_id, "addr": buffer_addr(region)}), flush=True)
    sys.stdin.readline()  # until the driver says stop
    engine.close()


def initiator_main(kind: str, host: str, session: str, remote: int, first: int, count: int, callers: int,
                   rounds: int) -> None:
    """`count` engines (slots from engine `first` on), ready, then all at once."""
    if kind == "pdx":
        import pdx

        engines = [pdx.Engine(host, "tcp") for _ in range(count)]
    else:
        os.environ["MC_FORCE_TCP"] = "1"
        from mooncake.engine import TransferEngine

        engines = []
        for _ in range(count):
            e = TransferEngine()
            if e.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
                raise SystemExit("mooncake initialize failed")
            engines.append(e)
    # Local buffers, registered where the engine needs it (Mooncake does).
    bufs = [[(bytearray(SLOT), bytearray(SLOT)) for _ in range(callers)] for _ in range(count)]
    if kind == "mooncake":
        for e, mine in zip(engines, bufs):
            for src, dst in mine:
                for b in (src, dst):
                    if e.register_memory(buffer_addr(b), SLOT) != 0:
                        raise SystemExit("mooncake register_memory failed")
    errors: dict[str, int] = {}
    lock = threading.Lock()
    done = [0]
    mismatched = [0]
    first_done = [None] * count
    go = threading.Event()
    start = [0.0]

    def drive(k: int, c: int) -> None:
        e = engines[k]
        slot = remote + ((first + k) * callers + c) * SLOT
        src, dst = bufs[k][c]
        go.wait()
        for r in range(rounds):
            src[:] = os.urandom(SLOT)
            ok = True
            for op, buf in (("write", src), ("read", dst)):
                try:
                    if kind == "pdx":
                        (e.write if op == "write" else e.read)(session, buf, slot)
                    else:
                        f = e.transfer_sync_write if op == "write" else e.transfer_sync_read
                        rc = f(session, buffer_addr(buf), slot, SLOT)
                        if rc != 0:
                            raise RuntimeError(f"mooncake transfer_sync_{op} returned {rc}")
                except Exception as exc:  # noqa: BLE001 - every failure is counted by its text
                    ok = False
                    why = f"{op}: {exc}"
                    with lock:
                        errors[why] = errors.get(why, 0) + 1
                    continue
                with lock:
                    done[0] += 1
                    if first_done[k] is None:
                        first_done[k] = time.time() - start[0]
            if ok and dst != src:
                with lock:
                    mismatched[0] += 1

    threads = [threading.Thread(target=drive, args=(k, c)) for k in range(count) for c in range(callers)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    start[0] = float(sys.stdin.readline())
    while time.time() < start[0]:
        time.sleep(0.001)
    go.set()
    for t in threads:
        t.join()
    print(json.dumps({"done": done[0], "errors": errors, "mismatched": mismatched[0], "first": first_done}), flush=True)
    if kind == "pdx":
        for e in engines:
            e.close()


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p * len(values)))], 3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=256)
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--initiator", choices=["pdx", "mooncake"], default="pdx")
    ap.add_argument("--lib", help="libpdx.so for every pdx engine (PDX_LIB), e.g. an older build to compare")
    ap.add_argument("--max-threads", type=int, default=2 * (os.cpu_count() or 2) + 16)
    ap.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--args", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "target":
        host, slots = a.args.split(",")
        target_main(host, int(slots))
        return 0
    if a.role == "initiator":
        host, session, remote, first, count = a.args.split(",")
        initiator_main(a.initiator, host, session, int(remote), int(first), int(count), a.callers, a.rounds)
        return 0

    names = os.environ.get("PDX_TESTBED_NS", "").split()
    addrs = os.environ.get("PDX_TESTBED_ADDRS", "").split()
    if len(names) < 2:
        print("burst.py runs inside scripts/netns-testbed (--hosts 2 or more)", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), PDX_SAME_HOST="off")
    if a.lib:
        env["PDX_LIB"] = a.lib
    me = [sys.executable, __file__, "--callers", str(a.callers), "--rounds", str(a.rounds), "--initiator", a.initiator]
    target = subprocess.Popen(["ip", "netns", "exec", names[0], *me, "--role", "target",
                               "--args", f"{addrs[0]},{a.engines * a.callers}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    hosts = list(zip(names[1:], addrs[1:]))
    per, extra = divmod(a.engines, len(hosts))
    procs = []
    try:
        info = json.loads(target.stdout.readline())
        first = 0
        for i, (ns, addr) in enumerate(hosts):
            count = per + (1 if i < extra else 0)
            if count == 0:
                continue
            args = f"{addr},{info['session']},{info['addr']},{first},{count}"
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *me, "--role", "initiator", "--args", args],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True))
            first += count
        for p in procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"an initiator process did not start: {line!r}")
        time.sleep(0.3)
        idle_threads, idle_rss = proc_status(target.pid)
        peak_threads, peak_rss = idle_threads, idle_rss
        start = time.time() + 0.5
        for p in procs:
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        while any(p.poll() is None for p in procs):
            threads, rss = proc_status(target.pid)
            peak_threads, peak_rss = max(peak_threads, threads), max(peak_rss, rss)
            time.sleep(0.02)
        took = time.time() - start
        results = []
        for p in procs:
            out = p.stdout.read().strip().splitlines()
            results.append(json.loads(out[-1]) if out else {"done": 0, "errors": {"no result": 1}, "mismatched": 0,
                                                           "first": []})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        target.stdin.close()
        target.wait(timeout=30)
    errors: dict[str, int] = {}
    for r in results:
        for why, n in r["errors"].items():
            errors[why] = errors.get(why, 0) + n
    firsts = [f for r in results for f in r["first"] if f is not None]
    expected = a.engines * a.callers * a.rounds * 2
    report = {
        "initiator": a.initiator,
        "engines": a.engines,
        "callers": a.callers,
        "rounds": a.rounds,
        "hosts": len(hosts),
        "transfers": expected,
        "done": sum(r["done"] for r in results),
        "failed": sum(errors.values()),
        "mismatched": sum(r["mismatched"] for r in results),
        "errors": errors,
        "target_threads_idle_peak": [idle_threads, peak_threads],
        "target_rss_growth_mib": round(peak_rss - idle_rss, 1),
        "engines_without_a_transfer": a.engines - len(firsts),
        "first_transfer_s_p50_p99_last": [pct(firsts, 0.5), pct(firsts, 0.99), round(max(firsts), 3) if firsts else None],
        "seconds": round(took, 2),
    }
    print(json.dumps(report), flush=True)
    ok = report["done"] == expected and report["failed"] == 0 and report["mismatched"] == 0
    if peak_threads > a.max_threads:
        print(f"the target peaked at {peak_threads} threads (bound {a.max_threads})", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
