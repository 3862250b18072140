#!/usr/bin/env python3
"""What peer authentication (PDX_PEER_SECRET_FILE, issue 23) costs.

Three figures, each without and with a secret, in one run:
- handshake: the time of one probe (one handshake connection: connect,
  with a secret the challenge and both proofs, the request and reply);
- first transfer: a 4 KiB write from a fresh initiator engine (descriptor
  fetch, a new data connection with its hello, the write);
- throughput: batches of 64 x 1 MiB writes on open connections, rounds of
  "off" and "on" interleaved so that both see the same machine.

    python3 bench/auth_cost.py [--rounds 5] [--probes 2000]

Loopback, two engines in this process (the 2-core machine runs both sides).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import pdx  # noqa: E402

MiB = 1 << 20


def options(secret: str | None) -> dict[str, str]:
    return {"peer_secret_file": secret} if secret else {}


def handshakes(secret: str | None, n: int) -> list[float]:
    with pdx.Engine("127.0.0.1", "tcp", **options(secret)) as a, \
            pdx.Engine("127.0.0.1", "tcp", **options(secret)) as b:
        for _ in range(50):
            a.probe(b.session_id)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            a.probe(b.session_id)
            out.append(time.perf_counter() - t)
        return out


def first_transfers(secret: str | None, n: int) -> list[float]:
    out = []
    with pdx.Engine("127.0.0.1", "tcp", **options(secret)) as b:
        pool = bytearray(4096)
        remote = b.register(pool)
        data = b"x" * 4096
        for _ in range(n):
            with pdx.Engine("127.0.0.1", "tcp", **options(secret)) as a:
                t = time.perf_counter()
                a.write(b.session_id, data, remote)
                out.append(time.perf_counter() - t)
    return out


def throughput(a: pdx.Engine, b: pdx.Engine, remote: int, src: bytearray, batches: int) -> tuple[float, float]:
    """GB/s of wall time, and CPU seconds (this process: both engines) per GB."""
    entries = [(memoryview(src)[i * MiB:(i + 1) * MiB], remote + i * MiB) for i in range(64)]
    a.batch_write(b.session_id, entries)  # warm: lanes open
    t, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        a.batch_write(b.session_id, entries)
    gb = batches * 64 * MiB / 1e9
    return gb / (time.perf_counter() - t), (time.process_time() - cpu) / gb


def summary(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p50, p99 = xs[len(xs) // 2], xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"{name}: median {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--probes", type=int, default=2000)
    ap.add_argument("--fresh", type=int, default=100)
    ap.add_argument("--batches", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        secret = os.path.join(d, "secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(48))
        os.chmod(secret, 0o600)
        for label, s in (("off", None), ("on", secret)):
            print(summary(f"handshake (probe), secret {label}", handshakes(s, args.probes)))
        for label, s in (("off", None), ("on", secret)):
            print(summary(f"first 4 KiB write from a new engine, secret {label}", first_transfers(s, args.fresh)))
        pairs = {}
        pools = {}
        for label, s in (("off", None), ("on", secret)):
            a, b = pdx.Engine("127.0.0.1", "tcp", **options(s)), pdx.Engine("127.0.0.1", "tcp", **options(s))
            pool = bytearray(64 * MiB)
            pools[label] = (pool, b.register(pool))
            pairs[label] = (a, b)
        src = bytearray(os.urandom(MiB)) * 64
        rates: dict[str, list[float]] = {"off": [], "on": []}
        cpus: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.rounds):
            for label in (("off", "on") if i % 2 == 0 else ("on", "off")):
                a, b = pairs[label]
                rate, cpu = throughput(a, b, pools[label][1], src, args.batches)
                rates[label].append(rate)
                cpus[label].append(cpu)
        for label in ("off", "on"):
            r = rates[label]
            print(f"throughput 64 x 1 MiB writes, secret {label}: median {statistics.median(r):.2f} GB/s, "
                  f"{statistics.median(cpus[label]):.3f} CPU s/GB (rounds: {', '.join(f'{x:.2f}' for x in r)})")
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        print(f"with the secret / without: throughput {on / off:.3f}, "
              f"CPU per GB {statistics.median(cpus['on']) / statistics.median(cpus['off']):.3f}")
        for a, b in pairs.values():
            a.close()
            b.close()


if __name__ == "__main__":
    main()
