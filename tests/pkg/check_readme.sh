#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_readme.sh — the code block README.md shows under the marker line
# "<!-- examples/minimal.c -->" is exactly examples/minimal.c.
# Usage: check_readme.sh SRC_DIR
set -euo pipefail
src=$1
block=$(awk '/^<!-- examples\/minimal.c -->$/ {m = 1; next}
             m == 1 && /^```c$/ {m = 2; next}
             m == 2 && /^```$/ {exit}
             m == 2 {print}' "$src/README.md")
[ -n "$block" ] || { echo "README.md: no code block after <!-- examples/minimal.c -->" >&2; exit 1; }
diff -u "$src/examples/minimal.c" - <<<"$block" ||
  { echo "README.md's program differs from examples/minimal.c (above)" >&2; exit 1; }
echo "README.md shows examples/minimal.c exactly"
