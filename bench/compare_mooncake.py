#!/usr/bin/env python3
"""pdx against Mooncake's TCP transport, side by side on loopback.

    python3 bench/compare_mooncake.py            # full run (a few minutes)
    python3 bench/compare_mooncake.py --quick    # under a minute
    python3 bench/compare_mooncake.py --rounds 5 --json out.json

Each engine runs as initiator against a target of the same kind, every engine
in its own process (bench/bench_peer.py): pdx -> pdx through the C ABI
(ctypes), Mooncake -> Mooncake through the PyPI wheel (MC_FORCE_TCP=1). Both
pairs use mmap buffers of the same size filled with random bytes, the same
workloads and the same verification: before every run the destination ranges
are zeroed, after it the crc32 of the destination ranges must equal the
crc32 of the source ranges.

Timing happens inside the initiator process around each engine call only
(`bench` command of bench_peer.py). Workloads run in rounds; within a round
every workload runs once per engine, back to back, and the engine that goes
first alternates from round to round. A run's figure is the median over its
calls; the table shows the median over rounds.

Workloads: (a) one transfer_sync_write (and _read) of 64 MiB, 256 MiB, 1 GiB;
(b) batch_transfer_sync_write of 256 blocks of 4, 16, 64 KiB (blocks spaced
apart and scattered on the target, so no two entries are adjacent);
(c) 4 KiB transfer_sync_write latency; (d) iperf3 single-stream loopback
(`iperf3 -c 127.0.0.1 -l <size> -J`) in the same rounds, for the "80% of
iperf3" target, and because iperf3 caps writes at 1 MiB, (e) one raw TCP
connection writing the same sizes as (a) (bench/tcp_stream.py: sendall() of
the whole buffer). Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests" / "interop"))
import tcp_stream  # noqa: E402
from peer_client import Peer  # noqa: E402

HERE = Path(__file__).resolve().parent
PEER_SCRIPT = HERE / "bench_peer.py"
KINDS = ("pdx", "mooncake")
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
IPERF3_MAX_BLOCK = MiB  # iperf3 (3.12 here) refuses -l above 1 MiB for TCP

# Variables that change either engine's behaviour: both engines run with defaults.
ENGINE_ENV = ("MC_TCP_PROTO", "MC_USE_TENT", "MC_USE_TEV1", "MC_DISABLE_METACACHE", "PDX_TCP_ENGINE",
              "PDX_TCP_LANES", "MC_TCP_LANES_PER_PEER", "MC_TCP_MAX_CONNECTIONS_PER_PEER", "PDX_WORKERS")


def fmt_size(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


# --------------------------------------------------------------------------
# peers


def _busy_jiffies() -> int:
    """User and system CPU time of the whole machine, in clock ticks (/proc/stat).

    Interrupt and softirq time are left out: loopback TCP's packet processing
    runs there (also in ksoftirqd), on behalf of the engines being measured."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2]  # user, nice, system


def _proc_jiffies(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except OSError:
        return 0


class ForeignLoad:
    """CPU used by processes other than ours during a span, as a share of all CPUs."""

    def __init__(self, pids):
        self.pids = list(pids) + [os.getpid()]
        self.t0, self.busy0 = time.monotonic(), _busy_jiffies()
        self.ours0 = sum(_proc_jiffies(p) for p in self.pids)

    def share(self) -> float | None:
        """None for spans under half a second (the counters tick every 10 ms)."""
        hz = os.sysconf("SC_CLK_TCK")
        dt = time.monotonic() - self.t0
        other = (_busy_jiffies() - self.busy0) - (sum(_proc_jiffies(p) for p in self.pids) - self.ours0)
        return max(0.0, other / hz / dt / os.cpu_count()) if dt >= 0.5 else None


class Pair:
    """Initiator and target of one engine kind, each with one registered buffer of `size` bytes."""

    def __init__(self, kind: str, size: int, log_dir: Path, same_host: bool = False):
        self.kind = kind
        # TCP against TCP: two pdx processes of one host would otherwise take
        # the same-host link (docs/same-host.md), which Mooncake's TCP lacks.
        self.env = {} if kind != "pdx" or same_host else {"PDX_SAME_HOST": "off"}
        self.peers = []
        self.target = self._start(f"{kind}-target", log_dir)
        self.init = self._start(f"{kind}-initiator", log_dir)
        self.tbuf = self.target.call("alloc", timeout=300, size=size, register=True)
        self.ibuf = self.init.call("alloc", timeout=300, size=size, register=True)
        # Random bytes on both sides (this also faults every page in before timing).
        self.target.call("randomize", timeout=300, buf=self.tbuf["buf"])
        self.init.call("randomize", timeout=300, buf=self.ibuf["buf"])

    def _start(self, name, log_dir):
        peer = Peer(self.kind, self.env, name=name, command=[str(PEER_SCRIPT), self.kind], drop_env=ENGINE_ENV,
                    log_dir=log_dir, start_timeout=60.0)
        self.peers.append(peer)
        return peer

    def run(self, w: dict) -> dict:
        """One run of workload w: zero the destination, time the calls, verify by crc32."""
        entries = [[lo, self.tbuf["addr"] + ro, n] for lo, ro, n in w["layout"]]
        local_ranges = [[lo, n] for lo, _, n in w["layout"]]
        remote_ranges = [[ro, n] for _, ro, n in w["layout"]]
        if w["op"] == "write":
            src, src_buf, src_ranges = self.init, self.ibuf, local_ranges
            dst, dst_buf, dst_ranges = self.target, self.tbuf, remote_ranges
        else:
            src, src_buf, src_ranges = self.target, self.tbuf, remote_ranges
            dst, dst_buf, dst_ranges = self.init, self.ibuf, local_ranges
        dst.call("clear", timeout=300, buf=dst_buf["buf"], ranges=dst_ranges)
        load = ForeignLoad(p.proc.pid for p in self.peers)
        r = self.init.call("bench", timeout=600, op=w["op"], mode=w["mode"], target=self.target.session,
                           buf=self.ibuf["buf"], entries=entries, iters=w["iters"], warmup=w["warmup"],
                           max_seconds=w["max_seconds"])
        foreign = load.share()
        want = src.call("crc", timeout=300, buf=src_buf["buf"], ranges=src_ranges)["crc32"]
        got = dst.call("crc", timeout=300, buf=dst_buf["buf"], ranges=dst_ranges)["crc32"]
        return {"rc": r["rc"], "error": r.get("error"), "stage": r.get("stage"), "times_ns": r["times_ns"],
                "verified": r["rc"] == 0 and want == got, "crc_src": want, "crc_dst": got,
                "foreign_cpu": foreign}

    def close(self):
        for p in self.peers:
            p.close()


# --------------------------------------------------------------------------
# workloads


def workloads(large: list[int], ops: list[str], blocks: list[int], batch: int, lat_iters: int,
              large_iters: int, batch_iters: int, seconds: float) -> list[dict]:
    out = []
    for op in ops:
        for size in large:
            out.append({"name": f"{op} {fmt_size(size)}", "group": "large", "op": op, "mode": "single",
                        "block": size, "layout": [[0, 0, size]], "bytes": size,
                        "iters": large_iters, "warmup": 1, "max_seconds": seconds})
    rng = random.Random(5)
    for block in blocks:
        stride = 2 * block  # a gap after every block: no two entries are adjacent on either side
        slots = list(range(batch))
        rng.shuffle(slots)
        layout = [[i * stride, slots[i] * stride, block] for i in range(batch)]
        out.append({"name": f"batch {batch}x{fmt_size(block)}", "group": "batch", "op": "write",
                    "mode": "batch", "block": block, "layout": layout, "bytes": block * batch,
                    "iters": batch_iters, "warmup": 3, "max_seconds": seconds})
    out.append({"name": "latency 4 KiB", "group": "latency", "op": "write", "mode": "single", "block": 4 * KiB,
                "layout": [[0, 0, 4 * KiB]], "bytes": 4 * KiB, "iters": lat_iters, "warmup": 50,
                "max_seconds": 1e9})
    return out


def buffer_size(ws: list[dict]) -> int:
    return max(max(lo + n, ro + n) for w in ws for lo, ro, n in w["layout"])


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_stats(w: dict, r: dict) -> dict:
    t = r["times_ns"]
    if not t:
        return {"gbps": None, "p50_us": None, "p99_us": None, "calls": 0}
    return {"gbps": w["bytes"] / statistics.median(t),  # bytes per ns == GB/s
            "p50_us": percentile(t, 0.50) / 1e3, "p99_us": percentile(t, 0.99) / 1e3, "calls": len(t)}


# --------------------------------------------------------------------------
# iperf3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Iperf3:
    def __init__(self):
        self.path = shutil.which("iperf3")
        self.server = None
        if self.path:
            self.port = free_port()
            self.server = subprocess.Popen([self.path, "-s", "-B", "127.0.0.1", "-p", str(self.port)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def run(self, block: int, seconds: float) -> dict:
        """One single-stream client run; returns GB/s (received) or an error."""
        last = "no attempt"
        for _ in range(20):  # the server may still be starting
            p = subprocess.run([self.path, "-c", "127.0.0.1", "-p", str(self.port), "-l", str(block),
                                "-t", str(seconds), "-J"], capture_output=True, text=True, timeout=seconds + 30)
            try:
                d = json.loads(p.stdout)
            except ValueError:
                d = {"error": (p.stdout + p.stderr).strip()[:200] or f"exit {p.returncode}"}
            if "error" not in d:
                end = d["end"]
                return {"gbps": end["sum_received"]["bits_per_second"] / 8e9,
                        "sent_gbps": end["sum_sent"]["bits_per_second"] / 8e9}
            last = d["error"]
            time.sleep(0.25)
        return {"error": last}

    def close(self):
        if self.server and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=10)


# --------------------------------------------------------------------------
# report


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(ws, results, iperf, rounds, tcp=None):
    """results[name][kind] = list of per-round stats; returns rows and target checks."""
    rows = []
    for w in ws:
        row = {"workload": w["name"], "group": w["group"], "block": w["block"], "bytes_per_call": w["bytes"]}
        for kind in KINDS:
            runs = results[w["name"]][kind]
            key = "p50_us" if w["group"] == "latency" else "gbps"
            vals = [r[key] for r in runs]
            row[kind] = {"median": med(vals), "rounds": vals, "p99_us": med([r["p99_us"] for r in runs]),
                         "p50_us": med([r["p50_us"] for r in runs]), "calls": sum(r["calls"] for r in runs),
                         "verified": all(r["verified"] for r in runs) and len(runs) == rounds}
        p, m = row["pdx"]["median"], row["mooncake"]["median"]
        row["ratio"] = (p / m) if p and m else None  # throughput: pdx/mc; latency: pdx p50 / mc p50
        rows.append(row)
    checks = []

    def check(name, ok, detail):
        checks.append({"target": name, "pass": ok, "detail": detail})

    large = [r for r in rows if r["group"] == "large" and r["workload"].startswith("write")]
    for r in large:
        ok = r["ratio"] is not None and r["ratio"] >= 2.0
        check(f"{r['workload']}: pdx >= 2x Mooncake", ok, f"{r['ratio']:.2f}x" if r["ratio"] else "n/a")
    if iperf.get("gbps"):
        base = iperf["gbps"]
        for r in large:
            p = r["pdx"]["median"]
            ok = p is not None and p >= 0.8 * base
            check(f"{r['workload']}: pdx >= 80% of iperf3 ({fmt_size(iperf['block'])} writes)", ok,
                  f"{p:.2f} / {base:.2f} GB/s = {100 * p / base:.0f}%" if p else "n/a")
    else:
        check("pdx >= 80% of iperf3 single stream", None, iperf.get("error", "iperf3 not run"))
    for r in large:
        t = (tcp or {}).get(r["block"])
        if t:
            p, base = r["pdx"]["median"], statistics.median(t)
            ok = p is not None and p >= 0.8 * base
            check(f"{r['workload']}: pdx >= 80% of one raw TCP stream, same write size", ok,
                  f"{p:.2f} / {base:.2f} GB/s = {100 * p / base:.0f}%" if p else "n/a")
    for r in rows:
        if r["group"] == "batch":
            ok = r["ratio"] is not None and r["ratio"] >= 3.0
            check(f"{r['workload']}: pdx >= 3x Mooncake", ok, f"{r['ratio']:.2f}x" if r["ratio"] else "n/a")
        if r["group"] == "latency":
            ok = r["ratio"] is not None and r["ratio"] <= 0.5
            check("4 KiB p50 latency: pdx <= 0.5x Mooncake", ok, f"{r['ratio']:.2f}x" if r["ratio"] else "n/a")
    verified = all(r[k]["verified"] for r in rows for k in KINDS)
    return rows, checks, verified


def print_report(rows, checks, verified, iperf, meta, tcp=None, out=sys.stdout):
    def num(v, spec):
        return format(v, spec) if v is not None else "-"

    print(f"\npdx vs Mooncake TCP on loopback: {meta['rounds']} rounds, {meta['nproc']} CPUs, "
          f"Mooncake wheel {meta['mooncake_version']}, load average {meta['loadavg_start']} -> {meta['loadavg_end']}\n"
          "medians over rounds (each round: median over its calls)",
          file=out)
    hdr = f"{'workload':<20} {'pdx':>10} {'mooncake':>10} {'pdx/mc':>7}  {'pdx rounds':<24} {'mooncake rounds':<24} verified"
    print("\nthroughput (GB/s)\n" + hdr, file=out)
    for r in rows:
        if r["group"] == "latency":
            continue
        p, m = r["pdx"], r["mooncake"]
        print(f"{r['workload']:<20} {num(p['median'], '10.3f')} {num(m['median'], '10.3f')} "
              f"{num(r['ratio'], '6.2f')}x  {' '.join(num(v, '.2f') for v in p['rounds']):<24} "
              f"{' '.join(num(v, '.2f') for v in m['rounds']):<24} "
              f"{'yes' if p['verified'] and m['verified'] else 'NO'}", file=out)
    for r in rows:
        if r["group"] != "latency":
            continue
        p, m = r["pdx"], r["mooncake"]
        print(f"\nlatency, {r['workload']} ({p['calls']} + {m['calls']} calls)\n"
              f"{'':<20} {'p50 us':>10} {'p99 us':>10}\n"
              f"{'pdx':<20} {num(p['p50_us'], '10.1f')} {num(p['p99_us'], '10.1f')}\n"
              f"{'mooncake':<20} {num(m['p50_us'], '10.1f')} {num(m['p99_us'], '10.1f')}\n"
              f"{'pdx/mooncake p50':<20} {num(r['ratio'], '9.2f')}x   verified: "
              f"{'yes' if p['verified'] and m['verified'] else 'NO'}", file=out)
    if iperf.get("gbps"):
        print(f"\niperf3 single stream, {fmt_size(iperf['block'])} writes: {iperf['gbps']:.2f} GB/s "
              f"(rounds {' '.join(f'{v:.2f}' for v in iperf['rounds'])})", file=out)
    else:
        print(f"\niperf3: skipped ({iperf.get('error')})", file=out)
    if iperf.get("note"):
        print(iperf["note"], file=out)
    for size, vals in sorted((tcp or {}).items()):
        print(f"raw TCP single stream, {fmt_size(size)} writes: {statistics.median(vals):.2f} GB/s "
              f"(rounds {' '.join(f'{v:.2f}' for v in vals)})", file=out)
    print("\ntargets", file=out)
    for c in checks:
        mark = "PASS" if c["pass"] else ("SKIP" if c["pass"] is None else "FAIL")
        print(f"  {mark}  {c['target']}: {c['detail']}", file=out)
    print(f"\nverification: {'all runs verified (crc32 of destination == source)' if verified else 'FAILED'}",
          file=out)


# --------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a run under a minute (smaller sizes, fewer calls)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds (for the test suite)")
    ap.add_argument("--rounds", type=int, help="rounds (default 3, --quick 2, --smoke 1)")
    ap.add_argument("--no-read", action="store_true", help="skip the large transfer_sync_read runs")
    ap.add_argument("--only", metavar="GROUPS", help="comma list of large,batch,latency (default: all)")
    ap.add_argument("--no-iperf", action="store_true", help="skip iperf3")
    ap.add_argument("--no-tcp", action="store_true", help="skip the raw TCP single-stream baseline")
    ap.add_argument("--iperf-seconds", type=float, help="seconds per iperf3 run (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write all results as JSON")
    ap.add_argument("--same-host", action="store_true",
                    help="let pdx use its same-host link (default: PDX_SAME_HOST=off, TCP against TCP)")
    args = ap.parse_args(argv)

    if args.smoke:
        cfg = dict(large=[1 * MiB, 4 * MiB], blocks=[4 * KiB, 64 * KiB], batch=16, lat_iters=50, large_iters=3,
                   batch_iters=5, seconds=0.5, rounds=1, iperf_s=1, tcp_s=0.2)
    elif args.quick:
        cfg = dict(large=[64 * MiB, 256 * MiB], blocks=[4 * KiB, 16 * KiB, 64 * KiB], batch=256, lat_iters=500,
                   large_iters=3, batch_iters=30, seconds=1.0, rounds=2, iperf_s=1, tcp_s=0.5)
    else:
        cfg = dict(large=[64 * MiB, 256 * MiB, GiB], blocks=[4 * KiB, 16 * KiB, 64 * KiB], batch=256,
                   lat_iters=2000, large_iters=5, batch_iters=200, seconds=2.0, rounds=3, iperf_s=3, tcp_s=1.5)
    rounds = args.rounds or cfg["rounds"]
    iperf_s = args.iperf_seconds or cfg["iperf_s"]
    ops = ["write"] if args.no_read else ["write", "read"]
    ws = workloads(cfg["large"], ops, cfg["blocks"], cfg["batch"], cfg["lat_iters"], cfg["large_iters"],
                   cfg["batch_iters"], cfg["seconds"])
    if args.only:
        groups = set(args.only.split(","))
        if not groups <= {"large", "batch", "latency"}:
            ap.error(f"--only takes large, batch, latency; got {args.only}")
        ws = [w for w in ws if w["group"] in groups]
    size = buffer_size(ws)
    iperf_block = min(max(cfg["large"]), IPERF3_MAX_BLOCK)

    try:
        from importlib.metadata import version
        mc_version = version("mooncake-transfer-engine-non-cuda")
    except Exception:
        mc_version = "?"
    meta = {"rounds": rounds, "nproc": os.cpu_count(), "mooncake_version": mc_version, "buffer_bytes": size,
            "mode": "smoke" if args.smoke else "quick" if args.quick else "full"}
    meta["loadavg_start"] = round(os.getloadavg()[0], 2)
    if meta["loadavg_start"] > 0.5:
        print(f"note: load average {meta['loadavg_start']} before the run; other work on this machine skews "
              "both engines' numbers (alternating rounds spreads it, but medians still move)", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="pdx-compare-"))
    t_start = time.monotonic()
    print(f"starting peers (2 x pdx, 2 x mooncake, {fmt_size(size)} buffers each; logs in {log_dir})", flush=True)
    pairs = {}
    iperf3 = None
    results = {w["name"]: {k: [] for k in KINDS} for w in ws}
    iperf = {"block": iperf_block, "rounds": []}
    tcp = {}
    tcp_sizes = [] if args.no_tcp else sorted({w["block"] for w in ws if w["group"] == "large" and w["op"] == "write"})
    failed = False
    try:
        for kind in KINDS:
            pairs[kind] = Pair(kind, size, log_dir, args.same_host)
        if args.no_iperf:
            iperf["error"] = "--no-iperf"
        else:
            iperf3 = Iperf3()
            if not iperf3.path:
                iperf["error"] = "iperf3 not installed (apt-get install -y iperf3)"
        for rnd in range(rounds):
            order = KINDS if rnd % 2 == 0 else KINDS[::-1]
            for w in ws:
                for kind in order:
                    r = pairs[kind].run(w)
                    st = run_stats(w, r)
                    st.update(verified=r["verified"], rc=r["rc"], times_ns=r["times_ns"],
                              foreign_cpu=r["foreign_cpu"])
                    results[w["name"]][kind].append(st)
                    shown = (f"p50 {st['p50_us']:.1f} us" if w["group"] == "latency" else
                             f"{st['gbps']:.3f} GB/s") if st["calls"] else "no calls"
                    fcpu = "  -" if r["foreign_cpu"] is None else f"{100 * r['foreign_cpu']:3.0f}%"
                    if r["verified"]:
                        status = "ok"
                    elif r["rc"] != 0:
                        status = f"FAILED rc={r['rc']} at {r['stage']}: {r['error'] or ''}"
                    else:
                        status = f"FAILED: crc32 {r['crc_dst']:#x} on the destination, {r['crc_src']:#x} at the source"
                    failed |= not r["verified"]
                    print(f"round {rnd + 1}/{rounds}  {w['name']:<18} {kind:<8} {shown:>16}  "
                          f"({st['calls']:>4} calls, other processes {fcpu} CPU) {status}",
                          flush=True)
            if iperf3 and iperf3.path:
                res = iperf3.run(iperf_block, iperf_s)
                if "error" in res:
                    iperf["error"] = f"iperf3 failed: {res['error']}"
                    print(f"round {rnd + 1}/{rounds}  iperf3 failed: {res['error']}", flush=True)
                else:
                    iperf["rounds"].append(res["gbps"])
                    print(f"round {rnd + 1}/{rounds}  iperf3 -l {fmt_size(iperf_block)} {'':<8} "
                          f"{res['gbps']:.3f} GB/s", flush=True)
            for tsize in tcp_sizes:
                rate = tcp_stream.send(tsize, cfg["tcp_s"])
                tcp.setdefault(tsize, []).append(rate)
                print(f"round {rnd + 1}/{rounds}  raw TCP {fmt_size(tsize):<10} {'':<8} {rate:.3f} GB/s", flush=True)
    finally:
        for p in pairs.values():
            p.close()
        if iperf3:
            iperf3.close()
    if iperf["rounds"] and "error" not in iperf:
        iperf["gbps"] = statistics.median(iperf["rounds"])
        if max(cfg["large"]) > IPERF3_MAX_BLOCK:
            iperf["note"] = (f"(iperf3 accepts -l up to {fmt_size(IPERF3_MAX_BLOCK)} for TCP, so its largest write "
                             f"size stands in for the {fmt_size(min(cfg['large']))}+ transfer sizes)")
    rows, checks, verified = summarize(ws, results, iperf, rounds, tcp)
    meta["seconds"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_end"] = round(os.getloadavg()[0], 2)
    print_report(rows, checks, verified, iperf, meta, tcp)
    print(f"({meta['seconds']} s)")
    if args.json:
        doc = {"meta": meta, "rows": rows, "targets": checks, "verified": verified, "iperf3": iperf,
               "raw_tcp": {str(k): v for k, v in tcp.items()},
               "runs": {name: {k: [{x: v for x, v in st.items() if x != "times_ns"} for st in by_kind[k]]
                               for k in KINDS} for name, by_kind in results.items()}}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if not (failed or not verified):
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0 if verified and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
