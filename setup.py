"""The Rust half of the Python package (metadata is in pyproject.toml).

setuptools-rust builds the `pdx` crate's cdylib with cargo (release profile;
CARGO_TARGET_DIR is honoured, so a checkout's `target/` is reused) and copies
it (debug info stripped) into the package as `pdx/libpdx.abi3.so`, which `pdx` loads with ctypes
(`pip install -e .` builds the same release library and copies it into python/pdx/).
setuptools' own scratch files (its build tree, pdx.egg-info) go to target/python-build/,
created when needed, so a clone that was never built installs from any directory.
The library has no Python ABI dependence, so the wheel is tagged
`cp39-abi3-<platform>`: one wheel for every CPython >= 3.9.
The opt-in shim's `.pth` file is copied to the top of site-packages.
"""

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info
from setuptools_rust import Binding, RustExtension, Strip

ROOT = Path(__file__).resolve().parent
SHIM_PTH = "pdx-mooncake-shim.pth"
# setuptools' scratch files, under the checkout's git-ignored target/ (build/ is
# CMake's). Absolute, so nothing depends on the directory setup.py runs from;
# in the checkout even when CARGO_TARGET_DIR sends cargo's output elsewhere.
SCRATCH = ROOT / "target" / "python-build"


def cargo_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    package = text[text.index("[package]") :]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, re.M)
    if not match:
        raise RuntimeError("no [package] version in Cargo.toml")
    return match.group(1)


class EggInfoInScratch(egg_info):
    """egg_info writing pdx.egg-info into SCRATCH, which it creates: a fresh
    clone has no target/ yet, and egg_info refuses an egg_base that does not
    exist. An egg_base given explicitly (pip's metadata step) is kept."""

    def finalize_options(self) -> None:
        if self.egg_base is None:
            SCRATCH.mkdir(parents=True, exist_ok=True)
            self.egg_base = str(SCRATCH)
        super().finalize_options()


class BuildPyWithShim(build_py):
    """build_py that also places the shim's .pth next to the packages."""

    def run(self) -> None:
        super().run()
        shutil.copyfile(ROOT / "python" / SHIM_PTH, Path(self.build_lib) / SHIM_PTH)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / SHIM_PTH)]


setup(
    version=cargo_version(),
    rust_extensions=[
        RustExtension(
            "pdx.libpdx",
            path="Cargo.toml",
            binding=Binding.NoBinding,
            py_limited_api=True,
            debug=False,  # release for `pip install -e .` too (setuptools-rust would build in-place ones unoptimised)
            strip=Strip.Debug,  # the release profile keeps line tables for the benchmarks; a wheel needs none
        ),
    ],
    cmdclass={"build_py": BuildPyWithShim, "egg_info": EggInfoInScratch},
    options={
        "bdist_wheel": {"py_limited_api": "cp39"},
        "build": {"build_base": str(SCRATCH)},
    },
    zip_safe=False,
)
