"""The Rust half of the Python package (metadata is in pyproject.toml).

setuptools-rust builds the `pdx` crate's cdylib with cargo (release profile;
CARGO_TARGET_DIR is honoured, so a checkout's `target/` is reused) and copies
it (debug info stripped) into the package as `pdx/libpdx.abi3.so`, which `pdx` loads with ctypes.
The library has no Python ABI dependence, so the wheel is tagged
`cp39-abi3-<platform>`: one wheel for every CPython >= 3.9.
The opt-in shim's `.pth` file is copied to the top of site-packages.
"""

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension, Strip

ROOT = Path(__file__).resolve().parent
SHIM_PTH = "pdx-mooncake-shim.pth"


def cargo_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    package = text[text.index("[package]") :]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, re.M)
    if not match:
        raise RuntimeError("no [package] version in Cargo.toml")
    return match.group(1)


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
            strip=Strip.Debug,  # the release profile keeps line tables for the benchmarks; a wheel needs none
        ),
    ],
    cmdclass={"build_py": BuildPyWithShim},
    options={
        "bdist_wheel": {"py_limited_api": "cp39"},
        # Keep setuptools' scratch files out of the tree (build/ is CMake's).
        "build": {"build_base": "target/python-build"},
        "egg_info": {"egg_base": "target"},
    },
    zip_safe=False,
)
