#!/usr/bin/env python3
"""How long a new engine takes to start while its etcd cluster elects a new
leader (docs/metadata.md, "Running against an etcd cluster").

    PDX_LIB=target/release PYTHONPATH=python python3 bench/metadata_election.py [--rounds 5] [--engines 3]

Each round starts three etcd members on loopback (temporary data
directories, free ports, etcd's default heartbeat and election timeouts),
lists them with the leader first, kills the leader with SIGKILL and at once
starts `--engines` new pdx engines (in threads, one per engine), each
publishing itself through the cluster. Prints, for every engine, whether
its `init` succeeded and how long it took, then the median and the worst of
the successful ones and the count of failures. Run it against two builds
(PDX_LIB) to compare them; nothing here is timed by a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests" / "metadata"))
sys.path.insert(0, str(HERE.parent / "python"))

from servers import EtcdCluster, free_port  # noqa: E402

import pdx  # noqa: E402
from pdx.binding import PdxError  # noqa: E402


def one_round(exe: str, engines: int) -> list[tuple[bool, float, str]]:
    with tempfile.TemporaryDirectory(prefix="pdx-election-") as data:
        cluster = EtcdCluster(exe, data)
        try:
            for i in range(3):
                cluster.start(i)
            leader = cluster.wait_healthy()
            order = [leader] + [i for i in range(3) if i != leader]
            metadata = "etcd://" + ",".join(cluster.endpoints[i] for i in order)
            out: list[tuple[bool, float, str]] = []
            kept: list[pdx.Engine] = []

            def start() -> None:
                t0 = time.monotonic()
                try:
                    kept.append(pdx.Engine(f"127.0.0.1:{free_port()}", "tcp", metadata_server=metadata))
                    out.append((True, time.monotonic() - t0, ""))
                except PdxError as e:
                    out.append((False, time.monotonic() - t0, str(e)[-160:]))

            cluster.kill(leader)
            threads = [threading.Thread(target=start) for _ in range(engines)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for engine in kept:
                engine.close()
            return out
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("etcd")
    if exe is None:
        sys.exit("etcd (Debian's etcd-server) is not installed")
    results: list[tuple[bool, float, str]] = []
    for r in range(args.rounds):
        got = one_round(exe, args.engines)
        for ok, seconds, why in got:
            print(f"round {r + 1}: {'ok    ' if ok else 'FAILED'} {seconds * 1000:7.0f} ms {why}")
        results += got
    ok = [s for good, s, _ in results if good]
    failed = len(results) - len(ok)
    if ok:
        print(f"started: {len(ok)} of {len(results)}; median {statistics.median(ok) * 1000:.0f} ms, "
              f"worst {max(ok) * 1000:.0f} ms")
    print(f"failed init: {failed} of {len(results)}")


if __name__ == "__main__":
    main()
