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
    # Looked up, not imported: the wheel's engine only ever loads in child processes.
    import importlib.util

    try:
        found = importlib.util.find_spec("mooncake.engine") is not None
    except ImportError:
        found = False
    return None if found else "the Mooncake wheel is not installed; bash .ci/install-deps.sh installs it"


def run_scenario(initiator: str, target: str, shim_site: Path | None = None) -> dict[str, Any]:
    """Run the scenario in a fresh interpreter. With `shim_site` (a directory holding the
    opt-in .pth), the initiator's plain `import mooncake.engine` goes through the shim."""
    env = dict(os.environ, MC_FORCE_TCP="1")
    env.pop("PDX_MOONCAKE_SHIM", None)
    cmd = [sys.executable, str(SCRIPT), "--initiator", initiator, "--target", target]
    if shim_site is not None:
        env["PDX_MOONCAKE_SHIM"] = "1"
        env["PYTHONPATH"] = str(SCRIPT.parents[2])  # where pdx and pdx_mooncake_shim live in a checkout
        # site.addsitedir processes the .pth as start-up does for site-packages.
        boot = (
            "import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        cmd = [sys.executable, "-c", boot, str(shim_site), *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert done.returncode == 0 and lines, (
        f"{initiator} -> {target} exited {done.returncode}\n--- stdout ---\n{done.stdout[-3000:]}"
        f"\n--- stderr ---\n{done.stderr[-6000:]}"
    )
    outcome: dict[str, Any] = json.loads(lines[-1][len("OUTCOME ") :])
    served = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("SERVED_BY ")]
    expected = "pdx.mooncake" if shim_site is not None or initiator == "pdx" else "mooncake.engine"
    assert served == [expected], (served, done.stdout[-2000:])
    if shim_site is not None:
        assert "served by pdx" in done.stderr, done.stderr[-3000:]
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


def test_unmodified_code_through_the_shim(reference: dict[str, Any], tmp_path: Path) -> None:
    """The scenario's wheel initiator (plain `import mooncake.engine`), with the opt-in
    shim active, runs on pdx against a real wheel target, with the wheel's outcomes."""
    shim = SCRIPT.parents[2] / "pdx-mooncake-shim.pth"
    (tmp_path / shim.name).write_text(shim.read_text())
    outcome = run_scenario("wheel", "wheel", shim_site=tmp_path)
    diff = _differences(reference, outcome)
    assert not diff, "shimmed initiator differs from wheel -> wheel:\n" + "\n".join(diff)


SIGNATURES = r"""
import inspect, json, re, sys
sys.path.insert(0, sys.argv[1])
import mooncake.engine as wheel
import pdx.mooncake as ours

def wheel_params(fn):
    # pybind11 puts the signature on the first docstring line: name(self: T, a: int, b: str = '*') -> int
    line = fn.__doc__.splitlines()[0]
    inner = line[line.index("(") + 1 : line.rindex(") ->")]
    params = [p.strip() for p in re.split(r",(?![^\[]*\])", inner)][1:]
    out = []
    for p in params:
        name, _, rest = p.partition(":")
        default = rest.split("=", 1)[1].strip() if "=" in rest else None
        out.append([name.strip(), default])
    return out

def our_params(fn):
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, default])
    return out

problems = []
for name in sorted(n for n in dir(wheel.TransferEngine) if not n.startswith("_") and n != "TransferOpcode"):
    w, o = wheel_params(getattr(wheel.TransferEngine, name)), our_params(getattr(ours.TransferEngine, name))
    if len(w) != len(o):
        problems.append(f"{name}: wheel {w}, pdx {o}")
        continue
    for (wn, wd), (on, od) in zip(w, o):
        if (not re.fullmatch(r"arg\d+", wn) and wn != on) or wd != od:
            problems.append(f"{name}: wheel {wn}={wd}, pdx {on}={od}")
print(json.dumps(problems))
"""


def test_signatures_match_the_wheel() -> None:
    """Every method takes the wheel's parameters: count, order, keyword names
    (where the wheel names them; pybind11's arg0.. are positional) and defaults."""
    reason = _wheel_missing()
    if reason:
        pytest.skip(reason)
    python_dir = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", SIGNATURES, python_dir], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    problems = json.loads(done.stdout.strip().splitlines()[-1])
    assert not problems, "\n".join(problems)
