# SPDX-License-Identifier: MIT
"""The prefix cache through the binding (docs/prefix.md): a published prompt
found again by a second sequence with the same K/V rows on shared pages,
salts that never share, the cache off, bad input. Blocks are the FP16 page's
16 tokens (head_dim 64)."""
import numpy as np
import pytest

import kvpage
from conftest import SHAPE, kv

B = 16  # tokens per block: FP16 tokens per page for head_dim 64
MODEL = b"\x01" * 32  # a model fingerprint (e.g. the SHA-256 of the weights)


@pytest.fixture
def pstore():
    with kvpage.Store(host_pages=256, n_threads=2, prefix_cache=True, prefix_model=MODEL,
                      **SHAPE) as st:
        yield st


def _prompt(store, rng, tokens):
    """A sequence holding the K/V of tokens (random) in every layer."""
    s = store.create_seq()
    for layer in range(SHAPE["n_layers"]):
        s.append(layer, *kv(rng, len(tokens)))
    return s


def test_config_round_trip(pstore):
    c = pstore.config
    assert c.prefix_cache is True and c.prefix_model == MODEL and c.prefix_remote is None
    with kvpage.Store(host_pages=16, **SHAPE) as off:
        assert off.config.prefix_cache is False and off.config.prefix_model == b""


def test_publish_then_match_shares_rows_and_pages(pstore, rng):
    tokens = np.arange(1000, 1040, dtype=np.int32)  # 40 tokens: 2 full blocks + 8
    a = _prompt(pstore, rng, tokens)
    assert a.prefix_publish(tokens) == 2 * B
    assert a.prefix_publish(list(tokens)) == 2 * B  # idempotent, any int sequence
    st = pstore.stats()
    assert st.prefix_published >= 1 and st.prefix_nodes >= 1
    used = st.pages_used

    b = pstore.create_seq()
    assert b.prefix_match(tokens, b"") == 2 * B
    st = pstore.stats()
    assert (st.prefix_hits, st.prefix_misses, st.prefix_tokens_reused) == (1, 0, 2 * B)
    assert st.pages_used == used  # the matched pages are shared, none copied
    for layer in range(SHAPE["n_layers"]):
        for h in range(SHAPE["n_kv_heads"]):
            assert b.len(layer, h) == 2 * B
            ka, va, pa = a.read(layer, h, 0, 2 * B)
            kb, vb, pb = b.read(layer, h)
            assert np.array_equal(ka, kb) and np.array_equal(va, vb)
            assert np.array_equal(pa, pb) and np.array_equal(pb, np.arange(2 * B))
    # the rest of the prompt appends to fresh pages: a's rows stay as they were
    before = a.read(0, 0)
    b.append(0, *kv(rng, 8))
    assert np.array_equal(a.read(0, 0)[0], before[0])
    pstore.check()

    # a different continuation shares only the common blocks
    c = pstore.create_seq()
    other = np.concatenate([tokens[:B], tokens[B:] + 1])
    assert c.prefix_match(other) == B
    # a sequence of tokens that was never published: a miss, not an error
    d = pstore.create_seq()
    assert d.prefix_match(np.arange(40) + 5000) == 0
    assert pstore.stats().prefix_misses == 1
    pstore.check()


def test_salt_isolates(pstore, rng):
    tokens = np.arange(48, dtype=np.int64)  # any integer dtype whose values fit int32
    a = _prompt(pstore, rng, tokens)
    assert a.prefix_publish(tokens, salt="tenant-a") == 3 * B
    with pstore.create_seq() as b:
        assert b.prefix_match(tokens, salt=b"tenant-b") == 0
        assert b.prefix_match(tokens) == 0  # no salt is a salt of its own
    with pstore.create_seq() as b:
        assert b.prefix_match(tokens, salt="tenant-a".encode()) == 2 * B  # n - 1 rounded down
    st = pstore.stats()
    assert (st.prefix_hits, st.prefix_misses) == (1, 2)


def test_cache_off_is_enotsup(store, rng):
    tokens = np.arange(32, dtype=np.int32)
    a = _prompt(store, rng, tokens)
    for call in (lambda: store.create_seq().prefix_match(tokens),
                 lambda: a.prefix_publish(tokens)):
        with pytest.raises(kvpage.KvError) as e:
            call()
        assert e.value.code == kvpage.KV_ENOTSUP
    assert store.stats().prefix_nodes == 0


def test_config_errors():
    with pytest.raises(kvpage.KvError) as e:  # the cache on without a fingerprint
        kvpage.Store(host_pages=16, prefix_cache=True, **SHAPE)
    assert e.value.code == kvpage.KV_EINVAL
    with pytest.raises(kvpage.KvError) as e:  # a fingerprint with the cache off
        kvpage.Store(host_pages=16, prefix_model=b"x", **SHAPE)
    assert e.value.code == kvpage.KV_EINVAL
    with pytest.raises(kvpage.KvError) as e:  # over 65536 bytes
        kvpage.Store(host_pages=16, prefix_cache=True, prefix_model=b"x" * 65537, **SHAPE)
    assert e.value.code == kvpage.KV_ERANGE


def test_bad_input(pstore, rng):
    tokens = np.arange(40, dtype=np.int32)
    a = _prompt(pstore, rng, tokens)
    fresh = pstore.create_seq()
    for seq in (a, fresh):
        for call in (seq.prefix_match, seq.prefix_publish):
            with pytest.raises(ValueError):
                call(tokens.reshape(4, 10))
            with pytest.raises(ValueError):
                call(np.array([1, 2**31], np.int64))
            with pytest.raises(ValueError):
                call(np.array([-2**31 - 1], np.int64))
            with pytest.raises(TypeError):
                call(np.arange(4, dtype=np.float32))
            with pytest.raises(TypeError):
                call(tokens, salt=5)
    with pytest.raises(kvpage.KvError) as e:  # match into a sequence that holds tokens
        a.prefix_match(tokens)
    assert e.value.code == kvpage.KV_ESTATE
    with pytest.raises(kvpage.KvError) as e:  # more tokens than the lists hold
        a.prefix_publish(np.arange(41))
    assert e.value.code == kvpage.KV_ERANGE
    with pytest.raises(kvpage.KvError) as e:  # salt over 65536 bytes
        fresh.prefix_match(tokens, salt=b"s" * 65537)
    assert e.value.code == kvpage.KV_EINVAL
    fresh.free()
    with pytest.raises(kvpage.KvError) as e:  # a freed sequence
        fresh.prefix_match(tokens)
    assert e.value.code == kvpage.KV_ENOENT
    assert pstore.stats().prefix_nodes == 0  # nothing published by the failures
    pstore.check()


def test_compressed_context(pstore, rng):
    """A context compressed at its prefill end, published whole and installed
    into a second sequence of the same policy: the same rows and positions
    (StreamingLLM keeps the sinks and the recent tokens), no page copied; the
    first misses, another policy misses, a sequence not prefill-ended cannot
    publish."""
    spec = "streamingllm:sink=4,recent=0.25"
    tokens = np.arange(2000, 2100, dtype=np.int32)
    a = pstore.create_seq()
    a.set_policy(spec)
    for layer in range(SHAPE["n_layers"]):
        a.append(layer, *kv(rng, len(tokens)))
    with pytest.raises(kvpage.KvError):
        a.prefix_publish_compressed(tokens)  # before the prefill end
    a.prefill_end()
    a.prefix_publish_compressed(tokens)
    used = pstore.stats().pages_used
    b = pstore.create_seq()
    b.set_policy(spec)
    assert b.prefix_match_compressed(tokens[:-1]) == 0
    assert b.prefix_match_compressed(tokens) == len(tokens)
    st = pstore.stats()
    assert (st.prefix_ctx_hits, st.prefix_ctx_misses, st.prefix_ctx_nodes) == (1, 1, 1)
    assert st.pages_used == used
    for layer in range(SHAPE["n_layers"]):
        for h in range(SHAPE["n_kv_heads"]):
            ka, va, pa = a.read(layer, h)
            kb, vb, pb = b.read(layer, h)
            assert len(pa) < len(tokens) and np.array_equal(pa, pb)
            assert np.array_equal(ka, kb) and np.array_equal(va, vb)
    c = pstore.create_seq()
    c.set_policy("streamingllm:sink=4,recent=0.5")
    assert c.prefix_match_compressed(tokens) == 0


def test_remote_deployment_fields(monkeypatch):
    """Key prefix and MAC key sources (docs/prefix.md, "Deployments"): the
    store reads the key at create (nothing is contacted yet) and returns the
    source strings, never the key; an unset variable is KV_EINVAL."""
    remote = dict(prefix_cache=True, prefix_model=MODEL, prefix_remote="redis://127.0.0.1:1",
                  prefix_remote_ns="dep-a", prefix_remote_mac="env:KVPAGE_PYTEST_MAC")
    monkeypatch.setenv("KVPAGE_PYTEST_MAC", "ab" * 32)
    with kvpage.Store(host_pages=16, **remote, **SHAPE) as st:
        c = st.config
        assert (c.prefix_remote_ns, c.prefix_remote_mac) == ("dep-a", "env:KVPAGE_PYTEST_MAC")
        assert c.prefix_remote_mac_prev is None
        assert st.stats().prefix_remote_unauth == 0
    monkeypatch.delenv("KVPAGE_PYTEST_MAC")
    with pytest.raises(kvpage.KvError) as e:
        kvpage.Store(host_pages=16, **remote, **SHAPE)
    assert e.value.code == kvpage.KV_EINVAL


def test_remote_security_fields(tmp_path, monkeypatch):
    """The remote tier's credential and TLS fields (docs/prefix.md,
    "Authentication and TLS"): copied and read back; bad input named at
    create; the refusal counters are in Stats. No server is contacted
    (nothing listens on port 1: a server that is down does not fail create)."""
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    monkeypatch.setenv("KVPAGE_TEST_PW", "secret")
    base = dict(host_pages=16, prefix_cache=True, prefix_model=MODEL,
                prefix_remote="redis://app@127.0.0.1:1", prefix_remote_timeout_ms=50, **SHAPE)
    with kvpage.Store(prefix_remote_password_file=str(pw), **base) as st:
        assert st.config.prefix_remote_password_file == str(pw)
        s = st.stats()
        assert (s.prefix_remote_denied, s.prefix_remote_auth_failures,
                s.prefix_remote_tls_failures) == (0, 0, 0)
    with kvpage.Store(prefix_remote_password_env="KVPAGE_TEST_PW", **base) as st:
        assert st.config.prefix_remote_password_env == "KVPAGE_TEST_PW"
    bad = [dict(prefix_remote_password_file=str(pw), prefix_remote_password_env="KVPAGE_TEST_PW"),
           dict(prefix_remote_password_env="KVPAGE_TEST_UNSET_VARIABLE"),
           dict(prefix_remote_tls_ca=str(pw)),  # TLS files with redis://
           dict(prefix_remote_tls_cert=str(pw))]
    for extra in bad:
        with pytest.raises(kvpage.KvError) as e:
            kvpage.Store(**extra, **base)
        assert e.value.code == kvpage.KV_EINVAL
    with pytest.raises(kvpage.KvError) as e:
        kvpage.Store(prefix_remote_password_file=str(tmp_path / "missing"), **base)
    assert e.value.name == "ENOENT"
    with pytest.raises(kvpage.KvError) as e:
        kvpage.Store(**dict(base, prefix_remote="rediss://127.0.0.1:1",
                            prefix_remote_tls_ca=str(pw)))
    assert e.value.code == kvpage.KV_ETLS  # not a certificate
    assert kvpage.KV_EAUTH == -1013 and kvpage.code_name(kvpage.KV_ETLS) == "KV_ETLS"
