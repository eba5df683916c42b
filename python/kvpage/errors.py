# SPDX-License-Identifier: MIT
"""errors.py — KvError and the KV_E* codes of include/kvpage/kvpage.h.

Every C call of the binding goes through check(): a negative return becomes
a KvError carrying the code and kv_strerror()'s text. Negative codes above
-1000 are -errno from the OS (kv_strerror gives strerror's text for them).
Owned is the base of the objects that own a C object (Store, Policy).
"""
from __future__ import annotations

import errno as _errno
from typing import Any, Optional, TypeVar

from ._lib import lib

T = TypeVar("T")

KV_OK = 0
KV_EINVAL = -1001
KV_ENOMEM = -1002
KV_ERANGE = -1003
KV_ENOENT = -1004
KV_ESTATE = -1005
KV_ENOTSUP = -1006
KV_EVERSION = -1007
KV_ECORRUPT = -1008
KV_EIO = -1009
KV_ELIMIT = -1010
KV_ENOTRES = -1011
KV_EBUSY = -1012
KV_EAUTH = -1013
KV_ETLS = -1014

_NAMES = {v: k for k, v in dict(globals()).items() if k.startswith("KV_E")}


def strerror(code: int) -> str:
    """kv_strerror(code): a short English description of an error code."""
    return lib.kv_strerror(code).decode()


def code_name(code: int) -> str:
    """The symbolic name of a code: "KV_ENOMEM", or for -errno e.g. "ENOSPC"."""
    if code in _NAMES:
        return _NAMES[code]
    if -1000 < code < 0 and -code in _errno.errorcode:
        return _errno.errorcode[-code]
    return str(code)


class KvError(Exception):
    """A kvpage call failed. Attributes:

    code    the negative KV_E* code (or -errno from the OS), e.g. -1002
    name    its symbolic name, e.g. "KV_ENOMEM" or "ENOSPC"
    message kv_strerror(code)
    detail  what the binding or the C parser adds (a policy spec's error,
            which argument was wrong), or None
    """

    def __init__(self, code: int, detail: Optional[str] = None) -> None:
        self.code = code
        self.name = code_name(code)
        self.message = strerror(code)
        self.detail = detail
        text = f"{self.message} ({self.name}, {code})"
        super().__init__(f"{text}: {detail}" if detail else text)


def check(rc: int, detail: Optional[str] = None) -> int:
    """Return rc if it is >= 0, else raise KvError(rc, detail)."""
    if rc < 0:
        raise KvError(rc, detail)
    return rc


class Owned:
    """Base of the objects that own a C object (Store, Policy): `handle`
    until close() (idempotent), the end of a with block, or garbage
    collection; after that every use raises KvError(KV_ESTATE)."""

    _what = "object"

    def __init__(self) -> None:
        self._h: Optional[Any] = None

    def _destroy(self, handle: Any) -> None:  # the C destroy function
        raise NotImplementedError

    @property
    def handle(self) -> Any:
        """The C pointer; KvError(KV_ESTATE) once closed."""
        if self._h is None:
            raise KvError(KV_ESTATE, f"the {self._what} is closed")
        return self._h

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._h is None

    def close(self) -> None:
        """Destroy the C object (see the class for what that does). Idempotent."""
        if self._h is not None:
            h, self._h = self._h, None
            self._destroy(h)

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
