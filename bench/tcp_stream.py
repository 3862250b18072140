#!/usr/bin/env python3
"""Raw single-stream TCP on loopback with large writes: a baseline for any write size.

iperf3 (3.12 here) refuses `-l` above 1 MiB for TCP, so it cannot write 64 MiB
at a time. This measures one TCP connection with the same write size as a
transfer: the sender calls sendall() on a `size`-byte mmap buffer, the
receiver recv_into()s an mmap buffer of the same size; at these sizes the
Python loop costs nothing measurable next to the copies.

    python3 tcp_stream.py recv            # prints its port, serves one connection
    (the sender side is `send()`, called by compare_mooncake.py)

Protocol: the sender sends an 8-byte little-endian byte count, then that many
bytes; the receiver answers one byte when it has them all.
"""

from __future__ import annotations

import mmap
import socket
import struct
import subprocess
import sys
import time


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def receiver():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    buf = view = None
    while True:
        head = conn.recv(16, socket.MSG_WAITALL)
        if len(head) < 16:
            return
        total, size = struct.unpack("<QQ", head)
        if buf is None or len(buf) != size:  # kept across bursts: pages are faulted in once
            buf = mmap.mmap(-1, size)
            view = memoryview(buf)
        left, at = total, 0
        while left:
            n = conn.recv_into(view[at : at + min(size - at, left)])
            if not n:
                return
            left -= n
            at = (at + n) % size
        conn.sendall(b"k")


def send(size: int, seconds: float, warmup: int = 1) -> float:
    """One connection; returns GB/s for `size`-byte sendall() calls over about `seconds`."""
    proc = subprocess.Popen([sys.executable, __file__, "recv"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        buf = mmap.mmap(-1, size)
        buf.write(b"\xa5" * min(size, 1 << 20))
        view = memoryview(buf)

        def burst(count):
            sock.sendall(struct.pack("<QQ", count * size, size))
            t0 = time.perf_counter()
            for _ in range(count):
                sock.sendall(view)
            if _recv_exact(sock, 1) != b"k":
                raise ConnectionError("bad ack")
            return time.perf_counter() - t0

        burst(warmup)  # fault pages in on both sides
        one = burst(1)
        count = max(3, int(seconds / max(one, 1e-6)))
        elapsed = burst(count)
        sock.close()
        view.release()
        buf.close()
        return count * size / elapsed / 1e9
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["recv"]:
        receiver()
    else:
        size = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
        print(f"{send(size, 2.0):.3f} GB/s")
