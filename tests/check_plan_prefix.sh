#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `kvpage plan --prefix-hit` against the same plan without it (docs/plan.md,
# "Prefix cache"): the figures without the cache are unchanged, and the
# prefix figures follow from what the store matched, checked as relations:
#   - every policy: hit <= F, prefill tokens = prompt x (1 - hit), pfx seqs
#     = floor((pool - groups x shared) / pfx pages/seq);
#   - fp16 (one fixed-length sample): the pages split exactly into the shared
#     prefix and the rest (shared + pfx pages/seq == pages/seq), the hit is
#     F x prompt rounded down to a 16-token block, and more sequences fit;
#   - h2o (the snapshot rule): the publisher's shared part is one chunk, so its
#     last node carries the statistics snapshot and the hit is FP16's;
#   - more groups never fit more sequences;
#   - --prefix-compressed (the shared prefix a compressed context): every
#     policy's hit is exactly F x prompt (a context is any length), and an
#     evicting policy (h2o) caches fewer shared pages than the same prefix
#     shared as appended blocks;
#   - KVzip is planned (its scoring pass simulated): the same pages per
#     sequence as SnapKV at the same c (both keep c of the prompt per list).
# usage: check_plan_prefix.sh KVPAGE
set -euo pipefail
kv=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
base=(plan --model llama-2-7b --gpu H100-80G --weights-gb 13.5 --workload fixed:1000,100
      --policies fp16,kivi2,h2o,snapkv:c=0.3,kvzip:c=0.3 --json -)
"$kv" "${base[@]}" >plain.json
"$kv" "${base[@]}" --prefix-hit 0.6 >p1.json
"$kv" "${base[@]}" --prefix-hit 0.6 --prefix-groups 40 --rate 2 >p40.json
"$kv" "${base[@]}" --prefix-hit 0.6 --prefix-compressed >p1c.json
python3 - plain.json p1.json p40.json p1c.json <<'EOF'
import json, math, sys
plain, p1, p40, p1c = (json.load(open(f)) for f in sys.argv[1:5])
bad = []
def check(ok, what):
    if not ok:
        bad.append(what)
prompt = plain["mean_prompt"]
for run, groups in ((p1, 1), (p40, 40)):
    check(run["prefix_hit"] == 0.6 and run["prefix_groups"] == groups, "inputs echoed")
    for a, b in zip(plain["results"], run["results"]):
        name, x = a["policy"], b["prefix"]
        for k in ("pages_per_seq", "max_seqs", "bytes_per_token", "max_ctx"):
            check(a[k] == b[k], f"{name}: {k} changed by --prefix-hit")
        check(0 <= x["hit"] <= 0.6, f"{name}: hit {x['hit']} outside [0, F]")
        check(abs(x["prefill_tokens"] - prompt * (1 - x["hit"])) < 1e-6 * prompt + 0.01,
              f"{name}: prefill tokens {x['prefill_tokens']} != prompt x (1 - hit)")
        room = run["pool_pages"] - groups * x["shared_pages"]
        want = math.floor(room / x["pages_per_seq"]) if room > 0 else 0
        check(x["max_seqs"] == want, f"{name}: pfx seqs {x['max_seqs']} != {want}")
        if name == "fp16":
            check(x["shared_pages"] + x["pages_per_seq"] == a["pages_per_seq"],
                  f"fp16: shared {x['shared_pages']} + own {x['pages_per_seq']} != "
                  f"{a['pages_per_seq']}")
            check(x["hit"] == (int(0.6 * prompt) // 16 * 16) / prompt, f"fp16: hit {x['hit']}")
            if groups == 1:
                check(x["max_seqs"] > a["max_seqs"], "fp16: sharing fits no more sequences")
        if name.startswith("h2o"):
            check(x["hit"] == (int(0.6 * prompt) // 16 * 16) / prompt and x["shared_pages"] > 0,
                  f"h2o: hit {x['hit']} (the node at the shared chunk's end has a snapshot)")
by = {r["policy"]: r for r in plain["results"]}
check(by["kvzip:c=0.3"]["pages_per_seq"] == by["snapkv:c=0.3"]["pages_per_seq"],
      f"kvzip: {by['kvzip:c=0.3']['pages_per_seq']} pages/seq, snapkv at the same c "
      f"{by['snapkv:c=0.3']['pages_per_seq']}")
for a, b in zip(p1["results"], p40["results"]):
    check(b["prefix"]["max_seqs"] <= a["prefix"]["max_seqs"],
          f"{a['policy']}: 40 groups fit more than 1")
check(p1c["prefix_compressed"] is True and p1["prefix_compressed"] is False,
      "--prefix-compressed echoed")
for a, b in zip(p1["results"], p1c["results"]):
    name, x = a["policy"], b["prefix"]
    check(x["hit"] == int(0.6 * prompt) / prompt, f"{name}: compressed hit {x['hit']}")
    if name.startswith("h2o"):
        check(0 < x["shared_pages"] < a["prefix"]["shared_pages"],
              f"h2o: compressed context {x['shared_pages']} pages, blocks "
              f"{a['prefix']['shared_pages']}")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print("1 passed, 0 failed")
EOF
