# SPDX-License-Identifier: MIT
"""config.py — the value types of the binding: page formats, flags, the store
configuration (kv_config_t) and what the store reports (kv_stats_t,
kv_estimate_t, kv_residency_t, kv_format_info_t), as dataclasses with the C
field names, plus the functions that need no store:
estimate(), format_note(), format_info(). Every number comes from the
header through _consts (generated, python/gen_consts.py).

Config's defaults are kv_config_default()'s, read from the library at import;
Config._to_c() starts from kv_config_default() again, so struct_size and
version always come from the library.
"""
from __future__ import annotations

import ctypes
import dataclasses
import enum
import operator
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Type, TypeVar

from . import _consts as _c
from . import _lib
from ._lib import lib
from .errors import KV_EINVAL, KV_ERANGE, KvError, check

T = TypeVar("T")


class Format(enum.IntEnum):
    """Page formats (kv_format_t). The numbers are written into page files."""
    FP16 = _c.KV_FMT_FP16
    INT4 = _c.KV_FMT_INT4      # KIVI 4-bit, groups of 16: 6 bits/element
    INT2 = _c.KV_FMT_INT2      # KIVI 2-bit, groups of 16: 4 bits/element
    MERGED = _c.KV_FMT_MERGED  # MiniCache merged layer pair


CONFIG_NO_TCACHE = _c.KV_CONFIG_NO_TCACHE  # kv_config_t.flags: no per-thread page caches
CONFIG_INT8_ATTN = _c.KV_CONFIG_INT8_ATTN  # flags: approximate int8 attention over INT pages
OFFLOAD_WAIT = _c.KV_OFFLOAD_WAIT    # offload_flags: read non-resident pages back and wait
OFFLOAD_OPEN = _c.KV_OFFLOAD_OPEN    # offload_flags: open an existing page file, restore it
OFFLOAD_PREAD = _c.KV_OFFLOAD_PREAD  # offload_flags: pread/pwrite even where io_uring runs

_D = _lib.config_default()


@dataclass
class Config:
    """Store configuration: kv_config_t without struct_size/version (see
    include/kvpage/kvpage.h for every field's range). Set at least the model
    shape (n_layers, n_q_heads, n_kv_heads, head_dim) and host_pages; the
    other fields default as kv_config_default() sets them (0 = the library's
    default). pressure, offload_path and the prefix_remote* strings
    (prefix_remote, _password_file, _password_env, _tls_ca, _tls_cert,
    _tls_key, _ns, _mac "file:PATH"/"env:NAME", _mac_prev) are str (or None).
    Prefix cache (docs/prefix.md): prefix_cache=True needs prefix_model, the
    model fingerprint (bytes, 1..65536; e.g. the SHA-256 of the weights
    file; the store copies it at create), else KvError(KV_EINVAL) from the
    store; with the cache off all prefix_* fields must stay unset.
    prefix_model_len is not a field: it is len(prefix_model)."""
    n_layers: int = _D.n_layers
    n_q_heads: int = _D.n_q_heads
    n_kv_heads: int = _D.n_kv_heads
    head_dim: int = _D.head_dim
    page_bytes: int = _D.page_bytes
    host_pages: int = _D.host_pages
    max_seqs: int = _D.max_seqs
    n_threads: int = _D.n_threads
    backend: int = _D.backend
    flags: int = _D.flags
    kv_format: int = _D.kv_format
    residual: int = _D.residual
    pressure: Optional[str] = None
    pressure_reserve: int = _D.pressure_reserve
    offload_path: Optional[str] = None
    offload_pages: int = _D.offload_pages
    offload_qd: int = _D.offload_qd
    offload_high: int = _D.offload_high
    offload_low: int = _D.offload_low
    offload_flags: int = _D.offload_flags
    offload_fault_ppm: int = _D.offload_fault_ppm
    offload_fault_seed: int = _D.offload_fault_seed
    prefix_cache: bool = bool(_D.prefix_cache)
    prefix_model: bytes = b""
    prefix_remote: Optional[str] = None
    prefix_remote_timeout_ms: int = _D.prefix_remote_timeout_ms
    prefix_remote_password_file: Optional[str] = None
    prefix_remote_password_env: Optional[str] = None
    prefix_remote_tls_ca: Optional[str] = None
    prefix_remote_tls_cert: Optional[str] = None
    prefix_remote_tls_key: Optional[str] = None
    prefix_remote_ns: Optional[str] = None
    prefix_remote_mac: Optional[str] = None
    prefix_remote_mac_prev: Optional[str] = None

    def _to_c(self) -> _lib.kv_config_t:
        """The C struct. Its char pointers point into bytes objects the
        struct keeps alive (ctypes holds them in the struct's _objects; the
        prefix_model buffer in the struct's attribute _prefix_model_buf), so
        the struct is valid for kv_store_create as long as it lives."""
        c = _lib.config_default()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "prefix_model":
                model = bytes(value) if value is not None else b""
                if len(model) >= 1 << 32:
                    raise KvError(KV_ERANGE, f"prefix_model: {len(model)} bytes")
                c.prefix_model_len = len(model)
                if model:
                    buf = ctypes.create_string_buffer(model, len(model))
                    c._prefix_model_buf = buf  # type: ignore[attr-defined]
                    c.prefix_model = ctypes.cast(buf, ctypes.c_void_p).value
                else:
                    c.prefix_model = None
                continue
            if f.name in _STRINGS:
                value = None if value is None else str(value).encode()
            else:
                value = u_int(f.name, value, 64 if f.name in _U64 else 32)
            setattr(c, f.name, value)
        return c

    @classmethod
    def _from_c(cls, c: _lib.kv_config_t) -> "Config":
        names = [f.name for f in dataclasses.fields(cls) if f.name != "prefix_model"]
        fields: dict = {name: getattr(c, name) for name in names}
        for name in _STRINGS:
            fields[name] = None if fields[name] is None else fields[name].decode()
        fields["prefix_cache"] = bool(fields["prefix_cache"])
        fields["prefix_model"] = (ctypes.string_at(c.prefix_model, c.prefix_model_len)
                                  if c.prefix_model and c.prefix_model_len else b"")
        return cls(**fields)


_U64 = ("host_pages", "offload_fault_seed")
_STRINGS = ("pressure", "offload_path", "prefix_remote", "prefix_remote_password_file",
            "prefix_remote_password_env", "prefix_remote_tls_ca", "prefix_remote_tls_cert",
            "prefix_remote_tls_key", "prefix_remote_ns", "prefix_remote_mac",
            "prefix_remote_mac_prev")


def u_int(name: str, value: Any, bits: int = 32) -> int:
    """value as an unsigned C integer of `bits` bits: TypeError if it is not
    an integer, KvError(KV_ERANGE) if it does not fit (ctypes would wrap it
    silently: -1 or 2**32 must not become a valid index)."""
    v = operator.index(value)
    if not 0 <= v < (1 << bits):
        raise KvError(KV_ERANGE, f"{name} = {v} does not fit in uint{bits}")
    return v


def _from_struct(cls: Type[T], c: ctypes.Structure) -> T:
    out = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        v = getattr(c, f.name)
        out[f.name] = tuple(v) if isinstance(v, ctypes.Array) else v
    return cls(**out)


@dataclass
class Stats:
    """Store-wide statistics (kv_stats_t; every field documented there).
    pages_by_format and bytes_by_format are indexed by Format.
    compression_ratio() is fp16_bytes / (kv_bytes + meta_bytes)."""
    page_bytes: int
    fp16_tokens_per_page: int
    pages_capacity: int
    pages_used: int
    pages_free: int
    pages_peak: int
    alloc_failures: int
    n_seqs: int
    tokens: int
    pages_by_format: Tuple[int, int, int, int]
    bytes_by_format: Tuple[int, int, int, int]
    kv_bytes: int
    meta_bytes: int
    fp16_bytes: int
    pressure_runs: int
    pressure_rescued: int
    pressure_pages_freed: int
    pressure_converted_tokens: int
    pressure_evicted_tokens: int
    offload_slots: int
    offload_slots_used: int
    pages_on_file: int
    pages_in_flight: int
    pages_lost: int
    pages_out: int
    pages_in: int
    bytes_out: int
    bytes_in: int
    io_errors: int
    seqs_dropped: int
    offload_faults: int
    pressure_offloaded_pages: int
    prefix_nodes: int
    prefix_pages: int
    prefix_pages_only: int
    prefix_hits: int
    prefix_misses: int
    prefix_tokens_reused: int
    prefix_published: int
    prefix_evicted: int
    prefix_evicted_pages: int
    prefix_remote_hits: int
    prefix_remote_tokens: int
    prefix_remote_bad: int
    prefix_remote_errors: int
    prefix_remote_bytes_in: int
    prefix_remote_put: int
    prefix_remote_dropped: int
    prefix_snapshots: int
    prefix_snapshot_bytes: int
    prefix_file_nodes: int
    prefix_file_slots: int
    prefix_file_hits: int
    prefix_file_tokens: int
    prefix_file_bytes_in: int
    prefix_file_bytes_out: int
    prefix_file_demoted: int
    prefix_file_dropped: int
    prefix_file_bad: int
    prefix_file_restored: int
    prefix_ctx_nodes: int
    prefix_ctx_published: int
    prefix_ctx_hits: int
    prefix_ctx_misses: int
    prefix_remote_unauth: int
    prefix_remote_denied: int
    prefix_remote_auth_failures: int
    prefix_remote_tls_failures: int

    def compression_ratio(self) -> float:
        """The header's honest ratio: fp16_bytes / (kv_bytes + meta_bytes)."""
        held = self.kv_bytes + self.meta_bytes
        return self.fp16_bytes / held if held else 0.0


@dataclass
class Estimate:
    """Memory a configuration can take (kv_estimate_t), in bytes."""
    meta_fixed: int
    meta_per_seq: int
    meta_per_page: int
    meta_max: int
    kv_max: int
    meta_cap: int


@dataclass
class Residency:
    """Where a sequence's page references are (kv_residency_t)."""
    pages: int
    resident: int
    on_file: int
    in_flight: int
    lost: int


@dataclass
class FormatInfo:
    """The numbers of a page format for a page geometry (kv_format_info_t)."""
    name: str
    note: str
    bits_per_element: float
    group_size: int
    tokens_per_page: int


def estimate(config: Config) -> Estimate:
    """kv_config_estimate: validate config as Store() would (same KvErrors)
    and estimate its memory, allocating nothing."""
    c = config._to_c()
    out = _lib.kv_estimate_t()
    check(lib.kv_config_estimate(ctypes.byref(c), ctypes.byref(out)))
    return _from_struct(Estimate, out)


def format_note(fmt: Format) -> str:
    """kv_format_note, e.g. "INT2 g16 = 4 bits/element". KvError(KV_EINVAL)
    for an unknown format."""
    note = lib.kv_format_note(u_int("fmt", fmt))
    if note is None:
        raise KvError(KV_EINVAL, f"unknown format {int(fmt)}")
    return note.decode()


def format_info(fmt: Format, head_dim: int, page_bytes: int = 0,
                dir_format: Format = Format.FP16) -> FormatInfo:
    """kv_format_info: bits per element, group size and tokens per page of
    fmt for head_dim and page_bytes (0: 64 * head_dim). dir_format: MERGED's
    direction format (FP16 or INT4); FP16 for the other formats."""
    out = _lib.kv_format_info_t()
    check(lib.kv_format_info(u_int("fmt", fmt), u_int("dir_format", dir_format),
                             u_int("head_dim", head_dim), u_int("page_bytes", page_bytes),
                             ctypes.byref(out)))
    return FormatInfo(out.name.decode(), out.note.decode(), out.bits_per_element,
                      out.group_size, out.tokens_per_page)
