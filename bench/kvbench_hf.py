# SPDX-License-Identifier: MIT
"""kvbench_hf.py — tokens/s of transformers' generate() with kvpage as the
cache and attention (kvpage.transformers) against DynamicCache + SDPA, on
SmolLM2-135M loaded from the GGUF (float32, CPU).

For each prompt length (real text, this repository's docs) and cache
(DynamicCache + SDPA, KvpageCache with FP16 pages, KvpageCache under
"kivi4"): one greedy generate() of --new tokens (min_new_tokens = new, so
every run decodes as many), timed as prefill (a generate of one token) and
the rest; prints one JSON object per run: prompt, cache, prefill_s,
decode_tok_s ((new - 1) / (total - prefill)), total_s, cache bytes at the
end. Not in CTest.

Run: bash python/run_hf.sh build/lib/libkvpage.so bench/kvbench_hf.py
     [--prompts 1024,4096] [--new 64] [--threads N]
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import kvpage.transformers as kt

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(os.environ.get("KVPAGE_MODEL_DIR") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpage")
REPO = Path(__file__).resolve().parents[1]


def text_ids(tok, n):
    text = "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    ids = tok(text, return_tensors="pt").input_ids
    assert ids.shape[1] >= n, f"only {ids.shape[1]} tokens of text"
    return ids[:, :n]


def run(model, ids, cache_fn, attn, new):
    model.set_attn_implementation(attn)
    times = []
    for n in (1, new):
        cache = cache_fn()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache,
                           max_new_tokens=n, min_new_tokens=n, do_sample=False)
        times.append(time.perf_counter() - t)
        nbytes = (cache.kv_bytes() if isinstance(cache, kt.KvpageCache)
                  else kt.dynamic_cache_bytes(cache))
        if isinstance(cache, kt.KvpageCache):
            cache.close()
    prefill, total = times
    return dict(prefill_s=round(prefill, 3), total_s=round(total, 3),
                decode_tok_s=round((new - 1) / max(total - prefill, 1e-9), 2), cache_bytes=nbytes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="1024,4096")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch and kvpage threads (0: torch's)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    tok = AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE).eval()
    for n in (int(x) for x in a.prompts.split(",")):
        ids = text_ids(tok, n)
        cases = [
            ("DynamicCache+sdpa", lambda: DynamicCache(config=model.config), "sdpa"),
            ("kvpage fp16", lambda: kt.KvpageCache(model.config, max_tokens=n + a.new,
                                                   n_threads=threads), kt.ATTN_NAME),
            ("kvpage kivi4", lambda: kt.KvpageCache(model.config, policy="kivi4",
                                                    max_tokens=n + a.new, n_threads=threads),
             kt.ATTN_NAME),
        ]
        for name, fn, attn in cases:
            r = run(model, ids, fn, attn, a.new)
            print(json.dumps(dict(prompt=n, new=a.new, threads=threads, cache=name, **r)),
                  flush=True)


if __name__ == "__main__":
    main()
