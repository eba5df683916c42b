# SPDX-License-Identifier: MIT
"""transformers.py — kvpage as the KV cache of a Hugging Face transformers
model: KvpageCache (a transformers.Cache whose K/V live in one kvpage Store,
one sequence per batch row) and the "kvpage" attention function, which runs
kvpage's paged attention (kv_attn_prefill / kv_attn_decode) over whatever
formats the pages hold, so compressed pages are never expanded to tensors.

    import kvpage.transformers as kt
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvpage")
    cache = kt.KvpageCache(model.config, policy="snapkv:c=0.25+int4")
    out = model.generate(**inputs, cache=cache, max_new_tokens=64)

Importing this module needs torch and transformers (the binding's optional
extra `kvpage[transformers]`; kvpage itself does not import it) and
registers "kvpage" with transformers' AttentionInterface and
AttentionMaskInterface.

How a forward pass flows: the model applies RoPE, then calls
KvpageCache.update(k, v, layer) (which only records the new tokens and
returns them, so K/V are never materialised as full tensors), then the
"kvpage" attention function, which appends each batch row's real tokens
(padding dropped, from the 2-D mask the "kvpage" mask function hands it)
to the row's sequence and computes attention from the store: a query of one
row per batch entry is one batched kv_attn_decode, longer queries one
kv_attn_prefill per row (causal over the row's earlier tokens and the new
ones). Keys arrive post-RoPE and kvpage never rotates them.

Policies (docs/policies.md): the spec given to KvpageCache is set on every
sequence; kv_seq_prefill_end runs when the first one-token (decode) forward
arrives (or on KvpageCache.prefill_end()), kv_seq_step_end after every
decode forward's last layer. The statistics a policy needs are collected by
the store inside its own attention calls.

Ownership: a KvpageCache owns its Store (created at the first update, when
the batch size is known) until close(); reset() frees the sequences.
Invariants: get_seq_length() is the number of columns (padding included)
the model has fed, the position transformers gives the next token; the
store's lists may be shorter (evicted tokens, padding never stored).
Threads: one forward at a time per cache. The attention finds its cache
through the update that ran just before it on the calling thread (the same
layer, the very key tensor update returned); anything else (no cache,
another Cache class) is a RuntimeError, never a stale store.
"""
from __future__ import annotations

import math
import threading
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface

from .store import Seq, Store

ATTN_NAME = "kvpage"

_active = threading.local()


class KvpageLayer(CacheLayerMixin):
    """One model layer's view of a KvpageCache: counts the columns fed and
    keeps no tensors (the store holds the keys and values)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, cache: "KvpageCache", layer_idx: int) -> None:
        super().__init__()
        self._cache = cache
        self.layer_idx = layer_idx
        self.seen = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._cache._open(key_states)
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != len(self._cache.seqs):
            raise ValueError(f"KvpageCache: batch of {key_states.shape[0]} rows, the cache "
                             f"holds {len(self._cache.seqs)} sequences")
        self.seen += key_states.shape[-2]
        _active.pending = (self._cache, self.layer_idx, key_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length: Any) -> Tuple[int, int]:
        # the new columns' count: transformers >= 5.3 passes it, 5.0-5.2
        # (what kvpress 0.5 needs) the cache_position tensor of those columns
        n = query_length if isinstance(query_length, int) else int(query_length.shape[0])
        return self.seen + n, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # its name in transformers 5.0-5.2

    def reset(self) -> None:
        self.seen = 0
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("KvpageCache: beam search is not supported")


class KvpageCache(Cache):
    """A transformers Cache over one kvpage Store: batch row b is store
    sequence seqs[b]; every layer's K/V are appended to it, stored in FP16
    pages (or the format the policy gives: kivi4, snapkv:c=0.2+int4, ...).

    config: the model's config (layers, heads, head_dim). policy: a spec of
    docs/policies.md, or None (FP16, every token). max_tokens: the longest
    row (prompt + generated) the store is sized for (host_pages is computed
    from it unless given). store_fields: other kvpage.Config fields
    (n_threads, residual, page_bytes, host_pages...).
    Use it with attn_implementation="kvpage" (this module's attention
    function), which is the only attention that reads the store."""

    def __init__(self, config: PreTrainedConfig, policy: Optional[str] = None,
                 max_tokens: int = 8192, **store_fields: Any) -> None:
        cfg = config.get_text_config(decoder=True)
        self.n_layers = cfg.num_hidden_layers
        self.n_q_heads = cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_q_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_q_heads
        self.policy = policy
        self.max_tokens = max_tokens
        self.store_fields = store_fields
        self.store: Optional[Store] = None
        self.seqs: List[Seq] = []
        self._prompt_done = False
        super().__init__(layers=[KvpageLayer(self, i) for i in range(self.n_layers)])

    # ---- lifetime ---------------------------------------------------------

    def _open(self, key_states: torch.Tensor) -> None:
        """Create the store and one sequence per batch row (first update)."""
        if self.seqs:
            return
        if key_states.device.type != "cpu":
            raise ValueError("KvpageCache: the store uses the CPU backend; "
                             f"got tensors on {key_states.device}")
        batch = key_states.shape[0]
        if self.store is None:
            fields = dict(self.store_fields)
            if "host_pages" not in fields:
                per_list = math.ceil(self.max_tokens / 16) + 2
                fields["host_pages"] = batch * self.n_layers * self.n_kv_heads * per_list + 64
            fields.setdefault("max_seqs", max(batch, 1))
            self.store = Store(n_layers=self.n_layers, n_q_heads=self.n_q_heads,
                               n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, **fields)
        self.seqs = [self.store.create_seq(policy=self.policy) for _ in range(batch)]

    def reset(self) -> None:
        """Free every sequence (the store stays): the next update starts a
        new batch."""
        for s in self.seqs:
            if s.live:
                s.free()
        self.seqs = []
        self._prompt_done = False
        super().reset()

    def close(self) -> None:
        """Destroy the store (idempotent)."""
        self.seqs = []
        if self.store is not None:
            self.store.close()
            self.store = None

    def __enter__(self) -> "KvpageCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- policy phases ----------------------------------------------------

    def prefill_end(self) -> None:
        """The prompt is in: apply the policy's prefill-end decisions
        (kv_seq_prefill_end) on every row. Idempotent; the attention
        function calls it before the first decode step."""
        if not self._prompt_done:
            for s in self.seqs:
                s.prefill_end()
            self._prompt_done = True

    # ---- what transformers asks -------------------------------------------

    def batch_repeat_interleave(self, repeats: int) -> None:
        if repeats != 1:
            raise NotImplementedError("KvpageCache: num_return_sequences > 1 is not supported")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("KvpageCache: batch selection is not supported")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KvpageCache: cropping is not supported")

    @property
    def is_croppable(self) -> bool:
        return False

    # ---- measurements -----------------------------------------------------

    def kv_bytes(self) -> int:
        """Bytes of page memory the store's keys and values occupy
        (kv_stats_t.kv_bytes), metadata excluded."""
        return 0 if self.store is None else self.store.stats().kv_bytes

    def lens(self, layer: int = 0) -> List[List[int]]:
        """Tokens each row holds at layer, per kv head."""
        return [[s.len(layer, h) for h in range(self.n_kv_heads)] for s in self.seqs]


def _rows(x: torch.Tensor) -> np.ndarray:
    """A CPU float tensor as a NumPy array: float32 and float16 without a
    copy (DLPack), other dtypes (bfloat16) widened to float32."""
    if x.dtype not in (torch.float32, torch.float16):
        x = x.float()
    return np.from_dlpack(x.detach())


def kvpage_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                     scaling: Optional[float] = None, dropout: float = 0.0,
                     **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """The "kvpage" attention: query (batch, n_q_heads, q_len, head_dim),
    key/value the new tokens (batch, n_kv_heads, q_len, head_dim) that
    KvpageCache.update returned; attention_mask None or the (batch, q_len)
    bool padding mask of the "kvpage" mask function. Appends the new tokens
    to the store, then attends over the store. Returns (out (batch, q_len,
    n_q_heads, head_dim), None): no attention weights."""
    layer = module.layer_idx
    pending = getattr(_active, "pending", None)
    _active.pending = None
    if pending is None or pending[1] != layer or pending[2] is not key or pending[0].store is None:
        raise RuntimeError('attn_implementation="kvpage" needs a KvpageCache as the cache '
                           "(generate(..., cache=KvpageCache(model.config)))")
    cache = pending[0]
    if dropout:
        raise NotImplementedError("kvpage attention: dropout is not supported")
    batch, _, q_len, _ = query.shape
    store, seqs = cache.store, cache.seqs
    scale = float(scaling) if scaling else 0.0
    if q_len == 1 and layer == 0:
        cache.prefill_end()
    k_all = key.transpose(1, 2)    # (batch, q_len, n_kv_heads, head_dim)
    v_all = value.transpose(1, 2)
    q_all = query.transpose(1, 2)  # (batch, q_len, n_q_heads, head_dim)
    valid = None if attention_mask is None else attention_mask.to(torch.bool)
    if q_len == 1 and (valid is None or bool(valid.all())):
        for b, s in enumerate(seqs):
            s.append(layer, _rows(k_all[b]), _rows(v_all[b]))
        out = store.decode(layer, seqs, _rows(q_all[:, 0]), scale=scale)
        result = torch.from_numpy(out).unsqueeze(1)
    else:
        result = query.new_zeros((batch, q_len, query.shape[1], query.shape[3]),
                                 dtype=torch.float32)
        for b, s in enumerate(seqs):
            k, v, q = k_all[b], v_all[b], q_all[b]
            if valid is not None and not bool(valid[b].all()):
                keep = valid[b]
                k, v, q = k[keep], v[keep], q[keep]
            if k.shape[0] == 0:
                continue
            s.append(layer, _rows(k), _rows(v))
            out = torch.from_numpy(store.prefill(layer, s, _rows(q), scale=scale))
            if valid is not None and not bool(valid[b].all()):
                result[b, valid[b]] = out
            else:
                result[b] = out
    if q_len == 1 and layer == cache.n_layers - 1:
        for s in seqs:
            s.step_end()
    return result.to(query.dtype), None


def kvpage_mask(batch_size: int, q_length: Optional[int] = None, kv_length: int = 0,
                q_offset: int = 0, kv_offset: int = 0, mask_function: Any = None,
                attention_mask: Optional[torch.Tensor] = None,
                cache_position: Optional[torch.Tensor] = None, **kwargs: Any
                ) -> Optional[torch.Tensor]:
    """The "kvpage" mask: causality is the store's (prefill is causal,
    decode attends to the whole row), so the only mask is padding: None when
    every new token is real, else the (batch, q_length) bool mask of the new
    columns (False = padding, never stored). transformers 5.0-5.2 give the
    new columns as cache_position instead of q_length."""
    if attention_mask is None:
        return None
    if q_length is None:
        q_length = int(cache_position.shape[0])
    m = attention_mask.to(torch.bool)[:, -q_length:]
    return None if bool(m.all()) else m


AttentionInterface.register(ATTN_NAME, kvpage_attention)
AttentionMaskInterface.register(ATTN_NAME, kvpage_mask)


def dynamic_cache_bytes(cache: Cache) -> int:
    """Bytes of the key and value tensors a DynamicCache holds."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None:
                total += t.numel() * t.element_size()
    return total
