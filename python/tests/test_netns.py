"""Tests over real links between network namespaces (scripts/netns-testbed):
a peer advertising a data address nobody answers at, and a rate-capped link
that pdx fills. Skipped (with the reason) where namespaces cannot be made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "scripts" / "netns-testbed"


def _bed(args: list[str], command: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([str(TESTBED), *args, "--", *command], capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode == 77:
        pytest.skip(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "netns-testbed cannot run here")
    return p


def test_an_unreachable_advertised_data_address_fails_each_attempt_within_the_connect_bound():
    p = _bed([], [sys.executable, str(ROOT / "scripts" / "netns_wrong_address.py")], 180)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert p.stdout.count('"ok": true') == 6, p.stdout


def test_pdx_fills_a_1_gbit_link():
    command = [sys.executable, str(ROOT / "scripts" / "link_test.py"), "--engines", "pdx", "--iters", "3", "--rounds", "1",
               "--iperf-seconds", "1", "--min-fraction", "0.9"]
    p = _bed(["--rate", "1gbit"], command, 300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
