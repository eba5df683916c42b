#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where `kvpage` writes its usage, and with what exit code (tools/kvpage/main.c,
# README "The kvpage command"): help asked for (`kvpage help`, `--help`, `-h`,
# `<command> --help`) goes to stdout, exit 0, nothing on stderr; a usage error
# (no command, an unknown command, an unknown option of any command) exits 2
# with its message on stderr and nothing on stdout. Also `kvpage plan` with a
# shape whose one-token sequence cannot fit the pool is refused at once (exit
# 2, the bytes it needs on stderr, within a few seconds: docs/plan.md).
# usage: check_cli_streams.sh KVPAGE
set -uo pipefail
kv=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# expect RC STREAM PATTERN ARGS...: exit code RC, PATTERN (grep -E) on STREAM
# (out or err), the other stream empty.
expect() {
  local rc=$1 stream=$2 pat=$3; shift 3
  "$kv" "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  local other=err; [ "$stream" = err ] && other=out
  if [ "$got" -ne "$rc" ] || ! grep -Eq -- "$pat" "$tmp/$stream" || [ -s "$tmp/$other" ]; then
    echo "FAIL: kvpage $* -> exit $got (want $rc, /$pat/ on std$stream, std$other empty)"
    sed 's/^/  stdout: /' "$tmp/out" | head -5
    sed 's/^/  stderr: /' "$tmp/err" | head -5
    fail=1
  fi
}
expect 2 err '^usage: kvpage <command>'
expect 0 out '^usage: kvpage <command>' help
expect 0 out '^usage: kvpage <command>' --help
expect 0 out '^usage: kvpage <command>' -h
expect 2 err "unknown command 'frobnicate'" frobnicate
for cmd in demo run eval stress plan; do
  expect 0 out "^usage: kvpage $cmd " "$cmd" --help
  expect 2 err "unknown option '--bogus'" "$cmd" --bogus
done
start=$(date +%s)
expect 2 err 'cannot hold one sequence: .* 274877906944 bytes of pages .* the KV pool has [0-9]+ bytes' \
  plan --layers 4096 --kv-heads 1024 --q-heads 1024 --head-dim 1024
secs=$(( $(date +%s) - start ))
if [ "$secs" -gt 5 ]; then
  echo "FAIL: the impossible plan took ${secs}s to be refused"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
