"""The package itself: where it finds libpdx, its typing, the protocol default,
and Args.normalize() mirroring the environment into os.environ. Loader checks
run in fresh interpreters (the library is loaded once per process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pdx

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
LIB = ROOT / "target" / "release" / "libpdx.so"


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PDX_LIB", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(extra)
    return env


@pytest.fixture
def bare_package(tmp_path: Path) -> Path:
    """A copy of the package outside any checkout, with no library next to it."""
    shutil.copytree(PYTHON_DIR / "pdx", tmp_path / "pdx", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return tmp_path


def test_checkout_build_is_found_without_env():
    done = _python("import pdx; print(pdx.library_path())", _clean_env(PYTHONPATH=str(PYTHON_DIR)), Path("/"))
    assert done.returncode == 0, done.stderr
    assert "target/release/libpdx.so" in done.stdout or "package directory" in done.stdout


def test_pdx_lib_may_name_a_directory_or_a_file(bare_package: Path):
    for value in (str(LIB.parent), str(LIB)):
        env = _clean_env(PYTHONPATH=str(bare_package), PDX_LIB=value)
        done = _python("import pdx; print(pdx.library_path()); print(pdx.version())", env, Path("/"))
        assert done.returncode == 0, done.stderr
        assert f"PDX_LIB={value}" in done.stdout and "pdx/" in done.stdout


def test_wrong_pdx_lib_is_an_error_not_a_fallback(bare_package: Path, tmp_path: Path):
    env = _clean_env(PYTHONPATH=str(bare_package), PDX_LIB=str(tmp_path / "nowhere"))
    done = _python("import pdx", env, Path("/"))
    assert done.returncode != 0
    assert "PDX_LIB=" in done.stderr and "nowhere" in done.stderr and "no such file" in done.stderr


def test_error_names_every_place_tried(bare_package: Path):
    done = _python("import pdx", _clean_env(PYTHONPATH=str(bare_package)), Path("/"))
    assert done.returncode != 0
    assert f"package directory ({bare_package / 'pdx' / 'libpdx.so'})" in done.stderr
    assert "system loader" in done.stderr and "libpdx.so" in done.stderr


def test_system_loader_is_tried_last(bare_package: Path):
    env = _clean_env(PYTHONPATH=str(bare_package), LD_LIBRARY_PATH=str(LIB.parent))
    done = _python("import pdx; print(pdx.library_path())", env, Path("/"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("system loader")


def test_constants_are_explicit_module_attributes():
    source = (PYTHON_DIR / "pdx" / "binding.py").read_text()
    assert "globals()" not in source
    for code, name in pdx.STATUS_NAMES.items():
        assert f"\n{name} = {code}\n" in source, name
    err = pdx.PdxError(pdx.PDX_ERR_TIMEOUT, "late")
    assert err.status == -18 and err.name == "PDX_ERR_TIMEOUT" and str(err) == "PDX_ERR_TIMEOUT: late"


def test_public_methods_have_docstrings():
    import inspect

    import pdx.mooncake

    missing = []
    for owner in (pdx, pdx.binding, pdx.args, pdx.options, pdx.engine, pdx.log, pdx.mooncake):
        for name, obj in vars(owner).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != owner.__name__:
                continue
            if inspect.isfunction(obj) and not obj.__doc__:
                missing.append(f"{owner.__name__}.{name}")
            if inspect.isclass(obj):
                if not obj.__doc__:
                    missing.append(f"{owner.__name__}.{name}")
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    fn = member.fget if isinstance(member, property) else member
                    if inspect.isfunction(fn) and not fn.__doc__:
                        missing.append(f"{owner.__name__}.{name}.{attr}")
    assert not missing, missing


def test_mypy_strict_on_the_package():
    pytest.importorskip("mypy", reason="mypy is in python/requirements-test.txt")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "pdx", "pdx_mooncake_shim.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PYTHON_DIR,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


def test_engine_protocol_follows_mooncake_protocol(monkeypatch):
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    with pdx.Engine("127.0.0.1") as e:
        assert e.protocol == "tcp"
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "rdma")
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1")  # rdma runs on Mooncake's library, absent here
    assert err.value.status == pdx.PDX_ERR_BACKEND_UNAVAILABLE


def test_normalize_mirrors_environment_into_os_environ():
    # In its own process: the write is process-wide.
    code = (
        "import os, pdx\n"
        "assert 'MC_FORCE_TCP' not in os.environ\n"
        "args = pdx.Args(['--disaggregation-mode', 'prefill', '--disaggregation-transfer-backend', 'mooncake_tcp'])\n"
        "args.normalize()\n"
        "print(os.environ.get('MC_FORCE_TCP'))\n"
    )
    env = _clean_env(PYTHONPATH=str(PYTHON_DIR))
    env.pop("MC_FORCE_TCP", None)
    done = _python(code, env, Path("/"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    # An existing value is kept, in both environments.
    env["MC_FORCE_TCP"] = "0"
    done = _python(code.replace("assert 'MC_FORCE_TCP' not in os.environ\n", ""), env, Path("/"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"

