# SPDX-License-Identifier: MIT
"""policy.py — compression policies parsed from spec strings (kv_policy_*),
and the memory-pressure ladder's checker (kv_pressure_check).

A Policy owns one parsed kv_policy_t until close() (or the end of a with
block, or garbage collection: kv_policy_destroy only frees memory, so the
finalizer calls it at once); Seq.set_policy copies it into the store, so
a policy may be closed as soon as it is attached. The grammar of specs and
ladders: docs/policies.md.
"""
from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Optional

from . import _consts as _c
from ._lib import kv_policy_info_t, lib
from .config import Format, u_int
from .errors import KV_ERANGE, Owned, check

_ERR_LEN = 512


Method = enum.IntFlag("Method", {name[len("KV_POLICY_"):]: value
                                 for name, value in vars(_c).items()
                                 if name.startswith("KV_POLICY_")}, module=__name__)
Method.__doc__ = """The methods of a policy: the KV_POLICY_* bits of kvpage.h (of
PolicyInfo.methods), named without the prefix: Method.H2O, Method.KVZIP..."""


@dataclass
class PolicyInfo:
    """What a policy does to a sequence's lists, in numbers
    (kv_policy_info_t; every field documented there)."""
    methods: Method
    format: Format
    residual: int
    evicts: int
    budget: int
    kept_fraction: float
    lazy_window: int
    lazy_at_prefill: int
    merge_first: int
    merge_pairs: int
    merge_every: int
    merge_dir_format: Format


class Policy(Owned):
    """A parsed policy, e.g. Policy("h2o:hh=0.1,rw=0.1+cam:m=16").

    A malformed spec raises KvError(KV_EINVAL) whose detail names the
    offending method, key or value. close() (kv_policy_destroy) frees it."""

    _what = "policy"

    def __init__(self, spec: str) -> None:
        super().__init__()
        if not isinstance(spec, str):
            raise TypeError(f"policy spec: expected str, got {type(spec).__name__}")
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_ERR_LEN)
        rc = lib.kv_policy_parse(spec.encode(), ctypes.byref(h), err, _ERR_LEN)
        check(rc, f"policy {spec!r}: {err.value.decode(errors='replace')}")
        self._own(h)

    @property
    def spec(self) -> str:
        """The canonical spec: every key with its value (kv_policy_describe)."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            rc = lib.kv_policy_describe(self.handle, buf, size)
            if rc == 0:
                return buf.value.decode()
            if rc != KV_ERANGE or size > 1 << 20:  # KV_ERANGE: does not fit
                check(rc)
            size *= 4

    def value(self, method: str, key: str) -> float:
        """The value of one key of one method, as given or defaulted
        (kv_policy_value); KvError(KV_ENOENT) if the policy lacks the method,
        KV_EINVAL for an unknown method or key."""
        out = ctypes.c_double()
        check(lib.kv_policy_value(self.handle, method.encode(), key.encode(),
                                  ctypes.byref(out)), f"{method}.{key}")
        return out.value

    def info(self, n_layers: int, prompt_len: int) -> PolicyInfo:
        """What the policy does for n_layers layers and a prompt of
        prompt_len tokens (kv_policy_info)."""
        out = kv_policy_info_t()
        check(lib.kv_policy_info(self.handle, u_int("n_layers", n_layers),
                                 u_int("prompt_len", prompt_len), ctypes.byref(out)))
        return PolicyInfo(Method(out.methods), Format(out.format), out.residual, out.evicts,
                          out.budget, out.kept_fraction, out.lazy_window, out.lazy_at_prefill,
                          out.merge_first, out.merge_pairs, out.merge_every,
                          Format(out.merge_dir_format))

    @staticmethod
    def _destroy_fn(handle: ctypes.c_void_p) -> None:
        lib.kv_policy_destroy(handle)

    def __repr__(self) -> str:
        return f"Policy({self.spec!r})" if self._h is not None else "Policy(<closed>)"


def check_pressure(ladder: Optional[str]) -> None:
    """Check a memory-pressure ladder (Config.pressure) on its own
    (kv_pressure_check): returns None for a valid one (None and "": no
    ladder), else raises KvError (KV_EINVAL, KV_ERANGE) whose detail names
    the step, key and value."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = lib.kv_pressure_check(None if ladder is None else ladder.encode(), err, _ERR_LEN)
    check(rc, f"pressure {ladder!r}: {err.value.decode(errors='replace')}")
