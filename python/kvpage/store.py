# SPDX-License-Identifier: MIT
"""store.py — Store and Seq: the store, its sequences, append/read,
attention (decode, prefill), fork, compaction, formats, policies, the
page-file tier, the prefix cache (Seq.prefix_match, Seq.prefix_publish).

Ownership: a Store owns its kv_store_t until close() (or the end of its with
block, or garbage collection). Sequences belong to the store; a Seq is a
handle (store, id) that does not free anything when dropped -- free() or the
end of its with block does. Arrays passed in are borrowed for the call only.

Invariants the binding adds to the C API's:
  - A closed store raises KvClosed (KV_ESTATE, a ValueError) on every
    call but close().
  - A Seq that was freed (through any handle of the same id) raises
    KvNotFound (KV_ENOENT), even after the store reuses its id for a new
    sequence: the store counts frees per id and every Seq remembers the
    count it was made under.
  - Integers go to C only if they fit the C type (config.u_int); arrays only
    as C-contiguous, aligned, native float32/float16 (copied if needed, never
    cast from another dtype) with the shape checked first: ValueError names
    the expected shape, TypeError the accepted dtypes.
Concurrency: as in C. ctypes releases the GIL during each call, so
attention from several threads runs in parallel; mutating calls (append,
fork, free, compact, policies, offload...) must be serialized by the caller,
and close() must not race any call.
"""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._consts import KV_DTYPE_F16, KV_DTYPE_F32
from ._lib import c_float_p, c_int32_p, c_uint32_p, lib
from .config import Config, Format, Residency, Stats, _from_struct, u_int
from .errors import KV_ENOENT, KV_ERANGE, KvError, Owned, check
from .policy import Policy

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
Dims = Sequence[Tuple[str, Optional[int]]]


def _shape_text(dims: Dims) -> str:
    return "(" + ", ".join(n if v is None else f"{n}={v}" for n, v in dims) + ")"


def as_array(name: str, a: Any, dims: Dims, dtypes: Tuple[np.dtype, ...] = _FLOATS
             ) -> np.ndarray:
    """a as a C-contiguous, aligned ndarray of one of dtypes with the shape
    dims ((name, size or None for any)). Accepts ndarrays, objects with
    __dlpack__ (CPU tensors), and array-likes; never casts between dtypes."""
    if not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__"):
        try:
            a = np.from_dlpack(a)
        except (BufferError, RuntimeError, TypeError) as e:
            raise TypeError(f"{name}: DLPack import failed (CPU tensors only): {e}") from e
    a = np.asarray(a)
    if a.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: dtype {a.dtype} is not supported: {names} "
                        f"(convert with .astype(np.{dtypes[0]}))")
    want = _shape_text(dims)
    if a.ndim != len(dims) or any(v is not None and s != v for s, (_, v) in zip(a.shape, dims)):
        raise ValueError(f"{name}: expected shape {want}, got {tuple(a.shape)}")
    return np.require(a, requirements=("C", "A"))


def _fptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(c_float_p)


def _tokens(tokens: Any) -> np.ndarray:
    """Token ids as a C-contiguous 1-D int32 array: ValueError for another
    number of dimensions or an id outside int32, TypeError for a
    non-integer dtype (an empty sequence is accepted)."""
    a = np.asarray(tokens)
    if a.ndim != 1:
        raise ValueError(f"tokens: expected shape (n_tokens,), got {tuple(a.shape)}")
    if a.size == 0:
        return np.zeros((0,), np.int32)
    if a.dtype.kind not in "iu":
        raise TypeError(f"tokens: dtype {a.dtype} is not an integer type")
    if int(a.min()) < -2**31 or int(a.max()) >= 2**31:
        raise ValueError("tokens: a token id does not fit in int32")
    if a.shape[0] >= 2**32:
        raise ValueError(f"tokens: {a.shape[0]} tokens do not fit in uint32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _salt(salt: Union[bytes, bytearray, memoryview, str]) -> bytes:
    """A prefix-cache salt as bytes (str: UTF-8)."""
    if isinstance(salt, str):
        return salt.encode("utf-8")
    if isinstance(salt, (bytes, bytearray, memoryview)):
        return bytes(salt)
    raise TypeError(f"salt: expected bytes or str, got {type(salt).__name__}")


def _floats32(name: str, a: Any, dims: Dims) -> np.ndarray:
    """A float32 input (queries): float16 is widened (exactly)."""
    return as_array(name, a, dims).astype(np.float32, copy=False)


class Store(Owned):
    """A kvpage store (kv_store_t) for one model shape.

        with kvpage.Store(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64,
                          host_pages=64) as store:
            with store.create_seq() as seq:
                seq.append(0, k, v)
                out = store.prefill(0, seq, q)

    Store(config) or Store(**fields) or both (fields override config's).
    Errors of kv_store_create raise KvError (e.g. KvInvalid for an unset
    shape, KvOSError with errno EEXIST for a new page file over an existing
    one).
    close() destroys the store and everything in it (kv_store_destroy), on
    the calling thread, and may block: with a page file it finishes the I/O
    and syncs the file first; with a remote tier it waits for what was
    published to reach the server (at most prefix_remote_timeout_ms, 1 s
    when 0). A store
    garbage-collected unclosed warns (ResourceWarning) and is destroyed the
    same way on the "kvpage-reaper" thread, never inside the collection
    (errors.Owned; reaper_wait() waits for it)."""

    _what = "store"
    _blocking = True

    def __init__(self, config: Optional[Config] = None, **fields: Any) -> None:
        super().__init__()
        self._frees: Dict[int, int] = {}
        base = config if config is not None else Config()
        cfg = dataclasses.replace(base, **fields)
        c = cfg._to_c()
        h = ctypes.c_void_p()
        check(lib.kv_store_create(ctypes.byref(c), ctypes.byref(h)))
        self._own(h)
        self.config: Config = self._read_config()
        """The configuration the store runs with (defaults resolved)."""

    # ---- lifetime -----------------------------------------------------------

    @staticmethod
    def _destroy_fn(handle: ctypes.c_void_p) -> None:
        lib.kv_store_destroy(handle)

    def __repr__(self) -> str:
        if self._h is None:
            return "Store(<closed>)"
        c = self.config
        return (f"Store(n_layers={c.n_layers}, n_q_heads={c.n_q_heads}, "
                f"n_kv_heads={c.n_kv_heads}, head_dim={c.head_dim}, host_pages={c.host_pages})")

    # ---- store-wide ---------------------------------------------------------

    def _read_config(self) -> Config:
        c = _lib.kv_config_t()
        check(lib.kv_store_config_into(self.handle, ctypes.byref(c), ctypes.sizeof(c)))
        return Config._from_c(c)

    def stats(self) -> Stats:
        """Current statistics (kv_store_stats)."""
        s = _lib.kv_stats_t(struct_size=ctypes.sizeof(_lib.kv_stats_t))
        check(lib.kv_store_stats(self.handle, ctypes.byref(s)))
        return _from_struct(Stats, s)

    def check(self) -> None:
        """Check every internal invariant (kv_store_check): KvError
        (KV_ECORRUPT) if one fails. O(pages); for tests and debugging."""
        check(lib.kv_store_check(self.handle))

    # ---- sequences ----------------------------------------------------------

    def create_seq(self, policy: Union[Policy, str, None] = None) -> "Seq":
        """A new empty sequence (kv_seq_create), with policy attached if given
        (a Policy or a spec string). KvError(KV_ELIMIT) when max_seqs live."""
        sid = ctypes.c_uint32()
        check(lib.kv_seq_create(self.handle, ctypes.byref(sid)))
        seq = Seq(self, sid.value)
        if policy is not None:
            try:
                seq.set_policy(policy)
            except BaseException:
                seq.free()
                raise
        return seq

    def seq(self, seq_id: int) -> "Seq":
        """A handle of the live sequence seq_id (e.g. one restored from a page
        file); KvError(KV_ENOENT) if none is live under that id."""
        seq_id = u_int("seq_id", seq_id)
        n = ctypes.c_uint32()
        check(lib.kv_seq_len(self.handle, seq_id, 0, 0, ctypes.byref(n)), f"sequence {seq_id}")
        return Seq(self, seq_id)

    def seqs(self) -> List["Seq"]:
        """Every live sequence, in increasing id order (kv_store_seqs)."""
        count = ctypes.c_uint32()
        check(lib.kv_store_seqs(self.handle, None, 0, ctypes.byref(count)))
        ids = (ctypes.c_uint32 * max(count.value, 1))()
        check(lib.kv_store_seqs(self.handle, ids, count.value, ctypes.byref(count)))
        return [Seq(self, i) for i in ids[:count.value]]

    def _seq_id(self, seq: Union["Seq", int]) -> int:
        if isinstance(seq, Seq):
            if seq.store is not self:
                raise ValueError(f"sequence {seq.id} belongs to another store")
            seq._check_live()
            return seq.id
        return u_int("seq", seq)

    def _lens(self, layer: int, ids: Iterable[int]) -> int:
        """The longest list of the given sequences at layer (stats stride)."""
        n, longest = ctypes.c_uint32(), 1
        for sid in ids:
            for h in range(self.config.n_kv_heads):
                check(lib.kv_seq_len(self.handle, sid, layer, h, ctypes.byref(n)))
                longest = max(longest, n.value)
        return longest

    # ---- attention ----------------------------------------------------------

    def decode(self, layer: int, seqs: Sequence[Union["Seq", int]], q: Any, *,
               scale: float = 0.0, stats: bool = False
               ) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """Decode attention at one layer for a batch (kv_attn_decode): one
        query row per sequence over every token it holds at that layer.

        q: (batch, n_q_heads, head_dim) float32 (or float16, widened).
        Returns out (batch, n_q_heads, head_dim) float32; with stats=True
        (out, stats), stats (batch, n_kv_heads, stride) float32: per token
        the attention probability it received, summed over the query heads
        of its kv head's group; zero past each list's length.
        scale 0 = 1/sqrt(head_dim). Query head h attends with kv head
        h // (n_q_heads // n_kv_heads)."""
        c = self.config
        layer = u_int("layer", layer)
        ids = [self._seq_id(s) for s in seqs]
        batch = len(ids)
        qa = _floats32("q", q, [("batch", batch), ("n_q_heads", c.n_q_heads),
                                ("head_dim", c.head_dim)])
        out = np.empty((batch, c.n_q_heads, c.head_dim), np.float32)
        id_arr = (ctypes.c_uint32 * max(batch, 1))(*ids)
        args = _lib.kv_decode_t(layer=layer, batch=batch, seqs=id_arr, q=_fptr(qa),
                                out=_fptr(out), scale=scale)
        st = None
        if stats:
            stride = self._lens(layer, ids)
            st = np.zeros((batch, c.n_kv_heads, stride), np.float32)
            ptrs = (c_float_p * max(batch, 1))(*[_fptr(st[i]) for i in range(batch)])
            args.stats, args.stats_stride = ptrs, stride
        check(lib.kv_attn_decode(self.handle, ctypes.byref(args)))
        return (out, st) if stats else out

    def prefill(self, layer: int, seq: Union["Seq", int], q: Any, *, scale: float = 0.0,
                stats: bool = False, stats_row0: int = 0
                ) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """Causal prefill attention for one sequence at one layer
        (kv_attn_prefill): the last n_new tokens of each list are the new ones
        (append them first); new row i attends to every earlier token and to
        new tokens 0..i.

        q: (n_new, n_q_heads, head_dim) float32 (or float16, widened).
        Returns out (n_new, n_q_heads, head_dim) float32; with stats=True
        (out, stats), stats (n_kv_heads, stride) summed over rows
        stats_row0..n_new-1, zero past each list's length."""
        c = self.config
        layer = u_int("layer", layer)
        sid = self._seq_id(seq)
        qa = _floats32("q", q, [("n_new", None), ("n_q_heads", c.n_q_heads),
                                ("head_dim", c.head_dim)])
        n_new = qa.shape[0]
        out = np.empty((n_new, c.n_q_heads, c.head_dim), np.float32)
        args = _lib.kv_prefill_t(layer=layer, seq=sid, n_new=n_new, q=_fptr(qa),
                                 out=_fptr(out), scale=scale,
                                 stats_row0=u_int("stats_row0", stats_row0))
        st = None
        if stats:
            stride = self._lens(layer, [sid])
            st = np.zeros((c.n_kv_heads, stride), np.float32)
            args.stats, args.stats_stride = _fptr(st), stride
        check(lib.kv_attn_prefill(self.handle, ctypes.byref(args)))
        return (out, st) if stats else out

    # ---- page file ----------------------------------------------------------

    def offload_balance(self) -> int:
        """Apply the watermarks (kv_store_offload_balance): returns the pages
        written. KvError(KV_ENOTSUP) without a page file."""
        return check(lib.kv_store_offload_balance(self.handle))

    def offload_sync(self) -> None:
        """Persist the page file (kv_store_offload_sync): records for every
        sequence wholly on the file, fdatasync, the index replaced
        atomically; what a Store with OFFLOAD_OPEN restores."""
        check(lib.kv_store_offload_sync(self.handle))


class Seq:
    """A sequence of a Store (kv_seq_id_t). Made by Store.create_seq,
    Store.seq(s), Seq.fork. `with store.create_seq() as seq:` frees it at the
    end of the block (if it is still live)."""

    __slots__ = ("store", "id", "_epoch")

    def __init__(self, store: Store, seq_id: int) -> None:
        self.store = store
        self.id = seq_id
        self._epoch = store._frees.get(seq_id, 0)

    def __repr__(self) -> str:
        return f"Seq({self.id})" if self.live else f"Seq({self.id}, freed)"

    def __int__(self) -> int:
        return self.id

    def __enter__(self) -> "Seq":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live and not self.store.closed:
            self.free()

    @property
    def live(self) -> bool:
        """False once freed through any handle (or the store is closed)."""
        return not self.store.closed and self.store._frees.get(self.id, 0) == self._epoch

    def _check_live(self) -> ctypes.c_void_p:
        h = self.store.handle
        if self.store._frees.get(self.id, 0) != self._epoch:
            raise KvError(KV_ENOENT, f"sequence {self.id} was freed")
        return h

    def _call(self, fn: Any, *args: Any) -> int:
        return check(fn(self._check_live(), self.id, *args))

    # ---- lifetime -----------------------------------------------------------

    def free(self) -> None:
        """Free the sequence and release its pages (kv_seq_free)."""
        self._call(lib.kv_seq_free)
        self.store._frees[self.id] = self._epoch + 1

    def fork(self) -> "Seq":
        """A new sequence sharing every page copy-on-write (kv_seq_fork)."""
        child = ctypes.c_uint32()
        self._call(lib.kv_seq_fork, ctypes.byref(child))
        return Seq(self.store, child.value)

    def score_begin(self, owner: "Seq", t0: int, t1: int) -> None:
        """Mark this sequence, a fork of owner made after owner's last
        append, as a KVzip scoring pass of owner for its tokens [t0, t1)
        (kv_seq_score_begin): the attention of this sequence's prefill calls
        over a reconstruction of those tokens scores them in owner. Free
        this sequence when done; then owner.prefill_end() selects."""
        if not isinstance(owner, Seq) or owner.store is not self.store:
            raise ValueError("owner must be a sequence of the same store")
        self._call(lib.kv_seq_score_begin, u_int("owner", owner.id), u_int("t0", t0),
                   u_int("t1", t1))

    # ---- tokens -------------------------------------------------------------

    def len(self, layer: int, kv_head: int = 0) -> int:
        """Tokens held for (layer, kv_head) (kv_seq_len)."""
        n = ctypes.c_uint32()
        self._call(lib.kv_seq_len, u_int("layer", layer), u_int("kv_head", kv_head),
                   ctypes.byref(n))
        return n.value

    def append(self, layer: int, k: Any, v: Any, pos: Any = None) -> None:
        """Append tokens of one layer, all kv heads (kv_append).

        k, v: (n_tokens, n_kv_heads, head_dim), both float32 or both float16
        (post-RoPE keys). pos: (n_tokens,) integer positions, or None to
        continue each list. Values must be finite and |x| <= 65504
        (KvError(KV_ERANGE) otherwise, nothing stored). All-or-nothing."""
        c = self.store.config
        ka = as_array("k", k, [("n_tokens", None), ("n_kv_heads", c.n_kv_heads),
                               ("head_dim", c.head_dim)])
        n = ka.shape[0]
        va = as_array("v", v, [("n_tokens", n), ("n_kv_heads", c.n_kv_heads),
                               ("head_dim", c.head_dim)])
        if va.dtype != ka.dtype:
            raise TypeError(f"k and v must have one dtype: k is {ka.dtype}, v is {va.dtype}")
        pa = None
        if pos is not None:
            pa = np.asarray(pos)
            if pa.dtype.kind not in "iu":
                raise TypeError(f"pos: dtype {pa.dtype} is not an integer type")
            if pa.shape != (n,):
                raise ValueError(f"pos: expected shape (n_tokens={n},), got {tuple(pa.shape)}")
            if n and (pa.min() < -2**31 or pa.max() >= 2**31):
                raise KvError(KV_ERANGE, "pos: a position does not fit in int32")
            pa = np.ascontiguousarray(pa, dtype=np.int32)
        dtype = KV_DTYPE_F32 if ka.dtype == np.float32 else KV_DTYPE_F16
        self._call(lib.kv_append, u_int("layer", layer), n, dtype,
                   ka.ctypes.data_as(ctypes.c_void_p), va.ctypes.data_as(ctypes.c_void_p),
                   None if pa is None else pa.ctypes.data_as(c_int32_p))

    def read(self, layer: int, kv_head: int, t0: int = 0, n: Optional[int] = None
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens [t0, t0+n) of (layer, kv_head) decoded to float32
        (kv_read): (k (n, head_dim), v (n, head_dim), pos (n,) int32).
        n None: to the end of the list."""
        layer, kv_head, t0 = u_int("layer", layer), u_int("kv_head", kv_head), u_int("t0", t0)
        if n is None:
            n = max(self.len(layer, kv_head) - t0, 0)
        n = u_int("n", n)
        hd = self.store.config.head_dim
        k = np.empty((n, hd), np.float32)
        v = np.empty((n, hd), np.float32)
        pos = np.empty((n,), np.int32)
        self._call(lib.kv_read, layer, kv_head, t0, n, _fptr(k), _fptr(v),
                   pos.ctypes.data_as(c_int32_p))
        return k, v, pos

    # ---- prefix cache (Config.prefix_cache; docs/prefix.md) -------------------

    def prefix_match(self, tokens: Any, salt: Union[bytes, str] = b"") -> int:
        """Attach the longest cached prefix of tokens (kv_seq_prefix_match) to
        this sequence, which must be empty (its policy already set): returns
        the tokens attached, at most len(tokens) - 1 rounded down to a node
        (0 = a miss); append and prefill tokens[matched:] next. tokens: 1-D
        integer ids (int32); salt: bytes or str (UTF-8), the isolation key
        (different salts never share). KvError: KV_ENOTSUP (cache off),
        KV_ESTATE (sequence not empty), KV_EINVAL (salt over 65536 bytes),
        KV_ENOMEM, KV_EIO; nothing attached then."""
        t, s = _tokens(tokens), _salt(salt)
        matched = ctypes.c_uint32()
        self._call(lib.kv_seq_prefix_match, t.ctypes.data_as(c_int32_p), t.shape[0],
                   s or None, len(s), ctypes.byref(matched))
        return matched.value

    def prefix_publish(self, tokens: Any, salt: Union[bytes, str] = b"") -> int:
        """Publish the full blocks of this sequence's first len(tokens)
        tokens (kv_seq_prefix_publish; tokens = the ids of the tokens
        appended, no more than any list holds). Idempotent; call it before
        prefill_end. Returns the tokens now cached from token 0 on.
        KvError: KV_ENOTSUP (cache off), KV_ERANGE (more tokens than a list
        holds), KV_EINVAL, KV_ENOMEM, KV_EIO; nothing published then."""
        t, s = _tokens(tokens), _salt(salt)
        return self._call(lib.kv_seq_prefix_publish, t.ctypes.data_as(c_int32_p), t.shape[0],
                          s or None, len(s))

    def prefix_publish_compressed(self, tokens: Any, salt: Union[bytes, str] = b"") -> None:
        """Publish this sequence's compressed context tokens (all of its
        prompt) after prefill_end and before any step_end or append
        (kv_seq_prefix_publish_compressed): a later sequence of the same
        policy and salt installs it with prefix_match_compressed. KvError:
        KV_ESTATE (no policy, not prefill-ended, stepped, len(tokens) not the
        prompt length), KV_ENOTSUP (cache off; merged pages), KV_ENOMEM."""
        t, s = _tokens(tokens), _salt(salt)
        self._call(lib.kv_seq_prefix_publish_compressed, t.ctypes.data_as(c_int32_p),
                   t.shape[0], s or None, len(s))

    def prefix_match_compressed(self, tokens: Any, salt: Union[bytes, str] = b"") -> int:
        """Install the compressed context tokens into this empty sequence
        (policy set, not prefill-ended; kv_seq_prefix_match_compressed).
        Returns len(tokens) on a hit (the sequence is then past its prefill
        end: append the rest and step_end), 0 on a miss (nothing changed).
        KvError: KV_ESTATE, KV_ENOTSUP, KV_EINVAL, KV_ENOMEM."""
        t, s = _tokens(tokens), _salt(salt)
        matched = ctypes.c_uint32()
        self._call(lib.kv_seq_prefix_match_compressed, t.ctypes.data_as(c_int32_p),
                   t.shape[0], s or None, len(s), ctypes.byref(matched))
        return matched.value

    def compact(self, layer: int, kv_head: int, keep: Any) -> None:
        """Keep only the tokens keep (strictly increasing indices into the
        current list) of (layer, kv_head), in order (kv_compact). Empty keep
        empties the list. Kept INT4/INT2/MERGED tokens become FP16."""
        ka = np.asarray(keep)
        if ka.size == 0:
            ka = ka.astype(np.uint32)
        if ka.dtype.kind not in "iu":
            raise TypeError(f"keep: dtype {ka.dtype} is not an integer type")
        if ka.ndim != 1:
            raise ValueError(f"keep: expected shape (n_keep,), got {tuple(ka.shape)}")
        if ka.size and (ka.min() < 0 or ka.max() >= 2**32):
            raise KvError(KV_ERANGE, "keep: an index is negative or does not fit in uint32")
        ka = np.ascontiguousarray(ka, dtype=np.uint32)
        self._call(lib.kv_compact, u_int("layer", layer), u_int("kv_head", kv_head),
                   ka.ctypes.data_as(c_uint32_p), ka.size)

    # ---- formats, merging, policies -----------------------------------------

    def set_format(self, layer: int, fmt: Format) -> None:
        """Format the layer's FP16 residual converts to from now on
        (kv_seq_set_format): Format.FP16 (stop), INT4 or INT2 (KIVI)."""
        self._call(lib.kv_seq_set_format, u_int("layer", layer), u_int("fmt", fmt))

    def quantize(self, layer: int, keep_fp16: int = 0) -> None:
        """Convert now every token of the layer but the newest keep_fp16
        (rounded up to whole 16-token groups) to its format (kv_seq_quantize)."""
        self._call(lib.kv_seq_quantize, u_int("layer", layer), u_int("keep_fp16", keep_fp16))

    def merge_layers(self, layer: int, *, t: Optional[float] = None,
                     gamma: Optional[float] = None, dir_format: Optional[Format] = None,
                     keep_fp16: Optional[int] = None) -> None:
        """MiniCache: merge layers (layer-1, layer) (kv_seq_merge_layers).
        Options not given keep kv_merge_opts_default()'s values."""
        o = lib.kv_merge_opts_default()
        if t is not None:
            o.t = t
        if gamma is not None:
            o.gamma = gamma
        if dir_format is not None:
            o.dir_format = u_int("dir_format", dir_format)
        if keep_fp16 is not None:
            o.keep_fp16 = u_int("keep_fp16", keep_fp16)
        self._call(lib.kv_seq_merge_layers, u_int("layer", layer), ctypes.byref(o))

    def set_policy(self, policy: Union[Policy, str, None]) -> None:
        """Attach a policy (a Policy, or a spec string parsed here; copied
        into the store) before the first append; None detaches
        (kv_seq_set_policy)."""
        if isinstance(policy, str):
            with Policy(policy) as p:
                self._call(lib.kv_seq_set_policy, p.handle)
        else:
            self._call(lib.kv_seq_set_policy, None if policy is None else policy.handle)

    def prefill_end(self) -> None:
        """The prompt is in: apply the policy's prefill-end decisions
        (kv_seq_prefill_end). After KV_ENOMEM, call again to finish."""
        self._call(lib.kv_seq_prefill_end)

    def step_end(self) -> None:
        """One decode step is done on every layer: apply the policy's
        per-step decisions (kv_seq_step_end)."""
        self._call(lib.kv_seq_step_end)

    # ---- page file ----------------------------------------------------------

    def offload(self) -> None:
        """Start writing the sequence's resident, unshared pages to the page
        file (kv_seq_offload); wait() waits for the writes."""
        self._call(lib.kv_seq_offload)

    def prefetch(self) -> None:
        """Start reading the sequence's pages back (kv_seq_prefetch)."""
        self._call(lib.kv_seq_prefetch)

    def wait(self) -> None:
        """Block until none of the sequence's I/O is in flight (kv_seq_wait);
        raises the first I/O error not reported yet, or a lost page's."""
        self._call(lib.kv_seq_wait)

    def residency(self) -> Residency:
        """Where the sequence's pages are (kv_seq_residency)."""
        r = _lib.kv_residency_t()
        self._call(lib.kv_seq_residency, ctypes.byref(r))
        return _from_struct(Residency, r)
