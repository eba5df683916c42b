#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# setup_hf.sh — the optional extra of the Python binding, kvpage.transformers
# (docs/python.md, "Hugging Face transformers"): a cached venv holding the
# pinned torch, transformers, gguf and accelerate from PyPI (plus NumPy and
# pytest), used by the ctest python/transformers (python/run_hf.sh).
#
#   scripts/setup_hf.sh
#
# Venv: $KVPAGE_HF_VENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/venv-hf.
# Idempotent: a venv whose stamp names the same pins is left alone (no
# network). KVPAGE_NO_HF=1 skips it (the suite then skips, exit 77). Cost of
# a fresh install (measured): about 4 minutes and 5.6 GB, most of it the
# CUDA libraries PyPI's torch wheel depends on. Exit: 0 ok (or skipped), 1
# failure.
set -euo pipefail
PINS="torch==2.15.0 transformers==5.24.0 gguf==0.19.0 accelerate==1.15.0 numpy pytest"
[ "${KVPAGE_NO_HF:-0}" = 1 ] && { echo "setup_hf: KVPAGE_NO_HF=1: skipped"; exit 0; }
venv="${KVPAGE_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/venv-hf}"
stamp="$venv/kvpage-pins"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$PINS" ]; then
  exit 0
fi
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "setup_hf: installing $PINS into $venv (about 4 minutes, 5.6 GB)"
start=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv" || { echo "setup_hf: python3 -m venv failed (python3-venv)" >&2; exit 1; }
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet --disable-pip-version-check $PINS ||
  { echo "setup_hf: pip install failed" >&2; exit 1; }
echo "$PINS" > "$stamp"
echo "setup_hf: done in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
