# SPDX-License-Identifier: MIT
"""dlopen.py — libkvpage.so loads into a Python process with ctypes, with
nothing preloaded (the way a Python binding will load it), and a few of its
functions answer: the version, an error's name, a worker workers created,
sized and destroyed. Fails if jemalloc is in the process, before or after.

Usage: python3 dlopen.py LIBKVPAGE_SO VERSION
"""
import ctypes
import sys


def mapped(name):
    with open("/proc/self/maps") as f:
        return name in f.read()


def main():
    path, want = sys.argv[1], sys.argv[2]
    if mapped("libjemalloc"):
        sys.exit("dlopen.py: jemalloc is already in this process: proves nothing")
    lib = ctypes.CDLL(path)
    if mapped("libjemalloc"):
        sys.exit("dlopen.py: loading %s brought jemalloc in" % path)
    lib.kv_version.restype = ctypes.c_char_p
    lib.kv_strerror.restype = ctypes.c_char_p
    lib.kv_strerror.argtypes = [ctypes.c_int]
    version = lib.kv_version().decode()
    if version != want:
        sys.exit("dlopen.py: kv_version() = %r, expected %r" % (version, want))
    enomem = lib.kv_strerror(-1002).decode()
    if not enomem or enomem == lib.kv_strerror(-1001).decode():
        sys.exit("dlopen.py: kv_strerror: %r" % enomem)
    workers = ctypes.c_void_p()
    lib.kv_workers_create.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]
    lib.kv_workers_size.argtypes = [ctypes.c_void_p]
    lib.kv_workers_size.restype = ctypes.c_uint32
    lib.kv_workers_destroy.argtypes = [ctypes.c_void_p]
    rc = lib.kv_workers_create(3, ctypes.byref(workers))
    if rc != 0 or lib.kv_workers_size(workers) != 3:
        sys.exit("dlopen.py: kv_workers_create(3) = %d, size %d" % (rc, lib.kv_workers_size(workers)))
    lib.kv_workers_destroy(workers)
    print("dlopen.py: %s loaded without jemalloc; kvpage %s; %s" % (path, version, enomem))


main()
