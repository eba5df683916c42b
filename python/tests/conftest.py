# SPDX-License-Identifier: MIT
"""Shared fixtures of the binding's tests. The package under test is the one
in this source tree (python/kvpage), the library whatever kvpage/_lib.py
finds: CTest sets KVPAGE_LIB to the build's libkvpage.so."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kvpage  # noqa: E402

SHAPE = dict(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)


@pytest.fixture
def store():
    """A small store: 2 layers, 4 query heads over 2 kv heads (GQA groups of
    2), head_dim 64, 256 pages of 16 FP16 tokens."""
    with kvpage.Store(host_pages=256, n_threads=2, **SHAPE) as st:
        yield st


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def kv(rng, n, dtype=np.float32, kv_heads=2, head_dim=64):
    """Random keys and values (n, kv_heads, head_dim)."""
    return (rng.standard_normal((n, kv_heads, head_dim)).astype(dtype),
            rng.standard_normal((n, kv_heads, head_dim)).astype(dtype))
