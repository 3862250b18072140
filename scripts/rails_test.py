#!/usr/bin/env python3
"""Multi-rail TCP over real links (issue 34): two network namespaces joined
by several veth links, each capped both ways with tbf, one pdx engine in
each with `PDX_TCP_RAILS` (auto unless `--rails` says otherwise) and
`PDX_SAME_HOST=off`. The initiator alternates 64 MiB writes and reads for
`--seconds` and the report gives Gbit/s, failed transfers, both sides' CPU
seconds per GB, the bytes per rail from `pdx_peer_info`, and per-second
throughput.

    sudo PYTHONPATH=python python3 scripts/rails_test.py --rates 1gbit,1gbit
    ... --rates 1gbit,4gbit                  unequal links
    ... --rates 1gbit,1gbit --kill 2:3:6     link 2 down on both ends at 3 s, up at 6 s
    ... --kill 2:3:6 --blackhole             link 2 drops every packet instead (routes stay)
    ... --rates 1gbit,1gbit --dead-rail      the target also advertises a rail nobody reaches
    ... --rates 1gbit,1gbit --rails ''       PDX_TCP_RAILS unset: one address
    ... --streams 2 --direction write        two threads, each its own loop of writes
    ... --target-pdx OLD/python:OLD/libpdx.so     the target runs another pdx build
    ... --initiator-pdx OLD/python:OLD/libpdx.so  the initiator does (say, one from
                                                before rails)

The namespaces and links are made here, torn down on exit, and carry only
10.231.(10+k).0/24 addresses inside them. Needs root; exit 77 (SKIP) if not.
Prints one JSON report.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time

SIZE = 64 << 20
HERE = os.path.abspath(__file__)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def rate_bits(rate: str) -> int:
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    r = rate.lower().removesuffix("bit")
    return int(float(r[:-1]) * units[r[-1]]) if r[-1] in units else int(r)


class Bed:
    """Namespaces `<tag>a` (initiator) and `<tag>b` (target) joined by one
    veth pair per rate: link k has 10.231.(10+k).1 (a) and .2 (b)."""

    def __init__(self, rates: list[str], dead_rail: bool):
        self.tag = f"pr{os.getpid()}"
        self.a, self.b = self.tag + "a", self.tag + "b"
        self.made: list[str] = []
        try:
            self.make(rates, dead_rail)
        except BaseException:
            self.close()
            raise

    def tbf(self, ns: str, dev: str, rate: str, verb: str = "add") -> None:
        burst = max(rate_bits(rate) // 8 // 500, 131072)
        sh("ip", "netns", "exec", ns, "tc", "qdisc", verb, "dev", dev, "root", "tbf", "rate", rate,
           "burst", str(burst), "latency", "20ms")

    def make(self, rates: list[str], dead_rail: bool) -> None:
        self.rates = rates
        for ns in (self.a, self.b):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for k, rate in enumerate(rates, 1):
            ea, eb = f"{self.tag}a{k}", f"{self.tag}b{k}"
            sh("ip", "link", "add", ea, "netns", self.a, "type", "veth", "peer", "name", eb, "netns", self.b)
            for ns, dev, host in ((self.a, ea, 1), (self.b, eb, 2)):
                sh("ip", "-n", ns, "addr", "add", f"10.231.{10 + k}.{host}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                self.tbf(ns, dev, rate)
        if dead_rail:
            # An address the target has and advertises that no link reaches.
            # (A veth pair inside the target whose other end stays down.)
            sh("ip", "-n", self.b, "link", "add", "dead0", "type", "veth", "peer", "name", "dead1")
            sh("ip", "-n", self.b, "addr", "add", "10.231.30.2/24", "dev", "dead0")
            sh("ip", "-n", self.b, "link", "set", "dead0", "up")
        self.links = len(rates)

    def link(self, k: int, up: bool, blackhole: bool = False) -> None:
        if blackhole:
            # The link stays up with its routes and drops everything (a
            # silent path: a connect times out rather than failing).
            for ns, dev in ((self.a, f"{self.tag}a{k}"), (self.b, f"{self.tag}b{k}")):
                if up:
                    self.tbf(ns, dev, self.rates[k - 1], "replace")
                else:
                    sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                       "8bit", "burst", "1600", "limit", "1")
            return
        state = "up" if up else "down"
        sh("ip", "-n", self.a, "link", "set", f"{self.tag}a{k}", state)
        sh("ip", "-n", self.b, "link", "set", f"{self.tag}b{k}", state)

    def close(self) -> None:
        for ns in self.made:
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def engine(host: str):
    import pdx

    buf = mmap.mmap(-1, SIZE)
    buf.write(os.urandom(SIZE))
    e = pdx.Engine(host, "tcp")
    e.register(buf)
    return pdx, e, buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


def role_target(host: str) -> None:
    _, e, _, addr = engine(host)
    print(json.dumps({"session": e.session_id, "addr": addr}), flush=True)
    sys.stdin.readline()


def role_initiator(host: str, session: str, remote: int, seconds: float, streams: int, direction: str) -> None:
    import threading

    pdx, e, buf, local = engine(host)
    ok = pdx.lib.pdx_transfer_sync_write(e.handle, session.encode(), local, remote, SIZE) == 0
    print(json.dumps({"ready": ok, "t": time.monotonic()}), flush=True)
    sys.stdin.readline()
    done: list[tuple[float, float, int]] = []
    t_end = time.monotonic() + seconds

    def loop(first: int) -> None:
        # Each stream its own loop of synchronous transfers (ctypes lets go
        # of the GIL during the call); the bytes of all are the same buffers.
        k = first
        while time.monotonic() < t_end:
            write = {"write": True, "read": False}.get(direction, k % 2 == 0)
            fn = pdx.lib.pdx_transfer_sync_write if write else pdx.lib.pdx_transfer_sync_read
            t0 = time.monotonic()
            rc = fn(e.handle, session.encode(), local, remote, SIZE)
            done.append((t0, time.monotonic(), rc))
            k += 1

    threads = [threading.Thread(target=loop, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.sort()
    # An older build (--initiator-pdx) may have no peer info.
    info = e.peer_info(session) if hasattr(e, "peer_info") else None
    print(json.dumps({"transfers": done, "peer_info": info}), flush=True)


def ns_cmd(ns: str, argv: list[str], env: dict[str, str]) -> list[str]:
    return ["ip", "netns", "exec", ns, "env", *[f"{k}={v}" for k, v in env.items()], *argv]


def run(args: argparse.Namespace) -> dict:
    rates = args.rates.split(",")
    bed = Bed(rates, args.dead_rail)
    env = {"PDX_SAME_HOST": "off", "PYTHONPATH": os.environ.get("PYTHONPATH", "python"),
           "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    if args.rails:
        env["PDX_TCP_RAILS"] = args.rails
    me = [sys.executable, HERE]
    t = i = None
    try:
        target_env = dict(env)
        if args.target_pdx:
            target_env["PYTHONPATH"], target_env["PDX_LIB"] = args.target_pdx.split(":", 1)
        t = subprocess.Popen(ns_cmd(bed.b, [*me, "--role", "target", "--host", "10.231.11.2"], target_env),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        info = json.loads(t.stdout.readline())
        initiator_env = dict(env)
        if args.initiator_pdx:
            initiator_env["PYTHONPATH"], initiator_env["PDX_LIB"] = args.initiator_pdx.split(":", 1)
        i = subprocess.Popen(ns_cmd(bed.a, [*me, "--role", "initiator", "--host", "10.231.11.1", "--args",
                                            f"{info['session']},{info['addr']},{args.seconds},{args.streams},{args.direction}"], initiator_env),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = json.loads(i.stdout.readline())
        c0 = cpu_seconds(t.pid) + cpu_seconds(i.pid)
        t0 = time.monotonic()
        i.stdin.write("go\n")
        i.stdin.flush()
        if args.kill:
            k, down_at, up_at = (float(x) for x in args.kill.split(":"))
            time.sleep(max(0.0, t0 + down_at - time.monotonic()))
            bed.link(int(k), False, args.blackhole)
            time.sleep(max(0.0, t0 + up_at - time.monotonic()))
            bed.link(int(k), True, args.blackhole)
        res = json.loads(i.stdout.readline())
        c1 = cpu_seconds(t.pid) + cpu_seconds(i.pid)
        i.wait(timeout=30)
        log = i.stderr.read()
    finally:
        for p in (i, t):
            if p is not None and p.poll() is None:
                p.kill()
        bed.close()
    xfers = res["transfers"]
    moved = sum(SIZE for (_, _, rc) in xfers if rc == 0)
    span = max(x[1] for x in xfers) - xfers[0][0] if xfers else 0.0
    per_second = []
    for s in range(int(args.seconds) + 1):
        lo, hi = t0 + s, t0 + s + 1
        # Bytes of each transfer spread evenly over its time, cut to the second.
        b = sum(SIZE * max(0.0, min(hi, e) - max(lo, s0)) / max(e - s0, 1e-9) for (s0, e, rc) in xfers if rc == 0)
        per_second.append(round(b * 8 / 1e9, 2))
    rails = (res["peer_info"] or {}).get("rails")
    return {
        "rates": rates, "rails_option": args.rails, "kill": args.kill, "blackhole": args.blackhole, "streams": args.streams,
        "direction": args.direction, "ready": ready["ready"],
        "transfers": len(xfers), "failed": sum(1 for x in xfers if x[2] != 0),
        "gbit_s": round(moved * 8 / span / 1e9, 3) if span else 0.0,
        "cpu_s_per_gb": round((c1 - c0) / (moved / 1e9), 3) if moved else None,
        "per_second_gbit": per_second, "rails": rails,
        "rail_log": [line for line in log.splitlines() if "rail" in line][-12:],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["target", "initiator"])
    ap.add_argument("--host")
    ap.add_argument("--args")
    ap.add_argument("--rates", default="1gbit,1gbit")
    ap.add_argument("--rails", default="auto")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--streams", type=int, default=1, help="threads each running its own loop of transfers")
    ap.add_argument("--direction", choices=["alternate", "write", "read"], default="alternate",
                    help="writes and reads in turn (each stream), or only one of them")
    ap.add_argument("--kill", default="", help="K:DOWN_S:UP_S: link K down on both ends at DOWN_S, up at UP_S")
    ap.add_argument("--blackhole", action="store_true",
                    help="--kill drops every packet of the link (tbf at 8 bit/s) instead of setting it down")
    ap.add_argument("--dead-rail", action="store_true")
    ap.add_argument("--target-pdx", default="", metavar="PYTHONPATH:LIB",
                    help="the target's pdx package directory and libpdx.so (another build)")
    ap.add_argument("--initiator-pdx", default="", metavar="PYTHONPATH:LIB",
                    help="the initiator's pdx package directory and libpdx.so (another build)")
    args = ap.parse_args()
    if args.role == "target":
        role_target(args.host)
        return 0
    if args.role == "initiator":
        session, remote, seconds, streams, direction = args.args.split(",")
        role_initiator(args.host, session, int(remote), float(seconds), int(streams), direction)
        return 0
    if os.geteuid() != 0:
        print("SKIP: rails_test needs root (network namespaces)", file=sys.stderr)
        return 77
    print(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
