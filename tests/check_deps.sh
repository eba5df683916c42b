#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The layering rule (docs/design.md, "The layers"), stated once here and
# enforced: the modules in order, each with the modules it may include.
# Every #include of a module's file that lands in another module must be
# an allowed edge; the script prints the folder graph and fails on
#   - an edge the table does not allow (an upward or sideways include);
#   - a cycle between folders (the table allows none, checked anyway);
#   - kernels/cuda/ including the CPU backend's private headers
#     (kernels/cpu/): the two backends are siblings behind one interface.
# A module is the longest of the table's names that prefixes a file's path;
# includes are resolved against the repository root, include/, the
# including file's folder, then each module folder (the build's include
# path); system headers (<...>) and files outside the modules are ignored.
# Tests, benches and fuzzers may reach any module (they test it); they are
# not in the table.
# usage: check_deps.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# module: the modules it may include (besides itself). Lower layers first.
RULES="
include:
util: include
alloc: include
formats: include
kernels: include util alloc formats
pages: include util alloc formats kernels
offload: include util alloc
prefix: include util alloc
remote: include util alloc
store: include util alloc formats kernels pages offload prefix remote
model: include
tools: include util model
python: include
"
MODULES=$(echo "$RULES" | sed -n 's/^\([a-z/]*\):.*/\1/p' | tr '\n' ' ')

module_of() { # path -> module, or empty
  local best="" m
  for m in $MODULES; do
    case $1 in "$m"/*) [ ${#m} -gt ${#best} ] && best=$m ;; esac
  done
  echo "$best"
}

resolve() { # include string, including file -> path, or empty
  local m
  if [ -f "$1" ]; then echo "$1"; return; fi
  if [ -f "include/$1" ]; then echo "include/$1"; return; fi
  if [ -f "$(dirname "$2")/$1" ]; then echo "$(dirname "$2")/$1"; return; fi
  for m in $MODULES; do
    if [ -f "$m/$1" ]; then echo "$m/$1"; return; fi
  done
}

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for m in $MODULES; do [ -d "$m" ] && echo "$m"; done | while read -r m; do
  find "$m" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
    -o -name '*.py' \)
done | sort -u | while read -r f; do
  from=$(module_of "$f")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
  while read -r inc; do
    p=$(resolve "$inc" "$f")
    [ -n "$p" ] || continue
    to=$(module_of "$p")
    [ -n "$to" ] || continue
    echo "$from $to $f $p"
  done
done > "$edges"

fail=0
echo "import graph (folder -> folder: #include lines):"
awk '$1 != $2 {print $1 " -> " $2}' "$edges" | sort | uniq -c |
  awk '{printf "  %-14s -> %-14s %4d\n", $2, $4, $1}'

# every edge allowed by the table
bad=$(echo "$RULES" | awk -v edges="$edges" '
  /^[a-z\/]+:/ { m = $1; sub(/:$/, "", m); ok[m " " m] = 1
                 for (i = 2; i <= NF; i++) ok[m " " $i] = 1 }
  END { while ((getline line < edges) > 0) {
          split(line, f, " ")
          if (!((f[1] " " f[2]) in ok)) print "  " f[3] " includes " f[4] " (" f[1] " -> " f[2] ")"
        } }')
if [ -n "$bad" ]; then
  echo "includes the layering rule does not allow (tests/check_deps.sh, RULES):"
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
echo "1 passed, 0 failed (every include allowed by the layering rule; no cycle;" \
  "kernels/cuda/ apart from kernels/cpu/)"
