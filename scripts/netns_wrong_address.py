#!/usr/bin/env python3
"""A peer whose descriptor advertises a data address nobody answers at, over
a real link (run inside scripts/netns-testbed, 2 hosts):

    scripts/netns-testbed -- env PYTHONPATH=$PWD/python python3 scripts/netns_wrong_address.py

Host 2 runs a handshake server that answers metadata requests with a
descriptor whose data address is PDX_TESTBED_DEAD (in the bed's subnet, owned
by no host: ARP gets no answer, so a connect hears nothing). Host 1's pdx
engine (connect timeout 1 s) writes to it three times, with a pdx-style
descriptor (an instance to confirm) and a Mooncake-style one (none): each
attempt must fail with PDX_ERR_PEER_UNREACHABLE within connect timeout +
1.5 s, its message naming the ip:port it tried and the session. Prints one
JSON line per attempt; exit status 1 on any miss.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

CONNECT_TIMEOUT_MS = 1000
BOUND_S = CONNECT_TIMEOUT_MS / 1000 + 1.5
DEAD_PORT = 15000


def serve_fake(host: str, dead: str, pdx_like: bool) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, 0))
    srv.listen(64)
    session = f"{host}:{srv.getsockname()[1]}"
    desc = {"buffers": [{"addr": 1 << 30, "length": 1 << 20, "name": session}], "name": session,
            "protocol": "tcp", "rdma_server_name": "", "tcp_data_host": dead, "tcp_data_port": DEAD_PORT,
            "tcp_proto_version": 2}
    if pdx_like:
        desc["pdx_instance"] = "0123abcd"
    body = json.dumps(desc)
    print(json.dumps({"session": session}), flush=True)

    def one(c: socket.socket) -> None:
        with c:
            try:
                (length,) = struct.unpack("<Q", c.recv(8, socket.MSG_WAITALL))
                frame = c.recv(length, socket.MSG_WAITALL)
                kind = frame[0] if frame and frame[0] <= 3 else None
                reply = body if kind == 1 else '{"status": "success"}'
                out = (bytes([kind]) if kind is not None else b"") + reply.encode() + b"\n"
                c.sendall(struct.pack("<Q", len(out)) + out)
            except OSError:
                pass

    while True:
        c, _ = srv.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()


def initiate(host: str, session: str, dead: str) -> int:
    import pdx

    engine = pdx.Engine(host, "tcp", connect_timeout_ms=CONNECT_TIMEOUT_MS)
    buf = bytearray(4096)
    misses = 0
    for attempt in range(3):
        t0 = time.monotonic()
        err = None
        try:
            engine.write(session, buf, 1 << 30, len(buf))
        except pdx.PdxError as e:
            err = e
        took = time.monotonic() - t0
        named = f"{dead}:{DEAD_PORT}"
        ok = (err is not None and err.status == pdx.PDX_ERR_PEER_UNREACHABLE and took < BOUND_S
              and named in str(err) and session in str(err))
        misses += 0 if ok else 1
        print(json.dumps({"attempt": attempt, "ok": ok, "seconds": round(took, 3), "error": str(err)}), flush=True)
    engine.close()
    return 1 if misses else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--fake":
        serve_fake(sys.argv[2], sys.argv[3], sys.argv[4] == "pdx")
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--initiate":
        return initiate(sys.argv[2], sys.argv[3], sys.argv[4])
    nss = os.environ.get("PDX_TESTBED_NS", "").split()
    if len(nss) < 2:
        print("SKIP: run inside scripts/netns-testbed", file=sys.stderr)
        return 77
    addrs = os.environ["PDX_TESTBED_ADDRS"].split()
    dead = os.environ["PDX_TESTBED_DEAD"]
    status = 0
    for style in ("pdx", "mooncake"):
        fake = subprocess.Popen(["ip", "netns", "exec", nss[1], sys.executable, __file__, "--fake", addrs[1], dead, style],
                                stdout=subprocess.PIPE, text=True)
        try:
            session = json.loads(fake.stdout.readline())["session"]
            print(f"{style}-style descriptor at {session} advertising {dead}:{DEAD_PORT}", flush=True)
            rc = subprocess.run(["ip", "netns", "exec", nss[0], sys.executable, __file__, "--initiate", addrs[0],
                                 session, dead], timeout=120).returncode
            status = status or rc
        finally:
            fake.kill()
            fake.wait()
    return status


if __name__ == "__main__":
    sys.exit(main())
