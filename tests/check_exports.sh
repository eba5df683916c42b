#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The shared library must export exactly the functions declared KV_API in
# include/kvpage/kvpage.h: no internal symbol leaks, no public one is missing.
# usage: check_exports.sh LIBKVPAGE_SO KVPAGE_H
set -euo pipefail
lib=$1 hdr=$2
want=$(grep -oE '^KV_API [^;{]*\(' "$hdr" | sed -E 's/\($//; s/.*[ *]//' | sort -u)
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort -u)
if [ "$want" != "$got" ]; then
  echo "exported symbols differ from KV_API declarations:"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
echo "1 passed, 0 failed ($(echo "$want" | wc -l) KV_API symbols exported, nothing else)"
