#!/usr/bin/env bash
# valgrind memcheck over the C tests, built without AddressSanitizer (the
# two cannot share a process). Not part of scripts/test-all.sh: it is 20-50x
# slower. Passes when every test exits 0 with 0 errors and 0 definitely or
# indirectly lost bytes. Suppressions, each justified, are in
# scripts/valgrind.supp.
#   scripts/valgrind.sh            # every C test
#   scripts/valgrind.sh test_engine
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-valgrind
cmake -S . -B "$build" -DPDX_ASAN=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build" -j 2 >/dev/null
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  mapfile -t tests < <(cd "$build" && ls test_* | grep -v '\.' | sort)
fi
failed=0
for t in "${tests[@]}"; do
  log="$build/valgrind-$t.log"
  start=$(date +%s)
  extra=()
  # test_cuda fills its host buffers with malloc and never initializes
  # them (their contents do not matter to it); sending them is reported as
  # "uninitialised bytes" in sendmsg. Only for that test are such reports off.
  [ "$t" = test_cuda ] && extra=(--undef-value-errors=no)
  if RUST_LOG=off valgrind "${extra[@]}" --error-exitcode=99 --leak-check=full \
      --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
      --suppressions=scripts/valgrind.supp --log-file="$log" "$build/$t" >"$build/$t.out" 2>&1; then
    status=ok
  else
    status="FAILED (exit $?)"
    failed=1
  fi
  summary=$(grep -E "ERROR SUMMARY|definitely lost|indirectly lost" "$log" | sed 's/^==[0-9]*== *//' | tr '\n' ';')
  echo "$t: $status in $(( $(date +%s) - start )) s; $summary"
done
exit $failed
