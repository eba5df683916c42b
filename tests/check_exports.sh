#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The shared library must export exactly the functions declared KV_API in
# include/kvpage/kvpage.h, and those that sources kept for programs built
# against older headers declare KV_API themselves (store/kv_store_abi.c): no
# internal symbol leaks, no public one is missing.
# usage: check_exports.sh LIBKVPAGE_SO KVPAGE_H [ABI_SOURCE...]
set -euo pipefail
lib=$1
shift
want=$(grep -hoE '^KV_API [^;{]*\(' "$@" | sed -E 's/\($//; s/.*[ *]//' | sort -u)
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort -u)
if [ "$want" != "$got" ]; then
  echo "exported symbols differ from KV_API declarations:"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
echo "1 passed, 0 failed ($(echo "$want" | wc -l) KV_API symbols exported, nothing else)"
