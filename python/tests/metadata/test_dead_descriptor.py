"""HTTP mode keeps a killed engine's keys (no leases): its callers must pay at
most one refused connect per call, fail at once with the address, and never
cache the peer as dead (dead_descriptor.py measures it in a network namespace
of its own, with the kernel's TCP counters)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_a_dead_descriptor_costs_each_call_at_most_one_refused_connect() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare(1) and ip(8): the count is read from a network namespace of the test's own")
    if shutil.which("mooncake_http_metadata_server") is None:
        pytest.skip("mooncake_http_metadata_server (from the Mooncake wheel) is not installed")
    run = subprocess.run(
        ["unshare", "--net", sys.executable, str(HERE / "dead_descriptor.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    calls = json.loads(run.stdout.strip().splitlines()[-1])["calls"]
    assert len(calls) == 6, calls
    for c in calls:
        # One connect to the dead data port, refused; a directory read may add one (that succeeds).
        assert c["refused"] == 1, c
        assert c["opens"] <= 2, c
        assert c["error"] is not None and c["error"].startswith("PDX_ERR_PEER_UNREACHABLE"), c
        assert "Connection refused" in c["error"], c
        assert c["seconds"] < 2.0, c
