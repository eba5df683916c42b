#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_kvpress.sh — runs Python from the kvpress venv (scripts/setup_kvpress.sh)
# against a given libkvpage.so: python/run.sh with that venv's interpreter,
# for bench/kvpress_compare.py and its CTest smoke check (bench/kvpress_smoke).
#   run_kvpress.sh LIB ARGS...
# Exit 77 (skipped) when that venv lacks kvpress, torch, transformers or gguf
# (scripts/setup_kvpress.sh was not run) or the model file is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="${KVPAGE_KVPRESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/venv-kvpress}"
model="${KVPAGE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage}/SmolLM2-135M-Instruct.Q4_1.gguf"
if ! "$venv/bin/python" -c "import kvpress, torch, transformers, gguf, numpy, pytest" \
     >/dev/null 2>&1; then
  echo "run_kvpress.sh: no venv with kvpress at $venv (scripts/setup_kvpress.sh): skipped"
  exit 77
fi
if [ ! -f "$model" ]; then
  echo "run_kvpress.sh: no $model (scripts/fetch_model.sh): skipped"
  exit 77
fi
KV_PYTHON="$venv/bin/python" exec bash "$here/../python/run.sh" "$@"
