# SPDX-License-Identifier: MIT
"""python_decode.py — an engine's loop in Python over kvpage (docs/python.md).

A store for a small GQA model shape (4 layers, 8 query heads over 2 kv
heads, head_dim 64). Three requests of different prompt lengths are
prefilled layer by layer (append, then causal attention); the longest is
forked (its pages shared copy-on-write, as for parallel sampling); then all
four decode together for 16 steps, one batched attention call per layer and
step, the first under a StreamingLLM policy that keeps its lists at sink +
recent tokens. Every step's output for one sequence is checked against a
NumPy softmax(q K^T / sqrt(d)) V over what the store holds, and the stats
are printed at the end. Exit 1 on a mismatch.

Run: python3 examples/python_decode.py  (with KVPAGE_LIB=.../libkvpage.so
if the library is not installed where the loader looks)
"""
import sys

import numpy as np

import kvpage

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 8, 2, 64
PROMPTS, STEPS = (90, 33, 150), 16


def reference(q, seq, layer):
    """softmax(q K^T / sqrt(d)) V per query head over the lists seq holds."""
    out = np.empty((Q_HEADS, HEAD_DIM))
    group = Q_HEADS // KV_HEADS
    for h in range(Q_HEADS):
        k, v, _ = seq.read(layer, h // group)
        logits = k.astype(np.float64) @ q[h] / np.sqrt(HEAD_DIM)
        p = np.exp(logits - logits.max())
        out[h] = (p / p.sum()) @ v
    return out


def main() -> int:
    rng = np.random.default_rng(7)

    def tokens(n):  # keys and values of n tokens, as a model's layer gives them (FP16)
        shape = (n, KV_HEADS, HEAD_DIM)
        return (rng.standard_normal(shape).astype(np.float16),
                rng.standard_normal(shape).astype(np.float16))

    with kvpage.Store(n_layers=LAYERS, n_q_heads=Q_HEADS, n_kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, host_pages=1024) as store:
        seqs = [store.create_seq(policy="streamingllm:sink=4,recent=32")]
        seqs += [store.create_seq() for _ in PROMPTS[1:]]
        for seq, n in zip(seqs, PROMPTS):  # prefill, layer by layer
            for layer in range(LAYERS):
                seq.append(layer, *tokens(n))
                store.prefill(layer, seq, rng.standard_normal((n, Q_HEADS, HEAD_DIM),
                                                              dtype=np.float32))
            seq.prefill_end()
        seqs.append(seqs[2].fork())
        print(f"prefilled {PROMPTS} and forked the last: {store.stats().pages_used} pages")

        worst = 0.0
        for step in range(STEPS):
            for layer in range(LAYERS):
                for seq in seqs:
                    seq.append(layer, *tokens(1))
                q = rng.standard_normal((len(seqs), Q_HEADS, HEAD_DIM), dtype=np.float32)
                out = store.decode(layer, seqs, q)
                want = reference(q[2], seqs[2], layer)
                worst = max(worst, float(np.abs(out[2] - want).max()))
            seqs[0].step_end()  # the policy evicts back to sink + recent

        st = store.stats()
        print(f"decoded {STEPS} steps for {len(seqs)} sequences; lists: "
              f"{[s.len(0) for s in seqs]} tokens (the first under streamingllm)")
        print(f"pages used {st.pages_used} of {st.pages_capacity}, KV bytes {st.kv_bytes}, "
              f"compression ratio {st.compression_ratio():.2f}")
        print(f"largest difference from the NumPy reference: {worst:.2e}")
        ok = worst < 1e-4 and seqs[0].len(0) == 36 and seqs[3].len(0) == PROMPTS[2] + STEPS
        for seq in seqs:
            seq.free()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
