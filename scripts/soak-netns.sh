#!/usr/bin/env bash
# The soak (scripts/soak.py) across 4 hosts in network namespaces joined by
# a bridge (scripts/netns-testbed), with SIGKILL/SIGSTOP/restarts, region
# withdrawals and idle gaps past a 500 ms idle timeout:
#   scripts/soak-netns.sh          # 60 s
#   scripts/soak-netns.sh 30       # the variant scripts/test-all.sh runs
# Prints SKIP and exits 0 where namespaces cannot be made (not root).
set -uo pipefail
cd "$(dirname "$0")/.."
duration="${1:-60}"
[ -f target/release/libpdx.so ] || cargo build --release
scripts/netns-testbed --hosts 4 -- env PYTHONPATH="$PWD/python" python3 scripts/soak.py --netns --idle-gaps --duration "$duration"
status=$?
[ "$status" = 77 ] && exit 0 # SKIP already printed
exit "$status"
