#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `kvpage run --prefix-cache --offload FILE` in two processes (docs/prefix.md,
# "The page-file tier"): the first creates the page file and, at exit,
# writes the cache's nodes to it; the second opens it, restores them and
# matches the prompt's blocks from the file (prefix_file_tokens ==
# prefix_tokens_matched > 0) and generates the same text; a third with
# another salt matches nothing. The file is made in a fresh directory.
# usage: check_run_offload.sh KVPAGE
set -euo pipefail
kv=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run=(run -p 'Say hi' -n 4 -t 2 --prefix-cache --offload "$tmp/cache.kvp" --json -)
"$kv" "${run[@]}" --offload-pages 4096 >"$tmp/1.json"
test -f "$tmp/cache.kvp" && test -f "$tmp/cache.kvp.idx"
"$kv" "${run[@]}" >"$tmp/2.json"
"$kv" "${run[@]}" --salt other >"$tmp/3.json"
python3 - "$tmp/1.json" "$tmp/2.json" "$tmp/3.json" <<'PY'
import json, sys
a, b, c = (json.load(open(f)) for f in sys.argv[1:4])
bad = []
if a["prefix_tokens_matched"] != 0:
    bad.append(f"first run matched {a['prefix_tokens_matched']} tokens of a new file")
if not (0 < b["prefix_file_tokens"] == b["prefix_tokens_matched"] < b["prompt_tokens"]):
    bad.append(f"second run: {b['prefix_file_tokens']} tokens from the file, "
               f"{b['prefix_tokens_matched']} matched of {b['prompt_tokens']}")
if b["text"] != a["text"]:
    bad.append(f"texts differ: {a['text']!r} / {b['text']!r}")
if c["prefix_tokens_matched"] != 0:
    bad.append(f"another salt matched {c['prefix_tokens_matched']} tokens")
print("\n".join(bad) if bad else
      f"1 passed, 0 failed ({b['prefix_file_tokens']} of {b['prompt_tokens']} prompt tokens "
      f"from the page file)")
sys.exit(1 if bad else 0)
PY
