# SPDX-License-Identifier: MIT
"""kvpage — Python binding of kvpage, a paged KV-cache store (libkvpage.so,
through ctypes; docs/python.md).

    import numpy as np, kvpage
    with kvpage.Store(n_layers=1, n_q_heads=4, n_kv_heads=2, head_dim=64,
                      host_pages=64) as store, store.create_seq() as seq:
        k = v = np.ones((40, 2, 64), np.float32)
        seq.append(0, k, v)
        out = store.prefill(0, seq, np.ones((40, 4, 64), np.float32))

Every failing C call raises a subclass of KvError (.code, .name, .message =
kv_strerror, .detail), one per KV_E* code, that is also the builtin that
fits: KvNoMemory is a MemoryError, KvInvalid and KvRange ValueErrors,
KvIOError an OSError... (errors.py); a closed Store or Policy raises
KvClosed, a ValueError. Bad shapes raise ValueError, bad dtypes TypeError.
"""
from ._lib import lib_path, version
from .config import (CONFIG_INT8_ATTN, CONFIG_NO_TCACHE, OFFLOAD_OPEN, OFFLOAD_PREAD,
                     OFFLOAD_WAIT, Config, Estimate, Format, FormatInfo, Residency, Stats,
                     estimate, format_info, format_note)
from .errors import (KV_EAUTH, KV_EBUSY, KV_ECORRUPT, KV_EINVAL, KV_EIO, KV_ELIMIT, KV_ENOENT,
                     KV_ENOMEM, KV_ENOTRES, KV_ENOTSUP, KV_ERANGE, KV_ESTATE, KV_ETLS, KV_EVERSION,
                     KV_OK, KvAuth, KvBusy, KvClosed, KvCorrupt, KvError, KvInvalid, KvIOError,
                     KvLimit, KvNoMemory, KvNotFound, KvNotResident, KvNotSupported, KvOSError,
                     KvRange, KvState, KvTLS, KvVersion, code_name, error_class, reaper_wait,
                     strerror)
from .policy import Method, Policy, PolicyInfo, check_pressure
from .store import Seq, Store

__version__ = version
__all__ = [
    "Store", "Seq", "Config", "Stats", "Estimate", "Residency", "Format", "FormatInfo",
    "Policy", "PolicyInfo", "Method", "KvError", "KvInvalid", "KvNoMemory", "KvRange",
    "KvNotFound", "KvState", "KvClosed", "KvNotSupported", "KvVersion", "KvCorrupt",
    "KvIOError", "KvLimit", "KvNotResident", "KvBusy", "KvAuth", "KvTLS", "KvOSError",
    "error_class",
    "reaper_wait", "estimate", "format_info", "format_note",
    "check_pressure", "strerror", "code_name", "version", "lib_path",
    "CONFIG_NO_TCACHE", "CONFIG_INT8_ATTN", "OFFLOAD_WAIT", "OFFLOAD_OPEN", "OFFLOAD_PREAD",
    "KV_OK", "KV_EINVAL", "KV_ENOMEM", "KV_ERANGE", "KV_ENOENT", "KV_ESTATE", "KV_ENOTSUP",
    "KV_EVERSION", "KV_ECORRUPT", "KV_EIO", "KV_ELIMIT", "KV_ENOTRES", "KV_EBUSY", "KV_EAUTH",
    "KV_ETLS",
]
