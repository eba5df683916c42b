#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/bench_builds.sh — kvbench-attn in two build types, side by side
# (make bench runs it): the default build (build/, RelWithDebInfo: -O2 -g)
# and a Release build (build-release/, CMake's -O3 -DNDEBUG), each with its
# own memcpy baseline and FP16 rows measured in the same run. Runs
# alternate between the two (RUNS times each, default 2), so that a busy
# machine slows both alike; every run's JSON is kept under OUT (default
# build/bench/), and the summary prints, per build and run: INT2 and INT4
# vs FP16 at 16K (median and best call; INT2+i8: KV_CONFIG_INT8_ATTN where
# the CPU has it), FP16's fraction of memcpy at each context >= 8K, and the
# median over runs.
#
#   scripts/bench_builds.sh [kvbench-attn options...]   (e.g. --quick)
#
# Needs both builds' kvbench-attn (make bench builds them) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-2}
out=${OUT:-build/bench}
mkdir -p "$out"
declare -A dir=([default]=${BUILD:-build} [release]=${RELEASE_BUILD:-build-release})
files=()
for r in $(seq 1 "$runs"); do
  for b in default release; do
    f=$out/attn-$b-run$r.json
    echo "kvbench-attn ($b build, run $r of $runs) -> $f" >&2
    "${dir[$b]}/bin/kvbench-attn" --json "$@" > "$f"
    files+=("$f")
  done
done
python3 - "${files[@]}" <<'EOF'
import json, statistics, sys

rows = {}  # build -> list of (file, summary)
for path in sys.argv[1:]:
    d = json.load(open(path))
    build = "release" if "-release-" in path else "default"
    res = d["results"]
    def pick(fmt, ctx, attn="exact", source="cache", batch=1):
        for r in res:
            if (r["format"], r.get("attn", "exact"), r["ctx"], r["source"],
                    r["batch"]) == (fmt, attn, ctx, source, batch):
                return r
    s = {"build_type": d.get("build", "?"), "memcpy": d["memcpy_gbps"],
         "load": d["loadavg"]}
    for fmt, attn, key in (("int2", "exact", "int2"), ("int4", "exact", "int4"),
                           ("int2", "int8", "int2+i8")):
        r = pick(fmt, 16384, attn)
        if r:
            s[key] = (r["speedup_vs_fp16"], r["speedup_best_vs_fp16"])
    s["fp16_frac"] = {}
    for r in res:
        if r["format"] == "fp16" and r["ctx"] >= 8192:
            key = "%dK%s%s" % (r["ctx"] // 1024, "x%d" % r["batch"] if r["batch"] > 1 else "",
                               " dram" if r["source"] == "memory" else "")
            s["fp16_frac"][key] = r["frac_of_memcpy"]
    rows.setdefault(build, []).append((path, s))

print("\nkvbench-attn, default build vs Release, CPU (ratios from the same run)")
print("%-8s %-14s %-6s %-13s %-13s %-13s %s" % ("build", "CMake type", "memcpy",
      "INT2/FP16 16K", "INT4/FP16 16K", "INT2+i8 16K", "FP16 frac of memcpy at >= 8K"))
for build in ("default", "release"):
    for path, s in rows.get(build, []):
        f = lambda k: "%.2fx (%.2fx)" % s[k] if k in s else "-"
        fr = " ".join("%s %.2f" % kv for kv in s["fp16_frac"].items())
        print("%-8s %-14s %-6.2f %-13s %-13s %-13s %s   [%s, load %.1f]" % (
            build, s["build_type"], s["memcpy"], f("int2"), f("int4"), f("int2+i8"), fr,
            path, s["load"][0]))
    ss = [s for _, s in rows.get(build, [])]
    if len(ss) > 1 and all("int2" in s for s in ss):
        med = statistics.median(s["int2"][0] for s in ss)
        fr = statistics.median(min(s["fp16_frac"].values()) for s in ss if s["fp16_frac"])
        i8 = (", INT2+i8 (KV_CONFIG_INT8_ATTN) %.2fx" % statistics.median(
            s["int2+i8"][0] for s in ss)) if all("int2+i8" in s for s in ss) else ""
        print("%-8s median over %d runs: INT2/FP16 at 16K %.2fx%s, lowest FP16 frac of memcpy %.2f"
              % (build, len(ss), med, i8, fr))
print("(x (y): median call (best call); frac: FP16 GB/s with the store's threads "
      "over single-thread memcpy GB/s; INT2+i8: approximate int8 attention, a CPU with "
      "AVX-512 VNNI + VBMI only)")
EOF
