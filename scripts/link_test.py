#!/usr/bin/env python3
"""pdx, Mooncake's wheel and iperf3 (one stream) side by side over one link:
64 MiB writes and reads (one request each, so one pdx lane), throughput and
sender + receiver CPU seconds per GB moved; every read compared with what was
written. `--rounds` interleaves them (pdx, Mooncake, iperf3, pdx, ...) and
reports medians, with each engine's figures as fractions of iperf3's.

    PYTHONPATH=python python3 scripts/link_test.py                 # loopback
    scripts/netns-testbed --rate 1gbit -- env PYTHONPATH=python python3 scripts/link_test.py
    scripts/netns-testbed -- env PYTHONPATH=python python3 scripts/link_test.py   # uncapped veth

Inside a test bed (PDX_TESTBED_NS set by scripts/netns-testbed), the target
runs on the second host and the initiator on the first, each in its
namespace; otherwise both on 127.0.0.1. `--min-fraction F` fails (exit 1) when
a pdx figure is under F of the cap (with a cap) and any transfer fails or
mismatches. Prints one JSON report.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

SIZE = 64 << 20
HERE = os.path.abspath(__file__)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def addr_of(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


class Side:
    def __init__(self, kind: str, host: str):
        self.kind = kind
        self.buf = mmap.mmap(-1, SIZE)
        self.buf.write(os.urandom(SIZE))
        self.addr = addr_of(self.buf)
        if kind == "pdx":
            import pdx

            self.pdx = pdx
            self.e = pdx.Engine(host, "tcp")
            self.e.register(self.buf)
            self.session = self.e.session_id
        else:
            os.environ["MC_FORCE_TCP"] = "1"
            from mooncake.engine import TransferEngine

            self.e = TransferEngine()
            if self.e.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
                raise SystemExit("mooncake initialize failed")
            if self.e.register_memory(self.addr, SIZE) != 0:
                raise SystemExit("mooncake register_memory failed")
            self.session = f"{host}:{self.e.get_rpc_port()}"

    def transfer(self, op: str, session: str, remote: int, local: int) -> bool:
        if self.kind == "pdx":
            lib = self.pdx.lib
            fn = lib.pdx_transfer_sync_write if op == "write" else lib.pdx_transfer_sync_read
            return fn(self.e.handle, session.encode(), local, remote, SIZE) == 0
        fn = self.e.transfer_sync_write if op == "write" else self.e.transfer_sync_read
        return fn(session, local, remote, SIZE) == 0


def role_target(kind: str, host: str) -> None:
    side = Side(kind, host)
    print(json.dumps({"session": side.session, "addr": side.addr}), flush=True)
    sys.stdin.readline()


def role_initiator(kind: str, host: str, session: str, remote: int, iters: int) -> None:
    side = Side(kind, host)
    src = bytes(side.buf[:])
    dst_map = mmap.mmap(-1, SIZE)
    # Resident before the timed reads, as the source and the target's region
    # are: faulting 64 MiB of fresh pages in is the harness's cost, not the
    # transfer's (iperf3 reuses one buffer).
    dst_map.write(bytes(SIZE))
    dst = addr_of(dst_map)
    # Warm up (descriptor, lane) before the timed runs.
    ok = side.transfer("write", session, remote, side.addr)
    print(json.dumps({"ready": ok}), flush=True)
    sys.stdin.readline()
    out = {}
    for op, local in (("write", side.addr), ("read", dst)):
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        failed = sum(0 if side.transfer(op, session, remote, local) else 1 for _ in range(iters))
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        out[op] = {"seconds": t1 - t0, "failed": failed,
                   "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)}
        print(json.dumps({"phase": op}), flush=True)
        sys.stdin.readline()  # the driver reads the target's CPU between phases
    out["mismatch"] = dst_map[:] != src
    print(json.dumps(out), flush=True)


def in_ns(ns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else argv


def run_engine(kind: str, hosts, nss, iters: int) -> dict:
    me = [sys.executable, HERE]
    t = subprocess.Popen(in_ns(nss[1], [*me, "--role", "target", "--kind", kind, "--host", hosts[1]]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(t.stdout.readline())
        i = subprocess.Popen(in_ns(nss[0], [*me, "--role", "initiator", "--kind", kind, "--host", hosts[0],
                                            "--args", f"{info['session']},{info['addr']},{iters}"]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(i.stdout.readline())
        target_cpu = {}
        c0 = cpu_seconds(t.pid)
        i.stdin.write("go\n")
        i.stdin.flush()
        for op in ("write", "read"):
            json.loads(i.stdout.readline())
            c1 = cpu_seconds(t.pid)
            target_cpu[op] = c1 - c0
            i.stdin.write("next\n")
            i.stdin.flush()
            c0 = cpu_seconds(t.pid)
        res = json.loads(i.stdout.readline())
        i.wait(timeout=60)
    finally:
        t.stdin.close()
        t.wait(timeout=60)
    gb = iters * SIZE / 1e9
    out = {"warmup_ok": ready["ready"], "mismatch": res["mismatch"]}
    for op in ("write", "read"):
        r = res[op]
        out[op] = {"gbit_s": round(gb * 8 / r["seconds"], 3), "failed": r["failed"],
                   "cpu_s_per_gb": round((r["cpu"] + target_cpu[op]) / gb, 3)}
    return out


def run_iperf(hosts, nss, seconds: float) -> dict | None:
    if not shutil.which("iperf3"):
        return None
    port = str(20000 + os.getpid() % 20000)
    end = None
    # A one-off server (-1) per attempt: a client that came too early (the
    # server not listening yet) or got an error report ("error" in its JSON,
    # no "sum_received") is not a measurement, and may have used the server up.
    for _ in range(50):
        server = subprocess.Popen(in_ns(nss[1], ["iperf3", "-s", "-1", "-B", hosts[1], "-p", port]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.1)
            client = subprocess.run(in_ns(nss[0], ["iperf3", "-c", hosts[1], "-p", port, "-t", str(seconds), "-J"]),
                                    capture_output=True, text=True)
            try:
                report = json.loads(client.stdout) if client.returncode == 0 else {}
            except json.JSONDecodeError:
                report = {}
        finally:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=30)
        if "sum_received" in report.get("end", {}):
            end = report["end"]
            break
    if end is None:
        return None
    secs = end["sum_received"]["seconds"]
    gb = end["sum_received"]["bytes"] / 1e9
    cpu = end["cpu_utilization_percent"]
    return {"gbit_s": round(end["sum_received"]["bits_per_second"] / 1e9, 3),
            "cpu_s_per_gb": round((cpu["host_total"] + cpu["remote_total"]) / 100 * secs / gb, 3)}


def median_of(rows: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}


def summarize(rows: list[dict]) -> dict:
    """Medians over the rounds; failures and mismatches summed; the first
    error if any round could not run."""
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        return {"error": errors[0]}
    out: dict = {"warmup_ok": all(r["warmup_ok"] for r in rows), "mismatch": any(r["mismatch"] for r in rows)}
    for op in ("write", "read"):
        out[op] = median_of([r[op] for r in rows], ("gbit_s", "cpu_s_per_gb"))
        out[op]["failed"] = sum(r[op]["failed"] for r in rows)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--engines", default="pdx,mooncake")
    ap.add_argument("--iperf-seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every engine and iperf3 (medians)")
    ap.add_argument("--min-fraction", type=float, default=0.0)
    ap.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    a = ap.parse_args()
    # TCP is what is measured: on loopback two pdx processes would otherwise
    # take the same-host link (the test bed sets this for its hosts too).
    os.environ.setdefault("PDX_SAME_HOST", "off")
    if a.role == "target":
        role_target(a.kind, a.host)
        return 0
    if a.role == "initiator":
        session, remote, iters = a.args.split(",")
        role_initiator(a.kind, a.host, session, int(remote), int(iters))
        return 0
    nss_env = os.environ.get("PDX_TESTBED_NS", "").split()
    if len(nss_env) >= 2:
        nss = nss_env[:2]
        hosts = os.environ["PDX_TESTBED_ADDRS"].split()[:2]
    else:
        nss, hosts = [None, None], ["127.0.0.1", "127.0.0.1"]
    rate = os.environ.get("PDX_TESTBED_RATE", "") if nss[0] else ""
    report = {"link": f"veth, {rate or 'uncapped'}" if nss[0] else "loopback", "size": SIZE, "iters": a.iters,
              "rounds": a.rounds}
    kinds = a.engines.split(",")
    runs: dict[str, list[dict]] = {kind: [] for kind in [*kinds, "iperf3"]}
    # Rounds interleave the engines and iperf3, so that a change in the
    # machine's load falls on all of them; medians are reported.
    for _ in range(a.rounds):
        for kind in kinds:
            try:
                runs[kind].append(run_engine(kind, hosts, nss, a.iters))
            except Exception as e:  # noqa: BLE001 - a side that cannot run is reported, not fatal
                runs[kind].append({"error": repr(e)})
        iperf = run_iperf(hosts, nss, a.iperf_seconds)
        if iperf:
            runs["iperf3"].append(iperf)
    for kind in kinds:
        report[kind] = summarize(runs[kind])
    report["iperf3"] = median_of(runs["iperf3"], ("gbit_s", "cpu_s_per_gb")) if runs["iperf3"] else None
    ok = True
    p = report.get("pdx", {})
    if "error" in p or p.get("mismatch") or any(p.get(op, {}).get("failed") for op in ("write", "read")):
        ok = False
    if report["iperf3"]:
        base = report["iperf3"]
        for kind in kinds:
            k = report[kind]
            if "error" not in k:
                k["of_iperf3"] = {op: {"throughput": round(k[op]["gbit_s"] / base["gbit_s"], 3),
                                       "cpu_per_gb": round(k[op]["cpu_s_per_gb"] / base["cpu_s_per_gb"], 3)}
                                  for op in ("write", "read")}
    if rate and a.min_fraction:
        cap = float(rate.lower().replace("gbit", "e9").replace("mbit", "e6")) / 1e9
        report["pdx_fraction_of_cap"] = {op: round(p[op]["gbit_s"] / cap, 3) for op in ("write", "read") if op in p}
        ok = ok and all(f >= a.min_fraction for f in report["pdx_fraction_of_cap"].values())
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
