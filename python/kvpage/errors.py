# SPDX-License-Identifier: MIT
"""errors.py — the exceptions of the binding, one class per KV_E* code of
include/kvpage/kvpage.h under KvError, and Owned, the base of the objects
that own a C object (Store, Policy).

Every C call goes through check(): a negative return raises
KvError(code, detail), which builds the class of that code (error_class):
KvNoMemory for KV_ENOMEM, KvOSError for -errno from the OS (codes above
-1000), ... Each class also derives from the builtin that fits, so that
`except MemoryError` catches KV_ENOMEM and `except OSError` a page-file
error; every instance carries .code, .name, .message (kv_strerror) and
.detail. A closed Store or Policy raises KvClosed (KV_ESTATE, and a
ValueError like a closed Python file).

Lifetime (Owned): close() destroys the C object on the calling thread and
may block (a store with a page file finishes its I/O and syncs the file, a
remote tier waits for its publisher's queue to reach the server). An object that
is garbage-collected unclosed is finalized by weakref.finalize: a
ResourceWarning, then the C destroy -- right away when it cannot block
(a Policy), else handed to one daemon thread ("kvpage-reaper"), so that
garbage collection never waits on fsync or the network. At interpreter
exit, objects still open are destroyed and the reaper's queue drained.
"""
from __future__ import annotations

import atexit
import errno as _errno
import queue
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Optional, Set, Type, TypeVar

from . import _consts as _c
from ._lib import lib

T = TypeVar("T")

KV_OK = _c.KV_OK
KV_EINVAL = _c.KV_EINVAL
KV_ENOMEM = _c.KV_ENOMEM
KV_ERANGE = _c.KV_ERANGE
KV_ENOENT = _c.KV_ENOENT
KV_ESTATE = _c.KV_ESTATE
KV_ENOTSUP = _c.KV_ENOTSUP
KV_EVERSION = _c.KV_EVERSION
KV_ECORRUPT = _c.KV_ECORRUPT
KV_EIO = _c.KV_EIO
KV_ELIMIT = _c.KV_ELIMIT
KV_ENOTRES = _c.KV_ENOTRES
KV_EBUSY = _c.KV_EBUSY
KV_EAUTH = _c.KV_EAUTH
KV_ETLS = _c.KV_ETLS

_NAMES = {v: k for k, v in vars(_c).items() if k.startswith("KV_E")}


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
    """A kvpage call failed. KvError(code, detail) makes the subclass of
    that code (error_class(code)). Attributes:

    code    the negative KV_E* code (or -errno from the OS), e.g. -1002
    name    its symbolic name, e.g. "KV_ENOMEM" or "ENOSPC"
    message kv_strerror(code)
    detail  what the binding or the C parser adds (a policy spec's error,
            which argument was wrong), or None
    """

    code: int = 0  # the class's code; an instance's own code may differ (KvOSError)

    def __new__(cls, code: int = 0, detail: Optional[str] = None, *rest: Any) -> "KvError":
        if cls is KvError:
            cls = error_class(code)
        # the builtin's own __new__ only where its layout differs (OSError);
        # MemoryError's refuses a subclass whose first base is KvError
        base = OSError if issubclass(cls, OSError) else Exception
        return base.__new__(cls)  # type: ignore[return-value]

    def __init__(self, code: Optional[int] = None, detail: Optional[str] = None) -> None:
        code = type(self).code if code is None else code
        self.code = code
        self.name = code_name(code)
        self.message = strerror(code)
        self.detail = detail
        text = f"{self.message} ({self.name}, {code})"
        self._text = f"{text}: {detail}" if detail else text
        Exception.__init__(self, code, detail)
        if isinstance(self, OSError):  # .errno, .strerror as OSError has them
            self.errno = -code if -1000 < code < 0 else getattr(type(self), "_errno", None)
            self.strerror = self.message

    def __str__(self) -> str:
        return self._text

    def __reduce__(self) -> Any:
        return (type(self), (self.code, self.detail))


class KvInvalid(KvError, ValueError):
    """KV_EINVAL: a bad argument (NULL, zero size, an unknown enum, a
    malformed spec)."""
    code = KV_EINVAL


class KvNoMemory(KvError, MemoryError):
    """KV_ENOMEM: no free page in the pool, or memory for metadata ran out.
    The call changed nothing; free sequences or pages and retry."""
    code = KV_ENOMEM


class KvRange(KvError, ValueError):
    """KV_ERANGE: a layer, head, token index or value out of range (also an
    integer that does not fit its C type)."""
    code = KV_ERANGE


class KvNotFound(KvError, LookupError):
    """KV_ENOENT: no such sequence (never created, or freed), or no such
    method in a policy."""
    code = KV_ENOENT


class KvState(KvError, RuntimeError):
    """KV_ESTATE: the object is in the wrong state for the call (a policy on
    a sequence that is not empty, attention over an empty list)."""
    code = KV_ESTATE


class KvClosed(KvState, ValueError):
    """A Store or Policy used after close(): KV_ESTATE, and a ValueError as
    for a closed Python file."""


class KvNotSupported(KvError, NotImplementedError):
    """KV_ENOTSUP: a feature not built in or not configured (no page file,
    the prefix cache off)."""
    code = KV_ENOTSUP


class KvVersion(KvError, ValueError):
    """KV_EVERSION: a struct_size or version this library does not know."""
    code = KV_EVERSION


class KvCorrupt(KvError, OSError):
    """KV_ECORRUPT: stored data failed its integrity check (errno EBADMSG)."""
    code = KV_ECORRUPT
    _errno = _errno.EBADMSG


class KvIOError(KvError, OSError):
    """KV_EIO: an I/O error (errno EIO)."""
    code = KV_EIO
    _errno = _errno.EIO


class KvLimit(KvError):
    """KV_ELIMIT: a fixed limit was reached (max_seqs, tokens per list)."""
    code = KV_ELIMIT


class KvNotResident(KvError):
    """KV_ENOTRES: a page needed is on the page file (prefetch and wait, or
    use OFFLOAD_WAIT)."""
    code = KV_ENOTRES


class KvBusy(KvError, OSError):
    """KV_EBUSY: the page file is owned by another store (errno EBUSY)."""
    code = KV_EBUSY
    _errno = _errno.EBUSY


class KvAuth(KvError, PermissionError):
    """KV_EAUTH: the remote tier's server refused the credentials or the
    user's permissions (-NOAUTH, -WRONGPASS, -NOPERM; docs/prefix.md)."""
    code = KV_EAUTH


class KvTLS(KvError, ConnectionError):
    """KV_ETLS: the TLS handshake with the remote tier's server failed
    (certificate, name, protocol, or no TLS there; docs/prefix.md)."""
    code = KV_ETLS


class KvOSError(KvError, OSError):
    """-errno from the OS (e.g. -EEXIST for a new page file over an existing
    one): .errno is the positive errno."""


_CLASSES: Dict[int, Type[KvError]] = {
    c.code: c for c in (KvInvalid, KvNoMemory, KvRange, KvNotFound, KvState, KvNotSupported,
                        KvVersion, KvCorrupt, KvIOError, KvLimit, KvNotResident, KvBusy,
                        KvAuth, KvTLS)}


def error_class(code: int) -> Type[KvError]:
    """The KvError subclass raised for code: KvOSError for -errno, a plain
    KvError for a code this binding does not know."""
    if code in _CLASSES:
        return _CLASSES[code]
    return KvOSError if -1000 < code < 0 else KvError


def check(rc: int, detail: Optional[str] = None) -> int:
    """Return rc if it is >= 0, else raise KvError(rc, detail) (its subclass)."""
    if rc < 0:
        raise KvError(rc, detail)
    return rc


# ---- finalization -----------------------------------------------------------

_reaped: "queue.Queue[Any]" = queue.Queue()
_reaper: Optional[threading.Thread] = None
_reaper_lock = threading.Lock()
_open: Set[weakref.finalize] = set()  # finalizers of the objects still open


def _reap_loop() -> None:
    while True:
        destroy, handle = _reaped.get()
        try:
            destroy(handle)
        except Exception:  # the C destroy returns nothing: keep serving the queue
            sys.excepthook(*sys.exc_info())
        finally:
            _reaped.task_done()


def _reap_later(destroy: Callable[[Any], None], handle: Any) -> None:
    global _reaper
    with _reaper_lock:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap_loop, name="kvpage-reaper", daemon=True)
            _reaper.start()
    _reaped.put((destroy, handle))


def reaper_wait() -> None:
    """Block until every object handed to the reaper thread is destroyed."""
    _reaped.join()


def _finalize(what: str, destroy: Callable[[Any], None], blocking: bool, handle: Any) -> None:
    warnings.warn(f"kvpage: unclosed {what} (close() it, or use a with block)",
                  ResourceWarning, stacklevel=2)
    if blocking and not _exiting:
        _reap_later(destroy, handle)
    else:
        destroy(handle)


_exiting = False


@atexit.register
def _at_exit() -> None:
    """Destroy what is still open (synchronously: the process is ending and
    a page file must be persisted), then drain the reaper's queue."""
    global _exiting
    _exiting = True
    for f in list(_open):
        info = f.detach()  # not f(): finalize's own atexit hook may have disabled calls
        if info is not None:
            _, func, args, _ = info
            func(*args)
    reaper_wait()


class Owned:
    """Base of the objects that own a C object (Store, Policy): `handle`
    until close() (idempotent) or the end of a with block; after that every
    use raises KvClosed. Garbage collection of an unclosed object: see the
    module comment. Subclasses set _what, _destroy_fn (a module-level
    function of the handle) and _blocking (whether it may wait)."""

    _what = "object"
    _blocking = False

    @staticmethod
    def _destroy_fn(handle: Any) -> None:  # the C destroy function
        raise NotImplementedError

    def __init__(self) -> None:
        self._h: Optional[Any] = None
        self._finalizer: Optional[weakref.finalize] = None

    def _own(self, handle: Any) -> None:
        """Take ownership of handle (just created by the C API)."""
        self._h = handle
        f = weakref.finalize(self, _finalize, self._what, type(self)._destroy_fn,
                             self._blocking, handle)
        f.atexit = False  # _at_exit runs it, before draining the reaper
        _open.add(f)
        self._finalizer = f
        # the set must not keep finalizers of closed objects
        weakref.finalize(self, _open.discard, f).atexit = False

    @property
    def handle(self) -> Any:
        """The C pointer; KvClosed once closed."""
        if self._h is None:
            raise KvClosed(KV_ESTATE, f"the {self._what} is closed")
        return self._h

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._h is None

    def close(self) -> None:
        """Destroy the C object now, on this thread (see the subclass for
        what that does and whether it blocks). Idempotent."""
        f, self._finalizer, self._h = self._finalizer, None, None
        if f is not None:
            _open.discard(f)
            info = f.detach()
            if info is not None:
                _, _, args, _ = info
                type(self)._destroy_fn(args[3])

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
