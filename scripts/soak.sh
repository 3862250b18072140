#!/usr/bin/env bash
# Bounded soak of the native engine (see scripts/soak.py): 4 pdx processes,
# random SIGKILL/SIGSTOP/restart, regions withdrawn, every byte checksummed.
#   scripts/soak.sh            # 5 minutes
#   scripts/soak.sh 60         # 60 s (the variant scripts/test-all.sh runs)
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-300}"
[ -f target/release/libpdx.so ] || cargo build --release
PYTHONPATH=python exec python3 scripts/soak.py --duration "$duration"
