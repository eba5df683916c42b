# SPDX-License-Identifier: MIT
"""The page-file tier through the binding, in a temporary directory:
offload, residency, KV_ENOTRES, sync, close, reopen with OFFLOAD_OPEN,
prefetch, every list and the attention over it back bit-exact; the OS
errors of create/open as KvError(-errno); one owner per file (KV_EBUSY)."""
import errno

import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv


def open_store(path, flags=0, **kw):
    return kvpage.Store(host_pages=128, offload_path=str(path), offload_pages=256,
                        offload_flags=flags, **dict(SHAPE, **kw))


def contents(seq):
    return [seq.read(layer, h) for layer in range(2) for h in range(2)]


def test_round_trip(tmp_path, rng):
    path = tmp_path / "pages"
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    with open_store(path) as st:
        a, b = st.create_seq(), st.create_seq()
        for s, n in ((a, 70), (b, 5)):
            for layer in range(2):
                s.append(layer, *kv(rng, n))
        want, attn = [contents(a), contents(b)], st.decode(1, [a, b], q)
        used = st.stats().pages_used
        for s in (a, b):
            s.offload()
        for s in (a, b):
            s.wait()
            r = s.residency()
            assert r.on_file == r.pages > 0 and r.resident == 0
        st_ = st.stats()
        assert st_.pages_used == 0 and st_.pages_on_file == used and st_.pages_out == used
        with pytest.raises(kvpage.KvError) as e:
            a.read(0, 0)
        assert e.value.code == kvpage.KV_ENOTRES
        st.offload_sync()
        ids = [a.id, b.id]
    assert path.exists()
    with pytest.raises(kvpage.KvError) as e:  # creating over it: -EEXIST
        open_store(path)
    assert e.value.code == -errno.EEXIST and e.value.name == "EEXIST"
    assert isinstance(e.value, OSError) and e.value.errno == errno.EEXIST
    with open_store(path, kvpage.OFFLOAD_OPEN) as st:
        seqs = st.seqs()
        assert [s.id for s in seqs] == ids
        with pytest.raises(kvpage.KvError) as e:  # one owner per file
            open_store(path, kvpage.OFFLOAD_OPEN)
        assert e.value.code == kvpage.KV_EBUSY and isinstance(e.value, kvpage.KvBusy)
        for s in seqs:
            s.prefetch()
        for s in seqs:
            s.wait()
            assert s.residency().resident == s.residency().pages
        for s, w in zip(seqs, want):
            for got, exp in zip(contents(s), w):
                for x, y in zip(got, exp):
                    np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(st.decode(1, seqs, q), attn)
        assert st.stats().pages_in == st.stats().pages_used
        st.check()


def test_wait_flag_reads_back(tmp_path, rng):
    with open_store(tmp_path / "p", kvpage.OFFLOAD_WAIT) as st:
        s = st.create_seq()
        s.append(0, *kv(rng, 40))
        k0 = s.read(0, 1)[0]
        s.offload()
        s.wait()
        np.testing.assert_array_equal(s.read(0, 1)[0], k0)  # read back on access
        assert st.offload_balance() == 0  # below the watermarks: nothing written


def test_open_errors(tmp_path):
    with pytest.raises(kvpage.KvError) as e:
        open_store(tmp_path / "missing", kvpage.OFFLOAD_OPEN)
    assert e.value.code == -errno.ENOENT
    with pytest.raises(kvpage.KvError) as e:
        open_store(tmp_path, 0)  # a directory
    assert e.value.code < 0
    with pytest.raises(kvpage.KvError) as e:
        open_store(tmp_path / "p", 0x80)  # an unknown flag
    assert e.value.code == kvpage.KV_EINVAL
