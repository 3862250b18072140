#!/usr/bin/env bash
# The SGLang oracle's environment: a virtual environment holding sglang at
# the pinned release, installed with --no-deps, plus the one package its
# argument code imports that Python lacks (msgspec). No torch, no GPU
# packages: the modules that import them are stood in for by recording
# stubs that fail the run if the rules ever touch them (see
# python/tests/sglang_oracle_runner.py). Separate from any serving-tier
# environment on purpose: it is small (about 250 MB, most of it sglang's own
# wheel) and takes seconds once the wheel is cached.
#
#   scripts/sglang-oracle-env.sh            # prints the environment's python
#   SGLANG_ORACLE_VERSION=0.5.24 scripts/sglang-oracle-env.sh   # another release
#
# The environment lives under $PDX_SGLANG_ORACLE_DIR (default
# ~/.cache/pdx/sglang-oracle), one directory per version, and is reused
# while its marker says it is complete. Exit 2: it could not be built
# (no network, no venv module); the reason is on stderr.
set -euo pipefail

version="${SGLANG_ORACLE_VERSION:-0.5.23}"
root="${PDX_SGLANG_ORACLE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pdx/sglang-oracle}"
venv="$root/sglang-$version"
marker="$venv/.pdx-oracle-complete"
python="${PYTHON:-python3}"

if [[ -f "$marker" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

fail() {
  echo "sglang-oracle-env: $*" >&2
  exit 2
}

mkdir -p "$root" || fail "cannot create $root"
rm -rf "$venv"
"$python" -m venv "$venv" >&2 || fail "cannot create a virtual environment with $python -m venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
log="$venv/pip.log"
# pip's resolver lists every undeclared dependency of a --no-deps install on
# the next install; that is expected here, so it goes to the log.
"${pip[@]}" install --no-deps "sglang==$version" >"$log" 2>&1 ||
  { cat "$log" >&2; fail "pip could not install sglang==$version --no-deps (offline?)"; }
"${pip[@]}" install "msgspec" >>"$log" 2>&1 || { tail -5 "$log" >&2; fail "pip could not install msgspec (offline?)"; }
compgen -G "$venv/lib/python*/site-packages/sglang/srt/arg_groups/pd_disaggregation_hook.py" >/dev/null ||
  fail "sglang==$version has no srt/arg_groups/pd_disaggregation_hook.py"
touch "$marker"
echo "$venv/bin/python"
