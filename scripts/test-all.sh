#!/usr/bin/env bash
# Runs every test: the lint gates (no circles of file imports, rustfmt,
# clippy with warnings as errors),
# cargo (unit, integration, header freshness), the C tests under ctest with
# AddressSanitizer, install plus C/C++ consumer programs (pkg-config,
# find_package, add_subdirectory, Mooncake's C API), the Python ctypes tests,
# a 60 s soak (scripts/soak.sh: 4 processes, kills, stops, withdrawals,
# checksums) and a 30 s soak across 4 hosts in network namespaces
# (scripts/soak-netns.sh: kills, stops, withdrawals, idle gaps; SKIP when
# not root).
#
# Each stage prints its duration as it ends, and a table of every stage's
# time follows at the end (also after a failure: the stages that ran), with
# the machine's cores and its load average (1 min) at each stage's end:
# the figures README.md quotes come from this table.
set -euo pipefail
cd "$(dirname "$0")/.."

load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?"; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
started=$SECONDS
stage_start=$SECONDS
load_start=$(load)
table=()
current=""

# stage TITLE COMMAND...: run COMMAND as one stage and time it.
stage() {
  local title=$1
  shift
  stage_start=$SECONDS
  current=$title
  echo "== $title"
  "$@"
  local took=$((SECONDS - stage_start))
  table+=("$(printf '  %-34s %8s   load %s' "$title" "$(mmss "$took")" "$(load)")")
  echo "-- $title: $(mmss "$took")"
  current=""
}

summary() {
  local status=$?
  echo
  echo "== stage times: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)); load average (1 min) $load_start at the start"
  [ ${#table[@]} -eq 0 ] || printf '%s\n' "${table[@]}"
  [ -z "$current" ] || printf '  %-34s %8s   load %s   FAILED\n' "$current" "$(mmss $((SECONDS - stage_start)))" "$(load)"
  echo "  total $(mmss $((SECONDS - started)))$([ "$status" -eq 0 ] || echo ", exit $status")"
}
trap summary EXIT

lint_rustfmt() { cargo fmt --all --check; }
lint_clippy() { cargo clippy --release --workspace --all-targets -- -D warnings; }
ctest_build() {
  cmake -S . -B build -DPDX_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build -j 2
}

stage "circles of imports" python3 scripts/check-circles.py
stage "cargo fmt --check" lint_rustfmt
stage "cargo clippy -D warnings" lint_clippy
stage "cargo test" cargo test --release --workspace
stage "C tests: build (ASan)" ctest_build
stage "C tests: ctest" ctest --test-dir build --output-on-failure
stage "install and consumer programs" scripts/test-install.sh
stage "pytest" python3 -m pytest -q python
stage "soak (60 s)" scripts/soak.sh 60
stage "soak, 4 namespaced hosts (30 s)" scripts/soak-netns.sh 30
