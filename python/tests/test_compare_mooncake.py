"""Smoke test of bench/compare_mooncake.py: tiny sizes, one round, a few seconds.

Checks that the script runs end to end against both engines, that its JSON
and its table parse, and that every run's bytes were verified. It asserts
nothing about speed.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

import pdx  # noqa: E402  (python/pdx/)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "compare_mooncake.py"

if not hasattr(pdx.lib, "pdx_engine_init"):
    pytest.skip("libpdx.so has no engine ABI", allow_module_level=True)


def test_smoke_run_verifies_and_reports(tmp_path):
    out_json = tmp_path / "out.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verification: all runs verified" in p.stdout, p.stdout

    doc = json.loads(out_json.read_text())
    assert doc["verified"] is True
    assert doc["meta"]["mode"] == "smoke"
    groups = {row["group"] for row in doc["rows"]}
    assert groups == {"large", "batch", "latency"}
    for row in doc["rows"]:
        for kind in ("pdx", "mooncake"):
            side = row[kind]
            assert side["verified"] is True, row
            assert side["calls"] > 0, row
            assert side["median"] is not None and side["median"] > 0, row
        assert row["ratio"] is not None and row["ratio"] > 0, row
    targets = [t["target"] for t in doc["targets"]]
    assert any("2x Mooncake" in t for t in targets)
    assert any("3x Mooncake" in t for t in targets)
    assert any("0.5x Mooncake" in t for t in targets)
    assert any("iperf3" in t for t in targets)  # measured, or skipped with the reason
    for row in doc["rows"]:
        assert row["workload"] in p.stdout  # the table names every workload
