#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/gpu_check.sh — everything about the CUDA backend that needs a GPU,
# in one command (docs/gpu.md). On a machine with an NVIDIA GPU, from the
# repository root:
#
#   OUT=/some/dir scripts/gpu_check.sh [all|build|test|sanitize|bench]
#
#   build     configure build-gpu (KV_CUDA_ARCH, default 90 = sm_90; warnings
#             not errors unless GPU_CHECK_WERROR=ON) and build every CUDA
#             test (tests/cuda/test_cuda_*) and kvbench-attn; nvcc from PATH,
#             else /usr/local/cuda/bin; fails at once if CMake finds no CUDA
#   test      ctest -L cuda (every tests/cuda/test_cuda_*: host, attn,
#             convert, tiles), contexts up to KV_CUDA_TEST_MAX_CTX (default
#             here 131072)
#   sanitize  compute-sanitizer memcheck (leak check on), racecheck,
#             initcheck and synccheck on test_cuda_attn and test_cuda_convert
#             (contexts up to SAN_MAX_CTX, default 512: the tools are slow)
#   bench     kvbench-attn --backend cuda --json, SmolLM2 shape (9/3 heads,
#             head_dim 64) and Llama shape (32/8, 128); BENCH_ARGS are added
#             (e.g. "--quick", "--ctx 32768 --batch 32")
#   all       the four in turn (default); a failing step does not stop the
#             others; the exit status is that of the first failure
#
# Results (at most 8 files, as the device tool returns them) under $OUT
# (default ./gpu-results): summary.txt (one line per step: PASS/FAIL and
# what), build.log, test.log, sanitize.log, bench-smollm.json,
# bench-llama.json, nvidia-smi.txt.
#
# Dependencies: the build needs liburing, kvbench-alloc jemalloc (setup.sh). A
# GPU machine that cannot install packages gets them from .gpu-deps/: run
#   scripts/gpu_check.sh fetch-deps
# once on a machine with apt access (downloads the four .deb files there;
# .gpu-deps/ is git-ignored through .git/info/exclude) and carry .gpu-deps
# along; they are unpacked into .gpu-deps/root, never into /.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
step=${1:-all}
OUT=${OUT:-$PWD/gpu-results}
BUILD=${BUILD:-build-gpu}
ARCH=${KV_CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
MAX_CTX=${KV_CUDA_TEST_MAX_CTX:-131072}
SAN_MAX_CTX=${SAN_MAX_CTX:-512}
BENCH_ARGS=${BENCH_ARGS:-}
# -Werror is off here by default: the GPU machine's host compiler may be
# newer than CI's (gcc 13 vs 12) and warn about things CI does not see, and a
# warning must not cost the only GPU run; CI already builds with
# -DKV_WERROR=ON (nvcc included). GPU_CHECK_WERROR=ON turns it on.
WERROR=${GPU_CHECK_WERROR:-OFF}
DEPS=$PWD/.gpu-deps

if [ "$step" = fetch-deps ]; then
  mkdir -p "$DEPS"
  excl=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$excl")" &&
    { grep -qx '/.gpu-deps/' "$excl" 2>/dev/null || echo /.gpu-deps/ >>"$excl"; }
  (cd "$DEPS" && apt-get download libjemalloc-dev libjemalloc2 liburing-dev liburing2)
  ls -l "$DEPS"
  exit $?
fi

mkdir -p "$OUT"
summary=$OUT/summary.txt
status=0
note() { echo "$*" | tee -a "$summary"; }
result() { # step rc what
  if [ "$2" -eq 0 ]; then note "PASS $1: $3"; else note "FAIL $1 (rc $2): $3"; [ $status -ne 0 ] || status=$2; fi
}

deps_args=()
deps_done=0
use_deps() { # jemalloc/liburing from .gpu-deps when the system has none
  [ $deps_done -eq 0 ] || return 0
  deps_done=1
  if [ -z "${GPU_CHECK_FORCE_DEPS:-}" ]; then
    [ -f /usr/include/jemalloc/jemalloc.h ] && [ -f /usr/include/liburing.h ] && return 0
  fi
  [ -d "$DEPS" ] || return 0
  mkdir -p "$DEPS/root"
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$DEPS/root"; done
  local lib
  lib=$(dirname "$(find "$DEPS/root" -name 'libjemalloc.so*' | head -1)")
  deps_args=(-DCMAKE_PREFIX_PATH="$DEPS/root/usr" -DJEMALLOC_INCLUDE_DIR="$DEPS/root/usr/include"
             -DURING_INCLUDE_DIR="$DEPS/root/usr/include"
             -DJEMALLOC_LIBRARY="$(find "$DEPS/root" -name 'libjemalloc.so' | head -1)"
             -DURING_LIBRARY="$(find "$DEPS/root" -name 'liburing.so' | head -1)")
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "deps: jemalloc/liburing from $DEPS"
}

# nvcc: from PATH, else the toolkit's default place; CUDACXX tells CMake.
cuda_env() {
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  if [ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null 2>&1; then
    CUDACXX=$(command -v nvcc)
    export CUDACXX
  fi
}

# The CUDA tests CMake makes (tests/cuda/test_cuda_*.c and .cu, the same
# glob as CMakeLists.txt): every one ctest -L cuda runs must be built.
cuda_test_targets() {
  local f
  for f in tests/cuda/test_cuda_*.c tests/cuda/test_cuda_*.cu; do
    [ -e "$f" ] && basename "${f%.*}"
  done
}

do_build() {
  use_deps
  cuda_env
  { date; echo "CUDACXX=${CUDACXX:-}"; nvcc --version; cmake --version | head -1; } >"$OUT/build.log" 2>&1
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  local t0=$SECONDS rc cuda_args=() targets
  # an explicit compiler also replaces a NOTFOUND cached by an earlier
  # configure without nvcc
  [ -n "${CUDACXX:-}" ] && cuda_args=(-DCMAKE_CUDA_COMPILER="$CUDACXX")
  cmake -S . -B "$BUILD" -DKV_WERROR="$WERROR" -DKV_CUDA_ARCH="$ARCH" "${cuda_args[@]}" \
    "${deps_args[@]}" >>"$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q 'kvpage: CUDA compiler found' "$OUT/build.log"; then
    note "build: CMake configured $BUILD without CUDA (no nvcc on PATH, in /usr/local/cuda/bin or CUDACXX='${CUDACXX:-}'): set CUDACXX to nvcc's path"
    result build 1 "no CUDA compiler (log: build.log)"
    return
  fi
  targets=$(cuda_test_targets | tr '\n' ' ')
  [ $rc -ne 0 ] || {
    echo "targets: $targets kvbench-attn" >>"$OUT/build.log"
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$JOBS" --target $targets kvbench-attn >>"$OUT/build.log" 2>&1
    rc=$?
  }
  result build $rc "sm_$ARCH, KV_WERROR=$WERROR, $((SECONDS - t0)) s, $BUILD (log: build.log)"
}

do_test() {
  use_deps
  KV_CUDA_TEST_MAX_CTX=$MAX_CTX ctest --test-dir "$BUILD" -L cuda --output-on-failure \
    >"$OUT/test.log" 2>&1
  local rc=$?
  # a skip (exit 77: no GPU) must not pass for a run on a GPU
  if [ $rc -eq 0 ] && grep -q "Skipped\|Not Run" "$OUT/test.log"; then rc=77; fi
  result test $rc "ctest -L cuda, contexts up to $MAX_CTX (log: test.log)"
}

do_sanitize() {
  use_deps
  local san rc=0 r
  cuda_env
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  : >"$OUT/sanitize.log"
  for tool in memcheck racecheck initcheck synccheck; do
    local extra=()
    [ $tool = memcheck ] && extra=(--leak-check full)
    for t in attn convert; do
      echo "=== $tool test_cuda_$t" >>"$OUT/sanitize.log"
      KV_CUDA_TEST_MAX_CTX=$SAN_MAX_CTX "$san" --tool $tool --error-exitcode 99 \
        "${extra[@]}" "$BUILD/bin/test_cuda_$t" >>"$OUT/sanitize.log" 2>&1
      r=$?
      echo "=== $tool test_cuda_$t: rc $r" >>"$OUT/sanitize.log"
      [ $r -eq 0 ] || rc=$r
      note "  $tool test_cuda_$t: rc $r"
    done
  done
  result sanitize $rc "compute-sanitizer memcheck racecheck initcheck synccheck (log: sanitize.log)"
}

do_bench() {
  use_deps
  local rc
  # shellcheck disable=SC2086
  "$BUILD/bin/kvbench-attn" --backend cuda --json $BENCH_ARGS >"$OUT/bench-smollm.json" 2>>"$summary"
  rc=$?
  # shellcheck disable=SC2086
  "$BUILD/bin/kvbench-attn" --backend cuda --json --shape llama $BENCH_ARGS \
    >"$OUT/bench-llama.json" 2>>"$summary" || rc=$?
  result bench $rc "kvbench-attn --backend cuda --json [--shape llama] $BENCH_ARGS"
}

case "$step" in
  build) do_build ;;
  test) do_test ;;
  sanitize) do_sanitize ;;
  bench) do_bench ;;
  all) do_build; do_test; do_sanitize; do_bench ;;
  *) echo "usage: $0 [all|build|test|sanitize|bench|fetch-deps]" >&2; exit 2 ;;
esac
exit $status
