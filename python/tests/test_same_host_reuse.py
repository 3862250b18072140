"""A forked child that keeps its parent's accepted same-host link moves no
byte of its parent's memory (issue 51), whoever it runs as, whatever it
sends, and the parent's own transfers stay on the link (same_host_reuse.py
holds the processes). The target is this process's engine; a pull would
land the parent's secret in its region, a push would change the parent's
memory. Needs root (the child drops to uid 65534)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pdx
import same_host_attack
import same_host_reuse

HERE = Path(__file__).resolve().parent
N = same_host_reuse.N


@pytest.fixture(scope="module")
def target():
    if os.geteuid() != 0:
        pytest.skip("needs root (the child drops to another uid)")
    engine = pdx.Engine("127.0.0.1", "tcp")
    region = bytearray(b"R" * (4 * N))
    base = engine.register(region)
    yield engine, region, base, same_host_attack._data_port(engine)
    engine.close()


def run(script: str, target, who: str) -> dict:
    engine, region, base, port = target
    region[:] = b"R" * len(region)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    argv = [sys.executable, "-c", script, engine.session_id, str(port), str(base), who]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    secret = bytes.fromhex(got["secret"])
    # Any 64-byte piece of the secret, anywhere in the region.
    pieces = {secret[i:i + 64] for i in range(0, len(secret), 64)}
    got["leaked"] = any(bytes(region[i:i + 64]) in pieces for i in range(len(region) - 63))
    got["overwritten"] = bytes.fromhex(got["now"]) != secret
    return got


def ok(status) -> bool:
    return status is not None and status >> 32 == same_host_attack.STATUS_MAGIC and status & 0xFFFFFFFF == 0


@pytest.mark.parametrize("who", ["other-user", "same-user"])
def test_a_child_reusing_a_hand_built_link_moves_nothing(target, who):
    r = run(same_host_reuse.HAND_BUILT, target, who)
    assert "error" not in r["child"], r["child"]
    assert not r["leaked"], f"LEAKED: {r['child']}"
    assert not r["overwritten"], f"OVERWRITTEN: {r['child']}"
    # Every attempt met a closed connection, unanswered.
    assert r["child"]["statuses"] == [None] * len(r["attempts"]), r
    # The parent's own link worked before, and a new one after.
    assert r["honest_before"] and all(ok(s) for s in r["honest_before"]), r
    assert len(r["honest_after"]) == 3 and all(ok(s) for s in r["honest_after"]), r
    # Memory the parent never listed as registered: "not registered" (4), even from the parent itself.
    (unlisted,) = r["unlisted"]
    assert unlisted is not None and unlisted & 0xFFFFFFFF == 4, r


@pytest.mark.parametrize("who", ["other-user", "same-user"])
def test_a_child_calling_pdx_on_its_parents_engine_never_uses_the_parents_link(target, who):
    r = run(same_host_reuse.PDX_API, target, who)
    child = r["child"]
    assert "error" not in child, child
    assert not r["leaked"], f"LEAKED: {child}"
    assert not r["overwritten"], f"OVERWRITTEN: {child}"
    # Its calls moved its own memory (its copy of `private`, never the
    # parent's): over TCP as another user, on a link of its own as the same one.
    assert child["api"] == [["write", "ok"], ["read", "ok"]], child
    assert child["child_path"] == ("tcp" if who == "other-user" else "same-host"), child
    assert r["inherited"] >= 1 and child["wire"] == [None], r  # the frame on the connection: closed
    # The parent: on the link before and after, its bytes moved over it.
    assert r["path_before"] == r["path_after"] == "same-host", r
    assert r["same_host_after"] > r["same_host_before"] and r["read_back"], r
