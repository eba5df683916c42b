#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_consumers.sh — kvpage works for the ways a C project consumes it.
#
#   install   cmake --install BUILD into a prefix inside the build tree, check
#             what is installed (header; libkvpage.so, .so.MAJOR with that
#             soname, no jemalloc; libkvpage.a; the kvpage command running
#             from the prefix; README, LICENSE, docs, examples; kvpage.pc;
#             kvpageConfig.cmake and its version file), then build and run:
#               pkg-config    examples/*.c with $(pkg-config --cflags --libs
#                             kvpage), run against the installed .so
#               static        examples/minimal.c with libkvpage.a and
#                             $(pkg-config --static --libs kvpage): needs no
#                             libkvpage.so
#               find_package  tests/pkg/consumer (kvpage::kvpage and
#                             kvpage::kvpage_static), and a request for
#                             version 99 must fail
#   subdir    tests/pkg/consumer with add_subdirectory(SRC): both targets
#             build and run, and the subproject builds no tests or tools.
#
# examples/minimal.c creates a store, appends, runs prefill and decode
# attention and checks the result (exit 1 if wrong).
# Usage: check_consumers.sh install|subdir CMAKE BUILD_DIR SRC_DIR CC VERSION [FLAGS]
# FLAGS (e.g. the sanitizer flags of the build) go to every compile and link.
set -euo pipefail
mode=$1 cmake=$2 build=$3 src=$4 cc=$5 version=$6 flags=${7:-}
work=$build/pkg-check/$mode
rm -rf "$work"
mkdir -p "$work"
fail() { echo "check_consumers ($mode): $*" >&2; exit 1; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
run() { echo "+ $*"; "$@"; }

# Build tests/pkg/consumer in $1 with extra cmake arguments, run both programs.
consumer() {
  local dir=$1; shift
  run "$cmake" -S "$src/tests/pkg/consumer" -B "$dir" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="$flags" -DKV_EXAMPLE="$src/examples/minimal.c" "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "configuring the consumer failed"; }
  run "$cmake" --build "$dir" -j 2 --target consumer_shared consumer_static >>"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "building the consumer failed"; }
  run "$dir/consumer_shared"
  run "$dir/consumer_static"
  needed "$dir/consumer_shared" | grep -qx "libkvpage.so.${version%%.*}" ||
    fail "consumer_shared does not use libkvpage.so.${version%%.*}"
  ! needed "$dir/consumer_static" | grep -q libkvpage || fail "consumer_static needs libkvpage.so"
}

if [ "$mode" = subdir ]; then
  consumer "$work/build" -DKV_SUBDIR="$src"
  targets=$("$cmake" --build "$work/build" --target help)
  ! grep -qE 'test_alloc|kvpage_cli|kvbench' <<<"$targets" ||
    fail "the subproject builds tests, tools or benchmarks by default"
  echo "check_consumers: add_subdirectory consumer ok"
  exit 0
fi

prefix=$work/prefix
run "$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
pc=$(find "$prefix" -name kvpage.pc)
[ -n "$pc" ] || fail "no kvpage.pc installed"
libdir=$(dirname "$(dirname "$pc")")
major=${version%%.*}
for f in include/kvpage/kvpage.h share/doc/kvpage/README.md share/doc/kvpage/LICENSE \
         share/doc/kvpage/docs/offload.md share/doc/kvpage/examples/minimal.c; do
  [ -f "$prefix/$f" ] || fail "$f not installed"
done
for f in libkvpage.so "libkvpage.so.$major" "libkvpage.so.$version" libkvpage.a \
         cmake/kvpage/kvpageConfig.cmake cmake/kvpage/kvpageConfigVersion.cmake; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
readelf -d "$libdir/libkvpage.so.$version" | grep -q "SONAME.*\[libkvpage.so.$major\]" ||
  fail "libkvpage.so's soname is not libkvpage.so.$major"
! needed "$libdir/libkvpage.so.$version" | grep -q jemalloc || fail "libkvpage.so needs jemalloc"
out=$(env -u LD_LIBRARY_PATH "$prefix/bin/kvpage" --version) ||
  fail "the installed kvpage command does not run"
grep -q "^kvpage $version" <<<"$out" || fail "kvpage --version printed: $out"
# `kvpage plan` finds the installed eval reports beside the binary, from any
# directory (docs/plan.md, "Quality")
out=$(cd / && env -u LD_LIBRARY_PATH -u KVPAGE_EVAL_DIR "$prefix/bin/kvpage" plan \
      --workload fixed:161,338 --policies fp16,kivi2) || fail "the installed kvpage plan failed"
grep -q "quality: the kvpage eval reports in $prefix/bin/.*/docs/results" <<<"$out" &&
  grep -q "dPPL" <<<"$out" || fail "the installed kvpage plan did not read its eval reports: $out"

command -v pkg-config >/dev/null || fail "pkg-config missing (scripts/setup.sh installs it)"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion kvpage)" = "$version" ] || fail "pkg-config --modversion kvpage"
cflags=$(pkg-config --cflags kvpage)
libs=$(pkg-config --libs kvpage)
static_libs=$(pkg-config --static --libs kvpage | sed 's/-lkvpage\b/-l:libkvpage.a/')
for ex in "$src"/examples/*.c; do
  name=$(basename "$ex" .c)
  # shellcheck disable=SC2086 # flag lists split on purpose
  run "$cc" $flags -std=c11 -Wall -Wextra -Werror $cflags "$ex" -o "$work/pc_$name" $libs
  run env LD_LIBRARY_PATH="$libdir" "$work/pc_$name" "$work"
done
needed "$work/pc_minimal" | grep -qx "libkvpage.so.$major" || fail "pc_minimal: no libkvpage.so.$major"
# shellcheck disable=SC2086
run "$cc" $flags -std=c11 -Wall -Wextra -Werror $cflags "$src/examples/minimal.c" \
  -o "$work/static_minimal" $static_libs
! needed "$work/static_minimal" | grep -q libkvpage || fail "static_minimal needs libkvpage.so"
run "$work/static_minimal"

consumer "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DKV_WANT_VERSION="$version"
if "$cmake" -S "$src/tests/pkg/consumer" -B "$work/cmake99" -DCMAKE_PREFIX_PATH="$prefix" \
     -DKV_WANT_VERSION=99 -DKV_EXAMPLE="$src/examples/minimal.c" >"$work/cmake99.log" 2>&1; then
  fail "find_package(kvpage 99) succeeded against kvpage $version"
fi
echo "check_consumers: install, pkg-config, static and find_package consumers ok"
