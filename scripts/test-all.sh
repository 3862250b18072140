#!/usr/bin/env bash
# Runs every test: the lint gates (no circles of file imports, rustfmt,
# clippy with warnings as errors),
# cargo (unit, integration, header freshness), the C tests under ctest with
# AddressSanitizer, install plus C/C++ consumer programs, the Python
# ctypes tests, a 60 s soak (scripts/soak.sh) and a 30 s soak across 4
# hosts in network namespaces (scripts/soak-netns.sh; SKIP when not root).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== circles of imports (scripts/check-circles.py)"
python3 scripts/check-circles.py

echo "== cargo fmt --check, cargo clippy -D warnings"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --release --workspace

echo "== ctest (C tests, AddressSanitizer)"
cmake -S . -B build -DPDX_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build -j 2
ctest --test-dir build --output-on-failure

echo "== install: pkg-config, find_package and add_subdirectory consumers"
scripts/test-install.sh

echo "== pytest"
python3 -m pytest -q python

echo "== soak (60 s: 4 processes, kills, stops, withdrawals, checksums)"
scripts/soak.sh 60

echo "== soak across 4 namespaced hosts (30 s: kills, stops, withdrawals, idle gaps; SKIP when not root)"
scripts/soak-netns.sh 30
