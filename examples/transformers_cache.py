# SPDX-License-Identifier: MIT
"""transformers_cache.py — kvpage as the KV cache of a Hugging Face
transformers model (kvpage.transformers, docs/python.md).

Loads SmolLM2-135M-Instruct from its GGUF with transformers (dequantized to
float32), then answers one prompt twice with greedy generate(): once with
transformers' DynamicCache and SDPA, once with a KvpageCache under a policy
(default "snapkv:c=128+int4": SnapKV keeps 128 tokens of the prompt, stored
INT4) and kvpage's attention. Prints both answers and the bytes each cache
holds at the end (DynamicCache: its float32 tensors; kvpage: the store's
pages, kv_stats_t.kv_bytes). Exit 1 if the store is not smaller or either
answer is empty.

Run: python3 examples/transformers_cache.py [POLICY]  (needs torch,
transformers, gguf and accelerate: scripts/setup_hf.sh; the model from
scripts/fetch_model.sh; KVPAGE_LIB=.../libkvpage.so if the library is not
installed where the loader looks)
"""
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import kvpage.transformers as kt

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(os.environ.get("KVPAGE_MODEL_DIR") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpage")
CONTEXT = """kvpage is a paged KV-cache store for LLM inference engines, written in C11.
An engine hands it the post-RoPE keys and values of every layer; kvpage keeps them in
fixed-size pages from a block allocator, shares pages between forked sequences
copy-on-write, compresses them (KIVI INT4/INT2 pages with an FP16 residual, MiniCache
merged layer pairs), compacts lists when a policy evicts tokens, and computes attention
directly over pages of any format. Its page-file tier moves cold sequences to an NVMe
page file through io_uring, and its prefix cache shares the pages of common prompts."""


def main() -> int:
    policy = sys.argv[1] if len(sys.argv) > 1 else "snapkv:c=128+int4"
    tok = AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE).eval()
    msgs = [{"role": "user", "content": CONTEXT + "\n\nIn one sentence: what does kvpage do?"}]
    inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)
    n_prompt = inputs["input_ids"].shape[1]
    gen = dict(max_new_tokens=40, do_sample=False)

    model.set_attn_implementation("sdpa")
    dyn = DynamicCache(config=model.config)
    out = model.generate(**inputs, cache=dyn, **gen)
    dyn_text = tok.decode(out[0, n_prompt:], skip_special_tokens=True)
    dyn_bytes = kt.dynamic_cache_bytes(dyn)

    model.set_attn_implementation(kt.ATTN_NAME)
    with kt.KvpageCache(model.config, policy=policy, max_tokens=n_prompt + 64) as cache:
        out = model.generate(**inputs, cache=cache, **gen)
        kv_text = tok.decode(out[0, n_prompt:], skip_special_tokens=True)
        kv_bytes = cache.kv_bytes()
        lens = cache.lens(0)[0]

    print(f"prompt: {n_prompt} tokens, {gen['max_new_tokens']} generated greedily")
    print(f"DynamicCache + SDPA  : {dyn_bytes:>10,} bytes  {dyn_text!r}")
    print(f"kvpage {policy:<14}: {kv_bytes:>10,} bytes  {kv_text!r}")
    print(f"kvpage lists at layer 0: {lens} tokens per kv head; "
          f"{dyn_bytes / max(kv_bytes, 1):.1f}x fewer bytes")
    return 0 if kv_bytes < dyn_bytes and dyn_text.strip() and kv_text.strip() else 1


if __name__ == "__main__":
    sys.exit(main())
