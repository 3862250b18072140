#!/usr/bin/env bash
# Installs what the tests need: cmake, C and C++ compilers and pkg-config
# (Debian), pytest, mypy, setuptools-rust (the wheel test), and the real
# Mooncake engine (PyPI wheel) plus its run-time libraries for the
# interoperability tests, and etcd (Debian's etcd-server) for the metadata
# tests.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v cc >/dev/null || need_apt+=(gcc)
command -v c++ >/dev/null || need_apt+=(g++)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
dpkg -s libibverbs1 >/dev/null 2>&1 || need_apt+=(libibverbs1)
dpkg -s libnuma1 >/dev/null 2>&1 || need_apt+=(libnuma1)
# A real etcd for the metadata-directory tests (python/tests/metadata).
command -v etcd >/dev/null || need_apt+=(etcd-server)
# python3 -m venv (the wheel test) needs ensurepip, a separate package on Debian.
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi
python3 -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
