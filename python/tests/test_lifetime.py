# SPDX-License-Identifier: MIT
"""What close() and garbage collection do (kvpage/errors.py, Owned):
close() destroys on the calling thread; a store collected unclosed warns
(ResourceWarning) and is destroyed on the "kvpage-reaper" thread, so the
collection does not wait for it, yet its page file is persisted; so is the
page file of a store still open at interpreter exit; a policy collected
unclosed is freed at once; a closed object raises KvClosed (a ValueError)."""
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv
from kvpage import _lib


def open_store(path, flags=0):
    return kvpage.Store(host_pages=64, offload_path=str(path), offload_pages=128,
                        offload_flags=flags, **SHAPE)


def fill_and_offload(st, rng):
    """One sequence of 40 tokens per layer, written to the page file: the
    index that records it is written by the sync of kv_store_destroy."""
    s = st.create_seq()
    for layer in range(2):
        s.append(layer, *kv(rng, 40))
    want = [s.read(layer, h) for layer in range(2) for h in range(2)]
    s.offload()
    s.wait()
    return s.id, want


def assert_restored(path, sid, want):
    with open_store(path, kvpage.OFFLOAD_OPEN | kvpage.OFFLOAD_WAIT) as st:
        assert [s.id for s in st.seqs()] == [sid]
        got = [st.seq(sid).read(layer, h) for layer in range(2) for h in range(2)]
    for g, w in zip(got, want):
        for x, y in zip(g, w):
            np.testing.assert_array_equal(x, y)


class Recorder:
    """Wraps kv_store_destroy: records the thread of each call, and holds
    each call until `release` is set (a slow fsync)."""

    def __init__(self, real):
        self.real, self.threads = real, []
        self.release = threading.Event()

    def __call__(self, handle):
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(10), "the destroy was never released"
        self.real(handle)


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder(_lib.lib.kv_store_destroy)
    monkeypatch.setattr(_lib.lib, "kv_store_destroy", rec)
    yield rec
    rec.release.set()
    kvpage.reaper_wait()


def test_close_destroys_on_the_calling_thread(recorder):
    recorder.release.set()
    st = kvpage.Store(host_pages=8, **SHAPE)
    st.close()
    st.close()  # idempotent
    assert recorder.threads == [threading.current_thread().name]
    with pytest.raises(kvpage.KvClosed) as e:
        st.stats()
    assert isinstance(e.value, ValueError) and isinstance(e.value, kvpage.KvState)
    assert e.value.code == kvpage.KV_ESTATE and "closed" in e.value.detail
    del st
    gc.collect()
    assert recorder.threads == [threading.current_thread().name]  # not destroyed twice


def test_collected_store_is_destroyed_off_the_collecting_thread(tmp_path, rng, recorder):
    path = tmp_path / "pages"
    st = open_store(path)
    sid, want = fill_and_offload(st, rng)
    with pytest.warns(ResourceWarning, match="unclosed store"):
        t0 = time.monotonic()
        del st
        gc.collect()
        waited = time.monotonic() - t0
    assert waited < 5, "garbage collection waited for the destroy"
    deadline = time.monotonic() + 10
    while not recorder.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.threads == ["kvpage-reaper"]
    recorder.release.set()
    kvpage.reaper_wait()
    assert_restored(path, sid, want)  # the reaper's destroy synced the page file


def test_store_open_at_exit_is_persisted(tmp_path, rng):
    path = tmp_path / "pages"
    k = rng.standard_normal((40, 2, 64)).astype(np.float32)
    np.save(tmp_path / "k.npy", k)
    script = f"""
import numpy as np, kvpage
k = np.load({str(tmp_path / 'k.npy')!r})
st = kvpage.Store(host_pages=64, offload_path={str(path)!r}, offload_pages=128,
                  n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)
s = st.create_seq()
for layer in range(2):
    s.append(layer, k, k)
s.offload()
s.wait()
keep = st  # still open when the interpreter exits
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(kvpage.__file__).parent.parent)] + sys.path))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    k16 = k.astype(np.float16).astype(np.float32)  # stored as FP16 pages
    want = [(k16[:, h], k16[:, h], np.arange(40, dtype=np.int32)) for _ in range(2)
            for h in range(2)]
    assert_restored(path, 0, want)


def test_collected_policy_is_freed_at_once(monkeypatch):
    calls = []
    real = _lib.lib.kv_policy_destroy
    monkeypatch.setattr(_lib.lib, "kv_policy_destroy",
                        lambda h: (calls.append(threading.current_thread().name), real(h)))
    p = kvpage.Policy("h2o")
    with pytest.warns(ResourceWarning, match="unclosed policy"):
        del p
        gc.collect()
    assert calls == [threading.current_thread().name]
    with kvpage.Policy("h2o") as p:
        pass
    assert len(calls) == 2
    with pytest.raises(ValueError, match="closed"):
        p.spec
