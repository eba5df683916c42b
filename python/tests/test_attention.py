# SPDX-License-Identifier: MIT
"""Attention through the binding against a NumPy reference:
softmax(q K^T / sqrt(d)) V per query head, query head h reading kv head
h // (n_q_heads / n_kv_heads) (GQA as kvpage.h defines it), causal for
prefill (new row i sees every earlier token and new tokens 0..i).

Tolerances, from the formats:
  - Over the values the store holds (read back with Seq.read), the only
    difference is float32 arithmetic order (the C kernel runs an online
    softmax in float32, the reference float64): with |q|, |k|, |v| ~ 1,
    d = 64 and <= 300 tokens, errors stay near 1e-6; we allow 2e-5.
  - FP16 pages hold fp16(x) exactly (round to nearest), so reading back
    must give x rounded through np.float16 bit for bit.
  - INT4 pages (KIVI, fmt_int.h): keys per channel over 16-token groups,
    values per token over 16-channel groups; scale = (max - min) / 15 and min
    stored in binary16 rounded outward, so |x - x^| <= stored scale / 2; and
    what is quantized is the FP16 residual, fp16(x), |x - fp16(x)| <= 2^-11
    |x|. We check each element against
    (range + 2^-9 amax) / 30 * (1 + 2^-9) + 2^-11 amax
    (range and amax of its group; the 2^-9 terms cover the outward rounding
    of min and scale and the FP16 range, the last term the FP16 rounding) and the output against the original float inputs
    with the perturbation bound of softmax attention: logits move by at most
    delta = scale * sum_i |q_i| |dk_i|, so the probabilities by at most
    e^(2 delta) - 1 in L1, and |dout| <= max|dv| + (e^(2 delta) - 1) max|v|.
"""
import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv

ATOL = 2e-5


def reference(q, K, V, n_new=None):
    """q (rows, nq, d); K, V (n_kv, T, d). Decode (n_new None): every row sees
    all T tokens; prefill: row i sees tokens < T - n_new + i + 1."""
    rows, nq, d = q.shape
    nkv, T, _ = K.shape
    g = nq // nkv
    out = np.zeros((rows, nq, d))
    for h in range(nq):
        logits = q[:, h].astype(np.float64) @ K[h // g].astype(np.float64).T / np.sqrt(d)
        if n_new is not None:
            visible = np.arange(T)[None, :] < (T - n_new + np.arange(rows)[:, None] + 1)
            logits = np.where(visible, logits, -np.inf)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ V[h // g].astype(np.float64)
    return out


def held(seq, layer, nkv=2):
    """The lists the store holds at layer, (n_kv, T, d) each."""
    ks, vs = zip(*[seq.read(layer, h)[:2] for h in range(nkv)])
    return np.stack(ks), np.stack(vs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decode_fp16_pages(store, rng, dtype):
    seqs, inputs = [], []
    for n in (1, 37, 300):  # one token, a partial page, many pages
        s = store.create_seq()
        k, v = kv(rng, n, dtype)
        s.append(1, k, v)
        seqs.append(s)
        inputs.append((k, v))
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    out = store.decode(1, seqs, q)
    assert out.shape == (3, 4, 64) and out.dtype == np.float32
    for b, (s, (k, v)) in enumerate(zip(seqs, inputs)):
        K, V = held(s, 1)
        # FP16 pages: exactly fp16(x)
        np.testing.assert_array_equal(K, k.astype(np.float16).astype(np.float32).transpose(1, 0, 2))
        np.testing.assert_array_equal(V, v.astype(np.float16).astype(np.float32).transpose(1, 0, 2))
        np.testing.assert_allclose(out[b], reference(q[b:b + 1], K, V)[0], rtol=0, atol=ATOL)


def test_prefill_fp16_pages_causal(store, rng):
    s = store.create_seq()
    k0, v0 = kv(rng, 50)
    s.append(0, k0, v0)
    store.prefill(0, s, rng.standard_normal((50, 4, 64)).astype(np.float32))
    k1, v1 = kv(rng, 70, np.float16)  # a second chunk: rows see the first 50 too
    s.append(0, k1, v1)
    q = rng.standard_normal((70, 4, 64)).astype(np.float16)  # widened exactly
    out = store.prefill(0, s, q)
    K, V = held(s, 0)
    assert K.shape == (2, 120, 64)
    np.testing.assert_allclose(out, reference(q.astype(np.float32), K, V, n_new=70),
                               rtol=0, atol=ATOL)


def int4_bound(x, axis):
    """Per-element bound of INT4 quantization of x (T, d) with groups of 16
    along `axis` (0: 16 tokens per channel, keys; 1: 16 channels per token,
    values), T and d multiples of 16."""
    g = np.moveaxis(x, axis, 0).reshape(-1, 16, *np.moveaxis(x, axis, 0).shape[1:])
    rng_ = g.max(axis=1, keepdims=True) - g.min(axis=1, keepdims=True)
    amax = np.abs(g).max(axis=1, keepdims=True)
    b = np.broadcast_to((rng_ + 2.0**-9 * amax) / 30 * (1 + 2.0**-9) + 2.0**-11 * amax + 1e-6,
                        g.shape)
    return np.moveaxis(b.reshape(np.moveaxis(x, axis, 0).shape), 0, axis)


def test_int4_pages(store, rng):
    s = store.create_seq()
    s.set_format(0, kvpage.Format.INT4)
    k, v = kv(rng, 200)
    s.append(0, k, v)
    s.quantize(0)  # 192 tokens (12 whole groups) to INT4, the last 8 stay FP16
    st = store.stats()
    assert st.pages_by_format[kvpage.Format.INT4] > 0
    K, V = held(s, 0)
    kt, vt = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    for h in range(2):
        dk, dv = np.abs(K[h] - kt[h]), np.abs(V[h] - vt[h])
        assert np.all(dk[:192] <= int4_bound(kt[h][:192], 0))
        assert np.all(dv[:192] <= int4_bound(vt[h][:192], 1))
        assert np.all(dk[192:] <= 2.0**-11 * np.abs(kt[h][192:]))  # the FP16 residual
        assert dk[:192].max() > 0  # it really is quantized
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    out = store.decode(0, [s], q)
    # exact over what the INT4 pages hold
    np.testing.assert_allclose(out[0], reference(q, K, V)[0], rtol=0, atol=ATOL)
    # and within the perturbation bound of the original inputs
    dk, dv = np.abs(K - kt), np.abs(V - vt)
    g = 2
    for h in range(4):
        delta = (np.abs(q[0, h]) @ dk[h // g].T).max() / np.sqrt(64)
        bound = dv[h // g].max() + np.expm1(2 * delta) * np.abs(vt[h // g]).max()
        err = np.abs(out[0, h] - reference(q[:, h:h + 1], kt[h // g:h // g + 1],
                                           vt[h // g:h // g + 1])[0, 0]).max()
        assert err <= bound + ATOL
    # prefill over INT4 pages (the rows' causal windows cross INT4 groups)
    qp = rng.standard_normal((100, 4, 64)).astype(np.float32)
    np.testing.assert_allclose(store.prefill(0, s, qp), reference(qp, K, V, n_new=100),
                               rtol=0, atol=ATOL)


def test_stats_are_probabilities(store, rng):
    a, b = store.create_seq(), store.create_seq()
    for s, n in ((a, 20), (b, 45)):
        s.append(0, *kv(rng, n))
    out, st = store.decode(0, [a, b], rng.standard_normal((2, 4, 64)).astype(np.float32),
                           stats=True)
    assert st.shape == (2, 2, 45)
    # each kv head sums the probabilities of its 2 query heads: 2 per head
    np.testing.assert_allclose(st.sum(axis=2), 2.0, atol=1e-5)
    assert np.all(st[0, :, 20:] == 0)  # past a's length: untouched zeros
    q = rng.standard_normal((45, 4, 64)).astype(np.float32)
    out, sp = store.prefill(0, b, q, stats=True, stats_row0=5)
    np.testing.assert_allclose(sp.sum(axis=1), 2.0 * 40, rtol=1e-5)  # rows 5..44
    # the statistics are the reference probabilities
    K, _ = held(b, 0)
    logits = np.einsum("rhd,htd->rht", q[5:].astype(np.float64),
                       np.repeat(K, 2, axis=0).astype(np.float64)) / 8.0
    logits = np.where(np.arange(45)[None, None, :] <= np.arange(5, 45)[:, None, None],
                      logits, -np.inf)
    p = np.exp(logits - logits.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    np.testing.assert_allclose(sp, p.reshape(40, 2, 2, 45).sum(axis=(0, 2)), atol=1e-4)


def test_scale(store, rng):
    s = store.create_seq()
    s.append(0, *kv(rng, 30))
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    K, V = held(s, 0)
    # scale 1/sqrt(d) * 2 == the default scale with q doubled
    np.testing.assert_allclose(store.decode(0, [s], q, scale=2 / 8.0),
                               reference(2 * q, K, V), atol=ATOL)


def test_noncontiguous_inputs_are_copied(store, rng):
    big = rng.standard_normal((30, 2, 128)).astype(np.float32)
    k = big[:, :, ::2]  # strided
    v = np.asfortranarray(rng.standard_normal((30, 2, 64)).astype(np.float32))
    assert not k.flags.c_contiguous and not v.flags.c_contiguous
    a, b = store.create_seq(), store.create_seq()
    a.append(0, k, v)
    b.append(0, np.ascontiguousarray(k), np.ascontiguousarray(v))
    q = rng.standard_normal((8, 2, 4, 64)).astype(np.float32)[:, 1]  # strided q
    for h in range(2):
        np.testing.assert_array_equal(a.read(0, h)[0], b.read(0, h)[0])
        np.testing.assert_array_equal(a.read(0, h)[1], b.read(0, h)[1])
    np.testing.assert_array_equal(store.prefill(0, a, q), store.prefill(0, b, q))


def test_dlpack_input(store, rng):
    class Tensor:  # a CPU tensor that speaks only DLPack (no __array__)
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, stream=None):
            return self._a.__dlpack__()

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    k, v = kv(rng, 16, np.float16)
    a, b = store.create_seq(), store.create_seq()
    a.append(0, Tensor(k), Tensor(v))
    b.append(0, k, v)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(store.decode(0, [a], Tensor(q)), store.decode(0, [b], q))


def test_int8_attention_flag(rng):
    """CONFIG_INT8_ATTN: INT2 pages read with int8 dot products (approximate)
    stay within 0.15 norm-wise of the exact path's output, with the same
    bits for 1 and 2 threads; KV_ENOTSUP where the CPU lacks it."""
    shape = dict(SHAPE, host_pages=256, kv_format=kvpage.Format.INT2, residual=16)
    try:
        fast = [kvpage.Store(n_threads=t, flags=kvpage.CONFIG_INT8_ATTN, **shape)
                for t in (1, 2)]
    except kvpage.KvError as e:
        assert e.code == kvpage.KV_ENOTSUP
        pytest.skip("this CPU lacks AVX-512 VNNI + VBMI")
    exact = kvpage.Store(n_threads=2, **shape)
    k, v = kv(rng, 300)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    outs = []
    for st in fast + [exact]:
        with st:
            s = st.create_seq()
            s.append(1, k, v)
            outs.append(st.decode(1, [s], q))
    np.testing.assert_array_equal(outs[0], outs[1])
    err = np.linalg.norm(outs[0] - outs[2]) / np.linalg.norm(outs[2])
    assert 0 < err < 0.15
