"""Cancel against the real Mooncake Transfer Engine (issue 50): a 256 MiB READ from a
Mooncake target (PyPI wheel, its own process), cancelled while its bytes are on the
wire, writes nothing into the buffer once the cancel returned (the buffer is filled
right after and compared 2 s later): the Mooncake target's late bytes go nowhere. The
target then serves the next READ, byte for byte, and stays up."""

from __future__ import annotations

import ctypes
import hashlib
import time

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

import pdx  # noqa: E402
from peer_client import Peer  # noqa: E402

MiB = 1 << 20
FILL = 0xA5


def test_a_read_cancelled_from_a_mooncake_target_leaves_the_buffer_untouched(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    n = 256 * MiB
    with Peer("mooncake", name="mc-cancel-target") as m, pdx.Engine("127.0.0.1", "tcp") as a:
        remote = m.alloc(n)
        m.fill(remote, 0, n, seed=50, timeout=120)
        local = bytearray(n)
        for when in ("at once", "on the wire"):
            batch = a.submit(m.session, "read", [(local, remote.addr)])
            deadline = time.monotonic() + 60
            while when == "on the wire" and a.status(batch).bytes == 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            assert a.cancel(batch) == 1, when
            ctypes.memset((ctypes.c_char * n).from_buffer(local), FILL, n)
            assert a.status(batch).state == pdx.PDX_TASK_CANCELED
            a.free(batch)
            time.sleep(2.0)
            assert local.count(FILL) == n, f"late bytes from the Mooncake target ({when})"
        assert m.alive, "the Mooncake target survived the cancelled reads:\n" + m.log_tail()
        a.read(m.session, local, remote.addr)
        assert hashlib.sha256(local).hexdigest() == m.sha256(remote, timeout=120), "the next read lands whole"
