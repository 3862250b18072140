#!/usr/bin/env bash
# Compares two pdx-bench builds on the engine's six reference figures, in one
# run that alternates them back to back (A then B, then B then A, ROUNDS
# times in all), and prints
# each figure's median of the B/A throughput ratios:
#   host write and read of 64 KiB x 256 and of 64 MiB (loopback, TCP);
#   staged write 1 MiB x 16 (cuda:0 -> cuda:1) and staged read 64 MiB
#   (cuda:0 <- cuda:1) through the CUDA stand-in.
# Usage: scripts/bench-ab.sh [--same-host] A_BENCH B_BENCH CUDA_LIB [ROUNDS]
#   A_BENCH, B_BENCH: pdx-bench binaries (say, the build before a change and
#   after it); CUDA_LIB: the driver to stage with (the stand-in is
#   build/libcuda_double.so after the C tests are built); ROUNDS: default 5.
# DURATION, TOTAL, BUFFER (environment): seconds and bytes per figure, and
# the loopback target's buffer (default 1, 512M, 1G; issue 31's method is
# DURATION=2 TOTAL=1G BUFFER=512M). A build of an older commit:
#   mkdir -p /tmp/ab-src && git archive fad2bfc | tar -x -C /tmp/ab-src &&
#   (cd /tmp/ab-src && CARGO_TARGET_DIR=/tmp/ab-target cargo build --release -p pdx-bench) &&
#   cp /tmp/ab-target/release/pdx-bench /tmp/pdx-bench-fad2bfc
# Run A against itself as a control, in the same hour, to see the noise.
# Both builds run over TCP loopback: PDX_SAME_HOST=off keeps a build that has
# the same-host link off it (one from before the link ignores the variable,
# and has no --path flag). With --same-host, the figures are instead host
# write and read of 64 KiB x 256 over the same-host link (both builds must
# have it, and every run must report it).
set -euo pipefail
path=tcp
if [ "${1:-}" = --same-host ]; then
  path=same-host
  shift
fi
if [ "$path" = tcp ]; then export PDX_SAME_HOST=off; else export PDX_SAME_HOST=auto; fi
[ $# -ge 3 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
a=$1 b=$2 cuda=$3 rounds=${4:-5}
duration=${DURATION:-1} total=${TOTAL:-512M} buffer=${BUFFER:-1G}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cases=(
  "host write 64K x 256|--op write --block 64K --batch 256"
  "host read 64K x 256|--op read --block 64K --batch 256"
  "host write 64M|--op write --block 64M --batch 1"
  "host read 64M|--op read --block 64M --batch 1"
  "staged write 1M x 16 (cuda:0 -> cuda:1)|--op write --block 1M --batch 16 --location cuda:0 --remote-location cuda:1"
  "staged read 64M (cuda:0 <- cuda:1)|--op read --block 64M --batch 1 --location cuda:0 --remote-location cuda:1"
)
if [ "$path" = same-host ]; then
  cases=(
    "same-host write 64K x 256|--op write --block 64K --batch 256"
    "same-host read 64K x 256|--op read --block 64K --batch 256"
  )
fi
# One figure in GB/s.
run() {
  local bench=$1 args=$2 out=$tmp/r.json
  # shellcheck disable=SC2086
  PDX_CUDA_LIB=$cuda "$bench" --workload blocks --quiet --duration "$duration" --total "$total" --buffer "$buffer" --json "$out" $args >/dev/null
  # A build that reports its path (one with the link) must have taken $path.
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); p=r.get("path","tcp")
if p!=sys.argv[3]: sys.exit(f"{sys.argv[2]} ran over {p}, not {sys.argv[3]}")
print(r["blocks"][0]["gb_per_s"])' "$out" "$bench" "$path"
}
printf '%-44s %10s %10s %8s   %s\n' figure "A GB/s" "B GB/s" "B/A" "ratios per round"
for c in "${cases[@]}"; do
  name=${c%%|*} args=${c#*|}
  ga=() gb=() ratios=()
  for r in $(seq "$rounds"); do
    # A then B in odd rounds, B then A in even ones: whatever favours the
    # first (or the second) of a pair falls on both builds alike.
    if [ $((r % 2)) = 1 ]; then
      x=$(run "$a" "$args")
      y=$(run "$b" "$args")
    else
      y=$(run "$b" "$args")
      x=$(run "$a" "$args")
    fi
    ga+=("$x") gb+=("$y")
    ratios+=("$(python3 -c "print(f'{$y/$x:.3f}')")")
  done
  python3 - "$name" "${ga[*]}" "${gb[*]}" "${ratios[*]}" <<'EOF'
import statistics, sys
name, ga, gb, ratios = sys.argv[1], *[list(map(float, s.split())) for s in sys.argv[2:5]]
print(f"{name:<44} {statistics.median(ga):10.2f} {statistics.median(gb):10.2f} {statistics.median(ratios):8.3f}   "
      + " ".join(f"{r:.2f}" for r in ratios))
EOF
done
