#!/usr/bin/env bash
# Builds pdx with CMake from a copy of the repository as a clone has it (the
# files git tracks, as the working tree has them: no target/, no build/), in a
# fresh build directory, installs it into fresh temporary prefixes and builds
# the consumer programs of c_tests/consumers/ against them the ways users do:
#   - C through `pkg-config --cflags --libs pdx` (shared), and through
#     `pkg-config --static` against a static-only prefix;
#   - C++17 through find_package(pdx) (pdx::pdx and pdx::pdx_static);
#   - C++17 through add_subdirectory(pdx) from a parent project.
# Each program does a loopback write and read through two tcp engines and
# runs without LD_LIBRARY_PATH. readelf checks the SONAME, what each program
# records as NEEDED, and its run path. Nothing may be written into the copy.
# cargo's target directory is the checkout's (CARGO_TARGET_DIR, else target/),
# passed as PDX_CARGO_TARGET_DIR. The script runs `cargo build --release` (the
# README's build) first, and fails if the CMake build's cargo step then
# compiles anything: CMake must reuse what cargo built (same packages, same
# features), not rebuild libpdx.
# Mooncake's C API: the installed transfer_engine.pc sits beside
# libtransfer_engine.so in <libdir>/pdx/mooncake (never in <libdir>/pkgconfig),
# and the example of docs/mooncake-c-api.md (c_tests/consumers/mooncake_c_api.c,
# shown there whole) is built with the compile line the document gives.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ $# -eq 0 ] || { echo "usage: $0 (no arguments; it configures its own build directory)" >&2; exit 2; }
cargo_target=${CARGO_TARGET_DIR:-$root/target}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
runpath() { readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p'; }
# Every entry under $1 with its type, size and time: any file written, removed or changed shows.
listing() { find "$1" -printf '%P %y %s %T@\n' | sort; }
quiet() { "$@" >"$tmp/log" 2>&1 || { tail -n 40 "$tmp/log" >&2; fail "$*"; }; }
cc=${CC:-cc}
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

echo "== configure, build and install from a fresh copy of the tracked files"
src=$tmp/pdx
mkdir "$src"
# Times are kept, so cargo sees the sources as old as the checkout's; files
# deleted in the working tree are left out, as their next commit has them.
git ls-files -z | while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null --no-recursion -T - -cf - | tar -xf - -C "$src"
[ -f "$src/CMakeLists.txt" ] && [ ! -e "$src/target" ] && [ ! -e "$src/build" ] || fail "the copy is not a clean tree"
listing "$src" >"$tmp/src.before"
build=$tmp/build
# The README's `cargo build --release`, in the copy (it writes only into the target directory).
quiet cargo build --release --manifest-path "$src/Cargo.toml" --target-dir "$cargo_target"
quiet cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPDX_BUILD_TESTS=OFF \
  -DPDX_CARGO_TARGET_DIR="$cargo_target"
start=$SECONDS
quiet cmake --build "$build" -j 2
if grep -E '^ *Compiling ' "$tmp/log" >&2; then
  fail "CMake's cargo step compiled the crates above right after cargo build --release (it must select the same packages)"
fi
echo "ok: after cargo build --release, the CMake build compiled nothing ($((SECONDS - start)) s)"
soname=$(readelf -d "$build/pdx-lib/libpdx.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')

echo "== install to a fresh prefix"
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name pdx.pc)
[ -n "$pc" ] || fail "no pdx.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir pdx)
[ -f "$libdir/libpdx.a" ] || fail "no libpdx.a in $libdir"
[ -f "$(pkg-config --variable=includedir pdx)/pdx.h" ] || fail "no pdx.h in the include directory"
real=$(readlink -f "$libdir/libpdx.so")
got=$(readelf -d "$real" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$got" = "$soname" ] && [ -n "$got" ] || fail "installed $(basename "$real") has SONAME '$got', not '$soname'"
[ "$(readlink "$libdir/libpdx.so")" = "$soname" ] || fail "libpdx.so does not link to $soname"
echo "ok: $(basename "$real") SONAME $got, $(stat -c %s "$real") bytes; pkg-config: $(pkg-config --cflags --libs pdx)"

echo "== C, pkg-config, shared"
exe=$tmp/c_shared
# A non-standard prefix needs an rpath (or ldconfig / LD_LIBRARY_PATH).
"$cc" "${cflags[@]}" "$src/c_tests/consumers/loopback.c" -o "$exe" $(pkg-config --cflags --libs pdx) \
  -Wl,-rpath,"$libdir"
needed "$exe" | grep -qx "$soname" || fail "c_shared does not record NEEDED $soname: $(needed "$exe" | tr '\n' ' ')"
[ "$(runpath "$exe")" = "$libdir" ] || fail "c_shared run path is '$(runpath "$exe")'"
"$exe"

echo "== Mooncake's C API: <libdir>/pdx/mooncake/libtransfer_engine.so"
mcdir=$libdir/pdx/mooncake
mchdr=$(pkg-config --variable=includedir pdx)/mooncake
[ -f "$mcdir/libtransfer_engine.so" ] || fail "no libtransfer_engine.so in $mcdir"
[ -f "$mchdr/transfer_engine_c.h" ] || fail "no transfer_engine_c.h in $mchdr"
[ ! -e "$libdir/libtransfer_engine.so" ] || fail "libtransfer_engine.so shadows Mooncake's in $libdir"
got=$(readelf -d "$mcdir/libtransfer_engine.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$got" = libtransfer_engine.so ] || fail "libtransfer_engine.so has SONAME '$got'"
mcpc=$mcdir/pkgconfig/transfer_engine.pc
[ -f "$mcpc" ] || fail "no transfer_engine.pc in $mcdir/pkgconfig"
[ "$(find "$prefix" -name transfer_engine.pc)" = "$mcpc" ] || fail "transfer_engine.pc installed elsewhere too"
# The example and its compile line, as docs/mooncake-c-api.md shows them.
example=$src/c_tests/consumers/mooncake_c_api.c
doc=$src/docs/mooncake-c-api.md
python3 - "$doc" "$example" <<'PY' || fail "docs/mooncake-c-api.md does not show $(basename "$example") whole"
import sys
doc, example = (open(p).read() for p in sys.argv[1:])
sys.exit(0 if f"```c\n{example}```\n" in doc else 1)
PY
compile='cc mooncake_c_api.c -o mooncake_c_api $(pkg-config --cflags --libs transfer_engine) -Wl,-rpath,$(pkg-config --variable=libdir transfer_engine)'
grep -qF -- "$compile" "$doc" || fail "docs/mooncake-c-api.md lacks the compile line: $compile"
exe=$tmp/mooncake_c_api
(
  export PKG_CONFIG_PATH=$mcdir/pkgconfig
  [ "$(pkg-config --variable=libdir transfer_engine)" = "$mcdir" ] || fail "transfer_engine.pc names another libdir"
  cflags_te=$(pkg-config --cflags transfer_engine | xargs)
  [ "$cflags_te" = "-I$mchdr" ] || fail "transfer_engine.pc: cflags $cflags_te"
  cd "$tmp" && cp "$example" . && eval "${compile/#cc /$cc ${cflags[*]} }"
)
needed "$exe" | grep -qx libtransfer_engine.so || fail "mooncake_c_api does not record NEEDED libtransfer_engine.so"
[ "$(runpath "$exe")" = "$mcdir" ] || fail "mooncake_c_api run path is '$(runpath "$exe")'"
needed "$exe" | grep -q libpdx && fail "mooncake_c_api needs libpdx too"
RUST_LOG=off "$exe"

echo "== C, pkg-config --static, static-only prefix"
sprefix=$tmp/static-prefix
cmake --install "$build" --prefix "$sprefix" --component Static >/dev/null
cmake --install "$build" --prefix "$sprefix" --component Development >/dev/null
ls "$sprefix"/lib*/libpdx.so* >/dev/null 2>&1 && fail "the static-only prefix has a libpdx.so"
exe=$tmp/c_static
"$cc" "${cflags[@]}" "$src/c_tests/consumers/loopback.c" -o "$exe" \
  $(PKG_CONFIG_PATH=$(dirname "$(find "$sprefix" -name pdx.pc)") pkg-config --static --cflags --libs pdx)
needed "$exe" | grep -q libpdx && fail "c_static still needs libpdx.so"
# The README's static-link list is what the installed pdx.pc prints.
static_libs=$(PKG_CONFIG_PATH=$(dirname "$(find "$sprefix" -name pdx.pc)") pkg-config --static --libs-only-l pdx | xargs)
grep -qF -- "\`$static_libs\`" "$src/README.md" ||
  fail "README.md's static-link list differs from pkg-config --static --libs-only-l: $static_libs"
"$exe"

echo "== C++17, find_package(pdx)"
quiet cmake -S "$src/c_tests/consumers/find_package" -B "$tmp/fp" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release
quiet cmake --build "$tmp/fp" -j 2
needed "$tmp/fp/consumer_shared" | grep -qx "$soname" || fail "consumer_shared does not need $soname"
needed "$tmp/fp/consumer_static" | grep -q libpdx && fail "consumer_static still needs libpdx.so"
[ "$(runpath "$tmp/fp/consumer_shared")" = "$libdir" ] || fail "consumer_shared run path is '$(runpath "$tmp/fp/consumer_shared")'"
"$tmp/fp/consumer_shared" "c++ find_package, shared"
"$tmp/fp/consumer_static" "c++ find_package, static"

echo "== C++17, add_subdirectory(pdx)"
quiet cmake -S "$src/c_tests/consumers/subdirectory" -B "$tmp/sub" -DPDX_SOURCE_DIR="$src" \
  -DPDX_CARGO_TARGET_DIR="$cargo_target" -DCMAKE_BUILD_TYPE=Release
quiet cmake --build "$tmp/sub" -j 2
[ ! -e "$tmp/sub/pdx/test_basics" ] || fail "pdx's own tests were built inside a parent project"
needed "$tmp/sub/consumer_subdir" | grep -qx "$soname" || fail "consumer_subdir does not need $soname"
"$tmp/sub/consumer_subdir" "c++ add_subdirectory"

listing "$src" | diff "$tmp/src.before" - >&2 || fail "the build wrote into the source tree (lines above)"
echo "test-install: all consumers passed ($soname); the source copy is unchanged"
