/* SPDX-License-Identifier: MIT */
/*
 * kv_alloc.h — fixed-size page pools (one per tier), with refcounts.
 *
 * A pool hands out page ids for pages of page_bytes each; capacity is fixed at
 * creation. Host-tier pools also own the page memory: one anonymous mapping
 * (mmap) of capacity * page_bytes, page-aligned, unmapped at destroy, and
 * kv_alloc_page_ptr() gives a page's address. Id-only pools (tier != HOST)
 * hand out ids for memory someone else owns (a device arena, a page file).
 *
 * Page ids: bits 31..26 hold the pool's tag (1..63, from a process-wide
 * counter), bits 25..0 the page index, so capacity <= 2^26 and an id from
 * another pool is rejected (KV_EINVAL) unless the two tags collide (pools
 * created 63 apart). Id 0 is never valid.
 *
 * Refcounts: a page is free (refcount 0) or held (>= 1). kv_alloc_page sets 1;
 * retain adds one; release drops one and frees at zero. Releasing or retaining
 * a free page returns KV_ESTATE and changes nothing. The caller must not
 * release the last reference of one page from two threads at once.
 *
 * Concurrency: every function is safe to call from many threads. Free pages
 * sit on a LIFO stack under a mutex, fronted by small per-thread caches (up to
 * KV_ALLOC_TCACHE_MAX ids per thread per pool) so that an alloc+free pair
 * takes no lock and no atomic read-modify-write. While the shared stack holds
 * fewer than a low watermark of pages, threads bypass and flush their caches,
 * so under memory pressure allocation fails only when the pool is truly
 * exhausted, apart from pages cached by threads that have not called into the
 * pool since the watermark was crossed (at most KV_ALLOC_TCACHE_MAX each).
 * KV_ALLOC_NO_TCACHE turns the caches off.
 *
 * Stats: used/free are exact at the moment of the call; peak is the
 * high-water mark of used, exact with NO_TCACHE and otherwise sampled on
 * every trip to the shared stack (so it may miss up to one cache's worth).
 */
#ifndef KV_ALLOC_H
#define KV_ALLOC_H

#include <stdint.h>

typedef uint32_t kv_page_id_t;

#define KV_PAGE_ID_INVALID   0u
#define KV_ALLOC_MAX_PAGES   (1u << 26)
#define KV_ALLOC_TCACHE_MAX  32u

typedef enum kv_tier {
    KV_TIER_HOST   = 0, /* memory owned by the pool (one mmap block)   */
    KV_TIER_PINNED = 1, /* id-only here; memory owned by the backend   */
    KV_TIER_DEVICE = 2, /* id-only; memory owned by the backend        */
    KV_TIER_FILE   = 3, /* id-only; slots of a page file               */
} kv_tier_t;

/* kv_alloc_config_t.flags */
#define KV_ALLOC_NO_TCACHE 0x1u

typedef struct kv_alloc_config {
    uint32_t page_bytes; /* bytes per page, a multiple of 64, >= 64  */
    uint32_t capacity;   /* pages, 1..KV_ALLOC_MAX_PAGES               */
    kv_tier_t tier;
    uint32_t flags;      /* KV_ALLOC_* */
} kv_alloc_config_t;

typedef struct kv_alloc_stats {
    uint32_t page_bytes;
    uint64_t capacity; /* pages                                         */
    uint64_t used;     /* pages held (refcount >= 1)                    */
    uint64_t free;     /* capacity - used                               */
    uint64_t peak;     /* high-water mark of used                       */
    uint64_t failed;   /* allocations refused: pool exhausted/injected  */
} kv_alloc_stats_t;

typedef struct kv_alloc_pool kv_alloc_pool_t;

/* The hot-path functions are C99 inline functions in C (defined at the end
 * of this header), plain external functions for C++ callers. */
#ifdef __cplusplus
#define KV_ALLOC_INLINE
#else
#define KV_ALLOC_INLINE inline
#endif

/* Errors: KV_EINVAL (NULL), KV_ERANGE (page_bytes/capacity), KV_ENOMEM. */
int  kv_alloc_pool_create(const kv_alloc_config_t *cfg, kv_alloc_pool_t **out);
/* Frees the pool and its page memory, whatever is still held. NULL: no-op. */
void kv_alloc_pool_destroy(kv_alloc_pool_t *pool);

/* One page with refcount 1. Errors: KV_ENOMEM (exhausted), KV_EINVAL.
 * (Inline in C: see "inline hot path" below.) */
KV_ALLOC_INLINE int kv_alloc_page(kv_alloc_pool_t *pool, kv_page_id_t *id);
/* One page of a HOST pool with refcount 1, and its address (page_bytes
 * bytes, aligned as kv_alloc_page_ptr says) in *mem: kv_alloc_page and
 * kv_alloc_page_ptr in one call, the pool's counterpart of malloc. Errors as
 * kv_alloc_page, and KV_EINVAL for NULL mem or an id-only pool (whose page
 * is given back at once: used and the free pages are as before, the peak may
 * count it). *id and *mem are untouched on any error. (Inline in C.) */
KV_ALLOC_INLINE int kv_alloc_page_mem(kv_alloc_pool_t *pool, kv_page_id_t *id, void **mem);
/* n pages, all or nothing: on KV_ENOMEM no page was taken. */
int kv_alloc_pages(kv_alloc_pool_t *pool, uint32_t n, kv_page_id_t *ids);

/* Add a reference. Errors: KV_EINVAL (bad id), KV_ESTATE (page is free). */
int kv_alloc_retain(kv_alloc_pool_t *pool, kv_page_id_t id);
/* Drop a reference: returns 1 if the page was freed, 0 if still held,
 * KV_EINVAL (bad id) or KV_ESTATE (page already free). (Inline in C.) */
KV_ALLOC_INLINE int kv_alloc_release(kv_alloc_pool_t *pool, kv_page_id_t id);

/* Current refcount (0 = free); 0 for a bad id as well. */
uint32_t kv_alloc_refcount(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* 1 if id could belong to this pool (tag and index in range). */
int kv_alloc_id_valid(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* Address of a page of a HOST pool (page_bytes bytes, 4096-aligned if
 * page_bytes is a multiple of 4096, else 64-aligned); NULL for id-only pools
 * or a bad id. Valid whatever the refcount; meaningful while held.
 * (Inline in C.) */
KV_ALLOC_INLINE void *kv_alloc_page_ptr(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* Index of a page in 0..capacity-1 (for arrays indexed by page). */
uint32_t kv_alloc_page_index(kv_page_id_t id);

void     kv_alloc_stats(const kv_alloc_pool_t *pool, kv_alloc_stats_t *out);
uint32_t kv_alloc_page_bytes(const kv_alloc_pool_t *pool);
uint32_t kv_alloc_capacity(const kv_alloc_pool_t *pool);

/* ---- inline hot path (C only; internals of kv_alloc.c) -------------------
 *
 * kv_alloc_page, kv_alloc_page_mem, kv_alloc_release and kv_alloc_page_ptr
 * are C99 inline functions, so that a C caller runs the per-thread-cache hot
 * path without a call and keeps the page id in a register instead of a round
 * trip through the out-parameter (a call costs about as much as the whole
 * hot path: kvbench-alloc). Whatever the hot path does not handle goes to the
 * out-of-line kv_alloc_page_other / kv_alloc_release_other. kv_alloc.c holds
 * the external definitions (for C++ callers, the CUDA files, and calls the
 * compiler does not inline). The types below are kv_alloc.c's internals,
 * shown here only for the inline functions; kv_alloc.c's top comment says
 * what each field means and who writes it.
 */
#ifndef __cplusplus
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "alloc/kv_fault_fast.h"
#include "kvpage/kvpage.h"

typedef struct kv_alloc_tcache kv_alloc_tcache_t;

/* One per-thread cache slot. */
struct kv_alloc_tcache {
    _Atomic uint64_t serial;          /* bound pool's serial; 0 = unbound            */
    kv_alloc_pool_t *pool;            /* bound pool (registry mutex)                 */
    _Atomic uint32_t count;           /* ids held; written by the owner only         */
    uint32_t lo;                      /* lowest count since last trip (owner only)   */
    uint32_t synced;                  /* count at last trip (pool->lock)             */
    kv_page_id_t ids[KV_ALLOC_TCACHE_MAX]; /* page ids (tagged: no ALU op between */
                                       /* a free and the next alloc), top last  */
    kv_alloc_tcache_t *prev, *next;   /* pool's list of bound caches (registry)      */
};

/* The slot a thread used last, for the hot path (its own small TLS). */
typedef struct kv_alloc_hot {
    uint64_t serial;      /* pool serial c was bound to when set; 0 = none */
    kv_alloc_tcache_t *c; /* that slot (set with serial, never NULL after) */
} kv_alloc_hot_t;

struct kv_alloc_pool {
    /* Line 0: the shared stack's bookkeeping, written under lock (registry
     * mutex for caches/n_bound/low_mark), never read on the hot path. The
     * hot fields are not first on purpose: the struct may start a 4 KiB
     * page, as every page does (it did as a fresh jemalloc slab), and a load from
     * the struct's first bytes just after a store to a page's first bytes
     * waits on that store (4K aliasing: the CPU compares address bits 11..0
     * first; docs/results/benchmarks.md has the measurement). */
    union {
        struct {
            pthread_mutex_t lock;
            _Atomic uint32_t shared_n;  /* ids on the stack (relaxed reads outside lock) */
            uint32_t cached_synced;     /* sum of bound caches' `synced`                 */
            _Atomic uint32_t low_mark;  /* see file comment                              */
            uint32_t n_bound;           /* length of the caches list                     */
            kv_alloc_tcache_t *caches;  /* bound caches (list through prev/next)         */
        };
        char line0[64];
    };

    /* Line 1: read on the hot path, written at create (cache_key and low also
     * at low-watermark crossings, under lock). */
    union {
        struct {
            _Atomic uint64_t cache_key; /* what a hot slot must match: serial, or    */
                                        /* KV_ALLOC_KEY_NONE (matches no slot) with  */
                                        /* NO_TCACHE or while low: one compare on    */
                                        /* the hot path covers "bound", "not low"    */
            uint64_t serial;            /* unique per pool in this process, never 0  */
            uint32_t tag_bits;          /* tag << 26                                 */
            uint32_t capacity;          /* pages                                     */
            uint32_t host_pages;        /* pages with an address: capacity (HOST), 0 */
            uint32_t page_bytes;        /* bytes per page                            */
            unsigned char *base;        /* HOST: [capacity][page_bytes], else NULL   */
            _Atomic uint32_t *refs;     /* [capacity] refcounts                      */
            uint32_t flags;             /* KV_ALLOC_*                                */
            kv_tier_t tier;
            _Atomic int low;            /* 1: shared stack below low_mark: bypass    */
        };                              /* the caches                                */
        char line1[64];
    };

    /* Cold: written under lock or at create. */
    kv_page_id_t *stack;         /* [capacity] free page ids, top = stack[shared_n-1] */
    _Atomic uint64_t peak;       /* high-water mark of used                          */
    _Atomic uint64_t failed;     /* refused allocations                              */
    size_t block_bytes;          /* capacity * page_bytes (HOST)                     */
};

/* The calling thread's hot slot (initial-exec TLS, defined in kv_alloc.c). */
extern _Thread_local kv_alloc_hot_t kv_alloc_hot_tls
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* kv_alloc_page_other's answer: returned by value (in one register), so that
 * the caller's id variable never has its address taken. */
typedef struct kv_alloc_got {
    int rc;           /* 0 or KV_E*          */
    kv_page_id_t id;  /* the page when rc==0 */
} kv_alloc_got_t;

kv_alloc_got_t kv_alloc_page_other(kv_alloc_pool_t *pool);
int kv_alloc_release_other(kv_alloc_pool_t *pool, kv_page_id_t id);

inline uint32_t kv_alloc_count(const kv_alloc_tcache_t *c)
{
    return atomic_load_explicit(&c->count, memory_order_relaxed);
}

inline void kv_alloc_set_count(kv_alloc_tcache_t *c, uint32_t n)
{
    atomic_store_explicit(&c->count, n, memory_order_relaxed);
}

/* Tag matches and index < capacity, in one compare: capacity <= 2^26, so
 * id - tag_bits < capacity exactly when both hold (else it wraps high). */
inline int kv_alloc_valid(const kv_alloc_pool_t *pool, kv_page_id_t id)
{
    return id - pool->tag_bits < pool->capacity;
}

/* The calling thread's hot slot if it is pool's and the pool is not low,
 * else NULL. Never NULL once the key matched (c is set with serial). The
 * slot is bound to pool then: a destroyed pool's serial never matches again,
 * an evicted slot is re-pointed at once, and thread exit clears serial. */
inline kv_alloc_tcache_t *kv_alloc_hot(const kv_alloc_pool_t *pool)
{
    const kv_alloc_hot_t *h = &kv_alloc_hot_tls;
    if (__builtin_expect(h->serial != atomic_load_explicit(
                                          &pool->cache_key, memory_order_relaxed), 0))
        return NULL;
    kv_alloc_tcache_t *c = h->c;
    if (c == NULL)
        __builtin_unreachable();
    return c;
}

/* Page v leaves a free list: refcount 1, v to *id. */
inline void kv_alloc_hand_out(kv_alloc_pool_t *pool, kv_page_id_t v, kv_page_id_t *id)
{
    atomic_store_explicit(&pool->refs[v - pool->tag_bits], 1, memory_order_relaxed);
    *id = v;
}

/* Take one page from c (bound, pool not low) unless it is empty. */
inline int kv_alloc_cache_pop(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                              kv_page_id_t *id)
{
    uint32_t n = kv_alloc_count(c);
    if (__builtin_expect(n == 0, 0))
        return 0;
    n--;
    kv_alloc_hand_out(pool, c->ids[n], id);
    kv_alloc_set_count(c, n);
    if (n < c->lo)
        c->lo = n;
    return 1;
}

/* Put page id on c (bound, pool not low) unless it is full. */
inline int kv_alloc_cache_push(kv_alloc_tcache_t *c, kv_page_id_t id)
{
    uint32_t n = kv_alloc_count(c);
    if (__builtin_expect(n >= KV_ALLOC_TCACHE_MAX, 0))
        return 0;
    c->ids[n] = id;
    kv_alloc_set_count(c, n + 1);
    return 1;
}

inline int kv_alloc_page(kv_alloc_pool_t *pool, kv_page_id_t *id)
{
    if (__builtin_expect(id == NULL, 0))
        return KV_EINVAL;
    /* Hot path: fault injection disarmed, the thread's hot slot is this
     * pool's and not empty. */
    if (__builtin_expect(pool != NULL &&
                             atomic_load_explicit(&kv_fault_countdown,
                                                  memory_order_relaxed) == 0, 1)) {
        kv_alloc_tcache_t *c = kv_alloc_hot(pool);
        if (__builtin_expect(c != NULL && kv_alloc_cache_pop(pool, c, id), 1))
            return 0;
    }
    kv_alloc_got_t g = kv_alloc_page_other(pool);
    if (g.rc == 0)
        *id = g.id;
    return g.rc;
}

/* Address of page index idx of a HOST pool (idx < host_pages). */
inline void *kv_alloc_addr(const kv_alloc_pool_t *pool, uint32_t idx)
{
    return pool->base + (size_t)idx * pool->page_bytes;
}

inline int kv_alloc_page_mem(kv_alloc_pool_t *pool, kv_page_id_t *id, void **mem)
{
    if (__builtin_expect(id == NULL || mem == NULL, 0))
        return KV_EINVAL;
    kv_page_id_t v;
    int rc = kv_alloc_page(pool, &v);
    if (__builtin_expect(rc != 0, 0))
        return rc;
    /* The tier is checked after the pop, not before: a load and branch
     * ahead of the hot path is measurably slower (docs/results/
     * benchmarks.md). */
    if (__builtin_expect(pool->base == NULL, 0)) {
        kv_alloc_release_other(pool, v); /* id-only pool: give it back */
        return KV_EINVAL;
    }
    *id = v;
    *mem = kv_alloc_addr(pool, v - pool->tag_bits);
    return 0;
}

inline int kv_alloc_release(kv_alloc_pool_t *pool, kv_page_id_t id)
{
    /* Hot path: the caller holds the only reference (so nobody else may
     * touch the refcount) and the hot slot is this pool's with room. The
     * refcount is cleared before the id enters the cache (so a page in a
     * cache is always free; also the faster order: docs/results/
     * benchmarks.md). */
    if (__builtin_expect(pool != NULL && kv_alloc_valid(pool, id), 1)) {
        uint32_t idx = id - pool->tag_bits, n;
        _Atomic uint32_t *r = &pool->refs[idx];
        kv_alloc_tcache_t *c = kv_alloc_hot(pool);
        if (__builtin_expect(c != NULL &&
                                 atomic_load_explicit(r, memory_order_acquire) == 1 &&
                                 (n = kv_alloc_count(c)) < KV_ALLOC_TCACHE_MAX, 1)) {
            atomic_store_explicit(r, 0, memory_order_relaxed);
            c->ids[n] = id;
            kv_alloc_set_count(c, n + 1);
            return 1;
        }
    }
    return kv_alloc_release_other(pool, id);
}

inline void *kv_alloc_page_ptr(const kv_alloc_pool_t *pool, kv_page_id_t id)
{
    if (!pool)
        return NULL;
    uint32_t idx = id - pool->tag_bits; /* wraps high for another pool's tag */
    return idx < pool->host_pages ? kv_alloc_addr(pool, idx) : NULL;
}
#endif /* !__cplusplus */

#endif /* KV_ALLOC_H */
