#!/usr/bin/env python3
"""What a dead engine's descriptor costs its callers in HTTP mode (run by
test_dead_descriptor.py inside a network namespace of its own).

Mooncake's HTTP metadata server has no leases, so a killed engine's keys stay.
This script starts that server and a pdx target on the namespace's loopback,
kills the target (SIGKILL: nothing is cleaned up), then asks for its segment
from an engine that knew it and from one that never met it. Around each call
it reads the namespace's own TCP counters (/proc/net/snmp: ActiveOpens,
AttemptFails), the kernel's count of connects tried and refused, and prints
one JSON object: ``{"calls": [{"who", "opens", "refused", "seconds", "error"}]}``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import pdx  # noqa: E402
from servers import NODE, PACKAGE_DIR, free_port, wait_until  # noqa: E402

DEAD = "127.0.0.1:17777"


def tcp_counters() -> tuple[int, int]:
    """(connects tried, connects refused or timed out) in this namespace so far."""
    rows = [line.split() for line in open("/proc/net/snmp") if line.startswith("Tcp:")]
    values = dict(zip(rows[0][1:], map(int, rows[1][1:])))
    return values["ActiveOpens"], values["AttemptFails"]


def call(who: str, engine: pdx.Engine, buf: bytearray, remote: int) -> dict:
    opens, fails = tcp_counters()
    start = time.monotonic()
    error = None
    try:
        engine.write(DEAD, buf, remote)
    except pdx.PdxError as e:
        error = str(e)
    now_opens, now_fails = tcp_counters()
    seconds = round(time.monotonic() - start, 3)
    return {"who": who, "opens": now_opens - opens, "refused": now_fails - fails, "seconds": seconds, "error": error}


def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    port = free_port()
    server = subprocess.Popen(
        [shutil.which("mooncake_http_metadata_server"), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metadata"
    wait_until(lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None, 30, "the HTTP metadata server")
    env = {**os.environ, "PYTHONPATH": PACKAGE_DIR}
    target = subprocess.Popen(
        [sys.executable, str(NODE), "pdx", "target", DEAD, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        ready = target.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise SystemExit(f"the target did not start: {ready}")
        remote = int(ready[1])
        knew = pdx.Engine("127.0.0.1:17778", "tcp", metadata_server=url)
        knew_buf = bytearray(4096)
        knew.register(knew_buf)
        knew.write(DEAD, knew_buf, remote)  # alive: the peer is cached with its lanes
        target.kill()
        target.wait()
        calls = [call("knew it", knew, knew_buf, remote) for _ in range(3)]
        stranger = pdx.Engine("127.0.0.1:17779", "tcp", metadata_server=url)
        stranger_buf = bytearray(4096)
        stranger.register(stranger_buf)
        calls += [call("never met it", stranger, stranger_buf, remote) for _ in range(3)]
        print(json.dumps({"calls": calls}), flush=True)
        knew.close()
        stranger.close()
    finally:
        target.kill()
        server.kill()


if __name__ == "__main__":
    main()
