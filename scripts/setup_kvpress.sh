#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# setup_kvpress.sh — the venv of bench/kvpress_compare.py (docs/results.md,
# "kvpage against NVIDIA kvpress"): NVIDIA kvpress from PyPI, torch, the
# transformers kvpress accepts (0.5.x needs transformers < 5.3, so this is
# NOT the venv of scripts/setup_hf.sh), gguf, accelerate and pytest.
#
#   scripts/setup_kvpress.sh
#
# Venv: $KVPAGE_KVPRESS_VENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/
# venv-kvpress (a symbolic link there to a venv elsewhere works too).
# Idempotent: a venv whose stamp names the same pins is left alone (no
# network). torch comes from PyTorch's CPU index when it answers (no CUDA
# libraries to download), else from PyPI (measured with the CPU index
# unreachable: 200 s, 5.8 GB). Not run by `make test`. Exit: 0 ok, 1 failure.
set -euo pipefail
TORCH="torch==2.15.0"
PINS="kvpress==0.5.5 transformers==5.2.0 gguf==0.19.0 accelerate==1.15.0 numpy pytest"
venv="${KVPAGE_KVPRESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/venv-kvpress}"
stamp="$venv/kvpage-pins"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$TORCH $PINS" ]; then
  exit 0
fi
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "setup_kvpress: installing $TORCH (CPU) $PINS into $venv"
start=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv" || { echo "setup_kvpress: python3 -m venv failed (python3-venv)" >&2; exit 1; }
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" --timeout 20 --retries 1 "$TORCH" --index-url https://download.pytorch.org/whl/cpu ||
  echo "setup_kvpress: PyTorch's CPU index unreachable: torch from PyPI (with its CUDA libraries, 5 GB)"
# shellcheck disable=SC2086
"${pip[@]}" $PINS "$TORCH" ||
  { echo "setup_kvpress: pip install failed" >&2; exit 1; }
echo "$TORCH $PINS" > "$stamp"
echo "setup_kvpress: done in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
