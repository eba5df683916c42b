#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_python.sh — the Python package installs with pip and imports with
# nothing but the installed library (issue 15): cmake --install BUILD into a
# prefix, `pip install` python/ (a copy: the source tree stays clean) into a
# fresh venv (--system-site-packages: NumPy from Debian; offline, no build
# isolation: nothing downloaded, nothing compiled), then from another
# directory, without KVPAGE_LIB, the venv's python imports kvpage with the
# prefix's lib/ on the loader path, and runs examples/python_decode.py.
# Usage: check_python.sh CMAKE BUILD_DIR SRC_DIR [PYTHON]
# Exit 77 only where no python3 with numpy and the venv module exists.
set -euo pipefail
cmake=$1 build=$2 src=$3 want_py=${4:-}
work=$build/pkg-check/python
fail() { echo "check_python: $*" >&2; exit 1; }
py=""
for c in $want_py python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c "import numpy, venv, ensurepip" >/dev/null 2>&1; then
    py=$c; break
  fi
done
[ -n "$py" ] || { echo "check_python: no python3 with numpy and venv: skipped"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" >"$work/install.log"
libdir=$(dirname "$(find "$work/prefix" -name 'libkvpage.so.0' | head -1)")
[ -e "$libdir/libkvpage.so.0" ] || fail "no libkvpage.so.0 installed"
"$py" -m venv --system-site-packages "$work/venv"
cp -r "$src/python" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
"$work/venv/bin/pip" install -q --no-build-isolation --no-deps --no-index "$work/src" ||
  fail "pip install python/ failed"
cd "$work"
out=$(env -u KVPAGE_LIB -u PYTHONPATH LD_LIBRARY_PATH="$libdir" "$work/venv/bin/python" -c '
import kvpage
assert kvpage.__file__.startswith("'"$work"'/venv/"), kvpage.__file__
assert kvpage.lib_path == "libkvpage.so.0", kvpage.lib_path
print("kvpage", kvpage.version, "from", kvpage.__file__, "with", kvpage.lib_path)') ||
  fail "import kvpage from the venv failed"
echo "$out"
env -u KVPAGE_LIB -u PYTHONPATH LD_LIBRARY_PATH="$libdir" "$work/venv/bin/python" \
  "$src/examples/python_decode.py" || fail "examples/python_decode.py failed"
echo "check_python: pip install and import with the installed library ok"
