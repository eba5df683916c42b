#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what kvpage needs on a Debian machine, only what is missing:
# the C toolchain, CMake, jemalloc, liburing, clang + libFuzzer (fuzz
# targets), libcrypto, hiredis and Redis (prefix reuse), fortunes-min (an
# evaluation haystack), pip (to fetch the model wheel once), and Debian's
# python3 with NumPy, pytest, venv, setuptools and wheel (the Python binding,
# python/, and its tests). Runs as root, or through sudo. Idempotent; silent
# when all is present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjemalloc-dev liburing-dev clang libclang-rt-dev)
# Prefix reuse (docs/prefix.md): SHA-256 from libcrypto, the remote tier's
# client (hiredis), and the Redis servers its tests and benchmark start.
pkgs+=(libssl-dev libhiredis-dev redis-server redis-tools)
# `kvpage eval`'s second real-text haystack and perplexity text
# (docs/eval.md): Debian's fortune cookies, /usr/share/games/fortunes.
pkgs+=(fortunes-min)
# The Python binding (python/) and its pytest suite, run by make test; venv,
# setuptools and wheel for pkg/python_install (pip install python/ offline).
pkgs+=(python3 python3-numpy python3-pytest python3-venv python3-setuptools python3-wheel)
python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
