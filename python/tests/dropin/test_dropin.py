"""pdx.mooncake.TransferEngine against the real wheel's class: one scenario
(dropin_scenario.py), written once, run with the wheel on both ends, with pdx on
both ends, and mixed (wheel -> pdx, pdx -> wheel). Every run is its own pair of
processes; the outcomes (return values, bytes moved, refused addresses, unknown
sessions, batch statuses, exceptions for bad arguments, the class's public
attributes) must be identical to the wheel's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent / "dropin_scenario.py"


def _wheel_missing() -> str | None:
    try:
        import mooncake.engine  # noqa: F401
    except Exception as exc:  # not installed, or its libraries are missing
        return f"the Mooncake wheel is not importable ({exc}); bash .ci/install-deps.sh installs it"
    return None


def run_scenario(initiator: str, target: str) -> dict[str, Any]:
    env = dict(os.environ, MC_FORCE_TCP="1")
    env.pop("PDX_MOONCAKE_SHIM", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--initiator", initiator, "--target", target],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert done.returncode == 0 and lines, (
        f"{initiator} -> {target} exited {done.returncode}\n--- stdout ---\n{done.stdout[-3000:]}"
        f"\n--- stderr ---\n{done.stderr[-6000:]}"
    )
    outcome: dict[str, Any] = json.loads(lines[-1][len("OUTCOME ") :])
    return outcome


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    reason = _wheel_missing()
    if reason:
        pytest.skip(reason)
    return run_scenario("wheel", "wheel")


def test_reference_run_is_meaningful(reference: dict[str, Any]) -> None:
    # The scenario checks something: transfers succeed and land, refusals fail.
    assert reference["initialize"] == 0
    assert reference["write"] == 0 and reference["write_arrived"] is True
    assert reference["read"] == 0 and reference["read_matches"] is True
    assert reference["batch_write"] == 0 and reference["async_write_status"] == 0
    assert reference["write_unregistered"] == -1 and reference["write_closed_port"] == -1
    assert reference["async_unregistered_status"] == -1
    assert reference["notifies_at_target"] == [["n1", "m1"], ["n2", "m2"]]
    assert reference["register_str_address"] == "raises TypeError"
    assert len(reference) > 80


def _differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    keys = sorted(set(reference) | set(other))
    return [
        f"{key}: wheel {reference.get(key, '<missing>')!r}, this run {other.get(key, '<missing>')!r}"
        for key in keys
        if reference.get(key, "<missing>") != other.get(key, "<missing>")
    ]


@pytest.mark.parametrize("initiator,target", [("pdx", "pdx"), ("wheel", "pdx"), ("pdx", "wheel")])
def test_same_outcome_as_the_wheel(reference: dict[str, Any], initiator: str, target: str) -> None:
    outcome = run_scenario(initiator, target)
    diff = _differences(reference, outcome)
    assert not diff, f"{initiator} -> {target} differs from wheel -> wheel:\n" + "\n".join(diff)
