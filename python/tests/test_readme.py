"""The README's examples must work as written: the Python ones run (each in
its own process: normalizing `mooncake_tcp` sets MC_FORCE_TCP in the
environment), the whole C program is compiled against include/pdx.h and
libpdx and run, and every C fragment compiles against the header."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pdx

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
C_BLOCKS = re.findall(r"```c\n(.*?)```", README, re.S)
CC = shutil.which(os.environ.get("CC", "cc"))
C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-I", str(ROOT / "include")]

# What the fragments use without declaring it (their context in a real program).
FRAGMENT_CONTEXT = """
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx.h>

extern void die(const char *what);
extern pdx_engine *e, *engine, *engines[8];
extern pdx_args *args;
extern const char *peer, *room;
extern void *k_or_v[72], *ud;
extern uint64_t peer_base[72], page_bytes, pool_pages;
extern const int32_t *src_pages, *dst_pages;
extern size_t n;
"""


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "README has no Python example"
    for code in blocks:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "python", capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip(), f"the example says nothing of what it did:\n{code}"


def linkable_library(tmp_path: Path) -> Path:
    """A directory where the libpdx the tests load is found under both names
    a program needs: libpdx.so to link, its SONAME to start."""
    lib = Path(pdx.lib._name).resolve()
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.+?)\]",
                       subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout)
    assert soname, f"{lib} has no SONAME"
    libdir = tmp_path / "lib"
    libdir.mkdir()
    for name in {"libpdx.so", soname.group(1)}:
        (libdir / name).symlink_to(lib)
    return libdir


@pytest.mark.skipif(CC is None or shutil.which("readelf") is None, reason="no C compiler or readelf")
def test_readme_c_program_compiles_and_runs(tmp_path, monkeypatch):
    programs = [b for b in C_BLOCKS if "int main(" in b]
    assert len(programs) == 1, "README should have one whole C program"
    src = tmp_path / "app.c"
    src.write_text(programs[0])
    libdir = linkable_library(tmp_path)
    subprocess.run([CC, *C_FLAGS, str(src), "-o", str(tmp_path / "app"), f"-L{libdir}", "-lpdx",
                    f"-Wl,-rpath,{libdir}"], check=True, capture_output=True, text=True)
    # As on a plain machine: whatever the environment says, "tcp" needs no RDMA.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MC_", "MOONCAKE_", "PDX_"))}
    env["MOONCAKE_PROTOCOL"] = "rdma"
    done = subprocess.run([str(tmp_path / "app"), "--disaggregation-mode", "prefill",
                           "--disaggregation-transfer-backend", "mooncake_tcp"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "backend mooncake", done.stdout
    assert re.fullmatch(r"decode engine 127\.0\.0\.1:\d+ over tcp", lines[1]), done.stdout
    assert lines[2] == "wrote 4096 bytes: landed", done.stdout


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("index", range(len(C_BLOCKS)))
def test_readme_c_fragment_compiles(tmp_path, index):
    block = C_BLOCKS[index]
    if "int main(" in block:
        pytest.skip("the whole program is built and run by test_readme_c_program_compiles_and_runs")
    src = tmp_path / "fragment.c"
    src.write_text(f"{FRAGMENT_CONTEXT}\nvoid readme_fragment(void) {{\n{block}}}\n")
    done = subprocess.run([CC, *C_FLAGS, "-c", str(src), "-o", str(tmp_path / "fragment.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"README C example {index} does not compile:\n{block}\n{done.stderr}"
