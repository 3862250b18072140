#!/usr/bin/env bash
# First of all pdx needs a Rust toolchain: rustc and cargo at least the
# rust-version of Cargo.toml, with rustfmt and clippy (the tests start with
# them). This script installs none (rustup installs into a user's home, a CI
# image brings its own): it checks the one on PATH and, where it is missing
# or too old, says how to get one and stops (exit 1).
#
# Then it installs what the tests need: cmake, C and C++ compilers and
# pkg-config (Debian), pytest, numpy, mypy, setuptools-rust (the wheel test),
# and the real Mooncake engine (PyPI wheel) plus its run-time libraries for
# the interoperability tests, and etcd (Debian's etcd-server) for the
# metadata tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# "$1" is an older version than "$2" (1.84.1 < 1.85, 1.85.0 is not).
version_lt() { [ "$1" != "$2" ] && [ "$(printf '%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ]; }
need_rust=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n 1)
[ -n "$need_rust" ] || { echo "install-deps: no rust-version in Cargo.toml" >&2; exit 1; }
rust_problems=()
for tool in rustc cargo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    rust_problems+=("$tool is not on PATH")
    continue
  fi
  # "rustc 1.95.0 (59807616e 2026-04-14)", "cargo 1.86.0-nightly (...)"
  have=$("$tool" --version 2>/dev/null | awk '{print $2}')
  have=${have%%-*}
  if [ -z "$have" ]; then
    rust_problems+=("$tool --version fails")
  elif version_lt "$have" "$need_rust"; then
    rust_problems+=("$tool $have is older than $need_rust")
  fi
done
if command -v cargo >/dev/null 2>&1; then
  cargo fmt --version >/dev/null 2>&1 || rust_problems+=("rustfmt is missing (cargo fmt does not run)")
  cargo clippy --version >/dev/null 2>&1 || rust_problems+=("clippy is missing (cargo clippy does not run)")
fi
if [ ${#rust_problems[@]} -gt 0 ]; then
  {
    echo "install-deps: pdx needs a Rust toolchain first: rustc and cargo $need_rust or newer (rust-version in"
    echo "Cargo.toml), with rustfmt and clippy. On this machine:"
    printf '  - %s\n' "${rust_problems[@]}"
    if command -v rustup >/dev/null 2>&1; then
      echo "rustup is here; update the toolchain and add the components:"
      echo "  rustup update stable && rustup default stable && rustup component add rustfmt clippy"
    else
      echo "Get one with rustup (https://rustup.rs; it installs into ~/.rustup and ~/.cargo, no root needed;"
      echo "its default profile has rustfmt and clippy):"
      echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile default"
      echo "  . \"\$HOME/.cargo/env\""
    fi
    echo "A distribution's packages (apt-get install rustc cargo) are often older than $need_rust: check"
    echo "rustc --version. Then run this script again."
  } >&2
  exit 1
fi
echo "install-deps: $(rustc --version), $(cargo --version | awk '{print $1, $2}'), rustfmt and clippy: ok"
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
