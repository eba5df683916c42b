# SPDX-License-Identifier: MIT
"""kvpage inside Hugging Face transformers (kvpage/transformers.py,
docs/python.md "transformers"): SmolLM2-135M loaded from the GGUF with
transformers (dequantized to float32), its KV cache a KvpageCache and its
attention kvpage's paged kernels.

- FP16 pages against DynamicCache + SDPA: a 1024-token prompt and 64 decode
  steps (teacher-forced with the reference's greedy tokens, so both see the
  same inputs), every step's logits within LOGIT_TOL; the greedy tokens the
  same.
- generate() under every format and selection policy of the grammar (kvzip
  excepted: it needs an engine-run scoring pass) produces the tokens asked
  for; evicting policies leave shorter lists, formats fewer bytes.
- A batch of two prompts of different lengths (left padding): each row's
  greedy tokens equal those of the row generated alone.
Skipped when torch, transformers or the model file are missing (run by
python/run_hf.sh, which exits 77 first in that case).
"""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import kvpage.transformers as kt  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(os.environ.get("KVPAGE_MODEL_DIR") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpage")
REPO = Path(__file__).resolve().parents[2]

# FP16 pages round every stored key and value to binary16 (relative error
# <= 2^-11); the reference keeps float32. Over 30 layers that moves the
# logits (magnitudes ~10-30) by a few 1e-2 at most; measured max 2.4e-2
# (docs/python.md). The tolerance leaves 4x room; a missed token, a rotated
# key or attention over padding moves them by whole units.
LOGIT_TOL = 0.1
PROMPT, STEPS = 1024, 64
GEN_PROMPT, GEN = 160, 8  # generate() under each policy

SPECS = [
    "fp16", "kivi4", "kivi2", "int4", "int2",
    "streamingllm:sink=4,recent=64", "h2o:hh=32,rw=32", "snapkv:c=64", "snapkv:c=64+int4",
    "minikv:hh=32,rw=32", "eattn:c=64,theta=100000,rope=halves",
    "simlayerkv:w=64", "minicache", "minicache+int4", "streamingllm:sink=4,recent=64+cam",
    "h2o:hh=32,rw=32,ada=1",
]


@pytest.fixture(scope="module")
def model():
    if not (MODEL_DIR / MODEL_FILE).exists():
        pytest.skip(f"no {MODEL_DIR / MODEL_FILE} (scripts/fetch_model.sh)")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
    m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
    m.eval()
    return tok, m


def _text_ids(tok, n):
    """n token ids of real text (this repository's docs/design.md)."""
    ids = tok((REPO / "docs" / "design.md").read_text(), return_tensors="pt").input_ids
    assert ids.shape[1] >= n
    return ids[:, :n]


def _run(m, cache, ids, steps, forced=None):
    """Prefill ids, then steps greedy (or forced) tokens one at a time;
    returns (per-step last-position logits, tokens fed)."""
    logits, fed = [], []
    with torch.inference_mode():
        out = m(input_ids=ids, cache=cache, use_cache=True)
        for i in range(steps):
            last = out.logits[:, -1, :].float()
            logits.append(last)
            nxt = forced[i] if forced is not None else int(last.argmax(-1))
            fed.append(nxt)
            out = m(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
        logits.append(out.logits[:, -1, :].float())
    return torch.cat(logits), fed


def test_fp16_pages_match_dynamic_cache(model):
    tok, m = model
    ids = _text_ids(tok, PROMPT)
    m.set_attn_implementation("sdpa")
    ref_logits, ref_tokens = _run(m, DynamicCache(config=m.config), ids, STEPS)
    m.set_attn_implementation(kt.ATTN_NAME)
    with kt.KvpageCache(m.config, max_tokens=PROMPT + STEPS + 1) as cache:
        got_logits, _ = _run(m, cache, ids, STEPS, forced=ref_tokens)
        assert cache.lens(0) == [[PROMPT + STEPS] * 3]
        assert cache.get_seq_length() == PROMPT + STEPS
    diff = float((got_logits - ref_logits).abs().max())
    print(f"FP16 pages vs DynamicCache+SDPA: max |logit diff| {diff:.3e} over "
          f"{PROMPT} prompt tokens + {STEPS} steps")
    assert diff < LOGIT_TOL
    assert torch.equal(got_logits.argmax(-1), ref_logits.argmax(-1))


def _prompt(tok, text):
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True)


@pytest.mark.parametrize("spec", SPECS)
def test_generate_under_policy(model, spec):
    tok, m = model
    m.set_attn_implementation(kt.ATTN_NAME)
    ids = _text_ids(tok, GEN_PROMPT)
    with kt.KvpageCache(m.config, policy=spec, max_tokens=GEN_PROMPT + GEN) as cache:
        out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache,
                         max_new_tokens=GEN, min_new_tokens=GEN, do_sample=False)
        assert out.shape[1] == GEN_PROMPT + GEN
        text = tok.decode(out[0, GEN_PROMPT:])
        assert text.strip()
        lens = cache.lens(0)[0]
        kv_bytes = cache.kv_bytes()
    full = GEN_PROMPT + GEN - 1  # the last generated token is never fed back
    fp16_bytes = 30 * 3 * full * 64 * 2 * 2
    print(f"{spec}: lens at layer 0 {lens}, store {kv_bytes} B, text {text!r}")
    if spec == "fp16":
        assert lens == [full] * 3
    if spec.startswith(("streamingllm", "snapkv", "h2o", "minikv", "eattn")):
        assert max(lens) < full
    if spec.startswith("snapkv:c=64"):
        # 64 kept at prefill end, which runs before the first decode token
        # (were it left to the first step_end, that token would be selected
        # among the prompt's and one fewer kept)
        assert lens == [64 + GEN - 1] * 3
    if spec.startswith(("kivi", "int", "snapkv:c=64+int4")) or spec.endswith("+int4"):
        assert kv_bytes < fp16_bytes


def test_sampling_generate(model):
    tok, m = model
    m.set_attn_implementation(kt.ATTN_NAME)
    inputs = _prompt(tok, "Write one sentence about the sea.")
    torch.manual_seed(1)
    with kt.KvpageCache(m.config, policy="kivi4") as cache:
        out = m.generate(**inputs, cache=cache, max_new_tokens=12, min_new_tokens=12,
                         do_sample=True, temperature=0.8, top_p=0.95)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 12


def test_batch_of_prompts_of_different_lengths(model):
    tok, m = model
    texts = ["What is the capital of France?",
             "Explain in two sentences why the sky is blue, as to a child of five."]
    alone = []
    m.set_attn_implementation("sdpa")
    for t in texts:
        inputs = _prompt(tok, t)
        out = m.generate(**inputs, max_new_tokens=16, do_sample=False)
        alone.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    chats = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                     add_generation_prompt=True) for t in texts]
    batch = tok(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    assert not bool(batch["attention_mask"].all())  # the short row is padded
    m.set_attn_implementation(kt.ATTN_NAME)
    with kt.KvpageCache(m.config) as cache:
        out = m.generate(**batch, cache=cache, max_new_tokens=16, do_sample=False,
                         pad_token_id=tok.pad_token_id)
        real = batch["attention_mask"].sum(1).tolist()
        assert [r[0] for r in cache.lens(0)] == [n + 15 for n in real]
    width = batch["input_ids"].shape[1]
    for row, want in enumerate(alone):
        got = out[row, width:width + len(want)].tolist()
        assert got == want, f"row {row}: {tok.decode(got)!r} != {tok.decode(want)!r}"


def test_attention_without_kvpage_cache_is_refused(model):
    """After a KvpageCache forward, a forward without a cache or with a
    DynamicCache is refused: the attention never reads a stale store."""
    tok, m = model
    m.set_attn_implementation(kt.ATTN_NAME)
    ids = _text_ids(tok, 8)
    with kt.KvpageCache(m.config) as cache, torch.inference_mode():
        m(input_ids=ids, cache=cache, use_cache=True)
        for other in (None, DynamicCache(config=m.config)):
            with pytest.raises(RuntimeError, match="KvpageCache"):
                m(input_ids=ids, cache=other, use_cache=other is not None)


def test_dynamic_cache_bytes_is_what_it_holds(model):
    tok, m = model
    m.set_attn_implementation("sdpa")
    cache = DynamicCache(config=m.config)
    with torch.inference_mode():
        m(input_ids=_text_ids(tok, 40), cache=cache, use_cache=True)
    assert kt.dynamic_cache_bytes(cache) == 30 * 2 * 3 * 40 * 64 * 4
