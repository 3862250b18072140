"""The package as a new user installs it: every pip command of docs/python.md
from a fresh copy of the repository (its tracked files only, as `git clone`
gives them: no target/, no build/), each into a fresh venv, then, from `/` with
no pdx variable and no PYTHONPATH: `import pdx` loads the bundled libpdx, and
a transfer. The first venv also gets `mypy --strict` over a small typed
client (against the installed package and its py.typed) and the opt-in
mooncake.engine shim (off by default; on with PDX_MOONCAKE_SHIM=1; always on
after `python -m pdx.mooncake --install-shim`).

Cost: one cold cargo build, `pip install <clone>` from another directory with
CARGO_TARGET_DIR unset (the issue 17 case: target/ does not exist yet). The
other commands (`pip wheel .`, `pip install .`, `pip install -e .`) each start
from their own fresh copy with CARGO_TARGET_DIR set to that first copy's
target/, so cargo finds everything built. Every command must leave its copy
unchanged except for the build folder target/ (and, for `-e`, the library
copied next to the package). pip's build isolation fetches setuptools and
setuptools-rust from PyPI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a build may add to a copy: cargo's target/ (setuptools' scratch files go
# to target/python-build even when CARGO_TARGET_DIR sends cargo elsewhere).
BUILD_FOLDER = "target/"
# An editable install copies the library next to the package (ignored by git).
EDITABLE_LIBRARY = "python/pdx/libpdx.abi3.so"


def _run(cmd: list[str], timeout: int = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done  # type: ignore[no-any-return]


def _user_env(**extra: str) -> dict[str, str]:
    """A user's environment: no PDX_*, MC_*, MOONCAKE_*, CARGO_TARGET_DIR, PYTHONPATH or LD_LIBRARY_PATH."""
    drop = ("PDX_", "MC_", "MOONCAKE_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(drop)
        and k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CARGO_TARGET_DIR")
    }
    env.update(extra)
    return env


def fresh_copy(dest: Path) -> Path:
    """The repository as a clone has it: the files git tracks, as the working
    tree has them now (so uncommitted edits are tested; deleted ones are left
    out), with their modification times, and nothing else."""
    listed = _run(["git", "-C", str(ROOT), "ls-files", "-z"], timeout=60)
    names = [name for name in listed.stdout.split("\0") if name]
    assert "setup.py" in names and "Cargo.toml" in names, "not a git checkout of pdx"
    for name in names:
        source = ROOT / name
        if not os.path.lexists(source):
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


def _files(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under `tree`: relative path -> (size, mtime in ns)."""
    found: dict[str, tuple[int, int]] = {}
    for directory, _, names in os.walk(tree):
        for name in names:
            path = Path(directory, name)
            st = path.lstat()
            found[path.relative_to(tree).as_posix()] = (st.st_size, st.st_mtime_ns)
    return found


def _assert_only_build_outputs(tree: Path, before: dict[str, tuple[int, int]], allowed: tuple[str, ...] = ()) -> None:
    after = _files(tree)
    touched = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    stray = [name for name in touched if not name.startswith(BUILD_FOLDER) and name not in allowed]
    assert not stray, f"the build changed files outside {BUILD_FOLDER}: {stray[:20]}"


def _new_venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)], timeout=300)
    return path / "bin" / "python"


def _pip(python: Path, args: list[str], cwd: Path, cargo_target_dir: Path | None) -> None:
    """`pip <args>` with the venv's own pip, in a user's environment."""
    env = _user_env() if cargo_target_dir is None else _user_env(CARGO_TARGET_DIR=str(cargo_target_dir))
    _run([str(python), "-m", "pip", "--disable-pip-version-check", *args], timeout=1200, cwd=cwd, env=env)


class ColdInstall(NamedTuple):
    python: Path  # the venv's interpreter
    target: Path  # the cargo target directory the build filled


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> ColdInstall:
    """`pip install <clone>` run from another (empty) directory, CARGO_TARGET_DIR
    unset: cargo builds everything in the clone's target/, which does not exist
    when the build starts."""
    work = tmp_path_factory.mktemp("cold")
    clone = fresh_copy(work / "pdx")
    assert not (clone / "target").exists() and not (clone / "build").exists()
    python = _new_venv(work / "venv")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    before = _files(clone)
    _pip(python, ["install", str(clone)], cwd=elsewhere, cargo_target_dir=None)
    _assert_only_build_outputs(clone, before)
    assert (clone / "target" / "release" / "libpdx.so").is_file()
    assert not any(elsewhere.iterdir()), list(elsewhere.iterdir())
    return ColdInstall(python, clone / "target")


@pytest.fixture(scope="module")
def venv(cold: ColdInstall) -> Path:
    """A fresh venv with pdx installed from a fresh clone; returns its python."""
    return cold.python


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


def _check_installed(python: Path, package_dir: Path) -> None:
    """From `/`, with no pdx variable: `import pdx` loads the library bundled in
    `package_dir`, a transfer works, and the library's version is the package's."""
    done = _run([str(python), "-c", TRANSFER], cwd="/", env=_user_env())
    assert "transfer ok" in done.stdout
    assert f"file {package_dir / '__init__.py'}" in done.stdout, done.stdout
    assert f"loaded package directory ({package_dir / 'libpdx.abi3.so'})" in done.stdout, done.stdout
    code = ("import importlib.metadata as m, pdx; "
            "print(m.version('pdx'), pdx.version(), m.metadata('pdx')['License-Expression'])")
    version = _run([str(python), "-c", code], cwd="/", env=_user_env())
    installed, reported, license_expression = version.stdout.split()
    assert reported == f"pdx/{installed}"
    assert license_expression == "Apache-2.0"  # project.license as an SPDX string (a table is deprecated)


def _site_packages(python: Path) -> Path:
    done = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=_user_env())
    return Path(done.stdout.strip())


def test_import_from_root_and_transfer(venv: Path):
    _check_installed(venv, _site_packages(venv) / "pdx")


@pytest.mark.parametrize("command", ["pip wheel .", "pip install .", "pip install -e ."])
def test_pip_command_from_a_fresh_clone(command: str, cold: ColdInstall, tmp_path: Path):
    """Each command from its own fresh copy, with CARGO_TARGET_DIR (outside the
    copy) holding the cold build, so cargo has nothing left to compile."""
    clone = fresh_copy(tmp_path / "pdx")
    python = _new_venv(tmp_path / "venv")
    before = _files(clone)
    allowed: tuple[str, ...] = ()
    if command == "pip wheel .":
        dist = tmp_path / "dist"
        _pip(python, ["wheel", ".", "--no-deps", "-w", str(dist)], cwd=clone, cargo_target_dir=cold.target)
        wheels = list(dist.glob("pdx-*.whl"))
        assert len(wheels) == 1 and wheels[0].name.endswith("-cp39-abi3-linux_" + os.uname().machine + ".whl"), wheels
        names = set(zipfile.ZipFile(wheels[0]).namelist())
        expected = {"pdx/__init__.py", "pdx/mooncake.py", "pdx/kv.py", "pdx/py.typed", "pdx/libpdx.abi3.so",
                    "pdx_mooncake_shim.py", "pdx-mooncake-shim.pth"}
        assert expected <= names, expected - names
        _pip(python, ["install", "--no-index", "--no-deps", str(wheels[0])], cwd=tmp_path, cargo_target_dir=None)
        package = _site_packages(python) / "pdx"
    elif command == "pip install .":
        _pip(python, ["install", "."], cwd=clone, cargo_target_dir=cold.target)
        package = _site_packages(python) / "pdx"
    else:
        _pip(python, ["install", "-e", "."], cwd=clone, cargo_target_dir=cold.target)
        package = clone / "python" / "pdx"  # the checkout's own package, with the library copied in
        allowed = (EDITABLE_LIBRARY,)
    _assert_only_build_outputs(clone, before, allowed)
    assert not (clone / "target" / "release").exists(), "CARGO_TARGET_DIR was not honoured"
    _check_installed(python, package)


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
