#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_hf.sh — runs Python from the transformers venv against a given
# libkvpage.so, for CTest (python/transformers): python/run.sh with the venv
# scripts/setup_hf.sh makes as the interpreter.
#   run_hf.sh LIB ARGS...
# Exit 77 (skipped) when that venv lacks torch, transformers or pytest
# (scripts/setup_hf.sh, or KVPAGE_NO_HF=1 was set) or the model file is
# missing (scripts/fetch_model.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="${KVPAGE_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage/venv-hf}"
model="${KVPAGE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage}/SmolLM2-135M-Instruct.Q4_1.gguf"
if ! "$venv/bin/python" -c "import torch, transformers, gguf, accelerate, numpy, pytest" \
     >/dev/null 2>&1; then
  echo "run_hf.sh: no venv with torch and transformers at $venv (scripts/setup_hf.sh): skipped"
  exit 77
fi
if [ ! -f "$model" ]; then
  echo "run_hf.sh: no $model (scripts/fetch_model.sh): skipped"
  exit 77
fi
KV_PYTHON="$venv/bin/python" exec bash "$here/run.sh" "$@"
