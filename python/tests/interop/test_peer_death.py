"""A pdx initiator whose peer process dies or freezes mid-transfer: every
transfer ends with an error within the configured deadline, never a hang, and
the engine keeps working for other peers."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time

import pytest

import pdx
from peer_client import Peer

MiB = 1 << 20


def _engine(env: dict[str, str]) -> pdx.Engine:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return pdx.Engine("127.0.0.1", "tcp")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_peer_dies_mid_transfer(how):
    # Short deadlines so a frozen peer is detected quickly.
    engine = _engine({"PDX_PROGRESS_TIMEOUT_MS": "1500", "PDX_STATUS_TIMEOUT_MS": "1500"})
    src = mmap.mmap(-1, 64 * MiB)
    src.write(os.urandom(MiB) * 64)
    with Peer("pdx", name=f"target-{how}") as target:
        remote = target.alloc(64 * MiB)
        session = target.call("session")["session"]
        outcome: dict = {}
        wrote_once = threading.Event()

        def writer():
            # Write until something fails (the peer goes away meanwhile).
            try:
                for _ in range(10_000):
                    engine.write(session, src, remote.addr, len(src))
                    wrote_once.set()
                outcome["finished"] = True
            except pdx.PdxError as e:
                outcome["error"] = e
            finally:
                wrote_once.set()

        t = threading.Thread(target=writer)
        t.start()
        # The writes are under way once one has landed: wait for that, not a time.
        assert wrote_once.wait(timeout=60), "no write finished"
        assert "error" not in outcome, f"the first write failed: {outcome}"
        pid = target.proc.pid
        os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        started = time.monotonic()
        t.join(timeout=60)
        assert not t.is_alive(), f"the transfer hung after the peer was {how}"
        elapsed = time.monotonic() - started
        if how == "frozen":
            os.kill(pid, signal.SIGCONT)
    err = outcome.get("error")
    assert err is not None, f"no error after the peer was {how}: {outcome}"
    expected = {
        "killed": {pdx.PDX_ERR_CONNECTION_LOST, pdx.PDX_ERR_PEER_UNREACHABLE},
        "frozen": {pdx.PDX_ERR_TIMEOUT},
    }[how]
    assert err.status in expected, err
    # Bounded by the deadlines, not by the 30 s defaults.
    assert elapsed < 20, f"failing took {elapsed:.1f} s"
    # The engine still serves other peers.
    with Peer("pdx", name="other") as other:
        buf = other.alloc(MiB)
        engine.write(other.call("session")["session"], src, buf.addr, MiB)
    engine.close()
