"""The wheel, as a new user gets it: `pip wheel .` once (cargo's target/ is
reused through CARGO_TARGET_DIR), a fresh venv, `pip install` of that wheel,
then, from `/` with no pdx environment variable: `import pdx`, a transfer,
`mypy --strict` over a small typed client (against the installed package and
its py.typed), and the opt-in mooncake.engine shim (off by default; on with
PDX_MOONCAKE_SHIM=1; always on after `python -m pdx.mooncake --install-shim`).

Building the wheel needs setuptools-rust: pip's build isolation fetches it
from PyPI, or set PDX_WHEEL_NO_ISOLATION=1 to build with the installed one
(python/requirements-test.txt)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], timeout: int = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done  # type: ignore[no-any-return]


def _user_env(**extra: str) -> dict[str, str]:
    """A user's environment: no PDX_*, MC_*, MOONCAKE_*, PYTHONPATH or LD_LIBRARY_PATH."""
    drop = ("PDX_", "MC_", "MOONCAKE_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(drop) and k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed; returns its python."""
    work = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(work / "dist"), "-q"]
    if os.environ.get("PDX_WHEEL_NO_ISOLATION") == "1":
        cmd.append("--no-build-isolation")
    env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target"))
    _run(cmd, timeout=900, env=env, cwd=ROOT)
    wheels = list((work / "dist").glob("pdx-*.whl"))
    assert len(wheels) == 1, wheels
    _run([sys.executable, "-m", "venv", str(work / "venv")], timeout=300)
    python = work / "venv" / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheels[0])], env=_user_env())
    return python


TRANSFER = """
import os, pdx
assert not any(k.startswith("PDX_") for k in os.environ)
print("loaded", pdx.library_path())
print("file", pdx.__file__)
with pdx.Engine("127.0.0.1", "tcp") as decode, pdx.Engine("127.0.0.1", "tcp") as prefill:
    pool = bytearray(1 << 16)
    remote = decode.register(pool)
    prefill.write(decode.session_id, b"kv" * 512, remote + 8)
    assert pool[8:12] == b"kvkv" and pool[:8] == bytes(8)
print("transfer ok")
"""


def test_import_from_root_and_transfer(venv: Path):
    done = _run([str(venv), "-c", TRANSFER], cwd="/", env=_user_env())
    site = venv.parent.parent
    assert "transfer ok" in done.stdout
    assert f"file {site}" in done.stdout, done.stdout  # the installed copy, not the checkout
    assert "loaded package directory" in done.stdout and "libpdx.abi3.so" in done.stdout
    version = _run([str(venv), "-c", "import importlib.metadata as m, pdx; print(m.version('pdx'), pdx.version())"],
                   cwd="/", env=_user_env())
    installed, reported = version.stdout.split()
    assert reported == f"pdx/{installed}"


CLIENT = '''
"""A small typed client of the installed package."""
from __future__ import annotations

import pdx
from pdx.mooncake import TransferEngine, TransferNotify, TransferOpcode


def move(decode: pdx.Engine, prefill: pdx.Engine, pool: bytearray) -> int:
    remote: int = decode.register(pool)
    prefill.write(decode.session_id, b"x" * 64, remote)
    summary: pdx.BatchSummary = prefill.status(prefill.submit(decode.session_id, "write", [(b"y" * 8, remote)]))
    return int(summary.total)


def dropin(peer: str, local: int, remote: int) -> int:
    engine = TransferEngine()
    rc: int = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    notify = TransferNotify("name", "msg")
    return rc or engine.transfer_sync(peer, local, remote, 8, TransferOpcode.Write, notify)


def code_of(exc: pdx.PdxError) -> int:
    return exc.status if exc.status != pdx.PDX_ERR_TIMEOUT else 0


if __name__ == "__main__":
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        print("tasks", move(a, b, bytearray(4096)))
'''


def _mypy_strict(venv: Path, client: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict over `client`, from the checkout's environment, resolving
    `pdx` in the venv (PEP 561: py.typed)."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(venv), str(client)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=client.parent,
        env=_user_env(),
    )


def test_mypy_strict_over_a_typed_client(venv: Path, tmp_path: Path):
    pytest.importorskip("mypy", reason="mypy is in python/requirements-test.txt")
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    done = _mypy_strict(venv, client)
    assert done.returncode == 0, done.stdout + done.stderr
    # A wrong call is caught, so the package's types are really used.
    client.write_text(CLIENT + "\nmove(1, 2, 3)\n")
    bad = _mypy_strict(venv, client)
    assert bad.returncode != 0 and "incompatible type" in bad.stdout, bad.stdout
    client.write_text(CLIENT)
    ran = _run([str(venv), str(client)], cwd="/", env=_user_env())
    assert "tasks 1" in ran.stdout


SHIMMED = """
import sys, ctypes
from mooncake.engine import TransferEngine, TransferOpcode
print("module", TransferEngine.__module__)
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
src, dst = ctypes.create_string_buffer(b"shim", 64), ctypes.create_string_buffer(64)
assert b.register_memory(ctypes.addressof(dst), 64) == 0
rc = a.transfer_sync(f"127.0.0.1:{b.get_rpc_port()}", ctypes.addressof(src), ctypes.addressof(dst), 4,
                     TransferOpcode.Write)
print("rc", rc, dst.value)
print("pdx imported", "pdx" in sys.modules)
"""


def test_shim_is_opt_in(venv: Path):
    # Without the opt-in nothing changes: this venv has no Mooncake wheel, so the import fails.
    plain = subprocess.run([str(venv), "-c", "import mooncake.engine"], capture_output=True, text=True,
                           timeout=60, cwd="/", env=_user_env())
    assert plain.returncode != 0 and "ModuleNotFoundError" in plain.stderr
    assert "served by pdx" not in plain.stderr
    # A fresh interpreter that never imports pdx gets pdx's class, and says so at start-up.
    on = _run([str(venv), "-c", SHIMMED], cwd="/", env=_user_env(PDX_MOONCAKE_SHIM="1"))
    assert "module pdx.mooncake" in on.stdout and "rc 0 b'shim'" in on.stdout
    assert "served by pdx" in on.stderr.splitlines()[0]
    # Nothing of pdx is loaded at start-up until mooncake.engine is imported.
    idle = _run([str(venv), "-c", "import sys; print('pdx' in sys.modules)"], cwd="/",
                env=_user_env(PDX_MOONCAKE_SHIM="1"))
    assert idle.stdout.strip() == "False" and "served by pdx" in idle.stderr


def test_install_shim_command(venv: Path):
    installed = _run([str(venv), "-m", "pdx.mooncake", "--install-shim"], cwd="/", env=_user_env())
    try:
        assert "served by pdx" in installed.stdout
        on = _run([str(venv), "-c", SHIMMED], cwd="/", env=_user_env())
        assert "module pdx.mooncake" in on.stdout and "rc 0" in on.stdout
        assert "--install-shim" in on.stderr.splitlines()[0]
    finally:
        removed = _run([str(venv), "-m", "pdx.mooncake", "--uninstall-shim"], cwd="/", env=_user_env())
    assert "removed" in removed.stdout
    off = subprocess.run([str(venv), "-c", "import mooncake.engine"], capture_output=True, text=True,
                         timeout=60, cwd="/", env=_user_env())
    assert off.returncode != 0 and "served by pdx" not in off.stderr


def test_shim_over_the_real_wheel(tmp_path: Path):
    """With the Mooncake wheel installed (this interpreter), the opt-in .pth serves
    pdx's class for mooncake.engine while the wheel's package still loads."""
    try:
        import mooncake  # noqa: F401
    except ImportError:
        pytest.skip("the Mooncake wheel is not installed")
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "pdx-mooncake-shim.pth").write_text((ROOT / "python" / "pdx-mooncake-shim.pth").read_text())
    # site.addsitedir processes a .pth exactly as start-up does for site-packages.
    code = textwrap.dedent(
        f"""
        import site, sys
        sys.path.insert(0, {str(ROOT / 'python')!r})
        site.addsitedir({str(site_dir)!r})
        import mooncake, mooncake.engine
        print(mooncake.engine.TransferEngine.__module__, mooncake.__file__)
        """
    )
    on = _run([sys.executable, "-c", code], env=_user_env(PDX_MOONCAKE_SHIM="1"), cwd="/")
    served, package = on.stdout.split()
    assert served == "pdx.mooncake" and package.endswith("site-packages/mooncake/__init__.py")
    assert "served by pdx" in on.stderr
    off = _run([sys.executable, "-c", code], env=_user_env(), cwd="/")
    served, package = off.stdout.split()
    assert served == "mooncake.engine" and package.endswith("site-packages/mooncake/__init__.py")
    assert "served by pdx" not in off.stderr
