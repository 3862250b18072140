#!/usr/bin/env python3
"""What a metadata directory costs and what its leases buy (docs/metadata.md).

    PDX_LIB=target/release PYTHONPATH=python python3 bench/metadata_modes.py [--json out.json]

Starts Mooncake's HTTP metadata server and etcd on free ports (both must be
installed), then for each of P2PHANDSHAKE, HTTP and etcd:

- time from ``initialize`` of a new engine to its first verified 4 KiB
  write (written, read back, compared) to a peer it never talked to: the
  median of 20 new engines;
- throughput of 64 MiB writes (8 of them, sync, one at a time, after one
  to open the connections) from a new engine to the same peer, the median
  of 5 rounds interleaved across the modes, over TCP (``PDX_SAME_HOST=off``: the directory
  does not touch the data path, and TCP is what crosses hosts);

and, through etcd, seconds until a ``kill -9``'d engine's keys are gone:
pdx (lease, default 10 s) against Mooncake's wheel (no lease).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests" / "metadata"))
os.environ["PDX_SAME_HOST"] = "off"
os.environ["MC_FORCE_TCP"] = "1"

import servers  # noqa: E402
from servers import Etcd, HttpMetadata, Node, free_port  # noqa: E402

from pdx.mooncake import TransferEngine  # noqa: E402


def start_http() -> HttpMetadata:
    import shutil
    import subprocess

    port = free_port()
    exe = shutil.which("mooncake_http_metadata_server")
    assert exe, "mooncake_http_metadata_server is not installed"
    proc = subprocess.Popen([exe, "--port", str(port), "--host", "127.0.0.1", "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = HttpMetadata(port, proc)
    servers.wait_until(lambda: server.get("x") is None, 30, "HTTP metadata server")
    return server


def start_etcd(data: str) -> Etcd:
    import shutil
    import subprocess

    client, peer = free_port(), free_port()
    exe = shutil.which("etcd")
    assert exe, "etcd is not installed"
    proc = subprocess.Popen(
        [exe, "--name=b", f"--data-dir={data}", f"--listen-client-urls=http://127.0.0.1:{client}",
         f"--advertise-client-urls=http://127.0.0.1:{client}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}", f"--initial-cluster=b=http://127.0.0.1:{peer}",
         "--log-level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Etcd(client, proc)
    servers.wait_until(lambda: server.get("x") is None, 30, "etcd")
    return server


def first_write_ms(metadata: str, target: str, runs: int) -> list[float]:
    """Per new engine: ms from initialize to a verified 4 KiB write to `target`."""
    times = []
    payload = os.urandom(4096)
    for _ in range(runs):
        t0 = time.perf_counter()
        engine = TransferEngine()
        host = "127.0.0.1" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{free_port()}"
        assert engine.initialize(host, metadata, "tcp", "") == 0
        local = engine.allocate_managed_buffer(8192)
        remote = engine.get_first_buffer_address(target)
        engine.write_bytes_to_buffer(local, payload, 4096)
        assert engine.transfer_sync_write(target, local, remote, 4096) == 0
        assert engine.transfer_sync_read(target, local + 4096, remote, 4096) == 0
        assert engine.read_bytes_from_buffer(local + 4096, 4096) == payload
        times.append((time.perf_counter() - t0) * 1000)
        engine._engine.close()  # type: ignore[union-attr]
    return times


def write_gbps(metadata: str, target: str, block: int, count: int) -> float:
    engine = TransferEngine()
    host = "127.0.0.1" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{free_port()}"
    assert engine.initialize(host, metadata, "tcp", "") == 0
    local = engine.allocate_managed_buffer(block)
    engine.write_bytes_to_buffer(local, os.urandom(1 << 20) * (block >> 20), block)
    remote = engine.get_first_buffer_address(target)
    assert engine.transfer_sync_write(target, local, remote, block) == 0  # warm: connections open
    t0 = time.perf_counter()
    for _ in range(count):
        assert engine.transfer_sync_write(target, local, remote, block) == 0
    seconds = time.perf_counter() - t0
    engine._engine.close()  # type: ignore[union-attr]
    return block * count / seconds / 1e9


def seconds_until_gone(store: Etcd, key: str, limit: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if store.get(key) is None:
            return round(time.monotonic() - t0, 2)
        time.sleep(0.1)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import tempfile

    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as data:
        http, etcd = start_http(), start_etcd(data)
        try:
            modes = {"P2PHANDSHAKE": "P2PHANDSHAKE", "HTTP": http.url, "etcd": f"etcd://{etcd.endpoint}"}
            nodes, targets = {}, {}
            for label, metadata in modes.items():
                name = f"127.0.0.1:{free_port()}"
                node = Node("pdx", "target", name, metadata, env={"NODE_TARGET_BYTES": str(64 << 20)})
                _, rpc_port = node.ready()
                nodes[label] = node
                targets[label] = f"127.0.0.1:{rpc_port}" if label == "P2PHANDSHAKE" else name
            try:
                for label, metadata in modes.items():
                    times = first_write_ms(metadata, targets[label], args.runs)
                    results[label] = {"first_write_ms_median": round(statistics.median(times), 2),
                                      "first_write_ms_all": [round(x, 2) for x in times]}
                # Rounds interleaved across the modes: the machine's load falls on each alike.
                rates: dict[str, list[float]] = {label: [] for label in modes}
                for _ in range(args.rounds):
                    for label, metadata in modes.items():
                        rates[label].append(write_gbps(metadata, targets[label], 64 << 20, 8))
                for label in modes:
                    entry = results[label]
                    assert isinstance(entry, dict)
                    entry["write_64MiB_GBps_median"] = round(statistics.median(rates[label]), 3)
                    entry["write_64MiB_GBps_all"] = [round(x, 3) for x in rates[label]]
                    print(label, entry["first_write_ms_median"], "ms;", entry["write_64MiB_GBps_median"], "GB/s",
                          flush=True)
            finally:
                for node in nodes.values():
                    node.kill()
            gone: dict[str, float | None] = {}
            for impl in ("pdx", "mooncake"):
                name = f"127.0.0.1:{free_port()}"
                with Node(impl, "target", name, etcd.endpoint) as t:
                    t.ready()
                    t.proc.kill()
                gone[impl] = seconds_until_gone(etcd, f"mooncake/ram/{name}", 30)
                print(f"{impl}: keys gone after kill -9: {gone[impl]}", flush=True)
            results["kill9_keys_gone_s"] = gone
        finally:
            http.stop()
            etcd.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
