# SPDX-License-Identifier: MIT
"""Store behaviour through the binding: config and estimates, sequences and
their handles, fork (copy-on-write, seen in the stats), compaction,
formats and merging, policies (spec strings, prefill_end, step_end),
statistics, the context managers."""
import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv


def test_config_resolved_and_estimate():
    cfg = kvpage.Config(host_pages=32, **SHAPE)
    est = kvpage.estimate(cfg)
    assert est.kv_max == 32 * 64 * 64  # host_pages * page_bytes (64 * head_dim)
    assert est.meta_max >= est.meta_fixed > 0
    with kvpage.Store(cfg, max_seqs=7) as st:
        c = st.config
        assert (c.n_layers, c.head_dim, c.max_seqs, c.host_pages) == (2, 64, 7, 32)
        assert c.page_bytes == 64 * 64 and c.residual == 128  # defaults resolved
        assert c.pressure is None and c.offload_path is None
    with pytest.raises(TypeError):
        kvpage.Store(cfg, no_such_field=1)


def test_format_info_and_note():
    assert kvpage.format_note(kvpage.Format.INT2).startswith("INT2")
    i4 = kvpage.format_info(kvpage.Format.INT4, 64)
    assert (i4.name, i4.bits_per_element, i4.group_size) == ("int4", 6.0, 16)
    assert kvpage.format_info(kvpage.Format.FP16, 64).tokens_per_page == 16


def test_sequence_handles(store, rng):
    with store.create_seq() as s:
        assert s.live and store.stats().n_seqs == 1
        s.append(0, *kv(rng, 5))
        assert [s.len(0, h) for h in range(2)] == [5, 5] and s.len(1) == 0
        same = store.seq(s.id)
        assert [x.id for x in store.seqs()] == [s.id]
    assert not s.live and not same.live and store.stats().n_seqs == 0
    # the id is reused by the next sequence; the old handles stay dead
    t = store.create_seq()
    assert t.id == s.id
    for old in (s, same):
        with pytest.raises(kvpage.KvError) as e:
            old.append(0, *kv(rng, 1))
        assert e.value.code == kvpage.KV_ENOENT
    assert t.len(0) == 0
    store.check()


def test_fork_shares_pages_copy_on_write(store, rng):
    p = store.create_seq()
    k, v = kv(rng, 40)  # per list: 2 full pages + a tail of 8
    for layer in range(2):
        p.append(layer, k, v)
    used = store.stats().pages_used
    assert used == 2 * 2 * 3  # layers x kv heads x pages
    c = p.fork()
    st = store.stats()
    assert st.pages_used == used and st.n_seqs == 2 and st.tokens == 2 * 2 * 2 * 40
    c.append(0, *kv(rng, 1))  # the shared tail page of layer 0 is copied, per kv head
    assert store.stats().pages_used == used + 2
    np.testing.assert_array_equal(p.read(0, 1)[0], c.read(0, 1, 0, 40)[0])
    assert p.len(0) == 40 and c.len(0) == 41
    p.free()
    assert c.read(1, 0)[0].shape == (40, 64)  # the child keeps the pages
    store.check()


def test_compact(store, rng):
    s = store.create_seq()
    k, v = kv(rng, 48)
    s.append(0, k, v, pos=np.arange(100, 148))
    keep = [0, 3, 17, 47]
    s.compact(0, 1, keep)
    kk, vv, pos = s.read(0, 1)
    assert list(pos) == [100 + i for i in keep]
    np.testing.assert_array_equal(kk, k[keep, 1].astype(np.float16).astype(np.float32))
    assert s.len(0, 0) == 48  # the other head is untouched
    before = store.stats().pages_used
    s.compact(0, 0, np.array([], dtype=np.int64))
    assert s.len(0, 0) == 0 and store.stats().pages_used < before
    s.append(0, *kv(rng, 1))  # continues each list's positions (0 when empty)
    assert s.read(0, 1)[2][-1] == 148 and list(s.read(0, 0)[2]) == [0]
    store.check()


def test_stats_counts_and_formats(store, rng):
    s = store.create_seq()
    s.set_format(1, kvpage.Format.INT2)
    for layer in range(2):
        s.append(layer, *kv(rng, 160, np.float16))  # R = 128 converts on append at layer 1
    st = store.stats()
    assert st.tokens == 2 * 2 * 160
    assert st.fp16_bytes == st.tokens * 2 * 64 * 2
    assert st.pages_by_format[kvpage.Format.INT2] > 0
    assert st.kv_bytes == sum(st.bytes_by_format) == st.pages_used * st.page_bytes
    assert st.pages_used + st.pages_free == st.pages_capacity == 256
    assert st.compression_ratio() == st.fp16_bytes / (st.kv_bytes + st.meta_bytes)


def test_merge_layers(store, rng):
    s = store.create_seq()
    k, v = kv(rng, 64)
    for layer in range(2):
        s.append(layer, k + 0.01 * layer, v)
    s.merge_layers(1, t=0.5, gamma=0.0)
    assert store.stats().pages_by_format[kvpage.Format.MERGED] > 0
    assert s.len(0) == s.len(1) == 64
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    assert np.isfinite(store.decode(1, [s], q)).all()


def test_policy_objects():
    with kvpage.Policy("streamingllm:sink=2,recent=8") as p:
        assert p.spec.startswith("streamingllm:sink=2,recent=8")
        assert p.value("streamingllm", "recent") == 8
        info = p.info(2, 100)
        assert info.methods == kvpage.Method.STREAMINGLLM
        assert (info.evicts, info.budget) == (1, 10)
        assert repr(p).startswith("Policy(")
        with pytest.raises(kvpage.KvError) as e:
            p.value("h2o", "hh")
        assert e.value.code == kvpage.KV_ENOENT
    assert repr(p) == "Policy(<closed>)"
    with kvpage.Policy("eattn:c=0.25,theta=100000,ada=1+int4") as p:
        info = p.info(2, 100)
        assert info.methods == kvpage.Method.EATTN | kvpage.Method.INT4
        assert (info.evicts, info.budget) == (0, 25)
        assert p.value("eattn", "theta") == 100000
    kvpage.check_pressure("int4,int2,evict:sink=4,recent=256")
    kvpage.check_pressure(None)


def test_policy_prefill_end_and_step_end(store, rng):
    s = store.create_seq(policy="streamingllm:sink=2,recent=8")
    for layer in range(2):
        s.append(layer, *kv(rng, 30))
        store.prefill(layer, s, rng.standard_normal((30, 4, 64)).astype(np.float32))
    s.prefill_end()
    assert s.len(0) == s.len(1) == 10
    assert list(s.read(0, 0)[2]) == [0, 1] + list(range(22, 30))
    for layer in range(2):
        s.append(layer, *kv(rng, 1))
        store.decode(layer, [s], rng.standard_normal((1, 4, 64)).astype(np.float32))
    s.step_end()
    assert s.len(0) == 10 and s.read(0, 0)[2][-1] == 30
    # a Policy object attaches too, and forks inherit it
    with kvpage.Policy("kivi4") as p:
        t = store.create_seq()
        t.set_policy(p)
    t.append(0, *kv(rng, 130))
    assert store.stats().pages_by_format[kvpage.Format.INT4] > 0
    t.set_policy(None)  # detaching keeps what is stored
    assert t.len(0) == 130


def test_kvzip_scoring_pass(store, rng):
    """KVzip: a fork marked as a scoring pass attends over a reconstruction;
    the owner then keeps its sinks and the tokens the pass looked at most."""
    s = store.create_seq(policy="kvzip:c=8,sink=2")
    k, v = kv(rng, 30)
    for layer in range(2):
        s.append(layer, k, v)
    with pytest.raises(kvpage.KvError):
        s.prefill_end()  # no scores: it would evict blindly
    p = s.fork()
    p.score_begin(s, 0, 30)
    # the reconstruction's queries are the keys of tokens 20..29: those win
    rk, rv = kv(rng, 10)
    for layer in range(2):
        p.append(layer, rk, rv)
        q = np.repeat(k[20:30] * 8.0, 2, axis=1)  # [10][4 q heads][64]
        store.prefill(layer, p, q.astype(np.float32))
    p.free()
    s.prefill_end()
    kept = list(s.read(0, 0)[2])
    assert len(kept) == 8 and kept[:2] == [0, 1]
    assert all(t >= 20 for t in kept[2:])
    with pytest.raises(ValueError):
        p2 = s.fork()
        p2.score_begin("not a seq", 0, 1)


def test_store_with_pressure_ladder(rng):
    with kvpage.Store(host_pages=24, pressure="evict:sink=4,recent=16", **SHAPE) as st:
        assert st.config.pressure == "evict:sink=4,recent=16"
        old = st.create_seq()
        for layer in range(2):
            old.append(layer, *kv(rng, 80))  # 20 of the 24 pages
        new = st.create_seq()
        for layer in range(2):
            new.append(layer, *kv(rng, 32))  # 8 more: the ladder evicts `old`
        s = st.stats()
        assert s.pressure_runs >= 1 and s.pressure_evicted_tokens > 0
        assert old.len(0) == 20
        st.check()


def test_store_context_manager_and_close():
    st = kvpage.Store(host_pages=8, **SHAPE)
    s = st.create_seq()
    with st:
        assert not st.closed
    assert st.closed and repr(st) == "Store(<closed>)" and not s.live
    st.close()  # idempotent
