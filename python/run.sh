#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh — runs Python against a given libkvpage.so, for CTest (python/pytest,
# example/python_decode): KVPAGE_LIB=LIB, this package on PYTHONPATH, no
# bytecode or pytest cache written into the source tree.
#   run.sh LIB ARGS...    = KVPAGE_LIB=LIB python3 ARGS...
# The interpreter is the first of $KV_PYTHON (CMake's), python3 on PATH and
# /usr/bin/python3 (Debian's, where scripts/setup.sh installs python3-numpy
# and python3-pytest) that imports numpy and pytest; none: exit 77 (skipped).
set -euo pipefail
lib=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
py=""
for c in ${KV_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c "import numpy, pytest" >/dev/null 2>&1; then
    py=$c; break
  fi
done
if [ -z "$py" ]; then
  echo "run.sh: no python3 with numpy and pytest (scripts/setup.sh installs python3-numpy python3-pytest): skipped"
  exit 77
fi
export KVPAGE_LIB=$lib PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
exec "$py" "$@"
