#!/usr/bin/env python3
"""Bounded soak of the native engine: 4 pdx processes, many threads, mixed
sizes, sync and async, random SIGKILL / SIGSTOP / restart of peers, regions
withdrawn and registered again, every byte checksummed.

Every writer thread owns one slot in every peer's region, writes a fresh
pattern there and reads it back (sync or async); a wrong byte is always a
failure. A failed call is *expected* when, during the call (plus a margin
for the deadline), its target was killed, stopped or restarting, or had its
region withdrawn; any other failure is *unexplained*. The report lists
transfers, bytes, failures expected and seen, and each peer's peak RSS,
threads and fds against the baseline taken after start (back to baseline
once its work stops). Exit status 1 on any unexplained failure or mismatch.

With --netns (inside `scripts/netns-testbed --hosts 4`), peer i runs on host
i of the test bed (its own namespace and address), so every transfer crosses
a veth link. With --idle-gaps, the targets close data connections idle for
500 ms (PDX_IDLE_TIMEOUT_MS) and each writer thread pauses 0.5-1.5 s now and
then, so pooled lanes are closed under the initiators between transfers:
that must never show as a failure.
"""
import argparse
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

PEERS = 4
THREADS = 4
SLOT = 4 << 20  # one writer thread's slot in a region
REGION = PEERS * THREADS * SLOT
SIZES = [4096, 65536, 1 << 20, 4 << 20]
TIMEOUT_S = 2  # every engine timeout, so a stopped peer fails calls fast


def now() -> float:
    return time.time()


def proc_stats(pid: str = "self") -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields["VmRSS"].split()[0]) if "VmRSS" in fields else 0
    hwm_kib = int(fields["VmHWM"].split()[0]) if "VmHWM" in fields else 0
    return {
        "rss_mib": rss_kib // 1024,
        "peak_rss_mib": hwm_kib // 1024,
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


# ----------------------------------------------------------------- a peer


def peer_main(index: int, workdir: Path, duration: float, seed: int, host: str, idle_gaps: bool) -> None:
    import pdx

    rng = random.Random(seed)
    log = open(workdir / f"ops{index}.{os.getpid()}.jsonl", "a", buffering=1)
    before = proc_stats()  # before the engine: what closing it must return to
    engine = pdx.Engine(host, "tcp")
    region = ctypes.create_string_buffer(REGION)
    base = engine.register(region)
    me = {"session": engine.session_id, "base": base, "pid": os.getpid()}
    baseline = proc_stats()
    (workdir / f"peer{index}.json.tmp").write_text(json.dumps(me))
    os.replace(workdir / f"peer{index}.json.tmp", workdir / f"peer{index}.json")
    lock = threading.Lock()
    deadline = now() + duration
    peak = dict(baseline)

    def record(**kv) -> None:
        with lock:
            log.write(json.dumps(kv) + "\n")

    def targets() -> list:
        out = []
        for j in range(PEERS):
            try:
                out.append((j, json.loads((workdir / f"peer{j}.json").read_text())))
            except (OSError, ValueError):
                pass
        return out

    def worker(k: int) -> None:
        wrng = random.Random(seed * 100 + k)
        src = ctypes.create_string_buffer(SLOT)
        dst = ctypes.create_string_buffer(SLOT)
        while now() < deadline:
            if idle_gaps and wrng.random() < 0.05:
                time.sleep(wrng.uniform(0.5, 1.5))  # longer than the targets' idle timeout
            options = targets()
            if not options:
                time.sleep(0.1)
                continue
            j, peer = wrng.choice(options)
            size = wrng.choice(SIZES)
            remote = peer["base"] + (index * THREADS + k) * SLOT
            data = wrng.randbytes(size)
            ctypes.memmove(src, data, size)
            mode = wrng.choice(["sync", "async"])
            start = now()
            status, phase = 0, "write"
            try:
                if mode == "sync":
                    engine.write(peer["session"], src, remote, size)
                    phase = "read"
                    ctypes.memset(dst, 0, size)
                    engine.read(peer["session"], dst, remote, size)
                else:
                    half = size // 2
                    b = engine.submit(peer["session"], "write", [(src, remote, half), (ctypes.addressof(src) + half, remote + half, size - half)])
                    engine.wait(b, 60000)
                    failed = engine.status(b).failed
                    engine.free(b)
                    if failed:
                        raise pdx.PdxError(-20, "async write failed")
                    phase = "read"
                    ctypes.memset(dst, 0, size)
                    b = engine.submit(peer["session"], "read", [(dst, remote, size)])
                    engine.wait(b, 60000)
                    failed = engine.status(b).failed
                    engine.free(b)
                    if failed:
                        raise pdx.PdxError(-20, "async read failed")
                ok = zlib.crc32(ctypes.string_at(dst, size)) == zlib.crc32(data)
                record(t0=start, t1=now(), target=j, pid=peer["pid"], mode=mode, size=size, status=0, crc_ok=ok)
            except pdx.PdxError as e:
                status = e.status
                record(t0=start, t1=now(), target=j, pid=peer["pid"], mode=mode, size=size, status=status, phase=phase)

    def withdrawer() -> None:
        # Now and then withdraw the region and register it again (zeroed:
        # the application reused it), logging the interval.
        while now() < deadline:
            time.sleep(rng.uniform(3, 8))
            if now() >= deadline:
                break
            t0 = now()
            try:
                engine.unregister(base)
            except pdx.PdxError as e:
                record(withdraw_failed=e.name, t0=t0)
                continue
            ctypes.memset(region, 0, REGION)
            time.sleep(rng.uniform(0.05, 0.3))
            engine.register(region)
            record(withdrawn_by=index, pid=os.getpid(), t0=t0, t1=now())

    def sampler() -> None:
        while now() < deadline:
            s = proc_stats()
            for key in ("peak_rss_mib", "threads", "fds"):
                peak[key] = max(peak[key], s[key])
            time.sleep(0.5)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    threads += [threading.Thread(target=withdrawer), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(6.5)  # idle extra workers leave after 5 s
    final = proc_stats()
    engine.close()
    closed = proc_stats()
    record(report=index, before=before, baseline=baseline, peak=peak, final=final, closed=closed)
    log.close()


# ------------------------------------------------------------ coordinator


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--netns", action="store_true", help="one peer per host of scripts/netns-testbed")
    ap.add_argument("--idle-gaps", action="store_true", help="500 ms idle timeout, writers pausing past it")
    ap.add_argument("--peer", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer is not None:
        peer_main(args.peer, args.workdir, args.duration, args.seed, args.host, args.idle_gaps)
        return 0
    hosts = [("", "127.0.0.1")] * PEERS
    if args.netns:
        names, addrs = os.environ.get("PDX_TESTBED_NS", "").split(), os.environ.get("PDX_TESTBED_ADDRS", "").split()
        if len(names) < PEERS:
            print(f"SKIP: soak --netns needs scripts/netns-testbed --hosts {PEERS}", file=sys.stderr)
            return 77
        hosts = list(zip(names, addrs))[:PEERS]
    import tempfile

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pdx-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "error")  # failed transfers are expected here
    for var in ("PDX_PROGRESS_TIMEOUT_MS", "PDX_STATUS_TIMEOUT_MS", "PDX_HANDSHAKE_TIMEOUT_MS", "PDX_CONNECT_TIMEOUT_MS", "PDX_LANE_WAIT_TIMEOUT_MS"):
        env[var] = str(TIMEOUT_S * 1000)
    if args.idle_gaps:
        env["PDX_IDLE_TIMEOUT_MS"] = "500"
    rng = random.Random(args.seed)
    end = now() + args.duration
    procs = {}
    faults = []  # (pid, t0, t1, kind)

    def start(i: int, remaining: float) -> None:
        (workdir / f"peer{i}.json").unlink(missing_ok=True)
        ns, host = hosts[i]
        cmd = [sys.executable, __file__, "--peer", str(i), "--workdir", str(workdir), "--duration", str(max(remaining, 1.0)), "--seed", str(rng.randrange(1 << 30)), "--host", host]
        if args.idle_gaps:
            cmd.append("--idle-gaps")
        if ns:
            cmd = ["ip", "netns", "exec", ns, *cmd]
        procs[i] = subprocess.Popen(cmd, env=env)
        while not (workdir / f"peer{i}.json").exists():
            if procs[i].poll() is not None:
                raise SystemExit(f"peer {i} exited at start ({procs[i].returncode})")
            time.sleep(0.05)

    for i in range(PEERS):
        start(i, end - now())
    kills = stops = 0
    while now() < end - 8:
        time.sleep(rng.uniform(2, 5))
        if now() >= end - 8:
            break
        i = rng.randrange(PEERS)
        p = procs[i]
        if rng.random() < 0.5:
            t0 = now()
            p.send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.5, 3))
            p.send_signal(signal.SIGCONT)
            faults.append((p.pid, t0, now(), "stop"))
            stops += 1
        else:
            t0 = now()
            (workdir / f"peer{i}.json").unlink(missing_ok=True)
            p.send_signal(signal.SIGKILL)
            p.wait()
            time.sleep(rng.uniform(0.2, 1))
            start(i, end - now())
            faults.append((p.pid, t0, now(), "kill"))
            kills += 1
    for p in procs.values():
        p.wait(timeout=120)

    ops, reports, withdrawals = [], [], []
    for f in workdir.glob("ops*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            if "report" in rec:
                reports.append(rec)
            elif "withdrawn_by" in rec:
                withdrawals.append(rec)
            elif "status" in rec:
                ops.append(rec)
    margin = 1.1 * TIMEOUT_S + 1.0

    def explained(op) -> bool:
        t0, t1 = op["t0"], op["t1"] + margin
        for pid, f0, f1, _ in faults:
            if pid == op["pid"] and f0 <= t1 and op["t0"] <= f1 + margin:
                return True
        for w in withdrawals:
            if w["pid"] == op["pid"] and w["t0"] <= t1 and t0 <= w["t1"] + margin:
                return True
        return False

    ok = [o for o in ops if o["status"] == 0 and o["crc_ok"]]
    bad_crc = [o for o in ops if o["status"] == 0 and not o["crc_ok"] and not explained(o)]
    failed = [o for o in ops if o["status"] != 0]
    expected = [o for o in failed if explained(o)]
    unexplained = [o for o in failed if not explained(o)]
    moved = sum(2 * o["size"] for o in ok)
    where = f"{PEERS} hosts ({', '.join(h for _, h in hosts)})" if args.netns else "loopback"
    print(f"soak: {args.duration:.0f} s, {PEERS} peers x {THREADS} threads on {where}, {kills} kills, {stops} stops, {len(withdrawals)} withdrawals{', idle gaps' if args.idle_gaps else ''}")
    print(f"transfers: {len(ops)} write+read pairs, {len(ok)} verified, {moved / 1e9:.2f} GB moved and checksummed")
    print(f"failures: {len(failed)} seen, {len(expected)} expected, {len(unexplained)} unexplained; {len(bad_crc)} unexplained checksum mismatches")
    for o in (unexplained + bad_crc)[:10]:
        print("  unexplained:", o)
    back = True
    for r in sorted(reports, key=lambda r: r["report"]):
        pre, b, pk, fi, cl = r["before"], r["baseline"], r["peak"], r["final"], r["closed"]
        print(
            f"peer {r['report']}: peak RSS {pk['peak_rss_mib']} MiB; threads {pre['threads']} before the engine, "
            f"{b['threads']} started, peak {pk['threads']}, {fi['threads']} idle, {cl['threads']} closed; "
            f"fds {pre['fds']} / {b['fds']} / peak {pk['fds']} / {fi['fds']} / {cl['fds']}"
        )
        back &= cl["threads"] <= pre["threads"] and cl["fds"] <= pre["fds"]
    print("resources back to baseline:", "yes" if back else "NO")
    good = not unexplained and not bad_crc and back and len(ok) > 0
    print("soak:", "PASS" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
