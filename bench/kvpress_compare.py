# SPDX-License-Identifier: MIT
"""kvpress_compare.py — kvpage's selection policies against NVIDIA kvpress's
presses of the same methods, on the same model, inputs and budget, in
kvpress's setting (the context compressed before the question is seen).

Inputs: the passkey items of `kvpage eval`, written by
`kvpage eval --dump-items -` (the token ids it feeds its own model: one
source of items); each context is asked its two questions.

Per context, ONE reference forward of the context (transformers, SDPA,
DynamicCache, SmolLM2-135M dequantized from the GGUF to float32) records per
layer the attention's input hidden states, RoPE tables, the post-RoPE keys,
values and queries. Then, per method:

  kvpress  the press's own code is applied to that record per layer, as its
           forward hook would have (a ScorerPress: score() then the top
           n_kept, as ScorerPress.compress; AdaKVPress.compress sets the
           masks; KVzipPress runs its reconstruction pass through the model
           on a copy of the cache and its compress_post). The hook runs after
           each layer's attention, so compressing afterwards sees the same
           inputs (--check verifies it against a live `with press(model)`).
  kvpage   a store sequence under the equivalent policy spec gets the same
           keys and values (kv_append) and the same queries in one
           kv_attn_prefill per layer (where its statistics come from), then
           kv_seq_prefill_end; for KVzip, a fork marked as the scoring pass
           (kv_seq_score_begin) gets the reconstruction pass's keys, values
           and queries recorded from kvpress's pass. The kept positions are
           read back per (layer, kv head) with kv_read.

Both budgets are n_kept = int(T * (1 - ratio)) per list (kvpress's
compute_n_kept), given to kvpage as a token count. Kept sets are compared per
(layer, kv head): Jaccard |A & B| / |A | B| and |A & B| / |A| (A kvpress's).
Each question is then answered greedily by both: kvpress on a DynamicCache
holding its compressed context (SDPA; AdaKV and KVzip through kvpress's
masking attention patch), kvpage in a fork of its compressed sequence through
kvpage.transformers (KvpageCache, attention "kvpage"), kv_seq_step_end after
the question and after every step, as `kvpage eval` does. Stop at a control
token or the item's max_new; scored as `kvpage eval` scores passkey answers
(the first run of digits equals the key).

Prints one JSON object (--json FILE too) and a Markdown table.

Run (docs/results.md, "kvpage against NVIDIA kvpress"):
  scripts/setup_kvpress.sh
  bash bench/run_kvpress.sh build/lib/libkvpage.so bench/kvpress_compare.py \\
       --ctx 512 --items 10 --ratio 0.75 --json docs/results/kvpress-compare.json
"""
import argparse
import importlib.metadata
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# kvpress first: it wraps every attention function registered at its import
# (the AdaKV/KVzip masking patch); "kvpage" is registered after, unwrapped.
import kvpress
from kvpress import (AdaKVPress, ExpectedAttentionPress, KVzipPress, SnapKVPress,
                     StreamingLLMPress)
from kvpress.utils import compute_n_kept, get_prerope_query_states
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.models.llama.modeling_llama import rotate_half

import kvpage
import kvpage.transformers as kt

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(os.environ.get("KVPAGE_MODEL_DIR") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpage")
REPO = Path(__file__).resolve().parents[1]
ROPE = "theta=100000,rope=halves"  # SmolLM2's RoPE in Hugging Face's layout

# method -> (kvpress press factory(ratio), kvpage spec(n_kept), what differs)
METHODS = {
    "streamingllm": (lambda r: StreamingLLMPress(compression_ratio=r, n_sink=4),
                     lambda n: f"streamingllm:sink=4,recent={n - 4}"),
    "snapkv": (lambda r: SnapKVPress(compression_ratio=r, window_size=64, kernel_size=5),
               lambda n: f"snapkv:w=64,k=5,c={n}"),
    "eattn": (lambda r: ExpectedAttentionPress(compression_ratio=r, n_future_positions=512,
                                               n_sink=4),
              lambda n: f"eattn:c={n},rw=0,w=0,sink=4,future=512,{ROPE}"),
    "adakv-snapkv": (lambda r: AdaKVPress(SnapKVPress(compression_ratio=r, window_size=64,
                                                      kernel_size=5), alpha_safeguard=0.2),
                     lambda n: f"snapkv:w=64,k=5,c={n},ada=1,alpha=0.2"),
    "kvzip": (lambda r: KVzipPress(compression_ratio=r, layerwise=True, n_sink=4),
              lambda n: f"kvzip:c={n},sink=4,ada=1,alpha=0"),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- items --------------------------------------------------------------------

def load_items(args):
    """The items as `kvpage eval --dump-items` writes them (a file, or the
    command run here with this run's --ctx/--items/--haystack/--seed)."""
    if args.items_file:
        text = Path(args.items_file).read_text()
    else:
        cmd = [args.kvpage, "eval", "--tasks", "passkey", "--ctx", str(args.ctx),
               "--items", str(args.items), "--haystack", args.haystack, "--questions", "2",
               "--seed", str(args.seed), "--dump-items", "-"]
        if args.model:
            cmd += ["--model", args.model]
        log("items:", " ".join(cmd))
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    items = [json.loads(line) for line in text.splitlines() if line.strip()]
    return items[:args.limit] if args.limit else items


def score_passkey(answer, gen):
    """`kvpage eval`'s passkey/needle rule (eval_item_score): the first run
    of digits in the generated text equals the key."""
    m = re.search(r"[0-9]+", gen)
    return int(bool(m) and m.group(0) == answer)


# ---- the reference forward ------------------------------------------------------

def post_rope_queries(module, hs, pe):
    q = get_prerope_query_states(module, hs)  # (1, Hq, T, D)
    cos, sin = pe
    return q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)


def record_forward(model, ids, cache, start):
    """Run ids through the model on cache; per layer: the attention's input
    hidden states, RoPE tables, and the new tokens' post-RoPE K, V, Q."""
    layers = model.model.layers
    rec = [dict() for _ in layers]

    def hook(module, args, kwargs, output):
        r = rec[module.layer_idx]
        hs, pe = kwargs["hidden_states"], kwargs["position_embeddings"]
        n = hs.shape[1]
        lay = cache.layers[module.layer_idx]
        r.update(hs=hs.detach().clone(), pe=(pe[0].clone(), pe[1].clone()),
                 k=lay.keys[:, :, -n:].detach().clone(), v=lay.values[:, :, -n:].detach().clone(),
                 q=post_rope_queries(module, hs, pe).detach())
        return output

    hooks = [l.self_attn.register_forward_hook(hook, with_kwargs=True) for l in layers]
    try:
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache,
                  position_ids=torch.arange(start, start + ids.shape[1]).unsqueeze(0))
    finally:
        for h in hooks:
            h.remove()
    return rec


def dyn_cache(model, kv):
    c = DynamicCache(config=model.config)
    for l, (k, v) in enumerate(kv):
        c.update(k.clone(), v.clone(), l)
    return c


def clear_masks(model):
    for l in model.model.layers:
        l.self_attn.masked_key_indices = None


# ---- kvpress --------------------------------------------------------------------

def kvpress_scorer(model, press, rec, n_kept):
    """A ScorerPress applied per layer as ScorerPress.compress does: kept
    indices (per layer (H, n_kept) sorted) and the compressed K/V."""
    kept, kv = [], []
    for l, layer in enumerate(model.model.layers):
        r, mod = rec[l], layer.self_attn
        kw = {"position_embeddings": r["pe"]}
        with torch.inference_mode():
            scores = press.score(mod, r["hs"], r["k"], r["v"], None, kw)
        idx = scores.topk(n_kept, dim=-1).indices  # as ScorerPress.compress
        g = idx.unsqueeze(-1).expand(-1, -1, -1, mod.head_dim)
        kv.append((r["k"].gather(2, g), r["v"].gather(2, g)))
        kept.append([sorted(idx[0, h].tolist()) for h in range(idx.shape[1])])
    return kept, kv, None


def masks_to_kept(masks, n_heads, T):
    """Kept positions per layer and head from kvpress's masked_key_indices."""
    kept = []
    for m in masks:
        keep = torch.ones(n_heads, T, dtype=torch.bool)
        if m is not None:
            _, h, s = m
            keep[h, s] = False
        kept.append([torch.nonzero(keep[h]).flatten().tolist() for h in range(n_heads)])
    return kept


def kvpress_adakv(model, press, rec, n_kept):
    masks = []
    for l, layer in enumerate(model.model.layers):
        r, mod = rec[l], layer.self_attn
        with torch.inference_mode():
            press.compress(mod, r["hs"], r["k"], r["v"], None,
                           {"position_embeddings": r["pe"]})
        masks.append(mod.masked_key_indices)
        mod.masked_key_indices = None
    T = rec[0]["k"].shape[2]
    kept = masks_to_kept(masks, rec[0]["k"].shape[1], T)
    return kept, [(r["k"], r["v"]) for r in rec], masks


def kvzip_prefix(tok):
    """KVzipPress.__call__'s prefix length and suffix ids (its own code's
    recipe, for a model whose tokenizer it cannot load by name)."""
    dummy = "dummy context"
    sep = "\n" + "#" * len(dummy)
    t = tok.apply_chat_template([{"role": "user", "content": dummy + sep}],
                                add_generation_prompt=True, tokenize=False)
    context, suffix = t.split(sep)
    prefix = context.split(dummy)[0]
    return (len(tok.encode(prefix, add_special_tokens=False)),
            torch.tensor([tok.encode(suffix, add_special_tokens=False)]))


def kvpress_kvzip(model, tok, press, ctx_ids, rec):
    """KVzipPress's scoring (_perform_kvzip_compression: the reconstruction
    pass through the model on a copy of the context's cache), recording that
    pass's keys, values and queries for kvpage. Returns the press (its
    score_val) and the recording (start, end, repeat ids, per layer K/V/Q)."""
    press.post_init_from_model(model)
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = model.model.rotary_emb
    press.prefix_length, press._suffix_ids = kvzip_prefix(tok)
    press._context_ids = ctx_ids
    press._cache = dyn_cache(model, [(r["k"], r["v"]) for r in rec])
    T = ctx_ids.shape[1]
    pairs = press.prepare(model, tok)
    assert len(pairs) == 1, "one reconstruction chunk (contexts < 2048 tokens)"
    rep = [dict() for _ in model.model.layers]

    def hook(module, args, kwargs, output):  # runs before KVzip's own hook
        hs, pe = kwargs["hidden_states"], kwargs["position_embeddings"]
        n = hs.shape[1]
        lay = press._cache.layers[module.layer_idx]
        rep[module.layer_idx].update(k=lay.keys[:, :, -n:].clone(),
                                     v=lay.values[:, :, -n:].clone(),
                                     q=post_rope_queries(module, hs, pe).detach())
        return output

    hooks = [l.self_attn.register_forward_hook(hook, with_kwargs=True)
             for l in model.model.layers]
    try:
        with torch.inference_mode():
            press._perform_kvzip_compression(model, tok)
    finally:
        for h in hooks:
            h.remove()
    clear_masks(model)
    return press, dict(t0=press.prefix_length, t1=T, layers=rep)


def kvzip_kept(model, press, layerwise):
    press.layerwise = layerwise
    with torch.inference_mode():
        press.compress_post(model)
    masks = [l.self_attn.masked_key_indices for l in model.model.layers]
    clear_masks(model)
    return masks


# ---- kvpage ----------------------------------------------------------------------

def kvpage_select(store, rec, spec, recon=None):
    """A sequence under spec holding the recorded context: appends, one
    prefill (statistics) per layer, the KVzip scoring pass when recon is
    given, prefill end. Returns the sequence and its kept positions."""
    seq = store.create_seq(policy=spec)
    T = rec[0]["k"].shape[2]
    for l, r in enumerate(rec):
        seq.append(l, r["k"][0].transpose(0, 1).contiguous(),
                   r["v"][0].transpose(0, 1).contiguous())
        if spec and not spec.startswith(("streamingllm", "kvzip")):
            store.prefill(l, seq, r["q"][0].transpose(0, 1).contiguous())
    if recon is not None:
        with seq.fork() as rp:
            rp.score_begin(seq, recon["t0"], recon["t1"])
            for l, r in enumerate(recon["layers"]):
                rp.append(l, r["k"][0].transpose(0, 1).contiguous(),
                          r["v"][0].transpose(0, 1).contiguous())
                store.prefill(l, rp, r["q"][0].transpose(0, 1).contiguous())
    seq.prefill_end()
    H = store.config.n_kv_heads
    kept = [[seq.read(l, h)[2].tolist() for h in range(H)] for l in range(len(rec))]
    assert all(p < T for lay in kept for hh in lay for p in hh)
    return seq, kept


class SeqView(kt.KvpageCache):
    """A KvpageCache over an existing store sequence (a fork of a compressed
    context) that already holds `seen` columns."""

    def __init__(self, config, store, seq, seen):
        super().__init__(config)
        self.store, self.seqs, self._prompt_done = store, [seq], True
        for lay in self.layers:
            lay.seen, lay.is_initialized, lay.device = seen, True, torch.device("cpu")

    def close(self):  # the store belongs to the caller
        self.seqs = []


# ---- answering -------------------------------------------------------------------

def greedy(model, cache, q_ids, start, max_new, specials, after=None):
    """Question ids through the model at positions start.., then greedy
    decoding: at most max_new tokens, stopping at a control token."""
    out = []
    pos = start
    with torch.inference_mode():
        ids = torch.tensor([q_ids])
        logits = model(input_ids=ids, past_key_values=cache, logits_to_keep=1,
                       position_ids=torch.arange(pos, pos + len(q_ids)).unsqueeze(0)).logits
        pos += len(q_ids)
        if after:
            after()
        for _ in range(max_new):
            nxt = int(logits[0, -1].argmax())
            if nxt in specials:
                break
            out.append(nxt)
            if len(out) == max_new:
                break
            logits = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache,
                           position_ids=torch.tensor([[pos]])).logits
            pos += 1
    return out


def answer_kvpress(model, tok, kv, masks, q, T, specials):
    model.set_attn_implementation("sdpa")
    cache = dyn_cache(model, kv)
    if masks is not None:
        for l, layer in enumerate(model.model.layers):
            layer.self_attn.masked_key_indices = masks[l]
    try:
        out = greedy(model, cache, q["ids"], T, q["max_new"], specials)
    finally:
        clear_masks(model)
    return tok.decode(out)


def answer_kvpage(model, tok, store, seq, q, T, specials):
    model.set_attn_implementation(kt.ATTN_NAME)
    with seq.fork() as f:
        view = SeqView(model.config, store, f, T)
        out = greedy(model, view, q["ids"], T, q["max_new"], specials, after=f.step_end)
    model.set_attn_implementation("sdpa")
    return tok.decode(out)


# ---- overlap ---------------------------------------------------------------------

def overlap(a_kept, b_kept):
    """Per (layer, head): Jaccard and |A & B| / |A| (A = a_kept)."""
    jac, rec = [], []
    for la, lb in zip(a_kept, b_kept):
        for ha, hb in zip(la, lb):
            A, B = set(ha), set(hb)
            inter = len(A & B)
            jac.append(inter / max(len(A | B), 1))
            rec.append(inter / max(len(A), 1))
    return jac, rec


def snapkv_maxpool_kept(model, rec, n_kept, w=64, k=5):
    """Diagnostic: kvpress's SnapKV window attention, scored kvpage's way
    (summed over the window rows and the query group, then max-pooled)."""
    kept = []
    for l, layer in enumerate(model.model.layers):
        r, mod = rec[l], layer.self_attn
        with torch.inference_mode():
            a = SnapKVPress.compute_window_attention(mod, r["hs"], r["k"], w, r["pe"])
            H = r["k"].shape[1]
            s = a.sum(dim=-2).view(1, H, -1, a.shape[-1]).sum(2)
            s = F.max_pool1d(s, kernel_size=k, padding=k // 2, stride=1)
            s = F.pad(s, (0, w), value=s.max().item() + 1)
            idx = s.topk(n_kept, dim=-1).indices
        kept.append([sorted(idx[0, h].tolist()) for h in range(H)])
    return kept


# ---- the run ---------------------------------------------------------------------

def live_check(model, press, ctx_ids, n_kept):
    """kvpress's own pipeline step: `with press(model)` over the context on
    a fresh DynamicCache; returns that cache (n_kept tokens per layer)."""
    cache = DynamicCache(config=model.config)
    model.set_attn_implementation("sdpa")
    with torch.inference_mode(), press(model):
        model(input_ids=ctx_ids, past_key_values=cache)
    for l, lay in enumerate(cache.layers):
        assert lay.keys.shape[2] == n_kept, (l, lay.keys.shape)
    return cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--ratio", type=float, default=0.75,
                    help="kvpress compression_ratio (fraction removed); kvpage keeps "
                         "int(T*(1-ratio)) per list")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--items", type=int, default=10, help="contexts per haystack")
    ap.add_argument("--haystack", default="licenses,fortunes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="first N contexts only")
    ap.add_argument("--items-file", help="items already dumped (kvpage eval --dump-items)")
    ap.add_argument("--kvpage", default=str(REPO / "build" / "bin" / "kvpage"))
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch and store threads (default 1: on the loaded 2-core machine "
                         "2 threads made each decode step 4x slower)")
    ap.add_argument("--check", action="store_true",
                    help="also run kvpress live (with press(model)) on each context and "
                         "require the offline application to keep the same keys")
    ap.add_argument("--json", help="also write the JSON to this file")
    ap.add_argument("--min-jaccard", default="",
                    help="METHOD=X,...: exit 1 unless the method's mean Jaccard is >= X "
                         "(the CTest smoke check bench/kvpress_smoke)")
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m} (of {', '.join(METHODS)})")
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    items = load_items(args)
    mfile = Path(args.model) if args.model else MODEL_DIR / MODEL_FILE
    tok = AutoTokenizer.from_pretrained(mfile.parent, gguf_file=mfile.name)
    model = AutoModelForCausalLM.from_pretrained(mfile.parent, gguf_file=mfile.name,
                                                 dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    for layer in model.model.layers:  # as BasePress.__call__ does
        layer.self_attn.rotary_emb = model.model.rotary_emb
    specials = set(tok.all_special_ids)
    cfg = model.config
    L, H, Hq = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.num_attention_heads
    D = cfg.hidden_size // Hq
    rows = ["none"] + methods + (["kvzip-global"] if "kvzip" in methods else [])
    acc = {r: {"kvpress": [], "kvpage": []} for r in rows}
    ov = {m: {"jaccard": [], "recall": []} for m in methods}
    diag = {"snapkv-maxpool": {"jaccard": [], "recall": []}}
    answers = []
    secs = {"reference": 0.0, "kvpress": 0.0, "kvpage": 0.0, "answer_kvpress": 0.0,
            "answer_kvpage": 0.0}
    clock = [time.perf_counter()]

    def lap(key):
        now = time.perf_counter()
        secs[key] += now - clock[0]
        clock[0] = now
    n_kept = 0
    for i, it in enumerate(items):
        t_item = time.perf_counter()
        ctx_ids = torch.tensor([it["context_ids"]])
        T = ctx_ids.shape[1]
        n_kept = compute_n_kept(T, args.ratio)
        cache = DynamicCache(config=cfg)
        model.set_attn_implementation("sdpa")
        clock[0] = time.perf_counter()
        rec = record_forward(model, ctx_ids, cache, 0)
        del cache
        lap("reference")
        room = T + 128 + max(len(q["ids"]) + q["max_new"] for q in it["questions"])
        store = kvpage.Store(n_layers=L, n_q_heads=Hq, n_kv_heads=H, head_dim=D,
                             host_pages=4 * L * H * (math.ceil(room / 16) + 2) + 64,
                             max_seqs=4, n_threads=args.threads)
        recon, zpress = None, None
        for row in rows:
            if row == "kvzip-global":
                masks = kvzip_kept(model, zpress, layerwise=False)
                kv_press = ([(r["k"], r["v"]) for r in rec], masks)
                spec = None
            elif row == "none":
                kv_press, spec = ([(r["k"], r["v"]) for r in rec], None), None
            else:
                mk_press, mk_spec = METHODS[row]
                press, spec = mk_press(args.ratio), mk_spec(n_kept)
                if row == "kvzip":
                    zpress, recon = kvpress_kvzip(model, tok, press, ctx_ids, rec)
                    masks = kvzip_kept(model, zpress, layerwise=True)
                    kept_a = masks_to_kept(masks, H, T)
                    kv_press = ([(r["k"], r["v"]) for r in rec], masks)
                elif row.startswith("adakv"):
                    kept_a, kv, masks = kvpress_adakv(model, press, rec, n_kept)
                    kv_press = (kv, masks)
                else:
                    kept_a, kv, _ = kvpress_scorer(model, press, rec, n_kept)
                    kv_press = (kv, None)
                    if args.check:
                        live = live_check(model, mk_press(args.ratio), ctx_ids, n_kept)
                        for l in range(L):
                            assert torch.equal(live.layers[l].keys, kv[l][0]), \
                                f"{row}: layer {l}: live kvpress kept other keys"
                        log(f"check: {row}: live kvpress == offline, all {L} layers")
            lap("kvpress")
            seq = None
            if row != "kvzip-global":
                seq, kept_b = kvpage_select(store, rec, spec,
                                            recon if row == "kvzip" else None)
                if row != "none":
                    j, r_ = overlap(kept_a, kept_b)
                    ov[row]["jaccard"] += j
                    ov[row]["recall"] += r_
                if row == "snapkv":
                    j, r_ = overlap(snapkv_maxpool_kept(model, rec, n_kept), kept_b)
                    diag["snapkv-maxpool"]["jaccard"] += j
                    diag["snapkv-maxpool"]["recall"] += r_
            lap("kvpage")
            for qi, q in enumerate(it["questions"]):
                a = answer_kvpress(model, tok, kv_press[0], kv_press[1], q, T, specials)
                lap("answer_kvpress")
                acc[row]["kvpress"].append(score_passkey(q["answer"], a))
                rec_ans = {"item": i, "question": qi, "row": row, "expect": q["answer"],
                           "kvpress": a}
                if seq is not None:
                    b = answer_kvpage(model, tok, store, seq, q, T, specials)
                    lap("answer_kvpage")
                    acc[row]["kvpage"].append(score_passkey(q["answer"], b))
                    rec_ans["kvpage"] = b
                answers.append(rec_ans)
            if seq is not None:
                seq.free()
        store.close()
        log(f"context {i + 1}/{len(items)}: {T} tokens, keep {n_kept}, "
            f"{time.perf_counter() - t_item:.1f} s")

    def stat(xs):
        return {"mean": round(sum(xs) / len(xs), 4), "min": round(min(xs), 4)} if xs else None

    result = {
        "model": str(mfile), "ratio": args.ratio, "ctx": args.ctx, "contexts": len(items),
        "answers_per_row": 2 * len(items), "threads": args.threads,
        "versions": {"kvpress": importlib.metadata.version("kvpress"),
                     "transformers": __import__("transformers").__version__,
                     "torch": torch.__version__, "kvpage": kvpage.version},
        "specs": {m: METHODS[m][1](n_kept) for m in methods}, "specs_n_kept": n_kept,
        "seconds": {k: round(v, 1) for k, v in secs.items()},
        "rows": [],
        "diagnostics": {k: {"jaccard": stat(v["jaccard"]), "recall": stat(v["recall"])}
                        for k, v in diag.items() if v["jaccard"]},
        "answers": answers,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    for r in rows:
        a, b = acc[r]["kvpress"], acc[r]["kvpage"]
        result["rows"].append({
            "method": r,
            "jaccard": stat(ov[r]["jaccard"]) if r in ov else None,
            "recall": stat(ov[r]["recall"]) if r in ov else None,
            "kvpress_correct": sum(a), "kvpage_correct": sum(b) if b else None, "n": len(a),
            "agree": sum(x == y for x, y in zip(a, b)) if b else None,
        })
    js = json.dumps(result)
    print(js)
    if args.json:
        Path(args.json).write_text(js + "\n")
    print()
    print(f"| method | ratio | Jaccard mean (min) | A&B/A mean (min) | kvpress | kvpage | "
          f"same score |")
    print("|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        def f(s):
            return f"{s['mean']:.3f} ({s['min']:.3f})" if s else "-"
        n = row["n"]
        kp = f"{row['kvpage_correct']}/{n}" if row["kvpage_correct"] is not None else "-"
        ag = f"{row['agree']}/{n}" if row["agree"] is not None else "-"
        print(f"| {row['method']} | {args.ratio if row['method'] != 'none' else 0} | "
              f"{f(row['jaccard'])} | {f(row['recall'])} | {row['kvpress_correct']}/{n} | "
              f"{kp} | {ag} |")
    log(f"wall {result['wall_s']} s; {result['seconds']}")
    bad = 0
    for part in filter(None, args.min_jaccard.split(",")):
        m, x = part.split("=")
        row = next(r for r in result["rows"] if r["method"] == m)
        if row["jaccard"]["mean"] < float(x):
            log(f"{m}: mean Jaccard {row['jaccard']['mean']} < {x}")
            bad = 1
    sys.exit(bad)


if __name__ == "__main__":
    main()
