/*
 * kv_mem.c — metadata allocation for the whole library (see kv_mem.h).
 *
 * Normal build: jemalloc's sized API (mallocx / rallocx / sdallocx), so a
 * free costs no size lookup. Sanitizer build (KV_MEM_SYSTEM): plain
 * malloc / realloc / free, so ASan/LSan track every block; there every free
 * also asserts that the size given matches the block (ASan's
 * malloc_usable_size is exact), catching the size mismatches that sdallocx
 * would silently turn into heap corruption in the normal build.
 *
 * Invariant: kv_mem_live is the sum of the sizes of live blocks (relaxed
 * atomic, all threads). Fault injection lives in kv_fault.c; every
 * allocation here asks kv_fault_hit() first.
 */
#include "alloc/kv_mem.h"

#include <assert.h>
#include <stdatomic.h>
#include <string.h>

#ifdef KV_MEM_SYSTEM
#include <malloc.h>
#include <stdlib.h>
#else
#include <jemalloc/jemalloc.h>
#endif

static _Atomic uint64_t kv_mem_live; /* bytes in live kv_mem blocks */

static void *kv_mem_raw_alloc(size_t n, int zero)
{
#ifdef KV_MEM_SYSTEM
    return zero ? calloc(1, n) : malloc(n);
#else
    return mallocx(n, zero ? MALLOCX_ZERO : 0);
#endif
}

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
    void *p = kv_mem_raw_alloc(n, zero);
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
#ifdef KV_MEM_SYSTEM
    void *q = realloc(p, new_n);
#else
    void *q = rallocx(p, new_n, 0);
#endif
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
#ifdef KV_MEM_SYSTEM
    free(p);
#else
    sdallocx(p, n, 0);
#endif
}

uint64_t kv_mem_live_bytes(void)
{
    return atomic_load_explicit(&kv_mem_live, memory_order_relaxed);
}
