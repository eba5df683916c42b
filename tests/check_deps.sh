#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The import graph of the library's folders (docs/design.md, "Layers"):
# prints every folder -> folder edge (with how many #include lines make it)
# and fails when
#   - the folders' graph has a cycle;
#   - formats/ includes anything outside formats/ but the public types
#     (include/kvpage/kvpage.h): the formats depend on nothing of kvpage;
#   - kernels/cuda/ includes the CPU backend's private headers (kernels/cpu/).
# A module is the longest of MODULES that prefixes a file's path; includes
# are resolved against the repository root, then the including file's
# folder; system headers (<...>) and files outside the modules are ignored.
# usage: check_deps.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
MODULES="include alloc formats pages kernels store model offload prefix remote"

module_of() { # path -> module, or empty
  local best="" m
  for m in $MODULES; do
    case $1 in "$m"/*) [ ${#m} -gt ${#best} ] && best=$m ;; esac
  done
  echo "$best"
}

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for m in $MODULES; do [ -d "$m" ] && echo "$m"; done | while read -r m; do
  find "$m" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
done | sort -u | while read -r f; do
  from=$(module_of "$f")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
  while read -r inc; do
    if [ -f "$inc" ]; then p=$inc
    elif [ -f "include/$inc" ]; then p=include/$inc
    elif [ -f "$(dirname "$f")/$inc" ]; then p=$(dirname "$f")/$inc
    else continue; fi
    to=$(module_of "$p")
    [ -n "$to" ] || continue
    echo "$from $to $f $p"
  done
done > "$edges"

fail=0
echo "import graph (folder -> folder: #include lines):"
awk '$1 != $2 {print $1 " -> " $2}' "$edges" | sort | uniq -c |
  awk '{printf "  %-14s -> %-14s %4d\n", $2, $4, $1}'

# formats/ depends on nothing of kvpage but the public types
bad=$(awk '$1 == "formats" && $2 != "formats" && $4 != "include/kvpage/kvpage.h" {print "  " $3 " includes " $4}' "$edges")
if [ -n "$bad" ]; then
  echo "formats/ must include nothing of kvpage but include/kvpage/kvpage.h:"
  echo "$bad"
  fail=1
fi
# the CUDA backend does not reach into the CPU backend
bad=$(awk '$3 ~ /^kernels\/cuda\// && $4 ~ /^kernels\/cpu\// {print "  " $3 " includes " $4}' "$edges")
if [ -n "$bad" ]; then
  echo "kernels/cuda/ must not include the CPU backend's headers:"
  echo "$bad"
  fail=1
fi
# no cycle between folders (depth-first search over the folder graph)
cycle=$(awk '$1 != $2 {e[$1] = e[$1] " " $2; n[$1]; n[$2]}
  function dfs(u,   i, k, v, a) {
    state[u] = 1; path[++depth] = u
    k = split(e[u], a, " ")
    for (i = 1; i <= k; i++) {
      v = a[i]
      if (state[v] == 1) { s = ""; for (j = 1; j <= depth; j++) s = s path[j] " -> "; print s v; found = 1 }
      else if (!state[v]) dfs(v)
    }
    depth--; state[u] = 2
  }
  END { for (u in n) if (!state[u]) dfs(u) }' "$edges" | sort -u | head -5)
if [ -n "$cycle" ]; then
  echo "cycle between folders:"
  echo "$cycle" | sed 's/^/  /'
  fail=1
fi
if [ $fail -ne 0 ]; then
  echo "0 passed, 1 failed"
  exit 1
fi
echo "1 passed, 0 failed (no cycle; formats/ depends on nothing of kvpage; kernels/cuda/ apart from kernels/cpu/)"
