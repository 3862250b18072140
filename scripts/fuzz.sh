#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer via cargo-fuzz) of the parsers that see
# peer or caller input: handshake frames and descriptors, data-port request
# headers against registered regions, and configuration text.
#
#   scripts/fuzz.sh [seconds per target, default 60] [target ...]
#
# cargo-fuzz needs nightly-only compiler flags; RUSTC_BOOTSTRAP=1 lets the
# stable toolchain accept them. Crashes land in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(handshake_frame data_request config_text)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p fuzz/corpus/handshake_frame
cp -n fuzz/seeds/* fuzz/corpus/handshake_frame/ 2>/dev/null || true
for t in "${targets[@]}"; do
  echo "== $t ($seconds s)"
  mkdir -p "fuzz/corpus/$t"
  RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" 2>&1 | grep -E "^Done|ERROR|SUMMARY|panicked" || true
done
