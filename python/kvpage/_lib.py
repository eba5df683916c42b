# SPDX-License-Identifier: MIT
"""_lib.py — finds and loads libkvpage.so, mirrors the C structs of
include/kvpage/kvpage.h in ctypes and declares every function the binding
calls (restype, argtypes), so that no call goes through ctypes' int guess.

Invariants: the struct mirrors are field-for-field copies of the header
(tests/test_abi.py compiles a C program that prints every offset and size and
compares); kv_config_t's size is also checked against the library's own
struct_size at load time, and the library's major version against MAJOR.

Where the library is looked for, first hit wins (docs/python.md):
  1. $KVPAGE_LIB: the path of a libkvpage.so (an error if it does not load);
  2. next to this package: kvpage/libkvpage.so.MAJOR or kvpage/libkvpage.so;
  3. the build tree, when the package runs from a source checkout:
     <repo>/build/lib/libkvpage.so (python/kvpage/../../build);
  4. the system loader: libkvpage.so.MAJOR, then libkvpage.so
     (LD_LIBRARY_PATH, the ld.so cache, /usr/lib, /usr/local/lib, ...).
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import List, Tuple

from ._consts import KV_FMT_COUNT

MAJOR = 0  # the soname's major version this binding speaks (libkvpage.so.0)

c_float_p = POINTER(c_float)
c_int32_p = POINTER(c_int32)
c_uint32_p = POINTER(c_uint32)


class kv_config_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("version", c_uint32),
        ("n_layers", c_uint32), ("n_q_heads", c_uint32), ("n_kv_heads", c_uint32),
        ("head_dim", c_uint32), ("page_bytes", c_uint32), ("host_pages", c_uint64),
        ("max_seqs", c_uint32), ("n_threads", c_uint32), ("backend", c_uint32),
        ("flags", c_uint32), ("kv_format", c_uint32), ("residual", c_uint32),
        ("pressure", c_char_p), ("pressure_reserve", c_uint32),
        ("offload_path", c_char_p), ("offload_pages", c_uint32), ("offload_qd", c_uint32),
        ("offload_high", c_uint32), ("offload_low", c_uint32), ("offload_flags", c_uint32),
        ("offload_fault_ppm", c_uint32), ("offload_fault_seed", c_uint64),
        ("prefix_cache", c_uint32), ("prefix_model_len", c_uint32),
        ("prefix_model", c_void_p), ("prefix_remote", c_char_p),
        ("prefix_remote_timeout_ms", c_uint32),
        ("prefix_remote_password_file", c_char_p), ("prefix_remote_password_env", c_char_p),
        ("prefix_remote_tls_ca", c_char_p), ("prefix_remote_tls_cert", c_char_p),
        ("prefix_remote_tls_key", c_char_p),
        ("prefix_remote_ns", c_char_p), ("prefix_remote_mac", c_char_p),
        ("prefix_remote_mac_prev", c_char_p),
    ]


class kv_stats_t(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("page_bytes", c_uint32), ("fp16_tokens_per_page", c_uint32),
        ("pages_capacity", c_uint64), ("pages_used", c_uint64), ("pages_free", c_uint64),
        ("pages_peak", c_uint64), ("alloc_failures", c_uint64), ("n_seqs", c_uint64),
        ("tokens", c_uint64),
        ("pages_by_format", c_uint64 * KV_FMT_COUNT),
        ("bytes_by_format", c_uint64 * KV_FMT_COUNT),
        ("kv_bytes", c_uint64), ("meta_bytes", c_uint64), ("fp16_bytes", c_uint64),
        ("pressure_runs", c_uint64), ("pressure_rescued", c_uint64),
        ("pressure_pages_freed", c_uint64), ("pressure_converted_tokens", c_uint64),
        ("pressure_evicted_tokens", c_uint64),
        ("offload_slots", c_uint64), ("offload_slots_used", c_uint64),
        ("pages_on_file", c_uint64), ("pages_in_flight", c_uint64), ("pages_lost", c_uint64),
        ("pages_out", c_uint64), ("pages_in", c_uint64), ("bytes_out", c_uint64),
        ("bytes_in", c_uint64), ("io_errors", c_uint64), ("seqs_dropped", c_uint64),
        ("offload_faults", c_uint64), ("pressure_offloaded_pages", c_uint64),
    ] + [(n, c_uint64) for n in (
        "prefix_nodes", "prefix_pages", "prefix_pages_only", "prefix_hits", "prefix_misses",
        "prefix_tokens_reused", "prefix_published", "prefix_evicted", "prefix_evicted_pages",
        "prefix_remote_hits", "prefix_remote_tokens", "prefix_remote_bad",
        "prefix_remote_errors", "prefix_remote_bytes_in", "prefix_remote_put",
        "prefix_remote_dropped", "prefix_snapshots", "prefix_snapshot_bytes",
        "prefix_file_nodes", "prefix_file_slots",
        "prefix_file_hits", "prefix_file_tokens", "prefix_file_bytes_in",
        "prefix_file_bytes_out", "prefix_file_demoted", "prefix_file_dropped",
        "prefix_file_bad", "prefix_file_restored", "prefix_ctx_nodes",
        "prefix_ctx_published", "prefix_ctx_hits", "prefix_ctx_misses", "prefix_remote_unauth",
        "prefix_remote_denied", "prefix_remote_auth_failures", "prefix_remote_tls_failures")]


class kv_estimate_t(Structure):
    _fields_ = [(n, c_uint64) for n in
                ("meta_fixed", "meta_per_seq", "meta_per_page", "meta_max", "kv_max",
                 "meta_cap")]


class kv_residency_t(Structure):
    _fields_ = [(n, c_uint64) for n in ("pages", "resident", "on_file", "in_flight", "lost")]


class kv_decode_t(Structure):
    _fields_ = [
        ("layer", c_uint32), ("batch", c_uint32), ("seqs", c_uint32_p),
        ("q", c_float_p), ("out", c_float_p), ("stats", POINTER(c_float_p)),
        ("stats_stride", c_uint32), ("scale", c_float),
    ]


class kv_prefill_t(Structure):
    _fields_ = [
        ("layer", c_uint32), ("seq", c_uint32), ("n_new", c_uint32),
        ("q", c_float_p), ("out", c_float_p), ("stats", c_float_p),
        ("stats_stride", c_uint32), ("stats_row0", c_uint32), ("scale", c_float),
    ]


class kv_merge_opts_t(Structure):
    _fields_ = [("struct_size", c_uint32), ("t", c_float), ("gamma", c_float),
                ("dir_format", c_uint32), ("keep_fp16", c_uint32)]


class kv_format_info_t(Structure):
    _fields_ = [("name", c_char_p), ("note", c_char_p), ("bits_per_element", c_double),
                ("group_size", c_uint32), ("tokens_per_page", c_uint32)]


class kv_policy_info_t(Structure):
    _fields_ = [
        ("methods", c_uint32), ("format", c_uint32), ("residual", c_uint32),
        ("evicts", c_uint32), ("budget", c_uint32), ("kept_fraction", c_double),
        ("lazy_window", c_uint32), ("lazy_at_prefill", c_uint32),
        ("merge_first", c_uint32), ("merge_pairs", c_uint32), ("merge_every", c_uint32),
        ("merge_dir_format", c_uint32),
    ]


P = POINTER
_store = c_void_p
_PROTOTYPES = {
    "kv_strerror": (c_char_p, [c_int]),
    "kv_version": (c_char_p, []),
    "kv_config_init": (c_int, [P(kv_config_t), c_uint32]),
    "kv_config_estimate": (c_int, [P(kv_config_t), P(kv_estimate_t)]),
    "kv_store_create": (c_int, [P(kv_config_t), P(c_void_p)]),
    "kv_store_destroy": (None, [_store]),
    "kv_store_config_into": (c_int, [_store, P(kv_config_t), c_uint32]),
    "kv_store_stats": (c_int, [_store, P(kv_stats_t)]),
    "kv_store_check": (c_int, [_store]),
    "kv_seq_create": (c_int, [_store, c_uint32_p]),
    "kv_seq_free": (c_int, [_store, c_uint32]),
    "kv_seq_fork": (c_int, [_store, c_uint32, c_uint32_p]),
    "kv_seq_score_begin": (c_int, [_store, c_uint32, c_uint32, c_uint32, c_uint32]),
    "kv_seq_len": (c_int, [_store, c_uint32, c_uint32, c_uint32, c_uint32_p]),
    "kv_append": (c_int, [_store, c_uint32, c_uint32, c_uint32, c_int, c_void_p, c_void_p,
                          c_int32_p]),
    "kv_read": (c_int, [_store, c_uint32, c_uint32, c_uint32, c_uint32, c_uint32, c_float_p,
                        c_float_p, c_int32_p]),
    "kv_compact": (c_int, [_store, c_uint32, c_uint32, c_uint32, c_uint32_p, c_uint32]),
    "kv_seq_set_format": (c_int, [_store, c_uint32, c_uint32, c_uint32]),
    "kv_seq_quantize": (c_int, [_store, c_uint32, c_uint32, c_uint32]),
    "kv_merge_opts_default": (kv_merge_opts_t, []),
    "kv_seq_merge_layers": (c_int, [_store, c_uint32, c_uint32, P(kv_merge_opts_t)]),
    "kv_format_note": (c_char_p, [c_uint32]),
    "kv_format_info": (c_int, [c_uint32, c_uint32, c_uint32, c_uint32, P(kv_format_info_t)]),
    "kv_policy_parse": (c_int, [c_char_p, P(c_void_p), c_char_p, c_size_t]),
    "kv_policy_destroy": (None, [c_void_p]),
    "kv_policy_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "kv_policy_value": (c_int, [c_void_p, c_char_p, c_char_p, P(c_double)]),
    "kv_policy_info": (c_int, [c_void_p, c_uint32, c_uint32, P(kv_policy_info_t)]),
    "kv_seq_set_policy": (c_int, [_store, c_uint32, c_void_p]),
    "kv_seq_prefill_end": (c_int, [_store, c_uint32]),
    "kv_seq_step_end": (c_int, [_store, c_uint32]),
    "kv_pressure_check": (c_int, [c_char_p, c_char_p, c_size_t]),
    "kv_seq_offload": (c_int, [_store, c_uint32]),
    "kv_seq_prefetch": (c_int, [_store, c_uint32]),
    "kv_seq_wait": (c_int, [_store, c_uint32]),
    "kv_seq_residency": (c_int, [_store, c_uint32, P(kv_residency_t)]),
    "kv_store_offload_balance": (c_int, [_store]),
    "kv_store_offload_sync": (c_int, [_store]),
    "kv_store_seqs": (c_int, [_store, c_uint32_p, c_uint32, c_uint32_p]),
    "kv_attn_decode": (c_int, [_store, P(kv_decode_t)]),
    "kv_attn_prefill": (c_int, [_store, P(kv_prefill_t)]),
    "kv_seq_prefix_match": (c_int, [_store, c_uint32, c_int32_p, c_uint32, c_void_p, c_size_t,
                                    c_uint32_p]),
    "kv_seq_prefix_publish": (c_int, [_store, c_uint32, c_int32_p, c_uint32, c_void_p,
                                      c_size_t]),
    "kv_seq_prefix_publish_compressed": (c_int, [_store, c_uint32, c_int32_p, c_uint32,
                                                 c_void_p, c_size_t]),
    "kv_seq_prefix_match_compressed": (c_int, [_store, c_uint32, c_int32_p, c_uint32,
                                               c_void_p, c_size_t, c_uint32_p]),
}


def _candidates() -> List[Tuple[str, str]]:
    """(how found, path or name) in the lookup order of the module comment."""
    here = Path(__file__).resolve().parent
    out = [("next to the package", str(here / name))
           for name in (f"libkvpage.so.{MAJOR}", "libkvpage.so")
           if (here / name).exists()]
    repo = here.parent.parent
    built = repo / "build" / "lib" / "libkvpage.so"
    if (repo / "include" / "kvpage" / "kvpage.h").exists() and built.exists():
        out.append(("the build tree", str(built)))
    out += [("the system loader", f"libkvpage.so.{MAJOR}"), ("the system loader", "libkvpage.so")]
    return out


def _load() -> Tuple[ctypes.CDLL, str]:
    env = os.environ.get("KVPAGE_LIB")
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise ImportError(f"kvpage: KVPAGE_LIB={env!r} does not load: {e}") from e
    tried = []
    for how, name in _candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"  {how}: {e}")
    raise ImportError("kvpage: libkvpage.so not found; set KVPAGE_LIB to its path, or install "
                      "the library (make install) where the loader looks. Tried:\n"
                      + "\n".join(tried))


lib, lib_path = _load()
for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args

version: str = lib.kv_version().decode()
if int(version.split(".")[0]) != MAJOR:
    raise ImportError(f"kvpage: {lib_path} is version {version}; this binding needs {MAJOR}.x")


def config_default() -> kv_config_t:
    """kv_config_default() of the header: kv_config_init with the mirror's
    size (a library whose kv_config_t differs refuses it: ImportError
    below)."""
    c = kv_config_t()
    if lib.kv_config_init(ctypes.byref(c), ctypes.sizeof(c)) != 0:
        raise ImportError(f"kvpage: {lib_path}: kv_config_init refuses the binding's "
                          f"kv_config_t of {ctypes.sizeof(c)} bytes: mismatched header and "
                          "library")
    return c


config_default()
