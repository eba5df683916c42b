# SPDX-License-Identifier: MIT
"""Every bad-input path of the binding: wrong dtypes (TypeError), wrong
shapes (ValueError naming the expected shape), integers that do not fit the
C types, C errors as KvError (.code, .name, .message = kv_strerror) of the
code's class, which is also the fitting builtin (MemoryError for KV_ENOMEM,
...), a closed store or policy (KvClosed, a ValueError), freed sequences, and that a failed call changed
nothing (stats and contents compared before and after)."""
import errno

import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv


BUILTIN = {kvpage.KV_EINVAL: ValueError, kvpage.KV_ENOMEM: MemoryError,
           kvpage.KV_ERANGE: ValueError, kvpage.KV_ENOENT: LookupError,
           kvpage.KV_ESTATE: RuntimeError, kvpage.KV_ENOTSUP: NotImplementedError,
           kvpage.KV_EVERSION: ValueError, kvpage.KV_ECORRUPT: OSError,
           kvpage.KV_EIO: OSError, kvpage.KV_EBUSY: OSError,
           kvpage.KV_EAUTH: PermissionError, kvpage.KV_ETLS: ConnectionError}


def raises_kv(code, fn, *args, **kw):
    """fn raises KvError(code): the class of code, and its builtin."""
    with pytest.raises(BUILTIN.get(code, kvpage.KvError)) as e:
        fn(*args, **kw)
    assert isinstance(e.value, kvpage.error_class(code))
    assert e.value.code == code, e.value
    assert e.value.message == kvpage.strerror(code)
    return e.value


def snapshot(store, seqs):
    """Everything observable: the stats and every list's contents."""
    lists = [s.read(layer, h) for s in seqs for layer in range(2) for h in range(2)]
    return store.stats(), lists


def assert_same(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1]):
        for u, w in zip(x, y):
            np.testing.assert_array_equal(u, w)


def test_kverror_fields():
    e = kvpage.KvError(kvpage.KV_ENOMEM, "why")
    assert type(e) is kvpage.KvNoMemory and isinstance(e, MemoryError)
    assert (e.code, e.name, e.detail) == (-1002, "KV_ENOMEM", "why")
    assert str(e) == f"{kvpage.strerror(-1002)} (KV_ENOMEM, -1002): why"
    assert e.message == kvpage.strerror(-1002) and e.message in str(e) and "why" in str(e)
    codes = [getattr(kvpage, n) for n in kvpage.__all__ if n.startswith("KV_E")]
    assert len(codes) == 14 and len({kvpage.strerror(c) for c in codes}) == 14
    assert kvpage.code_name(-errno.ENOSPC) == "ENOSPC"
    assert kvpage.strerror(-errno.ENOSPC) == "No space left on device"


def test_exception_hierarchy():
    """One class per code under KvError, each also its builtin; OS errors
    carry .errno like OSError's; all pickle back to the same class."""
    import pickle
    for code, builtin in BUILTIN.items():
        e = kvpage.KvError(code, "d")
        assert isinstance(e, kvpage.KvError) and isinstance(e, builtin), (code, type(e))
        assert type(e) is kvpage.error_class(code) and type(e)(code).code == code
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and (back.code, back.detail) == (code, "d")
    for code in (kvpage.KV_ELIMIT, kvpage.KV_ENOTRES):
        assert not isinstance(kvpage.KvError(code), (ValueError, MemoryError, OSError))
    assert kvpage.KvIOError().errno == errno.EIO and kvpage.KvBusy().errno == errno.EBUSY
    e = kvpage.KvError(-errno.ENOSPC)
    assert type(e) is kvpage.KvOSError and isinstance(e, OSError)
    assert (e.errno, e.strerror, e.name) == (errno.ENOSPC, "No space left on device", "ENOSPC")
    assert "ENOSPC" in str(e)
    assert type(kvpage.KvError(-4242)) is kvpage.KvError  # a code this binding does not know
    closed = pickle.loads(pickle.dumps(kvpage.KvClosed(kvpage.KV_ESTATE, "the store is closed")))
    assert type(closed) is kvpage.KvClosed and closed.detail == "the store is closed"


@pytest.mark.parametrize("bad", [np.float64, np.int32, np.uint16])
def test_append_wrong_dtype(store, rng, bad):
    s = store.create_seq()
    k, v = kv(rng, 3)
    with pytest.raises(TypeError, match="float32 or float16"):
        s.append(0, k.astype(bad), v.astype(bad))
    with pytest.raises(TypeError, match="one dtype"):
        s.append(0, k, v.astype(np.float16))
    with pytest.raises(TypeError, match="float32 or float16"):
        s.append(0, k.tolist(), v.tolist())  # lists become float64: refused, not cast
    with pytest.raises(TypeError):
        s.append(0, k.astype(">f4"), v.astype(">f4"))  # non-native byte order
    assert s.len(0) == 0


@pytest.mark.parametrize("shape", [(3, 2), (3, 2, 32), (3, 4, 64), (3, 2, 64, 1), (2, 64)])
def test_append_wrong_shape(store, rng, shape):
    s = store.create_seq()
    with pytest.raises(ValueError) as e:
        s.append(0, np.zeros(shape, np.float32), np.zeros(shape, np.float32))
    msg = str(e.value)
    assert "k: expected shape (n_tokens, n_kv_heads=2, head_dim=64)" in msg
    assert str(shape) in msg
    with pytest.raises(ValueError, match=r"v: expected shape \(n_tokens=3, n_kv_heads=2"):
        s.append(0, np.zeros((3, 2, 64), np.float32), np.zeros((4, 2, 64), np.float32))
    assert s.len(0) == 0


def test_append_bad_positions(store, rng):
    s = store.create_seq()
    k, v = kv(rng, 3)
    with pytest.raises(ValueError, match=r"pos: expected shape \(n_tokens=3,\)"):
        s.append(0, k, v, pos=[1, 2])
    with pytest.raises(TypeError, match="pos"):
        s.append(0, k, v, pos=[1.0, 2.0, 3.0])
    raises_kv(kvpage.KV_ERANGE, s.append, 0, k, v, pos=[0, 1, 2**31])
    assert s.len(0) == 0


def test_append_bad_values_change_nothing(store, rng):
    s = store.create_seq()
    s.append(0, *kv(rng, 20))
    before = snapshot(store, [s])
    k, v = kv(rng, 4)
    for bad in (np.nan, np.inf, 70000.0):
        k2 = k.copy()
        k2[2, 1, 7] = bad
        raises_kv(kvpage.KV_ERANGE, s.append, 0, k2, v)
    assert_same(before, snapshot(store, [s]))


@pytest.mark.parametrize("layer", [2, -1, 2**32, 2**40])
def test_out_of_range_integers(store, rng, layer):
    """Out of range for the store, or for uint32 (never wrapped by ctypes)."""
    s = store.create_seq()
    s.append(0, *kv(rng, 2))
    raises_kv(kvpage.KV_ERANGE, s.append, layer, *kv(rng, 1))
    raises_kv(kvpage.KV_ERANGE, s.len, layer)
    raises_kv(kvpage.KV_ERANGE, s.read, 0, 0, layer, 1)  # t0 beyond the list
    raises_kv(kvpage.KV_ERANGE, store.decode, layer, [s], np.zeros((1, 4, 64), np.float32))
    raises_kv(kvpage.KV_ERANGE, store.prefill, layer, s, np.zeros((1, 4, 64), np.float32))
    with pytest.raises(TypeError):
        s.len(0.0)
    assert s.len(0) == 2


def test_attention_bad_inputs(store, rng):
    a, empty = store.create_seq(), store.create_seq()
    a.append(0, *kv(rng, 5))
    q = np.zeros((1, 4, 64), np.float32)
    with pytest.raises(ValueError, match=r"q: expected shape \(batch=2, n_q_heads=4, head_dim=64\)"):
        store.decode(0, [a, a], q)
    with pytest.raises(ValueError, match=r"q: expected shape \(n_new, n_q_heads=4"):
        store.prefill(0, a, np.zeros((5, 2, 64), np.float32))
    with pytest.raises(TypeError, match="float32 or float16"):
        store.decode(0, [a], q.astype(np.float64))
    raises_kv(kvpage.KV_ESTATE, store.decode, 0, [empty], q)  # an empty list
    raises_kv(kvpage.KV_EINVAL, store.decode, 0, [], np.zeros((0, 4, 64), np.float32))
    raises_kv(kvpage.KV_ERANGE, store.prefill, 0, a, np.zeros((6, 4, 64), np.float32))
    raises_kv(kvpage.KV_ENOENT, store.decode, 0, [999], q)
    with pytest.raises(kvpage.KvError):
        store.prefill(0, a, np.zeros((0, 4, 64), np.float32))  # n_new 0
    with kvpage.Store(host_pages=8, **SHAPE) as other:
        with pytest.raises(ValueError, match="another store"):
            other.decode(0, [a], q)


def test_bad_config():
    raises_kv(kvpage.KV_ERANGE, kvpage.Store, host_pages=8)  # no shape: n_layers 0
    raises_kv(kvpage.KV_ERANGE, kvpage.estimate, kvpage.Config(host_pages=8))
    with pytest.raises(kvpage.KvError) as e:
        kvpage.Store(host_pages=8, **dict(SHAPE, head_dim=17))
    assert e.value.code in (kvpage.KV_EINVAL, kvpage.KV_ERANGE)
    raises_kv(kvpage.KV_EINVAL, kvpage.Store, host_pages=8, **dict(SHAPE, n_q_heads=3))
    raises_kv(kvpage.KV_ERANGE, kvpage.Store, host_pages=-1, **SHAPE)
    raises_kv(kvpage.KV_ENOTSUP, kvpage.Store, host_pages=8, backend=1, **SHAPE)
    raises_kv(kvpage.KV_EINVAL, kvpage.Store, host_pages=8, offload_pages=4, **SHAPE)
    with pytest.raises(kvpage.KvError) as e:
        kvpage.Store(host_pages=8, pressure="int4,bogus", **SHAPE)
    assert e.value.code == kvpage.KV_EINVAL


def test_bad_policy_specs(store):
    for spec in ("nope", "h2o:hh=2x", "h2o:zz=1", "h2o+snapkv", "fp16+int4", ""):
        e = raises_kv(kvpage.KV_EINVAL, kvpage.Policy, spec)
        assert e.detail and repr(spec) in e.detail
    with pytest.raises(TypeError):
        kvpage.Policy(None)
    s = store.create_seq()
    raises_kv(kvpage.KV_EINVAL, s.set_policy, "h2o:hh=")
    raises_kv(kvpage.KV_EINVAL, store.create_seq, "nope")
    assert store.stats().n_seqs == 1  # create_seq with a bad policy left nothing behind
    e = raises_kv(kvpage.KV_EINVAL, kvpage.check_pressure, "evict:sink=1,sink=2")
    assert "sink" in e.detail
    raises_kv(kvpage.KV_ERANGE, kvpage.check_pressure, "evict:recent=0")
    p = kvpage.Policy("h2o")
    p.close()
    raises_kv(kvpage.KV_ESTATE, s.set_policy, p)
    s.append(0, np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32))
    raises_kv(kvpage.KV_ESTATE, s.set_policy, "h2o")  # not empty any more


def test_limits_and_exhaustion_change_nothing(rng):
    with kvpage.Store(host_pages=6, max_seqs=2, **SHAPE) as st:
        a, b = st.create_seq(), st.create_seq()
        raises_kv(kvpage.KV_ELIMIT, st.create_seq)
        raises_kv(kvpage.KV_ELIMIT, a.fork)
        a.append(0, *kv(rng, 32))  # 4 of 6 pages
        before = snapshot(st, [a, b])
        raises_kv(kvpage.KV_ENOMEM, b.append, 0, *kv(rng, 40))  # needs 6
        try:
            a.append(0, *kv(rng, 17))  # needs 4
            raise AssertionError("append into a full pool succeeded")
        except MemoryError as e:  # a plain `except MemoryError` catches KV_ENOMEM
            assert e.code == kvpage.KV_ENOMEM
        after = snapshot(st, [a, b])
        assert after[0].alloc_failures > before[0].alloc_failures
        before[0].alloc_failures = after[0].alloc_failures
        before[0].pages_peak = after[0].pages_peak
        assert_same(before, after)
        st.check()


def test_sequence_errors(store, rng):
    s = store.create_seq()
    s.append(0, *kv(rng, 10))
    raises_kv(kvpage.KV_ENOENT, store.seq, 12345)
    raises_kv(kvpage.KV_ERANGE, store.seq, -1)
    raises_kv(kvpage.KV_EINVAL, s.compact, 0, 0, [3, 2])
    raises_kv(kvpage.KV_ERANGE, s.compact, 0, 0, [0, 10])
    raises_kv(kvpage.KV_ERANGE, s.compact, 0, 0, [-1, 2])
    with pytest.raises(TypeError):
        s.compact(0, 0, [0.5])
    with pytest.raises(ValueError):
        s.compact(0, 0, [[0, 1]])
    raises_kv(kvpage.KV_EINVAL, s.set_format, 0, 7)
    raises_kv(kvpage.KV_EINVAL, s.set_format, 0, kvpage.Format.MERGED)
    raises_kv(kvpage.KV_ERANGE, s.merge_layers, 0)
    raises_kv(kvpage.KV_EINVAL, s.merge_layers, 1, t=2.0)
    raises_kv(kvpage.KV_ERANGE, s.read, 0, 0, 5, 6)
    assert s.len(0) == 10
    s.free()
    raises_kv(kvpage.KV_ENOENT, s.free)
    raises_kv(kvpage.KV_ENOENT, s.len, 0)
    raises_kv(kvpage.KV_ENOENT, store.decode, 0, [s], np.zeros((1, 4, 64), np.float32))
    with s:  # leaving a with block of a freed sequence does nothing
        pass


def test_offload_without_page_file(store):
    s = store.create_seq()
    for fn in (s.offload, s.prefetch, s.wait, store.offload_balance, store.offload_sync):
        raises_kv(kvpage.KV_ENOTSUP, fn)
    r = s.residency()
    assert r.pages == r.resident == 0


def test_closed_store(rng):
    st = kvpage.Store(host_pages=8, **SHAPE)
    s = st.create_seq()
    st.close()
    q = np.zeros((1, 4, 64), np.float32)
    calls = [st.stats, st.check, st.create_seq, st.seqs, st.offload_sync, st.offload_balance,
             lambda: st.seq(0), lambda: st.decode(0, [s], q), lambda: st.prefill(0, s, q),
             s.free, s.fork, lambda: s.len(0), lambda: s.append(0, *kv(rng, 1)), lambda: s.read(0, 0),
             lambda: s.compact(0, 0, []), s.prefill_end, s.step_end, s.offload, s.wait,
             s.residency, lambda: s.set_policy("h2o")]
    for call in calls:
        e = raises_kv(kvpage.KV_ESTATE, call)
        assert "closed" in e.detail
        assert isinstance(e, kvpage.KvClosed) and isinstance(e, ValueError)
    with s:  # nothing to free
        pass
