/* SPDX-License-Identifier: MIT */
/*
 * kv_mem.c — metadata allocation for the whole library (see kv_mem.h).
 *
 * The process's malloc / calloc / realloc / free, whichever allocator that
 * is (glibc's, or jemalloc/tcmalloc where the program links one): the
 * library brings no allocator of its own, so it loads with dlopen anywhere
 * (a jemalloc linked into a shared library needs static TLS that a dlopen
 * may not find). Callers pass the block's size on free anyway: it keeps
 * kv_mem_live exact, and in the sanitizer build (KV_MEM_SYSTEM) every free
 * asserts that the size given matches the block (ASan's malloc_usable_size
 * is exact), so a wrong size is caught by the tests.
 *
 * Invariant: kv_mem_live is the sum of the sizes of live blocks (relaxed
 * atomic, all threads). Fault injection lives in kv_fault.c; every
 * allocation here asks kv_fault_hit() first.
 */
#include "alloc/kv_mem.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>

#ifdef KV_MEM_SYSTEM
#include <malloc.h>
#endif

static _Atomic uint64_t kv_mem_live; /* bytes in live kv_mem blocks */

static void kv_mem_check_size(void *p, size_t n)
{
#ifdef KV_MEM_SYSTEM
    /* Under ASan the usable size is the requested size, exactly. */
    assert(malloc_usable_size(p) == n);
#endif
    (void)p;
    (void)n;
}

static void *kv_mem_alloc_impl(size_t n, int zero)
{
    if (n == 0 || kv_fault_hit())
        return NULL;
    void *p = zero ? calloc(1, n) : malloc(n);
    if (p)
        atomic_fetch_add_explicit(&kv_mem_live, n, memory_order_relaxed);
    return p;
}

void *kv_mem_alloc(size_t n)
{
    return kv_mem_alloc_impl(n, 0);
}

void *kv_mem_calloc(size_t count, size_t size)
{
    if (count == 0 || size == 0 || count > SIZE_MAX / size)
        return NULL;
    return kv_mem_alloc_impl(count * size, 1);
}

void *kv_mem_realloc(void *p, size_t old_n, size_t new_n)
{
    if (!p)
        return kv_mem_alloc(new_n);
    /* new_n == 0 is refused like a failure: p stays valid and untouched. */
    if (new_n == 0 || kv_fault_hit())
        return NULL;
    kv_mem_check_size(p, old_n);
    void *q = realloc(p, new_n);
    if (!q)
        return NULL;
    if (new_n >= old_n)
        atomic_fetch_add_explicit(&kv_mem_live, new_n - old_n,
                                  memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&kv_mem_live, old_n - new_n,
                                  memory_order_relaxed);
    return q;
}

void kv_mem_free(void *p, size_t n)
{
    if (!p)
        return;
    kv_mem_check_size(p, n);
    assert(n > 0);
    atomic_fetch_sub_explicit(&kv_mem_live, n, memory_order_relaxed);
    free(p);
}

uint64_t kv_mem_live_bytes(void)
{
    return atomic_load_explicit(&kv_mem_live, memory_order_relaxed);
}
